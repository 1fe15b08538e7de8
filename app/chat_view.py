"""The message view: markdown messages (lists, tables, inline code) with code blocks highlighted
by Pygments, a Copy link on each code block and each message; the streaming reply is repainted in
batches (every 40 ms), so a fast model never floods the event loop, and it follows the end only
while the reader is at the end (scrolling up to read is not fought)."""
from __future__ import annotations

import html
import re

from PySide6.QtCore import QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QTextBrowser

FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)

ROLE_LABEL = {"user": "You", "assistant": "Mixdesk", "system": "System"}
FLUSH_MS = 40


class ChatView(QTextBrowser):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)  # copy: links are ours; web links open in the browser
        self.anchorClicked.connect(self._on_link)
        self.code_style = "default"  # the Pygments style (app/theme.py picks it with the theme)
        self.copies: list[str] = []  # what each copy:N link puts on the clipboard
        self._stream_start: int | None = None
        self._stream_text = ""
        self._shown = 0
        self._dirty = False
        self.flushes = 0
        self._timer = QTimer(self, interval=FLUSH_MS)
        self._timer.timeout.connect(self._flush)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            QGuiApplication.clipboard().setText(self.copies[int(url.path())])
        else:
            QDesktopServices.openUrl(url)

    def _copy_link(self, text: str, label: str = "Copy") -> str:
        self.copies.append(text)
        return f"<a href='copy:{len(self.copies) - 1}' style='font-size:small; text-decoration:none'>{label}</a>"

    def _at_end(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _follow(self, was_at_end: bool) -> None:
        if was_at_end:
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def _rich(self, cur: QTextCursor, content: str) -> None:
        """Markdown, with each fenced code block highlighted and given a Copy link."""
        pos = 0
        for m in FENCE.finditer(content):
            if content[pos:m.start()].strip():
                cur.insertMarkdown(content[pos:m.start()])
            cur.movePosition(QTextCursor.End)
            cur.insertBlock()
            cur.insertHtml(self._code_html(m.group(2), m.group(1)))
            cur.insertBlock()
            cur.insertHtml(self._copy_link(m.group(2), "Copy code"))
            pos = m.end()
        if content[pos:].strip() or pos == 0:
            cur.movePosition(QTextCursor.End)
            cur.insertMarkdown(content[pos:] or " ")

    def _code_html(self, code: str, language: str) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
        from pygments.util import ClassNotFound

        try:
            lexer = get_lexer_by_name(language) if language else guess_lexer(code)
        except ClassNotFound:
            lexer = TextLexer()
        fmt = HtmlFormatter(noclasses=True, style=self.code_style, nowrap=True)
        bg = fmt.style.background_color or "#f8f8f8"
        body = highlight(code.rstrip("\n"), lexer, fmt)
        return (f"<table width='100%' cellpadding='8' style='background:{bg}'><tr><td>"
                f"<pre style='font-family:monospace'>{body}</pre></td></tr></table>")

    def show_messages(self, messages) -> None:
        self.clear()
        self.copies = []
        self._stream_start = None
        for m in messages:
            self._append(m.role, m.content, m.meta.get("stats", "") if m.meta else "",
                         "" if m.complete else " _(interrupted)_")

    def _label(self, cur: QTextCursor, role: str, content: str | None = None) -> None:
        cur.movePosition(QTextCursor.End)
        if not self.document().isEmpty():
            cur.insertBlock()
            cur.insertBlock()
        copy = f" &nbsp; {self._copy_link(content)}" if content else ""
        cur.insertHtml(f"<b>{html.escape(ROLE_LABEL.get(role, role))}</b>{copy}")
        cur.insertBlock()

    def _stats_line(self, cur: QTextCursor, stats: str) -> None:
        cur.movePosition(QTextCursor.End)
        cur.insertBlock()
        cur.insertHtml(f"<span style='color:gray; font-size:small'>{stats}</span>")

    def _append(self, role: str, content: str, stats: str = "", suffix: str = "") -> None:
        cur = self.textCursor()
        self._label(cur, role, content)
        self._rich(cur, (content or " ") + suffix)
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
        at_end = self._at_end()
        cur = QTextCursor(self.document())  # not the view's cursor: appending must not scroll by itself
        cur.movePosition(QTextCursor.End)
        cur.insertText(self._stream_text[self._shown:])
        self._shown = len(self._stream_text)
        self._follow(at_end)

    def end_stream(self, stats: str) -> None:
        self._timer.stop()
        at_end = self._at_end()
        cur = QTextCursor(self.document())
        if self._stream_start is not None:
            cur.setPosition(self._stream_start)
            cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cur.removeSelectedText()
            self._rich(cur, self._stream_text or " ")
            cur.insertHtml(" &nbsp; " + self._copy_link(self._stream_text))
        self._stats_line(cur, stats)
        self._stream_start = None
        self._follow(at_end)
