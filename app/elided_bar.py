"""A progress bar whose text, when the bar is too narrow for it, is elided rather than cut off at
both ends: the words give way ("Measuring this machine and t…: 45%"), the figure after the last
": " stays whole. format() keeps the whole text (the tooltip can say it); only what is drawn
shortens, re-measured at every paint, so a bar that is narrowed or widened reads at once."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressBar

PAD = 8  # px the style keeps around the text


class ElidedBar(QProgressBar):
    def text(self) -> str:  # virtual: QProgressBar's paint asks for it
        full = super().text()
        fm, room = self.fontMetrics(), self.width() - PAD
        if fm.horizontalAdvance(full) <= room:
            return full
        head, sep, tail = full.rpartition(": ")
        if not sep or fm.horizontalAdvance(sep + tail) >= room:
            return fm.elidedText(full, Qt.ElideRight, max(room, 0))
        tail = sep + tail
        return fm.elidedText(head, Qt.ElideRight, room - fm.horizontalAdvance(tail)) + tail
