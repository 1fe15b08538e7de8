"""A prompt's attention over its sequence's cache in flash.c (AVX-512): scores in blocks of 32 keys,
the online softmax, no n-by-n scores in memory, the keys in fp32 FMAs and the weights times the values
in bf16 dot products where the CPU has AVX512-BF16. Where the CPU has AMX (Intel Xeon since Sapphire
Rapids) a bf16 cache's attention runs in bf16 tiles instead (flash_amx.c: the queries rounded to bf16 as
a bf16 model's are; 2 Xeon cores, Qwen3-30B-A3B's heads, 512 queries after 15,872 keys: 116 ms, 1.15
TFLOP/s, against 671 ms on the AVX-512 path; MIXDESK_AMX=0 turns it off). `attend` returns None where it does not apply
(no library or no AVX-512 path, a head dim other than 64/128/256, strides it does not take); the
caller then uses torch's scaled_dot_product_attention, the same math in fp32.

On one Zen 5 core pair (2026-12-04, benchmarks/prefill_attention.py): see the README's prefill table.
"""
from __future__ import annotations

import os

import torch

from engine import native

MIN_TOKENS = int(os.environ.get("MIXDESK_FLASH_MIN", "16"))  # below this many queries, torch's SDPA


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q0: int, window: int | None,
           scale: float | None, bf16_values: bool = True) -> torch.Tensor | None:
    """q [n, H, Hd] fp32 (rows may be strided: the projection's [n, H+G, Hd]), k and v [G, S, Hd]
    views of a cache (fp32, bf16 or fp16, the same strides), the n queries at key positions
    q0..q0+n-1 (S = q0 + n), each seeing the keys at or before it (within `window` of it) ->
    [n, H * Hd] fp32, or None (use torch)."""
    L = native.lib()
    n, H, Hd = q.shape
    G, S = k.shape[0], k.shape[1]
    if (L is None or n < MIN_TOKENS or q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != Hd
            or k.dtype not in native.FMT or v.dtype != k.dtype or v.shape != k.shape or k.stride() != v.stride()
            or k.stride(2) != 1 or S != q0 + n or q.device.type != "cpu" or k.device.type != "cpu"):
        return None
    out = torch.empty(n, H * Hd, dtype=torch.float32)
    rc = L.mdk_flash(q.data_ptr(), q.stride(0), H, G, Hd, n, q0, window or 0,
                     Hd ** -0.5 if scale is None else scale, k.data_ptr(), v.data_ptr(), native.FMT[k.dtype],
                     k.stride(0), k.stride(1), out.data_ptr(), out.stride(0), int(bf16_values), native.threads())
    return out if rc == 0 else None
