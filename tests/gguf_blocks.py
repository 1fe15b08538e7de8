"""Valid random blocks of GGUF's below-4-bit types and i-quants, for the tests (a helper module, not a
test): gguf-py dequantises every type but quantises few of them, so a matrix of such a type is random
bytes with its fp16 scales set so the dequantised values have a chosen RMS (what a file's blocks hold
is any byte pattern; a model made of them is a model like any other)."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

CODES_TYPES = [GT.Q2_K, GT.Q3_K, GT.IQ4_NL, GT.IQ4_XS, GT.IQ2_XXS, GT.IQ2_XS, GT.IQ2_S, GT.IQ3_XXS, GT.IQ3_S,
               GT.IQ1_S, GT.IQ1_M, GT.TQ1_0, GT.TQ2_0, GT.NVFP4]
# where each block's fp16 scales are (IQ1_M: spread over the top nibbles of its four scale words)
_D_AT = {GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.TQ1_0: (52,), GT.TQ2_0: (64,)}


def _set_d(qt: GT, b: np.ndarray, d: np.ndarray) -> None:
    """Every block's scale(s) to d (fp16, one a block)."""
    bits = d.astype(np.float16).view(np.uint16)
    if qt == GT.IQ1_M:
        for i in range(4):  # nibble i of d into the top nibble of scale word i
            w = b[:, 48 + 2 * i].astype(np.uint16) | (b[:, 49 + 2 * i].astype(np.uint16) << 8)
            w = (w & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
            b[:, 48 + 2 * i], b[:, 49 + 2 * i] = w & 0xFF, w >> 8
        return
    for off in _D_AT.get(qt, (0,)):
        b[:, off], b[:, off + 1] = bits & 0xFF, bits >> 8


def random_rows(qt: GT, n: int, k: int, seed: int, rms: float = 0.05) -> np.ndarray:
    """[n, row bytes] uint8: random blocks of qt whose dequantised values have about this RMS."""
    block, size = GGML_QUANT_SIZES[qt]
    assert k % block == 0, (qt.name, k)
    nb = n * k // block
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if qt == GT.NVFP4:  # its 4 scales are unsigned E4M3 bytes: small ones (exponent 0, mantissa 1..7)
        b[:, :4] = rng.integers(1, 8, size=(nb, 4), dtype=np.uint8)
        return b.reshape(n, -1)
    _set_d(qt, b, np.ones(nb, dtype=np.float32))
    v = dequantize(b, qt).reshape(nb, block)
    per = np.sqrt((v.astype(np.float64) ** 2).mean(-1)) + 1e-12
    _set_d(qt, b, (rms / per).astype(np.float32) * rng.uniform(0.5, 1.5, nb).astype(np.float32))
    return b.reshape(n, -1)
