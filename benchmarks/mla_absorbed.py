"""Multi-head latent attention at GLM-4.7-Flash's widths: one decode step's attention computed absorbed
(engine/layers/mla.py: the query moved into the latent space, attention over the cached [latent;
rope key] rows, values from the latents) against expanded (transformers' way: every cached latent
through kv_b into each head's keys and values, then ordinary attention), at several context lengths.

    python benchmarks/mla_absorbed.py [--contexts 256 2048 8192] [--repeats 20] [--smoke]

--smoke: one context (256) and one repeat, recorded as the full run is (a test runs it).

Both from the same random weights and cache; the outputs agree (checked each run). Torch on the
CPU, 2 threads, the engine's attention dtype (fp32); the projections before and after (q_a/q_b,
kv_a, o_proj) are the same matmuls in both and are left out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402

H, R, P, N, V = 20, 512, 64, 192, 256  # heads, kv latent, rope, no-rope and value head dims (GLM-4.7-Flash)


def absorbed(q_nope, q_rot, rows, w_k, w_v, scale):
    """q_nope [H, N], q_rot [H, P], rows [S, R + P] -> [H, V]."""
    q = torch.cat([torch.einsum("hn,hnr->hr", q_nope, w_k), q_rot], dim=-1)  # [H, R + P]
    o = F.scaled_dot_product_attention(q[None, :, None], rows[None, None], rows[None, None, :, :R], scale=scale)
    return torch.einsum("hr,hvr->hv", o[0, :, 0], w_v)


def expanded(q_nope, q_rot, rows, w_k, w_v, scale):
    latent, k_rot = rows[:, :R], rows[:, R:]
    k_nope = torch.einsum("sr,hnr->hsn", latent, w_k)  # [H, S, N]: every cached latent, every step
    v = torch.einsum("sr,hvr->hsv", latent, w_v)  # [H, S, V]
    k = torch.cat([k_nope, k_rot[None].expand(H, -1, -1)], dim=-1)
    q = torch.cat([q_nope, q_rot], dim=-1)[:, None]  # [H, 1, N + P]
    return F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale)[0, :, 0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.contexts, a.repeats = [256], 1
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    w_k, w_v = torch.randn(H, N, R, generator=g) * R ** -0.5, torch.randn(H, V, R, generator=g) * R ** -0.5
    q_nope, q_rot = torch.randn(H, N, generator=g), torch.randn(H, P, generator=g)
    scale = (N + P) ** -0.5
    lines = ["| context | absorbed ms | expanded ms | expanded / absorbed | cache MiB (absorbed rows) |", "|---|---|---|---|---|"]
    res = {}
    for S in a.contexts:
        rows = torch.randn(S, R + P, generator=g)
        ya, ye = absorbed(q_nope, q_rot, rows, w_k, w_v, scale), expanded(q_nope, q_rot, rows, w_k, w_v, scale)
        assert (ya - ye).abs().max() < 1e-3 * ye.abs().max(), "absorbed and expanded differ"
        t = {}
        for name, fn in (("absorbed", absorbed), ("expanded", expanded)):
            fn(q_nope, q_rot, rows, w_k, w_v, scale)
            t0 = time.perf_counter()
            for _ in range(a.repeats):
                fn(q_nope, q_rot, rows, w_k, w_v, scale)
            t[name] = (time.perf_counter() - t0) / a.repeats * 1e3
        res[S] = t
        lines.append(f"| {S:,} | {t['absorbed']:.3f} | {t['expanded']:.2f} | {t['expanded'] / t['absorbed']:.1f}x | "
                     f"{S * (R + P) * 4 / 2**20:.1f} |")
    lines.append(f"\nOne decode step's attention of one MLA layer at GLM-4.7-Flash widths (H {H}, latent {R}, rope {P}, "
                 f"no-rope {N}, value {V}), fp32, torch on 2 threads, mean of {a.repeats}.")
    print("\n".join(lines))
    print(f"recorded {record('mla_absorbed', {'ms': res}, chr(10).join(lines))}")


if __name__ == "__main__":
    main()
