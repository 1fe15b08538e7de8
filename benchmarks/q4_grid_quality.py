"""Which 4-bit grid should the cpu-4 tier re-quantise 16-bit experts to? Quality per byte, measured.

    python benchmarks/q4_grid_quality.py [--rows 1024] [--cols 14336] [--tokens 64] [--threads 2] [--smoke]

--smoke: W [32, 256] and 4 activations, every kind and grid, recorded as the full run is (a test runs it).

For each weight kind (Gaussian; heavy-tailed: Student-t with 3 degrees of freedom; row-offset:
Gaussian plus a per-row mean of 0.5 sigma * N(0, 1)) one matrix W [rows, cols] (by default a
1024-row slice of a Mixtral-sized 4096 x 14336 down projection) is quantised to each grid and read
back: the current cpu-4 grid (engine.experts.quant.Q4Native: fp16 scale and minimum per 32, min/max, 5 bits
a weight), and GGUF's Q4_0, Q4_1, Q4_K and, for context, Q5_0, Q5_K, Q6_K, Q8_0 from our own
quantisers (engine/native/kquantize.c), decoded by gguf.quants.dequantize (the reference, not our
kernels). Reported: bits a weight; the relative output error |x Wq^T - x W^T| / |x W^T| over a batch
of Gaussian activations x [tokens, cols]; the relative weight RMSE |Wq - W| / |W|; and the
quantiser's wall time for the matrix on --threads threads.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402

GRIDS = ("Q4Native", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0")


def kinds(rows: int, cols: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    chi2 = sum(torch.randn(rows, cols, generator=g) ** 2 for _ in range(3))  # 3 degrees of freedom
    return {"Gaussian": torch.randn(rows, cols, generator=g),
            "heavy-tailed (Student-t, 3 dof)": torch.randn(rows, cols, generator=g) / (chi2 / 3).sqrt(),
            "row-offset (Gaussian + 0.5 N(0,1) a row)": torch.randn(rows, cols, generator=g)
            + 0.5 * torch.randn(rows, 1, generator=g)}


def quantise(w: torch.Tensor, grid: str, threads: int) -> tuple[torch.Tensor, float, float]:
    """(the weight as the grid stores it, fp32; bits a weight; seconds to quantise)."""
    import gguf
    from gguf import GGMLQuantizationType as GT

    from engine.files.gguf.blockquant import bits_per_weight, quantize_raw
    from engine.experts.quant import Q4Native

    t0 = time.perf_counter()
    if grid == "Q4Native":
        q = Q4Native.quantize(w, threads=threads)
        dt = time.perf_counter() - t0
        return q.dequantize(), 8.0 * q.nbytes / w.numel(), dt
    raw = quantize_raw(w, GT[grid], threads)
    dt = time.perf_counter() - t0
    back = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), GT[grid]).reshape(w.shape))
    return back, bits_per_weight(GT[grid]), dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024, help="rows of W (Mixtral's down projection has 4096)")
    ap.add_argument("--cols", type=int, default=14336, help="in-features of W (a multiple of 256)")
    ap.add_argument("--tokens", type=int, default=64, help="Gaussian activations in the batch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.cols, args.tokens = 32, 256, 4
    g = torch.Generator().manual_seed(args.seed)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")  # the timings depend on it
    res: dict[str, dict] = {"shape": [args.rows, args.cols], "tokens": args.tokens, "threads": args.threads,
                            "load_average_1min": load}
    lines = []
    for name, w in kinds(args.rows, args.cols, g).items():
        x = torch.randn(args.tokens, args.cols, generator=g)
        ref = x @ w.t()
        res[name] = {}
        for grid in GRIDS:
            back, bits, dt = quantise(w, grid, args.threads)
            out = float((x @ back.t() - ref).norm() / ref.norm())
            rmse = float((back - w).norm() / w.norm())
            res[name][grid] = {"bits": bits, "output_error": out, "weight_rmse": rmse, "seconds": dt}
            lines.append(f"| {name} | {grid} | {bits:.3f} | {out:.4f} | {rmse:.4f} | {dt:.2f} |")
            print(lines[-1], flush=True)
        del w, x, ref
    verdict = []
    for name in res:
        if isinstance(res[name], dict) and "Q4_K" in res[name]:  # the weight kinds
            a, b = res[name]["Q4_K"]["output_error"], res[name]["Q4Native"]["output_error"]
            verdict.append(f"- {name}: Q4_K {a:.4f} at {res[name]['Q4_K']['bits']:.2f} bits vs the 5-bit grid {b:.4f}"
                           f" ({(a / b - 1) * 100:+.1f}%)")
    table = "\n".join(
        [f"W [{args.rows}, {args.cols}] fp32, {args.tokens} Gaussian activations, quantiser on {args.threads} threads"
         f" (wall time; 1-minute load average {load:.1f} at the start, on {os.cpu_count()} cores).",
         "", "| weights | grid | bits/weight | output error | weight RMSE | quantise s |", "|---|---|---|---|---|---|",
         *lines, "", "Output error: |x Wq^T - x W^T| / |x W^T|. Weight RMSE: |Wq - W| / |W|. "
         "Q4Native is the current cpu-4 grid; the others are GGUF's, from engine/native/kquantize.c,"
         " decoded by gguf.quants.dequantize.", "", "Q4_K against the 5-bit grid:", *verdict])
    print(table)
    print(f"recorded {record('q4_grid_quality', res, table)}")


if __name__ == "__main__":
    main()
