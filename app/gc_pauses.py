"""Python's full garbage collections, kept out of a streaming reply.

The window's process holds torch, transformers and Qt: hundreds of thousands of long-lived objects
that a full (generation 2) collection walks every time (measured: 133 ms after importing torch and
transformers alone; 280-620 ms in the test process, on the GUI thread, in the middle of a streamed
reply). `gc.freeze()` as a reply starts moves every object alive then out of the collector's reach,
so the collections during the reply walk only what was made since; a young collection first, so
that recent cyclic garbage is freed, not frozen. When the reply ends, `gc.unfreeze()` hands them
back: a model unloaded later (engine/runtime/session.py collects then) must not be kept by a freeze.
"""
from __future__ import annotations

import gc


def before_reply() -> None:
    gc.collect(1)
    gc.freeze()


def after_reply() -> None:
    gc.unfreeze()
