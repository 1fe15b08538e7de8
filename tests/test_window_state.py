"""What the window remembers across starts, its keys, and the sidebar and context glitches issue
29 found, through the real window as a user reaches it: the slider dragged, menu items' shortcuts
pressed, chats clicked in the sidebar, the search field typed into and cleared."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.store.chat_store import Store
from window_helpers import menu_actions


def start(qtbot, tiny, folder) -> MainWindow:
    w = MainWindow(Store(folder / "chats.sqlite3"), model=str(tiny), session_kwargs={"poll_s": 0.1},
                   device="cpu", dtype="fp32")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    return w


@pytest.fixture
def window(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = start(qtbot, tiny, tmp_path)
    yield w
    w.close()


def click_chat(qtbot, w, cid) -> None:
    lst = w.sidebar.list
    row = next(i for i in range(lst.count()) if lst.item(i).data(Qt.UserRole) == cid)
    rect = lst.visualItemRect(lst.item(row))
    qtbot.mouseClick(lst.viewport(), Qt.LeftButton, pos=rect.center())


def highlighted(w) -> list[int]:
    return [it.data(Qt.UserRole) for it in w.sidebar.list.selectedItems()]


def test_slider_geometry_and_last_chat_are_remembered_across_starts(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = start(qtbot, tiny, tmp_path)
    store = w.store
    a = store.new_conversation("first chat")
    store.add_message(a, "user", "hello from the first chat")
    b = store.new_conversation("second chat")
    store.add_message(b, "user", "hello from the second chat")
    w.refresh_conversations()
    click_chat(qtbot, w, a)
    assert w.cid == a
    w.slider.slider.setValue(23)  # as a drag ends
    qtbot.waitUntil(lambda: abs(w.bridge.session.controller.slider - 0.23) < 1e-9, timeout=10_000)
    first = w.size()
    # the offscreen screen is 800 px wide, less than the window's width: restoreGeometry keeps a
    # window on its screen, 2 px narrower than it (Qt: an exact fit would be full screen), so the
    # height is what this test can vary
    w.resize(first.width(), first.height() - 40)
    qtbot.waitUntil(lambda: w.size() != first, timeout=5_000)
    fits = max(w.screen().availableGeometry().width() - 2, w.minimumSizeHint().width())
    size = (min(w.width(), fits), w.height())
    w.close()

    w2 = start(qtbot, tiny, tmp_path)
    assert w2.slider.value() == 0.23
    qtbot.waitUntil(lambda: abs(w2.bridge.session.controller.slider - 0.23) < 1e-9, timeout=10_000)
    assert (w2.width(), w2.height()) == size
    assert w2.cid == a and highlighted(w2) == [a]
    assert [m.content for m in w2.store.messages(w2.cid)] == ["hello from the first chat"]
    w2.close()


def test_quit_find_and_the_menus_show_their_shortcuts(qtbot, window):
    acts = menu_actions(window)
    shown = {path: a.shortcut().toString() for path, a in acts.items() if not a.shortcut().isEmpty()}
    assert shown["File/Quit"] == "Ctrl+Q"
    assert shown["File/New chat"] == "Ctrl+N" and shown["File/Open model…"] == "Ctrl+O"
    assert shown["Edit/Find chats"] == "Ctrl+F"
    assert shown["Chat/Send"] == "Ctrl+Return" and shown["Chat/Stop the reply"] == "Esc"
    assert shown["Edit/Paste files as attachments"] == "Ctrl+Shift+V"
    window.activateWindow()
    window.input.setFocus()
    qtbot.keyClick(window.input, Qt.Key_F, Qt.ControlModifier)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.search, timeout=5_000)
    qtbot.keyClick(window.search, Qt.Key_Q, Qt.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=30_000)


def test_clearing_the_search_highlights_the_chat_that_is_shown(qtbot, window):
    store = window.store
    ids = [store.new_conversation(t) for t in ("apples", "bananas", "cherries")]
    window.refresh_conversations()
    click_chat(qtbot, window, ids[0])
    qtbot.keyClicks(window.search, "banan")
    assert [window.sidebar.list.item(i).text() for i in range(window.sidebar.list.count())] == ["bananas"]
    click_chat(qtbot, window, ids[1])
    assert window.cid == ids[1]
    window.search.clear()  # the field's clear button
    assert highlighted(window) == [ids[1]] and window.sidebar.list.currentItem().data(Qt.UserRole) == ids[1]


def test_a_long_title_is_elided_not_scrolled_sideways(qtbot, window):
    title = "A very long chat title that goes on " * 8
    cid = window.store.new_conversation(title)
    window.refresh_conversations()
    qtbot.wait(50)
    lst = window.sidebar.list
    assert lst.horizontalScrollBar().maximum() == 0 or not lst.horizontalScrollBar().isVisible()
    item = next(lst.item(i) for i in range(lst.count()) if lst.item(i).data(Qt.UserRole) == cid)
    assert item.toolTip() == title


def test_the_context_counter_is_the_chat_shown(qtbot, window):
    from main_window_helpers import send

    send(qtbot, window, "hello there", 6)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    first, figure = window.cid, window.context_label.text()
    assert figure.startswith("context ")
    qtbot.keyClick(window.input, Qt.Key_N, Qt.ControlModifier)  # File > New chat
    assert window.cid != first and window.context_label.text() == ""
    click_chat(qtbot, window, first)
    assert window.context_label.text() == figure


def test_the_gpu_runtime_dialog_speaks_plainly_on_a_machine_without_nvidia(qtbot, window, monkeypatch):
    """This machine kind has no NVIDIA driver: the dialog says so without NVML or --index-url
    (the engine's words stay in the tooltips)."""
    import app.gpu_runtime as gr

    monkeypatch.delenv("MIXDESK_RUNTIME_INDEX_URL", raising=False)
    menu_actions(window)["Settings/GPU runtime…"].trigger()
    dlg = window.runtime_dialog
    qtbot.waitUntil(lambda: dlg.isVisible(), timeout=10_000)
    seen = " ".join((dlg.info.text(), dlg.index.placeholderText()))
    assert "no NVIDIA GPU found" in seen
    assert "NVML" not in seen and "--index-url" not in seen, seen
    assert isinstance(dlg, gr.RuntimeDialog)
    dlg.close()
