"""Which 16-bit format the CPU multiplies fastest, measured here rather than assumed.

torch's CPU matmul speed at batch 1 differs by format and by processor: on one AVX-512 EPYC we
measured fp16 weights at ~46 GB/s and bf16 at ~16 GB/s for the same 14336x4096 matrix; other
processors may rank them the other way. A bf16 checkpoint converts to fp16 exactly for every
weight in fp16's normal range, and the model checks the rest when it loads.
"""
from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

FP16_MAX = 65504.0


def _gemv_seconds(dtype: torch.dtype, rows: int = 4096, cols: int = 1024, mats: int = 12, reps: int = 3) -> float:
    # 12 x 8 MiB of weights: larger than the caches, so this times reads from RAM
    ws = [torch.randn(rows, cols).to(dtype) for _ in range(mats)]
    x = torch.randn(1, cols).to(dtype)
    for w in ws:
        F.linear(x, w)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in ws:
            F.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=None)
def fastest_cpu_16bit() -> torch.dtype:
    times = {dt: _gemv_seconds(dt) for dt in (torch.bfloat16, torch.float16)}
    return min(times, key=times.get)


def auto_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return fastest_cpu_16bit()


def check_fits(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """True when converting t to dtype loses no value to overflow."""
    if dtype != torch.float16 or t.dtype == torch.float16:
        return True
    return bool(t.abs().max() <= FP16_MAX)
