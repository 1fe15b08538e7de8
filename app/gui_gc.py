"""Python's cyclic garbage collector, run on the GUI thread only.

A collection destroys every unreachable object on the thread that runs it. Garbage in reference
cycles often holds PySide objects (a closed dialog, a widget's lambda that names the widget), and a
Qt object destroyed off the GUI thread races the GUI thread inside Qt: a collection on the engine
thread (the explicit one as a model is unloaded, or any automatic one, triggered by whichever thread
happens to allocate) crashed the test run once with a segfault while the GUI thread was in Qt's
event loop. So, while a window's engine bridge is alive:

- automatic collection is off (`gc.disable()`), and a timer on the GUI thread does its work, by the
  same thresholds (`gc.get_threshold()`), every CHECK_MS (the PyQt "collector on the GUI thread"
  recipe);
- the engine's own collection (a model unloaded: engine/runtime/session.py) is asked of the GUI thread and
  waited for, at most WAIT_S: the GUI thread may be busy, and a model's memory is freed by reference
  counts anyway; a collection is what frees the rest (cycles) before the next model is read.

Installed per bridge and counted: when the last one shuts down, the collector is given back to
Python (collecting once here first), so code without an event loop (the CLI, tests after a window's)
is never left without collection.
"""
from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, QTimer, Signal

CHECK_MS = 500
WAIT_S = 5.0


class _GuiCollector(QObject):
    asked = Signal()

    def __init__(self):
        super().__init__()
        self.users = 0
        self.waiting: list[threading.Event] = []
        self.lock = threading.Lock()
        self.timer = QTimer(self, interval=CHECK_MS)
        self.timer.timeout.connect(self.check)
        self.asked.connect(self.answer, Qt.ConnectionType.QueuedConnection)

    def check(self) -> None:
        """What automatic collection would have done since the last check."""
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if t0 and c0 > t0:
            gc.collect(2 if (c1 > t1 and c2 > t2) else 1 if c1 > t1 else 0)

    def answer(self) -> None:
        """The threads' requests (queued on the GUI thread): one collection for all of them."""
        self.release_waiters(collect_first=True)

    def release_waiters(self, collect_first: bool = False) -> None:
        with self.lock:
            waiting, self.waiting = self.waiting, []
        if waiting and collect_first:
            gc.collect()
        for ev in waiting:
            ev.set()


_collector: _GuiCollector | None = None


def install() -> None:
    """On the GUI thread, once per engine bridge."""
    global _collector
    if _collector is None:
        _collector = _GuiCollector()
    _collector.users += 1
    if _collector.users == 1:
        gc.disable()
        _collector.timer.start()


def uninstall() -> None:
    """On the GUI thread, as a bridge shuts down: the last one hands collection back to Python."""
    c = _collector
    if c is None or c.users == 0:
        return
    c.users -= 1
    c.release_waiters()
    if c.users == 0:
        c.timer.stop()
        gc.collect()
        gc.enable()


def release_waiters() -> None:
    """Let every thread waiting for a collection go on without it (the GUI thread is about to
    wait for them: a bridge shutting down)."""
    if _collector is not None:
        _collector.release_waiters()


def collect() -> None:
    """A full collection, from any thread: done here on the GUI thread, else asked of it and waited
    for (at most WAIT_S). Without an installed collector (no window), done where it is called."""
    c = _collector
    if c is None or c.users == 0:
        gc.collect()
        return
    app = QCoreApplication.instance()
    if app is None or QThread.currentThread() is app.thread():
        gc.collect()
        return
    ev = threading.Event()
    with c.lock:
        c.waiting.append(ev)
    c.asked.emit()
    ev.wait(WAIT_S)


def active() -> bool:
    """Whether collection is now the GUI thread's (for tests and the log)."""
    return _collector is not None and _collector.users > 0 and not gc.isenabled()


def reset() -> int:
    """Give collection back to Python whatever bridges are still counted (a test's window never
    closed); how many were. For the tests' teardown."""
    c = _collector
    left = c.users if c is not None else 0
    if c is not None and c.users:
        c.users = 1
        uninstall()
    return left
