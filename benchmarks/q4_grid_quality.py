"""Does the cpu-4 grid's per-block minimum pay for its bits? The issue asked for it only if measured.

    python benchmarks/q4_grid_quality.py

Relative output error of one 4096 x 4096 matrix (64 activations) quantised in blocks of 32 with an
fp16 scale and minimum (w = q*d + m, 5 bits a weight: the cpu-4 grid) against the symmetric grid
with an fp16 scale alone (w = (q-8)*d, 4.5 bits: llama.cpp's Q4_0), on Gaussian, heavy-tailed
(Laplace) and row-offset weights, and on two of the demo's expert matrices (whose Q4_1 source the
grid with a minimum reproduces: not representative, shown for completeness).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402


def with_min(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    wb = w.float().reshape(n, k // 32, 32)
    lo, hi = wb.amin(-1, keepdim=True), wb.amax(-1, keepdim=True)
    d = ((hi - lo) / 15).clamp(min=1e-10).half().float()
    m = lo.half().float()
    return (((wb - m) / d).round().clamp(0, 15) * d + m).reshape(n, k)


def symmetric(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    wb = w.float().reshape(n, k // 32, 32)
    mx = wb.gather(-1, wb.abs().argmax(-1, keepdim=True))
    d = (mx / -8).half().float()
    d = torch.where(d == 0, torch.full_like(d, 1e-10), d)
    return (((wb / d + 8).round().clamp(0, 15) - 8) * d).reshape(n, k)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    cases = {"Gaussian": torch.randn(4096, 4096, generator=g),
             "Laplace (heavy tails)": torch.distributions.Laplace(0.0, 1.0).sample((4096, 4096)),
             "Gaussian + per-row offset": torch.randn(4096, 4096, generator=g) + 0.5 * torch.randn(4096, 1, generator=g)}
    try:
        from engine.checkpoint import Checkpoint
        from engine.sources.demo import demo_dir
        from engine.experts import read_expert

        w13, w2 = read_expert(Checkpoint(demo_dir()), 5, 0)
        cases["demo w13 (Q4_1 source)"], cases["demo w2 (Q4_1 source)"] = w13.float(), w2.float()
    except Exception as e:  # noqa: BLE001 -- the demo is optional here
        print(f"(demo not built: {e})")
    rows = ["| weights | with minimum (5 bits) | symmetric (4.5 bits) | error ratio |", "|---|---|---|---|"]
    res = {}
    for name, w in cases.items():
        x = torch.randn(64, w.shape[1], generator=g)
        ref = x @ w.t()
        a = float((x @ with_min(w).t() - ref).norm() / ref.norm())
        b = float((x @ symmetric(w).t() - ref).norm() / ref.norm())
        res[name] = {"with_min": a, "symmetric": b}
        rows.append(f"| {name} | {a:.4f} | {b:.4f} | {b / a:.2f}x |")
    table = "\n".join(rows) + "\n\nRelative output error of x @ W.T, 64 Gaussian activations."
    print(table)
    print(f"recorded {record('q4_grid_quality', res, table)}")


if __name__ == "__main__":
    main()
