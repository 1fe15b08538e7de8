"""The pieces of a message in the message view's document (app/chat/view.py), coloured from the
palette so both themes read: where a message goes (the user's in a bubble, a frame tinted with the
highlight colour and set to the right; the model's across the view, in the document's own frame),
its header (who, and a Copy link), the named chips of its attached documents, and the quiet footer
under a reply."""
from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFrame, QTextFrameFormat

from .attachments import human_size

ROLE_LABEL = {"user": "You", "assistant": "Mixdesk", "system": "System"}
USER_INDENT = 72  # px the user's bubble leaves on its left
REPLY_GAP = 18  # px above a reply's header


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


def relabel(document, href: str, old: str, new: str) -> bool:
    """The link to `href` that reads `old` made to read `new`, in its own format (Copy -> Copied
    and back); False where no such link is there (the document was drawn again meanwhile)."""
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().anchorHref() == href and frag.text() == old:
                cur = QTextCursor(document)
                cur.setPosition(frag.position())
                cur.setPosition(frag.position() + frag.length(), QTextCursor.KeepAnchor)
                cur.insertText(new, frag.charFormat())
                return True
            it += 1
        block = block.next()
    return False


def bubble(cur: QTextCursor, palette: QPalette, role: str) -> QTextFrame | DocumentEnd:
    """Where a message goes, at the end of the document; the cursor is left in its (empty) first block.
    The user's message is a frame tinted with the highlight colour and set to the right; a reply is
    blocks of the document's own (root) frame under its header line, across the view, not boxed:
    Qt lays a nested frame out whole after each edit inside it (measured: an insert at the end of a
    4,000-block frame 2.2 ms, in the root frame 0.08 ms whatever its length), so a streaming reply
    in a frame would cost more per token the longer it grew. Returns the frame the message ends in."""
    cur.movePosition(QTextCursor.End)
    if role == "user":
        fmt = QTextFrameFormat()
        fmt.setPadding(10)
        fmt.setTopMargin(6)
        fmt.setBottomMargin(0)
        fmt.setBackground(mix(palette.color(QPalette.Base), palette.color(QPalette.Highlight),
                              0.26 if dark(palette) else 0.13))
        fmt.setLeftMargin(USER_INDENT)
        return cur.insertFrame(fmt)
    top = QTextBlockFormat()
    top.setTopMargin(REPLY_GAP if cur.block().previous().isValid() or cur.block().length() > 1 else 0)
    if cur.block().length() > 1:
        cur.insertBlock(top, QTextCharFormat())
    else:
        cur.setBlockFormat(top)
    return DocumentEnd(cur.document)


class DocumentEnd:
    """What a reply ends in, standing in for a frame (document(), lastPosition()): the document's
    end, since a reply is built, and streams, at the end. It asks for the document each time rather
    than keep it: PySide6 (6.11) marks a kept QTextDocument wrapper deleted once any frame wrapper
    whose document() was called is collected (its return value is made that wrapper's child)."""

    def __init__(self, document):
        self.document = document  # a callable that gives the document

    def lastPosition(self) -> int:
        return self.document().characterCount() - 1


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


def footer(frame: QTextFrame | DocumentEnd, palette: QPalette, text: str, tooltip: str = "") -> None:
    """The quiet line under a reply (a block of its own at the end of the document, where the reply
    ends); the tooltip holds the detail."""
    cur = QTextCursor(frame.document())
    cur.movePosition(QTextCursor.End)
    fmt = QTextBlockFormat()
    fmt.setTopMargin(2)
    f = small(palette, 0.5)
    if tooltip:
        f.setToolTip(tooltip)
    if cur.block().length() > 1:
        cur.insertBlock(fmt, f)
    else:
        cur.setBlockFormat(fmt)
    cur.insertText(text, f)


def versions(frame: QTextFrame | DocumentEnd, palette: QPalette, mid, shown: int, count: int) -> None:
    """Under a regenerated reply: ‹ 2/3 ›, each arrow a link to the version beside the one shown
    (version:MID:J; an arrow with nowhere to go is drawn faint and links nowhere)."""
    cur = QTextCursor(frame.document())
    cur.movePosition(QTextCursor.End)
    fmt = QTextBlockFormat()
    fmt.setTopMargin(2)
    if cur.block().length() > 1:
        cur.insertBlock(fmt, small(palette, 0.6))
    else:
        cur.setBlockFormat(fmt)
    for arrow, j, tip in (("‹", shown - 1, "The answer before"), (None, None, None), ("›", shown + 1, "The answer after")):
        if arrow is None:
            cur.insertText(f"  answer {shown + 1} of {count}  ", small(palette, 0.7))
        elif 0 <= j < count:
            fmt = small(palette, 0.95, bold=True)
            fmt.setFontPointSize(fmt.fontPointSize() + 3)  # a target a finger or a mouse finds
            cur.insertText(f" {arrow} ", link(fmt, f"version:{mid}:{j}", tip))
        else:
            fmt = small(palette, 0.3, bold=True)
            fmt.setFontPointSize(fmt.fontPointSize() + 3)
            cur.insertText(f" {arrow} ", fmt)
