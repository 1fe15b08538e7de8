"""Every expert on the CPU: the engine against llama.cpp on the same weights, in one run.

    python benchmarks/cpu_vs_llama_cpp.py [--new-tokens 64] [--repeats 3] [--only demo|wide]

Two models:
- "wide": Mixtral-8x7B's widths (hidden 4096, ffn 14336, 8 experts top-2, 32/8 heads), 2 layers,
  random bf16 weights and a 512-token sentencepiece vocabulary (so the lm_head does not swamp two
  layers), written once under .bench/ (5.9 GB).
- "demo": the built-in demo (SmolLM2-135M upcycled to 8 experts, 30 layers).
Engine tiers cpu-4 and cpu-16 against llama.cpp Q4_0 (its stock mix: every matrix 4-bit, output
Q6_K), Q4_0 on the experts only (the rest F16, as Mixdesk keeps it) and F16. Decode: greedy, 32-token
prompt, time from the first new token to the last, best of the repeats. Prefill: 256 tokens (wide).
The bandwidth bound is the bytes a decode step must read (the top-k experts of every layer, the
dense weights, the lm_head) over the read bandwidth measured in the same run.
llama.cpp setup: see benchmarks/llama_peer.py. Both sides use 2 threads.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import llama_peer  # noqa: E402
from benchmarks.common import CACHE, read_bandwidth, record  # noqa: E402

WIDE = dict(layers=2, hidden=4096, ffn=14336, experts=8, top_k=2, heads=32, kv_heads=8, vocab=512)
CPU = torch.device("cpu")


def wide_checkpoint() -> Path:
    path = CACHE / "mixtral-width-2l"
    if not (path / "tokenizer.model").exists():
        import sentencepiece as spm

        from benchmarks.memory_real_width import write_checkpoint
        from engine.profile import calibration_text

        print(f"writing {path} (5.9 GB, once) ...", flush=True)
        write_checkpoint(path, WIDE)
        lines = [s for s in calibration_text().splitlines() if s.strip()]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 4), model_prefix=str(path / "tokenizer"),
                                       vocab_size=WIDE["vocab"], model_type="bpe", unk_id=0, bos_id=1, eos_id=2,
                                       pad_id=-1, minloglevel=2)
    return path


def engine_run(path: Path, tier: str, prompt: list[int], prefill: list[int] | None, new: int, reps: int) -> dict:
    from engine import native
    from engine.checkpoint import Checkpoint
    from engine.kernels import auto_dtype
    from engine.model import MixtralModel
    from engine.placement import Placement, Tier

    ck = Checkpoint(path)
    d = ck.dims
    model = MixtralModel(ck, Placement.uniform(d.layers, d.experts, Tier(tier)), CPU, auto_dtype(CPU))
    decode = 0.0
    for _ in range(reps):
        cache = model.new_cache(len(prompt) + new + 8)
        tok = int(model.forward(torch.tensor(prompt), cache, 0)[-1].argmax())
        t0 = time.perf_counter()
        for i in range(new - 1):
            tok = int(model.forward(torch.tensor([tok]), cache, len(prompt) + i)[-1].argmax())
        decode = max(decode, (new - 1) / (time.perf_counter() - t0))
    pre = 0.0
    if prefill:
        for _ in range(max(1, reps - 1)):
            cache = model.new_cache(len(prefill) + 8)
            t0 = time.perf_counter()
            model.forward(torch.tensor(prefill), cache, 0)
            pre = max(pre, len(prefill) / (time.perf_counter() - t0))
    expert = model.moe[0].experts[0].nbytes
    dense = model.dense_bytes() - (0 if d.tie_embeddings else model.embed.numel() * model.embed.element_size())
    step_bytes = d.layers * d.top_k * expert + dense
    out = {"decode_tok_s": decode, "prefill_tok_s": pre, "step_bytes": step_bytes, "dtype": str(model.dtype),
           "kernel": native.status(), "native_step": model.native_step is not None}
    del model
    gc.collect()
    return out


def llama_runs(path: Path, name: str, prompt, prefill, new: int, reps: int) -> dict:
    from engine import native
    f16 = llama_peer.convert_f16(path, CACHE / f"{name}-f16.gguf")
    files = {"Q4_0": llama_peer.quantize(f16, CACHE / f"{name}-q4_0.gguf"),
             "Q4_0 experts, F16 rest": llama_peer.experts_only_q4_0(f16, CACHE / f"{name}-q4_0-experts.gguf"),
             "F16": f16}
    out = {}
    for k, f in files.items():
        out[k] = {"decode_tok_s": llama_peer.decode_tok_s(f, prompt, new, reps, threads=native.threads()),
                  "file_bytes": f.stat().st_size}
        if prefill:
            out[k]["prefill_tok_s"] = llama_peer.prefill_tok_s(f, prefill, max(1, reps - 1), threads=native.threads())
        gc.collect()
    return out


def one_model(name: str, path: Path, vocab: int, new: int, reps: int, with_prefill: bool, out) -> dict:
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (32,), generator=g).tolist()
    prefill = torch.randint(3, vocab, (256,), generator=g).tolist() if with_prefill else None
    bw0 = read_bandwidth()
    eng = {t: engine_run(path, t, prompt, prefill, new, reps) for t in ("cpu-4", "cpu-16")}
    peer = llama_runs(path, name, prompt, prefill, new, reps) if llama_peer.available() else {}
    bw = max(bw0, read_bandwidth())
    rows = [f"### {name}", "", f"engine kernel: {eng['cpu-4']['kernel']}; engine dtype {eng['cpu-16']['dtype']}; "
            f"read bandwidth {bw0 / 1e9:.1f} GB/s before, {bw / 1e9:.1f} GB/s best of before/after", "",
            "| run | decode tok/s | of bandwidth bound | prefill tok/s |", "|---|---|---|---|"]
    for t, r in eng.items():
        bound = bw / r["step_bytes"]
        r["fraction_of_bound"] = r["decode_tok_s"] / bound
        rows.append(f"| engine {t} ({r['step_bytes'] / 2**20:.0f} MiB/step) | {r['decode_tok_s']:.2f} | "
                    f"{r['fraction_of_bound']:.0%} | {r['prefill_tok_s']:.1f} |")
    for k, r in peer.items():
        rows.append(f"| llama.cpp {k} | {r['decode_tok_s']:.2f} | | {r.get('prefill_tok_s', 0):.1f} |")
    ratios = {}
    if peer:
        pairs = [("cpu-4", "Q4_0"), ("cpu-4", "Q4_0 experts, F16 rest"), ("cpu-16", "F16")]
        rows.append("")
        for t, k in pairs:
            ratios[f"{t} / {k} decode"] = eng[t]["decode_tok_s"] / peer[k]["decode_tok_s"]
            if with_prefill:
                ratios[f"{t} / {k} prefill"] = eng[t]["prefill_tok_s"] / peer[k]["prefill_tok_s"]
        rows += [f"- engine {k}: **{v:.2f}x**" for k, v in ratios.items()]
    else:
        rows.append("\n- llama-cpp-python is not installed: no peer (see benchmarks/llama_peer.py)")
    for line in rows:
        out(line)
    return {"engine": eng, "llama_cpp": peer, "ratios": ratios, "bandwidth": bw}


def main() -> None:
    from engine import native
    from engine.demo import demo_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["demo", "wide"])
    a = ap.parse_args()
    lines: list[str] = []

    def out(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    res = {}
    if a.only != "demo":
        res["wide"] = one_model("mixtral-width", wide_checkpoint(), WIDE["vocab"], a.new_tokens, a.repeats, True, out)
    if a.only != "wide":
        path = demo_dir()
        if not (path / "config.json").exists():
            sys.exit("build the demo first: mixdesk demo-model")
        res["demo"] = one_model("demo", path, 49152, a.new_tokens, a.repeats, False, out)
    out(f"\n{a.new_tokens} new tokens after a 32-token prompt, greedy, {native.threads()} threads on both sides, "
        f"best of {a.repeats}; targets: wide cpu-4/Q4_0 >= 1.0, cpu-16/F16 >= 1.0; demo cpu-4/Q4_0 >= 0.8")
    print(f"recorded {record('cpu_vs_llama_cpp' + ('-' + a.only if a.only else ''), res, chr(10).join(lines))}")


if __name__ == "__main__":
    main()
