"""What each tier holds of one expert of a GGUF file.

A GGUF file is the source of truth, as a 16-bit checkpoint is for safetensors, but its experts are
already quantised, and quantising them again would round twice. So the tiers mean, per expert:
- cpu-16 ("the file's precision on the CPU"): the file's own blocks, repacked for the native
  kernel (engine/blockquant.py), no second rounding; F16/BF16/F32 experts as 16-bit tensors. At
  fp32, the reference precision, and without the native library: the exact dequantisation.
- cpu-4: the same form where the file's experts are 4-bit already (Q4_K, Q4_0, Q4_1, MXFP4: they
  cannot rise or fall); for a file with more bits (Q5_*, Q6_K, Q8_0, F16, BF16, F32) the exact
  dequantisation re-quantised to the cpu-4 format (engine/quant.py cpu4_quantize).
- gpu-16: the exact dequantisation in the model's dtype (no K-quant kernel runs on the GPU).
- gpu-4: NF4 of the exact dequantisation: a second rounding on top of the file's, bounded in
  tests/test_gguf_model.py.
Every form is re-derived from the file when an expert moves, so 16 -> 4 -> 16 is bit-identical.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as GT

from .. import native
from ..blockquant import NATIVE, BlockQuant
from ..placement import Tier

CPU = torch.device("cpu")
FLOAT_TYPES = (GT.F32, GT.F16, GT.BF16)
FOUR_BIT = (GT.Q4_K, GT.Q4_0, GT.Q4_1, GT.MXFP4)


def is_four_bit(qtype) -> bool:
    return GT(qtype) in FOUR_BIT


def file_form(ckpt, layer: int, expert: int, tier: Tier, dtype: torch.dtype, glu):
    """The expert in the file's own format on the CPU (tiers cpu-16, and cpu-4 of a 4-bit file), or
    None where the native kernel cannot run it (then the caller uses the exact dequantisation)."""
    from ..experts import QuantExpert
    from ..quant import MX4Native

    if not native.available():
        return None
    gate, up, down = (ckpt.expert_raw(layer, expert, w) for w in ("w1", "w3", "w2"))
    if gate[0] == GT.MXFP4 and up[0] == GT.MXFP4 and down[0] == GT.MXFP4:
        (b13, s13), (b2, s2) = ckpt.expert_mxfp4(layer, expert)
        w13, w2 = MX4Native.pack(b13, s13), MX4Native.pack(b2, s2)
        return QuantExpert(tier, w13, w2, CPU, glu) if w13 is not None and w2 is not None else None
    if gate[0] != up[0] or gate[0] not in NATIVE or down[0] not in NATIVE:
        return None  # gate and up in different formats cannot share one w13 matrix: rare, falls back
    d = ckpt.dims
    try:
        w13 = BlockQuant.from_raw(gate[0], torch.cat([gate[1], up[1]]), (2 * d.ffn, d.hidden))
        w2 = BlockQuant.from_raw(down[0], down[1], (d.hidden, d.ffn))
    except ValueError:
        return None
    return QuantExpert(tier, w13, w2, CPU, glu)


def expert_qtypes(ckpt) -> set:
    """The GGUF types of the file's expert matrices (gate, up and down of every layer)."""
    return set(ckpt.expert_formats())


def cpu4_is_file_form(ckpt) -> bool:
    """Whether cpu-4 holds the file's own blocks (4-bit experts) rather than a re-quantisation."""
    return all(is_four_bit(t) for t in expert_qtypes(ckpt))


def build_steps(ckpt, layer: int, expert: int, tier: Tier, accel: torch.device, dtype: torch.dtype,
                threads: int | None = None):
    """experts.build_steps for a GGUF checkpoint: yields between short steps, returns the form.
    At fp32 (the reference precision: parity tests, `eval --dtype fp32`) and without the native
    library every CPU tier holds the exact dequantisation instead of the file's blocks."""
    from ..experts import Expert16, quantise, read_glu

    glu = read_glu(ckpt, layer, expert)
    yield
    same_as_file = tier == Tier.CPU16 or (tier == Tier.CPU4 and cpu4_is_file_form(ckpt))
    if same_as_file and dtype != torch.float32:
        form = file_form(ckpt, layer, expert, tier, dtype, glu)
        if form is not None:
            return form
    w13, w2 = ckpt.expert_float(layer, expert)  # the exact dequantisation, fp32
    yield
    if tier.bits == 4 and not same_as_file:
        return quantise(tier, w13, w2, accel, dtype, threads, glu)
    device = accel if tier.on_accelerator else CPU
    return Expert16(tier, w13.to(device=device, dtype=dtype), w2.to(device=device, dtype=dtype),
                    glu.to(device) if glu is not None else None)
