"""What a reply waits for before its first word. A model's first start calibrates it in the
background, between requests, a step at a time; a step cannot be interrupted, and the first ones
(timing the dense layers, the reference pass) took 17-21 s on a busy machine, while the window
said nothing and the reply's stats then read "prefill 1.08 s". Now, while a reply has no token
and a calibration runs, the status line says what it waits for and for how long so far, and the
reply's stats say how long it waited."""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer

SAY_AFTER_S = 0.5  # a reply that starts within this says nothing


class ReplyWait(QObject):
    def __init__(self, status_bar, parent=None):
        super().__init__(parent)
        self.bar = status_bar
        self.calibrating = False  # a background calibration runs (the engine's Progress events)
        self.what = ""  # its step, as the engine last named it
        self.since: float | None = None  # the reply waiting for its first token, since then
        self.waited_s = 0.0  # how long the last reply waited while a calibration ran
        self.message = ""
        self._timer = QTimer(self, interval=250)
        self._timer.timeout.connect(self._tick)

    def calibration(self, running: bool, what: str = "") -> None:
        """From the engine's events: a calibration step started (running) or the calibration ended."""
        self.calibrating = running
        if what:
            self.what = what
        if not running:
            self._tick()

    def reply_started(self) -> None:
        self.since = time.monotonic()
        self.waited_s = 0.0
        self._timer.start()

    def reply_streaming(self) -> None:
        """Its first token came (or it ended): nothing to wait for any more."""
        if self.since is None:
            return
        self._tick()
        self.since = None
        self._timer.stop()
        self._clear()

    def stats_note(self) -> str:
        """For the reply's stats line: the wait, when there was one to speak of."""
        return f" · waited {self.waited_s:.0f} s for the calibration step" if self.waited_s >= 1 else ""

    def _tick(self) -> None:
        if self.since is None:
            return
        waited = time.monotonic() - self.since
        if not self.calibrating or waited < SAY_AFTER_S:
            self._clear()
            return
        self.waited_s = waited
        step = f": {self.what}" if self.what else ""
        self.message = (f"Measuring this machine and the model (calibration{step}): your reply starts when the "
                        f"step in progress ends — waiting {waited:.0f} s so far")
        self.bar.showMessage(self.message)

    def _clear(self) -> None:
        if self.message and self.bar.currentMessage() == self.message:
            self.bar.clearMessage()
        self.message = ""
