"""Attachments of the message being written: a row of chips, each a parsed document with its size
and token count. Parsing and fitting to the context run off the GUI thread (documents.parse_later);
the result comes back through a queued signal. Needs no model: without a context set, documents
are attached whole (the window sets the context when a model is loaded). A document longer than the
context offers its first part, and, where memory allows the model a context long enough, to open it
with that context (`longer_context`: the window sends the SetContext) and attach the whole document
once the model runs at it."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QMessageBox, QToolButton, QWidget

from . import documents

STEP = 1024  # a longer context offered for a document is a multiple of this many tokens


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


def room_of(ctx: int) -> int:
    """Tokens a document may take in a context of ctx: the context less room for the question and the reply."""
    return ctx - min(1024, ctx // 4)


def context_for(tokens: int, choice) -> int:
    """The shortest context (a multiple of STEP, or the model's own) whose room holds `tokens`, and that
    memory allows now (choice: the model's ContextChoice); 0 if there is none."""
    if choice is None:
        return 0
    top = choice.cost.max_positions
    ctx = tokens + 1024 if tokens + 1024 >= 4096 else -(-4 * tokens // 3)
    ctx = min(-(-ctx // STEP) * STEP, top)
    return ctx if room_of(ctx) >= tokens and ctx <= max(choice.fits, 0) else 0


class Attachments(QWidget):
    notice = Signal(str)  # a file that could not be attached, and why (one line)
    longer_context = Signal(int)  # the user chose to open the model with this many tokens of context

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
        self.context = None  # the model's ContextChoice (engine/planning/kv_reservation.py), when known
        self.waiting: list[tuple[int, documents.Document, int]] = []  # (context, document, tokens) to attach at it
        self.too_long_box: QMessageBox | None = None
        self._timers: dict[str, QTimer] = {}
        self._order: dict[str, int] = {}  # each path's place in the order the user attached them
        self._parsed = _Parsed()
        self._parsed.done.connect(self._on_parsed)

    def set_context(self, ctx: int, count_tokens, context=None) -> None:
        """The model's context (tokens), its tokenizer's count and its ContextChoice; documents waiting
        for a longer context are attached once the model runs at it."""
        self.ctx, self.count_tokens, self.context = ctx, count_tokens, context
        ready = [w for w in self.waiting if w[0] <= ctx]
        self.waiting = [w for w in self.waiting if w[0] > ctx]
        for _, doc, tokens in ready:
            self.add(doc, tokens)

    @property
    def room(self) -> int:
        """Tokens a document may take: the context less room for the question and the reply."""
        return room_of(self.ctx) if self.count_tokens else 0

    @property
    def longest_room(self) -> int:
        """The room of the longest context memory allows the model now (0: not known)."""
        c = self.context
        return room_of(min(c.fits, c.cost.max_positions)) if c is not None and c.fits > self.ctx else 0

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

        documents.parse_later(path, self.room, self.count_tokens, self.longest_room).add_done_callback(finished)

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
            self._too_long(fitted)
            return
        self.add(fitted.doc, fitted.tokens if fitted.exact else None)

    def _too_long(self, fitted) -> None:
        """The document does not fit the context: its first part, or (where memory allows the model a
        context long enough) that context and the whole document, or neither."""
        from engine.planning.kv_reservation import size_text

        size = f"{fitted.tokens:,}" if fitted.exact else f"more than {fitted.tokens:,}"
        longer = context_for(fitted.tokens, self.context) if fitted.exact else 0
        text = (f"{fitted.doc.name} is {size} tokens; the context holds {self.ctx:,}. "
                f"Attach its first part ({self.room:,} tokens) instead?")
        if longer:
            text += (f" Or open the model with a {longer:,}-token context, which holds all of it "
                     f"({size_text(self.context.bytes_at(longer))} of keys and values).")
        box = QMessageBox(QMessageBox.Question, "Document too long", text, QMessageBox.Yes | QMessageBox.No,
                          self.window())
        box.button(QMessageBox.Yes).setText("Attach its first part")
        box.button(QMessageBox.No).setText("Cancel")
        if longer:
            button = box.addButton(f"Open with a longer context (needs {size_text(self.context.bytes_at(longer))})",
                                   QMessageBox.AcceptRole)
            button.clicked.connect(lambda: self._at_longer(longer, fitted))
            box.longer_button = button
        box.finished.connect(lambda r: r == QMessageBox.Yes and self.add(fitted.part))
        box.open()  # not modal-blocking: the window keeps running
        self.too_long_box = box

    def _at_longer(self, ctx: int, fitted) -> None:
        """The whole document, once the model runs at ctx tokens (the window asks the engine for it)."""
        self.waiting.append((ctx, fitted.doc, fitted.tokens))
        self.longer_context.emit(ctx)

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
