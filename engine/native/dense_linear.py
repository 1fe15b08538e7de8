"""Which 16-bit format the CPU multiplies fastest, measured here rather than assumed, and the
dense matmul of the CPU (the native GEMV at a few rows, torch's GEMM past that).

With the native kernels the format is bf16 (measured on the whole decode step, see
fastest_cpu_16bit); without them, torch's own GEMV is timed in both formats.

torch's CPU matmul speed at batch 1 differs by format and by processor: on one AVX-512 EPYC we
measured fp16 weights at ~46 GB/s and bf16 at ~16 GB/s for the same 14336x4096 matrix; other
processors may rank them the other way. A bf16 checkpoint converts to fp16 exactly for every
weight in fp16's normal range, and the model checks the rest when it loads.
"""
from __future__ import annotations

import functools
import math
import time

import torch
import torch.nn.functional as F

from .. import native
from . import choice

FP16_MAX = 65504.0


def _gemv_seconds(dtypes, rows: int = 4096, cols: int = 1024, mats: int = 12, rounds: int = 7) -> dict:
    """Best time per format of one pass over 12 x 8 MiB of weights (larger than the caches, so this
    times reads from RAM), in interleaved rounds: a slow spell of a shared machine hits one round of
    each format rather than every run of one (a single such spell once picked the 3x slower one)."""
    ws = {dt: [torch.randn(rows, cols).to(dt) for _ in range(mats)] for dt in dtypes}
    xs = {dt: torch.randn(1, cols).to(dt) for dt in dtypes}
    best = {dt: float("inf") for dt in dtypes}
    for r in range(rounds + 1):
        for dt in dtypes:
            t0 = time.perf_counter()
            for w in ws[dt]:
                linear(xs[dt], w)
            if r:  # round 0 warms up
                best[dt] = min(best[dt], time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=None)  # a property of the machine: measured once per process
def fastest_cpu_16bit() -> torch.dtype:
    if native.available():
        # With the native kernels bf16 wins where it counts, the whole decode step: its activations
        # round with a shift (fp16 needs a scalar conversion in the step's small loops), and AVX512-BF16
        # multiplies it directly. Measured on the demo (2-core EPYC): cpu-4 9.5 vs 14.2 ms per token,
        # cpu-16 14.8 vs 27.3 ms; a GEMV alone ranked the two within noise, either way round.
        return torch.bfloat16
    times = _gemv_seconds((torch.bfloat16, torch.float16))
    return min(times, key=times.get)


def auto_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return fastest_cpu_16bit()


# a Load's dtype (protocol.Load.dtype) -> the compute dtype; "auto": the fastest here (auto_dtype)
LOAD_DTYPES = {"auto": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype a model loaded with Load(dtype=name) computes in on device."""
    return LOAD_DTYPES[name] or auto_dtype(device)


@functools.lru_cache(maxsize=None)
def fp16_rows_limit() -> int:
    """Up to how many rows fp16 weights are multiplied as they are. torch's fp16 CPU matmul costs
    about one GEMV per row; past some batch it pays to convert the weight to bf16 once and use the
    bf16 GEMM. The break-even batch is measured here (one 8 MiB weight)."""
    w = torch.randn(4096, 1024).half()
    x1 = torch.randn(1, 1024).half()
    xb = torch.randn(64, 1024).to(torch.bfloat16)
    per_row = min(_timed(lambda: F.linear(x1, w)) for _ in range(3))
    convert = min(_timed(lambda: F.linear(xb, w.to(torch.bfloat16))) for _ in range(3))
    return max(1, int(convert / per_row))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T, choosing the kernel by batch: torch's fp16 CPU matmul is fast at one row (a
    dedicated GEMV) but ~5x slower than bf16 at 64 rows (measured), so for a large batch fp16
    weights are widened to bf16 for that call. That is exact for weights from a bf16 checkpoint.
    A GGUF block weight (engine/files/gguf/blockquant.py BlockQuant, or stacked parts of them) multiplies itself."""
    if not isinstance(w, torch.Tensor):
        return w.matmul(x)
    if choice.dense(w, x.shape[0]):  # a few rows: the native GEMV (choice.DENSE_ROWS)
        return native.matmul(native.matrix(w), x.to(w.dtype)).to(x.dtype)
    if w.dtype == torch.float16 and w.device.type == "cpu" and x.shape[0] > fp16_rows_limit():
        return F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)).to(x.dtype)
    return F.linear(x, w)


def weight_problem(t: torch.Tensor, dtype: torch.dtype) -> str | None:
    """What stops t from being used in dtype, or None: NaN/Inf values, or values beyond fp16's range
    when computing in fp16. One pass with aminmax (10x faster than abs().max(), no temporary)."""
    if t.numel() == 0:
        return None
    lo, hi = (float(v) for v in torch.aminmax(t))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "holds NaN or Inf values (a corrupt or badly converted checkpoint)"
    if dtype == torch.float16 and t.dtype != torch.float16 and max(-lo, hi) > FP16_MAX:
        return "has values beyond fp16's range; use --dtype bf16"
    return None
