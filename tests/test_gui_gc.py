"""Cyclic garbage is collected on the GUI thread while a window is open (app/gui_gc.py): a Qt object
destroyed by a collection on the engine thread (a model unloaded, or any automatic collection the
engine thread triggers) raced the GUI thread and crashed the test run once."""
import gc
import threading

import pytest

pytest.importorskip("PySide6")
from PySide6.QtWidgets import QLabel  # noqa: E402

from app import gui_gc  # noqa: E402
from engine.protocol import Load, Loaded  # noqa: E402
from engine.runtime.session import Session  # noqa: E402
from main_window_helpers import open_window  # noqa: E402


class Cycle:
    """Reference-cycle garbage holding a Qt object, as a closed dialog's slots leave behind."""

    def __init__(self, died_on: list):
        self.me = self
        self.label = QLabel("in a cycle")
        self._note = lambda: died_on.append(threading.current_thread().name)

    def __del__(self):
        self._note()


def test_qt_garbage_in_cycles_dies_on_the_gui_thread_across_model_loads(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    assert gui_gc.active() and not gc.isenabled()  # no thread but the GUI's collects automatically
    loads = []
    w.engine.loaded.connect(loads.append)
    died_on = []
    for i in range(20):
        Cycle(died_on)  # unreachable at once: only a collection frees it
        # Load goes straight to the engine thread, which unloads (and collects) before reading the model
        w.bridge.send(Load(path=str(tiny), device="cpu", dtype="fp32"))
        qtbot.waitUntil(lambda: len(loads) > i, timeout=60_000)
    qtbot.waitUntil(lambda: len(died_on) == 20, timeout=10_000)
    assert set(died_on) == {threading.main_thread().name}, died_on
    w.close()
    assert gc.isenabled() and not gui_gc.active()  # the last window hands collection back


def test_the_engine_collects_through_the_hook_it_is_given(tiny, window_cache):
    collected, ready = [], threading.Event()

    def emit(ev):
        if isinstance(ev, Loaded) or type(ev).__name__ == "ErrorEvent":
            ready.set()

    s = Session(emit, poll_s=0.1, collect=lambda: collected.append(threading.current_thread().name)).start()
    try:
        s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
        assert ready.wait(120)
        ready.clear()
        s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
        assert ready.wait(120)
    finally:
        s.shutdown()
    assert collected and set(collected) == {"mixdesk-engine"}


def test_a_collection_asked_from_another_thread_runs_on_the_gui_thread(qtbot):
    gui_gc.install()
    try:
        died_on, asked = [], threading.Event()
        Cycle(died_on)

        def engine_like():
            gui_gc.collect()
            asked.set()

        threading.Thread(target=engine_like).start()
        qtbot.waitUntil(asked.is_set, timeout=10_000)  # the GUI thread's event loop answers it
        assert died_on == [threading.main_thread().name]
    finally:
        gui_gc.uninstall()
    assert gc.isenabled()
