"""A weight in one of GGUF's block formats (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; and, on the
file's rows alone, Q2_K, Q3_K, IQ4_NL, IQ4_XS, the IQ1/IQ2/IQ3 i-quants and TQ1_0/TQ2_0: engine/native/
codes.c), held on the CPU and multiplied there by the native kernels with int8 activations, in one of two
layouts:

- the file's own rows ("raw": N rows of K / block_size blocks in ggml's block structs, [N, row_bytes]
  uint8), read in place (`from_file`: e.g. views of a read-only mapping of the .gguf file, never
  written; engine/native/kraw.c). An expert's w13 may be two places: gate's rows, then up's.
- the kernel's tiles, built from the raw rows once ("repack", engine/native/kquant.c and qblock.c):
  a copy in the process's own memory (`from_raw`, `quantize`; and `from_file` when
  MIXDESK_RAW_KERNELS=0, for comparison).

Both hold the same values: `dequantize()` equals `gguf.quants.dequantize` of the raw rows, bit for bit;
their products agree to fp32 rounding (the same integer sums, added in another order).
"""
from __future__ import annotations

import ctypes
import os

import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES

from ... import native

# GGUF's type -> the native format code (mdk.h)
NATIVE = {GT.Q4_K: native.Q4K, GT.Q5_K: native.Q5K, GT.Q6_K: native.Q6K, GT.Q8_0: native.Q8_0,
          GT.Q4_0: native.Q4_0, GT.Q4_1: native.Q4_1, GT.Q5_0: native.Q5_0, GT.Q5_1: native.Q5_1,
          GT.Q2_K: native.Q2K, GT.Q3_K: native.Q3K, GT.IQ4_NL: native.IQ4NL, GT.IQ4_XS: native.IQ4XS,
          GT.IQ2_XXS: native.IQ2XXS, GT.IQ2_XS: native.IQ2XS, GT.IQ2_S: native.IQ2S, GT.IQ3_XXS: native.IQ3XXS,
          GT.IQ3_S: native.IQ3S, GT.IQ1_S: native.IQ1S, GT.IQ1_M: native.IQ1M, GT.TQ1_0: native.TQ1_0,
          GT.TQ2_0: native.TQ2_0, GT.NVFP4: native.NVFP4}
# the formats the kernels run on the file's rows alone (engine/native/codes.c): no tiles of their own
ROWS_ONLY = frozenset(q for q in NATIVE if NATIVE[q] >= native.Q2K)


def row_bytes(qtype: GT, k: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    if k % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values; this one has {k}")
    return k // block * size


def bits_per_weight(qtype: GT) -> float:
    block, size = GGML_QUANT_SIZES[qtype]
    return 8.0 * size / block


class BlockQuant:
    """One matrix in a GGUF block format: the kernel's tiles (packed), or the file's rows (file_rows)."""

    def __init__(self, qtype: GT, packed: torch.Tensor | None, shape: tuple[int, int],
                 file_rows: list[torch.Tensor] | None = None):
        self.qtype = GT(qtype)
        self.fmt = NATIVE[self.qtype]
        self.packed = packed  # uint8, the kernel's tiles; None for the file's rows
        self.file_rows = file_rows  # the file's rows: one flat uint8 tensor of all N, or gate's and up's
        self.shape = shape
        n, k = shape
        if file_rows is None:
            self.desc = native.Matrix(self.fmt, n, k, packed.data_ptr(), None, None)
        else:  # (rows n_lo.. in the second part: mdk.h's w_hi)
            hi = file_rows[1].data_ptr() if len(file_rows) > 1 else None
            n_lo = file_rows[0].numel() // row_bytes(self.qtype, k) if len(file_rows) > 1 else 0
            self.desc = native.Matrix(self.fmt, n, k, file_rows[0].data_ptr(), None, None, 1, hi, n_lo)

    def __deepcopy__(self, memo) -> "BlockQuant":  # a descriptor of its own; tiles in new memory
        if self.file_rows is not None:  # the file's rows are read-only: shared, not copied
            return type(self)(self.qtype, None, self.shape, list(self.file_rows))
        return type(self)(self.qtype, self.packed.clone(), self.shape)

    @classmethod
    def from_raw(cls, qtype: GT, raw: torch.Tensor, shape: tuple[int, int]) -> "BlockQuant":
        """raw: the file's rows ([N, row_bytes] or flat uint8, contiguous) -> the tiles."""
        n, k = shape
        qtype = GT(qtype)
        if qtype in ROWS_ONLY:  # no tiles: the rows as they are (a copy of the caller's, kept)
            return cls.from_file(qtype, [raw.contiguous().reshape(-1).clone()], shape)
        raw = raw.contiguous()
        if raw.dtype != torch.uint8 or raw.numel() != n * row_bytes(qtype, k):
            raise ValueError(f"{qtype.name} [{n}, {k}] takes {n * row_bytes(qtype, k)} bytes, not {raw.numel()}")
        L = native.lib()
        packed = torch.empty(L.mdk_wq_bytes(NATIVE[qtype], n, k), dtype=torch.uint8)
        if L.mdk_wq_pack(NATIVE[qtype], raw.data_ptr(), n, k, packed.data_ptr()):
            raise ValueError(f"{qtype.name} [{n}, {k}]: the native kernel does not take this shape")
        return cls(qtype, packed, (n, k))

    @classmethod
    def from_file(cls, qtype: GT, parts: list[torch.Tensor], shape: tuple[int, int]) -> "BlockQuant":
        """The file's rows where they are, no copy: parts is one uint8 tensor of all N rows, or two
        (gate's rows, then up's) that are one [N, K] matrix together; any shape, contiguous. They may
        be views of a read-only mapping: they are only read, and kept (they keep the mapping alive).
        MIXDESK_RAW_KERNELS=0: the tiles instead, repacked into the process's memory (for A/B runs)."""
        n, k = shape
        qtype = GT(qtype)
        if qtype not in NATIVE:
            raise ValueError(f"{qtype.name} has no native block kernel")
        if n < 0 or k <= 0:
            raise ValueError(f"{qtype.name}: no matrix of shape [{n}, {k}]")
        rb = row_bytes(qtype, k)
        if not 1 <= len(parts) <= 2:
            raise ValueError(f"the rows of one matrix come in one or two parts, not {len(parts)}")
        flat = []
        for p in parts:
            if p.dtype != torch.uint8 or not p.is_contiguous() or p.device.type != "cpu":
                raise ValueError("a matrix's rows are contiguous uint8 CPU tensors")
            if p.numel() % rb:
                raise ValueError(f"{qtype.name} rows of {k} take {rb} bytes; a part has {p.numel()}")
            flat.append(p.reshape(-1))
        if sum(p.numel() for p in flat) != n * rb:
            raise ValueError(f"{qtype.name} [{n}, {k}] takes {n * rb} bytes, not {sum(p.numel() for p in flat)}")
        if os.environ.get("MIXDESK_RAW_KERNELS", "1") == "0" and qtype not in ROWS_ONLY:
            return cls.from_raw(qtype, flat[0] if len(flat) == 1 else torch.cat(flat), shape)
        if len(flat) == 2 and (flat[0].numel() == 0 or flat[1].numel() == 0):
            flat = [flat[0] if flat[0].numel() else flat[1]]
        return cls(qtype, None, (n, k), flat)

    @property
    def mapped(self) -> bool:
        """Whether it runs the file's rows in place (their memory is the caller's: a mapped file's
        pages), not tiles of its own."""
        return self.file_rows is not None

    @classmethod
    def quantize(cls, w: torch.Tensor, qtype: GT, threads: int | None = None) -> "BlockQuant":
        """A float weight [N, K] quantised to qtype (engine/native/kquantize.c), then repacked."""
        return cls.from_raw(qtype, quantize_raw(w, qtype, threads), tuple(w.shape))

    def raw(self) -> torch.Tensor:
        """The GGUF rows, [N, row_bytes] uint8 (what a file would hold): a copy."""
        n, k = self.shape
        if self.file_rows is not None:
            return torch.cat(self.file_rows).reshape(n, row_bytes(self.qtype, k))
        out = torch.empty(n, row_bytes(self.qtype, k), dtype=torch.uint8)
        if native.lib().mdk_wq_unpack(self.fmt, self.packed.data_ptr(), n, k, out.data_ptr()):
            raise ValueError(f"{self.qtype.name} [{n}, {k}]: cannot unpack")
        return out

    def dequantize(self, r0: int = 0, r1: int | None = None) -> torch.Tensor:
        """Rows r0..r1-1 of the weight, fp32 [r1 - r0, K]."""
        n, k = self.shape
        r1 = n if r1 is None else r1
        if not 0 <= r0 <= r1 <= n:
            raise IndexError(f"rows {r0}..{r1} of a {n}-row matrix")
        out = torch.empty(r1 - r0, k, dtype=torch.float32)
        if r1 == r0:
            return out
        if self.file_rows is not None:
            native.lib().mdk_raw_dequantize(ctypes.byref(self.desc), r0, r1, out.data_ptr())
        else:
            native.lib().mdk_wq_dequantize(self.fmt, self.packed.data_ptr(), n, k, r0, r1, out.data_ptr())
        return out

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N]
        return native.matmul(self.desc, x).to(x.dtype)

    @property
    def nbytes(self) -> int:
        """The bytes it refers to: its tiles, or the file's rows (see `mapped`)."""
        return sum(p.numel() for p in self.file_rows) if self.file_rows is not None else self.packed.numel()

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
