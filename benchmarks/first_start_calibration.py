"""What a first start's background calibration costs on a real-size model: time and memory.

    python benchmarks/first_start_calibration.py [MODEL] [--tiers cpu-4] [--steps N]

MODEL defaults to the full-size Qwen3-30B-A3B-shaped Q4_K_M of benchmarks/real_scale_files.py. The
model is opened as a first start opens it (every expert at cpu-16: the file's own blocks, mapped),
then the calibration (engine/measures/profile.py calibrate_steps) runs step by step in this process
with the 4-bit tiers given (default: those the engine measures on this machine, calibrated_tiers),
to its end or for N steps. Printed: seconds and the process's own memory (RssAnon) at each layer's
end, the peaks of RssAnon and RssFile (sampled every 0.1 s by a thread), the steps that built or
measured nothing (a layer whose experts are 4-bit in the file), and the read bandwidth of this machine
measured in the same run (the calibration's speed drifts with it). --smoke: a tiny random Mixtral (2 layers
of 4 experts, written once under MIXDESK_BENCH_CACHE), 128 tokens, to the end; bandwidth over 256 MiB.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, smoke_model  # noqa: E402



def read_bandwidth_gbs(mib: int = 1024) -> float:
    import torch

    a = torch.ones(mib * 2**20 // 4)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return a.numel() * 4 / best / 1e9


def main() -> None:
    from engine.runtime.load import load
    from engine.machine.memory import rss_parts
    from engine.placement import Tier
    from engine.measures import profile as P

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(CACHE / "qwen3-30b-a3b-q4_k_m.gguf"))
    ap.add_argument("--tiers", default="", help="comma-separated 4-bit tiers (default: this machine's)")
    ap.add_argument("--steps", type=int, default=0, help="stop after N steps (0: to the end)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    mib = 1024
    if a.smoke:
        a.model, mib = str(smoke_model()), 256

    print(f"read bandwidth {read_bandwidth_gbs(mib):.1f} GB/s", flush=True)
    t_load = time.perf_counter()
    ld = load(a.model, placement="cpu", device="cpu", dtype="bf16")
    print(f"loaded in {time.perf_counter() - t_load:.1f} s: RssAnon {rss_parts()[0] / 2**30:.2f} GiB", flush=True)
    tiers = (tuple(Tier(t) for t in a.tiers.split(",")) if a.tiers
             else P.calibrated_tiers(ld.accel.cpu_only))
    print(f"tiers measured: {', '.join(t.value for t in tiers)}", flush=True)
    peaks, stop = [0, 0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            anon, file = rss_parts()
            peaks[0], peaks[1] = max(peaks[0], anon), max(peaks[1], file)
            stop.wait(0.1)

    threading.Thread(target=sample, daemon=True).start()
    ids = P.calibration_ids(ld.tokenizer, 128 if a.smoke else 1024)
    per_layer = ld.ckpt.dims.experts + 1
    gen = P.calibrate_steps(ld.model, ids, tiers)
    t0, k, mp = time.perf_counter(), 0, None
    try:
        while True:
            next(gen)
            k += 1
            if k > 1 and (k - 1) % per_layer == 0:
                print(f"layer {(k - 1) // per_layer - 1} done: step {k} at {time.perf_counter() - t0:.1f} s, "
                      f"RssAnon {rss_parts()[0] / 2**30:.2f} GiB", flush=True)
            if a.steps and k >= a.steps:
                break
    except StopIteration as done:
        mp = done.value
    took = time.perf_counter() - t0
    stop.set()
    print(f"{'calibrated' if mp else 'stopped'} after {k} steps in {took:.1f} s; peak RssAnon "
          f"{peaks[0] / 2**30:.2f} GiB, peak RssFile {peaks[1] / 2**30:.2f} GiB", flush=True)
    same = [l for l in range(ld.ckpt.dims.layers) if all(P._same_as_reference(ld.ckpt, l, t, ld.model.dtype)
                                                         for t in tiers)]
    print(f"layers with nothing to build or measure (4-bit in the file at every tier measured): {len(same)} of "
          f"{ld.ckpt.dims.layers} {same}", flush=True)
    if mp is not None:
        print(f"layer KL {[round(v, 5) for v in mp.layer_kl]}")
    print(f"read bandwidth {read_bandwidth_gbs(mib):.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
