"""GPU memory in the GPU check: a smaller card emulated on the device, and the peaks a stage reached.

A 24 GB card on a 141 GB H200 is torch.cuda.set_per_process_memory_fraction(24 GB / total): past it
torch's allocator raises out-of-memory as the smaller card would. It is a per-process setting, so
each group of stages on one card runs in a process of its own (gpu_check.py).

Peaks, against the card: torch's own (max_memory_allocated / max_memory_reserved, reset when a
stage starts) and NVML's view of this process (sampled every 50 ms on a thread: what the driver
counts, the CUDA context included). Without CUDA both are skipped with the reason; the process's
peak RSS is sampled either way (the rehearsal's memory is RAM).
"""
from __future__ import annotations

import os
import threading

import psutil
import torch

GB = 10**9
NO_CUDA = "no CUDA device here: nothing to read"


def emulate_card(card_gb: float | None) -> dict:
    """Limit this process to a card of card_gb (None: the whole device)."""
    if card_gb is None:
        return {"card": "the whole device"}
    if not torch.cuda.is_available():
        return {"card_gb": card_gb, "set_per_process_memory_fraction": f"skipped: {NO_CUDA}"}
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(card_gb * GB / total, 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return {"card_gb": card_gb, "device_total_gb": round(total / GB, 1), "memory_fraction": round(fraction, 4)}


def _nvml_handle():
    """This process's GPU in NVML, matched to torch's device by PCI bus id (as engine/machine/monitor.py)."""
    import pynvml

    pynvml.nvmlInit()
    p = torch.cuda.get_device_properties(0)
    return pynvml.nvmlDeviceGetHandleByPciBusId(f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")


def nvml_used(handle) -> tuple[int | None, int]:
    """(bytes NVML counts for this process, or None where it lists no processes; bytes used on the device)."""
    import pynvml

    used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    ours = None
    try:
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory:
                ours = int(p.usedGpuMemory)
    except pynvml.NVMLError:
        pass
    return ours, used


class PeakWatch:
    """Peak memory from start() to result(): torch's, NVML's and RSS."""

    def __init__(self, period_s: float = 0.05):
        self.period_s = period_s
        self.cuda = torch.cuda.is_available()
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self.rss = 0
        self.nvml_process = None  # bytes, where NVML lists this process
        self.nvml_device = 0      # bytes used on the device above what was used at start
        self.nvml_error = NO_CUDA
        self._handle, self._base = None, 0

    def start(self) -> PeakWatch:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            try:
                self._handle = _nvml_handle()
                self._base = nvml_used(self._handle)[1]
                self.nvml_error = None
            except Exception as e:  # noqa: BLE001 - NVML missing or refused: recorded, never fatal
                self.nvml_error = f"NVML unavailable: {type(e).__name__}: {e}"
        threading.Thread(target=self._run, name="gpu-check-peaks", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        self.rss = max(self.rss, self._proc.memory_info().rss)
        if self._handle is not None:
            try:
                ours, used = nvml_used(self._handle)
            except Exception:  # noqa: BLE001 - one failed sample is skipped
                return
            if ours is not None:
                self.nvml_process = max(self.nvml_process or 0, ours)
            self.nvml_device = max(self.nvml_device, used - self._base)

    def result(self, card_gb: float | None) -> dict:
        self.sample()
        out = {"rss_peak_gb": round(self.rss / GB, 3)}
        if not self.cuda:
            return {**out, "torch_peak": f"skipped: {NO_CUDA}", "nvml_peak": f"skipped: {NO_CUDA}"}
        out["torch_max_allocated_gb"] = round(torch.cuda.max_memory_allocated() / GB, 3)
        out["torch_max_reserved_gb"] = round(torch.cuda.max_memory_reserved() / GB, 3)
        if self.nvml_error:
            out["nvml_peak"] = f"skipped: {self.nvml_error}"
        else:
            out["nvml_process_peak_gb"] = None if self.nvml_process is None else round(self.nvml_process / GB, 3)
            out["nvml_device_peak_gb"] = round(self.nvml_device / GB, 3)  # above the use at start
        if card_gb is not None:
            out["card_gb"] = card_gb
            out["within_card"] = out["torch_max_reserved_gb"] <= card_gb
        return out

    def stop(self) -> None:
        self._stop.set()
