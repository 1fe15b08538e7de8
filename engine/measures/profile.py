"""The model profile: what the planner needs to know about one model, measured once and cached in
the user's cache folder (never in the model folder).

- popularity[l][e]: how many (token, slot) pairs the router sent to expert e of layer l on the
  calibration text;
- error[tier][l][e]: relative output error ||f4(X) - f16(X)|| / ||f16(X)|| of the expert's 4-bit
  form against its 16-bit form, on the calibration activations X routed to it (the quantisation
  error bound of one matrix product, issue 4);
- sensitivity[tier][l][e]: the quality model's per-expert cost, in KL divergence (nats per token)
  per unit of routing share. Two measurements make it:
    energy[l][e] = mean over the tokens routed to e of g^2 ||f4(x) - f16(x)||^2 / ||r||^2: the
      perturbation the 4-bit form adds to the residual stream r, relative to it (g: route weight).
      Squared weights treat the errors of a token's experts as independent, as they are for
      different weights (Mixtral). On the demo, whose experts are identical copies, they are fully
      correlated; weights g instead of g^2 were measured too and chose no better there.
    layer_kl[l] = KL divergence of the model's predictions when every expert of layer l is 4-bit
      (one forward pass per layer, from that layer on,
      over the first KL_TOKENS tokens), which says how much later layers amplify a perturbation there.
  sensitivity = energy * layer_kl[l] / sum_e share[l][e] * energy[l][e], so that summing
  share * sensitivity over a layer's experts gives back its measured KL. KL is quadratic in small
  perturbations, so per-expert energies add; the planner's loss, sum of share * sensitivity over the
  4-bit experts, is a predicted KL divergence.
  (The relative output error alone ranked layers backwards on the demo: Spearman -0.12 against
  per-layer KL; the layer scale is what makes it predictive, see benchmarks/planner_predictions.py.)
- bytes per tier of one expert.
"""
from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..experts.build import build_steps
from ..experts.quant import run_to_end
from ..files.model_files import model_key
from ..model.forward import MoEModel
from ..placement import LOW_TIERS, Tier

CORPUS = Path(__file__).resolve().parents[2] / "resources" / "corpus"
FORMAT = 3  # 3: cpu-4 is the native Q4 format where the library is built
MIN_TOKENS = 8  # an expert that saw fewer calibration tokens is measured on a sample of its layer's tokens
# Rows an expert's error is measured on, at most: evenly spaced among its own tokens (or, below
# MIN_TOKENS, among the layer's). The energy is a mean over rows, so a sample estimates it; without
# the cap a rarely chosen expert ran on all 1,024 calibration tokens, and with 128 small experts a
# layer (Qwen3-30B-A3B-shaped) that was most of calibration's time.
MAX_TOKENS = 128

ProgressFn = Callable[[int, int, str], None]


class Cancelled(Exception):
    pass


@dataclass
class ModelProfile:
    key: str
    layers: int
    experts: int
    calibration_tokens: int
    popularity: list[list[int]]
    sensitivity: dict[str, list[list[float]]]
    error: dict[str, list[list[float]]]
    layer_kl: list[float]
    expert_bytes: dict[str, int]
    dtype: str
    format: int = FORMAT
    # this model's time outside the experts on this machine: "<machine>|<device>|<dtype>|<kernel>"
    # -> [decode step s, prefill s per token]; kept so a cached start plans before building experts
    dense: dict = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "ModelProfile | None":
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                return None
            prof = cls(**data)
            if not isinstance(prof.dense, dict):
                prof.dense = {}
            return prof
        except (OSError, ValueError, TypeError, AttributeError):
            return None


def profile_path(folder: Path) -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "profiles" / f"{model_key(folder)}.json"


def calibration_text() -> str:
    return (CORPUS / "calibration.txt").read_text(encoding="utf-8")


def capture(model: MoEModel, ids: list[int]) -> list[tuple]:
    """Run the model over ids and return, per layer, (MoE inputs x [T, D], routes [T, K], route
    weights [T, K], residual stream [T, D])."""
    with model.recording() as records:
        model.forward(torch.tensor(ids), model.new_cache(len(ids)), 0)
    return records


KL_TOKENS = 256  # tokens of the calibration text the per-layer KL passes use


def _logprobs(model: MoEModel, ids: list[int], start=None) -> torch.Tensor:
    logits = model.forward(torch.tensor(ids[:-1]), model.new_cache(len(ids)), 0, all_logits=True, start=start)
    return torch.log_softmax(logits.float().cpu(), dim=-1)


def _kl(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float((ref.exp() * (ref - got)).sum(-1).mean())


def calibrate(model: MoEModel, ids: list[int], tiers: tuple[Tier, ...] = (Tier.CPU4, Tier.GPU4),
              progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> ModelProfile:
    return run_to_end(calibrate_steps(model, ids, tiers, progress, cancel))


def calibrate_steps(model: MoEModel, ids: list[int], tiers: tuple[Tier, ...] = (Tier.CPU4, Tier.GPU4),
                    progress: ProgressFn | None = None, cancel: threading.Event | None = None):
    """calibrate as a generator: it yields after each step (one expert's errors, one layer's KL
    pass) with the model as it found it (recording off, every block's experts its own), so the
    engine thread can answer requests, and move experts, between steps. Returns the profile.
    Its large transients are mapped buffers while it runs (engine/machine/memory.py large_buffers_mapped)."""
    from ..machine.memory import large_buffers_mapped

    with large_buffers_mapped():
        return (yield from _calibrate_steps(model, ids, tiers, progress, cancel))


def calibrated_tiers(cpu_only: bool, ckpt=None) -> tuple[Tier, ...]:
    """The tiers below 16 bits a calibration measures: those the planner can place experts in here (a
    CPU-only machine has no use for NF4's error, the slowest form to build on a CPU), and cpu-3 and
    cpu-2 where they hold fewer bytes than the tier above (whole 256-weight blocks, a file holding
    more bits; engine/planning/planner.py PlanInputs.tiers), whatever the user's lowest precision, so
    changing it plans at once. A GPU that appears later finds the profile without gpu-4 and
    calibrates again (cached_profile)."""
    base = (Tier.CPU4,) if cpu_only else (Tier.CPU4, Tier.GPU4)
    return base + (low_tiers_of(ckpt) if ckpt is not None else ())


def low_tiers_of(ckpt) -> tuple[Tier, ...]:
    """cpu-3 and cpu-2 where they hold fewer bytes of an expert than the CPU tier above them."""
    from ..experts.tier_bytes import tier_bytes

    sizes, out = tier_bytes(ckpt, 2), []
    above = sizes["cpu-4"]
    for t in LOW_TIERS:
        if sizes[t.value] < above:
            out.append(t)
            above = sizes[t.value]
    return tuple(out)


def _same_as_reference(ckpt, layer: int, tier: Tier, dtype: torch.dtype) -> bool:
    """Whether the layer's experts hold the same numbers at `tier` as at cpu-16: a GGUF layer whose
    matrices are 4-bit (3-, 2-bit) already keeps the file's blocks at cpu-4 (cpu-3, cpu-2) (engine/experts/gguf_tiers.py), so there is
    no error to measure and no form to build."""
    if tier.on_accelerator or tier.bits == 16 or not ckpt.is_gguf:
        return False
    from ..experts.gguf_tiers import keeps_file_form

    return keeps_file_form(ckpt, layer, dtype, tier.bits)


@torch.inference_mode()
def _calibrate_steps(model: MoEModel, ids: list[int], tiers: tuple[Tier, ...], progress: ProgressFn | None,
                     cancel: threading.Event | None):
    from ..experts.tier_bytes import tier_bytes

    d, ckpt = model.dims, model.ckpt
    records = capture(model, ids)
    popularity = [torch.bincount(idx.reshape(-1).cpu(), minlength=d.experts).tolist() for _, idx, _, _ in records]
    err = {t.value: [[0.0] * d.experts for _ in range(d.layers)] for t in tiers}
    energy = {t.value: [[0.0] * d.experts for _ in range(d.layers)] for t in tiers}
    layer_kl = [0.0] * d.layers
    sizes = tier_bytes(ckpt, torch.empty((), dtype=model.dtype).element_size())
    cpu = torch.device("cpu")
    kl_ids = ids[:KL_TOKENS]
    model.layer_inputs = inputs = []  # each KL pass resumes at its layer: half the work on average
    try:
        ref = _logprobs(model, kl_ids)
    finally:
        model.layer_inputs = None
    total, done = d.layers * (d.experts + 1), 0

    def step(what: str) -> None:
        nonlocal done
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        done += 1
        if progress:
            progress(done, total, what)

    def form(layer: int, expert: int, tier: Tier):
        """The expert as the model builds it for tier (the file's own blocks, mapped, where it can)."""
        return run_to_end(build_steps(ckpt, layer, expert, tier, model.accel if tier.on_accelerator else cpu,
                                      model.dtype))

    yield
    for l, (x, idx, w, resid) in enumerate(records):
        x = x.to(cpu)
        idx, w = idx.cpu(), w.float().cpu()
        r2 = resid.float().cpu().pow(2).sum(-1).clamp(min=1e-12)  # [T]
        same = {t.value for t in tiers if _same_as_reference(ckpt, l, t, model.dtype)}
        ref16s, quants = [], {t.value: [] for t in tiers}
        for e in range(d.experts):
            hit = idx == e
            rows = hit.any(-1)
            if int(rows.sum()) >= MIN_TOKENS:
                xe, g, re2 = x[rows], (w * hit).sum(-1)[rows], r2[rows]
            else:  # too few tokens: the layer's tokens at a typical route weight
                xe, g, re2 = x, torch.full((x.shape[0],), 1.0 / d.top_k), r2
            if xe.shape[0] > MAX_TOKENS:
                pick = torch.linspace(0, xe.shape[0] - 1, MAX_TOKENS).round().long()
                xe, g, re2 = xe[pick], g[pick], re2[pick]
            own = model.moe[l].experts[e]
            # the 16-bit reference: the model's own form where it holds this expert at 16 bits, else
            # the cpu-16 form (the file's blocks or a mapped view where it can: no copy), kept for
            # the layer's KL pass, which compares against the layer at 16 bits
            ref16 = own if own.tier.bits == 16 else form(l, e, Tier.CPU16)
            ref16s.append(ref16 if own.tier.bits < 16 else None)
            y16 = None
            for t in tiers:
                if t.value in same:  # the same numbers as the reference: no error
                    quants[t.value].append(ref16)
                    continue
                if y16 is None:
                    y16 = ref16(xe.to(ref16.device)).float().to(cpu)
                q = form(l, e, t)
                quants[t.value].append(q)
                dy2 = (q(xe.to(q.device)).float().to(cpu) - y16).pow(2).sum(-1)  # [rows]
                err[t.value][l][e] = float(dy2.sum().sqrt() / y16.norm().clamp(min=1e-12))
                energy[t.value][l][e] = float((g.pow(2) * dy2 / re2).mean())
                sizes[t.value] = q.nbytes
            step(f"layer {l} expert {e}")
            yield
        # the layer's KL, with the lossiest 4-bit form (the clearest signal); the amplification it
        # measures belongs to the layer, so it scales every tier's energies. A layer whose 4-bit
        # forms all equal its 16-bit ones has none to measure.
        share = [c / max(sum(popularity[l]), 1) for c in popularity[l]]
        worst = max(tiers, key=lambda t: sum(s * v for s, v in zip(share, energy[t.value][l]))).value
        block = model.moe[l]
        kept = block.experts
        if len(same) < len(tiers):
            try:
                base, start = ref, (d.decoder(l), inputs[d.decoder(l)])
                if any(ex.tier.bits < 16 for ex in kept):  # compare against this layer at 16 bits
                    block.experts = [r if r is not None else ex for r, ex in zip(ref16s, kept)]
                    base = _logprobs(model, kl_ids, start)
                block.experts = quants[worst]
                layer_kl[l] = max(_kl(base, _logprobs(model, kl_ids, start)), 0.0)
            finally:
                block.experts = kept
        del ref16s, quants
        step(f"layer {l} KL")
        yield
    sens = {}
    for t in tiers:
        sens[t.value] = []
        for l in range(d.layers):
            share = [c / max(sum(popularity[l]), 1) for c in popularity[l]]
            worst = max(sum(s * v for s, v in zip(share, energy[u.value][l])) for u in tiers)
            scale = layer_kl[l] / worst if worst > 0 else 0.0
            sens[t.value].append([scale * v for v in energy[t.value][l]])
    if ckpt.is_gguf:  # its CPU tiers hold the file's own blocks (engine/experts/gguf_tiers.py),
        from ..experts.gguf_tiers import tier_nbytes  # not the 16-bit and re-quantised forms measured above

        sizes.update(tier_nbytes(ckpt))
    return ModelProfile(key=model_key(ckpt.folder), layers=d.layers, experts=d.experts,
                        calibration_tokens=len(ids), popularity=popularity, sensitivity=sens, error=err,
                        layer_kl=layer_kl, expert_bytes=sizes, dtype=str(model.dtype).replace("torch.", ""))


# An ASSUMED per-expert sensitivity for planning without calibration: every layer all-4-bit costs
# 0.004 nats/token of KL, about what each layer of the demo measures with NF4.
ASSUMED_SENSITIVITY = 0.004
# ASSUMED, until a calibration measures them: a 3- or 2-bit expert's sensitivity is the 4-bit one's
# times the ratio of their squared rounding errors on Gaussian weights (relative RMSE of the Q3_K and
# Q2_K searches 0.151 and 0.268 against Q4_K's 0.071, measured 2026-12-05: x4.5 and x14).
LOW_SENSITIVITY = {"cpu-3": 4.5, "cpu-2": 14.0}


def assumed_sensitivity(layers: int, experts: int, sensitivity: float = ASSUMED_SENSITIVITY,
                        shares: dict | None = None) -> dict:
    """tier -> [L][E] of one assumed sensitivity (the low tiers' scaled as above); shares: tier -> the
    share of an expert's weights that tier re-quantises (a GGUF file's matrices already that small
    keep their blocks), default 1."""
    ratio = {"cpu-4": 1.0, "gpu-4": 1.0, **LOW_SENSITIVITY}
    shares = shares or {}
    return {t: [[sensitivity * r * shares.get(t, 1.0)] * experts for _ in range(layers)] for t, r in ratio.items()}


def uniform_profile(model: MoEModel, sensitivity: float = ASSUMED_SENSITIVITY) -> ModelProfile:
    """A stand-in when calibration is cancelled: every expert equally popular and sensitive."""
    from ..experts.tier_bytes import tier_bytes

    d = model.dims
    sizes = tier_bytes(model.ckpt, torch.empty((), dtype=model.dtype).element_size())
    return ModelProfile(key=model_key(model.ckpt.folder), layers=d.layers, experts=d.experts, calibration_tokens=0,
                        popularity=[[1] * d.experts for _ in range(d.layers)],
                        sensitivity=assumed_sensitivity(d.layers, d.experts, sensitivity),
                        error={}, layer_kl=[sensitivity] * d.layers,
                        expert_bytes=sizes,
                        dtype=str(model.dtype).replace("torch.", ""))


def cached_profile(ckpt, tiers: tuple[Tier, ...] = (Tier.CPU4,)) -> ModelProfile | None:
    """This checkpoint's cached profile, if one was measured with these 4-bit tiers (reads no
    weights): a profile measured on a CPU-only machine has no gpu-4 for a GPU found later."""
    prof = ModelProfile.load(profile_path(ckpt.folder))
    if (prof is not None and (prof.layers, prof.experts) == (ckpt.dims.layers, ckpt.dims.experts)
            and all(t.value in prof.sensitivity for t in tiers)):
        return prof
    return None


def _dense_key(device: torch.device, dtype: torch.dtype) -> str:
    from .. import native
    from .hardware import machine_id

    return f"{machine_id()}|{device.type}|{str(dtype).replace('torch.', '')}|{native.status()}"


def dense_timings(mp: ModelProfile, device: torch.device, dtype: torch.dtype) -> tuple[float, float] | None:
    """The cached (decode step s, prefill s per token) outside the experts, for this machine,
    device, compute dtype and CPU kernel; None when not measured yet."""
    t = mp.dense.get(_dense_key(device, dtype))
    return (float(t[0]), float(t[1])) if isinstance(t, list) and len(t) == 2 else None


def save_dense_timings(mp: ModelProfile, folder: Path, device: torch.device, dtype: torch.dtype,
                       timings: tuple[float, float]) -> None:
    mp.dense[_dense_key(device, dtype)] = [float(timings[0]), float(timings[1])]
    try:
        mp.save(profile_path(folder))
    except OSError:
        pass  # a read-only cache folder: measured again next time


def calibration_ids(tokenizer, max_tokens: int = 1024) -> list[int]:
    return tokenizer.encode(calibration_text(), add_special_tokens=False)[:max_tokens]


def load_or_calibrate(model: MoEModel, tokenizer, progress: ProgressFn | None = None,
                      cancel: threading.Event | None = None, max_tokens: int = 1024,
                      recalibrate: bool = False, tiers: tuple[Tier, ...] = (Tier.CPU4, Tier.GPU4)) -> ModelProfile:
    path = profile_path(model.ckpt.folder)
    prof = None if recalibrate else cached_profile(model.ckpt, tiers)
    if prof is not None:
        return prof
    prof = calibrate(model, calibration_ids(tokenizer, max_tokens), tiers, progress=progress, cancel=cancel)
    prof.save(path)
    return prof
