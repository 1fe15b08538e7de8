"""The message view on its own (no model): markdown, highlighted code blocks with Copy, Copy of a
whole message, a stream that follows the end only while the reader is there; and the themes."""
import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QUrl  # noqa: E402
from PySide6.QtGui import QGuiApplication, QPalette  # noqa: E402

from app.chat.view import ChatView  # noqa: E402
from app.store.chat_store import Message  # noqa: E402

REPLY = """Here is a function:

```python
def add(a, b):
    return a + b
```

| tier | bits |
|---|---|
| cpu-4 | 4 |

- one
- two with `inline code`
"""


@pytest.fixture
def view(qtbot):
    v = ChatView()
    qtbot.addWidget(v)
    v.resize(600, 400)
    v.show()
    return v


def test_code_blocks_are_highlighted_and_copyable(view):
    view.show_messages([Message(1, "user", "show me code", True, {}), Message(2, "assistant", REPLY, True, {})])
    html = view.toHtml()
    assert "def" in view.toPlainText() and "Copy code" in view.toPlainText()
    assert html.count("color:#") > 3  # Pygments colours the tokens (keyword, name, operator...)
    assert view.document().toPlainText().count("Copy") >= 3  # two messages + the code block
    code_link = view.copies.index("def add(a, b):\n    return a + b\n")
    view.anchorClicked.emit(QUrl(f"copy:{code_link}"))
    assert QGuiApplication.clipboard().text() == "def add(a, b):\n    return a + b\n"
    view.anchorClicked.emit(QUrl(f"copy:{view.copies.index(REPLY)}"))  # the whole message
    assert QGuiApplication.clipboard().text() == REPLY
    assert any(f.__class__.__name__ == "QTextTable" for f in frames(view.document().rootFrame()))  # a table


def frames(frame):
    """Every frame inside `frame`, nested ones too (each message is a frame; its tables and code, frames in it)."""
    for f in frame.childFrames():
        yield f
        yield from frames(f)


def test_the_stream_follows_the_end_only_while_the_reader_is_there(qtbot, view):
    view.show_messages([Message(1, "user", "long please", True, {})])
    view.begin_stream()
    for i in range(200):
        view.add_text(f"line {i}\n\n")  # 200 paragraphs: taller than the view
    qtbot.waitUntil(lambda: view.streamed.count("\n") == 400 and view.flushes > 0 and not view._dirty, timeout=5000)
    bar = view.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # at the end: follows
    bar.setValue(0)  # the reader scrolls up to read
    for i in range(50):
        view.add_text(f"more {i}\n")
    qtbot.wait(200)
    assert bar.value() == 0  # not dragged back down
    view.end_stream("12 tok/s")
    assert bar.value() == 0 and "more 49" in view.toPlainText()


def test_themes_apply_and_are_remembered(qapp, tmp_path, monkeypatch):
    from app import theme

    try:
        style = theme.apply("Dark")
        assert style == "monokai" and theme.is_dark(qapp.palette()) and theme.saved() == "Dark"
        assert theme.apply("Light") == "default" and not theme.is_dark(qapp.palette())
        assert theme.saved() == "Light"
        assert qapp.palette().color(QPalette.Window).lightness() > 128
    finally:
        theme.apply("System")


def test_the_composer_works_without_a_model(qtbot, tmp_path):
    from PySide6.QtCore import QMimeData
    from PySide6.QtCore import Qt as QtNS

    from app.chat.composer import Composer

    c = Composer()
    qtbot.addWidget(c)
    asked = []
    c.send_requested.connect(lambda: asked.append("send"))
    c.set_generating(False)
    qtbot.mouseClick(c.send_btn, QtNS.LeftButton)
    assert asked == ["send"]
    c.set_generating(True)
    assert not c.send_btn.isEnabled() and c.stop_btn.isEnabled()
    (tmp_path / "a.txt").write_text("pasted from a file manager")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(tmp_path / "a.txt"))])
    assert c.paste_files(mime)
    qtbot.waitUntil(lambda: len(c.attachments.chip_widgets()) == 1, timeout=10_000)
    assert c.attachments.docs[0].text == "pasted from a file manager"


def test_a_streaming_code_block_shows_each_line_once_while_it_streams(qtbot, view):
    code = 'def route(logits, k=2):\n    """Top-k experts."""\n    return logits.topk(k)\n'
    reply = f"Here:\n\n```python\n{code}```\n\nDone."
    view.show_messages([Message(1, "user", "code please", True, {})])
    view.begin_stream()
    for i in range(0, len(reply), 5):
        view.add_text(reply[i:i + 5])
        flushes = view.flushes
        qtbot.waitUntil(lambda: view.flushes > flushes, timeout=5000)
        shown = view.toPlainText()
        assert "```" not in shown and shown.count("def route") <= 1 and shown.count("Top-k") <= 1, shown
        if "return logits.topk(k)\n" in view.streamed and "Done" not in view.streamed:
            assert "return logits.topk(k)" in shown and "Copy code" in shown
    view.end_stream("1 tokens/s")
    shown = view.toPlainText()
    assert shown.count("def route") == 1 and "Done." in shown and view.copies.count(code) == 1


def test_a_streaming_reply_keeps_old_objects_out_of_the_collector_until_it_ends(view):
    """Full garbage collections walk every object the process holds (torch's, transformers'): while
    a reply streams the objects alive at its start are frozen (app/gc_pauses.py), and when it ends
    they are handed back, so that what was dropped meanwhile (a model unloaded) is freed."""
    import gc
    import weakref

    class Held:
        pass

    held = Held()
    held.me = held  # a cycle: only the collector frees it
    ref = weakref.ref(held)
    view.show_messages([Message(1, "user", "hi", True, {})])
    view.begin_stream()
    assert gc.get_freeze_count() > 0
    del held
    view.add_text("Hello")
    gc.collect()
    assert ref() is not None  # frozen while the reply streams
    view.end_stream("1 tokens/s")
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None
