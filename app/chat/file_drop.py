"""Files dragged from a file manager onto a text widget (the composer's text box, the message view)
become attachments, never their file:// URLs as text. While a drag of local files is over the
widget it shows where they will land: a dashed highlight frame over it saying "Drop to attach" (an
overlay, so the text under it is neither laid out again nor restyled), and the dynamic property
DRAG_PROPERTY set; both gone when the drag leaves or drops. Drags of anything else (text) go to the
widget as before."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen
from PySide6.QtWidgets import QAbstractScrollArea, QWidget

DRAG_PROPERTY = "fileDragOver"
HINT = "Drop to attach"


def local_files(mime) -> list[str]:
    """The local files a drag (or paste) carries; none for text, web links, or nothing."""
    if mime is None or not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]


class DropHighlight(QWidget):
    """The frame drawn over a widget while files are dragged over it (mouse and drags pass through)."""

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setAttribute(Qt.WA_TransparentForMouseEvents)
        self.hide()

    def paintEvent(self, _e) -> None:
        colour = self.palette().color(QPalette.Highlight)
        fill = QColor(colour)
        fill.setAlpha(28)
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(colour, 2, Qt.DashLine))
        p.setBrush(fill)
        p.drawRoundedRect(self.rect().adjusted(1, 1, -1, -1), 6, 6)
        p.setPen(colour)
        p.drawText(self.rect(), Qt.AlignCenter, HINT)
        p.end()


class FileDrop(QObject):
    """Files dropped on `widget` go to attach(path), one call per file, in the order dragged."""

    def __init__(self, widget: QWidget, attach: Callable[[str], object]):
        super().__init__(widget)
        self.widget, self.attach = widget, attach
        # the window system delivers a scroll area's drags to its viewport (the widget under the pointer)
        self.target = widget.viewport() if isinstance(widget, QAbstractScrollArea) else widget
        self.target.setAcceptDrops(True)  # a read-only view (the messages) refuses drops otherwise
        self.target.installEventFilter(self)
        widget.setProperty(DRAG_PROPERTY, False)
        self.frame = DropHighlight(widget)

    def highlight(self, on: bool) -> None:
        self.widget.setProperty(DRAG_PROPERTY, on)
        if not on:
            self.frame.hide()
            return
        self.frame.setGeometry(self.widget.rect())  # the widget may have been resized since
        if self.frame.isHidden():
            self.frame.raise_()
            self.frame.show()

    def eventFilter(self, obj, ev) -> bool:
        kind = ev.type()
        if kind in (QEvent.DragEnter, QEvent.DragMove):
            if not local_files(ev.mimeData()):
                return False  # text dragged in: the widget's own business
            ev.setDropAction(Qt.CopyAction)
            ev.accept()
            self.highlight(True)
            return True
        if kind == QEvent.DragLeave:
            self.highlight(False)
            return False
        if kind == QEvent.Drop:
            self.highlight(False)
            paths = local_files(ev.mimeData())
            if not paths:
                return False
            ev.setDropAction(Qt.CopyAction)
            ev.accept()
            for path in paths:
                self.attach(path)
            return True
        return False
