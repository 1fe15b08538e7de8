"""The main window: conversations, chat, attachments, the slider and the live panel.

A reply arrives read in the model's format (engine/formats): its content is the answer (what the
store keeps as the message, and all that later turns send back), its reasoning and tool calls are
kept in the message's meta and shown around the answer (app/reasoning_view.py).

It reaches the engine only through EngineBridge (commands out, events in, on the GUI thread)."""
from __future__ import annotations

import logging
import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QApplication, QLabel, QMainWindow, QMessageBox, QProgressBar, QPushButton, QSplitter,
                               QVBoxLayout, QWidget)

from engine.generate import SamplingParams
from engine.protocol import (Done, EngineStopped, ErrorEvent, Generate, Loaded, MigrationProgress, PlacementChanged,
                             Progress, SetSlider, Stats, Stop, Token)

from . import documents, menus, remote, theme
from .composer import Composer
from .conversation_list import ConversationList
from .gpu_runtime import GpuOfferBar, RuntimeDialog
from .bridge import EngineBridge
from .chat_view import ChatView
from .model_picker import ModelSwitch
from .panel import LivePanel
from .quality_slider import QualitySlider
from .reply_parts import ReplyParts
from .serving import LocalServer, ServerBox, ServerDialog
from .store import Store
from .waiting import ReplyWait

log = logging.getLogger("mixdesk")
SAVE_PARTIAL_S = 1.0


class MainWindow(QMainWindow):
    def __init__(self, store: Store, model: str = "demo", session_kwargs: dict | None = None,
                 device: str | None = None, dtype: str = "auto"):
        super().__init__()
        self.setWindowTitle("Mixdesk")
        self.resize(1280, 800)
        self.store = store
        self.bridge = EngineBridge(session_kwargs, self)
        self.bridge.events.connect(self.on_events)
        self.log_lines: list[str] = []
        self.cid: int | None = None
        self.request: int | None = None  # the reply in progress: its id from the engine (or the remote)
        self.reply_mid: int | None = None
        self.parts = ReplyParts(self)  # the reply's reasoning, tool calls, and the chat's Think switch
        self.last_save = 0.0
        self.count_tokens = None
        self.ctx = 0
        self.generating = False
        self.loading = False
        self.model_info = None  # the Loaded event of the model in use
        self.tiers_now: dict = {}  # experts per tier, as the engine last reported
        self.params = SamplingParams(max_new_tokens=1024)
        self.remote = None  # a RemoteChat while the chat talks to a served model elsewhere
        self.server = LocalServer(self)
        self.device, self.dtype = device, dtype  # what File > Open model opens models with
        self.models = ModelSwitch(self)
        self._build()
        self.wait = ReplyWait(self.statusBar(), self)
        self.set_theme(theme.saved(), remember=False)
        self.refresh_conversations()
        self._store_timer = QTimer(self, interval=1000)  # writes that waited for a lock; the store's notices
        self._store_timer.timeout.connect(self._store_tick)
        self._store_timer.start()
        self._store_tick()
        self.gpu_offer.check()
        self.load_model(model, device, dtype)

    # ---- layout ----
    def _build(self) -> None:
        split = QSplitter(Qt.Horizontal)
        self._undo_btn = QPushButton("Undo delete")
        self._undo_btn.hide()
        self.sidebar = ConversationList(self.store, self._undo_btn)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.selected.connect(self._on_select)
        self.sidebar.deleted.connect(self._on_deleted)
        self.conv_list, self.search = self.sidebar.list, self.sidebar.search
        split.addWidget(self.sidebar)

        center = QWidget()
        cl = QVBoxLayout(center)
        self.gpu_offer = GpuOfferBar()
        self.gpu_offer.action.clicked.connect(lambda: self.gpu_runtime(start=self.gpu_offer.action.text() == "Download…"))
        cl.addWidget(self.gpu_offer)
        self.model_label = QLabel("loading…")
        self.model_label.setWordWrap(True)
        cl.addWidget(self.model_label)
        self.slider = QualitySlider()
        self.slider.changed.connect(lambda v: self.bridge.send(SetSlider(value=v)))
        cl.addWidget(self.slider)
        self.chat = ChatView()
        cl.addWidget(self.chat, 1)
        self.composer = Composer()
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.regenerate_requested.connect(self.regenerate)
        self.composer.edit_requested.connect(self.edit_last)
        self.composer.think_toggled.connect(self.parts.think_toggled)
        c = self.composer
        self.attachments, self.input, self.send_btn, self.stop_btn = c.attachments, c.input, c.send_btn, c.stop_btn
        self.context_label = c.context_label
        self.attachments.notice.connect(lambda m: (self.statusBar().showMessage(m, 15000), self.log_line(m)))
        cl.addWidget(c)
        split.addWidget(center)
        self.panel = LivePanel()
        self.server_box = ServerBox()
        self.panel.layout().insertWidget(0, self.server_box)
        split.addWidget(self.panel)
        split.setSizes([220, 700, 360])
        self.setCentralWidget(split)
        self.setAcceptDrops(True)

        self.progress = QProgressBar(minimumWidth=300, maximumWidth=560)
        self.progress.hide()
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.hide()
        self.cancel_btn.clicked.connect(lambda: self.bridge.send(Stop()))
        self.statusBar().addPermanentWidget(self.progress)
        self.statusBar().addPermanentWidget(self.cancel_btn)
        self.statusBar().addPermanentWidget(self._undo_btn)

        menus.build(self)

    # ---- models ----
    def load_model(self, path: str, device: str | None = None, dtype: str | None = None) -> None:
        """Open a model (device and dtype: the window's unless given); the one in use stays until the
        new one is ready, and comes back if the new one fails (app/model_picker.py ModelSwitch)."""
        self.models.open((path, device or self.device, dtype or self.dtype))

    @property
    def model_spec(self) -> tuple | None:
        return self.models.spec

    def pick_model(self) -> None:
        """File > Open model…: the picker (non-blocking): recent models, a folder, or a hub id."""
        from .model_picker import ModelPicker

        self.picker = ModelPicker(self)
        self.picker.accepted.connect(lambda: self.picker.choice and self.load_model(self.picker.choice))
        self.picker.open()

    # ---- conversations ----
    def refresh_conversations(self) -> None:
        self.sidebar.current = self.cid
        self.sidebar.refresh()

    def new_chat(self) -> None:
        self.cid = self.store.new_conversation()
        self.refresh_conversations()
        self.chat.show_messages([])
        self.composer.set_think(True)

    def _on_select(self, cid: int) -> None:
        if not self.generating:
            if cid != self.cid:
                self.chat.unfolded.clear()  # a chat opened shows its reasoning folded
            self.cid = cid
            self.chat.show_messages(self.store.messages(self.cid))
            self.composer.set_think(self.parts.chat_thinks())

    def _on_deleted(self, cid: int) -> None:
        if cid == self.cid:
            self.cid = None
            self.chat.show_messages([])
        self.sidebar.current = self.cid

    def delete_conversation(self, cid: int) -> None:
        self.sidebar.delete(cid)

    # ---- sending ----
    def history(self) -> list[dict]:
        c = self.store.conversation(self.cid)
        msgs = [{"role": "system", "content": c.system_prompt}] if c.system_prompt else []
        return msgs + [{"role": m.role, "content": m.content} for m in self.store.messages(self.cid)
                       if m.complete or m.role == "user"]

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if self.generating or (not text and not self.docs) or not self.send_btn.isEnabled():
            return
        if self.cid is None:
            self.cid = self.store.new_conversation(title=(text or self.docs[0].name)[:40])
        elif self.store.conversation(self.cid).title == "New chat":
            self.store.rename(self.cid, (text or self.docs[0].name)[:40])
        content = documents.prompt_with_documents(text, self.docs)
        self.store.add_message(self.cid, "user", content,
                               meta=self.parts.with_switch({"attachments": [d.name for d in self.docs]}))
        self.input.clear()
        self.attachments.clear()
        self.refresh_conversations()
        self.chat.show_messages(self.store.messages(self.cid))
        self._generate()

    def _generate(self) -> None:
        self.reply_mid = self.store.add_message(self.cid, "assistant", "", complete=False)
        self.generating = True
        self.last_save = time.monotonic()
        self.composer.set_generating(True)
        self.chat.begin_stream(key=self.reply_mid)
        self.parts.begin()
        if self.remote is not None:
            self.request = self.remote.generate(self.history(), self.params)
        else:
            self.wait.reply_started()  # says so if a calibration step holds it back
            self.request = self.bridge.send(Generate(messages=self.history(), params=self.params,
                                                     thinking=self.parts.thinking))

    def stop(self) -> None:
        if self.generating and self.remote is not None:
            self.remote.stop(self.request)
        elif self.generating:
            self.bridge.send(Stop(request_id=self.request))

    # ---- the network (app/serving.py) ----
    def toggle_server(self, on: bool, port: int | None = None, api_key: str = "") -> None:
        if not on:
            self.server.stop()
            self.server_box.stop()
            return
        if port is None:
            dlg = ServerDialog(self)
            if not menus.run_modal(dlg):
                self.server_action.setChecked(False)
                return
            port, api_key = dlg.port.value(), dlg.key.text().strip()
        try:
            url = self.server.start(self.bridge.session, port, api_key)
        except (OSError, ValueError) as e:
            self.statusBar().showMessage(f"the local server could not start: {e}", 15000)
            self.server_action.setChecked(False)
            return
        self.server_action.blockSignals(True)  # started from code: the menu shows it too
        self.server_action.setChecked(True)
        self.server_action.blockSignals(False)
        self.server_box.show_server(self.server.server, self.model_info.name if self.model_info else "(loading)")
        self.log_line(f"local server at {url}")

    def connect_remote(self, choice: tuple[str, str, str] | None = None) -> bool:
        """File > Connect to a server (the dialog), or straight to choice = (url, key, model)."""
        return remote.connect(self, choice)

    def disconnect_remote(self) -> None:
        remote.disconnect(self)

    def regenerate(self) -> None:
        if self.generating or self.cid is None:
            return
        msgs = self.store.messages(self.cid)
        if msgs and msgs[-1].role == "assistant":
            self.store.delete_messages_from(self.cid, msgs[-1].id)
        if self.store.messages(self.cid):
            self.chat.show_messages(self.store.messages(self.cid))
            self._generate()

    def edit_last(self) -> None:
        if self.generating or self.cid is None:
            return
        users = [m for m in self.store.messages(self.cid) if m.role == "user"]
        if users:
            self.input.setPlainText(users[-1].content)
            self.store.delete_messages_from(self.cid, users[-1].id)
            self.chat.show_messages(self.store.messages(self.cid))

    # ---- engine events ----
    def on_events(self, batch: list) -> None:
        for ev in batch:
            self.on_event(ev)

    def on_event(self, ev) -> None:
        if self.models.on_event(ev):  # the answer to File > Open model's check or load
            return
        if isinstance(ev, Token) and ev.request_id == self.request:
            self.wait.reply_streaming()
            self.parts.take(ev)
            now = time.monotonic()
            if now - self.last_save >= SAVE_PARTIAL_S:  # a kill loses at most this much of a reply
                meta = self.parts.meta()
                self.store.update_message(self.reply_mid, self.chat.streamed, complete=False, meta=meta or None)
                self.last_save = now
        elif isinstance(ev, Done) and ev.request_id == self.request:
            self.wait.reply_streaming()
            stats = (f"{ev.decode_tok_s:.1f} tok/s · {len(ev.token_ids)} tokens · prefill {ev.prompt_tokens - ev.reused_tokens} "
                     f"tok in {ev.prefill_s:.2f} s · {ev.reason}" + (self.wait.stats_note() if self.remote is None else ""))
            meta = self.parts.meta(ev, stats=stats)
            content = ev.content
            self.store.update_message(self.reply_mid, content, complete=True, meta=meta)
            self.chat.end_stream(stats, content, meta)
            self.generating = False
            self.composer.set_generating(False)
            self.context_label.setText(f"context {ev.prompt_tokens + len(ev.token_ids)}/{self.ctx}")
        elif isinstance(ev, Stats):
            if self.remote is not None:
                return  # the local engine's numbers: not what the chat uses now
            self.panel.show_stats(ev)
            if ev.tiers != self.tiers_now:
                self.tiers_now = dict(ev.tiers)
                self.model_bar()
        elif isinstance(ev, PlacementChanged):
            self.panel.map.set_placement(ev.placement)
            self.panel.show_migration(0, ev.moves)
            self.slider.show_plan(ev)
        elif isinstance(ev, MigrationProgress):
            self.panel.show_migration(ev.done, ev.total)
        elif isinstance(ev, Progress):
            if ev.stage == "calibrate" and not self.loading:
                self.wait.calibration(ev.done < ev.total, ev.what)
            self.progress.show()
            self.cancel_btn.setVisible(ev.stage in ("calibrate", "download"))
            self.progress.setRange(0, max(ev.total, 1))
            self.progress.setValue(ev.done)
            label = "calibrating in the background (chat away)" if ev.stage == "calibrate" and not self.loading else ev.stage
            if ev.stage == "download":
                label = f"downloading {ev.what.split(':')[0]} ({ev.done}/{ev.total} files)"
            self.progress.setFormat(f"{label}: %p%")
        elif isinstance(ev, Loaded):
            self.progress.hide()
            self.cancel_btn.hide()
            self.count_tokens, self.ctx = ev.count_tokens, ev.ctx
            self.attachments.set_context(ev.ctx, ev.count_tokens)
            self.model_info = ev
            self.composer.think_btn.setVisible(ev.thinking_switch)
            self.model_label.setToolTip(ev.description)  # the technical line
            self.wait.calibration(False)  # a calibration that ends says so with a Loaded
            if self.remote is None:
                self.model_bar()
            if self.server.running:
                self.server_box.show_server(self.server.server, ev.name)
            self.panel.map.set_share(ev.share)
            self.loading = self.models.busy  # a Loaded of the model in use while another is being opened: still busy
            self.send_btn.setEnabled(not self.generating and not self.loading)
            self.log_line(f"loaded {ev.name}: {ev.description}")
            self.models.loaded()
        elif isinstance(ev, EngineStopped):
            self.log_line(f"error: {ev.message}")
            self._end_failed_reply(ev.message)
            self.send_btn.setEnabled(False)
            self.model_label.setText(ev.message)
            box = self.stopped_box = QMessageBox(QMessageBox.Icon.Critical, "Mixdesk", ev.message, parent=self)
            box.setInformativeText("Restart the engine to reload the model." + (f"\nDetails: {ev.log}" if ev.log else ""))
            restart = box.addButton("Restart engine", QMessageBox.ButtonRole.AcceptRole)
            box.addButton(QMessageBox.StandardButton.Close)
            restart.clicked.connect(self.restart_engine)
            box.setWindowModality(Qt.WindowModality.NonModal)
            box.open()
        elif isinstance(ev, ErrorEvent):
            self.log_line(f"error: {ev.message}")
            self.statusBar().showMessage(ev.message.splitlines()[0], 15000)
            if ev.request_id == self.request and self.generating:
                self.wait.reply_streaming()
                self._end_failed_reply(ev.message)
            if ev.message.startswith(("calibrat", "calibration")):
                self.wait.calibration(False)
                self.progress.hide()
                self.cancel_btn.hide()

    def _end_failed_reply(self, message: str) -> None:
        """The reply in progress ended with an error: keep what streamed (marked), or drop the empty
        row, and leave "generating"."""
        if not self.generating:
            return
        if self.chat.streamed or self.chat.streamed_reasoning:
            note = f"stopped by an error: {message.splitlines()[0]}"
            self.store.update_message(self.reply_mid, self.chat.streamed, complete=True, meta=self.parts.meta(stats=note))
            self.chat.end_stream(note)
        else:
            self.store.delete_messages_from(self.cid, self.reply_mid)
        self.chat.show_messages(self.store.messages(self.cid))
        self.generating = False
        self.composer.set_generating(False)

    def set_theme(self, name: str, remember: bool = True) -> None:
        """System, Light or Dark; remembered across starts (app/theme.py)."""
        self.theme = name
        self.chat.code_style = theme.apply(name, remember)
        self.panel.set_dark(theme.is_dark(QApplication.palette()))
        self.theme_actions[name].setChecked(True)
        if self.cid is not None and not self.generating:
            self.chat.show_messages(self.store.messages(self.cid))  # code blocks in the new style

    def model_bar(self) -> None:
        """The model bar, for people: name and size, where it runs, and the current 16/4-bit mix."""
        ev = self.model_info
        if ev is None:
            return
        p = ev.params
        size = (f"{p / 1e9:.1f}B" if p >= 1e9 else f"{p / 1e6:.0f}M" if p >= 1e6 else f"{p / 1e3:.0f}K") + " parameters"
        where = "CPU only" if ev.cpu_only else "GPU + CPU"
        n16 = sum(n for t, n in self.tiers_now.items() if t.endswith("16"))
        n4 = sum(n for t, n in self.tiers_now.items() if t.endswith("-4"))
        mix = f" · {n16} experts at 16-bit, {n4} at 4-bit" if n16 + n4 else ""
        if ev.weights:  # a GGUF file: its own precision, and what the slider re-quantised
            mix = f" · {ev.weights}" + (f" · {n4} experts re-quantised to 4-bit" if n4 and not ev.weights_4bit else "")
        self.model_label.setText(f"<b>{ev.name}</b> · {size} · {where}{mix}")

    def _store_tick(self) -> None:
        if self.store.pending:
            self.store.flush()
        while self.store.notices:
            note = self.store.notices.pop(0)
            self.log_line(note)
            self.statusBar().showMessage(note, 20000)

    def restart_engine(self) -> None:
        self.log_line("restarting the engine")
        self.server_action.setChecked(False)  # the server was a listener of the old engine thread
        self.bridge.restart()
        self.models.restart()

    # ---- documents (app/attachments.py) ----
    @property
    def docs(self) -> list[documents.Document]:
        return self.attachments.docs

    @property
    def too_long_box(self):
        return self.attachments.too_long_box

    def attach(self, path: str) -> None:
        self.attachments.attach(path)

    def chip_widgets(self):
        return self.attachments.chip_widgets()

    def paste_files(self, mime=None) -> bool:
        return self.composer.paste_files(mime)

    def dragEnterEvent(self, e):
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e):
        for url in e.mimeData().urls():
            if url.isLocalFile():
                self.attachments.attach(url.toLocalFile())

    def log_line(self, line: str) -> None:
        self.log_lines.append(time.strftime("%H:%M:%S ") + line)
        log.info(line)

    def gpu_runtime(self, start: bool = False) -> RuntimeDialog:
        """Settings > GPU runtime (or the offer bar's Download…, which starts the install at once)."""
        self.gpu_offer.hide()
        dlg = RuntimeDialog(self, self.gpu_offer.worker, start=start)
        dlg.show()
        self.runtime_dialog = dlg
        return dlg

    def closeEvent(self, e):
        if self.generating and self.reply_mid is not None:
            self.store.update_message(self.reply_mid, self.chat.streamed, complete=False, meta=self.parts.meta() or None)
        self.server.stop()
        self.bridge.shutdown(timeout=10.0)
        self._store_timer.stop()
        if not self.store.close():  # what waits is written, or kept for the next start; else the user is told
            QMessageBox.warning(self, "Chats not saved", self.store.notices[-1])
        super().closeEvent(e)
