"""Record `mixdesk bench kernels`: one Mixtral-size expert (4096 x 14336; gate, up and down) in every
tier present, time per token at batch 1/4/16/128 and the fraction of read bandwidth at batch 1,
in several consecutive runs, all reported.

    python benchmarks/expert_kernels.py [--runs 3]
    python benchmarks/expert_kernels.py --formats [--threads 2]   # GGUF K-quants against MDK_Q4, not recorded
    python benchmarks/expert_kernels.py --smoke   # a test runs it: tiny shapes, one round, both parts

--smoke: one run on an expert of hidden 256 and ffn 512, one batch-1 round, one repeat, recorded as the full
run is, after --formats on one [256, 256] copy of each format, one round (with --formats: that part only).

--formats: one 14336 x 4096 matrix in MDK_Q4 and in Q4_K / Q5_K / Q6_K (random valid blocks), three
copies of each so that a pass reads ~100 MB or more from RAM (one Q4 copy, 37 MB, is near the 32 MB L3
of the machine it was written on), timed interleaved at batch 1 and 4; the best round's GB/s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402
from engine.tools import bench_kernels


def formats(threads: int, rounds: int = 12, copies: int = 3, n: int = 14336, k: int = 4096) -> None:
    import time

    import numpy as np
    import torch
    from gguf import GGMLQuantizationType as GT
    from gguf.constants import GGML_QUANT_SIZES

    from engine import native
    from engine.files.gguf.blockquant import BlockQuant
    from engine.experts.quant import Q4Native

    native._threads = threads
    rng = np.random.default_rng(0)

    def block_weight(qt):
        block, size = GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        at, nd = (208, 2) if qt == GT.Q6_K else (0, 4)  # finite fp16 d (and dmin)
        raw[..., at:at + nd] = (rng.standard_normal((n, k // block, nd // 2)) * 0.01).astype(np.float16).view(
            np.uint8).reshape(n, k // block, nd)
        return BlockQuant.from_raw(qt, torch.from_numpy(raw.reshape(n, -1)), (n, k))

    mats = {"MDK_Q4": [Q4Native.quantize(torch.randn(n, k)) for _ in range(copies)]}
    for qt in (GT.Q4_K, GT.Q5_K, GT.Q6_K):
        mats[qt.name] = [block_weight(qt) for _ in range(copies)]
    print(f"{n} x {k}, {copies} copies each, {threads} threads, {native.status()}")
    for T in (1, 4):
        x = torch.randn(T, k)
        best = {name: float("inf") for name in mats}
        for r in range(rounds + 1):
            for name, qs in mats.items():
                for q in qs:
                    t0 = time.perf_counter()
                    q.matmul(x)
                    if r:  # round 0 warms up
                        best[name] = min(best[name], time.perf_counter() - t0)
        print(f"batch {T}: " + ", ".join(f"{name} {best[name] * 1e3:.2f} ms {qs[0].nbytes / best[name] / 1e9:.1f} GB/s"
                                         for name, qs in mats.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--formats", action="store_true", help="GGUF K-quants against MDK_Q4 (GB/s), not recorded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        formats(a.threads, rounds=1, copies=1, n=256, k=256)
        if a.formats:
            return
        a.runs = 1
        bench_kernels.ROUNDS = 1  # batch 1's rounds, each beside its own read-bandwidth reading
    elif a.formats:
        formats(a.threads)
        return
    size = dict(hidden=256, ffn=512, reps=1) if a.smoke else {}
    lines: list[str] = []

    def out(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    runs = []
    for i in range(a.runs):
        out(f"run {i + 1} of {a.runs}")
        runs.append(bench_kernels.run(out=out, **size))
    summary = ["", "| tier | " + " | ".join(f"run {i + 1}" for i in range(a.runs)) + " |",
               "|---|" + "---|" * a.runs]
    for tier in runs[0]["tiers"]:
        summary.append(f"| {tier} | " + " | ".join(f"{r['tiers'][tier]['fraction_of_bandwidth']:.0%}" for r in runs)
                       + " |")
    for s in summary:
        out(s)
    table = ("```\n" + "\n".join(lines[: -len(summary)]) + "\n```\n" + "\n".join(summary[1:])
             + "\n\nFraction of the read bandwidth at batch 1 (median of each run's rounds). "
             "Target: CPU tiers at batch 1 >= 80%.")
    print(f"recorded {record('kernels', {'runs': runs}, table)}")


if __name__ == "__main__":
    main()
