"""The message view: markdown messages (lists, tables, inline code) with code blocks highlighted
by Pygments, a Copy link on each code block and each message; the streaming reply is repainted in
batches (every 40 ms), so a fast model never floods the event loop, and it follows the end only
while the reader is at the end (scrolling up to read is not fought). A reply's reasoning streams into
a folded block above its answer, and its tool calls show as blocks below it (app/reasoning_view.py)."""
from __future__ import annotations

import html
import re

from PySide6.QtCore import QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QTextBrowser

from . import reasoning_view as rv

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
        self.thoughts: list[rv.Thought] = []  # the reasoning blocks shown, by their link's number
        self.unfolded: set = set()  # the messages (ids) whose reasoning the reader unfolded
        self._live: rv.Thought | None = None  # the streaming reply's reasoning block
        self._live_key = None
        self._live_seconds: float | None = None
        self._reasoning = ""
        self._dirty = False
        self.flushes = 0
        self._timer = QTimer(self, interval=FLUSH_MS)
        self._timer.timeout.connect(self._flush)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            QGuiApplication.clipboard().setText(self.copies[int(url.path())])
        elif url.scheme() == rv.LINK:
            self.toggle_thought(int(url.path()))
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

    def toggle_thought(self, n: int) -> None:
        """Fold or unfold reasoning block n (its header's link)."""
        t = self.thoughts[n]
        t.toggle()
        if t.key is not None:
            (self.unfolded.add if t.open else self.unfolded.discard)(t.key)

    def _thought(self, cur: QTextCursor, text: str, seconds: float | None, key=None) -> rv.Thought:
        """A reasoning block at the cursor, folded unless the reader unfolded that message's."""
        t = rv.Thought(rv.box(cur, self.palette()), f"{rv.LINK}:{len(self.thoughts)}", self.palette(), text,
                       seconds, open=key is not None and key in self.unfolded, key=key)
        self.thoughts.append(t)
        t.render()
        return t

    def show_messages(self, messages) -> None:
        self.clear()
        self.copies = []
        self.thoughts = []
        self._stream_start = self._live = None
        for m in messages:
            self._append(m.role, m.content, m.meta or {}, "" if m.complete else " _(interrupted)_", m.id)

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
        if cur.block().length() > 1:  # not the empty line after a tool call's block
            cur.insertBlock()
        cur.insertHtml(f"<span style='color:gray; font-size:small'>{stats}</span>")

    def _extras(self, cur: QTextCursor, meta: dict) -> None:
        rv.tool_calls(cur, meta.get("tool_calls") or (), self.palette())
        rv.notes(cur, meta.get("notes") or (), self.palette())

    def _append(self, role: str, content: str, meta: dict, suffix: str = "", key=None) -> None:
        cur = self.textCursor()
        self._label(cur, role, content)
        if (meta.get("reasoning") or "").strip():
            self._thought(cur, meta["reasoning"], meta.get("thought_s") or 0.0, key)
            cur.movePosition(QTextCursor.End)
        if content.strip() or suffix or not meta.get("tool_calls"):  # a reply that only called a tool: no empty answer
            self._rich(cur, (content or " ") + suffix)
        self._extras(cur, meta)
        if meta.get("stats"):
            self._stats_line(cur, meta["stats"])
        self.moveCursor(QTextCursor.End)

    def begin_stream(self, key=None) -> None:
        """A reply starts streaming; key: its message id (the reader's unfolding is kept by it)."""
        cur = self.textCursor()
        self._label(cur, "assistant")
        self._stream_start = cur.position()
        self._stream_text = self._reasoning = ""
        self._shown = 0
        self._live, self._live_key, self._live_seconds = None, key, None
        self._timer.start()

    def add_text(self, text: str) -> None:
        self._stream_text += text
        self._dirty = True

    def add_reasoning(self, text: str) -> None:
        self._reasoning += text
        self._live_seconds = None  # thinking (again)
        self._dirty = True

    def thought_done(self, seconds: float) -> None:
        """The answer began after `seconds` of reasoning: the block's header says so."""
        self._live_seconds = seconds
        self._dirty = True

    @property
    def streamed(self) -> str:
        return self._stream_text

    @property
    def streamed_reasoning(self) -> str:
        return self._reasoning if self._stream_start is not None else ""

    def _answer_start(self) -> int:
        """Where the streaming answer begins: after its reasoning block, if it has one."""
        return self._live.frame.lastPosition() + 1 if self._live is not None else self._stream_start

    def _flush_thought(self) -> None:
        if self._live is None:
            if not self._reasoning.strip():
                return
            cur = QTextCursor(self.document())
            cur.setPosition(self._stream_start)
            self._live = self._thought(cur, self._reasoning, self._live_seconds, self._live_key)
        t = self._live
        t.text = self._reasoning
        if t.seconds != self._live_seconds:
            t.seconds = self._live_seconds
            t.retitle()
        t.flush()

    def _flush(self) -> None:
        """While streaming, append only the new text, as plain text: the cost of a flush does not
        grow with the reply. The reply is rendered as markdown once, when it ends."""
        if not self._dirty or self._stream_start is None:
            return
        self._dirty = False
        self.flushes += 1
        at_end = self._at_end()
        self._flush_thought()
        cur = QTextCursor(self.document())  # not the view's cursor: appending must not scroll by itself
        cur.movePosition(QTextCursor.End)
        cur.insertText(self._stream_text[self._shown:])
        self._shown = len(self._stream_text)
        self._follow(at_end)

    def end_stream(self, stats: str, content: str | None = None, meta: dict | None = None) -> None:
        """The reply ended: its answer (content: the reply's own, else what streamed) rendered as
        markdown, its reasoning block titled (meta: what the store keeps of it, app/main_window.py:
        reasoning, thought_s, tool_calls, notes), its tool calls and notes, and the stats line."""
        self._timer.stop()
        at_end = self._at_end()
        meta = meta or {}
        cur = QTextCursor(self.document())
        if self._stream_start is not None:
            if content is not None:
                self._stream_text = content
            self._reasoning = meta.get("reasoning", self._reasoning)
            self._live_seconds = meta.get("thought_s") or self._live_seconds or 0.0
            self._flush_thought()
            if self._live is not None:
                self._live.render()  # the whole reasoning, trimmed, when unfolded
            cur.setPosition(self._answer_start())
            cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cur.removeSelectedText()
            if self._stream_text.strip() or not meta.get("tool_calls"):
                self._rich(cur, self._stream_text or " ")
                cur.insertHtml(" &nbsp; " + self._copy_link(self._stream_text))
            self._extras(cur, meta)
        self._stats_line(cur, stats)
        self._stream_start = self._live = None
        self._follow(at_end)
