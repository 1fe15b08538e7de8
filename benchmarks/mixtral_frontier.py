"""The frontier for Mixtral-8x7B at real size, from its config alone, for a 24 GB GPU and 64 GB RAM.

    python benchmarks/mixtral_frontier.py

CPU tiers use this machine's measured hardware profile; the GPU tiers are the ASSUMED reference
GPU of engine/measures/inputs.py (no GPU here). Popularity is uniform and every 4-bit expert is given
an ASSUMED sensitivity (engine.measures.profile.ASSUMED_SENSITIVITY; the config carries no weights to measure).
--smoke: one frontier call after the first and 3 slider settings (0, 0.5, 1); the table, plot and record as ever.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import RESULTS, record  # noqa: E402
from engine.tools.cli_plan import plot, table  # noqa: E402
from engine.measures.hardware import load_or_measure  # noqa: E402
from engine.measures.inputs import from_config  # noqa: E402
from engine.planning.planner import Budgets, frontier, plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    smoke = ap.parse_args().smoke
    hw = load_or_measure(torch.device("cpu"))
    inp, note = from_config(ROOT / "resources" / "mixtral-8x7b-config.json", hw)
    b = Budgets(vram=24 * 10**9, ram=64 * 10**9)
    times = []
    for _ in range(2 if smoke else 6):  # the first call includes numpy's warm-up; the median of the rest is reported
        t0 = time.perf_counter()
        pts = frontier(inp, b)
        times.append((time.perf_counter() - t0) * 1e3)
    ms = sorted(times[1:])[len(times[1:]) // 2]
    sliders = "\n".join(f"| {s:.1f} | {', '.join(f'{n} {t}' for t, n in sorted(p.counts().items()))} | "
                        f"{p.tok_s:.2f} | {p.loss:.3f} |"
                        for s in ([0.0, 0.5, 1.0] if smoke else [i / 10 for i in range(11)])
                        for p in [plan(inp, b, s)])
    text = (f"{note}\n\nFrontier computed in {ms:.1f} ms, median of {len(times) - 1} (first call {times[0]:.1f} ms; {len(pts)} points).\n\n"
            f"## The slider\n\n| slider | tiers | tok/s (pred.) | quality loss |\n|---|---|---|---|\n{sliders}\n\n"
            f"## The whole frontier\n\n{table(pts)}")
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(pts, RESULTS / "mixtral_frontier.png", "Mixtral-8x7B, 24 GB GPU (assumed), 64 GB RAM, config only")
    print(f"recorded {record('mixtral_frontier', {'points': len(pts), 'ms': ms}, text)}")


if __name__ == "__main__":
    main()
