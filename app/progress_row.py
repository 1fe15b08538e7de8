"""The status bar's progress row: loading, downloading, building the demo, and the background
calibration (the chat goes on meanwhile), with Cancel where the engine can stop it. It follows the
engine controller (app/engine_controller.py); `loading()` says whether a model is being opened (a
calibration during a load is part of the load, not "in the background").

The row shares the status bar with the status line (QStatusBar draws a message left of its
permanent widgets): while a message shows, the bar narrows to leave it the room it needs (down to
MIN_WIDTH), its text elided rather than cut (app/elided_bar.py); with none, it widens again."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QPushButton, QSizeGrip, QStatusBar, QWidget

from .elided_bar import ElidedBar

MIN_WIDTH, MAX_WIDTH = 180, 560  # px of the bar
GAPS = 40  # px the status bar keeps around its message and between its widgets, with room to spare
STAGES = {"load": "Loading the model", "build demo": "Building the demo model", "calibrate": "Measuring the model",
          "machine": "Measuring this machine (once, about 20 s)"}


def label(stage: str, what: str, background: bool) -> str:
    """What a Progress event's bar says, in plain words."""
    if stage == "download":
        return f"Downloading {what.split(':')[0]} ({{done}}/{{total}} files)"
    if stage == "calibrate" and background:
        return "Measuring this machine and the model in the background (you can chat meanwhile)"
    return STAGES.get(stage, stage.capitalize())


class StatusBar(QStatusBar):
    """The window's status bar, saying when its room changed (resized, or a widget beside the message
    shown or hidden). Not an event filter on it: a filter (a Python QObject that outlives the bar's
    own destructor, as its child) is still called while the bar is being destroyed, and reading the
    bar's message then reads freed memory. A virtual override is not called once destruction began."""
    relaid = Signal()

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self.relaid.emit()

    def event(self, e) -> bool:
        done = super().event(e)
        if e.type() == QEvent.LayoutRequest:
            self.relaid.emit()
        return done


class ProgressRow(QObject):
    def __init__(self, status_bar: StatusBar, stop: Callable[[], object], loading: Callable[[], bool]):
        super().__init__(status_bar)
        self.status = status_bar
        self.bar = ElidedBar(minimumWidth=MIN_WIDTH, maximumWidth=MAX_WIDTH)
        self.bar.hide()
        self.cancel = QPushButton("Cancel")
        self.cancel.setToolTip("Stop the download or the measurement (a measurement stopped plans from assumed figures)")
        self.cancel.hide()
        self.cancel.clicked.connect(lambda: stop())
        self.loading = loading
        status_bar.addPermanentWidget(self.bar)
        status_bar.addPermanentWidget(self.cancel)
        status_bar.messageChanged.connect(self.fit)  # bound methods: let go of when this row is deleted
        status_bar.relaid.connect(self.fit)

    def fit(self, _message: str = "") -> None:
        """The bar as wide as the status line's message leaves it (MIN_WIDTH..MAX_WIDTH)."""
        message = self.status.currentMessage()
        width = MAX_WIDTH
        if message:
            beside = sum(c.sizeHint().width() + GAPS // 4 for c in self.status.findChildren(
                QWidget, options=Qt.FindDirectChildrenOnly)
                if c.isVisible() and c is not self.bar and not isinstance(c, QSizeGrip))
            room = self.status.width() - self.status.fontMetrics().horizontalAdvance(message) - beside - GAPS
            width = max(MIN_WIDTH, min(MAX_WIDTH, room))
        if self.bar.maximumWidth() != width:
            self.bar.setMaximumWidth(width)

    def follow(self, engine) -> None:
        engine.progress.connect(self.show_progress)
        engine.loaded.connect(lambda _ev: self.hide())
        engine.error.connect(lambda ev: ev.message.startswith("calibrat") and self.hide())

    def show_progress(self, ev) -> None:
        self.bar.show()
        self.cancel.setVisible(ev.stage in ("calibrate", "download"))
        self.bar.setRange(0, max(ev.total, 0))  # a total of 0: busy, no share known
        self.bar.setValue(ev.done)
        text = label(ev.stage, ev.what, background=not self.loading()).format(done=ev.done, total=ev.total)
        self.bar.setFormat(text + (": %p%" if ev.total else "…"))
        self.bar.setToolTip(text + (f"\n{ev.stage}: {ev.what}" if ev.what else ""))  # the whole text, when elided
        self.fit()

    def hide(self) -> None:
        self.bar.hide()
        self.cancel.hide()
