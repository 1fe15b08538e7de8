"""Help → Log: the window's log lines in a dialog that scrolls, selects and copies (a message box
cut long lines and could not scroll), newest at the bottom and in view, with Copy all."""
from __future__ import annotations

from PySide6.QtGui import QFontDatabase, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QPlainTextEdit, QPushButton, QVBoxLayout

KEEP = 2000  # the newest lines shown


class LogView(QDialog):
    def __init__(self, lines: list[str], parent=None):
        super().__init__(parent)
        self.setWindowTitle("Mixdesk log")
        self.resize(760, 420)
        lay = QVBoxLayout(self)
        self.view = QPlainTextEdit(readOnly=True)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)  # a long reason reads whole
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.view.setPlainText("\n".join(lines[-KEEP:]) or "(empty)")
        self.view.moveCursor(QTextCursor.MoveOperation.End)
        lay.addWidget(self.view)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_btn = QPushButton("Copy all")
        self.copy_btn.clicked.connect(self.copy_all)
        buttons.addButton(self.copy_btn, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)

    def text(self) -> str:
        return self.view.toPlainText()

    def copy_all(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copy_btn.setText("Copied")
