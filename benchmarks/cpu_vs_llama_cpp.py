"""Every expert on the CPU: the engine against llama.cpp on the same weights, in one run.

    python benchmarks/cpu_vs_llama_cpp.py [--new-tokens 64] [--repeats 3] [--only demo|wide] [--no-16] [--smoke]

Two models:
- "wide": Mixtral-8x7B's widths (hidden 4096, ffn 14336, 8 experts top-2, 32/8 heads), 2 layers,
  random bf16 weights and a 512-token sentencepiece vocabulary (so the lm_head does not swamp two
  layers), written once under .bench/ (5.9 GB).
- "demo": the built-in demo (SmolLM2-135M upcycled to 8 experts, 30 layers).
Both engines on the very same Q4_K_M GGUF file, made by llama.cpp's own converter and quantiser (Mixdesk
keeps every matrix in the file's blocks on the CPU); then engine tiers cpu-4 (Q4_K where rows are
whole 256-blocks, else the 5-bit grid) and cpu-16 of the safetensors folder against llama.cpp Q4_0
(its stock mix: every matrix 4-bit, output Q6_K), Q4_0 on the experts only (the rest F16) and F16. All contenders are
loaded at once and measured in interleaved rounds, best of the rounds. Decode: greedy, 32-token
prompt, time from the first new token to the last. Prefill: 256 tokens, best of 2.
The bandwidth bound is the bytes a decode step must read (the top-k experts of every layer, the
dense weights, the lm_head) over the read bandwidth measured just before that round.
llama.cpp setup: see benchmarks/llama_peer.py. Both sides use 2 threads.
`--smoke`: toy stand-ins for both models (WIDE_SMOKE, DEMO_SMOKE: 2 layers, vocab 512, written once under
.bench/; their GGUF files named apart), 4 new tokens, one round.
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
from benchmarks.common import CACHE, read_bandwidth, record, smoke_model  # noqa: E402

WIDE = dict(layers=2, hidden=4096, ffn=14336, experts=8, top_k=2, heads=32, kv_heads=8, vocab=512)
CPU = torch.device("cpu")
# --smoke's stand-ins, 2 layers each, random bf16 weights and a small byte-level BPE (common.smoke_model):
# "wide" at toy widths (whole 256-blocks, an lm_head of its own); "demo" with the demo's hidden 576 (not whole
# 256-blocks: cpu-4's 5-bit grid), 9/3 heads and tied embeddings
WIDE_SMOKE = dict(layers=2, hidden=256, ffn=512, experts=8, top_k=2, heads=4, kv_heads=2, vocab=512)
DEMO_SMOKE = dict(layers=2, hidden=576, ffn=512, experts=8, top_k=2, heads=9, kv_heads=3, vocab=512,
                  tie_word_embeddings=True, rope_theta=100000.0)


def wide_checkpoint() -> Path:
    path = CACHE / "mixtral-width-2l"
    if not (path / "tokenizer.model").exists():
        import sentencepiece as spm

        from benchmarks.memory_real_width import write_checkpoint
        from engine.measures.profile import calibration_text

        print(f"writing {path} (5.9 GB, once) ...", flush=True)
        write_checkpoint(path, WIDE)
        lines = [s for s in calibration_text().splitlines() if s.strip()]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 4), model_prefix=str(path / "tokenizer"),
                                       vocab_size=WIDE["vocab"], model_type="bpe", unk_id=0, bos_id=1, eos_id=2,
                                       pad_id=-1, minloglevel=2)
    return path


class Engine:
    """The engine on one model at one tier, every expert on the CPU, driven step by step as the
    Generator drives it (forward, then greedy argmax)."""

    def __init__(self, path: Path, tier: str, dense_blocks=None):
        from engine import native
        from engine.native.dense_linear import auto_dtype
        from engine.runtime.load import open_checkpoint
        from engine.model.forward import MoEModel
        from engine.placement import Placement, Tier

        ck = open_checkpoint(path)  # a safetensors folder or a GGUF file
        d = ck.dims
        self.model = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier(tier)), CPU, auto_dtype(CPU),
                                  dense_blocks=dense_blocks)
        m = self.model
        # a step reads one row of the embedding, unless it is the lm_head too
        dense = m.dense_bytes() - (0 if d.tie_embeddings else m.embed.nbytes)
        # experts may differ in bytes (a GGUF file's down matrices are Q4_K in some layers, Q6_K in others)
        per_layer = [sum(e.nbytes for e in b.experts) / d.experts for b in m.moe]
        self.step_bytes = int(d.top_k * sum(per_layer) + dense)
        label = ck.format_label() if ck.is_gguf else tier
        self.info = {"dtype": str(m.dtype), "kernel": native.status(), "native_step": m.native_step is not None,
                     "weights": label}

    def decode(self, prompt: list[int], new: int) -> float:
        m = self.model
        cache = m.new_cache(len(prompt) + new + 8)
        tok = int(m.forward(torch.tensor(prompt), cache, 0)[-1].argmax())
        t0 = time.perf_counter()
        for i in range(new - 1):
            tok = int(m.forward(torch.tensor([tok]), cache, len(prompt) + i)[-1].argmax())
        return (new - 1) / (time.perf_counter() - t0)

    def prefill(self, ids: list[int]) -> float:
        cache = self.model.new_cache(len(ids) + 8)
        t0 = time.perf_counter()
        self.model.forward(torch.tensor(ids), cache, 0)
        return len(ids) / (time.perf_counter() - t0)


def gguf_step_bytes(path: Path) -> int:
    """Bytes one decode step of a GGUF file reads: top-k of E of each expert tensor, every dense
    tensor, and one row of the embedding when the output matrix is a separate tensor."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    field = lambda k: int(r.fields[f"{arch}.{k}"].parts[-1][0])
    E, K = field("expert_count"), field("expert_used_count")
    names = {t.name for t in r.tensors}
    total = 0.0
    for t in r.tensors:
        if "_exps" in t.name:
            total += int(t.n_bytes) * K / E
        elif t.name != "token_embd.weight" or "output.weight" not in names:
            total += int(t.n_bytes)
    return int(total)


class Peer:
    def __init__(self, gguf: Path):
        from engine import native

        self.llm = llama_peer.load(gguf, native.threads())
        self.file_bytes = gguf.stat().st_size
        self.step_bytes = gguf_step_bytes(gguf)

    def decode(self, prompt, new):
        return llama_peer.decode_tok_s(self.llm, prompt, new)

    def prefill(self, ids):
        return llama_peer.prefill_tok_s(self.llm, ids)


def contenders(path: Path, name: str, with16: bool = True) -> dict:
    from gguf import GGMLQuantizationType as GT

    runs = {f"engine {t}": Engine(path, t) for t in (("cpu-4", "cpu-16") if with16 else ("cpu-4",))}
    # what cpu-4 would read with its dense matrices in Q8_0 (the app keeps them 16-bit): the bytes'
    # share of the gap to llama.cpp's Q4_0, which quantises attention too
    runs["engine cpu-4, dense Q8_0"] = Engine(path, "cpu-4", GT.Q8_0)
    if llama_peer.available():
        f16 = llama_peer.convert_f16(path, CACHE / f"{name}-f16.gguf")
        # the very same file on both sides, made by llama.cpp's own converter and quantiser
        q4km = llama_peer.quantize(f16, CACHE / f"{name}-q4_k_m.gguf", "Q4_K_M")
        runs["engine Q4_K_M GGUF"] = Engine(q4km, "cpu-16")
        runs["llama.cpp Q4_K_M"] = Peer(q4km)
        runs["llama.cpp Q4_0"] = Peer(llama_peer.quantize(f16, CACHE / f"{name}-q4_0.gguf"))
        runs["llama.cpp Q4_0 experts, F16 rest"] = Peer(llama_peer.experts_only_q4_0(f16, CACHE / f"{name}-q4_0-experts.gguf"))
        if with16:
            runs["llama.cpp F16"] = Peer(f16)
    return runs


def one_model(name: str, path: Path, vocab: int, new: int, reps: int, with_prefill: bool, out,
              with16: bool = True) -> dict:
    """Every contender loaded at once, then measured in interleaved rounds (best of each), each
    round beside its own read-bandwidth reading: this machine's bandwidth drifts 2x over minutes,
    and a sequential run once gave whichever side ran second a 1.8x faster machine."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (32,), generator=g).tolist()
    prefill = torch.randint(3, vocab, (256,), generator=g).tolist() if with_prefill else None
    runs = contenders(path, name, with16)
    best = {k: {"decode_tok_s": 0.0, "prefill_tok_s": 0.0, "bw_at_best": 0.0} for k in runs}
    bws = []
    for r in range(reps):
        for k, c in runs.items():
            bw = read_bandwidth(512)
            bws.append(bw)
            tps = c.decode(prompt, new)
            if tps > best[k]["decode_tok_s"]:
                best[k].update(decode_tok_s=tps, bw_at_best=bw)
            if prefill and r < 2:
                best[k]["prefill_tok_s"] = max(best[k]["prefill_tok_s"], c.prefill(prefill))
    eng = {k: {**best[k], **c.info, "step_bytes": c.step_bytes} for k, c in runs.items() if isinstance(c, Engine)}
    peer = {k: {**best[k], "file_bytes": c.file_bytes, "step_bytes": c.step_bytes} for k, c in runs.items()
            if isinstance(c, Peer)}
    del runs
    gc.collect()
    first = next(iter(eng.values()))
    rows = [f"### {name}", "", f"engine kernel: {first['kernel']}; engine dtype {first['dtype']}; read bandwidth "
            f"{min(bws) / 1e9:.1f}-{max(bws) / 1e9:.1f} GB/s across the rounds", "",
            "| run | decode tok/s | of bandwidth bound | prefill tok/s |", "|---|---|---|---|"]
    for k, r in eng.items():
        r["fraction_of_bound"] = r["decode_tok_s"] * r["step_bytes"] / r["bw_at_best"]
        rows.append(f"| {k} ({r['step_bytes'] / 2**20:.0f} MiB/step) | {r['decode_tok_s']:.2f} | "
                    f"{r['fraction_of_bound']:.0%} | {r['prefill_tok_s']:.1f} |")
    for k, r in peer.items():
        r["fraction_of_bound"] = r["decode_tok_s"] * r["step_bytes"] / r["bw_at_best"]
        rows.append(f"| {k} ({r['file_bytes'] / 2**20:.0f} MiB file, {r['step_bytes'] / 2**20:.0f} MiB/step) | "
                    f"{r['decode_tok_s']:.2f} | {r['fraction_of_bound']:.0%} | {r['prefill_tok_s']:.1f} |")
    ratios = {}
    if peer:
        rows.append("")
        for t, k in [("Q4_K_M GGUF", "Q4_K_M"), ("cpu-4", "Q4_0"), ("cpu-4", "Q4_0 experts, F16 rest"),
                     ("cpu-4, dense Q8_0", "Q4_0"), ("cpu-16", "F16")]:
            if f"engine {t}" not in eng or f"llama.cpp {k}" not in peer:
                continue
            e, p = eng[f"engine {t}"], peer[f"llama.cpp {k}"]
            ratios[f"{t} / {k} decode"] = e["decode_tok_s"] / p["decode_tok_s"]
            if with_prefill:
                ratios[f"{t} / {k} prefill"] = e["prefill_tok_s"] / p["prefill_tok_s"]
        rows += [f"- engine {k}: **{v:.2f}x**" for k, v in ratios.items()]
    else:
        rows.append("\n- llama-cpp-python is not installed: no peer (see benchmarks/llama_peer.py)")
    for line in rows:
        out(line)
    return {"engine": eng, "llama_cpp": peer, "ratios": ratios, "bandwidth_readings": bws}


def main() -> None:
    from engine import native
    from engine.sources.demo import demo_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["demo", "wide"])
    ap.add_argument("--no-16", action="store_true", help="leave out engine cpu-16 and llama.cpp F16 (RAM: the "
                    "wide model's 16-bit copies take 12 GB)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.new_tokens, a.repeats = 4, 1
    lines: list[str] = []

    def out(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    res = {}
    if a.only != "demo":
        if a.smoke:  # its own names: the GGUF files cached under .bench/ are named after them
            res["wide"] = one_model("mixtral-width-smoke", smoke_model("mixtral-width-2l-smoke", **WIDE_SMOKE),
                                    WIDE_SMOKE["vocab"], a.new_tokens, a.repeats, True, out, not a.no_16)
        else:
            res["wide"] = one_model("mixtral-width", wide_checkpoint(), WIDE["vocab"], a.new_tokens, a.repeats,
                                    True, out, not a.no_16)
    if a.only != "wide":
        if a.smoke:
            res["demo"] = one_model("demo-smoke", smoke_model("demo-shaped-smoke", **DEMO_SMOKE),
                                    DEMO_SMOKE["vocab"], a.new_tokens, a.repeats, True, out, not a.no_16)
        else:
            path = demo_dir()
            if not (path / "config.json").exists():
                sys.exit("build the demo first: mixdesk demo-model")
            res["demo"] = one_model("demo", path, 49152, a.new_tokens, a.repeats, True, out, not a.no_16)
    out(f"\n{a.new_tokens} new tokens after a 32-token prompt, greedy, {native.threads()} threads on both sides, "
        f"best of {a.repeats}; targets: Q4_K_M GGUF decode >= 1.0 (goal 1.2) and prefill of 256 >= 1.2, "
        f"cpu-4/Q4_0 >= 1.0 and cpu-16/F16 >= 1.0 on both models")
    print(f"recorded {record('cpu_vs_llama_cpp' + ('-' + a.only if a.only else ''), res, chr(10).join(lines))}")


if __name__ == "__main__":
    main()
