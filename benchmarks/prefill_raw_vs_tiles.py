"""A prompt's matrix products on a GGUF file's own rows (the raw kernels the engine runs from the mapped
file, engine/native/kraw.c) against the same Q4_K weights repacked into the kernels' tiles (kquant.c),
and what the repacking costs: is repacking a matrix for a long prompt worth it?

    python benchmarks/prefill_raw_vs_tiles.py [--rounds 3] [--smoke]

--smoke: the expert's gate+up shape only, 16 tokens, one round, recorded as the full run is (a test runs it).

Shapes: Qwen3.5-35B-A3B's DeltaNet in_proj_qkv [8192, 2048], a [2048, 4096] output projection, and an
expert's gate+up [1024, 2048]; T = 16, 128, 512 and 2048 prompt tokens; Q4_K, random weights, 2 threads.
Per shape and T: the best round's ms for raw, tiles, and the repack (BlockQuant.from_raw), and the
speed of raw against repack + tiles (> 1: keep the raw rows). Compute-bound at these T (GFLOP/s shown);
the read bandwidth of the same run is measured once (benchmarks/common.read_bandwidth) for the record.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402

from benchmarks.common import read_bandwidth, record  # noqa: E402
from engine.files.gguf.blockquant import BlockQuant, quantize_raw  # noqa: E402

SHAPES = ((8192, 2048), (2048, 4096), (1024, 2048))
TOKENS = (16, 128, 512, 2048)


def best(f, rounds: int) -> float:
    f()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    shapes, tokens = (SHAPES[-1:], TOKENS[:1]) if a.smoke else (SHAPES, TOKENS)
    if a.smoke:
        a.rounds = 1
    torch.manual_seed(0)
    bw = read_bandwidth() / 1e9  # GB/s
    rows, out = [], []
    for n, k in shapes:
        raw = quantize_raw(torch.randn(n, k) * 0.02, GT.Q4_K)
        file_rows = BlockQuant.from_file(GT.Q4_K, [raw.reshape(-1)], (n, k))
        pack = best(lambda: BlockQuant.from_raw(GT.Q4_K, raw, (n, k)), a.rounds)
        tiles = BlockQuant.from_raw(GT.Q4_K, raw, (n, k))
        for t in tokens:
            x = torch.randn(t, k)
            r = best(lambda: file_rows.matmul(x), a.rounds)
            p = best(lambda: tiles.matmul(x), a.rounds)
            gf = 2 * t * n * k / 1e9
            ratio = (pack + p) / r
            out.append(dict(shape=[n, k], tokens=t, raw_ms=r * 1e3, tiles_ms=p * 1e3, repack_ms=pack * 1e3,
                            raw_over_repack_and_tiles=ratio))
            rows.append(f"| [{n}, {k}] | {t} | {r * 1e3:.2f} ({gf / r:.0f} GF/s) | {p * 1e3:.2f} ({gf / p:.0f} GF/s) "
                        f"| {pack * 1e3:.2f} | {ratio:.2f}x |")
            print(rows[-1], flush=True)
    table = ("| matrix (Q4_K) | tokens | raw ms | tiles ms | repack ms | raw vs repack + tiles |\n"
             "|---|---|---|---|---|---|\n" + "\n".join(rows) +
             f"\n\nRead bandwidth in this run: {bw:.1f} GB/s.")
    print(record("prefill_raw_vs_tiles", {"rows": out, "read_gb_s": bw}, table))


if __name__ == "__main__":
    main()
