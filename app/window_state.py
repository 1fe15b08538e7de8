"""What the window remembers across starts (QSettings, app/theme.py's): its geometry and the
column widths, the quality <-> speed slider, and the chat that was open. Restored when the window is
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


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
