"""Shared by several test modules (moved out of tests/test_app.py, which uses them too): close_and_delete, open_window, send, window."""
import pytest
pytest.importorskip("PySide6")
from PySide6.QtCore import Qt
from app.main_window import MainWindow
from app.store.chat_store import Store
from engine.runtime.generate import SamplingParams


def open_window(qtbot, tiny, tmp_path, calibrated=True, dtype="fp32", **session):
    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(tiny), session_kwargs={"poll_s": 0.1, **session},
                   device="cpu", dtype=dtype)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    if calibrated:  # the background calibration of a never-profiled model
        qtbot.waitUntil(lambda: not w.bridge.session.controller.calibrating, timeout=120_000)
    return w


@pytest.fixture
def window(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    yield w
    close_and_delete(w)


def close_and_delete(w) -> None:
    """Close the window and destroy it now, in its own test: left to pytest-qt's deleteLater, it is
    destroyed in the next test's event loop, during that test's model load, and whatever goes wrong
    in a window's destruction would then show in the wrong test."""
    from PySide6.QtCore import QCoreApplication, QEvent

    w.close()
    w.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)


def send(qtbot, w, text, max_new_tokens=24):
    w.params = SamplingParams(max_new_tokens=max_new_tokens)
    w.input.setPlainText(text)
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)

