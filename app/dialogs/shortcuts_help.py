"""Help > Keyboard shortcuts…: every shortcut the menus hold, read when the dialog opens: the menu
actions' own (QAction.shortcuts(), in the words the menus show them in), then the message box's
keys as the caller says the composer takes them at that moment (`enter_sends`: whether Enter sends;
Ctrl+Enter always sends, through Chat > Send). It is handed the menu bar and that bool, nothing more."""
from __future__ import annotations

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractItemView, QDialog, QDialogButtonBox, QHeaderView, QTableWidget, \
    QTableWidgetItem, QVBoxLayout

SEP = " › "  # between a menu and its item: "File › New chat"


def native(keys) -> str:
    return QKeySequence(keys).toString(QKeySequence.SequenceFormat.NativeText)


def menu_shortcuts(menu_bar) -> list[tuple[str, str]]:
    """(menu path, its keys) for every action with a shortcut in menu_bar (a QMenuBar, or anything with
    actions() whose menus hold them), in menu order."""
    rows: list[tuple[str, str]] = []

    def walk(menu, path: str) -> None:
        for a in menu.actions():
            if a.isSeparator():
                continue
            name = f"{path}{SEP}{a.text().replace('&', '')}"
            if a.menu() is not None:
                walk(a.menu(), name)
            elif a.shortcuts():
                rows.append((name, ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText)
                                             for s in a.shortcuts())))
    for top in menu_bar.actions():
        if top.menu() is not None:
            walk(top.menu(), top.text().replace("&", ""))
    return rows


def composer_keys(enter_sends: bool) -> list[tuple[str, str]]:
    """The message box's keys: enter_sends, whether Enter sends a message (else it adds a line)."""
    box = f"Message box{SEP}"
    rows = ([(f"{box}Send the message", "Enter, Ctrl+Enter"), (f"{box}New line", "Shift+Enter")] if enter_sends else
            [(f"{box}Send the message", "Ctrl+Enter"), (f"{box}New line", "Enter, Shift+Enter")])
    return rows + [(f"{box}Paste (files copied in a file manager become attachments)",
                    native(QKeySequence.StandardKey.Paste))]


class ShortcutsDialog(QDialog):
    """The table of shortcuts (action, keys), read-only: menu_bar's actions', then the message box's
    (enter_sends: whether Enter sends); parent: the dialog's parent widget."""

    def __init__(self, menu_bar, enter_sends: bool, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.resize(560, 520)
        rows = menu_shortcuts(menu_bar) + composer_keys(bool(enter_sends))
        self.table = QTableWidget(len(rows), 2)
        self.table.setHorizontalHeaderLabels(["Action", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for r, (what, keys) in enumerate(rows):
            self.table.setItem(r, 0, QTableWidgetItem(what))
            self.table.setItem(r, 1, QTableWidgetItem(keys))
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addWidget(buttons)
