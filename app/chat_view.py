"""The message view: markdown messages; the streaming reply is repainted in batches (every 40 ms),
so a fast model never floods the event loop."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QTextBrowser

ROLE_LABEL = {"user": "You", "assistant": "Mixdesk", "system": "System"}
FLUSH_MS = 40


class ChatView(QTextBrowser):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self._stream_start: int | None = None
        self._stream_text = ""
        self._shown = 0
        self._dirty = False
        self.flushes = 0
        self._timer = QTimer(self, interval=FLUSH_MS)
        self._timer.timeout.connect(self._flush)

    def show_messages(self, messages) -> None:
        self.clear()
        self._stream_start = None
        for m in messages:
            self._append(m.role, m.content, m.meta.get("stats", "") if m.meta else "",
                         "" if m.complete else " _(interrupted)_")

    def _label(self, cur: QTextCursor, role: str) -> None:
        cur.movePosition(QTextCursor.End)
        if not self.document().isEmpty():
            cur.insertBlock()
            cur.insertBlock()
        cur.insertHtml(f"<b>{ROLE_LABEL.get(role, role)}</b>")
        cur.insertBlock()

    def _stats_line(self, cur: QTextCursor, stats: str) -> None:
        cur.movePosition(QTextCursor.End)
        cur.insertBlock()
        cur.insertHtml(f"<span style='color:gray; font-size:small'>{stats}</span>")

    def _append(self, role: str, content: str, stats: str = "", suffix: str = "") -> None:
        cur = self.textCursor()
        self._label(cur, role)
        cur.insertMarkdown((content or " ") + suffix)
        if stats:
            self._stats_line(cur, stats)
        self.moveCursor(QTextCursor.End)

    def begin_stream(self) -> None:
        cur = self.textCursor()
        self._label(cur, "assistant")
        self._stream_start = cur.position()
        self._stream_text = ""
        self._shown = 0
        self._timer.start()

    def add_text(self, text: str) -> None:
        self._stream_text += text
        self._dirty = True

    @property
    def streamed(self) -> str:
        return self._stream_text

    def _flush(self) -> None:
        """While streaming, append only the new text, as plain text: the cost of a flush does not
        grow with the reply. The reply is rendered as markdown once, when it ends."""
        if not self._dirty or self._stream_start is None:
            return
        self._dirty = False
        self.flushes += 1
        cur = self.textCursor()
        cur.movePosition(QTextCursor.End)
        cur.insertText(self._stream_text[self._shown:])
        self._shown = len(self._stream_text)
        self.moveCursor(QTextCursor.End)

    def end_stream(self, stats: str) -> None:
        self._timer.stop()
        if self._stream_start is not None:
            cur = self.textCursor()
            cur.setPosition(self._stream_start)
            cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cur.removeSelectedText()
            cur.insertMarkdown(self._stream_text or " ")
        self._stats_line(self.textCursor(), stats)
        self._stream_start = None
        self.moveCursor(QTextCursor.End)
