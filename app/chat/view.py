"""The message view: one QTextBrowser whose document holds the messages (app/chat/bubbles.py: the
user's in a bubble, a reply across the view): who wrote it and a Copy link, the named chips of the documents it carried, its
Markdown (lists, tables, headings, inline code) and fenced code highlighted by Pygments with a Copy
code link each, and under a reply a quiet footer of its stats (the detail in its tooltip).

A streaming reply is rendered as Markdown while it streams, incrementally (app/chat/markdown_render.py):
every 40 ms the new text is cut into blocks, each block that completed is rendered once, and only the
open block is rendered again, so a flush costs what changed, not the reply. A flush's edits are one
edit block, laid out once (Qt lays out after every edit outside one), and a reply is not a nested
frame (Qt lays a nested frame out whole). The view follows the end
only while the reader is at the end (scrolling up to read is not fought). A reply's reasoning streams
into a folded block above its answer and its tool calls show as blocks below it (app/chat/reasoning_view.py).

Why one document rather than a widget per message: text selection runs across messages, the
reasoning blocks and the tests' clicks stay where they were, and measured, a flush's cost (its
Python, the layout and the paint it causes) is flat in the reply's length (tests/test_app.py
test_streaming_render..., scripts/profile_chat_stream.py)."""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import QEvent, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QToolTip

from . import bubbles, reply_footer
from .. import gc_pauses
from . import reasoning_view as rv
from .file_drop import FileDrop
from .markdown_render import Answer, streaming, warm

ROLE_LABEL = bubbles.ROLE_LABEL
FLUSH_MS = 40
COPIED_MS = 2000  # how long a Copy link reads "Copied" after a click
OLD_DOCUMENTS = re.compile(r'\A(?:<document name="[^"]*">\n.*?\n</document>(?:\n\n|\Z))+', re.S)


def typed_text(content: str, meta: dict) -> str:
    """What the user typed of a message: meta["typed"] where the window kept it (messages sent with
    documents: their content is what the model read, documents.prompt_with_documents); messages of
    older versions carried their documents as <document name=...> blocks before the text."""
    if "typed" in meta:
        return meta["typed"]
    if meta.get("attachments"):
        return OLD_DOCUMENTS.sub("", content)
    return content


def attached(meta: dict) -> list[dict]:
    """A message's documents as chips want them: {"name", "path", "size"} (older messages kept names)."""
    return [a if isinstance(a, dict) else {"name": str(a), "path": None, "size": None}
            for a in meta.get("attachments") or ()]


class ChatView(QTextBrowser):
    notice = Signal(str)  # one line for the status bar: an attached file that cannot be opened
    file_dropped = Signal(str)  # a file dragged from a file manager onto the messages: to attach (app/chat/file_drop.py)
    # the theme changed: the messages shown were drawn in the old palette's colours (bubbles, chips,
    # footers take theirs when drawn); the window draws them again (at once, or when a reply ends)
    restyle = Signal()
    version_requested = Signal(int, int)  # a regenerated reply's ‹ › clicked: (its message id, the version)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)  # copy:, open:, think: links are ours; web links open in the browser
        self.anchorClicked.connect(self._on_link)
        self.file_drop = FileDrop(self, self.file_dropped.emit)  # lit up while files are dragged over it
        self.document().setDocumentMargin(10)
        self.code_style = "default"  # the Pygments style (app/theme.py picks it with the theme)
        self.copies: list[str] = []  # what each copy:N link puts on the clipboard
        self._copied: dict = {}  # copy:N links that read "Copied" now: their own label, the timer that puts it back
        self.files: list[dict] = []  # what each open:N chip opens
        self.thoughts: list[rv.Thought] = []  # the reasoning blocks shown, by their link's number
        self.unfolded: set = set()  # the messages (ids) whose reasoning the reader unfolded
        self._stream_start: QTextCursor | None = None  # the streaming reply's first content block
        self._frame = None  # the frame the streaming reply ends in (the document's own)
        self._answer: Answer | None = None
        self._copy_index = 0  # the streaming reply's whole-message Copy link
        self.reading = ""  # the line where the reply will appear while its long prompt is read ("": none)
        self._stream_text = ""
        self._shown = 0
        self._live: rv.Thought | None = None  # the streaming reply's reasoning block
        self._live_key = None
        self._live_seconds: float | None = None
        self._reasoning = ""
        self._dirty = False
        self.stale_colours = False  # drawn in a palette the view no longer has (see `restyle`)
        self.flushes = 0
        self.flush_log: list[tuple[int, float]] = []  # per flush: characters of the reply shown, CPU seconds
        # of the GUI thread in it and in the paint that follows it
        self._timer = QTimer(self, interval=FLUSH_MS)
        self._timer.timeout.connect(self._flush)
        warm()  # the code lexers made off the GUI thread, before a reply needs one

    # ---- links and tooltips ----
    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            QGuiApplication.clipboard().setText(self.copies[int(url.path())])
            self.show_copied(url.toString())
        elif url.scheme() == rv.LINK:
            self.toggle_thought(int(url.path()))
        elif url.scheme() == "open":
            self.open_file(int(url.path()))
        elif url.scheme() == "version":
            mid, j = url.path().split(":")
            self.version_requested.emit(int(mid), int(j))
        else:
            QDesktopServices.openUrl(url)

    def show_copied(self, href: str) -> None:
        """The clicked Copy (or Copy code) link reads "Copied" for COPIED_MS, then as it did."""
        if href in self._copied:  # clicked again while it says so: said for longer
            self._copied[href][1].start()
            return
        with self.one_edit():
            for label in ("Copy", "Copy code"):
                if bubbles.relabel(self.document(), href, label, "Copied"):
                    break
            else:
                return
        timer = QTimer(self, singleShot=True, interval=COPIED_MS)
        timer.timeout.connect(lambda: self._copy_label_back(href))
        self._copied[href] = (label, timer)
        timer.start()

    def _copy_label_back(self, href: str) -> None:
        label, timer = self._copied.pop(href)
        timer.deleteLater()
        with self.one_edit():
            bubbles.relabel(self.document(), href, "Copied", label)

    def open_file(self, n: int) -> None:
        """An attachment chip was clicked: the file opens in its own app, or one line says why not."""
        f = self.files[n]
        if not f.get("path"):
            self.notice.emit(f"{f['name']}: where it was is not known (attached with an older version of Mixdesk)")
        elif not Path(f["path"]).is_file():
            self.notice.emit(f"{f['name']} is no longer at {f['path']}")
        elif not QDesktopServices.openUrl(QUrl.fromLocalFile(f["path"])):
            self.notice.emit(f"{f['name']}: no application to open it with")

    def _copy(self, text: str, index: int | None = None) -> int:
        """copies[index] = text (a new entry when index is None); the index."""
        if index is None:
            self.copies.append(text)
            return len(self.copies) - 1
        self.copies[index] = text
        return index

    def paintEvent(self, e) -> None:
        t0 = time.thread_time()
        super().paintEvent(e)
        if self._stream_start is not None and self.flush_log:  # the last flush's cost includes its paint
            chars, s = self.flush_log[-1]
            self.flush_log[-1] = (chars, s + time.thread_time() - t0)

    def changeEvent(self, e) -> None:
        super().changeEvent(e)
        if e.type() == QEvent.PaletteChange:
            self.stale_colours = True
            self.restyle.emit()

    def viewportEvent(self, e) -> bool:
        if e.type() == QEvent.ToolTip:  # a chip's path, a footer's technical detail (QTextCharFormat.toolTip)
            tip = self.tooltip_at(e.pos())
            if tip:
                QToolTip.showText(e.globalPos(), tip, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(e)

    def tooltip_at(self, pos) -> str:
        cur = self.cursorForPosition(pos)
        tip = cur.charFormat().toolTip()
        if not tip:
            cur.movePosition(QTextCursor.NextCharacter)
            tip = cur.charFormat().toolTip()
        return tip

    @contextmanager
    def one_edit(self):
        """The edits inside laid out once, at the end (Qt lays out the document after each edit
        outside an edit block: a flush makes ten or more)."""
        cur = QTextCursor(self.document())
        cur.beginEditBlock()
        try:
            yield
        finally:
            cur.endEditBlock()

    # ---- scrolling ----
    def _at_end(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _follow(self, was_at_end: bool) -> None:
        if was_at_end:
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    # ---- reasoning blocks ----
    def toggle_thought(self, n: int) -> None:
        """Fold or unfold reasoning block n (its header's link)."""
        t = self.thoughts[n]
        with self.one_edit():
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

    # ---- messages ----
    def show_messages(self, messages) -> None:
        if self._stream_start is not None:  # a chat shown instead of the one streaming
            self._timer.stop()
            self._quiet(False)
        self.clear()
        self.stale_colours = False
        self.copies, self.files, self.thoughts = [], [], []
        for _label, timer in self._copied.values():  # the links that read "Copied" are gone
            timer.stop()
            timer.deleteLater()
        self._copied = {}
        self._stream_start = self._live = self._answer = self._frame = None
        self.reading = ""
        with self.one_edit():
            for m in messages:
                self._append(m.role, m.content, m.meta or {}, "" if m.complete else " _(interrupted)_", m.id)
        self.moveCursor(QTextCursor.End)

    def _bubble(self, role: str, copy_text: str):
        cur = self.textCursor()
        frame = bubbles.bubble(cur, self.palette(), role)
        index = self._copy(copy_text)
        bubbles.header(cur, self.palette(), role, f"copy:{index}")
        return cur, frame, index

    def _append(self, role: str, content: str, meta: dict, suffix: str = "", key=None) -> None:
        shown = typed_text(content, meta) if role == "user" else content
        cur, frame, _ = self._bubble(role, shown)
        files = attached(meta)
        if files:
            bubbles.chips(cur, self.palette(), files, len(self.files))
            self.files.extend(files)
        if (meta.get("reasoning") or "").strip():
            self._thought(cur, meta["reasoning"], meta.get("thought_s") or 0.0, key)
            cur.setPosition(frame.lastPosition())
        if shown.strip() or suffix or not (meta.get("tool_calls") or files):  # a reply that only called a tool: no empty answer
            answer = Answer(frame, cur.position(), self.code_style, self._copy, self.palette().color(QPalette.Text),
                            line_breaks=role == "user")  # what the user typed on two lines shows on two
            answer.feed((shown or " ") + suffix)
            answer.close()
        self._extras(frame, meta)
        footer = reply_footer.line(meta.get("stats") or "", meta.get("model") or "")  # who wrote it, and its stats
        if footer:
            bubbles.footer(frame, self.palette(), footer, meta.get("stats_detail", ""))
        self._versions(frame, key, meta)

    def _versions(self, frame, key, meta: dict) -> None:
        """‹ 1/2 › under a reply that was regenerated (app/chat/session.py keeps the versions)."""
        count = len(meta.get("versions") or ())
        if count > 1 and key is not None:
            bubbles.versions(frame, self.palette(), key, int(meta.get("version", count - 1)), count)

    def _extras(self, frame, meta: dict) -> None:
        rv.tool_calls(frame, meta.get("tool_calls") or (), self.palette())
        rv.notes(frame, meta.get("notes") or (), self.palette())

    # ---- the streaming reply ----
    @staticmethod
    def _quiet(on: bool) -> None:
        """While a reply streams, what would pause it waits: full GCs, the lexers' warm-up."""
        if on:
            gc_pauses.before_reply()
        else:
            gc_pauses.after_reply()
        streaming(on)

    def begin_stream(self, key=None) -> None:
        """A reply starts streaming; key: its message id (the reader's unfolding is kept by it)."""
        self._quiet(True)
        with self.one_edit():
            cur, self._frame, self._copy_index = self._bubble("assistant", "")
        self._stream_start = QTextCursor(cur)
        self._stream_start.setKeepPositionOnInsert(True)  # the reply's first position, whatever goes in there
        self._answer = None
        self._stream_text = self._reasoning = self.reading = ""
        self._shown = 0
        self.flush_log = []
        self._live, self._live_key, self._live_seconds = None, key, None
        self._timer.start()

    def show_reading(self, text: str) -> None:
        """Where the reply will appear, before its first word: how far its prompt has been read
        ("Reading the document: 4,096 of 18,512 tokens · about 1 min left"), in the placeholder's colour;
        the reply's first word (or its end) takes its place."""
        if self._stream_start is None or self._shown or self._live is not None:
            return
        at_end = self._at_end()
        with self.one_edit():
            cur = self._reading_span()
            fmt = QTextCharFormat()
            fmt.setForeground(self.palette().color(QPalette.PlaceholderText))
            fmt.setFontItalic(True)
            cur.insertText(text, fmt)
        self.reading = text
        self._follow(at_end)

    def _reading_span(self) -> QTextCursor:
        """A cursor over what the streaming reply holds before its first word: the reading line."""
        cur = QTextCursor(self.document())
        cur.setPosition(self._stream_start.position())
        cur.setPosition(self._frame.lastPosition(), QTextCursor.KeepAnchor)
        return cur

    def _clear_reading(self) -> None:
        if self.reading:
            self._reading_span().removeSelectedText()
            self.reading = ""

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
        return self._live.frame.lastPosition() + 1 if self._live is not None else self._stream_start.position()

    def _flush_thought(self) -> None:
        if self._live is None:
            if not self._reasoning.strip():
                return
            cur = QTextCursor(self.document())
            cur.setPosition(self._stream_start.position())
            self._live = self._thought(cur, self._reasoning, self._live_seconds, self._live_key)
        t = self._live
        t.text = self._reasoning
        if t.seconds != self._live_seconds:
            t.seconds = self._live_seconds
            t.retitle()
        t.flush()

    def _feed_answer(self) -> None:
        new = self._stream_text[self._shown:]
        if not new:
            return
        if self._answer is None:
            self._answer = Answer(self._frame, self._answer_start(), self.code_style, self._copy,
                                  self.palette().color(QPalette.Text))
        self._answer.feed(new)
        self._shown = len(self._stream_text)
        self._copy(self._stream_text, self._copy_index)

    def _flush(self) -> None:
        """The new text rendered: completed blocks once, the open block again (app/chat/markdown_render.py)."""
        if not self._dirty or self._stream_start is None:
            return
        t0 = time.thread_time()
        self._dirty = False
        self.flushes += 1
        at_end = self._at_end()
        with self.one_edit():
            self._clear_reading()
            self._flush_thought()
            self._feed_answer()
        self._follow(at_end)
        self.flush_log.append((self._shown, time.thread_time() - t0))

    def end_stream(self, stats: str, content: str | None = None, meta: dict | None = None) -> None:
        """The reply ended: its answer (content: the reply's own, else what streamed) complete, its
        reasoning block titled (meta: what the store keeps of it, app/main_window.py: reasoning,
        thought_s, tool_calls, notes, stats_detail: the footer's tooltip), its tool calls and notes,
        and the footer with the stats."""
        self._timer.stop()
        at_end = self._at_end()
        meta = meta or {}
        if self._stream_start is not None:
            with self.one_edit():
                self._clear_reading()
                self._reasoning = meta.get("reasoning", self._reasoning)
                self._live_seconds = meta.get("thought_s") or self._live_seconds or 0.0
                self._flush_thought()
                if self._live is not None:
                    self._live.render()  # the whole reasoning, trimmed, when unfolded
                if content is not None and content != self._stream_text:  # the reply's own answer differs: anew
                    cur = QTextCursor(self.document())
                    cur.setPosition(self._answer_start())
                    cur.setPosition(self._frame.lastPosition(), QTextCursor.KeepAnchor)
                    cur.removeSelectedText()
                    self._stream_text, self._shown, self._answer = content, 0, None
                self._feed_answer()
                if self._answer is not None:
                    self._answer.close()
                self._copy(self._stream_text.strip() and self._stream_text, self._copy_index)
                self._extras(self._frame, meta)
                bubbles.footer(self._frame, self.palette(), reply_footer.line(stats, meta.get("model") or ""),
                               meta.get("stats_detail", ""))
                self._versions(self._frame, self._live_key, meta)
            self._quiet(False)
        self._stream_start = self._live = self._answer = None
        self._follow(at_end)
