"""ggml's MXFP4 rows (GPT-OSS's experts in GGUF) in the layout of OpenAI's release, which
engine/files/fused_experts.py and engine/experts/quant.MX4Native take. Lossless: only bits move.

ggml's block_mxfp4 (32 values): one E8M0 byte e, then 16 bytes where byte j holds element j in its
low nibble and element j + 16 in its high one; ggml doubles the E2M1 table and halves the scale, so
a value is E2M1[code] * 2^(e - 127), the release's own scale. The release: blocks [rows, K/32, 16]
with element 2i in byte i's low nibble and 2i + 1 in its high one, scales [rows, K/32] = e.
"""
from __future__ import annotations

import torch

BLOCK_BYTES = 17


def to_release(raw: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """raw [R, K/32 * 17] uint8 (the file's rows) -> (blocks [R, K/32, 16], scales [R, K/32]) uint8."""
    r = raw.shape[0]
    g = raw.reshape(r, k // 32, BLOCK_BYTES)
    scales = g[..., 0].contiguous()
    qs = g[..., 1:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [R, G, 32] in element order
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), scales
