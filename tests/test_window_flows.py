"""The flows a tester found broken (issue 25), walked as a user walks them: through the menu's
QAction, the model picker's buttons, the composer's Send button, and the dialogs they open."""
from pathlib import Path
import time

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402

from engine.runtime.client import Client  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.tools.serve import Server  # noqa: E402

from main_window_helpers import open_window, window  # noqa: E402,F401  (the same window fixture)
from store_helpers import small_disk  # noqa: E402,F401  (a tmpfs that fills)
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402
from server_window_helpers import fill_connect, say, second_server  # noqa: E402,F401 (shared: tests/server_window_helpers.py)


def test_connect_to_a_server_from_the_file_menu_opens_the_dialog_and_chats(qtbot, window, second_server, tiny):
    """Defect 1: the menu's triggered(bool) reached connect_remote(choice) as False (a TypeError on
    stderr, no dialog)."""
    server, other = second_server
    with no_uncaught_exceptions():
        seen = on_modal(fill_connect(server.url, "k3y"))  # the model from the server's /models
        menu_actions(window)["File/Connect to a server…"].trigger()
        assert seen, "no dialog opened"
        assert window.remote is not None and window.remote.model == tiny.name
        assert window.panel.mode.text().startswith("remote: ") and not window.slider.isVisible()
        reply = say(qtbot, window, "hello from the window", 12)
        assert reply.complete and reply.content and "12 tokens" in reply.meta["stats"]
        want = other.generate(messages=[{"role": "user", "content": "hello from the window"}],
                              params=SamplingParams(max_new_tokens=12))
        assert reply.content == want.text  # the remote model's own reply
        assert "12 tokens" in window.chat.toPlainText()  # shown, with its stats line
        menu_actions(window)["File/Use the local model"].trigger()
        assert window.remote is None and window.slider.isVisible()
        assert say(qtbot, window, "and locally", 4).complete


def test_a_failed_open_of_a_folder_that_is_not_a_model_keeps_the_old_model_chatting(qtbot, window, tmp_path):
    """Defect 2, through File > Open model folder… and through the picker: the old model stays
    loaded while the new one is checked; the failure is said; Send works and replies."""
    not_a_model = tmp_path / "holiday photos"
    not_a_model.mkdir()
    (not_a_model / "notes.txt").write_text("not a model")
    old = window.model_info.name
    session = window.bridge.session
    loaded_before = session.loaded

    def choose(dlg):
        assert isinstance(dlg, QFileDialog)
        dlg.setDirectory(str(not_a_model))  # a folder dialog opens the folder it shows
        dlg.accept()

    with no_uncaught_exceptions():
        seen = on_modal(choose, QFileDialog)
        menu_actions(window)["File/Open model folder…"].trigger()
        assert seen
        qtbot.waitUntil(lambda: "could not be opened" in window.statusBar().currentMessage(), timeout=60_000)
        msg = window.statusBar().currentMessage()
        assert f"{not_a_model.name} could not be opened" in msg and f"Still using {Path(window.model_spec[0]).name}" in msg
        assert msg.count(str(not_a_model)) == 0 and not msg.startswith(not_a_model.name)  # the reason first
        assert session.loaded is loaded_before  # never let go
        assert window.send_btn.isEnabled() and old in window.model_label.text()
        assert say(qtbot, window, "still there?", 6).complete

        # the same through the model picker's own field and button
        menu_actions(window)["File/Open model…"].trigger()
        picker = window.picker
        picker.hub.setText(str(tmp_path / "nowhere"))
        button = next(b for b in picker.findChildren(type(window.send_btn)) if b.text() == "Download and open")
        qtbot.mouseClick(button, Qt.LeftButton)
        qtbot.waitUntil(lambda: "nowhere could not be opened" in window.statusBar().currentMessage(),
                        timeout=60_000)
        reply = say(qtbot, window, "and now?", 6)
        assert reply.complete and "tokens/s" in reply.meta["stats"]
        assert session.loaded is loaded_before


def test_a_failed_open_after_the_old_model_was_let_go_brings_it_back(qtbot, window, tmp_path, tiny,
                                                                                 monkeypatch):
    """Defect 2, the other half: a model that passes the check but fails while it is built (the
    engine unloads the model in use first: engine/runtime/session.py _load, e.g. out of memory). The
    window reopens the previous model and says both things."""
    import shutil

    import engine.runtime.load
    from engine.protocol.errors import ModelError

    broken = tmp_path / "broken-copy"
    shutil.copytree(tiny, broken)
    real = engine.runtime.load.load

    def load(folder, *a, **k):
        if str(folder) == str(broken):
            raise ModelError(broken, "ran out of memory while building its experts (injected)")
        return real(folder, *a, **k)
    monkeypatch.setattr(engine.runtime.load, "load", load)
    old = window.model_info.name
    with no_uncaught_exceptions():
        on_modal(lambda d: (d.setTextValue(str(broken)), d.accept()))
        menu_actions(window)["File/Open Hugging Face model…"].trigger()  # any spec: a folder here
        qtbot.waitUntil(lambda: "is back" in window.statusBar().currentMessage(), timeout=120_000)
        msg = window.statusBar().currentMessage()
        assert msg.startswith("ran out of memory") and f"{tiny.name} is back" in msg
        assert window.model_info.name == old and window.send_btn.isEnabled()
        assert any("could not be opened" in line for line in window.log_lines)
        assert say(qtbot, window, "are you back?", 6).complete


def test_a_reply_held_back_by_a_calibration_step_says_what_it_waits_for(qtbot, tiny, tmp_path, monkeypatch,
                                                                       measured_machine):
    """Defect 3: on a model's first start, a reply sent while a calibration step runs waited
    17-21 s with no word. The status line now says so while it waits, and the stats say how long."""
    import engine.measures.inputs as inputs

    real = inputs.measure_dense_s

    def slow(*a, **k):  # the first background step, as long as on a busy machine (scaled down)
        time.sleep(4)
        return real(*a, **k)
    monkeypatch.setattr(inputs, "measure_dense_s", slow)
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    try:
        with no_uncaught_exceptions():
            qtbot.waitUntil(lambda: w.progress.isVisible() and "in the background" in w.progress.format(), timeout=30_000)
            w.params = SamplingParams(max_new_tokens=4)
            w.input.setPlainText("hello while it measures")
            qtbot.mouseClick(w.send_btn, Qt.LeftButton)
            qtbot.waitUntil(lambda: "your reply starts when" in w.statusBar().currentMessage(), timeout=3_000)
            msg = w.statusBar().currentMessage()
            assert "calibration" in msg and "timing the dense layers" in msg and "waiting" in msg
            assert w.generating and not w.chat.streamed
            qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
            reply = w.store.messages(w.cid)[-1]
            assert reply.complete and "waited" in reply.meta["stats"] and "calibration" in reply.meta["stats"]
            assert "your reply starts" not in w.statusBar().currentMessage()  # said no longer than it held
    finally:
        w.close()


def test_closing_with_chats_that_can_be_kept_nowhere_says_so(qtbot, tiny, small_disk, tmp_path, monkeypatch, window_cache):
    """The disk holding the chats fills, and the copy's folder is on it too: the window's close
    says plainly that the waiting messages are lost (the store's notice), never silently."""
    from PySide6.QtWidgets import QMessageBox

    from app.main_window import MainWindow
    from app.store.chat_store import Store
    from store_helpers import fill

    store = Store(small_disk / "chats.sqlite3", fallback_dirs=[small_disk / "state"])
    w = MainWindow(store, model=str(tiny), session_kwargs={"poll_s": 0.1}, device="cpu", dtype="fp32")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    filler = fill(small_disk)
    try:
        say(qtbot, w, "this one waits for room", 4)
        assert w.store.pending
        said = []
        on_modal(lambda box: (said.append(box.text()), box.accept()), QMessageBox)
        w.close()
        assert said and "lost when Mixdesk closes" in said[0], said
    finally:
        filler.unlink()


def test_a_refused_gguf_says_the_reason_first_and_its_name_once(qtbot, window, tmp_path):
    """The issue's case: a GGUF the engine refuses (an architecture it does not run). The status line
    gives the reason first, then the file's name once (never its whole path twice); Help > Log keeps
    the whole line with the path."""
    import gguf

    bad = tmp_path / "some-model-Q4_K_M.gguf"
    w = gguf.GGUFWriter(str(bad), "nonesuch")
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 8), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    session = window.bridge.session
    loaded_before = session.loaded
    with no_uncaught_exceptions():
        menu_actions(window)["File/Open model…"].trigger()
        picker = window.picker
        picker.hub.setText(str(bad))
        button = next(b for b in picker.findChildren(type(window.send_btn)) if b.text() == "Download and open")
        qtbot.mouseClick(button, Qt.LeftButton)
        qtbot.waitUntil(lambda: "could not be opened" in window.statusBar().currentMessage(), timeout=60_000)
    msg = window.statusBar().currentMessage()
    why, sep, rest = msg.partition(" — ")
    assert sep and rest.startswith((f"{bad.stem} could not be opened", f"{bad.name} could not be opened")), msg
    assert "nonesuch" in why, msg  # the reason, first
    assert str(tmp_path) not in msg and msg.count(bad.stem) == 1, msg  # the name once, no path
    assert any(str(bad) in line and "nonesuch" in line for line in window.log_lines), "the whole line in the log"
    assert session.loaded is loaded_before and window.send_btn.isEnabled()
