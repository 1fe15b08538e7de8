"""A worker thread's last reference to a Qt object is let go on the GUI thread (app/gui_threads.py):
a model browser's search thread outliving its dialog destroyed the dialog's QObject on the worker
thread while the GUI thread delivered its queued signals, and the test run crashed."""
import threading

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QObject, Signal  # noqa: E402

from app import gui_threads  # noqa: E402


class Owner(QObject):
    """What a worker reports through (as the model browser's Jobs), noting where it is destroyed."""
    done = Signal(int)

    def __init__(self, died_on: list):
        super().__init__()
        self._note = lambda: died_on.append(threading.current_thread().name)

    def __del__(self):
        self._note()


def work_for(owner: Owner, go: threading.Event, result: int):
    def work():
        go.wait(10)
        owner.done.emit(result)
    return work


def test_a_worker_outliving_its_owner_lets_it_go_on_the_gui_thread(qtbot):
    died_on, got = [], []
    for i in range(20):
        go = threading.Event()
        owner = Owner(died_on)
        owner.done.connect(got.append)
        gui_threads.start(work_for(owner, go, i), "test-worker")
        del owner  # the window lets go (a dialog closed) while the work runs: the worker holds the last reference
        go.set()
    qtbot.waitUntil(lambda: len(died_on) == 20 and gui_threads.held() == 0, timeout=10_000)
    assert set(died_on) == {threading.main_thread().name}, died_on


def test_a_worker_that_raises_is_logged_and_still_lets_go(qtbot, caplog):
    def broken():
        raise ValueError("bad input")
    gui_threads.start(broken, "test-worker").join(5)
    qtbot.waitUntil(lambda: gui_threads.held() == 0, timeout=5_000)
    assert "a worker thread failed" in caplog.text and "bad input" in caplog.text
