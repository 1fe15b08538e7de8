"""What the window remembers across starts (QSettings, app/theme.py's): its geometry and the
column widths, whether the live panel is shown (View > Show live panel), the quality <-> speed
slider, the chat that was open, and whether Enter sends a message. Restored when the window is
built; saved as they change (the slider, the chat) and at close (the geometry), so a kill loses at
most the last resize."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QByteArray

from . import theme

GROUP = "window"


def _chat_key(store_path) -> str:
    """The open chat is remembered per chat database, at store_path (another file numbers its chats its own way)."""
    import hashlib

    return "window/chat-" + hashlib.sha1(str(Path(store_path).resolve()).encode()).hexdigest()[:12]


def restore(top, splitter, panel_switch, enter_sends, slider, store, open_chat: Callable[[int], object]) -> None:
    """Geometry (of top, the top-level widget), column widths (splitter), whether the live panel is
    shown (panel_switch), Enter sends (enter_sends: Settings > Enter sends message, a checkable
    QAction), the slider, and the last chat of store (open_chat(cid) opens it), where saved (and still there)."""
    s = theme.settings()
    geometry, split = s.value("window/geometry"), s.value("window/splitter")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        top.restoreGeometry(geometry)
    if isinstance(split, QByteArray) and not split.isEmpty():
        splitter.restoreState(split)
    panel_switch.show(_bool(s.value("window/panel"), True))  # after the widths: shown, it is never a sliver
    enter_sends.setChecked(_bool(s.value("window/enter_sends"), True))  # Settings > Enter sends message
    value = _float(s.value("window/slider"))
    if value is not None:
        slider.set_value(value)  # its debounced signal sends SetSlider: the engine plans for it
    cid = _int(s.value(_chat_key(store.path)))
    if cid is not None and any(c.id == cid for c in store.conversations()):
        open_chat(cid)


def follow(slider, chat_selected, panel_switch, enter_sends, store_path) -> None:
    """Save the slider, the open chat (chat_selected: a signal that carries the chat id picked), the
    live panel's switch and Enter sends (a checkable QAction) as they change."""
    slider.changed.connect(lambda v: theme.settings().setValue("window/slider", float(v)))
    chat_selected.connect(lambda cid: theme.settings().setValue(_chat_key(store_path), int(cid)))
    panel_switch.changed.connect(lambda on: theme.settings().setValue("window/panel", bool(on)))
    enter_sends.toggled.connect(lambda on: theme.settings().setValue("window/enter_sends", bool(on)))


def forget() -> None:
    """Everything the window remembered (tests start each window as on a first start)."""
    s = theme.settings()
    s.remove(GROUP)
    s.sync()


def save(top, splitter, store_path, cid: int | None) -> None:
    """At close: the geometry of top (the top-level widget), the column widths (splitter) and the chat
    open (cid, None: none) of the chat database at store_path."""
    s = theme.settings()
    s.setValue("window/geometry", top.saveGeometry())
    s.setValue("window/splitter", splitter.saveState())
    if cid is not None:
        s.setValue(_chat_key(store_path), int(cid))
    else:
        s.remove(_chat_key(store_path))
    s.sync()


def _float(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return min(max(f, 0.0), 1.0) if f == f else None


def _bool(v, default: bool) -> bool:
    """QSettings gives a bool back as a bool or, read from its file, as "true"/"false"."""
    if isinstance(v, bool):
        return v
    return {"true": True, "false": False}.get(str(v).lower(), default) if v is not None else default


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
