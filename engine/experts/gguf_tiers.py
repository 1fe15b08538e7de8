"""What each tier holds of one expert of a GGUF file.

A GGUF file is the source of truth, as a 16-bit checkpoint is for safetensors, but its experts are
already quantised, and quantising them again would round twice. So the tiers mean, per expert:
- cpu-16 ("the file's precision on the CPU"): the file's own blocks, where the file is mapped
  (the native kernels run its row layout: no copy, file-backed memory; engine/files/gguf/blockquant.py), no
  second rounding; F16/BF16/F32 experts as 16-bit tensors. At
  fp32, the reference precision, and without the native library: the exact dequantisation.
- cpu-4: per matrix, the file's blocks where they are 4-bit or fewer already (Q4_K, Q4_0, Q4_1, MXFP4,
  IQ4_XS/NL, Q3_K, Q2_K, the 1-3 bit i-quants: they cannot rise or fall), and the exact dequantisation re-quantised to the cpu-4 format
  (engine/experts/quant.py cpu4_quantize) where the file holds more (Q5_*, Q6_K, Q8_0, F16, BF16, F32): a
  Q4_K_M file's Q4_K gate/up stay, its Q6_K down matrices drop to Q4_K.
- cpu-3, cpu-2: likewise at 3 and 2 bits: the file's blocks where they hold that many bits or fewer
  (a Q3_K_M file's Q3_K matrices at cpu-3; IQ2_XXS at both), and the exact dequantisation re-quantised
  to Q3_K / Q2_K (engine/experts/quant.py cpu_tier_quantize) where it holds more. A tier that holds no fewer
  bytes than the one above it offers nothing and is not planned (engine/measures/inputs.py).
- gpu-16: the exact dequantisation in the model's dtype (no K-quant kernel runs on the GPU).
- gpu-4: NF4 of the exact dequantisation: a second rounding on top of the file's, bounded in
  tests/test_gguf_model.py.
Every form is re-derived from the file when an expert moves, so 16 -> 4 -> 16 is bit-identical.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as GT

from .. import native
from ..files.gguf.blockquant import NATIVE, BlockQuant
from ..placement import Tier

CPU = torch.device("cpu")
FLOAT_TYPES = (GT.F32, GT.F16, GT.BF16)
# the formats at 4 bits a weight or fewer: a 4-bit tier keeps them as they are (they cannot fall further
# without a second rounding, and a tier above the file's precision is never made of them)
AT_MOST_4_BITS = (GT.Q4_K, GT.Q4_0, GT.Q4_1, GT.MXFP4, GT.IQ4_NL, GT.IQ4_XS, GT.Q3_K, GT.Q2_K, GT.IQ3_S,
                  GT.IQ3_XXS, GT.IQ2_S, GT.IQ2_XS, GT.IQ2_XXS, GT.IQ1_M, GT.IQ1_S, GT.TQ1_0, GT.TQ2_0, GT.NVFP4)


BITS = {GT.Q3_K: 3, GT.IQ3_S: 3, GT.IQ3_XXS: 3, GT.Q2_K: 2, GT.IQ2_S: 2, GT.IQ2_XS: 2, GT.IQ2_XXS: 2,
        GT.TQ2_0: 2, GT.IQ1_M: 1, GT.IQ1_S: 1, GT.TQ1_0: 1}


def qtype_bits(qtype) -> int:
    """The bits a weight of qtype counts as for the tiers: 4 for the 4-bit formats, 3 and 2 for the
    3- and 2-bit K- and i-quants, 1 for the 1-bit ones; more than 4 (5, 6, 8, 16, 32) for the rest."""
    qtype = GT(qtype)
    if qtype in BITS:
        return BITS[qtype]
    if qtype in AT_MOST_4_BITS:
        return 4
    return {GT.F32: 32, GT.F16: 16, GT.BF16: 16}.get(qtype, 8 if "8" in qtype.name else (6 if "6" in qtype.name else 5))


def at_most_bits(qtype, bits: int) -> bool:
    return qtype_bits(qtype) <= bits


def at_most_four_bits(qtype) -> bool:
    return GT(qtype) in AT_MOST_4_BITS


def _block_form(qtype, parts: list[torch.Tensor], shape: tuple[int, int]):
    """The file's rows (one view, or gate's and up's) as a BlockQuant the native kernels run: on the
    mapped file itself where they run its layout (BlockQuant.from_file), else repacked into tiles."""
    try:
        return BlockQuant.from_file(qtype, parts, shape) if qtype in NATIVE else None
    except ValueError:
        return None


def file_form(ckpt, layer: int, expert: int, tier: Tier, dtype: torch.dtype, glu, max_bits: int | None = None):
    """The expert in the file's own format on the CPU (tier cpu-16; and cpu-4/3/2, where each matrix the
    file holds at more than max_bits is re-quantised to that tier), or None where the native kernel
    cannot run it (then the caller uses the exact dequantisation). A generator: it yields between the
    slices of a re-quantisation (a decode step may run between them) and returns the form."""
    from .expert import QuantExpert
    from .quant import MX4Native, cpu_tier_quantize_steps

    if not native.available():
        return None
    (tg, gate), (tu, up), (td, down) = (ckpt.expert_view(layer, expert, w) for w in ("w1", "w3", "w2"))
    if tg == tu == td == GT.MXFP4 and max_bits in (None, 4):  # (repacked from a copy: no kernel on the file's layout yet)
        (b13, s13), (b2, s2) = ckpt.expert_mxfp4(layer, expert)
        w13, w2 = MX4Native.pack(b13, s13), MX4Native.pack(b2, s2)
        return QuantExpert(tier, w13, w2, CPU, glu) if w13 is not None and w2 is not None else None
    d = ckpt.dims

    def keeps(qtype) -> bool:
        return max_bits is None or at_most_bits(qtype, max_bits)

    def requantised(which: int):  # only the matrix that drops is dequantised
        w = ckpt.expert_part_float(layer, expert, which)
        yield
        return (yield from cpu_tier_quantize_steps(w, max_bits))

    if tg == tu and keeps(tg):
        w13 = _block_form(tg, [gate, up], (2 * d.ffn, d.hidden))
    else:  # gate and up cannot share one w13 matrix in two formats; or they drop
        w13 = (yield from requantised(0)) if max_bits is not None else None
    w2 = _block_form(td, [down], (d.hidden, d.ffn)) if keeps(td) else (yield from requantised(1))
    if w13 is None or w2 is None:
        return None
    return QuantExpert(tier, w13, w2, CPU, glu)


def expert_qtypes(ckpt) -> set:
    """The GGUF types of the file's expert matrices (gate, up and down of every layer)."""
    return set(ckpt.expert_formats())


def requantised_share(ckpt, bits: int = 4) -> float:
    """The share of the experts' weights that the CPU tier of `bits` re-quantises (those the file
    holds at more bits): at 4, 0 for a Q4_0 file, about 1/3 for a Q4_K_M file (its Q6_K down
    matrices), 1 for Q8_0; at 3 or 2, 1 for a Q4_K_M file."""
    d = ckpt.dims
    more = total = 0
    for layer in range(d.layers):
        for w in ("w1", "w3", "w2"):
            total += 1
            more += not at_most_bits(ckpt.expert_raw_info(layer, 0, w).qtype, bits)
    return more / total if total else 0.0


def requantised_from(ckpt) -> str:
    """In words, the file's precision of the expert matrices that a 4-bit tier re-quantises (those
    held at more than 4 bits): "8-bit" for a Q8_0 file, "6-bit" for a Q4_K_M file's Q6_K down
    matrices, "16-bit" for F16; "" when every one is 4-bit already."""
    import re

    bits = set()
    for t in expert_qtypes(ckpt):
        m = re.search(r"\d+", GT(t).name)
        if not at_most_four_bits(t) and m and int(m[0]) > 4:
            bits.add(int(m[0]))
    return " and ".join(f"{b}-bit" for b in sorted(bits))


def cpu4_is_file_form(ckpt) -> bool:
    """Whether cpu-4 holds the file's own blocks (4-bit experts) rather than a re-quantisation."""
    return all(at_most_four_bits(t) for t in expert_qtypes(ckpt))


def keeps_file_form(ckpt, layer: int, dtype: torch.dtype, bits: int = 4) -> bool:
    """Whether the CPU tier of `bits` holds the same numbers as cpu-16 for this layer's experts
    (build_steps): its gate, up and down hold that many bits or fewer in the file, so both tiers are
    the file's own blocks (one format for gate and up, which the native kernels run), or both the
    exact dequantisation (fp32, or no native library, in a file whose experts all hold that few)."""
    types = [ckpt.expert_raw_info(layer, 0, w).qtype for w in ("w1", "w3", "w2")]
    if not all(at_most_bits(t, bits) for t in types):
        return False
    if dtype != torch.float32 and native.available():
        mx = all(GT(t) == GT.MXFP4 for t in types)
        return mx or (types[0] == types[1] and all(GT(t) in NATIVE for t in types))
    return all(at_most_bits(t, bits) for t in expert_qtypes(ckpt))


def cpu4_keeps_file_form(ckpt, layer: int, dtype: torch.dtype) -> bool:
    return keeps_file_form(ckpt, layer, dtype, 4)


def tier_nbytes(ckpt) -> dict[str, int]:
    """Bytes of one expert on the CPU, averaged over the layers (a Q4_K_M file's down matrices are
    Q6_K in some layers and Q4_K in others), in cpu-16 (the file's own) and cpu-4, cpu-3, cpu-2."""
    from .quant import cpu_tier_nbytes

    d = ckpt.dims
    shapes = {"w1": (d.ffn, d.hidden), "w3": (d.ffn, d.hidden), "w2": (d.hidden, d.ffn)}
    out = {"cpu-16": 0, "cpu-4": 0, "cpu-3": 0, "cpu-2": 0}
    for layer in range(d.layers):
        for w, (n, k) in shapes.items():
            t = ckpt.expert_raw_info(layer, 0, w)
            b = n * t.row_bytes
            out["cpu-16"] += b
            for bits in (4, 3, 2):
                out[f"cpu-{bits}"] += b if at_most_bits(t.qtype, bits) else cpu_tier_nbytes(n, k, bits)
    return {t: v // max(d.layers, 1) for t, v in out.items()}


def mapped_nbytes(ckpt) -> dict[str, int]:
    """Of tier_nbytes, the bytes served from the mapped file (its blocks the native kernels run as
    they are: every block matrix at cpu-16; those of at most a tier's bits at cpu-4/3/2), averaged
    over the layers."""
    d = ckpt.dims
    out = {"cpu-16": 0, "cpu-4": 0, "cpu-3": 0, "cpu-2": 0}
    for layer in range(d.layers):
        for w, n in (("w1", d.ffn), ("w3", d.ffn), ("w2", d.hidden)):
            t = ckpt.expert_raw_info(layer, 0, w)
            if GT(t.qtype) in NATIVE:
                out["cpu-16"] += n * t.row_bytes
                for bits in (4, 3, 2):
                    out[f"cpu-{bits}"] += n * t.row_bytes if at_most_bits(t.qtype, bits) else 0
    return {t: v // max(d.layers, 1) for t, v in out.items()}


def build_steps(ckpt, layer: int, expert: int, tier: Tier, accel: torch.device, dtype: torch.dtype,
                threads: int | None = None):
    """build.build_steps for a GGUF checkpoint: yields between short steps, returns the form.
    At fp32 (the reference precision: parity tests, `eval --dtype fp32`) and without the native
    library every CPU tier holds the exact dequantisation instead of the file's blocks."""
    from .expert import Expert16, quantise, read_glu

    glu = read_glu(ckpt, layer, expert)
    yield
    if not tier.on_accelerator and dtype != torch.float32:
        form = yield from file_form(ckpt, layer, expert, tier, dtype, glu, max_bits=tier.bits if tier.bits < 16 else None)
        if form is not None:
            return form
    w13, w2 = ckpt.expert_float(layer, expert)  # the exact dequantisation, fp32
    yield
    on_file = not tier.on_accelerator and all(at_most_bits(t, tier.bits) for t in expert_qtypes(ckpt))
    if tier.bits < 16 and not on_file:
        return quantise(tier, w13, w2, accel, dtype, threads, glu)
    device = accel if tier.on_accelerator else CPU
    return Expert16(tier, w13.to(device=device, dtype=dtype), w2.to(device=device, dtype=dtype),
                    glu.to(device) if glu is not None else None)


def bar_fields(ckpt) -> dict:
    """What a GGUF file holds, for the Loaded event's model bar (protocol.Loaded.weights/weights_4bit)."""
    return {"weights": ckpt.format_label(), "weights_4bit": cpu4_is_file_form(ckpt),
            "weights_bits": requantised_from(ckpt)}
