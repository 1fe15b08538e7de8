"""Where the first start's calibration holds memory, step by step, on a real-size model.

    python benchmarks/calibration_memory.py [MODEL] [--steps 260]

MODEL defaults to the full-size Qwen3-30B-A3B-shaped Q4_K_M of benchmarks/real_scale_files.py. Every
expert at cpu-16 (the file's own blocks, mapped); the calibration (engine/measures/profile.py) run
step by step in this process, printing the process's own memory (RssAnon) after the capture, after
each KL pass and at steps through the first two layers (128 experts + 1 KL step a layer).
--smoke: a tiny random Mixtral (2 layers of 4 experts, written once under MIXDESK_BENCH_CACHE), 128 tokens.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, smoke_model  # noqa: E402



def main() -> None:
    from engine.runtime.load import load
    from engine.machine.memory import rss_parts
    from engine.measures import profile as P

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(CACHE / "qwen3-30b-a3b-q4_k_m.gguf"))
    ap.add_argument("--steps", type=int, default=260)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.model = str(smoke_model())

    def anon() -> float:
        return rss_parts()[0] / 2**30

    ld = load(a.model, placement="cpu", device="cpu", dtype="bf16")
    print(f"loaded: RssAnon {anon():.2f} GiB", flush=True)
    ids = P.calibration_ids(ld.tokenizer, 128 if a.smoke else 1024)
    capture, logprobs = P.capture, P._logprobs
    passes = [0]

    def traced_capture(model, ids):
        r = capture(model, ids)
        held = sum(t.numel() * t.element_size() for rec in r for t in rec) / 2**30
        print(f"after the capture of {len(ids)} tokens: RssAnon {anon():.2f} GiB (records {held:.2f} GiB)", flush=True)
        return r

    def traced_logprobs(model, ids, start=None):
        out = logprobs(model, ids, start)
        passes[0] += 1
        print(f"after KL pass {passes[0]}: RssAnon {anon():.2f} GiB", flush=True)
        return out

    P.capture, P._logprobs = traced_capture, traced_logprobs
    per_layer = ld.ckpt.dims.experts + 1
    marks = {1, 2, per_layer // 4, per_layer // 2, per_layer - 1, per_layer, per_layer + 1, 2 * per_layer}
    t0, peak = time.time(), 0.0
    for k, _ in enumerate(P.calibrate_steps(ld.model, ids), start=1):
        peak = max(peak, anon())
        if k in marks:
            print(f"step {k}: RssAnon {anon():.2f} GiB at {time.time() - t0:.0f} s", flush=True)
        if k >= a.steps:
            break
    print(f"peak RssAnon over {k} steps: {peak:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
