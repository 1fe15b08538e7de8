"""Decode speed of the engine against stock transformers, in one run, on the same checkpoint.

    python benchmarks/decode_vs_transformers.py [--new-tokens 128] [--model DIR]

The checkpoint is bf16. Stock transformers runs it at bf16 (the issue's baseline) and, for an honest
comparison, at fp16 too; the engine runs its cpu-16 tier in whichever 16-bit format it measures
faster on this CPU (see engine/native/dense_linear.py), with its native kernels where built. Greedy, the same prompt, 128 new tokens. Stock transformers runs
`MixtralForCausalLM.generate` with each of its expert implementations; the ratio is taken against
the faster one. Read bandwidth is measured in the same run, and the engine's decode speed is
reported as a fraction of the bandwidth bound: bytes a decode step must read / bandwidth.

--smoke: a tiny random Mixtral (benchmarks/common.py: smoke_model(), written once under .bench/) unless
--model names one, an 8-token prompt, 8 new tokens, one repeat; recorded as the full run is (a test runs it).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import demo_shaped_model, read_bandwidth, record  # noqa: E402


def stock(path: Path, prompt: list[int], new: int, impl: str, dtype=torch.bfloat16) -> tuple[float, list[int]]:
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(path), dtype=dtype, experts_implementation=impl).eval()
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        total = time.perf_counter() - t0
    del model
    return (new - 1) / (total - t_prefill), out[0, len(prompt):].tolist()


def engine_run(path: Path, prompt: list[int], new: int, reps: int):
    from engine.runtime.generate import SamplingParams
    from engine.runtime.load import load

    loaded = load(path, "cpu", device="cpu", dtype="auto", ctx=1024)
    gen = loaded.generator
    gen.eos_ids.clear()
    best = None
    for _ in range(reps):
        fin = list(gen.stream(prompt, SamplingParams(max_new_tokens=new)))[-1]
        if best is None or fin.decode_tok_s > best.decode_tok_s:
            best = fin
    return loaded, best


def bytes_per_decode_token(loaded, mean_pos: float) -> int:
    m, d = loaded.model, loaded.model.dims
    dense = m.norm.numel() + m.lm_head.numel() + sum(
        l.ln1.numel() + l.wqkv.numel() + l.wo.numel() + l.ln2.numel() for l in m.layers) + sum(
        b.gate.numel() for b in m.moe)
    item = m.embed.element_size()
    experts = sum(b.experts[0].nbytes for b in m.moe) * d.top_k
    kv = d.layers * 2 * d.kv_heads * d.head_dim * mean_pos * item
    return int(dense * item + experts + kv)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        from benchmarks.common import smoke_model

        a.model = a.model or smoke_model()
        a.new_tokens, a.prompt_tokens, a.repeats = 8, 8, 1
    path = a.model or demo_shaped_model()
    torch.manual_seed(0)
    from engine.files.checkpoint import Checkpoint

    vocab = Checkpoint(path).dims.vocab
    prompt = torch.randint(100, vocab, (a.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()

    bw = read_bandwidth()
    loaded, fin = engine_run(path, prompt, a.new_tokens, a.repeats)
    need = bytes_per_decode_token(loaded, a.prompt_tokens + a.new_tokens / 2)
    ours = fin.decode_tok_s
    our_dtype = str(loaded.model.dtype).replace("torch.", "")
    del loaded
    from engine import native

    native.torch_threads.widen()  # give torch its threads back before the stock runs
    stock_rates = {}
    stock_tokens = {}
    for impl in ("eager", "grouped_mm"):
        stock_rates[impl], stock_tokens[impl] = stock(path, prompt, a.new_tokens, impl)
    fp16_rate, _ = stock(path, prompt, a.new_tokens, "grouped_mm", torch.float16)
    bw_after = read_bandwidth()
    best_impl = max(stock_rates, key=stock_rates.get)
    ratio = ours / stock_rates[best_impl]
    bound = max(bw, bw_after) / need
    same = sum(x == y for x, y in zip(fin.token_ids, stock_tokens[best_impl]))
    rows = [
        "| run | decode tok/s |", "|---|---|",
        *[f"| stock transformers, experts_implementation={k} | {v:.2f} |" for k, v in stock_rates.items()],
        f"| stock transformers, fp16 weights, grouped_mm | {fp16_rate:.2f} |",
        f"| Mixdesk engine, all experts cpu-16 ({our_dtype}, engine.native.dense_linear.auto_dtype) | {ours:.2f} |",
        "",
        f"- ratio engine / best stock at bf16 ({best_impl}): **{ratio:.2f}x**",
        f"- ratio engine / stock at fp16 (its faster format here): {ours / fp16_rate:.2f}x",
        f"- read bandwidth (torch sum over 2 GiB, before/after): {bw / 1e9:.1f} / {bw_after / 1e9:.1f} GB/s",
        f"- bytes read per decode token (dense + top-{loaded_k(path)} experts/layer + KV): {need / 1e6:.0f} MB",
        f"- bandwidth bound: {bound:.1f} tok/s; engine reaches {ours / bound:.0%} of it",
        f"- greedy tokens equal to stock's: {same}/{len(fin.token_ids)} (bf16 rounding may split ties)",
        f"- model: {path.name}, bf16, {a.prompt_tokens}-token prompt, {a.new_tokens} new tokens, best of {a.repeats}",
    ]
    table = "\n".join(rows)
    print(table)
    out = record("decode_vs_transformers", {
        "model": str(path.name), "new_tokens": a.new_tokens, "stock_tok_s": stock_rates, "stock_fp16_tok_s": fp16_rate,
        "engine_tok_s": ours, "engine_dtype": our_dtype,
        "ratio": ratio, "read_bw_gbs": [bw / 1e9, bw_after / 1e9], "bytes_per_token": need,
        "bandwidth_bound_tok_s": bound, "fraction_of_bound": ours / bound, "tokens_equal": same,
    }, table)
    print(f"recorded {out}")


def loaded_k(path: Path) -> int:
    from engine.files.checkpoint import Checkpoint

    return Checkpoint(path).dims.top_k


if __name__ == "__main__":
    main()
