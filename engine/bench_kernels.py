"""`mixdesk bench kernels`: one Mixtral-size expert (hidden 4096, ffn 14336) in every tier this
machine has, at batch 1, 4, 16 and 128: time per token, and at batch 1 the fraction of the memory
read bandwidth measured in the same run (bytes of the expert's weights / time / bandwidth)."""
from __future__ import annotations

import time

import torch

from . import native
from .devices import best_time
from .experts import Expert16, quantise
from .kernels import auto_dtype
from .placement import Tier

BATCHES = (1, 4, 16, 128)


def read_bandwidth(mib: int = 2048, reps: int = 3) -> float:
    """Bytes/s torch reads from RAM (a sum over a buffer far larger than the caches; best of reps)."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


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
    # the machine is shared and its bandwidth readings vary: take the best seen before and after
    cpu_times = {}
    for tier, ex in experts.items():
        dev = ex.device
        dtype = cpu_dtype if dev.type == "cpu" else auto_dtype(dev)
        for b in BATCHES:
            x = torch.randn(b, hidden, dtype=dtype, device=dev)
            cpu_times[(tier, b)] = best_time(lambda: ex(x), dev, reps if b < 128 else 2) / b
    bw["cpu"] = max(bw["cpu"], read_bandwidth(reps=5))
    out(f"CPU expert kernel: {native.status()}; 16-bit CPU format {cpu_dtype}; {torch.get_num_threads()} threads")
    out(f"read bandwidth (best of 10 readings): " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bw.items()))
    out(f"{'tier':8} {'MiB':>7} " + " ".join(f"{'b=' + str(b) + ' ms/tok':>13}" for b in BATCHES)
        + f" {'b=1 GB/s':>9} {'of bw':>6}")
    results = {"bandwidth": bw, "kernel": native.status(), "tiers": {}}
    for tier, ex in experts.items():
        dtype = cpu_dtype if ex.device.type == "cpu" else auto_dtype(ex.device)
        per_tok = {b: cpu_times[(tier, b)] for b in BATCHES}
        gbs = ex.nbytes / per_tok[1]
        frac = gbs / bw["gpu" if tier.on_accelerator else "cpu"]
        results["tiers"][tier.value] = {"bytes": ex.nbytes, "s_per_token": per_tok, "b1_bytes_per_s": gbs,
                                        "fraction_of_bandwidth": frac, "dtype": str(dtype)}
        out(f"{tier.value:8} {ex.nbytes / 2**20:7.0f} " + " ".join(f"{per_tok[b] * 1e3:13.3f}" for b in BATCHES)
            + f" {gbs / 1e9:9.1f} {frac:6.0%}")
    return results
