"""The demo's decode step, before and after the native path: time per token, the bandwidth-bound
time for the bytes a step reads, and the per-layer overhead (step time beyond that bound, per layer).

    python benchmarks/decode_step.py [--model FOLDER] [--tiers cpu-4,cpu-16]

--model takes any model folder, a synthetic one included (`mixdesk synthetic-model`); the default
is the demo.

Three variants, each in its own process (the library is chosen at load):
- "torch": MIXDESK_NATIVE=0, the engine as it was before the native kernels (torch's int4 and
  16-bit kernels, a Python loop over the layers);
- "native experts": the native kernels for experts and dense GEMVs, the Python loop over layers;
- "native step": every layer of a decode step in one native call (the default).
Greedy decode of 64 tokens after a 32-token prompt, median step time; read bandwidth measured in the
same process right before.

--smoke: the cpu-16 tier only, 8 tokens timed (after the 8 not counted), on a tiny random Mixtral (smoke_model(),
written once under .bench/) unless --model names one; recorded as the full run is (a test runs it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record, smoke_model  # noqa: E402

CHILD = r"""
import json, sys, time, statistics, torch
from engine import native
from engine.native import choice
from engine.tools.bench_kernels import read_bandwidth
from engine.runtime.load import open_checkpoint
from engine.native.dense_linear import auto_dtype
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.sources.demo import demo_dir
tier, variant, folder, new = sys.argv[1], sys.argv[2], sys.argv[3] or str(demo_dir()), int(sys.argv[4])
ck = open_checkpoint(folder); d = ck.dims
m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier(tier)), torch.device("cpu"), auto_dtype(torch.device("cpu")))
if variant == "native experts":
    m.native_step = None
bw = read_bandwidth()
cache = m.new_cache(160)
tok = int(m.forward(torch.arange(100, 132), cache, 0)[-1].argmax())
steps = []
for i in range(8 + new):
    t0 = time.perf_counter()
    tok = int(m.forward(torch.tensor([tok]), cache, 32 + i)[-1].argmax())
    steps.append(time.perf_counter() - t0)
step = statistics.median(steps[8:])
ex = m.moe[0].experts[0].nbytes
nbytes = d.layers * d.top_k * ex + m.dense_bytes()
if m.lm_head is not m.embed:  # a step reads one row of the embedding table, not all of it
    nbytes -= m.embed.numel() * m.embed.element_size()
print(json.dumps({"step_s": step, "bytes": nbytes, "bandwidth": bw, "kernel": native.status(),
                  "dtype": str(m.dtype), "layers": d.layers, "family": d.family,
                  "native_step": choice.step_ready(m)}))
"""


def run(tier: str, variant: str, model: str, new: int = 64, timeout: int = 900) -> dict:
    env = dict(os.environ)
    if variant == "torch":
        env["MIXDESK_NATIVE"] = "0"
    r = subprocess.run([sys.executable, "-c", CHILD, tier, variant, model, str(new)], capture_output=True, text=True,
                       env=env, cwd=Path(__file__).resolve().parents[1], timeout=timeout)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])



def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="a model folder (default: the demo)")
    ap.add_argument("--tiers", default="cpu-4,cpu-16")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.tiers = "cpu-16"
        args.model = args.model or str(smoke_model())
    rows = ["| tier | variant | kernel | step ms | tok/s | bytes/step MiB | bound ms | of bound | overhead per layer us |",
            "|---|---|---|---|---|---|---|---|---|"]
    res = {}
    for tier in args.tiers.split(","):
        for variant in ("torch", "native experts", "native step"):
            r = run(tier, variant, args.model, *((8, 100) if args.smoke else (64, 900)))
            if variant == "native step" and not r["native_step"]:
                raise SystemExit(f"the native step does not take this model ({r['family']})")
            bound = r["bytes"] / r["bandwidth"]
            r["overhead_per_layer_s"] = (r["step_s"] - bound) / r["layers"]
            res[f"{tier} {variant}"] = r
            rows.append(f"| {tier} | {variant} | {r['kernel']} ({r['dtype'].replace('torch.', '')}) | "
                        f"{r['step_s'] * 1e3:.2f} | {1 / r['step_s']:.1f} | {r['bytes'] / 2**20:.0f} | {bound * 1e3:.2f} | "
                        f"{bound / r['step_s']:.0%} | {r['overhead_per_layer_s'] * 1e6:.0f} |")
            print(rows[-1], flush=True)
    rows += ["", "bound = bytes a step reads (top-k experts of every layer, dense weights but one row of an untied "
             "embedding table, lm_head) / read bandwidth measured in the same process; overhead per layer = (step - bound) / layers"]
    table = "\n".join(rows)
    print(table)
    name = "decode_step" + (f"_{Path(args.model).name}" if args.model else "")
    print(f"recorded {record(name, res, table)}")


if __name__ == "__main__":
    main()
