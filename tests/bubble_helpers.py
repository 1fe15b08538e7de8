"""Shared by several test modules (moved out of tests/test_chat_bubbles.py, which uses them too): find, point_of."""
import pytest
pytest.importorskip("PySide6")
from PySide6.QtCore import QPoint
from PySide6.QtGui import QTextCursor


def find(view, words, last=True) -> QTextCursor:
    doc, found, cur = view.document(), [], QTextCursor(view.document())
    while True:
        cur = doc.find(words, cur)
        if cur.isNull():
            break
        found.append(QTextCursor(cur))
    assert found, f"no {words!r} in {view.toPlainText()!r}"
    return found[-1 if last else 0]


def point_of(view, cur: QTextCursor) -> QPoint:
    """Where the middle of the found text is in the viewport, scrolled into view (where a user points)."""
    at = QTextCursor(view.document())
    at.setPosition((cur.selectionStart() + cur.selectionEnd()) // 2)
    view.setTextCursor(at)
    view.ensureCursorVisible()
    return view.cursorRect(at).center()

