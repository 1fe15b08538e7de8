"""The window's modal dialogs are deleted by the GUI thread once they are done, whoever still holds a
Python reference to them.

PySide's QDialog.exec() hands the dialog's ownership to Python, so a dialog the code forgot died
with its last Python reference. tests/window_helpers.on_modal keeps the dialogs it filled in a list
inside a reference cycle (its poll() closes over itself), so that last reference was dropped by the
cyclic garbage collector on whichever thread ran it: in tests/test_menus.py, 1 run in 4-10, the
engine thread (deep-copying experts for Tools > Re-measure) destroyed File > Connect to a server's
dialog while the main thread's event loop was in Qt: "malloc_consolidate(): unaligned fastbin chunk
detected" on the engine thread inside QWidget::~QWidget, a segfault in the main thread's
QAbstractItemModel::endResetModel. app/menus.run_modal deletes each dialog from the event loop."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QObject  # noqa: E402
from PySide6.QtGui import QAction  # noqa: E402
from PySide6.QtWidgets import QLabel, QMainWindow, QMessageBox, QPushButton, QWidget  # noqa: E402
from shiboken6 import Shiboken  # noqa: E402

from window_helpers import on_modal  # noqa: E402


class EngineStandIn(QObject):
    """app/engine_controller.py's side of Connect: it takes a RemoteChat's events (and parents it)."""
    remote_active = False

    def listen(self, source) -> None:
        pass


class StandIn(QMainWindow):
    """What the dialogs' openers use of MainWindow, without a model behind it."""

    def __init__(self):
        super().__init__()
        self.generating, self.remote, self.lines, self.model_info, self.loading = False, None, [], None, False
        self.slider, self.model_label, self.send_btn = QWidget(self), QLabel(self), QPushButton(self)
        self.composer = SimpleNamespace(send_btn=self.send_btn)
        self.panel = SimpleNamespace(placement_box=QWidget(self), mode=QLabel(self))
        self.engine = EngineStandIn(self)
        self.server_action = QAction(self)
        self.server_action.setCheckable(True)
        self.log_lines = ["12:00:00 loaded tiny"]

    def on_events(self, events) -> None:
        pass

    def stop(self) -> None:
        pass

    def log_line(self, line: str) -> None:
        self.lines.append(line)


def opened_and_deleted(qtbot, open_it, fill):
    """open_it() with its dialog filled by fill(dialog) from a timer (on_modal keeps the dialog);
    the dialog must then be deleted by the event loop, not left to that reference."""
    seen = on_modal(fill)
    result = open_it()
    assert seen, "no dialog opened"
    qtbot.waitUntil(lambda: not Shiboken.isValid(seen[0]), timeout=3_000)
    return result


@pytest.fixture
def w(qtbot):
    w = StandIn()
    qtbot.addWidget(w)
    return w


def test_connect_dialog_is_deleted_accepted_or_cancelled(qtbot, w):
    from app.chat import remote
    from app.window_wiring import WindowWiring

    parts = WindowWiring.remote_parts_of(w)  # what MainWindow hands app/chat/remote.py
    def fill(d):
        d.url.setText("http://127.0.0.1:9/v1")
        d.models.setEditText("some-model")
        d.accept()
    assert opened_and_deleted(qtbot, lambda: remote.connect(parts), fill)
    assert w.remote.model == "some-model" and w.remote.base == "http://127.0.0.1:9/v1"  # read before deletion
    assert not opened_and_deleted(qtbot, lambda: remote.connect(parts), lambda d: d.reject())


def test_server_dialog_is_deleted(qtbot, w):
    from app.main_window import MainWindow

    opened_and_deleted(qtbot, lambda: MainWindow.toggle_server(w, True), lambda d: d.reject())
    assert not w.server_action.isChecked()


def test_log_box_is_deleted(qtbot, w):
    from app import menus

    texts = []
    opened_and_deleted(qtbot, lambda: menus.show_log(w.log_lines, w), lambda d: (texts.append(d.text()), d.accept()))
    assert texts == ["12:00:00 loaded tiny"]
    from app.dialogs.log_view import LogView

    assert not any(isinstance(c, (QMessageBox, LogView)) for c in w.children())
