"""The one controller between the engine and the widgets: it takes the engine's events (in batches,
on the GUI thread, from EngineBridge; and a served model's, from app/chat/remote.py) and turns each into
one typed signal. Each widget subscribes to what it shows (its `follow(engine)`), so an event is
handled once by each reader, never routed back through the window.

The reply in progress is the one request whose tokens, end and error are the chat's: the window
names it (`reply_request`); other requests' events (the local server's, a check's) are not the chat's.
Filters (ModelSwitch.on_event) see each event first and may claim it: the answer to a model check."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal

from engine.protocol import (Done, EngineStopped, ErrorEvent, Loaded, MigrationProgress, PlacementChanged, Progress,
                             PromptProgress, Stats, Token)


class EngineController(QObject):
    reply_token = Signal(object)  # Token of the reply in progress (local engine or remote server)
    reply_reading = Signal(object)  # PromptProgress of the reply in progress: its long prompt being read
    reply_done = Signal(object)  # Done of the reply in progress
    reply_failed = Signal(str)  # the reply in progress ended by an error: its message
    stats = Signal(object)  # Stats of the local engine (not while the chat goes to a remote server)
    placement_changed = Signal(object)  # PlacementChanged
    migration_progress = Signal(object)  # MigrationProgress
    progress = Signal(object)  # Progress: load, download, build demo, calibrate
    loaded = Signal(object)  # Loaded
    calibration_finished = Signal()  # the plan now uses measured figures (once per calibration)
    error = Signal(object)  # any ErrorEvent (the reply's too, after reply_failed)
    engine_stopped = Signal(object)  # EngineStopped

    def __init__(self, bridge, parent=None):
        super().__init__(parent)
        self.bridge = bridge
        self.reply_request: int | None = None  # the chat's reply in progress
        self.remote_active = False  # the chat goes to a served model: the local engine's Stats are not its
        self.filters: list[Callable[[object], bool]] = []  # may claim an event (True): no signal for it
        self.handled = 0  # events turned into signals (tests)
        bridge.events.connect(self.take)

    def listen(self, source) -> None:
        """Also take the events of another source with an `events` signal (a RemoteChat)."""
        source.events.connect(self.take)

    def take(self, batch: list) -> None:
        for ev in batch:
            self.dispatch(ev)

    def dispatch(self, ev) -> None:
        """One event: to the filters, then to its signal."""
        if any(f(ev) for f in self.filters):
            return
        self.handled += 1
        mine = self.reply_request is not None and getattr(ev, "request_id", None) == self.reply_request
        if isinstance(ev, Token):
            if mine:
                self.reply_token.emit(ev)
        elif isinstance(ev, PromptProgress):
            if mine:
                self.reply_reading.emit(ev)
        elif isinstance(ev, Done):
            if mine:
                self.reply_request = None
                self.reply_done.emit(ev)
        elif isinstance(ev, Stats):
            if not self.remote_active:
                self.stats.emit(ev)
        elif isinstance(ev, PlacementChanged):
            self.placement_changed.emit(ev)
            if ev.reason == "profile":  # planned from a profile measured just now (engine/control/controller.py)
                self.calibration_finished.emit()
        elif isinstance(ev, MigrationProgress):
            self.migration_progress.emit(ev)
        elif isinstance(ev, Progress):
            self.progress.emit(ev)
        elif isinstance(ev, Loaded):
            self.loaded.emit(ev)
        elif isinstance(ev, EngineStopped):
            if self.reply_request is not None:
                self.reply_request = None
                self.reply_failed.emit(ev.message)
            self.engine_stopped.emit(ev)
        elif isinstance(ev, ErrorEvent):
            if mine:
                self.reply_request = None
                self.reply_failed.emit(ev.message)
            self.error.emit(ev)
