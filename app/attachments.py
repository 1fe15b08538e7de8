"""Attachments of the message being written: a row of chips, each a parsed document with its size
and token count. Parsing and fitting to the context run off the GUI thread (documents.parse_later);
the result comes back through a queued signal. Needs no model: without a context set, documents
are attached whole (the window sets the context when a model is loaded)."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QMessageBox, QToolButton, QWidget

from . import documents


def human_size(n: int) -> str:
    """A file's size for people: "312 bytes", "4.2 KB", "1.3 MB" (never "0 KB")."""
    if n < 1024:
        return "1 byte" if n == 1 else f"{n:,} bytes"
    for unit, scale in (("KB", 1024), ("MB", 1024 ** 2), ("GB", 1024 ** 3)):
        if n < scale * 1024 or unit == "GB":
            value = n / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n} bytes"


class _Parsed(QObject):
    done = Signal(object, object, object)  # path, Fitted | None, error message | None


class Attachments(QWidget):
    notice = Signal(str)  # a file that could not be attached, and why (one line)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.addStretch(1)
        self.docs: list[documents.Document] = []
        # The chips, in the row's order. Kept here, never read back with QLayout.itemAt: PySide keeps
        # the QWidgetItem wrapper itemAt returns alive after the layout deletes the item, and a later
        # Qt object at that address came back as the stale wrapper (a QTextFrame read as a QWidgetItem,
        # then segfaults in the window tests). tests/test_attachments_lifetime.py holds this.
        self.chips: list[QToolButton] = []
        self.ctx = 0
        self.count_tokens = None
        self.too_long_box: QMessageBox | None = None
        self._timers: dict[str, QTimer] = {}
        self._order: dict[str, int] = {}  # each path's place in the order the user attached them
        self._parsed = _Parsed()
        self._parsed.done.connect(self._on_parsed)

    def set_context(self, ctx: int, count_tokens) -> None:
        self.ctx, self.count_tokens = ctx, count_tokens

    @property
    def room(self) -> int:
        """Tokens a document may take: the context less room for the question and the reply."""
        return self.ctx - min(1024, self.ctx // 4) if self.count_tokens else 0

    def attach_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files")
        for p in paths:
            self.attach(p)

    def attach(self, path: str) -> None:
        """Parse off the GUI thread with a time limit; the result comes back through a queued signal."""
        self._order.setdefault(str(path), len(self._order))
        timer = QTimer(self, singleShot=True)
        timer.timeout.connect(lambda: self._parsed.done.emit(
            path, None, f"{Path(path).name}: took longer than {documents.TIME_LIMIT_S:.0f} s to read"))
        self._timers[path] = timer  # registered before the parse can possibly finish
        timer.start(int(documents.TIME_LIMIT_S * 1000) + 5000)  # the child process is stopped at the limit itself

        def finished(f: concurrent.futures.Future):
            try:
                self._parsed.done.emit(path, f.result(), None)
            except documents.DocumentError as e:
                self._parsed.done.emit(path, None, str(e))
            except Exception as e:  # never a crash: name the file and the problem
                self._parsed.done.emit(path, None, f"{Path(path).name}: could not be read ({type(e).__name__})")

        documents.parse_later(path, self.room, self.count_tokens).add_done_callback(finished)

    def _on_parsed(self, path, fitted, error) -> None:
        t = self._timers.pop(path, None)
        if t is not None:
            t.stop()
        elif fitted is not None or error is None:
            return  # already reported as timed out
        if error:
            self.notice.emit(error)
            return
        if fitted.part is not None:  # counted and cut on the parsing thread (documents.fit)
            size = f"{fitted.tokens:,}" if fitted.exact else f"more than {fitted.tokens:,}"
            box = QMessageBox(QMessageBox.Question, "Document too long",
                              f"{fitted.doc.name} is {size} tokens; the context holds {self.ctx:,}. "
                              f"Attach its first part ({self.room:,} tokens) instead?",
                              QMessageBox.Yes | QMessageBox.No, self.window())
            box.finished.connect(lambda r: r == QMessageBox.Yes and self.add(fitted.part))
            box.open()  # not modal-blocking: the window keeps running
            self.too_long_box = box
            return
        self.add(fitted.doc, fitted.tokens if fitted.exact else None)

    def add(self, doc: documents.Document, tokens: int | None = None) -> None:
        if tokens is None:
            tokens = self.count_tokens(doc.text) if self.count_tokens else 0
        # in the order attached, whichever parse finished first (the model reads them numbered so)
        place = self._order.get(str(doc.path), len(self._order))
        at = sum(self._order.get(str(d.path), len(self._order)) <= place for d in self.docs)
        self.docs.insert(at, doc)
        label = f"{doc.name} · {human_size(doc.size)}" + (f" · {tokens:,} tokens" if self.count_tokens else "")
        chip = QToolButton(text=f"{label}  ✕")
        chip.setProperty("tokens", tokens)
        chip.clicked.connect(lambda: self._remove(chip, doc))
        self.row.insertWidget(at, chip)
        self.chips.insert(at, chip)

    def chip_widgets(self) -> list[QToolButton]:
        return list(self.chips)

    def _remove(self, chip, doc) -> None:
        self.docs.remove(doc)
        self.chips.remove(chip)
        chip.deleteLater()

    def clear(self) -> None:
        for w in self.chips:
            w.deleteLater()
        self.chips = []
        self.docs = []
        self._order = {}
