"""Python's full garbage collections, kept out of a streaming reply.

The window's process holds torch, transformers and Qt: millions of long-lived objects that a full
(generation 2) collection walks every time. Measured in the test process, one such collection took
280-620 ms on the GUI thread, in the middle of a streamed reply. `gc.freeze()` moves every object
alive now out of the collector's reach, so the collections that follow walk only what was made
since. Called as a reply starts: the objects alive then (the model, the modules, the chats shown)
live on anyway. A young collection first, so that recent cyclic garbage is freed, not frozen; what
older cyclic garbage a freeze keeps is small next to the model the process holds.
"""
from __future__ import annotations

import gc


def before_reply() -> None:
    gc.collect(1)
    gc.freeze()
