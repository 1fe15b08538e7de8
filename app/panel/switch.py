"""View > Show live panel (Ctrl+Shift+P): the live panel shown, or hidden so the chat gets its room.
The splitter's handle dragged to the window's edge collapses it too, and the action then says it is
hidden; shown again from the menu (or a start that remembers it shown), it comes back at a usable
width, not as the collapsed sliver. app/window_state.py remembers the choice across starts."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QKeySequence

SHORTCUT = "Ctrl+Shift+P"
SHARE = 0.26  # of the splitter's width, what the panel comes back at (never under its minimum)


class PanelSwitch(QObject):
    changed = Signal(bool)  # shown or hidden by the user (the menu, its shortcut, the splitter's handle)

    def __init__(self, splitter, panel, parent):
        super().__init__(parent)
        self.splitter, self.panel = splitter, panel
        self.kept_width = 0  # px the panel had when it was hidden (shown again, it comes back so)
        self.action = QAction("Show live panel", parent, checkable=True, checked=True)
        self.action.setShortcut(QKeySequence(SHORTCUT))
        self.action.setToolTip("The live panel: memory, speed, and where the model's experts are")
        self.action.toggled.connect(self._toggled)
        splitter.setCollapsible(splitter.indexOf(panel), True)
        splitter.splitterMoved.connect(self._moved)

    @property
    def shown(self) -> bool:
        return self.action.isChecked()

    def show(self, on: bool) -> None:
        """Shown or hidden from code (a start restoring it): said by the action, not announced."""
        self.action.blockSignals(True)
        self.action.setChecked(on)
        self.action.blockSignals(False)
        self._apply(on)

    def _toggled(self, on: bool) -> None:
        self._apply(on)
        self.changed.emit(on)

    def _apply(self, on: bool) -> None:
        if not on:
            self._give_away()
        self.panel.setVisible(on)
        if on:
            self._widen()

    def _centre(self, i: int) -> int:
        return 1 if i != 1 else 0

    def _give_away(self) -> None:
        """Hidden, the panel's width goes to the chat's column (not shared with the sidebar)."""
        i = self.splitter.indexOf(self.panel)
        sizes = self.splitter.sizes()
        if sizes[i]:
            self.kept_width = sizes[i]
            sizes[self._centre(i)] += sizes[i]
            sizes[i] = 0
            self.splitter.setSizes(sizes)

    def _widen(self) -> None:
        """A panel hidden comes back as wide as it was; one collapsed by the handle (or saved so) at
        SHARE of the width; the room is taken from the chat's column (the splitter keeps each
        column at its minimum)."""
        i = self.splitter.indexOf(self.panel)
        sizes = self.splitter.sizes()
        least = self.panel.minimumSizeHint().width()
        if sizes[i] >= least:
            return
        want = max(least, min(self.kept_width, sum(sizes) // 2) or int(sum(sizes) * SHARE))
        sizes[self._centre(i)] -= want - sizes[i]
        sizes[i] = want
        self.splitter.setSizes(sizes)

    def _moved(self, _pos: int, _index: int) -> None:
        collapsed = self.splitter.sizes()[self.splitter.indexOf(self.panel)] == 0
        if collapsed == self.action.isChecked():
            self.action.setChecked(not collapsed)
