"""The hardware profile: what each tier costs on this machine, measured at first start and cached.

For each tier, one expert's forward at batch 1 is timed at two sizes and fitted as
fixed_s + s_per_byte * bytes, and at batches 1..256 for how its cost grows with the tokens it
takes at once (prefill). With CUDA, pinned
host<->device bandwidth too. A CPU-only machine gets a CPU-only profile (no gpu-* tiers).
"""
from __future__ import annotations

import copy
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import torch

from ..machine.devices import best_time
from ..experts.expert import Expert16, quantise, run_jobs
from ..native.dense_linear import auto_dtype
from ..placement import Tier

FORMAT = 8  # 5: the native CPU kernels (tier costs changed); 6: batch 2 measured (batched decode); 7: cpu-3, cpu-2;
# 8: native experts timed 8 to a call, as a decode step's layer runs them
GROUP = 8
SIZES = ((512, 1024), (2048, 8192))  # (hidden, ffn) of the two synthetic experts
# The small expert is timed in rotation over copies that together outgrow the caches, as a model's
# experts do in decode (each is read once per token): timed alone it stays in cache, and its fixed
# cost came out low (on the demo, predicted cpu-4 tok/s ran 19% above the measured rate).
WORKING_SET = 96 * 2**20


@dataclass
class HardwareProfile:
    machine: str
    cpu_only: bool
    tier_costs: dict  # tier value -> [fixed_s, s_per_byte]
    h2d_bytes_per_s: float | None
    d2h_bytes_per_s: float | None
    gpu_total: int
    ram_total: int
    # tier -> {small, large: [[batch, time at that batch / time at batch 1], ...], bytes}: how a
    # tier's cost grows with the tokens one expert takes at once (prefill, batched decode), at both sizes
    batch_scale: dict = field(default_factory=dict)
    format: int = FORMAT


def machine_id() -> str:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-only"
    return f"{platform.processor() or platform.machine()}|{psutil.cpu_count()}|{gpu}|torch {torch.__version__}"


def _expert(tier: Tier, d: int, i: int, accel: torch.device, g: torch.Generator):
    w13 = (torch.randn(2 * i, d, generator=g) * d ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(d, i, generator=g) * i ** -0.5).to(torch.bfloat16)
    dev = accel if tier.on_accelerator else torch.device("cpu")
    dtype = auto_dtype(dev)
    if tier.bits < 16:
        return quantise(tier, w13, w2, accel, dtype), dev, dtype
    return Expert16(tier, w13.to(dev, dtype), w2.to(dev, dtype)), dev, dtype


def _copy(ex, tier: Tier, d: int, i: int, accel: torch.device, g: torch.Generator):
    """Another expert in separate memory: a deep copy (30x faster than quantising anew), or a new
    one where a tier's tensors can't be deep-copied."""
    try:
        return copy.deepcopy(ex)
    except Exception:  # noqa: BLE001 -- any failure just means: build one
        return _expert(tier, d, i, accel, g)[0]


BATCHES = (1, 2, 4, 16, 64, 256)  # 2 and 4: concurrent decode streams; the rest: prefill
LONG_S = 0.25


ROUNDS = 5  # timing rounds, each through every size: a slow spell of a shared machine hits one round


def _built(built: dict | None, tier: Tier, d: int, i: int, accel: torch.device, g: torch.Generator):
    """_expert, built once per (tier, size) in one measure() (building the large synthetic expert in Q3_K
    and Q2_K takes seconds: each was built three times, and the first start's measuring took 4x as long)."""
    if built is None:
        return _expert(tier, d, i, accel, g)
    key = (tier, d, i)
    if key not in built:
        built[key] = _expert(tier, d, i, accel, g)
    return built[key]


def _batch_scale(tiers, accel: torch.device, built: dict | None = None) -> dict:
    """tier -> {"small": [[n, ratio]...], "large": [...]}, the ratio of time at batch n to batch 1,
    for both synthetic sizes (small experts gain less from batching than large ones)."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for tier in tiers:
        out[tier.value] = {}
        for label, (d, i) in zip(("small", "large"), SIZES):
            ex, dev, dtype = _built(built, tier, d, i, accel, g)
            xs = {n: torch.randn(n, d, dtype=dtype, device=dev) for n in BATCHES}
            best = {}
            for n in BATCHES:  # a batch that runs longer than LONG_S is compute-bound: the larger ones
                best[n] = best_time(lambda n=n: ex(xs[n]), dev, reps=2)  # are read linearly past the table
                if best[n] > LONG_S:  # (batch_ratio), not timed (the 3- and 2-bit tiers' large expert
                    break  # at 256 tokens took seconds a run on AVX2)
            for _ in range(ROUNDS - 1):  # the decode sizes again, interleaved: a slow spell of a shared
                for n in (n for n in best if n <= 4):  # machine at batch 1 skewed every ratio
                    best[n] = min(best[n], best_time(lambda n=n: ex(xs[n]), dev, reps=1))
            # n tokens at once never cost more than n runs one by one (the engine could run them so)
            out[tier.value][label] = [[n, min(best[n] / best[1], float(n))] for n in best]
        out[tier.value]["bytes"] = [_built(built, tier, d, i, accel, g)[0].nbytes for d, i in SIZES]
    return out


def tier_costs(tiers, accel: torch.device, built: dict | None = None) -> dict:
    g = torch.Generator().manual_seed(0)
    costs = {}
    for tier in tiers:
        runs, sizes = [], []
        for d, i in SIZES:
            ex, dev, dtype = _built(built, tier, d, i, accel, g)
            copies = [ex] + [_copy(ex, tier, d, i, accel, g) for _ in range(WORKING_SET // ex.nbytes)]
            x = torch.randn(1, d, dtype=dtype, device=dev)
            runs.append((copies, x))
            sizes.append(ex.nbytes)
        best = [float("inf")] * len(SIZES)
        for _ in range(ROUNDS):  # interleaved: small, large, small, large, ... best of each
            for k, (copies, x) in enumerate(runs):
                def run_all(copies=copies, x=x):
                    if all(getattr(c, "desc", None) is not None for c in copies):
                        # native experts as a decode step runs them: a layer's top-k in one call (timed one
                        # by one, each call's own overhead made a fixed cost ~100 us an expert that the
                        # step does not pay, and hid what fewer bytes save)
                        one, w = torch.zeros(GROUP, dtype=torch.long), torch.ones(GROUP)
                        for i in range(0, len(copies), GROUP):
                            group = copies[i:i + GROUP]
                            run_jobs([(c, j, 1) for j, c in enumerate(group)], x, one[:len(group)], w[:len(group)])
                        return
                    for c in copies:
                        c(x)
                best[k] = min(best[k], best_time(run_all, dev, reps=1) / len(copies))
        del runs
        (b0, t0), (b1, t1) = zip(sizes, best)
        per_byte = max((t1 - t0) / (b1 - b0), 1e-15)
        costs[tier.value] = [max(t0 - per_byte * b0, 0.0), per_byte]
    return costs


def measure(accel: torch.device) -> HardwareProfile:
    from .. import native

    # the tiers below 4 bits run on the native codes kernels only (Q3_K, Q2_K)
    tiers = ([Tier.CPU16, Tier.CPU4] + ([Tier.CPU3, Tier.CPU2] if native.available() else [])
             + ([Tier.GPU16, Tier.GPU4] if accel.type == "cuda" else []))
    built: dict = {}
    costs = tier_costs(tiers, accel, built)
    h2d = d2h = None
    gpu_total = 0
    if accel.type == "cuda":
        host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
        dev_buf = torch.empty_like(host, device=accel)
        h2d = host.numel() / best_time(lambda: dev_buf.copy_(host, non_blocking=True), accel)
        d2h = host.numel() / best_time(lambda: host.copy_(dev_buf, non_blocking=True), accel)
        gpu_total = torch.cuda.get_device_properties(accel).total_memory
    return HardwareProfile(machine_id(), accel.type != "cuda", costs, h2d, d2h, gpu_total,
                           psutil.virtual_memory().total, _batch_scale(tiers, accel, built))


def profile_path() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "hardware.json"


def cached(path: Path | None = None) -> HardwareProfile | None:
    """This machine's cached profile (or the one at path), or None when it is missing, stale or damaged
    (never measures)."""
    try:
        data = json.loads((path or profile_path()).read_text())
        if isinstance(data, dict) and data.get("format") == FORMAT and data.get("machine") == machine_id():
            prof = HardwareProfile(**data)
            if isinstance(prof.tier_costs, dict) and "cpu-16" in prof.tier_costs:
                return prof
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # unreadable, stale or damaged
    return None


def load_or_measure(accel: torch.device, remeasure: bool = False) -> HardwareProfile:
    path = profile_path()
    if not remeasure:
        prof = cached()
        if prof is not None:
            return prof
    return save(measure(accel), path)


def save(prof: HardwareProfile, path: Path) -> HardwareProfile:
    """prof written to path whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(prof), indent=1))
    tmp.replace(path)
    return prof
