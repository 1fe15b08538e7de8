"""Measured costs that decide, per expert and per prefill, whether a CPU-resident expert computes
on the CPU (only activations cross) or has its weights copied to the accelerator for the batch.

Nothing here is a constant: each figure is timed on this machine, on a real expert of the loaded
model, when the model loads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..machine.devices import best_time
from .expert import Expert16


@dataclass(frozen=True)
class OffloadCosts:
    cpu_fixed_s: float  # time = fixed + per_token * n
    cpu_per_token_s: float
    gpu_fixed_s: float
    gpu_per_token_s: float
    h2d_bytes_per_s: float

    def cpu_time(self, tokens: int) -> float:
        return self.cpu_fixed_s + self.cpu_per_token_s * tokens

    def copy_time(self, tokens: int, nbytes: int) -> float:
        return nbytes / self.h2d_bytes_per_s + self.gpu_fixed_s + self.gpu_per_token_s * tokens

    def copy_wins(self, tokens: int, nbytes: int) -> bool:
        return self.copy_time(tokens, nbytes) < self.cpu_time(tokens)


def _fit(expert, device: torch.device, dtype: torch.dtype, reps: int) -> tuple[float, float]:
    d = expert.w2.shape[0]
    n_lo, n_hi = 1, 32
    x_lo = torch.randn(n_lo, d, dtype=dtype, device=device)
    x_hi = torch.randn(n_hi, d, dtype=dtype, device=device)
    t_lo = best_time(lambda: expert(x_lo), device, reps)
    t_hi = best_time(lambda: expert(x_hi), device, reps)
    per = max((t_hi - t_lo) / (n_hi - n_lo), 0.0)
    return max(t_lo - per * n_lo, 0.0), per


def measure(cpu_expert, accel: torch.device, reps: int = 3, dtype: torch.dtype | None = None) -> OffloadCosts | None:
    """Time one expert on the CPU and on the accelerator, and its copy there: a pinned host-to-device
    copy of a 16-bit expert's bytes, or a GGUF expert's whole QuantExpert.to (its file rows across
    from pageable memory, and their dequantisation there). dtype: the model's (a 16-bit expert's own
    by default). Returns None without an accelerator: then there is nothing to decide."""
    if accel.type != "cuda":
        return None
    dtype = dtype or cpu_expert.w13.dtype
    cpu_fixed, cpu_per = _fit(cpu_expert, torch.device("cpu"), dtype, reps)
    gpu_expert = cpu_expert.to(accel, dtype)
    gpu_fixed, gpu_per = _fit(gpu_expert, accel, dtype, reps)
    if isinstance(cpu_expert, Expert16):
        staging = torch.empty(cpu_expert.nbytes, dtype=torch.uint8).pin_memory()
        target = torch.empty_like(staging, device=accel)
        t = best_time(lambda: target.copy_(staging, non_blocking=True), accel, reps)
    else:
        t = best_time(lambda: cpu_expert.to(accel, dtype), accel, reps)
    return OffloadCosts(cpu_fixed, cpu_per, gpu_fixed, gpu_per, cpu_expert.nbytes / t)
