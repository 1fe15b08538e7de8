"""Qwen3.5-MoE's hybrid layers at real width, every expert on the CPU: the engine against llama.cpp
on the very same Q4_K_M GGUF, in one interleaved run.

    python benchmarks/hybrid_vs_llama_cpp.py [--new-tokens 48] [--repeats 3] [--no-peer] [--smoke]

The model: Qwen3.5-35B-A3B's widths (hidden 2048; 16 key / 32 value DeltaNet heads of 128; 16/2
attention heads of 256; 256 experts of 512, top-8, a shared expert of 512) and 4 layers, 3 Gated
DeltaNet + 1 gated attention, random bf16 weights, a 2,048-token vocabulary (so the lm_head does not
swamp four layers): benchmarks/hybrid_width.py, written once under .bench/ (6.7 GB). The GGUF: written
F16 by engine/files/gguf/writer.py (as llama.cpp's converter writes qwen35moe; tests/test_gguf_hybrid.py
checks that llama.cpp reads it), quantised to Q4_K_M by llama.cpp's own quantiser, and read by both.
Contenders, all loaded at once and measured in interleaved rounds (best of each), each round beside
its own read-bandwidth reading: engine on the Q4_K_M GGUF (its blocks, mapped), llama.cpp on it,
and the engine's cpu-4 and cpu-16 tiers of the safetensors folder. Decode: greedy, 32-token prompt.
Also: the share of a decode step spent in the DeltaNet mixers (timed around them in one extra decode).
`--smoke`: the same 4 layers at toy widths (QWEN35_SMOKE, 30 MB, its files under .bench/qwen35-width-smoke*),
2 new tokens, one round, a 64-token prefill; the peer whenever llama_cpp imports (its quantiser is all it needs).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import llama_peer  # noqa: E402
from benchmarks.common import CACHE, read_bandwidth, record  # noqa: E402
from benchmarks.cpu_vs_llama_cpp import Engine, Peer  # noqa: E402  (each: decode(), prefill())
from benchmarks.hybrid_width import QWEN35_WIDTH, write  # noqa: E402

VOCAB = QWEN35_WIDTH["vocab_size"]
# --smoke's model: the same layer kinds (3 Gated DeltaNet + 1 gated attention, a shared expert) at toy widths
QWEN35_SMOKE = {**QWEN35_WIDTH, "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 16,
                "num_experts_per_tok": 4, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
                "vocab_size": 512}


def width_model(config: dict = QWEN35_WIDTH, stem: str = "qwen35-width-4l") -> Path:
    path = CACHE / stem
    if not (path / "model.safetensors.index.json").exists():
        print(f"writing {path} ({'6.7 GB, ' if config is QWEN35_WIDTH else ''}once) ...", flush=True)
        write(path, config)
    if not (path / "tokenizer.json").exists():  # the GGUF writer carries a tokenizer; token ids are given directly
        from engine.sources.tiny_model import write_tokenizer

        write_tokenizer(path, config["vocab_size"])
    return path


def q4_k_m(path: Path, stem: str = "qwen35-width-4l", peer_ok: bool | None = None) -> Path | None:
    """The Q4_K_M file (written F16 by the engine, quantised by llama.cpp) when there or llama.cpp is
    there to make it (`peer_ok`, default llama_peer.available())."""
    out = CACHE / f"{stem}-q4_k_m.gguf"
    if out.exists():
        return out
    if not (llama_peer.available() if peer_ok is None else peer_ok):
        return None
    from engine.files.gguf.writer import write_gguf

    f16 = CACHE / f"{stem}-f16.gguf"
    if not f16.exists():
        write_gguf(path, f16, "f16")
    return llama_peer.quantize(f16, out, "Q4_K_M")


def deltanet_share(engine: Engine, prompt: list[int], new: int) -> dict:
    """One decode with the DeltaNet mixers timed: their share of the step."""
    from engine.layers.deltanet import GatedDeltaNet

    spent = [0.0]
    call = GatedDeltaNet.__call__

    def timed(self, m, h, run):
        t = time.perf_counter()
        try:
            return call(self, m, h, run)
        finally:
            spent[0] += time.perf_counter() - t
    GatedDeltaNet.__call__ = timed
    try:
        m = engine.model
        cache = m.new_cache(len(prompt) + new + 8)
        tok = int(m.forward(torch.tensor(prompt), cache, 0)[-1].argmax())
        spent[0] = 0.0
        t0 = time.perf_counter()
        for i in range(new - 1):
            tok = int(m.forward(torch.tensor([tok]), cache, len(prompt) + i)[-1].argmax())
        total = time.perf_counter() - t0
    finally:
        GatedDeltaNet.__call__ = call
    return {"deltanet_ms_per_token": 1e3 * spent[0] / (new - 1), "step_ms": 1e3 * total / (new - 1),
            "deltanet_share": spent[0] / total}


def main() -> None:
    from engine import native

    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-16", action="store_true", help="leave out the engine's cpu-16 tier (6.7 GB more RAM)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    config, stem, prefill_n = QWEN35_WIDTH, "qwen35-width-4l", 512
    if a.smoke:
        a.new_tokens, a.repeats = 2, 1
        config, stem, prefill_n = QWEN35_SMOKE, "qwen35-width-smoke", 64
    vocab = config["vocab_size"]
    lines: list[str] = []

    def out(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    path = width_model(config, stem)
    peer_ok = None
    if a.smoke:
        import importlib.util

        peer_ok = importlib.util.find_spec("llama_cpp") is not None
    gguf = None if a.no_peer else q4_k_m(path, stem, peer_ok)
    runs = {}
    if gguf is not None:
        runs["engine Q4_K_M GGUF"] = Engine(gguf, "cpu-16")
        runs["llama.cpp Q4_K_M"] = Peer(gguf)
    runs["engine cpu-4"] = Engine(path, "cpu-4")
    if not a.no_16:
        runs["engine cpu-16"] = Engine(path, "cpu-16")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (32,), generator=g).tolist()
    best = {k: {"decode_tok_s": 0.0, "bw_at_best": 0.0, "rounds": [], "prefill_tok_s": 0.0} for k in runs}
    long = torch.randint(3, vocab, (prefill_n,), generator=g).tolist()
    bws = []
    for _ in range(a.repeats):
        for k, c in runs.items():
            bw = read_bandwidth(512)
            bws.append(bw)
            tps = c.decode(prompt, a.new_tokens)
            best[k]["rounds"].append(round(tps, 2))
            best[k]["prefill_tok_s"] = max(best[k]["prefill_tok_s"], c.prefill(long))
            if tps > best[k]["decode_tok_s"]:
                best[k].update(decode_tok_s=tps, bw_at_best=bw)
    shares = {k: deltanet_share(c, prompt, a.new_tokens) for k, c in runs.items() if isinstance(c, Engine)}
    out(f"### Qwen3.5-35B-A3B {'layer kinds at toy widths' if a.smoke else 'width'}, 4 layers (3 Gated DeltaNet + "
        f"1 attention), every expert on the CPU")
    out("")
    out(f"engine kernel: {native.status()}; read bandwidth {min(bws) / 1e9:.1f}-{max(bws) / 1e9:.1f} GB/s across "
        f"the rounds")
    out("")
    out("| run | MiB a token reads | decode tok/s, best (median) | of bandwidth bound | DeltaNet share of a step | "
        f"prefill tok/s ({prefill_n}) |")
    out("|---|---|---|---|---|---|")
    res = {}
    for k, c in runs.items():
        r = {**best[k], "step_bytes": c.step_bytes}
        r["fraction_of_bound"] = r["decode_tok_s"] * r["step_bytes"] / r["bw_at_best"]
        sh = shares.get(k)
        if sh:
            r.update(sh)
        res[k] = r
        share = f"{sh['deltanet_share']:.0%} ({sh['deltanet_ms_per_token']:.2f} of {sh['step_ms']:.1f} ms)" if sh else "-"
        r["median_tok_s"] = sorted(r["rounds"])[len(r["rounds"]) // 2]
        out(f"| {k} | {r['step_bytes'] / 2**20:.0f} | {r['decode_tok_s']:.2f} ({r['median_tok_s']:.2f}) | "
            f"{r['fraction_of_bound']:.0%} | {share} | {r['prefill_tok_s']:.1f} |")
    if "llama.cpp Q4_K_M" in res:
        e, p = res["engine Q4_K_M GGUF"], res["llama.cpp Q4_K_M"]
        ratio, mid = e["decode_tok_s"] / p["decode_tok_s"], e["median_tok_s"] / p["median_tok_s"]
        res["ratio"], res["ratio_median"] = ratio, mid
        rounds = [f"{x / y:.2f}" for x, y in zip(e["rounds"], p["rounds"])]
        out(f"\n- engine / llama.cpp on the same Q4_K_M file, decode: **{ratio:.2f}x** best of each, {mid:.2f}x "
            f"medians, per round {', '.join(rounds)} (target >= 1.0); prefill of {prefill_n} tokens: "
            f"**{e['prefill_tok_s'] / p['prefill_tok_s']:.2f}x**")
    else:
        out("\n- no llama.cpp peer (llama-cpp-python not installed, or --no-peer)")
    out(f"\n{a.new_tokens} new tokens after a 32-token prompt, greedy, {native.threads()} threads on both sides, "
        f"best of {a.repeats} interleaved rounds")
    print(f"recorded {record('hybrid_vs_llama_cpp', {'runs': res, 'bandwidth_readings': bws}, chr(10).join(lines))}")


if __name__ == "__main__":
    main()
