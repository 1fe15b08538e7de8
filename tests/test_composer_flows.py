"""The composer and chat view flows a new user found broken, walked as a user walks them through
the real window: files dragged onto the composer's text box (and onto the messages) become
attachments, never their file:// URL as text, and both show where the drop will land; Enter sends
and Shift+Enter adds a line (a remembered setting, Ctrl+Enter always sends); a message typed on two
lines shows on two lines; the text box has the focus back after the Attach… dialog; Copy says it
copied."""
import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import (QDragEnterEvent, QDragLeaveEvent, QDragMoveEvent, QDropEvent, QGuiApplication,  # noqa: E402
                           QTextCursor)
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit  # noqa: E402

from engine.runtime.generate import SamplingParams  # noqa: E402

from main_window_helpers import open_window, send, window  # noqa: E402,F401  (the same window fixture)
from bubble_helpers import find, point_of  # noqa: E402
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402

DRAG_PROPERTY = "fileDragOver"  # the highlight a widget shows while files are dragged over it


def files_mime(*paths) -> QMimeData:
    """What a file manager's drag carries: the files as file:// URLs."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def drag_over(widget, mime: QMimeData, at=QPoint(20, 20)) -> None:
    """A drag entering the widget and moving over it, as the window system delivers it: to the
    widget under the pointer (a scroll area's viewport), Qt passing it on to the parents until one
    takes it."""
    enter = QDragEnterEvent(at, Qt.CopyAction | Qt.MoveAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    move = QDragMoveEvent(at + QPoint(5, 5), Qt.CopyAction | Qt.MoveAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, move)


def drag_away(widget) -> None:
    QApplication.sendEvent(widget, QDragLeaveEvent())


def drop_on(widget, mime: QMimeData, at=QPoint(25, 25)) -> QDropEvent:
    ev = QDropEvent(QPointF(at), Qt.CopyAction | Qt.MoveAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, ev)
    return ev


def activate(qtbot, w) -> None:
    w.activateWindow()
    w.raise_()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=5_000)


def chip_names(w) -> list[str]:
    return [d.name for d in w.attachments.docs]


# ---- 1. files dropped on the composer's text box (and on the messages) ----
def drag_and_drop(widget, lit_by, mime) -> list:
    """Files dragged over the widget, away, over again and dropped; whether `lit_by` showed the
    highlight: [over, after leaving, over again, after the drop]."""
    lit = []
    drag_over(widget, mime)
    lit.append(bool(lit_by.property(DRAG_PROPERTY)))
    drag_away(widget)
    lit.append(bool(lit_by.property(DRAG_PROPERTY)))
    drag_over(widget, mime)
    lit.append(bool(lit_by.property(DRAG_PROPERTY)))
    drop_on(widget, mime)
    lit.append(bool(lit_by.property(DRAG_PROPERTY)))
    return lit


def test_files_dropped_on_the_composer_become_chips_not_text_and_the_box_lights_up(qtbot, window, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The capital of France is Paris.")
    box = window.composer.input
    with no_uncaught_exceptions():
        lit = drag_and_drop(box.viewport(), box, files_mime(notes))
        assert box.toPlainText() == "", f"the drop typed {box.toPlainText()!r} into the message"
        qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=30_000)
    assert chip_names(window) == ["notes.txt"] and "notes.txt" in window.chip_widgets()[0].text()
    assert lit == [True, False, True, False], f"the text box's highlight over, away, over, dropped: {lit}"


def test_files_dropped_on_the_messages_become_chips_and_the_view_lights_up(qtbot, window, tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# Revenue\n\nRevenue grew.")
    view = window.chat
    with no_uncaught_exceptions():
        lit = drag_and_drop(view.viewport(), view, files_mime(report))
        qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=30_000)
    assert chip_names(window) == ["report.md"] and window.composer.input.toPlainText() == ""
    assert not window.composer.input.property(DRAG_PROPERTY)  # only where the drop lands
    assert lit == [True, False, True, False], f"the messages' highlight over, away, over, dropped: {lit}"


# ---- 2. Enter sends, Shift+Enter adds a line (Settings > Enter sends message) ----
def sent_messages(w) -> list[str]:
    return [m.content for m in w.store.messages(w.cid) if m.role == "user"] if w.cid is not None else []


def sent(w, *texts):
    """For qtbot.waitUntil: the user's messages in the chat are `texts` (else what is there, and in the box)."""
    def check():
        assert sent_messages(w) == list(texts), f"sent {sent_messages(w)}, the box holds {w.input.toPlainText()!r}"
    return check


def test_enter_sends_and_shift_enter_adds_a_line(qtbot, window):
    box = window.composer.input
    window.params = SamplingParams(max_new_tokens=4)
    activate(qtbot, window)
    box.setFocus()
    QTest.keyClicks(box, "first line")
    QTest.keyClick(box, Qt.Key_Return, Qt.ShiftModifier)
    QTest.keyClicks(box, "second line")
    assert box.toPlainText() == "first line\nsecond line" and not sent_messages(window)
    QTest.keyClick(box, Qt.Key_Return)
    qtbot.waitUntil(sent(window, "first line\nsecond line"), timeout=10_000)
    assert box.toPlainText() == ""
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    QTest.keyClicks(box, "by the keypad")
    QTest.keyClick(box, Qt.Key_Enter, Qt.KeypadModifier)
    qtbot.waitUntil(sent(window, "first line\nsecond line", "by the keypad"), timeout=10_000)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    QTest.keyClicks(box, "ctrl too")
    QTest.keyClick(box, Qt.Key_Return, Qt.ControlModifier)  # Ctrl+Enter always sends
    qtbot.waitUntil(sent(window, "first line\nsecond line", "by the keypad", "ctrl too"), timeout=10_000)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    action = menu_actions(window)["Settings/Enter sends message"]
    assert action.isCheckable() and action.isChecked()  # on by default
    assert "Enter sends" in box.placeholderText() and "Ctrl+Enter" not in box.placeholderText()


def test_enter_adds_a_line_when_the_setting_is_off_and_it_is_remembered(qtbot, tiny, tmp_path, window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    try:
        action = menu_actions(w)["Settings/Enter sends message"]
        action.trigger()  # off
        assert not action.isChecked()
        box = w.composer.input
        assert "Ctrl+Enter sends" in box.placeholderText()
        w.params = SamplingParams(max_new_tokens=4)
        activate(qtbot, w)
        box.setFocus()
        QTest.keyClicks(box, "one")
        QTest.keyClick(box, Qt.Key_Return)
        QTest.keyClicks(box, "two")
        qtbot.wait(100)
        assert box.toPlainText() == "one\ntwo" and not sent_messages(w)  # Enter added a line
        QTest.keyClick(box, Qt.Key_Return, Qt.ControlModifier)
        qtbot.waitUntil(sent(w, "one\ntwo"), timeout=10_000)
        qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    finally:
        w.close()
    again = open_window(qtbot, tiny, tmp_path, calibrated=False)  # the next start
    try:
        action = menu_actions(again)["Settings/Enter sends message"]
        assert not action.isChecked() and "Ctrl+Enter sends" in again.composer.input.placeholderText()
        action.trigger()  # on again: said at once
        assert "Ctrl+Enter" not in again.composer.input.placeholderText()
    finally:
        again.close()


# ---- 3. a message typed on several lines shows on several lines ----
def test_a_multi_line_message_keeps_its_line_breaks_in_the_chat(qtbot, window):
    send(qtbot, window, "line one\nline two\n\nafter a blank line", 4)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    shown = window.chat.toPlainText()
    assert "line one\nline two\n" in shown, f"the line break was lost: {shown!r}"
    assert "after a blank line" in shown
    html = window.chat.toHtml()
    assert "line one<br />line two" in html


# ---- 4. the focus comes back to the text box after Attach… ----
def test_the_text_box_has_the_focus_after_the_attach_dialog(qtbot, window, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("attached through the dialog")
    qtbot.waitExposed(window)
    activate(qtbot, window)
    window.search.setFocus()  # the user was last in the sidebar's search
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.search, timeout=5_000)

    def choose(dlg):
        dlg.setDirectory(str(tmp_path))  # the user opens the folder and picks the file by its name
        dlg.findChild(QLineEdit, "fileNameEdit").setText(notes.name)
        dlg.accept()
        if dlg.isVisible():  # refused: closed all the same, so the test fails rather than hangs
            dlg.reject()

    with no_uncaught_exceptions():
        seen = on_modal(choose, QFileDialog)
        qtbot.mouseClick(window.composer.attach_btn, Qt.LeftButton)
        assert seen
        qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=30_000)
    activate(qtbot, window)  # the dialog closed: the window system makes the window active again

    def focused():
        assert QApplication.focusWidget() is window.composer.input, f"the focus is on {QApplication.focusWidget()}"
    qtbot.waitUntil(focused, timeout=5_000)
    assert window.composer.input.hasFocus()


# ---- 5. Copy says it copied ----
def header_copy(view, who: str) -> QTextCursor:
    """The Copy link in the header of the (last) message by `who` ("You", "Mixdesk")."""
    header = find(view, f"{who}    Copy")
    link = QTextCursor(header)
    link.setPosition(header.selectionEnd() - len("Copy"))
    link.setPosition(header.selectionEnd(), QTextCursor.KeepAnchor)
    return link


def test_copy_on_a_message_says_copied_and_fills_the_clipboard(qtbot, window):
    send(qtbot, window, "copy me, please", 6)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    view = window.chat
    QGuiApplication.clipboard().clear()
    link = header_copy(view, "You")  # the user's message: its header's Copy
    at = point_of(view, link)
    assert view.anchorAt(at).startswith("copy:")
    with no_uncaught_exceptions():
        qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=at)
    assert QGuiApplication.clipboard().text() == "copy me, please"
    first_block = view.document().findBlock(link.selectionStart()).text()
    assert "Copied" in first_block, f"no feedback: {first_block!r}"
    qtbot.waitUntil(lambda: "Copied" not in view.document().findBlock(link.selectionStart()).text(), timeout=4_000)
    assert "Copy" in view.document().findBlock(link.selectionStart()).text()  # back as it was
    reply = window.store.messages(window.cid)[-1]
    with no_uncaught_exceptions():
        qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=point_of(view, header_copy(view, "Mixdesk")))
    assert QGuiApplication.clipboard().text() == reply.content
