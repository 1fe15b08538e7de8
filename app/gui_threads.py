"""Threads the window starts for slow work (a hub search, a download, a remote reply), whose last
reference to what they were given is let go on the GUI thread.

A worker's function usually holds a Qt object (the QObject it reports through, by its signals). If
the window let go of that object meanwhile (a dialog closed while its search ran), the worker's
reference is the last one, and dropping it destroys the Qt object on the worker thread, while the
GUI thread may be delivering that object's queued signals: Qt forbids deleting a QObject from a
thread other than its own, and the test run crashed with a segfault in the GUI thread's event loop
(a model browser's threads outliving their dialog). So `start` keeps the function (and so what it
holds) in a table on the GUI thread; the worker drops its own references first, then asks the GUI
thread, through a relay that is never destroyed, to drop the table's.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal

log = logging.getLogger(__name__)


class _Relay(QObject):
    release = Signal(int)

    def __init__(self):
        super().__init__()
        self.held: dict[int, Callable] = {}
        self.release.connect(self._release, Qt.ConnectionType.QueuedConnection)

    def _release(self, key: int) -> None:
        self.held.pop(key, None)  # may be the last reference: on the GUI thread, as it must be


_relay: _Relay | None = None
_keys = itertools.count(1)


def start(fn: Callable[[], object], name: str) -> threading.Thread:
    """Run fn() on a daemon thread (call on the GUI thread). An exception fn lets out is logged:
    report failures through the owner's signals inside fn."""
    global _relay
    if _relay is None:
        _relay = _Relay()  # on the GUI thread, the first time; kept for the process's life
    relay, key = _relay, next(_keys)
    relay.held[key] = fn
    box = [fn]
    del fn

    def run() -> None:
        f = box.pop()
        try:
            f()
        except BaseException:  # noqa: BLE001 - logged; its traceback (holding f's frames) dropped here
            log.exception("a worker thread failed")
        finally:
            del f
            relay.release.emit(key)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def held() -> int:
    """How many workers' functions the GUI thread still holds (for tests)."""
    return len(_relay.held) if _relay is not None else 0
