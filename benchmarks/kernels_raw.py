"""Record the native kernels on a GGUF file's own rows ("raw", engine/native/kraw.c: what the engine runs
from a read-only mapping of the file) against the same weights repacked into the kernels' tiles
(kquant.c / qblock.c: a copy in anonymous memory), timed interleaved in one run.

    python benchmarks/kernels_raw.py [--rounds 7] [--threads 2] [--quick] [--other-formats] [--in-cache] [--smoke]

--smoke: one copy of each Qwen3 matrix (no Mixtral ones) and one round, recorded as the full run is (a test
runs it; --quick, 8 and 2 copies of all and 2 rounds, is not recorded).

Shapes: Qwen3-30B-A3B's experts (gate+up [1536, 2048] Q4_K as the engine holds it, gate's 768 rows and
up's 768 in two places; down [2048, 768] in Q6_K and in Q4_K), 64 experts' matrices of each, so that a
pass reads 56-113 MB, past the 32 MB L3 this was written on; and Mixtral's (gate+up [28672, 4096] Q4_K,
down [4096, 14336] Q6_K), two copies of each. Random valid blocks (speed does not depend on values).
--other-formats: the other six formats at Qwen3's down shape instead; --in-cache: one copy of each
Qwen3 matrix (1-2 MB, cache-resident: the kernels' compute, not the memory's speed). Neither is
recorded (print only). Each call is mdk_matmul (the activation quantised, the rows split over the threads), called through
ctypes in a loop over the copies: the same ~2 us of call overhead for both layouts. T = 1 and 4 tokens.
Per configuration: the best round's time for one matrix, its GB/s (bytes of the matrix / time), and
raw / tiled as a speed ratio (> 1: raw faster); the read bandwidth (benchmarks/common.read_bandwidth)
is measured between rounds in the same run.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from benchmarks.common import read_bandwidth, record  # noqa: E402
from engine import native  # noqa: E402
from engine.files.gguf.blockquant import BlockQuant  # noqa: E402

D_AT = {GT.Q4_K: (0, 4), GT.Q5_K: (0, 4), GT.Q6_K: (208, 2), GT.Q8_0: (0, 2), GT.Q4_0: (0, 2), GT.Q4_1: (0, 4),
        GT.Q5_0: (0, 2), GT.Q5_1: (0, 4)}  # fp16 d (and dmin / m): offset, bytes


def random_rows(rng, qt: GT, n: int, k: int) -> torch.Tensor:
    """n valid rows [n, row_bytes]: random bytes with small finite fp16 scales."""
    block, size = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    at, nd = D_AT[qt]
    raw[..., at:at + nd] = (rng.standard_normal((n, k // block, nd // 2)) * 0.01).astype(np.float16).view(
        np.uint8).reshape(n, k // block, nd)
    return torch.from_numpy(raw.reshape(n, -1))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        f = {l.split(":", 1)[0].strip(): l.split(":", 1)[1].strip() for l in out.splitlines() if ":" in l}
        return f"{f.get('Model name', '?')} (family {f.get('CPU family', '?')}, model {f.get('Model', '?')}), " \
               f"{f.get('CPU(s)', '?')} CPUs, L3 {f.get('L3 cache', '?')}"
    except OSError:
        return "unknown"


def build(rng, qt: GT, n: int, k: int, copies: int, split: bool):
    """copies pairs (raw, tiled) of one [n, k] matrix; split: the raw one in two parts (gate, up)."""
    out = []
    for _ in range(copies):
        rows = random_rows(rng, qt, n, k)
        parts = [rows[: n // 2].reshape(-1), rows[n // 2:].reshape(-1)] if split else [rows.reshape(-1)]
        if split:  # two separate allocations, as gate's and up's rows are two places in a file
            parts = [p.clone() for p in parts]
        raw = BlockQuant.from_file(qt, parts, (n, k))
        assert raw.mapped
        out.append((raw, BlockQuant.from_raw(qt, rows, (n, k))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer copies and rounds (a smoke run, not recorded)")
    ap.add_argument("--other-formats", action="store_true", help="Q5_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (not recorded)")
    ap.add_argument("--in-cache", action="store_true", help="one copy of each Qwen3 matrix (not recorded)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    native._threads = a.threads
    L = native.lib()
    rng = np.random.default_rng(0)
    many, few = (1, 1) if a.smoke else (8, 1) if a.quick else (1, 1) if a.in_cache else (64, 2)
    configs = [  # (name, qtype, n, k, copies, two parts)
        ("qwen3 gate+up", GT.Q4_K, 1536, 2048, many, True),
        ("qwen3 down", GT.Q6_K, 2048, 768, many, False),
        ("qwen3 down", GT.Q4_K, 2048, 768, many, False),
        ("mixtral gate+up", GT.Q4_K, 28672, 4096, few, True),
        ("mixtral down", GT.Q6_K, 4096, 14336, few, False),
    ]
    if a.in_cache or a.smoke:
        configs = configs[:3]
    if a.other_formats:
        configs = [("qwen3 down", qt, 2048, 768, many, False) for qt in (GT.Q5_K, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1)]
    print(f"CPU: {cpu_model()}\n{native.status()}, {a.threads} threads; building weights ...", flush=True)
    mats = {c: build(rng, c[1], c[2], c[3], c[4], c[5]) for c in configs}
    rounds = 1 if a.smoke else 2 if a.quick else a.rounds
    Ts = (1, 4)
    times = {(c, T, lay): [] for c in configs for T in Ts for lay in ("raw", "tiled")}  # per round: s / matrix
    bws = []
    for r in range(rounds + 1):  # round 0 warms up
        if r:
            bws.append(read_bandwidth(512, reps=3))
        for c in configs:
            k = c[3]
            for T in Ts:
                x = torch.randn(T, k)
                y = torch.empty(T, c[2])
                xp, yp = x.data_ptr(), y.data_ptr()
                order = ("raw", "tiled") if r % 2 else ("tiled", "raw")
                for lay in order:
                    descs = [ctypes.byref((raw if lay == "raw" else tiled).desc) for raw, tiled in mats[c]]
                    reps = max(1, 8 // len(descs))
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        for d in descs:
                            L._cdll.mdk_matmul(d, xp, native.F32, T, yp, a.threads)
                    dt = (time.perf_counter() - t0) / (reps * len(descs))
                    if r:
                        times[(c, T, lay)].append(dt)
    bw = statistics.median(bws)
    lines = [f"- CPU: {cpu_model()}", f"- kernel: {native.status()}, {a.threads} threads",
             f"- read bandwidth (torch sum over 512 MiB, each round): median {bw / 1e9:.1f} GB/s, "
             f"range {min(bws) / 1e9:.1f}-{max(bws) / 1e9:.1f}", "",
             "| matrix | format | shape [N, K] | MB | copies | T | tiled ms | tiled GB/s | raw ms | raw GB/s "
             "| raw / tiled speed (best) | (median of rounds) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    payload = []
    for c in configs:
        name, qt, n, k, copies, split = c
        nbytes = mats[c][0][0].nbytes
        for T in Ts:
            rt, tt = times[(c, T, "raw")], times[(c, T, "tiled")]
            best_r, best_t = min(rt), min(tt)
            med = statistics.median(t / r_ for t, r_ in zip(tt, rt))
            lines.append(f"| {name}{' (2 parts)' if split else ''} | {qt.name} | [{n}, {k}] | {nbytes / 1e6:.1f} | "
                         f"{copies} | {T} | {best_t * 1e3:.3f} | {nbytes / best_t / 1e9:.1f} | {best_r * 1e3:.3f} | "
                         f"{nbytes / best_r / 1e9:.1f} | {best_t / best_r:.2f} | {med:.2f} |")
            payload.append({"matrix": name, "format": qt.name, "n": n, "k": k, "copies": copies, "two_parts": split,
                            "T": T, "bytes": nbytes, "tiled_s": tt, "raw_s": rt})
    for l in lines:
        print(l)
    if a.quick or a.other_formats or a.in_cache:
        return
    table = ("\n".join(lines) + "\n\nTimes are per matrix (each call: mdk_matmul, fp32 activations quantised to "
             "int8, rows split over the threads), best of the rounds; GB/s = the matrix's bytes / that time. "
             "Raw and tiled are timed interleaved in each round (alternating which goes first).")
    print(f"recorded {record('kernels_raw', {'cpu': cpu_model(), 'read_bandwidth': bws, 'results': payload}, table)}")


if __name__ == "__main__":
    main()
