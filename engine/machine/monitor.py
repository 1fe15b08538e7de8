"""Memory monitor: samples VRAM (NVML) and RAM (psutil) on its own thread and turns them into
budgets for the planner. A source interface lets tests script a memory timeline.

VRAM budget = what this process holds + what is free - a safety margin.
RAM budget  = what the model holds in RAM + what is available - a safety margin.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import psutil


@dataclass(frozen=True)
class MemorySample:
    vram_total: int = 0
    vram_free: int = 0
    vram_used_by_others: int = 0
    ram_total: int = 0
    ram_available: int = 0
    rss: int = 0
    rss_file: int = 0  # of rss, file-backed pages (a mapped model file's): the page cache's, evictable


class MemorySource(Protocol):
    def sample(self) -> MemorySample: ...


class SystemSource:
    """The real machine. NVML is matched to torch's CUDA device by PCI bus id; without a driver or
    NVML library it reports no VRAM (CPU-only), never an error."""

    def __init__(self, cuda_index: int | None = None):
        self._handle = None
        self._proc = psutil.Process()
        if cuda_index is None:
            return
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            p = torch.cuda.get_device_properties(cuda_index)
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:  # NVMLError_LibraryNotFound and friends: no NVIDIA driver here
            self._handle = None

    def sample(self) -> MemorySample:
        vm = psutil.virtual_memory()
        mi = self._proc.memory_info()
        rss, rss_file = mi.rss, getattr(mi, "shared", 0)  # Linux: RssFile + RssShmem
        if self._handle is None:
            return MemorySample(ram_total=vm.total, ram_available=vm.available, rss=rss, rss_file=rss_file)
        import pynvml

        info = pynvml.nvmlDeviceGetMemoryInfo(self._handle)
        ours = 0
        try:
            import os

            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if p.pid == os.getpid():
                    ours = p.usedGpuMemory or 0
        except Exception:
            pass
        return MemorySample(info.total, info.free, max(int(info.used) - ours, 0), vm.total, vm.available, rss,
                            rss_file)


class ScriptedSource:
    """A memory timeline for tests: a function of the number of samples taken so far."""

    def __init__(self, fn: Callable[[int], MemorySample]):
        self.fn = fn
        self.n = 0

    def sample(self) -> MemorySample:
        s = self.fn(self.n)
        self.n += 1
        return s


@dataclass(frozen=True)
class BudgetReading:
    vram: int
    ram: int
    sample: MemorySample


class Monitor:
    """Polls a source every `period` seconds and calls `on_reading` with the budgets.
    `held` returns the bytes this process holds (vram, ram) for the model, to add back; `lock`, when
    given, is held while the sample and `held` are read, so that both describe the same moment (the
    migrator swaps experts under it: a swap is never counted in one and not the other)."""

    def __init__(self, source: MemorySource, on_reading: Callable[[BudgetReading], None],
                 held: Callable[[], tuple[int, int]] = lambda: (0, 0), period: float = 0.5,
                 vram_margin: float = 0.10, ram_margin: float = 0.15, lock: threading.Lock | None = None):
        self.source, self.on_reading, self.held = source, on_reading, held
        self.lock = lock or threading.Lock()
        self.period, self.vram_margin, self.ram_margin = period, vram_margin, ram_margin
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reading(self) -> BudgetReading:
        with self.lock:
            s = self.source.sample()
            held_v, held_r = self.held()
        vram = int((held_v + s.vram_free) * (1 - self.vram_margin)) if s.vram_total else 0
        ram = int((held_r + s.ram_available) * (1 - self.ram_margin))
        return BudgetReading(vram, ram, s)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.on_reading(self.reading())
            except Exception:  # a failed sample must never take the monitor down
                pass
            self._stop.wait(max(0.0, self.period - (time.perf_counter() - t0)))

    def start(self) -> "Monitor":
        self._thread = threading.Thread(target=self._run, name="mixdesk-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
