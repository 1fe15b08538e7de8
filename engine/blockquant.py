"""A weight in one of GGUF's block formats (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), held on
the CPU in the native kernel's tiles and multiplied there with int8 activations.

Shapes: a weight is W [N, K] (out, in); x [T, K] -> x @ W.T [T, N]. "raw" means the rows exactly as a
GGUF file holds them: N rows of K / block_size blocks in ggml's block structs ([N, row_bytes] uint8).
The tiles are built from the raw rows once ("repack", engine/native/kquant.c and qblock.c) and hold
the same values: `dequantize()` equals `gguf.quants.dequantize` of the raw rows, bit for bit.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES

from . import native

# GGUF's type -> the native format code (mdk.h)
NATIVE = {GT.Q4_K: native.Q4K, GT.Q5_K: native.Q5K, GT.Q6_K: native.Q6K, GT.Q8_0: native.Q8_0,
          GT.Q4_0: native.Q4_0, GT.Q4_1: native.Q4_1, GT.Q5_0: native.Q5_0, GT.Q5_1: native.Q5_1}


def row_bytes(qtype: GT, k: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    if k % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values; this one has {k}")
    return k // block * size


def bits_per_weight(qtype: GT) -> float:
    block, size = GGML_QUANT_SIZES[qtype]
    return 8.0 * size / block


class BlockQuant:
    """One matrix in a GGUF block format, in the native kernel's tiles."""

    def __init__(self, qtype: GT, packed: torch.Tensor, shape: tuple[int, int]):
        self.qtype = GT(qtype)
        self.fmt = NATIVE[self.qtype]
        self.packed = packed  # uint8, the kernel's tiles
        self.shape = shape
        self.desc = native.Matrix(self.fmt, shape[0], shape[1], packed.data_ptr(), None, None)

    def __deepcopy__(self, memo) -> "BlockQuant":  # new memory, and a descriptor pointing at it
        return type(self)(self.qtype, self.packed.clone(), self.shape)

    @classmethod
    def from_raw(cls, qtype: GT, raw: torch.Tensor, shape: tuple[int, int]) -> "BlockQuant":
        """raw: the file's rows ([N, row_bytes] or flat uint8, contiguous) -> the tiles."""
        n, k = shape
        qtype = GT(qtype)
        raw = raw.contiguous()
        if raw.dtype != torch.uint8 or raw.numel() != n * row_bytes(qtype, k):
            raise ValueError(f"{qtype.name} [{n}, {k}] takes {n * row_bytes(qtype, k)} bytes, not {raw.numel()}")
        L = native.lib()
        packed = torch.empty(L.mdk_wq_bytes(NATIVE[qtype], n, k), dtype=torch.uint8)
        if L.mdk_wq_pack(NATIVE[qtype], raw.data_ptr(), n, k, packed.data_ptr()):
            raise ValueError(f"{qtype.name} [{n}, {k}]: the native kernel does not take this shape")
        return cls(qtype, packed, (n, k))

    @classmethod
    def quantize(cls, w: torch.Tensor, qtype: GT, threads: int | None = None) -> "BlockQuant":
        """A float weight [N, K] quantised to qtype (engine/native/kquantize.c), then repacked."""
        return cls.from_raw(qtype, quantize_raw(w, qtype, threads), tuple(w.shape))

    def raw(self) -> torch.Tensor:
        """The GGUF rows these tiles came from, [N, row_bytes] uint8 (what a file would hold)."""
        n, k = self.shape
        out = torch.empty(n, row_bytes(self.qtype, k), dtype=torch.uint8)
        if native.lib().mdk_wq_unpack(self.fmt, self.packed.data_ptr(), n, k, out.data_ptr()):
            raise ValueError(f"{self.qtype.name} [{n}, {k}]: cannot unpack")
        return out

    def dequantize(self, r0: int = 0, r1: int | None = None) -> torch.Tensor:
        """Rows r0..r1-1 of the weight these tiles stand for, fp32 [r1 - r0, K]."""
        n, k = self.shape
        r1 = n if r1 is None else r1
        out = torch.empty(r1 - r0, k, dtype=torch.float32)
        native.lib().mdk_wq_dequantize(self.fmt, self.packed.data_ptr(), n, k, r0, r1, out.data_ptr())
        return out

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N]
        return native.matmul(self.desc, x).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    @property
    def bits(self) -> float:
        return 8.0 * self.nbytes / (self.shape[0] * self.shape[1])


def quantize_raw(w: torch.Tensor, qtype: GT, threads: int | None = None) -> torch.Tensor:
    """A float weight [N, K] (fp32/fp16/bf16) -> GGUF rows of qtype, [N, row_bytes] uint8."""
    n, k = w.shape
    qtype = GT(qtype)
    w = w.contiguous()
    if w.dtype not in native.FMT:
        w = w.float()
    out = torch.empty(n, row_bytes(qtype, k), dtype=torch.uint8)
    if native.lib().mdk_quantize_blocks(NATIVE[qtype], w.data_ptr(), native.FMT[w.dtype], n, k, out.data_ptr(),
                                        threads or native.threads()):
        raise ValueError(f"{qtype.name}: cannot quantise a [{n}, {k}] weight")
    return out
