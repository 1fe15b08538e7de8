"""The status bar's progress row: loading, downloading, building the demo, and the background
calibration (the chat goes on meanwhile), with Cancel where the engine can stop it. It follows the
engine controller (app/engine_controller.py); `loading()` says whether a model is being opened (a
calibration during a load is part of the load, not "in the background")."""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QProgressBar, QPushButton

STAGES = {"load": "Loading the model", "build demo": "Building the demo model", "calibrate": "Measuring the model",
          "machine": "Measuring this machine (once, about 20 s)"}


def label(stage: str, what: str, background: bool) -> str:
    """What a Progress event's bar says, in plain words."""
    if stage == "download":
        return f"Downloading {what.split(':')[0]} ({{done}}/{{total}} files)"
    if stage == "calibrate" and background:
        return "Measuring this machine and the model in the background (you can chat meanwhile)"
    return STAGES.get(stage, stage.capitalize())


class ProgressRow:
    def __init__(self, status_bar, stop: Callable[[], object], loading: Callable[[], bool]):
        self.bar = QProgressBar(minimumWidth=300, maximumWidth=560)
        self.bar.hide()
        self.cancel = QPushButton("Cancel")
        self.cancel.setToolTip("Stop the download or the measurement (a measurement stopped plans from assumed figures)")
        self.cancel.hide()
        self.cancel.clicked.connect(lambda: stop())
        self.loading = loading
        status_bar.addPermanentWidget(self.bar)
        status_bar.addPermanentWidget(self.cancel)

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
        self.bar.setToolTip(f"{ev.stage}: {ev.what}" if ev.what else ev.stage)

    def hide(self) -> None:
        self.bar.hide()
        self.cancel.hide()
