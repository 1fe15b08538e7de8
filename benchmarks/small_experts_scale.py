"""Calibration and migration with thousands of small experts: a Qwen3-30B-A3B-shaped model (48
layers x 128 experts, top-8) at tiny widths (hidden 256, expert ffn 64: 49 K weights an expert), so
that per-expert fixed costs, not weight bytes, decide the time.

    python benchmarks/small_experts_scale.py [--layers 48]

The weights are seeded random tensors (engine/sources/synthetic.py). Printed, each from this run:
- calibration (1,024 tokens, tiers cpu-4 and gpu-4): the total; the model's own forwards (capture
  and the per-layer KL passes: per-layer work); and per expert what is left, split by cProfile
  into native kernel calls, bitsandbytes (gpu-4's NF4, on the CPU here), torch ops, and the
  Python of engine/ itself (self time);
- migration: every expert cpu-16 -> cpu-4 through Model.apply (read, quantise, install), against
  the same work done bare in a loop (read + Q4 quantise) on a sample of experts, in the same run.
No baseline: no peer calibrates or re-places experts live. --smoke: 2 layers of 8 experts, 64 tokens of
calibration, every stage as above.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def split(stats: pstats.Stats) -> dict[str, float]:
    """Self time by where it was spent: native calls, bitsandbytes, torch's C ops, engine/ Python."""
    out = {"native": 0.0, "bitsandbytes": 0.0, "torch ops": 0.0, "engine python": 0.0, "other": 0.0}
    for (file, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        if file.endswith("engine/native/__init__.py") and name == "call":
            out["native"] += tt
        elif "bitsandbytes" in file:
            out["bitsandbytes"] += tt
        elif file == "~" and ("torch" in name or "method" in name):
            out["torch ops"] += tt
        elif "/engine/" in file:
            out["engine python"] += tt
        else:
            out["other"] += tt
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.layers = 2
    import torch

    from engine import native
    from engine.experts.expert import read_expert
    from engine.model.forward import MoEModel
    from engine.placement import Placement, Tier
    from engine.measures import profile as P
    from engine.experts.quant import cpu4_format
    from engine.sources.synthetic import SyntheticCheckpoint, write_synthetic

    raw = json.loads((ROOT / "resources" / "qwen3-30b-a3b-config.json").read_text())
    raw.update(num_hidden_layers=args.layers, hidden_size=256, moe_intermediate_size=64, intermediate_size=256,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096, bos_token_id=1,
               eos_token_id=2)
    if args.smoke:
        raw.update(num_experts=8)
    tokens = 64 if args.smoke else 1024
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(raw))
    ck = SyntheticCheckpoint(write_synthetic(tmp / "model", tmp / "config.json"))
    d = ck.dims
    n = d.layers * d.experts
    cpu = torch.device("cpu")
    t = time.perf_counter()
    model = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), cpu, torch.bfloat16)
    load_s = time.perf_counter() - t
    ids = ck.load_tokenizer()(P.calibration_text())["input_ids"][:tokens]
    import bitsandbytes  # noqa: F401  (its first import, ~3 s, is not calibration's)

    forward_s = 0.0
    real_forward = model.forward

    def timed_forward(*a, **k):
        nonlocal forward_s
        t0 = time.perf_counter()
        try:
            return real_forward(*a, **k)
        finally:
            forward_s += time.perf_counter() - t0
    model.forward = timed_forward
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    P.calibrate(model, ids)
    prof.disable()
    cal_s = time.perf_counter() - t
    model.forward = real_forward
    cal_split = split(pstats.Stats(prof))
    model.forward = timed_forward
    forward_s = 0.0
    t = time.perf_counter()
    P.calibrate(model, ids)  # again without the profiler: the figure quoted
    cal_plain_s = time.perf_counter() - t
    cal_forward_s = forward_s
    model.forward = real_forward

    sample = [(l, e) for l in range(0, d.layers, max(1, d.layers // 4)) for e in range(0, d.experts, 4)]
    fmt = cpu4_format()
    t = time.perf_counter()
    for l, e in sample:
        w13, w2 = read_expert(ck, l, e)
        fmt.quantize(w13), fmt.quantize(w2)
    bare_ms = (time.perf_counter() - t) / len(sample) * 1e3
    target = Placement.uniform(d.layers, d.experts, Tier.CPU4)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    model.apply(target)
    prof.disable()
    mig_prof_s = time.perf_counter() - t
    mig_split = split(pstats.Stats(prof))
    model.apply(Placement.uniform(d.layers, d.experts, Tier.CPU16))
    t = time.perf_counter()
    model.apply(target)
    mig_s = time.perf_counter() - t

    per_expert_cal = (cal_plain_s - cal_forward_s) / n * 1e3
    rows = [
        f"model: {d.layers} x {d.experts} experts (top-{d.top_k}), hidden {d.hidden}, expert ffn {d.ffn} "
        f"({3 * d.hidden * d.ffn / 1e3:.0f} K weights an expert); CPU kernel: {native.status()}",
        f"load (all cpu-16): {load_s:.1f} s",
        f"calibration, {len(ids):,} tokens, cpu-4 + gpu-4: {cal_plain_s:.1f} s; of it the model's forwards (capture, "
        f"per-layer KL) {cal_forward_s:.1f} s; the rest {per_expert_cal:.2f} ms an expert",
        f"  under cProfile ({cal_s:.1f} s), self time: " + ", ".join(f"{k} {v:.1f} s" for k, v in cal_split.items()),
        f"migration, all {n:,} experts cpu-16 -> cpu-4 (Model.apply): {mig_s:.1f} s = {mig_s / n * 1e3:.2f} ms an "
        f"expert; the same read + quantise bare in a loop: {bare_ms:.2f} ms an expert "
        f"({len(sample)} experts); overhead {mig_s / n * 1e3 - bare_ms:+.2f} ms an expert",
        f"  under cProfile ({mig_prof_s:.1f} s), self time: " + ", ".join(f"{k} {v:.1f} s" for k, v in mig_split.items()),
    ]
    print("\n".join(rows))
    path = record("small_experts_scale", {
        "layers": d.layers, "experts": d.experts, "hidden": d.hidden, "ffn": d.ffn, "load_s": load_s,
        "calibration_s": cal_plain_s, "calibration_forward_s": cal_forward_s, "calibration_split": cal_split,
        "migration_s": mig_s, "bare_ms_per_expert": bare_ms, "migration_split": mig_split}, "```\n" + "\n".join(rows)
        + "\n```")
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
