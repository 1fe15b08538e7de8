"""Process memory measurement: peak RSS over a block of code (sampled) and over the process life."""
from __future__ import annotations

import contextlib
import ctypes
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


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MAPPED_FROM, AFTER = 4 << 20, 32 << 20  # bytes


@contextlib.contextmanager
def large_buffers_mapped():
    """While inside: buffers of MAPPED_FROM bytes and more are mmapped by glibc's malloc (given back
    to the system when freed) instead of carved from the heap. The calibration allocates and frees an
    expert's 9-19 MB transients between the small forms it keeps; from the heap that fragmented it
    (measured on the full-size Qwen3-30B-A3B: a layer grew the process's own memory by 1.73 GiB with the
    heap, 0.76 GiB mapped). Afterwards the threshold is AFTER (where glibc's own adjusting threshold
    settles after large frees), so decode and prefill allocate as before. glibc only; elsewhere nothing."""
    libc = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt(M_MMAP_THRESHOLD, MAPPED_FROM)
        except (OSError, AttributeError):
            libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, AFTER)
            with contextlib.suppress(AttributeError):
                libc.malloc_trim(0)


def rss_parts(pid: int | str = "self") -> tuple[int, int]:
    """(RssAnon, RssFile) of a process in bytes, from /proc/PID/status: the memory it owns, and the
    file pages it has mapped that are resident (page cache the OS can evict). (0, 0) where unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile")))
        return tuple(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))
    except (OSError, KeyError, ValueError):
        return 0, 0


class PeakRSS:
    """`with PeakRSS() as p: ...` then p.peak: the largest RSS sampled every `period` seconds, and
    p.peak_anon / p.peak_file the largest anonymous (the process's own memory) and file-backed (a
    mapped model file's pages: page cache) parts of it (Linux; 0 elsewhere)."""

    def __init__(self, period: float = 0.005):
        self.period = period
        self.peak = self.peak_anon = self.peak_file = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()

    def _sample(self) -> None:
        self.peak = max(self.peak, self._proc.memory_info().rss)
        anon, file = rss_parts()
        self.peak_anon, self.peak_file = max(self.peak_anon, anon), max(self.peak_file, file)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> "PeakRSS":
        self._sample()
        self._t = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self._sample()
