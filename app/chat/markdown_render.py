"""Markdown blocks (app/chat/markdown_stream.py) into a QTextDocument, incrementally.

`Answer` owns the end of a message's frame while its reply streams: each block that completes is
rendered once, where the open block's rendering was, and never touched again; the open block alone
is rendered anew at each flush. A fenced code block is a shaded frame with its language and a
"Copy code" link; while it streams, each complete line is highlighted once (Pygments), the open line
shows plain, and when its fence closes the block is highlighted once as a whole (a lexer reads
strings and comments across lines). So a flush costs what the open block holds, never the reply.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache

from PySide6.QtGui import (QBrush, QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextDocumentFragment, QTextFrame, QTextFrameFormat)

from .markdown_stream import Block, BlockSplitter


@lru_cache(maxsize=8)
def _style(name: str):
    from pygments.styles import get_style_by_name
    from pygments.util import ClassNotFound

    try:
        return get_style_by_name(name)
    except ClassNotFound:
        return get_style_by_name("default")


# The fence languages models write most: their lexers are made off the GUI thread when the view is
# built (warm), since the first lexer of a language costs its module's import and its regexes'
# compiling (measured: 65 ms for Python, 60 ms for CSS, 350 ms for the first guess, which imports them all).
COMMON = ("python", "bash", "sh", "console", "javascript", "typescript", "json", "c", "cpp", "rust", "go",
          "java", "html", "css", "sql", "yaml", "toml", "diff", "text")
_warming: list = []
_idle = threading.Event()  # cleared while a reply streams: the warm-up waits for it
_idle.set()


def streaming(on: bool) -> None:
    """A reply started (True) or ended (False) streaming: the lexers' warm-up pauses meanwhile."""
    (_idle.clear if on else _idle.set)()


def warm() -> None:
    """Make the common lexers, and import the rest for guessing, in a background thread (once).

    Gently, and never while a reply streams: the work is Python that holds the GIL (about 0.5 s in
    all), and a window's first reply can stream while it runs; done in one go it took two of every
    three GIL turns from the GUI thread and the engine's, and the event loop stalled 60-87 ms
    (tests/test_app.py's 50 ms bound, run alone). So one lexer or one module at a time, each after
    any streaming reply has ended, with a pause after each."""
    if _warming:
        return

    def run():
        import importlib
        import time

        for lang in COMMON:
            _idle.wait()
            _named_lexer(lang)
            time.sleep(0.01)
        try:  # guess_lexer imports every lexer module at once: import them here, one at a time
            from pygments.lexers._mapping import LEXERS
            modules = sorted({entry[0] for entry in LEXERS.values()})
        except (ImportError, AttributeError, IndexError, TypeError):  # a Pygments that lays them out otherwise
            modules = []
        for name in modules:
            _idle.wait()
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 — a lexer module that fails to import is guess_lexer's to skip
                pass
            time.sleep(0.005)
        _idle.wait()
        _lexer("", "x = 1")

    _warming.append(threading.Thread(target=run, name="mixdesk-lexers", daemon=True))
    _warming[0].start()


@lru_cache(maxsize=64)
def _named_lexer(lang: str):
    """The lexer of a fence's language (one per language: a lexer keeps no state between texts)."""
    from pygments.lexers import TextLexer, get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(lang.lower(), stripnl=False)
    except ClassNotFound:
        return TextLexer(stripnl=False)


def _lexer(lang: str, code: str | None = None):
    """The lexer of the fence's language; none named: guessed from the code's start (plain while it streams)."""
    from pygments.lexers import guess_lexer
    from pygments.util import ClassNotFound

    if lang:
        return _named_lexer(lang)
    try:
        if code and code.strip():
            return guess_lexer(code[:2000], stripnl=False)
    except ClassNotFound:
        pass
    return _named_lexer("text")


def mono() -> QTextCharFormat:
    f = QTextCharFormat()
    f.setFontFamilies(["monospace"])
    f.setFontStyleHint(QFont.Monospace)
    f.setFontFixedPitch(True)
    return f


class Highlighter:
    """Pygments tokens as character formats (one format per token type, made once)."""

    def __init__(self, style: str):
        self.style = _style(style)
        self._formats: dict = {}
        self.background = QColor(self.style.background_color or "#f8f8f8")

    def fmt(self, ttype) -> QTextCharFormat:
        f = self._formats.get(ttype)
        if f is None:
            s = self.style.style_for_token(ttype)
            f = mono()
            if s.get("color"):
                f.setForeground(QColor("#" + s["color"]))
            else:
                f.setForeground(self.plain_colour())
            if s.get("bold"):
                f.setFontWeight(QFont.Bold)
            if s.get("italic"):
                f.setFontItalic(True)
            self._formats[ttype] = f
        return f

    def plain_colour(self) -> QColor:
        return QColor("#f8f8f2") if self.background.lightness() < 128 else QColor("#1f2328")

    def insert(self, cur: QTextCursor, code: str, lexer) -> None:
        """`code` highlighted at the cursor (its newlines become the frame's blocks)."""
        tokens = list(lexer.get_tokens(code))
        if tokens and not code.endswith("\n") and tokens[-1][1].endswith("\n"):
            tokens[-1] = (tokens[-1][0], tokens[-1][1][:-1])  # the newline Pygments adds at the end
        for ttype, value in tokens:
            if value:
                cur.insertText(value, self.fmt(ttype))


# a line that begins a block of its own in Markdown (a list item, a quote, a heading, a rule or a
# setext underline, a fence): the line before it is not joined to it
BLOCK_START = re.compile(r" {0,3}(?:[-+*](?:\s|$)|\d{1,9}[.)](?:\s|$)|>|#{1,6}(?:\s|$)|[-=_*](?:\s*[-=_*]){2,}\s*$"
                         r"|`{3,}|~{3,})")


def _same_paragraph(line: str, after: str) -> bool:
    """Whether Markdown would join `after` to `line` (a soft break): neither starts a block of its
    own or is indented code, and `after` holds no | (a table's row)."""
    if not line.strip() or not after.strip() or line.startswith(("    ", "\t")) or after.startswith(("    ", "\t")):
        return False
    return "|" not in after and not BLOCK_START.match(after)


def keep_line_breaks(text: str) -> str:
    """A text block's Markdown with the line breaks Markdown would join into one paragraph made
    line separators (U+2028: a line break inside the paragraph), the rest left as they were: what
    the user typed on several lines shows on several lines, lists and tables still lists and tables."""
    lines = text.split("\n")
    out = lines[:1]
    for before, line in zip(lines, lines[1:]):
        out.append("\u2028" + line.lstrip() if _same_paragraph(before, line) else "\n" + line)
    return "".join(out)


def insert_markdown(cur: QTextCursor, text: str) -> None:
    """One text block's Markdown at the cursor (a paragraph, list, table or heading). An empty line
    the fragment leaves in a list (where it met the line before it) is taken out of the list."""
    doc = QTextDocument()
    doc.setMarkdown(text)
    first = cur.block().previous()
    top = cur.block()
    cur.insertFragment(QTextDocumentFragment(doc))
    if top.isValid() and top.previous().isValid() and top.previous().length() > 1:  # a little air above it
        fix = QTextCursor(top)
        fmt = fix.blockFormat()
        fmt.setTopMargin(max(fmt.topMargin(), 4))
        fix.setBlockFormat(fmt)
    b = first if first.isValid() else cur.document().begin()
    while b.isValid() and b.position() <= cur.position():
        if b.length() == 1 and b.textList() is not None:
            b.textList().remove(b)
            fix = QTextCursor(b)
            fmt = fix.blockFormat()
            fmt.setIndent(0)
            fix.setBlockFormat(fmt)
        b = b.next()


class CodeBlock:
    """A fenced code block's shaded frame: a header line (its language, a Copy code link), then code."""

    def __init__(self, cur: QTextCursor, lang: str, hl: Highlighter, copy_href: str, palette_text: QColor):
        self.lang, self.hl = lang, hl
        fmt = QTextFrameFormat()
        fmt.setBackground(QBrush(hl.background))
        fmt.setPadding(8)
        fmt.setTopMargin(4)
        fmt.setBottomMargin(8)
        self.frame: QTextFrame = cur.insertFrame(fmt)
        head = QTextCharFormat()
        head.setForeground(_mix(hl.background, hl.plain_colour(), 0.55))
        head.setFontPointSize(max(QFont().pointSizeF() - 1.5, 6.0))
        cur.insertText(f"{lang or 'code'}    ", head)
        link = QTextCharFormat(head)
        link.setAnchor(True)
        link.setAnchorHref(copy_href)
        link.setForeground(_mix(hl.background, hl.plain_colour(), 0.8))
        cur.insertText("Copy code", link)
        self.lines = 0  # complete lines shown highlighted
        self._lexer = _lexer(lang) if lang else None  # none named: plain while streaming, guessed at the end
        self._stream_lexer = self._lexer or _lexer("")
        self.tail = QTextCursor(self.frame.document())  # where the open line's block begins (its separator)
        self.tail.setKeepPositionOnInsert(True)  # text inserted at it (the open line) stays after it
        self.tail.setPosition(self.frame.lastPosition())

    def _head_end(self) -> int:
        cur = self.frame.firstCursorPosition()
        cur.movePosition(QTextCursor.EndOfBlock)
        return cur.position()

    def show(self, lines: list[str], partial: str) -> None:
        """While it streams: the complete lines not shown yet, highlighted, and the open line plain."""
        cur = QTextCursor(self.frame.document())
        cur.setPosition(self.tail.position())
        cur.setPosition(self.frame.lastPosition(), QTextCursor.KeepAnchor)
        cur.removeSelectedText()  # the open line as the last flush showed it
        for line in lines[self.lines:]:
            cur.insertBlock(QTextBlockFormat(), mono())
            self.hl.insert(cur, line, self._stream_lexer)
        self.lines = len(lines)
        self.tail.setPosition(cur.position())
        cur.insertBlock(QTextBlockFormat(), mono())
        plain = mono()
        plain.setForeground(self.hl.plain_colour())
        cur.insertText(partial, plain)

    def finish(self, code: str) -> None:
        """The fence closed (or the reply ended): the whole block highlighted once."""
        cur = QTextCursor(self.frame.document())
        cur.setPosition(self._head_end())
        cur.setPosition(self.frame.lastPosition(), QTextCursor.KeepAnchor)
        cur.removeSelectedText()
        cur.insertBlock(QTextBlockFormat(), mono())
        self.hl.insert(cur, code, self._lexer or _lexer("", code))


def _mix(a: QColor, b: QColor, share: float) -> QColor:
    return QColor(*(round(x + (y - x) * share) for x, y in zip(a.getRgb()[:3], b.getRgb()[:3])))


class Answer:
    """A message's Markdown at the end of `frame`, from `start` on, fed as it streams."""

    def __init__(self, frame: QTextFrame, start: int, style: str, copy, palette_text: QColor,
                 line_breaks: bool = False):
        self.frame, self.hl, self.copy, self.text_colour = frame, Highlighter(style), copy, palette_text
        self.line_breaks = line_breaks  # each line break of the text kept (a user's message), not joined
        self.splitter = BlockSplitter()
        self.mark = QTextCursor(frame.document())  # where the open block's rendering begins
        self.mark.setKeepPositionOnInsert(True)
        self.mark.setPosition(start)
        self.first = True  # nothing rendered yet: no separating line before the first block
        self.code: CodeBlock | None = None  # the open code block's frame
        self.code_copy: int | None = None  # its index in the view's copies
        self.source = ""

    def _clear_open(self) -> QTextCursor:
        cur = QTextCursor(self.frame.document())
        cur.setPosition(self.mark.position())
        cur.setPosition(self.frame.lastPosition(), QTextCursor.KeepAnchor)
        cur.removeSelectedText()
        return cur

    def _new_block(self, cur: QTextCursor) -> None:
        """A block of its own for what comes next: the empty line after a table's or code's frame
        is one already."""
        if not self.first and cur.block().length() > 1:
            cur.insertBlock(QTextBlockFormat(), QTextCharFormat())
        self.first = False

    def feed(self, text: str) -> None:
        """New text of the reply: the blocks it completed rendered once, the open block anew."""
        self.source += text
        for block in self.splitter.feed(text):
            self._complete(block)
        self._show_open()

    def close(self) -> None:
        for block in self.splitter.close():
            self._complete(block)
        self._clear_open()

    def _complete(self, block: Block) -> None:
        if block.kind == "code":
            if self.code is None:  # opened and closed within one feed
                self._clear_open()
                self._open_code(block)
            self.copy(block.text + "\n", self.code_copy)
            self.code.finish(block.text)
            self.code = None
            self.mark.setPosition(self.frame.lastPosition())
            self.first = True  # the line after the code's frame is the next block's
            return
        cur = self._clear_open()
        self._new_block(cur)
        insert_markdown(cur, keep_line_breaks(block.text) if self.line_breaks else block.text)
        self.mark.setPosition(cur.position())

    def _open_code(self, block: Block) -> None:
        cur = QTextCursor(self.frame.document())
        cur.setPosition(self.mark.position())
        self.first = False
        self.code_copy = self.copy(block.text, None)
        self.code = CodeBlock(cur, block.lang, self.hl, f"copy:{self.code_copy}", self.text_colour)

    def _show_open(self) -> None:
        block, partial = self.splitter.open, self.splitter.partial
        if partial.lstrip().startswith(("``", "~~")):  # a fence being written: not shown as backticks
            partial = ""
        if block.kind == "code":
            if self.code is None:
                self._clear_open()
                self._open_code(block)
            self.copy("\n".join(block.lines + [partial]), self.code_copy)
            self.code.show(block.lines, partial)
            return
        cur = self._clear_open()
        text = "\n".join(block.lines + [partial])
        if text.strip():
            at = cur.position()
            if not self.first and cur.block().length() > 1:  # as _new_block, but the open block stays open
                cur.insertBlock(QTextBlockFormat(), QTextCharFormat())
            insert_markdown(cur, keep_line_breaks(text) if self.line_breaks else text)
            self.mark.setPosition(at)  # the open block is rendered again at the next flush
