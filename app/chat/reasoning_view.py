"""What a reply holds besides its answer, in the message view (app/chat/view.py): the model's
reasoning, a block above the answer folded to one line ("Thinking…" while it streams, "Thought for
N s" once the answer begins) that a click unfolds and folds again, even while it streams; and the
tool calls the model made, each a small block saying what it called (the window offers the model no
tools, so none is run), never the model's markup.

Each block is a QTextFrame of the view's document: a frame keeps its place while text is added
before or after it, so folding, unfolding and streaming into one rewrite only that frame."""
from __future__ import annotations

import json
from dataclasses import dataclass

from PySide6.QtGui import QColor, QFont, QPalette, QTextCharFormat, QTextCursor, QTextFrame, QTextFrameFormat

LINK = "think"  # the scheme of a block's header link: think:N, N its index in the view's list
NOT_RUN = "Not run: the chat window offers the model no tools."


def tint(palette: QPalette, share: float) -> QColor:
    """The palette's text colour laid over its base colour at `share` (0: the base, 1: the text),
    so the blocks follow the theme."""
    a, b = palette.color(QPalette.Base), palette.color(QPalette.Text)
    return QColor(*(round(x + (y - x) * share) for x, y in zip(a.getRgb()[:3], b.getRgb()[:3])))


def title(seconds: float | None) -> str:
    if seconds is None:
        return "Thinking…"
    return f"Thought for {seconds:.1f} s" if seconds < 10 else f"Thought for {seconds:.0f} s"


def box(cur: QTextCursor, palette: QPalette) -> QTextFrame:
    """A shaded frame at the cursor (which is then inside it), with no empty line left above it."""
    fmt = QTextFrameFormat()
    fmt.setBackground(tint(palette, 0.07))
    fmt.setPadding(6)
    fmt.setTopMargin(2)
    fmt.setBottomMargin(4)
    frame = cur.insertFrame(fmt)
    above = QTextCursor(frame.document())
    above.setPosition(frame.firstPosition() - 1)
    if not above.block().text() and above.block().previous().isValid():
        above.deletePreviousChar()  # the empty line insertFrame leaves where it split the block
    return frame


def _chars(palette: QPalette, share: float, href: str = "", mono: bool = False, small: bool = False) -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(tint(palette, share))
    if href:
        f.setAnchor(True)
        f.setAnchorHref(href)
        f.setFontUnderline(False)
    if mono:
        f.setFontFamilies(["monospace"])
        f.setFontStyleHint(QFont.Monospace)
    if small:
        f.setFontPointSize(max(QFont().pointSizeF() - 1.5, 6.0))
    return f


@dataclass(eq=False)
class Thought:
    """One reply's reasoning block. `text` grows while it streams (`flush` shows what is new when
    unfolded); `seconds` is None until the answer begins."""

    frame: QTextFrame
    href: str
    palette: QPalette
    text: str = ""
    seconds: float | None = None
    open: bool = False
    key: object = None  # the message it belongs to (its id), where known
    shown: int = 0  # characters of `text` handled (shown when unfolded)
    body: bool = False  # the frame holds the reasoning's own block (below the header)

    def _cursor(self) -> QTextCursor:
        return QTextCursor(self.frame.document())

    def header(self) -> str:
        return ("▾ " if self.open else "▸ ") + title(self.seconds)

    def render(self) -> None:
        """The frame's contents anew: the header, and the reasoning when unfolded."""
        cur = self._cursor()
        cur.setPosition(self.frame.firstPosition())
        cur.setPosition(self.frame.lastPosition(), QTextCursor.KeepAnchor)
        cur.insertText(self.header(), _chars(self.palette, 0.55, self.href))
        self.shown, self.body = 0, False
        self.flush()

    def retitle(self) -> None:
        cur = self._cursor()
        cur.setPosition(self.frame.firstPosition())
        cur.movePosition(QTextCursor.EndOfBlock, QTextCursor.KeepAnchor)
        cur.insertText(self.header(), _chars(self.palette, 0.55, self.href))

    def flush(self) -> None:
        """Append the reasoning not shown yet (only when unfolded: folded, it costs nothing)."""
        if not self.open:
            return
        new = self.text[self.shown:]
        if not self.body:
            new = new.lstrip()
        if self.seconds is not None:
            new = new.rstrip()
        if new:
            cur = self._cursor()
            cur.setPosition(self.frame.lastPosition())
            if not self.body:
                cur.insertBlock()
                self.body = True
            cur.insertText(new, _chars(self.palette, 0.7))
        self.shown = len(self.text)

    def toggle(self) -> None:
        self.open = not self.open
        self.render()


def call_line(name: str, arguments: str) -> str:
    try:
        args = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        args = arguments
    return f"Called {name}({args if len(args) <= 400 else args[:400] + '…'})"


def tool_calls(frame: QTextFrame, calls, palette: QPalette) -> None:
    """A block for each tool call (dicts of id, name, arguments), at the end of the message's frame."""
    cur = QTextCursor(frame.document())
    for call in calls:
        cur.setPosition(frame.lastPosition())
        if cur.block().length() > 1:
            cur.insertBlock()
        box(cur, palette)
        cur.insertText(call_line(call.get("name", "?"), call.get("arguments", "")), _chars(palette, 0.85, mono=True))
        cur.insertBlock()
        cur.insertText(NOT_RUN, _chars(palette, 0.5, small=True))


def notes(frame: QTextFrame, lines, palette: QPalette) -> None:
    """One quiet line for each note (a tool call the model wrote that could not be read), at the end
    of the message's frame."""
    cur = QTextCursor(frame.document())
    for line in lines:
        cur.setPosition(frame.lastPosition())
        if cur.block().length() > 1 or cur.block().previous().isValid():
            cur.insertBlock()
        cur.insertText(f"Note: {line}", _chars(palette, 0.5, small=True))
