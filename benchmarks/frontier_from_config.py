"""The frontier of a model at real size from its config alone, for a 24 GB GPU and 64 GB RAM: how
long the planner takes, and what the slider picks. Any family of engine/families.

    python benchmarks/frontier_from_config.py resources/qwen3-30b-a3b-config.json

CPU tiers use this machine's measured hardware profile; the GPU tiers are the ASSUMED reference GPU
of engine/measures/inputs.py (no GPU here). Popularity is uniform and every 4-bit expert is given
an ASSUMED sensitivity (the config carries no weights to measure). Above 512 experts the planner
works on 256 groups of alike experts (engine/planning/planner.reduced); the time reported is the
whole frontier() call, median of 5 after a first call. --smoke: one call after the first and 3 slider
settings (0, 0.5, 1), on the same config.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import record  # noqa: E402
from engine.tools.cli_plan import table  # noqa: E402
from engine.measures.hardware import load_or_measure  # noqa: E402
from engine.measures.inputs import from_config  # noqa: E402
from engine.planning.planner import Budgets, frontier, plan  # noqa: E402


def main(config: str, smoke: bool = False) -> None:
    path = Path(config)
    name = json.loads(path.read_text()).get("model_type", "model")
    hw = load_or_measure(torch.device("cpu"))
    inp, note = from_config(path, hw)
    b = Budgets(vram=24 * 10**9, ram=64 * 10**9)
    times = []
    for _ in range(2 if smoke else 6):
        t0 = time.perf_counter()
        pts = frontier(inp, b)
        times.append((time.perf_counter() - t0) * 1e3)
    ms = sorted(times[1:])[len(times[1:]) // 2]
    sliders = "\n".join(f"| {s:.1f} | {', '.join(f'{n} {t}' for t, n in sorted(p.counts().items()))} | "
                        f"{p.tok_s:.2f} | {p.loss:.3f} | {p.vram / 1e9:.1f} | {p.ram / 1e9:.1f} |"
                        for s in ([0.0, 0.5, 1.0] if smoke else [i / 10 for i in range(11)])
                        for p in [plan(inp, b, s)])
    text = (f"{path.name}: {inp.layers} layers x {inp.experts} experts = {inp.layers * inp.experts} experts, "
            f"top-{inp.top_k}\n\n{note}\n\nFrontier computed in {ms:.1f} ms, median of {len(times) - 1} (first call "
            f"{times[0]:.1f} ms; {len(pts)} points).\n\n## The slider\n\n| slider | tiers | tok/s (pred.) | "
            f"quality loss | VRAM GB | RAM GB |\n|---|---|---|---|---|---|\n{sliders}\n\n## The whole frontier\n\n"
            f"{table(pts)}")
    print(text)
    print(f"recorded {record(f'frontier_{name}', {'points': len(pts), 'ms': ms, 'first_ms': times[0]}, text)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "resources" / "qwen3-30b-a3b-config.json"))
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    main(a.config, a.smoke)
