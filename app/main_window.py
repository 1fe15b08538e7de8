"""The main window: conversations, chat, attachments, the slider and the live panel.

A reply arrives read in the model's format (engine/prompts/formats): its content is the answer (what the
store keeps as the message, and all that later turns send back), its reasoning and tool calls are
kept in the message's meta and shown around the answer (app/chat/reasoning_view.py). It reaches the
engine only through EngineBridge (commands out, events in, on the GUI thread)."""
from __future__ import annotations

import logging
import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QMainWindow, QMessageBox, QPushButton, QSplitter, QVBoxLayout, QWidget)

from engine.protocol import SetSlider, Stop

from . import menus, theme, window_state
from .bridge import EngineBridge
from .chat import defaults as chat_defaults, documents, remote
from .chat.backend import LocalBackend
from .chat.composer import Composer
from .chat.conversation_list import ConversationList
from .chat.reply_flow import ReplyFlow, ReplyHooks
from .chat.session import ChatSession
from .chat.view import ChatView
from .chat.waiting import ReplyWait
from .dialogs import lowest_precision
from .dialogs.context_choice import ContextButton, ContextSwitch, remembered
from .engine_controller import EngineController
from .gpu_runtime import GpuOfferBar, RuntimeDialog
from .model_bar import ModelBar
from .model_switch import ModelSwitch
from .panel.live_panel import LivePanel
from .panel.quality_slider import QualitySlider
from .panel.switch import PanelSwitch
from .progress_row import ProgressRow, StatusBar
from .serving import LocalServer, ServerBox
from .store.chat_store import Store
from .window_wiring import WindowWiring


class MainWindow(QMainWindow, WindowWiring):
    def __init__(self, store: Store, model: str = "demo", session_kwargs: dict | None = None,
                 device: str | None = None, dtype: str = "auto", ctx=None, kv_bits: int = 16):
        """ctx: the context to open the model at ("auto" or tokens; None: the one chosen for it last).
        kv_bits: 16 or 8, the keys-and-values format models open with (engine/kv/int8.py)."""
        super().__init__()
        self.setWindowTitle("Mixdesk")
        self.resize(1280, 800)
        self.store = store
        self.bridge = EngineBridge(session_kwargs, self)
        self.engine = EngineController(self.bridge, self)  # events -> typed signals, which the widgets follow
        self.log_lines: list[str] = []
        self.cid: int | None = None
        self.sessions: dict = {}  # chat id -> its ChatSession (draft, edit, versions) while the window is open
        self.count_tokens = None
        self.ctx = 0
        self.loading = False
        self.model_info = None  # the Loaded event of the model in use
        self.params = chat_defaults.saved()  # what new chats start from (Chat > Defaults for new chats…)
        self.remote = None  # a RemoteChat while the chat talks to a served model elsewhere
        self.local = LocalBackend(lambda cmd: self.bridge.send(cmd), lambda: self.model_info)  # the engine, as a backend
        self.server = LocalServer(self)
        self.device, self.dtype = device, dtype  # what File > Open model opens models with
        self.setStatusBar(StatusBar())  # says when its room changes (the progress row fits itself to it)
        self.wait = ReplyWait(self.statusBar(), self)
        self._build()
        self.models = ModelSwitch(self.switch_parts())  # handed its parts, not the window (app/window_wiring.py)
        self.models.kv_bits = kv_bits
        self.contexts = ContextSwitch(self.bridge.send, lambda: self.models.current and self.models.current[0], self)
        self.contexts.changed.connect(self.models.context_changed)
        self.contexts.refused.connect(lambda _: self.attachments.waiting.clear())  # the longer context is not coming
        self.remote_parts = self.remote_parts_of()  # app/chat/remote.py's connect, disconnect, show_mode
        self._follow()
        self.set_theme(theme.saved(), remember=False)
        self.refresh_conversations()
        self._store_timer = QTimer(self, interval=1000)  # writes that waited for a lock; the store's notices
        self._store_timer.timeout.connect(self._store_tick)
        self._store_timer.start()
        self._store_tick()
        self.gpu_offer.check()
        shown = (self.panel_switch, self.enter_sends_action)  # geometry, slider and the chat that was open:
        window_state.restore(self, self.splitter, *shown, self.slider, self.store, self.open_chat)
        window_state.follow(self.slider, self.sidebar.selected, *shown, self.store.path)
        self.lowest.announce()  # the lowest precision remembered, with the slider restored
        self.load_model(model, device, dtype, ctx)

    # ---- layout ----
    def _build(self) -> None:
        split = self.splitter = QSplitter(Qt.Horizontal)
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
        self.model_label = ModelBar()
        self.context_button = ContextButton()  # the model's context: auto or a length, changed without a reload
        self.context_button.chosen.connect(lambda value: self.contexts.request(value))
        bar = QHBoxLayout()
        bar.addWidget(self.model_label, 1)
        bar.addWidget(self.context_button)
        cl.addLayout(bar)
        self.slider = QualitySlider()
        self.slider.changed.connect(lambda v: self.bridge.send(SetSlider(value=v)))
        cl.addWidget(self.slider)
        self.chat = ChatView()
        self.chat.notice.connect(lambda m: self.statusBar().showMessage(m, 15000))  # a chip's file that cannot open
        self._restyle = QTimer(self, singleShot=True, interval=0)  # a child: it dies with the window
        self._restyle.timeout.connect(self.redraw_chat)
        self.chat.restyle.connect(self._restyle.start)
        self.chat.version_requested.connect(self.show_version)
        cl.addWidget(self.chat, 1)
        self.composer = Composer()
        self.reply = ReplyFlow(self.chat, self.composer, self.store, self.engine, self.wait, ReplyHooks(  # send ... end
            session=lambda: self.chat_session, cid=lambda: self.cid, chat_sent=self._chat_sent,
            backend=lambda: self.backend, params=lambda: self.params, ctx=lambda: self.ctx,
            status=lambda m, ms: self.statusBar().showMessage(m, ms), log=lambda m: self.log_line(m),
            ended=lambda: (self.redraw_chat(), self.models.reply_ended())))  # a model checked meanwhile loads
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.regenerate_requested.connect(self.reply.regenerate)
        self.composer.edit_requested.connect(self.reply.edit_last)
        self.composer.think_toggled.connect(lambda on: self.chat_session.set_think(on))
        c = self.composer
        self.attachments, self.input, self.send_btn, self.stop_btn = c.attachments, c.input, c.send_btn, c.stop_btn
        self.context_label = c.context_label
        self.attachments.notice.connect(lambda m: (self.statusBar().showMessage(m, 15000), self.log_line(m)))
        self.attachments.longer_context.connect(lambda n: self.contexts.request(n, remember_it=False))  # for a document
        self.chat.file_dropped.connect(self.attachments.attach)  # files dropped on the messages: attached
        cl.addWidget(c)
        split.addWidget(center)
        self.panel = LivePanel()
        self.server_box = ServerBox()
        self.panel.layout().insertWidget(0, self.server_box)
        split.addWidget(self.panel)
        split.setSizes([220, 700, 360])
        self.panel_switch = PanelSwitch(split, self.panel, self)  # View > Show live panel
        self.setCentralWidget(split)
        self.setAcceptDrops(True)

        self.progress_row = ProgressRow(self.statusBar(), stop=lambda: self.bridge.send(Stop()), loading=lambda: self.loading)
        self.progress, self.cancel_btn = self.progress_row.bar, self.progress_row.cancel
        self.statusBar().addPermanentWidget(self._undo_btn)

        acts = menus.build(self.menuBar(), self.menu_commands())  # the actions kept: checked from code
        self.server_action, self.enter_sends_action, self.theme_actions = acts.server, acts.enter_sends, acts.themes
        self.lowest = lowest_precision.LowestPrecision(self, acts.settings, self.slider.value, self.bridge.send)

    def _follow(self) -> None:
        """Each reader of the engine's events subscribes to the controller's signals."""
        e = self.engine
        e.filters.append(self.models.on_event)  # the answer to File > Open model's check or load
        e.filters.append(self.contexts.on_event)  # the answer to a SetContext (the model bar's, a document's)
        self.reply.follow(e)
        self.model_label.follow(e)
        self.progress_row.follow(e)
        self.composer.follow(e)
        e.progress.connect(self._on_progress)
        e.loaded.connect(self._on_loaded)
        e.error.connect(self._on_error)
        e.engine_stopped.connect(self._on_engine_stopped)
        self.panel.follow(e)  # stats, loaded, placement_changed, migration_progress, calibration_finished
        self.slider.follow(e)  # placement_changed

    # ---- models ----
    def load_model(self, path: str, device: str | None = None, dtype: str | None = None, ctx=None) -> None:
        """Open a model (device and dtype: the window's unless given; ctx: "auto" or tokens, None: the
        one chosen for this model last); the one in use stays until the new one is ready, and comes
        back if the new one fails (app/model_switch.py)."""
        self.models.open((path, device or self.device, dtype or self.dtype, remembered(path) if ctx is None else ctx))

    @property
    def model_spec(self) -> tuple | None:
        return self.models.spec

    def pick_model(self) -> None:
        """File > Open model…: the picker (non-blocking): recent models, a folder, or a hub id."""
        from .dialogs.model_picker import ModelPicker

        self.picker = ModelPicker(self, in_use=self.models.current[0] if self.models.current else None,
                                  device=self.device, dtype=self.dtype)
        self.picker.accepted.connect(lambda: self.picker.choice and self.load_model(self.picker.choice,
                                                                                    ctx=self.picker.context))
        self.picker.open()

    # ---- conversations ----
    def refresh_conversations(self) -> None:
        self.sidebar.current = self.cid
        self.sidebar.refresh()

    @property
    def backend(self):
        """Where the chat's replies come from (app/chat/backend.py): a served model, else the engine."""
        return self.remote if self.remote is not None else self.local

    @property
    def chat_session(self) -> ChatSession:
        """The chat shown, as app/chat/session.py holds it."""
        if self.cid not in self.sessions:
            self.sessions[self.cid] = s = ChatSession(self.store, self.cid)
            s.watch(self._session_said)
        return self.sessions[self.cid]

    def _session_said(self, session: ChatSession, what: str) -> None:
        """A chat's session changed (app/chat/session.py watch): the widgets are handed what they show."""
        shown = self.sessions.get(self.cid) is session  # a chat made by this Send is under None until it is sent
        if what in ("messages", "ended"):  # titles, and the newest chat first
            self.sidebar.current = session.cid if shown else self.cid
            self.sidebar.refresh()
        if not shown:
            return
        if what == "messages":
            self.chat.show_messages(session.messages())
        elif what == "edit":
            self.reply.show_editing()

    def _leave_chat(self) -> None:
        """The chat shown keeps what was being written in it."""
        self.chat_session.draft = self.composer.draft()

    def _enter_chat(self) -> None:
        gone = self.composer.show_draft(self.chat_session.draft)
        self.reply.show_editing()
        if gone:
            self.statusBar().showMessage(f"no longer there, not attached: {', '.join(gone)}", 15000)

    def _chat_sent(self, cid: int, session: ChatSession) -> None:
        """Send wrote to chat cid (made then if none was shown): the chat shown, its session kept."""
        self.cid = cid
        self.sessions.pop(None, None)
        self.sessions[cid] = session

    def show_version(self, mid: int, j: int) -> None:
        """A regenerated reply's ‹ ›: that version shown, and sent to the model from now on."""
        if self.generating:
            self.statusBar().showMessage("The answers can be switched when this reply ends", 8000)
        else:
            self.chat_session.show_version(mid, j)  # drawn again as the session says (_session_said)

    def new_chat(self) -> None:
        self._leave_chat()
        self.cid = self.store.new_conversation()
        self.refresh_conversations()
        self.chat.show_messages([])
        self.composer.set_think(True)
        self.composer.show_context(None)
        self._enter_chat()

    def _on_select(self, cid: int) -> None:
        if self.generating:  # the chat shown stays highlighted: its reply is still coming
            if cid != self.cid:
                self.statusBar().showMessage("Another chat opens when this reply ends (or Stop it)", 8000)
            self.refresh_conversations()
            return
        self.open_chat(cid)

    def open_chat(self, cid: int) -> None:
        """Show chat cid (and highlight it in the sidebar)."""
        if cid != self.cid:
            self.chat.unfolded.clear()  # a chat opened shows its reasoning folded
            self._leave_chat()
        switched = cid != self.cid
        self.cid = self.sidebar.current = cid
        if switched:
            self._enter_chat()
        messages = self.store.messages(self.cid)
        self.chat.show_messages(messages)
        self.composer.set_think(self.chat_session.thinks())
        self.composer.show_context(self.reply.context_of(messages),
                                   limit=self.chat_session.context(self.ctx))  # the chat's memory
        self.sidebar.highlight(cid)

    def _on_deleted(self, cid: int) -> None:
        self.sessions.pop(cid, None)
        if cid == self.cid:
            self.cid = None
            self.chat.show_messages([])
            self.composer.show_context(None)
        self.sidebar.current = self.cid

    def delete_conversation(self, cid: int) -> None:
        self.sidebar.delete(cid)

    # ---- sending (app/chat/reply_flow.py) ----
    @property
    def generating(self) -> bool:
        return self.reply.generating

    def history(self) -> list[dict]:
        return self.reply.history()

    def send(self) -> None:
        self.reply.send()

    def stop(self) -> None:
        self.reply.stop()

    # ---- the network (app/serving.py; the Local server's switch: app/window_wiring.py) ----
    def connect_remote(self, choice: tuple[str, str, str] | None = None) -> bool:
        """File > Connect to a server (the dialog), or straight to choice = (url, key, model)."""
        return remote.connect(self.remote_parts, choice)

    def disconnect_remote(self) -> None:
        remote.disconnect(self.remote_parts)

    # ---- engine events (app/engine_controller.py: each widget follows what it shows) ----
    def on_events(self, batch: list) -> None:
        """Events given to the window directly (a test, a script): as if the engine sent them."""
        self.engine.take(batch)

    def on_event(self, ev) -> None:
        self.engine.dispatch(ev)

    def _on_loaded(self, ev) -> None:
        self.count_tokens, self.ctx = ev.count_tokens, ev.ctx
        self.model_info = ev
        self.context_button.show_context(getattr(ev, "context", None))
        self.wait.calibration(False)  # a calibration that ends says so with a Loaded
        if self.server.running:
            self.server_box.show_server(self.server.server, ev.name)
        self.loading = self.models.busy  # a Loaded of the model in use while another is being opened: still busy
        self.send_btn.setEnabled(not self.generating and not self.loading)
        self.log_line(f"loaded {ev.name}: {ev.description}")
        if getattr(ev, "memory", ""):
            self.log_line(ev.memory)
            if "read from disk" in ev.memory:  # paging: said where it is seen, not only in the log
                self.statusBar().showMessage(ev.memory.split(". ", 1)[1], 30000)
        self.models.loaded()

    def _on_progress(self, ev) -> None:
        if ev.stage == "calibrate" and not self.loading:
            self.wait.calibration(ev.done < ev.total, ev.what)

    def _on_error(self, ev) -> None:
        self.log_line(f"error: {ev.message}")
        self.statusBar().showMessage(ev.message.splitlines()[0], 15000)
        if getattr(ev, "kind", "") == "ModelClosed":  # the engine closed the model (its file changed on disk)
            self.model_info = None
            self.send_btn.setEnabled(False)
            self.model_label.closed(ev.message)
        if ev.message.startswith("calibrat"):
            self.wait.calibration(False)

    def _on_engine_stopped(self, ev) -> None:
        self.log_line(f"error: {ev.message}")
        self.send_btn.setEnabled(False)
        self.model_label.setText(ev.message)
        box = self.stopped_box = QMessageBox(QMessageBox.Icon.Critical, "Mixdesk", ev.message, parent=self)
        box.setInformativeText("Restart the engine to reload the model." + (f"\nDetails: {ev.log}" if ev.log else ""))
        restart = box.addButton("Restart engine", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Close)
        restart.clicked.connect(self.restart_engine)
        box.setWindowModality(Qt.WindowModality.NonModal)
        box.open()

    def set_theme(self, name: str, remember: bool = True) -> None:
        """System, Light or Dark; remembered across starts (app/theme.py)."""
        self.theme = name
        self.chat.code_style = theme.apply(name, remember)
        self.panel.set_dark(theme.is_dark(QApplication.palette()))
        self.theme_actions[name].setChecked(True)
        self.chat.stale_colours = True  # code blocks in the new style: redrawn once, with the palette's change
        self._restyle.start()

    def redraw_chat(self) -> None:
        """The chat shown drawn again in the theme's colours, once no reply streams into it (a reply
        that streams ends with it: ReplyFlow)."""
        if self.chat.stale_colours and self.cid is not None and not self.generating:
            self.chat.show_messages(self.store.messages(self.cid))

    def model_bar(self) -> None:
        """The model bar shows the local model again (app/model_bar.py)."""
        self.model_label.show_model()

    @property
    def tiers_now(self) -> dict:
        return self.model_label.tiers

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

    # ---- documents (app/chat/attachments.py) ----
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
        logging.getLogger("mixdesk").info(line)

    def gpu_runtime(self, start: bool = False) -> RuntimeDialog:
        """Settings > GPU runtime (or the offer bar's Download…, which starts the install at once)."""
        self.gpu_offer.hide()
        dlg = RuntimeDialog(self, self.gpu_offer.worker, start=start)
        dlg.show()
        self.runtime_dialog = dlg
        return dlg

    def closeEvent(self, e):
        self.reply.save_partial()
        window_state.save(self, self.splitter, self.store.path, self.cid)
        self.server.stop()
        self.bridge.shutdown(timeout=10.0)
        self._store_timer.stop()
        if not self.store.close():  # what waits is written, or kept for the next start; else the user is told
            QMessageBox.warning(self, "Chats not saved", self.store.notices[-1])
        super().closeEvent(e)
