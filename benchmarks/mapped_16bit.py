"""A 16-bit safetensors checkpoint's cpu-16 experts served from its mapping, against today's copies.

    python benchmarks/mapped_16bit.py [--rounds 2] [--smoke]

--smoke: one round on a tiny checkpoint of the same layout (SMOKE_SHAPE, written once under .bench/),
recorded as the full run is (a test runs it).

The 2-layer Mixtral-width bf16 checkpoint of benchmarks/memory_real_width.py (written once under
.bench/, ~6.3 GB). Each run is a fresh process: the model built with every expert at cpu-16, a
32-token prefill and 32 decode steps; it reports its peak anonymous memory (RssAnon: what the
process owns) and file-backed memory (RssFile: the mapped file's pages), the experts' bytes, and
decode tok/s. Mapped (the default) and copied (MIXDESK_RAW_KERNELS=0: every expert read into
memory) alternate, rounds interleaved, with the read bandwidth measured before each round.
Targets (issue 38): anonymous memory <= 10% of the experts' bytes; decode unchanged within noise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import CACHE, read_bandwidth, record  # noqa: E402
from benchmarks.memory_real_width import SHAPE, write_checkpoint  # noqa: E402

SMOKE_SHAPE = dict(layers=2, hidden=256, ffn=512, experts=4, top_k=2, heads=4, kv_heads=2, vocab=320)

CHILD = r"""
import json, sys, time, torch
from engine.files.checkpoint import Checkpoint
from engine.machine.memory import PeakRSS, rss_parts
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
with PeakRSS(period=0.01) as peak:
    before = rss_parts()[0]
    ck = Checkpoint(sys.argv[1])
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), torch.device("cpu"), torch.bfloat16)
    cache = m.new_cache(128)
    with torch.inference_mode():
        m.forward(torch.arange(100, 132), cache, 0)
        best = 0.0
        for r in range(3):
            t0 = time.perf_counter()
            for i in range(32):
                m.forward(torch.tensor([7 + i]), cache, 32 + (i % 64))
            best = max(best, 32 / (time.perf_counter() - t0))
    eb = m.expert_bytes()
print(json.dumps({"anon_before": before, "peak_anon": peak.peak_anon, "peak_file": peak.peak_file,
                  "experts": eb["host"] + eb["mapped"], "experts_mapped": eb["mapped"], "decode_tok_s": best}))
"""


def run(path: Path, mapped: bool) -> dict:
    env = {**os.environ, "MIXDESK_RAW_KERNELS": "1" if mapped else "0"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    shape = SMOKE_SHAPE if a.smoke else SHAPE
    if a.smoke:
        a.rounds = 1
    path = CACHE / ("mapped_16bit-smoke" if a.smoke else "mixtral-width-2layer")
    if not (path / "config.json").exists():
        t0 = time.perf_counter()
        print(f"writing the {'tiny' if a.smoke else 'real-width'} checkpoint to {path} ...", flush=True)
        write_checkpoint(path, shape)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    rows = ["| round | experts | read bandwidth GB/s | decode tok/s | peak RssAnon GiB (- before load) | "
            "anon / expert bytes | peak RssFile GiB |", "|---|---|---|---|---|---|---|"]
    runs = []
    for rnd in range(a.rounds):
        for mapped in ((True, False) if rnd % 2 == 0 else (False, True)):
            bw = read_bandwidth() / 1e9
            m = run(path, mapped)
            own = m["peak_anon"] - m["anon_before"]
            m.update(round=rnd + 1, mapped=mapped, bandwidth_gbs=bw, own=own, share=own / m["experts"])
            runs.append(m)
            rows.append(f"| {rnd + 1} | {'mapped' if mapped else 'copied (MIXDESK_RAW_KERNELS=0)'} | {bw:.1f} | "
                        f"{m['decode_tok_s']:.2f} | {m['peak_anon'] / 2**30:.2f} ({own / 2**30:.2f}) | "
                        f"{m['share']:.3f} | {m['peak_file'] / 2**30:.2f} |")
            print(rows[-1], flush=True)
    best = {k: max(r["decode_tok_s"] for r in runs if r["mapped"] == k) for k in (True, False)}
    width = "a tiny model" if a.smoke else "Mixtral-8x7B"
    rows.append(f"\nExperts: {runs[0]['experts'] / 2**30:.2f} GiB (bf16, {shape['layers']} layers x "
                f"{shape['experts']} of {width}'s width). Decode, best of each: mapped {best[True]:.2f} vs "
                f"copied {best[False]:.2f} tok/s ({best[True] / best[False]:.2f}x). Target: anonymous memory "
                f"<= 10% of the experts' bytes (the column 'anon / expert bytes', the process's own growth).")
    table = "\n".join(rows)
    print(table)
    print(f"recorded {record('mapped_16bit', {'runs': runs}, table)}")


if __name__ == "__main__":
    main()
