"""Which accelerator the engine runs on. A missing CUDA or driver means CPU-only, never a crash."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accelerator:
    device: torch.device
    name: str

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def cpu_only(self) -> bool:
        return not self.is_cuda

    def describe(self) -> str:
        if self.cpu_only:
            return "CPU-only: no CUDA GPU was found, so every expert and the dense part run on the CPU"
        return f"GPU: {self.name}"


def detect(prefer: str | None = None) -> Accelerator:
    """`prefer` is 'cpu', 'cuda', 'cuda:N' or None (CUDA when available)."""
    if prefer == "cpu":
        return Accelerator(torch.device("cpu"), "CPU")
    try:
        ok = torch.cuda.is_available()
    except Exception:  # broken driver or library: run on the CPU and say so
        ok = False
    if not ok:
        if prefer and prefer.startswith("cuda"):
            from ..protocol.errors import InputError

            build = f"torch {torch.__version__}" + (" (a CPU-only build)" if torch.version.cuda is None else "")
            raise InputError(f"--device {prefer}", f"no CUDA GPU is usable on this machine ({build}); "
                             "use --device cpu, or install a CUDA build of torch")
        return Accelerator(torch.device("cpu"), "CPU")
    dev = torch.device(prefer if prefer and prefer.startswith("cuda") else "cuda")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        from ..protocol.errors import InputError

        raise InputError(f"--device {prefer}", f"this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered from 0")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return Accelerator(dev, torch.cuda.get_device_name(dev))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, device: torch.device, reps: int = 5) -> float:
    """Best wall time of fn() over `reps` runs after one warm-up, synchronising CUDA around each."""
    fn()
    synchronize(device)
    best = float("inf")
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best
