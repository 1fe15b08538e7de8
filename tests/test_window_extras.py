"""What a new user found missing, reached as a user reaches it: Help > Keyboard shortcuts…, the GPU
runtime dialog on a machine without an NVIDIA GPU, when each chat was last active, and the recent
models (the one in use marked, none twice)."""
import datetime
import sqlite3

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QKeySequence  # noqa: E402
from PySide6.QtWidgets import QLabel, QTableWidget  # noqa: E402

from main_window_helpers import window  # noqa: E402,F401  (the fixture)
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402


def native(keys) -> str:
    return QKeySequence(keys).toString(QKeySequence.SequenceFormat.NativeText)


# ---- Help > Keyboard shortcuts… ----
def shortcut_rows(qtbot, w, path="Help/Keyboard shortcuts…") -> list[tuple[str, str]]:
    rows = []

    def read(d):
        table = d.findChild(QTableWidget)
        rows.extend((table.item(r, 0).text(), table.item(r, 1).text()) for r in range(table.rowCount()))
        d.accept()
    seen = on_modal(read)
    menu_actions(w)[path].trigger()
    qtbot.waitUntil(lambda: bool(seen), timeout=10_000)
    return rows


def test_help_lists_every_shortcut_of_the_window(qtbot, window):
    with no_uncaught_exceptions():
        rows = shortcut_rows(qtbot, window)
    listed = dict(rows)
    assert listed["File › New chat"] == native(QKeySequence.StandardKey.New)  # Ctrl+N, as the menu shows it
    for path, a in menu_actions(window).items():  # every menu shortcut, in the action's own words
        if a.shortcuts():
            keys = listed[path.replace("/", " › ")]
            assert all(s.toString(QKeySequence.SequenceFormat.NativeText) in keys for s in a.shortcuts()), (path, keys)
    own = menu_actions(window)["Help/Keyboard shortcuts…"].shortcuts()
    assert own and {s.toString() for s in own} <= {"Ctrl+/", "F1"}  # a shortcut of its own
    composer = [(what, keys) for what, keys in rows if what.startswith("Message box")]
    assert any("Ctrl+Return" in keys or "Ctrl+Enter" in keys for what, keys in composer if "send" in what.lower())
    assert any(keys.startswith("Enter") or "Enter" in keys.split(", ") for _, keys in composer)


# ---- Settings > GPU runtime… without an NVIDIA GPU ----
def test_the_gpu_runtime_dialog_without_nvidia_offers_no_download(qtbot, window, monkeypatch):
    """This machine kind has no NVIDIA GPU; NVML's answer is given here as tests/test_gpu_runtime_window
    gives it, so that the test says the same on a machine that has one."""
    import app.gpu_runtime
    import engine.tools.runtime.install

    for mod in (app.gpu_runtime, engine.tools.runtime.install):
        monkeypatch.setattr(mod, "find_nvidia", lambda: (None, "no NVIDIA GPU (no NVIDIA driver: NVML not found)"))
    monkeypatch.delenv("MIXDESK_RUNTIME_INDEX_URL", raising=False)
    with no_uncaught_exceptions():
        menu_actions(window)["Settings/GPU runtime…"].trigger()
        dlg = window.runtime_dialog
        qtbot.waitUntil(dlg.isVisible, timeout=10_000)
        said = " ".join(label.text() for label in dlg.findChildren(QLabel) if label.isVisible())
        assert ("No NVIDIA GPU found on this machine: Mixdesk runs on the CPU; the GPU runtime is only for "
                "NVIDIA cards") in said, said
        for b in (dlg.install_btn, dlg.check_btn):
            assert not (b.isVisible() and b.isEnabled()), b.text()  # nothing to download
        assert not dlg.index.isVisible()
        qtbot.mouseClick(dlg.close_btn, Qt.LeftButton)


# ---- the chat list: when each chat was last active ----
def test_each_chat_shows_when_it_was_last_active(qtbot, window, monkeypatch):
    from app.chat import conversation_list

    now = datetime.datetime(2026, 12, 3, 15, 30)  # a Thursday
    monkeypatch.setattr(conversation_list, "now", lambda: now.timestamp(), raising=False)  # its clock
    when = {"today": (datetime.datetime(2026, 12, 3, 14, 2), "14:02"),
            "yesterday": (datetime.datetime(2026, 12, 2, 23, 59), "Yesterday"),
            "monday": (datetime.datetime(2026, 11, 30, 9, 0), "Mon"),
            "six days": (datetime.datetime(2026, 11, 27, 8, 0), "Fri"),
            "a week": (datetime.datetime(2026, 11, 26, 8, 0), "26 Nov"),
            "january": (datetime.datetime(2026, 1, 5, 8, 0), "5 Jan"),
            "last year": (datetime.datetime(2025, 11, 30, 8, 0), "30 Nov 2025")}
    ids = {title: window.store.new_conversation(title) for title in when}
    db = sqlite3.connect(window.store.path)  # the timestamps, in the real store
    with db:
        for title, (at, _) in when.items():
            db.execute("UPDATE conversations SET updated=? WHERE id=?", (at.timestamp(), ids[title]))
    db.close()
    window.refresh_conversations()
    lst = window.sidebar.list
    role = getattr(conversation_list, "WHEN_ROLE", None)
    assert role is not None, "the chat list shows no date"
    shown = {lst.item(i).text(): lst.item(i).data(role) for i in range(lst.count())}
    assert {t: shown[t] for t in when} == {t: label for t, (_, label) in when.items()}
    assert [lst.item(i).text() for i in range(lst.count())][:len(when)] == list(when)  # newest first
    with no_uncaught_exceptions():
        assert not lst.grab().isNull()  # the delegate draws title and date


# ---- File > Open model…: recent models ----
def test_recent_models_mark_the_one_in_use_and_list_each_once(qtbot, window, tiny):
    from app import theme
    from app.dialogs.model_picker import DEMO_LABEL
    from engine.sources import demo

    settings = theme.settings()
    before = settings.value("recent_models", [])
    # what the list holds after the demo was opened by name and by its folder, and the tiny model
    # by its path with and without a trailing slash (the window has the tiny model loaded)
    settings.setValue("recent_models", [str(tiny), str(demo.demo_dir()), "demo", f"{tiny}/"])
    try:
        with no_uncaught_exceptions():
            menu_actions(window)["File/Open model…"].trigger()
            picker = window.picker
            rows = [(picker.list.item(i).text(), picker.list.item(i).data(Qt.UserRole))
                    for i in range(picker.list.count())]
            picker.reject()
        labels = [text.split("\n")[0] for text, _ in rows]
        assert sum(DEMO_LABEL in label or str(demo.demo_dir()) in label for label in labels) == 1, labels
        assert sum(str(tiny) in label for label in labels) == 1, labels
        assert len({spec for _, spec in rows}) == len(rows), rows
        in_use = [label for label in labels if "(in use)" in label]
        assert in_use == [f"{tiny}  (in use)"], labels
    finally:
        settings.setValue("recent_models", before)
