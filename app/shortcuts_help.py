"""Help > Keyboard shortcuts…: every shortcut the window has, read when the dialog opens: the menu
actions' own (QAction.shortcuts(), in the words the menus show them in), then the message box's
keys as the composer takes them at that moment (Enter sends only where the composer says so: its
`enter_sends`, a bool or a callable, when it has one; Ctrl+Enter always sends, through Chat > Send)."""
from __future__ import annotations

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractItemView, QDialog, QDialogButtonBox, QHeaderView, QTableWidget, \
    QTableWidgetItem, QVBoxLayout

SEP = " › "  # between a menu and its item: "File › New chat"


def native(keys) -> str:
    return QKeySequence(keys).toString(QKeySequence.SequenceFormat.NativeText)


def menu_shortcuts(window) -> list[tuple[str, str]]:
    """(menu path, its keys) for every menu action with a shortcut, in menu order."""
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
    for top in window.menuBar().actions():
        if top.menu() is not None:
            walk(top.menu(), top.text().replace("&", ""))
    return rows


def composer_keys(composer) -> list[tuple[str, str]]:
    """The message box's keys, as the composer takes them now."""
    enter_sends = getattr(composer, "enter_sends", False)
    if callable(enter_sends):
        enter_sends = enter_sends()
    box = f"Message box{SEP}"
    rows = ([(f"{box}Send the message", "Enter, Ctrl+Enter"), (f"{box}New line", "Shift+Enter")] if enter_sends else
            [(f"{box}Send the message", "Ctrl+Enter"), (f"{box}New line", "Enter, Shift+Enter")])
    return rows + [(f"{box}Paste (files copied in a file manager become attachments)",
                    native(QKeySequence.StandardKey.Paste))]


class ShortcutsDialog(QDialog):
    """The table of shortcuts (action, keys), read-only."""

    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts")
        self.resize(560, 520)
        rows = menu_shortcuts(window) + composer_keys(window.composer)
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
