"""What the window remembers across starts (QSettings, app/theme.py's): its geometry and the
column widths, whether the live panel is shown (View > Show live panel), the quality <-> speed
slider, the chat that was open, and whether Enter sends a message. Restored when the window is
built; saved as they change (the slider, the chat) and at close (the geometry), so a kill loses at
most the last resize."""
from __future__ import annotations

from PySide6.QtCore import QByteArray

from . import theme

GROUP = "window"


def _chat_key(w) -> str:
    """The open chat is remembered per chat database (another file numbers its chats its own way)."""
    import hashlib

    return "window/chat-" + hashlib.sha1(str(w.store.path.resolve()).encode()).hexdigest()[:12]


def restore(w) -> None:
    """Geometry, column widths, slider and the last chat of window w, where saved (and still there)."""
    s = theme.settings()
    geometry, split = s.value("window/geometry"), s.value("window/splitter")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        w.restoreGeometry(geometry)
    if isinstance(split, QByteArray) and not split.isEmpty():
        w.splitter.restoreState(split)
    w.panel_switch.show(_bool(s.value("window/panel"), True))  # after the widths: shown, it is never a sliver
    w.enter_sends_action.setChecked(_bool(s.value("window/enter_sends"), True))  # Settings > Enter sends message
    slider = _float(s.value("window/slider"))
    if slider is not None:
        w.slider.set_value(slider)  # its debounced signal sends SetSlider: the engine plans for it
    cid = _int(s.value(_chat_key(w)))
    if cid is not None and any(c.id == cid for c in w.store.conversations()):
        w.open_chat(cid)


def follow(w) -> None:
    """Save the slider and the open chat as they change."""
    w.slider.changed.connect(lambda v: theme.settings().setValue("window/slider", float(v)))
    w.sidebar.selected.connect(lambda cid: theme.settings().setValue(_chat_key(w), int(cid)))
    w.panel_switch.changed.connect(lambda on: theme.settings().setValue("window/panel", bool(on)))
    w.enter_sends_action.toggled.connect(lambda on: theme.settings().setValue("window/enter_sends", bool(on)))


def forget() -> None:
    """Everything the window remembered (tests start each window as on a first start)."""
    s = theme.settings()
    s.remove(GROUP)
    s.sync()


def save(w) -> None:
    s = theme.settings()
    s.setValue("window/geometry", w.saveGeometry())
    s.setValue("window/splitter", w.splitter.saveState())
    if w.cid is not None:
        s.setValue(_chat_key(w), int(w.cid))
    else:
        s.remove(_chat_key(w))
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
