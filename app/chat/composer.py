"""The composer: the message being written, its attachments, and the buttons that act on the
conversation (attach, send, stop, regenerate, edit last), the Think switch (shown for a model whose
chat template can switch its reasoning off), with the context indicator. It says what
the user asked for through signals; the window decides what happens. Files pasted from a file
manager (URLs on the clipboard) or dropped on the text box become attachments, not text
(app/chat/file_drop.py). Enter sends and Shift+Enter adds a line, or (Settings > Enter sends message
off) Enter adds a line; Ctrl+Enter always sends."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

from .attachments import Attachments
from .file_drop import FileDrop, local_files

PLACEHOLDER = {True: "Message Mixdesk — drop files here (Enter sends, Shift+Enter adds a line)",
               False: "Message Mixdesk — drop files here (Ctrl+Enter sends, Enter adds a line)"}
ENTER_KEYS = (Qt.Key_Return, Qt.Key_Enter)


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
        self.enter_sends = True  # Enter sends (Shift+Enter adds a line); False: Enter adds a line
        self.input = QPlainTextEdit(placeholderText=PLACEHOLDER[True])
        self.input.setMaximumHeight(110)
        self.input.installEventFilter(self)
        self.file_drop = FileDrop(self.input, self.attachments.attach)
        lay.addWidget(self.input)
        row = QHBoxLayout()
        self.attach_btn = QToolButton(text="Attach…")
        self.attach_btn.setToolTip("Attach files (txt, md, code, csv, json, html, pdf, docx)")
        self.attach_btn.clicked.connect(self.attach_dialog)
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
        self.context_label.setWordWrap(True)  # a narrow window wraps it rather than widening the chat's column
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
        self.attachments.set_context(ev.ctx, ev.count_tokens, getattr(ev, "context", None))
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

    def set_enter_sends(self, on: bool) -> None:
        """Settings > Enter sends message: Enter sends (on) or adds a line (off); the placeholder says which."""
        self.enter_sends = bool(on)
        self.input.setPlaceholderText(PLACEHOLDER[self.enter_sends])

    def attach_dialog(self) -> None:
        """Attach…: the file dialog, then the text box has the focus again (to type the question)."""
        self.attachments.attach_dialog()
        self.input.setFocus(Qt.OtherFocusReason)

    def paste_files(self, mime=None) -> bool:
        """Files copied in a file manager arrive as URLs on the clipboard: attach them."""
        if mime is None:
            mime = QApplication.clipboard().mimeData()
        paths = local_files(mime)
        for path in paths:
            self.attachments.attach(path)
        return bool(paths)

    def _enter(self, ev) -> bool:
        """Enter, Shift+Enter or Ctrl+Enter in the text box: True where it was handled here."""
        mods = ev.modifiers() & ~Qt.KeypadModifier
        if mods == Qt.ControlModifier or (mods == Qt.NoModifier and self.enter_sends):
            self.send_requested.emit()  # the window sends only while Send is enabled (not while a reply streams)
            return True
        if mods == Qt.ShiftModifier:
            self.input.textCursor().insertText("\n")  # a new line (not Qt's line separator, U+2028)
            self.input.ensureCursorVisible()
            return True
        return False  # Enter with Enter sends off: the text box adds a line

    def eventFilter(self, obj, ev):
        if obj is self.input and ev.type() == QEvent.KeyPress:
            if ev.matches(QKeySequence.Paste) and self.paste_files():
                return True  # files pasted as attachments, not as text
            if ev.key() in ENTER_KEYS and self._enter(ev):
                return True
        return super().eventFilter(obj, ev)

    # ---- the draft (each chat its own: app/chat/session.py) ----
    def draft(self):
        """What is being written now: its text and the documents staged."""
        from .session import Draft

        return Draft(self.input.toPlainText(), list(self.attachments.docs))

    def show_draft(self, draft) -> list[str]:
        """Show a chat's draft: its text (the cursor at its end, the focus here), its staged documents,
        and its files to attach again (an edited message's). Returns the files no longer there."""
        from pathlib import Path

        from PySide6.QtGui import QTextCursor

        self.input.setPlainText(draft.text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.attachments.clear()
        for doc in draft.docs:
            self.attachments.add(doc)
        gone = [p for p in draft.paths if not Path(p).is_file()]
        for p in draft.paths:
            if p not in gone:
                self.attachments.attach(p)
        self.input.setFocus()
        return gone

    def set_editing(self, editing: bool) -> None:
        """While the last message is being edited, Edit last reads Cancel edit."""
        self.edit_btn.setText("Cancel edit" if editing else "Edit last")
        self.edit_btn.setToolTip("Keep the message as it was" if editing else
                                 "Edit your last message: it and its reply are replaced when you send")
