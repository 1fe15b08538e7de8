"""The tensor types Mixdesk reads from a GGUF file, and a file's rows turned into their values (the
stored floats, or the dequantisation: native where the library runs the type, else gguf.quants')."""
from __future__ import annotations

import os

import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize

from .header import TensorInfo

SUPPORTED = (GT.F32, GT.F16, GT.BF16, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q4_K, GT.Q5_K, GT.Q6_K,
             GT.MXFP4, GT.Q3_K, GT.Q2_K, GT.IQ4_XS, GT.IQ4_NL, GT.IQ3_S, GT.IQ3_XXS, GT.IQ2_S, GT.IQ2_XS,
             GT.IQ2_XXS, GT.IQ1_M, GT.IQ1_S, GT.TQ1_0, GT.TQ2_0, GT.NVFP4)
FLOATS = {GT.F32: torch.float32, GT.F16: torch.float16, GT.BF16: torch.bfloat16}

def unsupported(t: TensorInfo) -> str:
    return (f"tensor '{t.name}' is {t.qtype.name}, which Mixdesk does not read yet (it reads "
            f"{', '.join(q.name for q in SUPPORTED)})")


def dequantize_rows(qtype: GT, raw: torch.Tensor, k: int) -> torch.Tensor:
    """The file's rows [R, row_bytes] uint8 -> their values [R, K]: the stored floats, or
    gguf.quants.dequantize's float32 (the reference the native kernels are tested against)."""
    if qtype in FLOATS:
        return raw.reshape(-1).view(FLOATS[qtype]).reshape(-1, k)
    fast = _native_rows(qtype, raw, k)
    return fast if fast is not None else torch.from_numpy(dequantize(raw.numpy(), qtype)).reshape(-1, k)


def _native_rows(qtype: GT, raw: torch.Tensor, k: int) -> torch.Tensor | None:
    """dequantize_rows by the native library on the file's rows (bit-equal to gguf.quants.dequantize:
    tests/test_kernels_raw.py; about 10x faster than its numpy), or None where it cannot."""
    from ... import native
    from .blockquant import NATIVE, BlockQuant, row_bytes

    if (not native.available() or qtype not in NATIVE or raw.dtype != torch.uint8 or not raw.is_contiguous()
            or os.environ.get("MIXDESK_RAW_KERNELS", "1") == "0"):
        return None
    try:
        return BlockQuant.from_file(qtype, [raw], (raw.numel() // row_bytes(qtype, k), k)).dequantize()
    except ValueError:
        return None
