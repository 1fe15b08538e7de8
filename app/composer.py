"""The composer: the message being written, its attachments, and the buttons that act on the
conversation (attach, send, stop, regenerate, edit last), the Think switch (shown for a model whose
chat template can switch its reasoning off), with the context indicator. It says what
the user asked for through signals; the window decides what happens. Files pasted from a file
manager (URLs on the clipboard) become attachments, not text."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

from .attachments import Attachments


class Composer(QWidget):
    send_requested = Signal()
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal()
    think_toggled = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.ctx = 0  # the model's context, in tokens
        self.used: int | None = None  # what the chat shown took of it, as last shown
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.attachments = Attachments(self)
        lay.addWidget(self.attachments)
        self.input = QPlainTextEdit(placeholderText="Message Mixdesk — drop files here (Ctrl+Enter sends)")
        self.input.setMaximumHeight(110)
        self.input.installEventFilter(self)
        lay.addWidget(self.input)
        row = QHBoxLayout()
        self.attach_btn = QToolButton(text="Attach…")
        self.attach_btn.setToolTip("Attach files (txt, md, code, csv, json, html, pdf, docx)")
        self.attach_btn.clicked.connect(self.attachments.attach_dialog)
        self.think_btn = QToolButton(text="Think", checkable=True, checked=True)
        self.think_btn.setToolTip("Let the model reason before it answers (off: quicker answers, no reasoning)")
        self.think_btn.toggled.connect(self.think_toggled)
        self.think_btn.hide()
        self.send_btn = QPushButton("Send")
        self.send_btn.clicked.connect(self.send_requested)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.clicked.connect(self.stop_requested)
        self.stop_btn.setEnabled(False)
        self.regen_btn = QPushButton("Regenerate")
        self.regen_btn.clicked.connect(self.regenerate_requested)
        self.edit_btn = QPushButton("Edit last")
        self.edit_btn.clicked.connect(self.edit_requested)
        self.context_label = QLabel("")
        for w in (self.attach_btn, self.think_btn, self.send_btn, self.stop_btn, self.regen_btn, self.edit_btn):
            row.addWidget(w)
        row.addStretch(1)
        row.addWidget(self.context_label)
        lay.addLayout(row)

    def set_generating(self, generating: bool, ready: bool = True) -> None:
        """Send while idle (and a model is ready), Stop while a reply streams."""
        self.send_btn.setEnabled(ready and not generating)
        self.stop_btn.setEnabled(generating)

    def follow(self, engine) -> None:
        engine.loaded.connect(self._on_loaded)

    def _on_loaded(self, ev) -> None:
        self.think_btn.setVisible(ev.thinking_switch)
        self.attachments.set_context(ev.ctx, ev.count_tokens)
        self.ctx = ev.ctx

    def show_context(self, used: int | None, ctx: int | None = None, limit: int | None = None) -> None:
        """The context indicator: tokens the chat shown takes (None: not known yet) of its memory
        (`limit`: chat_settings.context_for, never above the model's), else of the model's context."""
        self.ctx = ctx or self.ctx
        self.used = used
        cap = limit or self.ctx
        self.context_label.setText(f"context {used:,}/{cap:,} tokens" if used is not None and cap else "")
        if cap and self.ctx and cap < self.ctx:
            self.context_label.setToolTip(f"How much of this chat's memory ({cap:,} of the model's {self.ctx:,} "
                                          "tokens; Chat > Chat settings…) its last reply used")
        else:
            self.context_label.setToolTip("How much of the model's context window this chat's last reply used")

    def set_think(self, on: bool) -> None:
        """The Think switch as the chat shown remembers it (no think_toggled)."""
        self.think_btn.blockSignals(True)
        self.think_btn.setChecked(on)
        self.think_btn.blockSignals(False)

    def paste_files(self, mime=None) -> bool:
        """Files copied in a file manager arrive as URLs on the clipboard: attach them."""
        if mime is None:
            mime = QApplication.clipboard().mimeData()
        urls = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()] if mime and mime.hasUrls() else []
        for path in urls:
            self.attachments.attach(path)
        return bool(urls)

    def eventFilter(self, obj, ev):
        if obj is self.input and ev.type() == QEvent.KeyPress and ev.matches(QKeySequence.Paste):
            if self.paste_files():
                return True  # files pasted as attachments, not as text
        return super().eventFilter(obj, ev)
