"""`mixdesk bench kernels`: one Mixtral-size expert (hidden 4096, ffn 14336; gate, up and down) in
every tier this machine has, at batch 1, 4, 16 and 128: time per token, and at batch 1 the fraction
of the memory read bandwidth measured in the same run (bytes of the expert's weights / time /
bandwidth), with the active CPU kernel named."""
from __future__ import annotations

import time

import torch

from .. import native
from ..machine.devices import best_time
from ..experts.expert import Expert16, quantise
from ..native.dense_linear import auto_dtype
from ..placement import Tier

BATCHES = (1, 4, 16, 128)
ROUNDS = 7


def read_bandwidth(mib: int = 1024, reps: int = 3) -> float:
    """Bytes/s torch reads from RAM (a sum over a buffer far larger than the caches; best of reps)."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def _dtype(ex, cpu_dtype: torch.dtype) -> torch.dtype:
    return cpu_dtype if ex.device.type == "cpu" else auto_dtype(ex.device)


def run(hidden: int = 4096, ffn: int = 14336, reps: int = 5, out=print) -> dict:
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(2 * ffn, hidden, generator=g) * hidden ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(hidden, ffn, generator=g) * ffn ** -0.5).to(torch.bfloat16)
    cpu_dtype = auto_dtype(cpu)
    experts = {Tier.CPU16: Expert16(Tier.CPU16, w13.to(cpu_dtype), w2.to(cpu_dtype)),
               Tier.CPU4: quantise(Tier.CPU4, w13, w2, cpu, cpu_dtype)}
    bw = {"cpu": read_bandwidth(reps=5)}
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        gdt = auto_dtype(dev)
        experts[Tier.GPU16] = Expert16(Tier.GPU16, w13.to(dev, gdt), w2.to(dev, gdt))
        experts[Tier.GPU4] = quantise(Tier.GPU4, w13, w2, dev, gdt)
        buf = torch.empty(2**30, dtype=torch.uint8, device=dev)
        bw["gpu"] = buf.numel() / best_time(lambda: buf.sum(dtype=torch.int32), dev, reps)
    # The machine is shared and its read bandwidth drifts (2x over minutes here): batch 1 is timed
    # in rounds, each next to its own bandwidth reading, and the fraction is taken per round.
    rounds = {tier: [] for tier in experts}  # (seconds at batch 1, bandwidth) per round
    xs1 = {tier: torch.randn(1, hidden, dtype=_dtype(ex, cpu_dtype), device=ex.device) for tier, ex in experts.items()}
    for _ in range(ROUNDS):
        for tier, ex in experts.items():
            here = bw["gpu"] if tier.on_accelerator else read_bandwidth(512, reps=3)
            rounds[tier].append((best_time(lambda: ex(xs1[tier]), ex.device, reps=3), here))
    times = {}
    for tier, ex in experts.items():
        for b in BATCHES[1:]:
            x = torch.randn(b, hidden, dtype=_dtype(ex, cpu_dtype), device=ex.device)
            times[(tier, b)] = best_time(lambda: ex(x), ex.device, reps if b < 128 else 2) / b
    out(f"CPU expert kernel: {native.status()}; 16-bit CPU format {cpu_dtype}; {torch.get_num_threads()} threads")
    out(f"batch 1 in {ROUNDS} rounds, each beside its own read-bandwidth reading; fraction = median over rounds")
    out(f"{'tier':8} {'MiB':>7} " + " ".join(f"{'b=' + str(b) + ' ms/tok':>13}" for b in BATCHES)
        + f" {'b=1 GB/s':>9} {'bw GB/s':>8} {'of bw':>6} {'range':>10}")
    results = {"bandwidth": bw, "kernel": native.status(), "rounds": ROUNDS, "tiers": {}}
    for tier, ex in experts.items():
        fr = sorted(ex.nbytes / t / w for t, w in rounds[tier])
        med = fr[len(fr) // 2]
        t1 = min(t for t, _ in rounds[tier])
        per_tok = {1: t1, **{b: times[(tier, b)] for b in BATCHES[1:]}}
        gbs = ex.nbytes / t1
        results["tiers"][tier.value] = {"bytes": ex.nbytes, "s_per_token": per_tok, "b1_bytes_per_s": gbs,
                                        "fraction_of_bandwidth": med, "fractions_per_round": fr,
                                        "bandwidth_per_round": [w for _, w in rounds[tier]],
                                        "dtype": str(_dtype(ex, cpu_dtype))}
        out(f"{tier.value:8} {ex.nbytes / 2**20:7.0f} " + " ".join(f"{per_tok[b] * 1e3:13.3f}" for b in BATCHES)
            + f" {gbs / 1e9:9.1f} {sorted(w for _, w in rounds[tier])[ROUNDS // 2] / 1e9:8.1f} {med:6.0%}"
            + f" {fr[0]:4.0%}-{fr[-1]:.0%}")
    return results
