"""Shared by several test modules (moved out of tests/test_chat_settings.py, which uses them too): click, open_settings, record_generates, select_chat, type_into."""
import pytest
pytest.importorskip("PySide6")
from PySide6.QtCore import Qt
from app.dialogs import chat_settings as csd
from engine.protocol import Generate
from window_helpers import menu_actions, on_modal


def record_generates(w) -> list:
    """Every Generate the window sends the engine, in order (the commands still go through)."""
    sent, send = [], w.bridge.send

    def spy(cmd):
        if isinstance(cmd, Generate):
            sent.append(cmd)
        return send(cmd)
    w.bridge.send = spy
    return sent


def type_into(qtbot, box, text: str) -> None:
    """Select what a field holds and type over it, as a user does."""
    edit = box.lineEdit() if hasattr(box, "lineEdit") else box
    edit.selectAll()
    qtbot.keyClicks(edit, text)
    if hasattr(box, "interpretText"):
        box.interpretText()


def click(qtbot, button) -> None:
    assert button.isEnabled() and button.isVisibleTo(button.window()), button.text()
    qtbot.mouseClick(button, Qt.LeftButton)


def open_settings(qtbot, w, fill) -> list:
    """Chat > Chat settings… (its QAction), fill(dialog) run once it shows; the dialogs seen."""
    def safely(dlg):
        try:
            fill(dlg)
        except BaseException:
            dlg.reject()  # a failed check must not leave the dialog's exec() waiting
            raise
    seen = on_modal(safely, csd.ChatSettingsDialog)
    menu_actions(w)["Chat/Chat settings…"].trigger()
    assert seen, "Chat > Chat settings… opened no dialog"
    return seen


def select_chat(qtbot, w, cid: int) -> None:
    lst = w.conv_list
    item = next(lst.item(i) for i in range(lst.count()) if lst.item(i).data(Qt.UserRole) == cid)
    lst.scrollToItem(item)
    qtbot.mouseClick(lst.viewport(), Qt.LeftButton, pos=lst.visualItemRect(item).center())
    qtbot.waitUntil(lambda: w.cid == cid, timeout=10_000)

