"""Bytes of one expert in each tier, known before any expert is built (the planner's sizes until
calibration measures the real forms).

16-bit tiers hold D x I x 3 weights at the compute dtype; gpu-4 is NF4 (4 bits + an fp32 absmax per
64: 4.5 bits); cpu-4 is the cpu-4 format's own size for each matrix (engine/experts/quant.py). A GGUF file's
experts are what the file holds on the CPU (engine/experts/gguf_tiers.py): cpu-16 its own bytes, and cpu-4
the same where its experts are 4-bit already; cpu-3 and cpu-2 (Q3_K, Q2_K) likewise.
"""
from __future__ import annotations

import math


def tier_bytes_of_dims(d, itemsize: int) -> dict[str, int]:
    """From the model's shape, for a 16-bit source."""
    from .quant import cpu_tier_nbytes

    n = d.expert_params()
    cpu = {f"cpu-{b}": cpu_tier_nbytes(2 * d.ffn, d.hidden, b) + cpu_tier_nbytes(d.hidden, d.ffn, b) for b in (4, 3, 2)}
    return {"gpu-16": n * itemsize, "cpu-16": n * itemsize, "gpu-4": n * 9 // 16, **cpu}


def mapped_bytes(ckpt, dtype=None, cpu_only: bool = True) -> tuple[dict[str, int], int]:
    """Of one expert's bytes per CPU tier, and of the dense part's (where it is on the CPU), those a
    model serves from its mapped file (file-backed page cache, not memory the process owns): a GGUF
    file's own blocks, below fp32 (fp32, the reference precision, holds dequantisations), when the
    native kernels run the file's layout (engine/files/mapped.py serving). ({}, 0) otherwise."""
    import torch

    from ..files import mapped

    if dtype == torch.float32 or not mapped.serving():
        return {}, 0
    if not ckpt.is_gguf:  # a 16-bit checkpoint's cpu-16 experts (engine/experts/expert.py mapped_form)
        d = ckpt.dims
        same = dtype is None or dtype == ckpt.dtype
        if (not same or not hasattr(ckpt, "view") or d.adapter.fused_experts or d.adapter.expert_bias
                or d.act != "silu" or ckpt.dtype not in (torch.bfloat16, torch.float16)):
            return {}, 0
        size = torch.empty((), dtype=ckpt.dtype).element_size()
        dense = 0
        if cpu_only:  # its embedding, output and o_proj matrices (engine/model/forward.py matrix; q, k, v are stacked: a copy)
            for name, shape in ckpt.expected.items():
                if name.endswith(("embed_tokens.weight", "lm_head.weight", "o_proj.weight")) and ".experts." not in name:
                    dense += math.prod(shape) * size
        return {"cpu-16": d.expert_params() * size}, dense
    from ..files.gguf.blockquant import NATIVE
    from .gguf_tiers import mapped_nbytes as expert_mapped

    dense = 0
    if cpu_only:
        for hf in ckpt.expected.dense:
            if ckpt.tensor_type(hf) in NATIVE and ckpt.raw_view_ok(hf):
                dense += ckpt.info(hf).nbytes
    return expert_mapped(ckpt), dense


def tier_bytes(ckpt, itemsize: int) -> dict[str, int]:
    """For this checkpoint: its shape, and for a GGUF file what its experts hold."""
    sizes = tier_bytes_of_dims(ckpt.dims, itemsize)
    if ckpt.is_gguf:
        from .gguf_tiers import tier_nbytes

        sizes.update(tier_nbytes(ckpt))
    return sizes
