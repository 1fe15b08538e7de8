"""The pieces of a message in the message view's document (app/chat_view.py), coloured from the
palette so both themes read: the message's bubble (a frame: the user's tinted with the highlight
colour and set to the right, the model's a quiet box across the view), its header (who, and a Copy
link), the named chips of its attached documents, and the quiet footer under a reply."""
from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFrame, QTextFrameFormat

from .attachments import human_size

ROLE_LABEL = {"user": "You", "assistant": "Mixdesk", "system": "System"}
USER_INDENT = 72  # px the user's bubble leaves on its left
REPLY_INDENT = 24  # px the model's bubble leaves on its right


def mix(a: QColor, b: QColor, share: float) -> QColor:
    return QColor(*(round(x + (y - x) * share) for x, y in zip(a.getRgb()[:3], b.getRgb()[:3])))


def tint(palette: QPalette, share: float) -> QColor:
    """The text colour laid over the base at `share` (0: the base, 1: the text)."""
    return mix(palette.color(QPalette.Base), palette.color(QPalette.Text), share)


def dark(palette: QPalette) -> bool:
    return palette.color(QPalette.Base).lightness() < 128


def small(palette: QPalette, share: float = 0.55, bold: bool = False) -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(tint(palette, share))
    f.setFontPointSize(max(QFont().pointSizeF() - 1.5, 6.0))
    if bold:
        f.setFontWeight(QFont.DemiBold)
    return f


def link(fmt: QTextCharFormat, href: str, tooltip: str = "") -> QTextCharFormat:
    f = QTextCharFormat(fmt)
    f.setAnchor(True)
    f.setAnchorHref(href)
    f.setFontUnderline(False)
    if tooltip:
        f.setToolTip(tooltip)
    return f


def bubble(cur: QTextCursor, palette: QPalette, role: str) -> QTextFrame:
    """A message's frame at the end of the document; the cursor is left in its (empty) first block."""
    fmt = QTextFrameFormat()
    fmt.setPadding(10)
    fmt.setTopMargin(6)
    fmt.setBottomMargin(0)
    if role == "user":
        fmt.setBackground(mix(palette.color(QPalette.Base), palette.color(QPalette.Highlight),
                              0.26 if dark(palette) else 0.13))
        fmt.setLeftMargin(USER_INDENT)
    else:
        fmt.setBackground(tint(palette, 0.035))
        fmt.setBorder(1)
        fmt.setBorderBrush(tint(palette, 0.13))
        fmt.setBorderStyle(QTextFrameFormat.BorderStyle_Solid)
        fmt.setRightMargin(REPLY_INDENT)
    cur.movePosition(QTextCursor.End)
    return cur.insertFrame(fmt)


def header(cur: QTextCursor, palette: QPalette, role: str, copy_href: str) -> None:
    """Who wrote it, and a Copy link for the whole message; the cursor ends in a new block below."""
    cur.insertText(ROLE_LABEL.get(role, role), small(palette, 0.7, bold=True))
    cur.insertText("    ", small(palette))
    cur.insertText("Copy", link(small(palette, 0.5), copy_href, "Copy the whole message"))
    cur.insertBlock(QTextBlockFormat(), QTextCharFormat())


def chips(cur: QTextCursor, palette: QPalette, files: list[dict], first_href: int) -> None:
    """One chip per attached document, its name and size, a link that opens it (open:N)."""
    fill = mix(palette.color(QPalette.Base), palette.color(QPalette.Text), 0.10)
    for i, f in enumerate(files):
        fmt = QTextCharFormat()
        fmt.setBackground(fill)
        fmt.setForeground(tint(palette, 0.85))
        size = f" · {human_size(f['size'])}" if f.get("size") is not None else ""
        tip = f"Open {f['path']}" if f.get("path") else "Attached before Mixdesk kept where files were"
        cur.insertText(f"\u00a0▤\u00a0{f['name']}{size}\u00a0", link(fmt, f"open:{first_href + i}", tip))
        cur.insertText("  ", QTextCharFormat())
    cur.insertBlock(QTextBlockFormat(), QTextCharFormat())


def footer(frame: QTextFrame, palette: QPalette, text: str, tooltip: str = "") -> None:
    """The quiet line under a bubble (in the root block after its frame); the tooltip holds the detail."""
    cur = QTextCursor(frame.document())
    cur.setPosition(frame.lastPosition() + 1)
    cur.movePosition(QTextCursor.EndOfBlock)
    fmt = QTextBlockFormat()
    fmt.setLeftMargin(frame.frameFormat().leftMargin() + 10)
    fmt.setTopMargin(2)
    cur.setBlockFormat(fmt)
    f = small(palette, 0.5)
    if tooltip:
        f.setToolTip(tooltip)
    cur.insertText(text, f)
