"""Experts fused per layer (GPT-OSS): one expert read out of its layer's tensors into the engine's
layout, from 16-bit tensors or from MXFP4 blocks and scales, without reading the rest of the layer.

Checkpoint layouts (E experts, D hidden, I ffn):
- 16-bit, as transformers writes it: gate_up_proj [E, D, 2I] (applied as x @ W, gate and up
  interleaved along the last axis: column 2i is gate i, column 2i+1 up i), gate_up_proj_bias
  [E, 2I] (interleaved alike), down_proj [E, I, D], down_proj_bias [E, D].
- MXFP4, as OpenAI released gpt-oss: gate_up_proj_blocks [E, 2I, D/32, 16] uint8 (two 4-bit E2M1
  values a byte, the low nibble first; rows interleaved gate/up) with gate_up_proj_scales
  [E, 2I, D/32] uint8 (the block's power of two, 2^(s - 127)); down_proj_blocks [E, D, I/32, 16] and
  down_proj_scales [E, D, I/32]. The biases stay 16-bit.
The engine's layout: w13 [2I, D] gate rows then up rows, w2 [D, I], and fp32 biases b13 [2I], b2 [D].

MXFP4 values are E2M1 numbers times a power of two, so bf16 (8 exponent bits, 1 mantissa bit
needed) holds each one exactly: the 16-bit tiers run the released weights unchanged. fp16 would
flush the smallest blocks' values (scales below 2^-14) towards zero, so MXFP4 is dequantised to
bf16 whatever the model's dtype, and the tier converts from there. cpu-4 runs the released blocks
as they are (quant.MX4Native: the Q4 kernel reads each nibble through a table), exact and
without a 16-bit detour. gpu-4 quantises the exact values into NF4: a second rounding, measured
in tests/test_gpt_oss.py.
"""
from __future__ import annotations

import torch

# E2M1: the 16 values one MXFP4 nibble stands for (sign bit, 2 exponent bits, 1 mantissa bit)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_LUT = torch.tensor(E2M1, dtype=torch.float32)


def mxfp4_to_float(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """blocks [R, G, 16] uint8 and scales [R, G] uint8 -> the weight [R, 32 G] in dtype (exact in bf16)."""
    R, G, _ = blocks.shape
    out = torch.empty(R, G, 32, dtype=torch.float32)
    out[..., 0::2] = _LUT[(blocks & 0x0F).long()]
    out[..., 1::2] = _LUT[(blocks >> 4).long()]
    out = torch.ldexp(out, scales.to(torch.int32).unsqueeze(-1) - 127)
    return out.reshape(R, G * 32).to(dtype)


def float_to_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, K] float (K a multiple of 32) -> (blocks [R, K/32, 16], scales [R, K/32]) uint8: each
    block's scale is the power of two that brings its largest magnitude to at most 6, and each value
    the nearest E2M1 number. For tests and tiny checkpoints: releases ship already quantised."""
    R, K = w.shape
    wb = w.float().reshape(R, K // 32, 32)
    amax = wb.abs().amax(-1).clamp(min=2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127).to(torch.int32)  # amax / 2^e <= 6
    scaled = torch.ldexp(wb, -e.unsqueeze(-1))
    mags = _LUT[:8]
    code = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(-1)  # nearest magnitude, 0..7
    code = code | ((scaled < 0).long() << 3)
    code = code.to(torch.uint8).reshape(R, K // 32, 16, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)
    return blocks.contiguous(), (e + 127).to(torch.uint8)


def _prefix(ckpt, layer: int) -> str:
    return f"model.layers.{layer}.{ckpt.dims.adapter.moe}.experts."


def _halves(t: torch.Tensor) -> torch.Tensor:
    """Rows (or values) interleaved gate/up -> gate rows first, then up rows (a new contiguous tensor)."""
    return torch.cat([t[0::2], t[1::2]])


def read_weights(ckpt, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert `expert` of `layer`: w13 [2I, D] (gate rows, then up rows) and w2 [D, I], in ckpt.dtype."""
    p = _prefix(ckpt, layer)
    if ckpt.mxfp4:
        def weight(name):
            b = ckpt.read_rows(p + name + "_blocks", expert, 1)[0]
            return mxfp4_to_float(b, ckpt.read_rows(p + name + "_scales", expert, 1)[0], ckpt.dtype)
        return _halves(weight("gate_up_proj")), weight("down_proj")
    gate_up = ckpt.read_rows(p + "gate_up_proj", expert, 1)[0]  # [D, 2I]
    return _halves(gate_up.t()), ckpt.read_rows(p + "down_proj", expert, 1)[0].t().contiguous()


def read_mxfp4(ckpt, layer: int, expert: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """An MXFP4 expert as released, rows in the engine's order: (blocks, scales) of w13 [2I, D/32, 16]
    / [2I, D/32] (gate rows, then up rows) and of w2 [D, I/32, 16] / [D, I/32], uint8."""
    p = _prefix(ckpt, layer)

    def part(name):
        return (ckpt.read_rows(p + name + "_blocks", expert, 1)[0], ckpt.read_rows(p + name + "_scales", expert, 1)[0])
    (b13, s13), w2 = part("gate_up_proj"), part("down_proj")
    return (_halves(b13), _halves(s13)), w2


def read_biases(ckpt, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert's biases in fp32: b13 [2I] (gate half first) and b2 [D]."""
    p = _prefix(ckpt, layer)
    b13 = ckpt.read_rows(p + "gate_up_proj_bias", expert, 1)[0]
    return _halves(b13).float(), ckpt.read_rows(p + "down_proj_bias", expert, 1)[0].float()


def shapes(d, mxfp4: bool) -> dict[str, tuple[int, ...]]:
    """Every fused expert tensor of the checkpoint, with its shape."""
    s = {}
    E, D, I = d.experts, d.hidden, d.ffn
    for l in range(d.layers):
        p = f"model.layers.{l}.{d.adapter.moe}.experts."
        if mxfp4:
            s[p + "gate_up_proj_blocks"], s[p + "gate_up_proj_scales"] = (E, 2 * I, D // 32, 16), (E, 2 * I, D // 32)
            s[p + "down_proj_blocks"], s[p + "down_proj_scales"] = (E, D, I // 32, 16), (E, D, I // 32)
        else:
            s[p + "gate_up_proj"], s[p + "down_proj"] = (E, D, 2 * I), (E, I, D)
        s[p + "gate_up_proj_bias"], s[p + "down_proj_bias"] = (E, 2 * I), (E, D)
    return s


# ---- experts fused per layer, gate rows then up rows (transformers' in-memory layout) ----
# Qwen3.5-MoE, Qwen3-Next, GLM-4.5 and others may ship (or be saved with) each layer's experts as
# two 3-D tensors: experts.gate_up_proj [E, 2I, D] (expert e's gate rows, then its up rows) and
# experts.down_proj [E, D, I]. Expert e's gate, up and down are then contiguous byte ranges of the
# file, so the checkpoint names them as the per-expert tensors they are: no copy, and the mapped
# tiers serve them from the file as for a per-expert checkpoint.
_ELEMENT = {"BF16": 2, "F16": 2, "F32": 4}


def split_fused(tensors: dict, family) -> dict:
    """tensors (name -> safetensors TensorInfo) with every 3-D gate_up_proj / down_proj of the family's
    MoE blocks replaced by per-expert entries under the family's own per-expert names."""
    import re

    from .safetensors_file import TensorInfo

    inner = re.escape(family.moe + ".") if family.moe else ""
    fused = re.compile(r"^model\.layers\.(\d+)\." + inner + r"experts\.(gate_up_proj|down_proj)$")
    out = {}
    for name, info in tensors.items():
        m = fused.match(name)
        if not m or len(info.shape) != 3 or info.dtype not in _ELEMENT:
            out[name] = info
            continue
        layer, E, rows, cols = int(m[1]), *info.shape
        size = rows * cols * _ELEMENT[info.dtype]
        if m[2] == "down_proj":
            parts = (("w2", 0, rows),)
        elif rows % 2 == 0:
            parts = (("w1", 0, rows // 2), ("w3", rows // 2, rows // 2))
        else:
            out[name] = info  # not gate and up halves: left as it is (the shape check names it)
            continue
        row = cols * _ELEMENT[info.dtype]
        for e in range(E):
            for w, first, n in parts:
                start = info.start + e * size + first * row
                out[family.expert_key(layer, e, w)] = TensorInfo(info.dtype, (n, cols), start, start + n * row)
    return out
