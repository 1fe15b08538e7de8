"""The model files the engine reads through read-only mappings, watched for a change on disk.

A mapped file truncated (or overwritten, or on a drive that went away) while mapped raises SIGBUS
at the next touch of a page that is no longer there: by default the end of the process, the window
with it. With the native library, its guard (engine/native/guard.c) answers a fault inside a
watched mapping with a page of zeros and counts it; `check()`, called after each step of the
engine, turns a count into a ModelError naming the file: the model is then unloaded as for any
error of its own, and the window stays. Without the native library there is no guard (said once in
the log): a truncated file then ends the process, as it does llama.cpp's.
"""
from __future__ import annotations

import logging
import threading
import weakref
from pathlib import Path

from ..protocol.errors import ModelError

log = logging.getLogger(__name__)

CHANGED = ("changed on disk while in use (truncated, overwritten or its drive gone): it was closed; "
           "open it again once it is whole")
_lock = threading.Lock()
_watched: dict[int, tuple[Path, int]] = {}  # slot -> (path, faults already reported)
_faulted: set[Path] = set()  # files that faulted since they were mapped (until forget_faults)
_said_unguarded = False


def _lib():
    from .. import native

    return native.lib() if native.available() else None


def watch(m, path: Path) -> None:
    """Watch mapping `m` (an mmap.mmap) of file `path` until it is closed or collected."""
    global _said_unguarded
    import numpy as np

    lib = _lib()
    if lib is None or len(m) == 0:
        if lib is None and not _said_unguarded:
            _said_unguarded = True
            log.warning("mapped model files are not guarded without the native library: a file truncated "
                        "while in use ends the process")
        return
    base = np.frombuffer(m, dtype=np.uint8).ctypes.data
    slot = lib.mdk_guard_add(base, len(m))
    if slot < 0:
        log.warning("%s: mapped without a guard (too many files mapped at once)", path)
        return
    with _lock:
        _watched[slot] = (Path(path), 0)
    weakref.finalize(m, _forget, slot)


def _forget(slot: int) -> None:
    lib = _lib()
    with _lock:
        _watched.pop(slot, None)
    if lib is not None:
        lib.mdk_guard_remove(slot)


def check() -> None:
    """Raise ModelError for a watched file that faulted since the last check (each fault once)."""
    if not _watched:
        return
    lib = _lib()
    if lib is None:
        return
    with _lock:
        for slot, (path, seen) in list(_watched.items()):
            n = lib.mdk_guard_faults(slot)
            if n > seen:
                _watched[slot] = (path, n)
                _faulted.add(path)
                raise ModelError(path, CHANGED)


def faulted(paths) -> Path | None:
    """The first of `paths` (a model's files) that faulted while mapped, checking now; else None."""
    try:
        check()
    except ModelError:
        pass
    with _lock:
        return next((Path(p) for p in paths if Path(p) in _faulted), None)


def forget_faults(paths) -> None:
    """The model of these files is closed: a file opened again starts clean."""
    with _lock:
        _faulted.difference_update(Path(p) for p in paths)


def rearm() -> None:
    """The guard's handler back in front if something replaced it since (faulthandler enabled later)."""
    lib = _lib()
    if lib is not None and _watched:
        lib.mdk_guard_reinstall()


def serving() -> bool:
    """Whether the engine serves a GGUF file's blocks from its mapping (the native kernels run the
    file's row layout); MIXDESK_RAW_KERNELS=0 repacks them into the kernels' tiles instead (owned
    memory), for comparison."""
    import os

    from .. import native

    return native.available() and os.environ.get("MIXDESK_RAW_KERNELS", "1") != "0"
