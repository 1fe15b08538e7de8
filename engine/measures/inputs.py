"""Turn measured profiles (or a bare config.json) into the planner's inputs, and budgets from the
machine's memory."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import psutil
import torch

from ..files.checkpoint import dims_from_config, dense_shapes
from ..protocol.errors import ModelError
from .hardware import HardwareProfile
from ..model.forward import MoEModel
from ..planning.planner import Budgets, PlanInputs
from .profile import ASSUMED_SENSITIVITY, ModelProfile, assumed_sensitivity

# Free memory the planner leaves alone: the OS, other programs, activations, the KV cache.
RAM_MARGIN = 0.15
VRAM_MARGIN = 0.10

# A 24 GB consumer GPU (RTX 4090 class) for planning from a config on a machine without one.
# ASSUMED figures, not measurements: ~1 TB/s memory with ~80% reached by 16-bit batch-1 matmuls,
# ~50% by NF4's dequantising kernel, PCIe 4.0 x16. A real run replaces them with measured ones.
REFERENCE_GPU = {"name": "assumed 24 GB GPU (RTX 4090 class)", "total": 24 * 10**9,
                 "gpu-16": (2e-5, 1 / 800e9), "gpu-4": (3e-5, 1 / 500e9), "h2d": 25e9,
                 "layer_overhead_s": 1.5e-4}


def from_profiles(mp: ModelProfile, hw: HardwareProfile, top_k: int, dense_bytes: int,
                  dense_s: float, cpu_only: bool | None = None, dense_prefill_s: float = 0.0) -> PlanInputs:
    share = tuple(tuple(c / max(sum(row), 1) for c in row) for row in mp.popularity)
    costs = {t: tuple(v) for t, v in hw.tier_costs.items()}
    return PlanInputs(mp.layers, mp.experts, top_k, share, mp.sensitivity, mp.expert_bytes, costs,
                      dense_bytes, dense_s, hw.cpu_only if cpu_only is None else cpu_only,
                      hw.batch_scale, dense_prefill_s)


def measure_dense_prefill_s(model: MoEModel, hw: HardwareProfile, tokens: int = 128) -> float:
    """Time per prompt token outside the experts in a prefill: a measured prefill (best of 2) minus
    the modelled time of the expert batches it actually ran. Timed as a prefill runs (recording
    would take the native routed call away), then replayed with recording for the routes."""
    from ..planning.batch_scaling import batch_ratio

    ids = torch.randint(3, model.dims.vocab, (tokens,), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        model.forward(ids, model.new_cache(tokens), 0)
        total = time.perf_counter() - t0
        with model.recording() as records:
            model.forward(ids, model.new_cache(tokens), 0)
        experts_s = 0.0
        for l, (_, idx, _, _) in enumerate(records):
            counts = torch.bincount(idx.reshape(-1).cpu(), minlength=model.dims.experts).tolist()
            for e, n in enumerate(counts):
                if n:
                    ex = model.moe[l].experts[e]
                    fixed, per_byte = hw.tier_costs[ex.tier.value]
                    experts_s += (fixed + per_byte * ex.nbytes) * batch_ratio(hw.batch_scale.get(ex.tier.value), n, ex.nbytes)
        best = min(best, max((total - experts_s) / tokens, 0.0))
    return best


def measure_dense_s(model: MoEModel, hw: HardwareProfile, steps: int = 16, tries: int = 3) -> float:
    """Time per decode step outside the experts: measured steps minus the modelled time of the
    experts those steps actually ran. Best of `tries` runs after a warm-up one: on a shared machine
    a single run was seen 20% off in either direction. The timed steps run as decode runs (with the
    native library, one native call per step, which recording would switch off); the same steps are
    then replayed with recording to learn which experts they routed to."""
    best = float("inf")
    for _ in range(tries + 1):
        cache = model.new_cache(steps + 8)
        model.forward(torch.arange(1, 9), cache, 0)
        t0 = time.perf_counter()
        for i in range(steps):
            model.forward(torch.tensor([100 + i]), cache, 8 + i)
        total = time.perf_counter() - t0
        cache = model.new_cache(steps + 8)
        model.forward(torch.arange(1, 9), cache, 0)
        with model.recording() as records:  # the same steps again: the same routes
            for i in range(steps):
                model.forward(torch.tensor([100 + i]), cache, 8 + i)
        experts_s = 0.0
        for l, (_, idx, _, _) in enumerate(records):
            for e in idx.reshape(-1).tolist():
                ex = model.moe[l % len(model.moe)].experts[e]
                fixed, per_byte = hw.tier_costs[ex.tier.value]
                experts_s += fixed + per_byte * ex.nbytes
        best = min(best, max((total - experts_s) / steps, 0.0))
    return best


def default_budgets(cpu_only: bool, accel: torch.device | None = None, held_ram: int = 0,
                    held_vram: int = 0) -> Budgets:
    ram = int((psutil.virtual_memory().available + held_ram) * (1 - RAM_MARGIN))
    vram = 0
    if not cpu_only and accel is not None and accel.type == "cuda":
        free, _ = torch.cuda.mem_get_info(accel)
        vram = int((free + held_vram) * (1 - VRAM_MARGIN))
    return Budgets(vram=vram, ram=ram)


def dense_bytes_of(d, dtype: torch.dtype) -> int:
    """Bytes of the non-expert weights at the compute dtype (what MoEModel.dense_bytes counts)."""
    return sum(math.prod(s) for s in dense_shapes(d).values()) * torch.empty((), dtype=dtype).element_size()


def from_dims(d, hw: HardwareProfile, itemsize: int = 2, sensitivity: float = ASSUMED_SENSITIVITY,
              gpu_costs: dict | None = None, sizes: dict | None = None, dense_bytes: int | None = None,
              cpu4_share: float = 1.0, low_shares: dict | None = None) -> PlanInputs:
    """Planner inputs from a model's shape alone (no weights read): uniform popularity, one assumed
    sensitivity for every 4-bit expert, this machine's measured tier costs. GPU tiers: gpu_costs
    when given, else the measured ones when this machine has a GPU, else none (CPU-only).
    sizes: bytes of one expert per tier (engine/experts/tier_bytes.py; default: from the shape);
    cpu4_share: the share of an expert's weights cpu-4 re-quantises (a GGUF file's 4-bit matrices stay
    as they are: engine/experts/gguf_tiers.py), which scales its assumed sensitivity; low_shares likewise for
    cpu-3 and cpu-2 (default 1)."""
    from ..experts.tier_bytes import tier_bytes_of_dims

    sizes = sizes or tier_bytes_of_dims(d, itemsize)
    if dense_bytes is None:
        dense_bytes = sum(math.prod(s) for s in dense_shapes(d).values()) * itemsize
    costs = {t: tuple(hw.tier_costs[t]) for t in ("cpu-16", "cpu-4", "cpu-3", "cpu-2") if t in hw.tier_costs}
    gpu = gpu_costs or {t: tuple(hw.tier_costs[t]) for t in ("gpu-16", "gpu-4") if t in hw.tier_costs}
    costs.update(gpu)
    cpu_only = not gpu
    fixed, per_byte = costs["cpu-16" if cpu_only else "gpu-16"]
    dense_s = dense_bytes * per_byte + d.layers * (REFERENCE_GPU["layer_overhead_s"] if not cpu_only else fixed)
    share = tuple(tuple([1.0 / d.experts] * d.experts) for _ in range(d.layers))
    sens = assumed_sensitivity(d.layers, d.experts, sensitivity, {"cpu-4": cpu4_share, **(low_shares or {})})
    scale = {t: hw.batch_scale[t] for t in costs if t in hw.batch_scale}
    return PlanInputs(d.layers, d.experts, d.top_k, share, sens, sizes, costs, dense_bytes, dense_s, cpu_only,
                      scale, dense_s / 8)  # dense prefill per token: ASSUMED 8x cheaper than a decode step


def with_mapping(inp: PlanInputs, ckpt) -> PlanInputs:
    """inp with what ckpt serves from its mapped file (engine/experts/tier_bytes.py mapped_bytes; bf16), and
    the costs of its blocks (with_file_costs; the dense part's too: from a header, it is estimated)."""
    from dataclasses import replace

    from ..experts.tier_bytes import mapped_bytes

    experts, dense = mapped_bytes(ckpt, None, inp.cpu_only)
    return with_file_costs(replace(inp, mapped_bytes=experts, dense_mapped=dense), ckpt, dense=True)


def with_file_costs(inp: PlanInputs, ckpt, dtype: torch.dtype | None = None, dense: bool = False) -> PlanInputs:
    """A GGUF file's cpu-16 experts are its own blocks, run by the block kernels, not 16-bit weights:
    they cost what the cpu-4 tier costs a byte (the same kernels, measured on Q4_K), not what bf16
    weights do (on a compute-bound CPU far apart: AMD EPYC Zen 1, 2 threads, 1.85e-10 s a byte
    against 6.8e-11; planned at the bf16 cost, a Q4_K_M file's experts looked 2.7x cheaper than they
    run, and no lower tier ever paid). dense: the dense part's estimate (from a header) likewise.
    Unchanged at fp32 (the exact dequantisation) and without the native library."""
    from dataclasses import replace

    from gguf import GGMLQuantizationType as GT

    from .. import native
    from ..files.gguf.blockquant import NATIVE

    if (not ckpt.is_gguf or "cpu-4" not in inp.tier_costs or "cpu-16" not in inp.tier_costs
            or dtype == torch.float32 or not native.available()):
        return inp
    from ..experts.gguf_tiers import expert_qtypes

    if not all(GT(t) in NATIVE for t in expert_qtypes(ckpt)):
        return inp
    (f16, b16), (f4, b4) = inp.tier_costs["cpu-16"], inp.tier_costs["cpu-4"]
    out = replace(inp, tier_costs={**inp.tier_costs, "cpu-16": (f4, b4)})
    if dense and inp.cpu_only:
        out = replace(out, dense_s=inp.dense_s + (b4 - b16) * inp.dense_bytes)
    return out


def from_config(config_path: Path, hw: HardwareProfile, sensitivity: float = ASSUMED_SENSITIVITY) -> tuple[PlanInputs, str]:
    """Plan a model from its config.json alone: uniform popularity, one assumed sensitivity for
    every 4-bit expert, this machine's measured CPU tiers and the reference GPU above."""
    from ..files.checkpoint import check_config, hf_config
    from ..families import FAMILIES

    try:
        raw = json.loads(Path(config_path).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(config_path, f"cannot be read: {e}") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in FAMILIES:
        mt = raw.get("model_type") if isinstance(raw, dict) else None
        raise ModelError(config_path, f"model_type is {mt!r}; Mixdesk plans {', '.join(FAMILIES)}")
    check_config(raw, Path(config_path))
    d = dims_from_config(hf_config(raw, Path(config_path)), Path(config_path))
    gpu = {"gpu-16": REFERENCE_GPU["gpu-16"], "gpu-4": REFERENCE_GPU["gpu-4"]}
    inp = from_dims(d, hw, 2, sensitivity, gpu_costs=gpu)
    note = (f"from config only: uniform popularity, ASSUMED sensitivity {sensitivity} (KL nats/token per layer "
            f"all 4-bit) for every 4-bit expert; "
            f"CPU tiers measured here; GPU: {REFERENCE_GPU['name']}\n{sequence_note(d)}")
    return inp, note


def sequence_note(d, ctx: int = 32768) -> str:
    """What one conversation of ctx tokens holds beside the weights (bf16 keys and values)."""
    kv, state = d.sequence_bytes(ctx)
    line = (f"a {ctx:,}-token conversation holds {kv / 2**20:,.0f} MiB of keys and values "
            f"({d.attention_layers} of {d.decoder_layers} layers attend)")
    if state:
        line += f" and {state / 2**20:,.0f} MiB of linear-attention state (with its copies at turn boundaries)"
    return line


def from_gguf(path: Path, hw: HardwareProfile, sensitivity: float = ASSUMED_SENSITIVITY,
              assume_gpu: bool = True) -> tuple[PlanInputs, str]:
    """Plan a GGUF file from its header alone (no tensor read): its metadata gives the shape, its
    tensor infos each expert's real bytes; otherwise as from_config. assume_gpu False: for this
    machine's CPU alone (its measured GPU tiers if it has them), the dense part in the file's blocks."""
    from ..files.gguf import open_gguf
    from ..experts.gguf_tiers import requantised_share
    from ..experts.tier_bytes import tier_bytes

    ck = open_gguf(path)
    try:
        gpu = {"gpu-16": REFERENCE_GPU["gpu-16"], "gpu-4": REFERENCE_GPU["gpu-4"]} if assume_gpu else None
        cpu_alone = not assume_gpu and hw.cpu_only
        inp = from_dims(ck.dims, hw, 2, sensitivity, gpu_costs=gpu, sizes=tier_bytes(ck, 2),
                        cpu4_share=requantised_share(ck), dense_bytes=ck.dense_nbytes() if cpu_alone else None,
                        low_shares={f"cpu-{b}": requantised_share(ck, b) for b in (3, 2)})
        inp = with_mapping(inp, ck)
        label = ck.format_label()
    finally:
        ck.close()
    where = f"GPU: {REFERENCE_GPU['name']}" if assume_gpu else ("no GPU: CPU only" if inp.cpu_only else "GPU tiers measured here")
    note = (f"from the GGUF header only ({label}): uniform popularity, ASSUMED sensitivity {sensitivity} "
            f"for every 4-bit expert the file does not already hold; CPU tiers measured here; {where}")
    return inp, note
