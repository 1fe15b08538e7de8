"""8-bit keys and values (Load.kv_bits = 8): each cached row of W values is W int8 codes followed by
W / 32 fp16 scales, one per block of 32 values, in one uint8 row of W + W / 16 bytes (ggml's Q8_0,
blocks in a row): value = code * scale, scale = absmax(block) / 127 rounded to fp16, code =
round-half-even(value / scale), within +-127.

Why this layout: a row stays one row of one tensor per layer, [G, ctx, row bytes], so everything
that handles the cache by rows (KVCache._rows, its files in engine/kv/files.py, resident bytes, the
pool's counts) needs nothing new, and the native decode's attention (engine/native/attention.c, fmt
MDK_KV8) reads a position's codes and scales from one place. Bytes a value: 1 + 2/32 = 1.0625
(engine/planning/kv_reservation.py int8_element_bytes counts the same), against 2 at bf16: Qwen3-30B-
A3B's 98,304 bytes a token become 52,224.

Plain torch (any device); decode.c rounds the same way (the codes and scales it writes are these).
A dequantised value (an 8-bit code times an fp16 scale) is exact in fp32, so torch's attention over
unpack's fp32 rows and the native one over the codes see the same numbers.
"""
from __future__ import annotations

import torch

BLOCK = 32  # values a scale covers
SCALE_BYTES = 2  # fp16
VALUE_BYTES = 1 + SCALE_BYTES / BLOCK  # bytes a stored value takes, scales included
FP16_MAX = 65504.0
LAYOUT = "int8 codes, fp16 scale per 32 values"  # in an 8-bit cache file's key (engine/kv/files.py)


def row_bytes(width: int) -> int:
    """Bytes of one stored row of `width` values."""
    return width + width // BLOCK * SCALE_BYTES


def width_of(nbytes: int) -> int:
    """The values a stored row of nbytes holds (row_bytes's inverse)."""
    return nbytes * BLOCK // (BLOCK + SCALE_BYTES)


def supports(width: int) -> bool:
    """A row of this width splits into whole blocks."""
    return width > 0 and width % BLOCK == 0


def pack(x: torch.Tensor, out: torch.Tensor) -> None:
    """x [..., W] (any float dtype) -> its rows stored into out [..., row_bytes(W)] uint8 (a view of
    the cache; its last dim contiguous)."""
    W = x.shape[-1]
    xf = x.float().unflatten(-1, (W // BLOCK, BLOCK))
    scale = (xf.abs().amax(-1, keepdim=True) / 127).clamp(max=FP16_MAX).half()
    s = scale.float()
    codes = torch.where(s > 0, xf / s, torch.zeros((), device=x.device)).round().clamp(-127, 127)
    out[..., :W].view(torch.int8).copy_(codes.flatten(-2))
    out[..., W:].view(torch.float16).copy_(scale.squeeze(-1))


def unpack(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored rows [..., row_bytes(W)] uint8 -> their values [..., W] in dtype: exact in fp32, the exact
    value rounded once in another dtype."""
    W = width_of(rows.shape[-1])
    if W == 0:  # MLA's values: none (its keys are the latent rows)
        return torch.empty(rows.shape, dtype=dtype, device=rows.device)
    codes = rows[..., :W].view(torch.int8).unflatten(-1, (W // BLOCK, BLOCK))
    scale = rows[..., W:].view(torch.float16)
    values = (codes.float() * scale.float().unsqueeze(-1)).flatten(-2)
    return values if dtype == torch.float32 else values.to(dtype)
