"""Reaching the window as a user does: its menu actions by their path ("File/Connect to a server…"),
modal dialogs filled from a timer (the code that opened them waits in exec()), and every exception
that reaches sys.excepthook recorded, so that a handler failing inside a Qt slot fails the test."""
from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication


def menu_actions(window) -> dict:
    """Every action of the menu bar, submenus included, by path: "Settings/Theme/Dark"."""
    found = {}

    def walk(menu, path):
        for a in menu.actions():
            if a.isSeparator():
                continue
            name = f"{path}/{a.text().replace('&', '')}"
            if a.menu() is not None:
                walk(a.menu(), name)
            else:
                found[name] = a

    for top in window.menuBar().actions():
        walk(top.menu(), top.text().replace("&", ""))
    return found


def on_modal(fn, kind=None, timeout_ms: int = 30_000) -> list:
    """fn(dialog) for the next modal dialog (of class kind, if given), from the event loop; the
    dialogs handled are appended to the list returned."""
    seen, waited = [], [0]

    def poll():
        d = QApplication.activeModalWidget()
        if d is None or (kind is not None and not isinstance(d, kind)):
            waited[0] += 20
            if waited[0] < timeout_ms:
                QTimer.singleShot(20, poll)
            return
        seen.append(d)
        fn(d)
    QTimer.singleShot(20, poll)
    return seen


@contextmanager
def no_uncaught_exceptions():
    """Records every exception that reaches sys.excepthook (a Qt slot's, a timer's) and fails with
    their tracebacks at the end."""
    errors = []
    before = sys.excepthook
    sys.excepthook = lambda t, e, tb: errors.append("".join(traceback.format_exception(t, e, tb)))
    try:
        yield errors
    finally:
        sys.excepthook = before
    assert not errors, "\n".join(errors)
