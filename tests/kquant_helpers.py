"""Shared by several test modules (moved out of tests/test_kquant.py, which uses them too): random_raw, scaled."""
import numpy as np
import torch
from gguf import GGMLQuantizationType as GT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES
from engine.files.gguf.blockquant import BlockQuant
from native_helpers import path, threads  # noqa: F401  (fixtures: every code path, 1 and 2 threads)


D_AT = {GT.Q4_K: 0, GT.Q5_K: 0, GT.Q6_K: 208}  # where a block's fp16 d starts (Q4_K/Q5_K: then dmin)


def random_raw(qt: GT, n: int, k: int, seed: int, scale: float = 0.01) -> np.ndarray:
    """Valid raw rows [n, row bytes]: random bytes, with finite small fp16 d (and dmin)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    nd = 2 if qt == GT.Q6_K else 4
    h = (rng.standard_normal((n, k // block, nd // 2)) * scale).astype(np.float16)
    raw[..., D_AT[qt]:D_AT[qt] + nd] = h.view(np.uint8).reshape(n, k // block, nd)
    return raw.reshape(n, -1)


def scaled(qt: GT, n: int, k: int, seed: int, std: float) -> BlockQuant:
    """A random valid block weight whose values have about this standard deviation (d, dmin scaled)."""
    raw = random_raw(qt, n, k, seed)
    w = quants.dequantize(raw, qt)
    s = std / max(float(w.std()), 1e-30)
    block, size = GGML_QUANT_SIZES[qt]
    r = raw.reshape(n, k // block, size)
    nd = 2 if qt == GT.Q6_K else 4
    h = r[..., D_AT[qt]:D_AT[qt] + nd].copy().view(np.float16)
    r[..., D_AT[qt]:D_AT[qt] + nd] = (h.astype(np.float32) * s).astype(np.float16).view(np.uint8)
    return BlockQuant.from_raw(qt, torch.from_numpy(r.reshape(n, -1).copy()), (n, k))

