"""Process memory measurement: peak RSS over a block of code (sampled) and over the process life."""
from __future__ import annotations

import sys
import threading

import psutil


def lifetime_peak_rss() -> int | None:
    """The kernel's own high-water mark of this process's RSS, in bytes (None where unknown)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class PeakRSS:
    """`with PeakRSS() as p: ...` then p.peak: the largest RSS sampled every `period` seconds."""

    def __init__(self, period: float = 0.005):
        self.period = period
        self.peak = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "PeakRSS":
        self.peak = self._proc.memory_info().rss
        self._t = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
