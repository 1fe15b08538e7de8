"""The GUI's only door to the engine: commands go into the engine thread's queue; its events are
collected on the engine thread and handed to the GUI thread in batches every 30 ms, as a Qt
signal. No widget is touched off the GUI thread, and a fast model cannot flood the event loop
with one cross-thread call per token."""
from __future__ import annotations

import sys
from collections import deque

from PySide6.QtCore import QObject, QTimer, Signal

from engine.runtime.session import Session

from . import gui_gc

BATCH_MS = 30
SWITCH_INTERVAL_S = 0.0005


class EngineBridge(QObject):
    events = Signal(list)  # a batch of engine events, oldest first

    def __init__(self, session_kwargs: dict | None = None, parent=None):
        super().__init__(parent)
        # A thread waiting for the GIL gets it after the switch interval (5 ms by default); every
        # return from Qt into Python on the GUI thread may wait that long behind the engine
        # thread's Python code. A shorter interval keeps the window responsive (measured in tests).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._pending: deque = deque()  # appended on the engine thread, drained on the GUI thread
        self._timer = QTimer(self, interval=BATCH_MS)
        self._timer.timeout.connect(self._drain)
        self._timer.start()
        self._kwargs = dict(session_kwargs or {})
        gui_gc.install()  # cyclic garbage (Qt objects among it) collected on the GUI thread only
        self._gc_installed, self._closing = True, False
        self.session = self._new_session()

    def _new_session(self) -> Session:
        """An engine thread whose events reach the window while it is the bridge's: after a
        restart, what the old one still sends (its ids count from 1 as the new one's do) is dropped."""
        def emit(ev) -> None:
            if self.session is session:
                self._pending.append(ev)
        self.session = session = Session(emit, collect=self._collect, **self._kwargs)
        return session.start()

    def _collect(self) -> None:
        """The engine's collection (a model unloaded), on the GUI thread; none while the bridge shuts
        down: the GUI thread then waits for the engine, and collects itself once it has ended."""
        if not self._closing:
            gui_gc.collect()

    def _drain(self) -> None:
        # One signal per batch, not per event: each crossing into Qt and back costs a GIL
        # hand-over, which under a busy engine thread can take milliseconds.
        batch = []
        while self._pending:
            batch.append(self._pending.popleft())
        if batch:
            self.events.emit(batch)

    def send(self, cmd) -> int | None:
        """Queue a command (thread-safe); the request id of a Load, Generate or Query, whose own
        events come back with the rest of the session's."""
        return self.session.submit(cmd)

    def restart(self) -> None:
        """A new engine thread, after the old one stopped (it should never need this)."""
        self._closing = True
        gui_gc.release_waiters()
        self.session.shutdown(timeout=2.0)
        self._closing = False
        self._new_session()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the engine thread and its helpers. They are waited for past `timeout` too, however
        long the step in progress takes (a calibration step took 20 s on a busy machine): a thread
        left inside torch aborts the process when the interpreter exits (engine/runtime/client.py
        end_session). True if the engine ended within `timeout`."""
        from engine.runtime.client import end_session

        self._closing = True
        gui_gc.release_waiters()  # an engine waiting for the GUI thread to collect goes on
        ok = self.session.shutdown(timeout)
        end_session(self.session)
        self._timer.stop()
        self._drain()
        if self._gc_installed:
            self._gc_installed = False
            gui_gc.uninstall()
        return ok
