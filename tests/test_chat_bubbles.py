"""The chat view of issue 29, walked as a user walks it through the real window, on a tiny Qwen3-style
model whose replies are scripted (tests/scripted_chat.py): a streaming reply is Markdown while it
streams (bold is bold, a fence is a code block, not backticks); documents pasted into the composer
(Ctrl+V of files copied in a file manager) stay in the sent message as named chips that open the
file, and reach the model each with its name as a boundary; small sizes read in bytes, never "0 KB";
the footer under a reply speaks plainly, the technical detail in its tooltip."""
import time

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDesktopServices, QFont, QGuiApplication, QHelpEvent, QTextCursor  # noqa: E402
from PySide6.QtWidgets import QApplication, QToolTip  # noqa: E402

from app.main_window import MainWindow  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.protocol import Generate  # noqa: E402
from scripted_chat import script, write_chat_model  # noqa: E402
from window_helpers import no_uncaught_exceptions  # noqa: E402
from bubble_helpers import find, point_of  # noqa: E402,F401 (shared: tests/bubble_helpers.py)


def wait(cond, timeout_s=180.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        QApplication.processEvents()
        time.sleep(0.01)


@pytest.fixture(scope="module")
def w(qapp, tmp_path_factory):
    folder = write_chat_model(tmp_path_factory.mktemp("qwen3"), "qwen3")
    store = Store(tmp_path_factory.mktemp("chats") / "chats.sqlite3")
    win = MainWindow(store, model=str(folder), session_kwargs={"poll_s": 0.1}, device="cpu", dtype="fp32")
    win.resize(1280, 800)
    win.show()
    wait(lambda: win.send_btn.isEnabled())
    wait(lambda: not win.bridge.session.controller.calibrating)
    win.sent = []
    send = win.bridge.send
    win.bridge.send = lambda cmd: (win.sent.append(cmd), send(cmd))[1]
    yield win
    win.close()


def generator(w):
    return w.bridge.session.loaded.generator


def type_and_send(qtbot, w, text, n=400):
    w.params = SamplingParams(max_new_tokens=n)
    w.input.setPlainText(text)
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)


def test_a_streaming_reply_shows_rendered_markdown_before_it_ends(qtbot, w, pace):
    gen = generator(w)
    inner = gen.retrying
    tail = " ".join(f"word{i}" for i in range(300))
    reply = ("Some **bold words** here.\n\n```python\ndef f(x):\n    return x + 1\n```\n\n"
             f"- first item\n- second item\n\n{tail}")
    try:
        pace(gen, 0.02)
        with no_uncaught_exceptions():
            script(gen, reply)
            type_and_send(qtbot, w, "Show me some code", n=2000)
            view = w.chat
            wait(lambda: "second item" in view.streamed and view.flushes and not view._dirty or not w.generating, 60)
            shown = view.toPlainText()
            assert w.generating, "the reply ended before the test could look at it streaming"
            assert "bold words" in shown and "**" not in shown  # Markdown, not its marks
            assert "```" not in shown and "def f(x):" in shown and "Copy code" in shown  # a code block, not a fence
            assert "- first item" not in shown and "first item" in shown  # a list, not dashes
            bold = find(view, "bold words")
            at = QTextCursor(view.document())
            at.setPosition(bold.selectionStart() + 2)
            assert at.charFormat().fontWeight() >= QFont.Bold  # bold while it streams
            code = find(view, "return x + 1")
            assert code.charFormat().fontFixedPitch() or "monospace" in (code.charFormat().fontFamilies() or [])
            gen.retrying = inner  # seen streaming: the rest at full speed (paced, its 2,300 tokens took 46 s)
            wait(lambda: not w.generating)
        shown = view.toPlainText()
        assert "**" not in shown and "```" not in shown and "word299" in shown
    finally:
        gen.retrying = inner


def test_two_attached_documents_are_named_chips_in_the_sent_message_and_reach_the_model_named(qtbot, w, tmp_path,
                                                                                               monkeypatch):
    small = tmp_path / "notes.txt"
    small.write_text("n" * 311 + "\n")  # 312 bytes
    big = tmp_path / "report.md"
    big.write_text("The quarterly report says revenue grew.\n" * 40)  # 1,600 bytes (the tiny model's context holds it)
    wait(lambda: not w.generating)  # the module's window: a reply an earlier test stopped has ended
    with no_uncaught_exceptions():
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(str(small)), QUrl.fromLocalFile(str(big))])
        QGuiApplication.clipboard().setMimeData(mime)
        w.input.setFocus()
        qtbot.keyClick(w.input, Qt.Key_V, Qt.ControlModifier)  # files copied in a file manager, pasted
        wait(lambda: len(w.chip_widgets()) == 2, 30)
        chips = sorted(c.text() for c in w.chip_widgets())
        assert "notes.txt · 312 bytes" in chips[0] and "report.md · 1.6 KB" in chips[1]
        script(generator(w), "Both read.")
        before = len(w.sent)
        type_and_send(qtbot, w, "Compare these two")
        wait(lambda: not w.generating)
        gen_cmd = [c for c in w.sent[before:] if isinstance(c, Generate)][-1]
        asked = gen_cmd.messages[-1]["content"]
        first, second = asked.index("Document 1: notes.txt"), asked.index("Document 2: report.md")
        assert first < asked.index("End of document 1: notes.txt") < second < asked.index("End of document 2: report.md")
        assert asked.rstrip().endswith("Compare these two") and "revenue grew" in asked[second:]

        view = w.chat
        shown = view.toPlainText()
        assert "notes.txt · 312 bytes" in shown and "report.md · 1.6 KB" in shown  # the chips stay in the message
        assert "Compare these two" in shown and "revenue grew" not in shown and "nnnn" not in shown  # what was typed
        user = w.store.messages(w.cid)[-2]
        assert [a["name"] for a in user.meta["attachments"]] == ["notes.txt", "report.md"]
        assert user.meta["attachments"][0]["size"] == 312 and user.meta["typed"] == "Compare these two"

        opened = []
        monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
        chip = point_of(view, find(view, "report.md · 1.6 KB"))
        assert view.anchorAt(chip).startswith("open:")
        qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=chip)
        assert [u.toLocalFile() for u in opened] == [str(big)]
        big.unlink()
        qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=point_of(view, find(view, "report.md · 1.6 KB")))
        assert len(opened) == 1 and "report.md is no longer at" in w.statusBar().currentMessage()


def test_small_files_read_in_bytes_never_0_kb(qtbot, w, tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hello\n")
    w.attach(str(tiny))
    wait(lambda: any("tiny.txt" in c.text() for c in w.chip_widgets()), 30)
    label = next(c.text() for c in w.chip_widgets() if "tiny.txt" in c.text())
    assert "6 bytes" in label and "0 KB" not in label
    w.attachments.clear()
    from app.chat.attachments import human_size

    assert [human_size(n) for n in (1, 312, 1023, 4300, 1363149)] == ["1 byte", "312 bytes", "1,023 bytes",
                                                                      "4.2 KB", "1.3 MB"]


def test_the_footer_speaks_plainly_and_its_tooltip_has_the_detail(qtbot, w):
    with no_uncaught_exceptions():
        script(generator(w), "A short answer.")
        type_and_send(qtbot, w, "Say something short")
        wait(lambda: not w.generating)
        view = w.chat
        shown = view.toPlainText()
        last = shown[shown.rindex("A short answer."):]
        assert "tokens/s ·" in last and "stopped: end of answer" in last
        for jargon in ("eos", "prefill", "tok/s"):
            assert jargon not in last
        where = find(view, "stopped: end of answer")
        pos = point_of(view, where)
        QApplication.sendEvent(view.viewport(), QHelpEvent(QHelpEvent.ToolTip, pos, view.viewport().mapToGlobal(pos)))
        tip = QToolTip.text()
        assert "prefill" in tip and "reason: eos" in tip
        reply = w.store.messages(w.cid)[-1]
        assert reply.meta["stats"].endswith("stopped: end of answer") and "prefill" in reply.meta["stats_detail"]
