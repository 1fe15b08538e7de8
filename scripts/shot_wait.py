"""What the view scripts (scripts/shots_*.py) share: running the event loop until their view is ready."""
from __future__ import annotations

import time


def wait(app, until, timeout_s: float) -> bool:
    """Process events until until() holds (True) or timeout_s passes (False)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        app.processEvents()
        if until():
            return True
        time.sleep(0.02)
    return False
