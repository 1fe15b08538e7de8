"""Peak RSS follows the placement, at Mixtral's real widths.

    python benchmarks/memory_real_width.py [--smoke]

`--smoke`: the same two placements on a toy 2-layer checkpoint (hidden 256, ffn 512, 8 experts, vocab 1024;
~14 MB, written once under .bench/mixtral-width-2layer-smoke), to check the harness in seconds.

Writes (once, under .bench/) a 2-layer checkpoint with random bf16 weights at Mixtral-8x7B's
widths: hidden 4096, ffn 14336, 8 experts, vocab 32000 (~6.3 GB, one shard per layer plus an index).
Then, for each placement, a fresh process loads it, runs a 32-token prefill and 16 decode steps,
and reports its peak RSS (the kernel's high-water mark) against the bytes the placement keeps
resident in host memory plus the dense part.

On a CPU-only machine the accelerator tier is the CPU device (the engine's test seam), so its
experts count as host-resident too; on a GPU machine they would live in VRAM instead.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, record  # noqa: E402

SHAPE = dict(layers=2, hidden=4096, ffn=14336, experts=8, top_k=2, heads=32, kv_heads=8, vocab=32000)
SMOKE_SHAPE = dict(layers=2, hidden=256, ffn=512, experts=8, top_k=2, heads=4, kv_heads=2, vocab=1024)


def write_checkpoint(path: Path, shape: dict | None = None) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import MixtralConfig

    s = shape or SHAPE
    cfg = MixtralConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
                        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                        num_key_value_heads=s["kv_heads"], num_local_experts=s["experts"],
                        num_experts_per_tok=s["top_k"], max_position_embeddings=4096, bos_token_id=1,
                        architectures=["MixtralForCausalLM"],
                        eos_token_id=2)
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * shape[-1] ** -0.5).to(torch.bfloat16)

    D, I, V = s["hidden"], s["ffn"], s["vocab"]
    hd = D // s["heads"]
    weight_map = {}
    shards = [{"model.embed_tokens.weight": rnd(V, D), "lm_head.weight": rnd(V, D),
               "model.norm.weight": torch.ones(D, dtype=torch.bfloat16)}]
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        t = {p + "input_layernorm.weight": torch.ones(D, dtype=torch.bfloat16),
             p + "post_attention_layernorm.weight": torch.ones(D, dtype=torch.bfloat16),
             p + "self_attn.q_proj.weight": rnd(D, D), p + "self_attn.k_proj.weight": rnd(s["kv_heads"] * hd, D),
             p + "self_attn.v_proj.weight": rnd(s["kv_heads"] * hd, D), p + "self_attn.o_proj.weight": rnd(D, D),
             p + "block_sparse_moe.gate.weight": rnd(s["experts"], D)}
        for e in range(s["experts"]):
            q = p + f"block_sparse_moe.experts.{e}."
            t[q + "w1.weight"], t[q + "w3.weight"], t[q + "w2.weight"] = rnd(I, D), rnd(I, D), rnd(D, I)
        shards.append(t)
    n = len(shards)
    for i, t in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(t, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in t})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg.to_json_file(str(path / "config.json"))


CHILD = r"""
import json, sys, torch
from engine.files.checkpoint import Checkpoint
from engine.machine.memory import lifetime_peak_rss
from engine.model.forward import MoEModel
from engine.placement import Placement
import psutil
base = psutil.Process().memory_info().rss
ck = Checkpoint(sys.argv[1])
pl = Placement.from_json(sys.argv[2])
m = MoEModel(ck, pl, torch.device("cpu"), torch.bfloat16)
cache = m.new_cache(64)
m.forward(torch.arange(100, 132), cache, 0)
for i in range(16):
    m.forward(torch.tensor([7 + i]), cache, 32 + i)
eb = m.expert_bytes()
kv_used = cache.nbytes * 48 // 64
print(json.dumps({"base_rss": base, "peak_rss": lifetime_peak_rss(), "experts_host": eb["host"],
                  "experts_accel": eb["accelerator"], "dense": m.dense_bytes(), "kv_used": kv_used}))
"""


def main() -> None:
    from engine.placement import Placement, Tier

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    shape = SMOKE_SHAPE if a.smoke else SHAPE
    path = CACHE / ("mixtral-width-2layer-smoke" if a.smoke else "mixtral-width-2layer")
    if not (path / "config.json").exists():
        t0 = time.perf_counter()
        print(f"writing the {'toy' if a.smoke else 'real'}-width checkpoint to {path} ...", flush=True)
        write_checkpoint(path, shape)
        print(f"  {time.perf_counter() - t0:.0f} s")
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    L, E = shape["layers"], shape["experts"]
    placements = {
        "all cpu-16": Placement.uniform(L, E, Tier.CPU16),
        "half gpu-16 (seam) / half cpu-16": Placement.random(L, E, [Tier.GPU16, Tier.CPU16], seed=0),
    }
    rows = ["| placement | resident experts + dense | peak RSS | ratio | python+torch before load |",
            "|---|---|---|---|---|"]
    out = {"checkpoint_bytes": size, "runs": {}}
    for name, pl in placements.items():
        r = subprocess.run([sys.executable, "-c", CHILD, str(path), pl.to_json()], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[1])
        if r.returncode:
            sys.exit(r.stderr)
        m = json.loads(r.stdout.strip().splitlines()[-1])
        resident = m["experts_host"] + m["experts_accel"] + m["dense"]
        ratio = m["peak_rss"] / resident
        out["runs"][name] = {**m, "resident": resident, "ratio": ratio}
        rows.append(f"| {name} | {resident / 2**30:.2f} GiB | {m['peak_rss'] / 2**30:.2f} GiB | {ratio:.3f} | "
                    f"{m['base_rss'] / 2**30:.2f} GiB |")
    rows.append(f"\nCheckpoint on disk: {size / 2**30:.2f} GiB (bf16). Target: peak RSS <= 1.2x resident.")
    table = "\n".join(rows)
    print(table)
    print(f"recorded {record('memory_real_width', out, table)}")


if __name__ == "__main__":
    main()
