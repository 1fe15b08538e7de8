"""One expert materialised in one tier, from the checkpoint.

Shapes: D hidden, I ffn, T tokens. An expert is SwiGLU: w2 @ (silu(w1 @ x) * (w3 @ x)).
w1 and w3 are stored fused as w13 [2I, D] (gate rows first), so one matmul serves both.
The 16-bit source of truth stays in the checkpoint; a tier holds only its own copy.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import native
from ..native import choice
from ..files.gguf.blockquant import BlockQuant
from ..files.checkpoint import Checkpoint, expert_key
from ..protocol.errors import ModelError
from ..files import fused_experts as fused
from ..native.dense_linear import linear, weight_problem
from ..placement import LOW_TIERS, Tier
from .quant import NF4, MX4Native, Q4Native, cpu4_format, cpu4_quantize, cpu_tier_quantize, cpu_tier_quantize_steps

CPU = torch.device("cpu")
ACTS = {"silu": 0, "swiglu_oai": 1, "gelu_tanh": 2}  # the native kernel's codes (mdk.h)


@dataclass(frozen=True)
class Glu:
    """What a family adds to the plain SwiGLU expert (GPT-OSS): fp32 biases on gate/up (b13 [2I],
    gate half first) and on down (b2 [D]), and its activation: "silu", "gelu_tanh" (Gemma's GeGLU,
    gelu(gate, tanh approximation) * up), or "swiglu_oai",
    (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with g = min(gate, limit)."""

    b13: torch.Tensor | None = None
    b2: torch.Tensor | None = None
    act: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def to(self, device: torch.device) -> "Glu":
        move = lambda t: None if t is None else t.to(device, non_blocking=device.type == "cuda")
        return Glu(move(self.b13), move(self.b2), self.act, self.alpha, self.limit)

    def apply(self, h: torch.Tensor, ffn: int) -> torch.Tensor:
        """h [T, 2I] = x @ w13.T -> the activation [T, I] that down multiplies."""
        if self.b13 is not None:
            h = h + self.b13.to(h.dtype)
        gate, up = h.split(ffn, dim=-1)
        if self.act == "silu":
            return F.silu(gate) * up
        if self.act == "gelu_tanh":  # Gemma's GeGLU
            return F.gelu(gate, approximate="tanh") * up
        g = gate.clamp(max=self.limit)
        return (up.clamp(-self.limit, self.limit) + 1) * (g * torch.sigmoid(g * self.alpha))

    def down(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.b2 is None else y + self.b2.to(y.dtype)

    def fill(self, desc) -> None:
        """Point a native expert descriptor at the biases and name the activation."""
        desc.b13 = self.b13.data_ptr() if self.b13 is not None else None
        desc.b2 = self.b2.data_ptr() if self.b2 is not None else None
        desc.act, desc.alpha, desc.limit = ACTS[self.act], self.alpha, self.limit


class Expert16:
    """A 16-bit (or fp32, for parity tests) expert on one device."""

    copyable = True  # the prefill may copy it to the accelerator for one batch

    def __init__(self, tier: Tier, w13: torch.Tensor, w2: torch.Tensor, glu: Glu | None = None):
        self.tier = tier
        self.w13 = w13  # [2I, D]
        self.w2 = w2  # [D, I]
        self.glu = glu
        self.ffn = w2.shape[1]
        self.desc = _desc(w13, w2, glu)  # the native kernel's view, when it runs this expert

    @property
    def device(self) -> torch.device:
        return self.w13.device

    @property
    def nbytes(self) -> int:
        return self.w13.numel() * self.w13.element_size() + self.w2.numel() * self.w2.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, D] -> [T, D]
        if self.desc is not None:
            return run_native(self, x)
        h = linear(x, self.w13)  # [T, 2I]
        if self.glu is not None:
            return self.glu.down(linear(self.glu.apply(h, self.ffn), self.w2))
        gate, up = h.split(self.ffn, dim=-1)  # [T, I] each
        return linear(F.silu(gate) * up, self.w2)  # [T, D]

    def __deepcopy__(self, memo) -> "Expert16":  # new memory, and a descriptor pointing at it
        return Expert16(self.tier, self.w13.clone(), self.w2.clone(), self.glu)

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> "Expert16":
        """A temporary copy on another device (the prefill 'copy the weights over' path), in its own
        dtype (`dtype` is for QuantExpert.to's sake)."""
        nb = device.type == "cuda"
        return Expert16(self.tier, self.w13.to(device, non_blocking=nb), self.w2.to(device, non_blocking=nb),
                        self.glu.to(device) if self.glu is not None else None)


class QuantExpert:
    """A 4-bit expert: w13 and w2 in one of the formats of `quant`, or a GGUF file's own blocks."""

    def __init__(self, tier: Tier, w13, w2, device: torch.device, glu: Glu | None = None):
        self.tier = tier
        self.w13, self.w2 = w13, w2
        self.glu = glu.to(device) if glu is not None else None
        self.ffn = w2.shape[1]
        self._device = device
        self.desc = None
        if isinstance(w13, (Q4Native, BlockQuant)) and isinstance(w2, (Q4Native, BlockQuant)):  # native tiles
            self.desc = native.ExpertDesc(w13.desc, w2.desc)
            if self.glu is not None:
                self.glu.fill(self.desc)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def nbytes(self) -> int:
        return self.w13.nbytes + self.w2.nbytes

    @property
    def copyable(self) -> bool:
        """The prefill may copy it to the accelerator for one batch (Fiddler's prefill rule, decided by
        offload.copy_wins on its bytes): where w13 and w2 are a GGUF file's own rows in a format
        engine/files/gguf/torch_dequant.py expands. Those rows cross as they are (Q4_K: 4.5 bits a weight)."""
        from ..files.gguf.torch_dequant import supported

        return all(isinstance(w, BlockQuant) and w.file_rows is not None and supported(w.qtype)
                   for w in (self.w13, self.w2))

    def to(self, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Expert16:
        """A temporary 16-bit copy on another device (the prefill's 'copy the weights over' path): the
        file's rows copied there and dequantised there, in `dtype` (the model's)."""
        from ..files.gguf.torch_dequant import dequantize  # the module, not engine.files.gguf's package (an import cycle)

        nb = device.type == "cuda"

        def there(w: BlockQuant) -> torch.Tensor:
            k = w.shape[1]
            parts = [dequantize(r.to(device, non_blocking=nb), w.qtype, k) for r in w.file_rows]
            return (parts[0] if len(parts) == 1 else torch.cat(parts)).to(dtype)  # gate's rows, then up's

        return Expert16(self.tier, there(self.w13), there(self.w2),
                        self.glu.to(device) if self.glu is not None else None)

    def __deepcopy__(self, memo) -> "QuantExpert":
        import copy

        return QuantExpert(self.tier, copy.deepcopy(self.w13, memo), copy.deepcopy(self.w2, memo), self._device,
                           self.glu)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, D] -> [T, D]
        if self.desc is not None:
            return run_native(self, x)
        h = self.w13.matmul(x)  # [T, 2I]
        if self.glu is not None:
            return self.glu.down(self.w2.matmul(self.glu.apply(h, self.ffn).contiguous()))
        gate, up = h.split(self.ffn, dim=-1)
        return self.w2.matmul((F.silu(gate) * up).contiguous())  # [T, D]


class MappedExpert16(Expert16):
    """A cpu-16 expert whose weights are the checkpoint's own 16-bit tensors where its file is mapped
    (w1, w3, w2: no copy, file-backed pages), run by the native kernels: gate's and up's rows are two
    places in the file, one w13 to the kernel (mdk.h's w_hi). `w13` as one tensor is built only
    where something asks for it (a copy to another device)."""

    mapped = True

    def __init__(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor):
        self.tier, self.w1, self.w3, self.w2, self.glu = Tier.CPU16, w1, w3, w2, None
        self.ffn = w2.shape[1]
        fmt = native.FMT[w1.dtype]
        self.desc = native.ExpertDesc(
            native.Matrix(fmt, 2 * w1.shape[0], w1.shape[1], w1.data_ptr(), None, None, 0, w3.data_ptr(), w1.shape[0]),
            native.matrix(w2))

    @property
    def w13(self) -> torch.Tensor:  # a copy: only for a move to another device
        return torch.cat([self.w1, self.w3])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.w3, self.w2))

    def __deepcopy__(self, memo) -> "MappedExpert16":  # the file's pages are read-only: shared
        return MappedExpert16(self.w1, self.w3, self.w2)


def mapped_form(ckpt, layer: int, expert: int, dtype: torch.dtype) -> MappedExpert16 | None:
    """cpu-16 from the mapped checkpoint file, where that is possible: the native kernels, a
    checkpoint stored in `dtype` (no conversion), one tensor per weight (not a fused layer tensor),
    no biases (engine/files/mapped.py serving says whether mapping is on)."""
    from ..files import mapped

    d = ckpt.dims
    if (not mapped.serving() or not hasattr(ckpt, "view") or d.adapter.fused_experts or d.adapter.expert_bias
            or d.act != "silu" or ckpt.dtype != dtype or dtype not in (torch.bfloat16, torch.float16)):
        return None
    w1, w3, w2 = (ckpt.view(expert_key(layer, expert, w, d)) for w in ("w1", "w3", "w2"))
    if not all(t.is_contiguous() for t in (w1, w3, w2)):
        return None
    return MappedExpert16(w1, w3, w2)


def _desc(w13: torch.Tensor, w2: torch.Tensor, glu: Glu | None = None) -> "native.ExpertDesc | None":
    """The native kernel's descriptor of a host expert, or None where torch runs it."""
    if not choice.expert(w13, w2):
        return None
    desc = native.ExpertDesc(native.matrix(w13), native.matrix(w2))
    if glu is not None:
        glu.fill(desc)
    return desc


def run_jobs(jobs: list, x: torch.Tensor, token: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Native experts in one call: jobs are (expert, slot start, count); token and weight [slots]
    give each slot's row of x [T, D] and its route weight. Returns sum over slots of weight x
    expert(row), [T, D] in x's dtype."""
    x = x.contiguous()
    toks = torch.cat([token[a:a + c] for _, a, c in jobs]).to(torch.int32)
    rws = torch.cat([weight[a:a + c] for _, a, c in jobs]).float()
    counts = [0]
    for _, _, c in jobs:
        counts.append(counts[-1] + c)
    offs = torch.tensor(counts, dtype=torch.int32)
    arr = (ctypes.c_void_p * len(jobs))(*[ctypes.addressof(ex.desc) for ex, _, _ in jobs])
    out = torch.empty_like(x)
    fmt = native.FMT[x.dtype]
    if native.lib().mdk_experts(arr, len(jobs), offs.data_ptr(), toks.data_ptr(), rws.data_ptr(), x.data_ptr(),
                                fmt, x.shape[0], out.data_ptr(), fmt, native.threads()):
        raise MemoryError("native experts: out of memory for scratch buffers")
    return out


def run_native(ex, x: torch.Tensor) -> torch.Tensor:
    """One expert on every row of x [T, D] with weight 1, in one native call."""
    T = x.shape[0]
    return run_jobs([(ex, 0, T)], x, torch.arange(T), torch.ones(T))


def quantise(tier: Tier, w13: torch.Tensor, w2: torch.Tensor, accel: torch.device,
             dtype: torch.dtype, threads: int | None = None, glu: Glu | None = None) -> QuantExpert:
    """The 4-bit form of a 16-bit expert for `tier` (cpu-4: the native Q4 kernel, or torch int4 without it;
    gpu-4: NF4), or its 3- or 2-bit form (cpu-3, cpu-2: Q3_K, Q2_K; engine/experts/quant.py cpu_tier_quantize)."""
    if tier == Tier.CPU4:
        return QuantExpert(tier, cpu4_quantize(w13, threads), cpu4_quantize(w2, threads), CPU, glu)
    if tier in LOW_TIERS:
        return QuantExpert(tier, cpu_tier_quantize(w13, tier.bits, threads), cpu_tier_quantize(w2, tier.bits, threads),
                           CPU, glu)
    if tier == Tier.GPU4:
        return QuantExpert(tier, NF4.quantize(w13, accel, dtype), NF4.quantize(w2, accel, dtype), accel, glu)
    raise ValueError(f"{tier} is not a 4-bit tier")


def mxfp4_form(ckpt: Checkpoint, layer: int, expert: int, glu: Glu | None) -> QuantExpert | None:
    """cpu-4 of an MXFP4 checkpoint's expert: its released blocks in the Q4 kernel's tiles, exact
    (quant.MX4Native); None where a scale is out of the tiles' range (then it is rounded to Q4)."""
    (b13, s13), (b2, s2) = fused.read_mxfp4(ckpt, layer, expert)
    w13, w2 = MX4Native.pack(b13, s13), MX4Native.pack(b2, s2)
    return QuantExpert(Tier.CPU4, w13, w2, CPU, glu) if w13 is not None and w2 is not None else None


def read_glu(ckpt: Checkpoint, layer: int, expert: int) -> Glu | None:
    """The expert's biases and activation, for the families that have them (GPT-OSS); else None."""
    d = ckpt.dims
    if d.act == "silu" and not d.adapter.expert_bias:
        return None
    b13 = b2 = None
    if d.adapter.expert_bias:
        b13, b2 = fused.read_biases(ckpt, layer, expert)
    return Glu(b13, b2, d.act, *d.swiglu)


def read_expert(ckpt: Checkpoint, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert's weights at checkpoint precision in host memory: w13 [2I, D], w2 [D, I].
    w1 and w3 are read straight into the two halves of w13, with no intermediate copy. A family
    whose layer fuses its experts (GPT-OSS) is read by engine/files/fused_experts.py."""
    d = ckpt.dims
    if d.adapter.fused_experts:
        return fused.read_weights(ckpt, layer, expert)
    w13 = torch.empty(2 * d.ffn, d.hidden, dtype=ckpt.dtype)
    ckpt.read(expert_key(layer, expert, "w1", d), out=w13[: d.ffn])
    ckpt.read(expert_key(layer, expert, "w3", d), out=w13[d.ffn:])
    w2 = ckpt.read(expert_key(layer, expert, "w2", d))
    return w13, w2


def build_steps(ckpt: Checkpoint, layer: int, expert: int, tier: Tier, accel: torch.device, dtype: torch.dtype,
                threads: int | None = None):
    """A safetensors checkpoint's expert (build.py: any checkpoint's) built in tier, as a generator: it yields between short steps (a read, a check, a slice of
    quantisation) and returns the form, so a build can be spread between decode steps."""
    if tier == Tier.CPU16:
        form = mapped_form(ckpt, layer, expert, dtype)
        if form is not None:
            return form
    w13, w2 = read_expert(ckpt, layer, expert)
    glu = read_glu(ckpt, layer, expert)
    yield
    for w, names in ((w13, ("w1", "w3")), (w2, ("w2",))):
        why = weight_problem(w, dtype if tier.bits == 16 else torch.float32)
        if why:
            key = expert_key(layer, expert, names[0], ckpt.dims)
            where = ckpt.where.get(key) or ckpt.where[key + "_blocks"]  # MXFP4: the blocks hold the weight
            raise ModelError(where.path, f"expert {expert} of layer {layer} ({key}) {why}")
    if tier == Tier.CPU4 and ckpt.mxfp4 and cpu4_format() is Q4Native:
        mx = mxfp4_form(ckpt, layer, expert, glu)
        if mx is not None:
            return mx
    if not tier.on_accelerator and tier.bits < 16 and cpu4_format() is Q4Native and threads != 1:
        yield
        q13 = yield from cpu_tier_quantize_steps(w13, tier.bits)
        q2 = yield from cpu_tier_quantize_steps(w2, tier.bits)
        return QuantExpert(tier, q13, q2, CPU, glu)
    if tier.bits < 16:
        return quantise(tier, w13, w2, accel, dtype, threads, glu)
    device = accel if tier.on_accelerator else torch.device("cpu")
    return Expert16(tier, w13.to(device=device, dtype=dtype), w2.to(device=device, dtype=dtype),
                    glu.to(device) if glu is not None else None)
