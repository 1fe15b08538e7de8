"""Record `mixdesk bench kernels`: one Mixtral-size expert (4096 x 14336; gate, up and down) in every
tier present, time per token at batch 1/4/16/128 and the fraction of read bandwidth at batch 1,
in several consecutive runs, all reported.

    python benchmarks/kernels.py [--runs 3]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402
from engine.tools import bench_kernels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    lines: list[str] = []

    def out(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    runs = []
    for i in range(a.runs):
        out(f"run {i + 1} of {a.runs}")
        runs.append(bench_kernels.run(out=out))
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
