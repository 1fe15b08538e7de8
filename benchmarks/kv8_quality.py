"""What 8-bit keys and values (Load.kv_bits 8, engine/kv/int8.py) change against 16-bit ones, on one text
read to 16K positions: perplexity, and the KL divergence of the 8-bit run's next-token distribution
from the 16-bit run's (mean over positions, nats), over the first 4,096 and the first 16,384
positions and the last 1,024 of those; the bytes a token at 16 and at 8 bits; and the native decode
step after 4,096 and 16,384 positions both ways (best and median of the steps, interleaved).

    python benchmarks/kv8_quality.py [--model PATH] [--positions 16384] [--chunk 512] [--steps 16]

Default model: the 4-layer full-width Qwen3-30B-A3B Q4_K_M of benchmarks/real_scale_files.py
(qwen3-tiny): random blocks and a synthetic tokenizer, so its perplexity says nothing about language;
the KL between the two caches' runs is still the measure of what the cache's rounding changes
downstream. The two runs share one file mapping (two MoEModels, bf16, every expert on the CPU): each
chunk of the text is read by both, the logits of both compared chunk by chunk, so neither run's
[positions, vocab] logits are ever held whole. The text: this repository's README, design sketch and
engine sources, in a fixed order, tokenised by the model's own tokenizer, cut to --positions + 1.
Writes benchmarks/results/kv8-quality-<model>-<date>.md (and .json; MIXDESK_BENCH_RESULTS moves the folder).
--smoke: a tiny random Mixtral (heads of 32, written once under MIXDESK_BENCH_CACHE) unless --model, 64
positions in chunks of 32, decode timed (4 steps each way) after 32 and 64, the last 16 positions as the tail.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

import torch  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent



def text_ids(tokenizer, n: int) -> list[int]:
    """n token ids of this repository's own prose and code, in a fixed order."""
    files = [ROOT / "README.md", ROOT / "shared" / "DESIGN.md"] + sorted((ROOT / "engine").rglob("*.py"))
    ids: list[int] = []
    for f in files:
        if f.exists():
            ids += tokenizer.encode(f.read_text(errors="replace"), add_special_tokens=False)
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"the text gives {len(ids):,} tokens, fewer than {n:,}")


def machine() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    return f"{name} (lscpu's model name), {os.cpu_count()} cores"


def rounding_error(cache16, upto: int) -> dict:
    """The 16-bit cache's rows stored at 8 bits and widened again: the error's RMS over the rows' RMS,
    keys and values apart (what the 8-bit cache's attention reads instead)."""
    from engine.kv import int8 as kv8

    out = {}
    for name, t in (("keys", cache16.k), ("values", cache16.v)):
        x = t[:, :, :upto].float()
        rows = torch.empty(*x.shape[:-1], kv8.row_bytes(x.shape[-1]), dtype=torch.uint8)
        kv8.pack(x, rows)
        out[name] = ((kv8.unpack(rows) - x).pow(2).mean() / x.pow(2).mean()).sqrt().item()
    return out


def decode_times(model, cache, pos: int, steps: int) -> list[float]:
    """Seconds of each of `steps` decode steps at positions pos.. (rows written there are overwritten by
    the next chunk read)."""
    out = []
    tok = torch.tensor([11])
    for i in range(steps):
        t0 = time.perf_counter()
        model.forward(tok, cache, pos + i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model file or folder (default: the qwen3-tiny GGUF)")
    ap.add_argument("--positions", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed each way at each length")
    ap.add_argument("--marks", default="4096,16384", help="positions after which decode is timed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    tail = 1024  # the last positions' span
    if a.smoke:
        from benchmarks.common import smoke_model

        a.model = a.model or str(smoke_model("tiny-mixtral-smoke-kv8", heads=2, kv_heads=2))
        a.positions, a.chunk, a.steps, a.marks, tail = 64, 32, 4, "32,64", 16

    from engine.machine.devices import detect
    from engine.runtime.load import open_checkpoint, parse_placement
    from engine.model.forward import MoEModel
    from engine.native import choice

    if a.model is None:
        import real_scale_files

        a.model = str(real_scale_files.ensure("qwen3-tiny"))
    ck = open_checkpoint(a.model)
    accel = detect("cpu")
    dtype = torch.bfloat16
    pl = parse_placement("cpu", ck, accel, dtype)
    models = {bits: MoEModel(ck, pl, accel.device, dtype, kv_bits=bits) for bits in (16, 8)}
    native = {bits: choice.whole_step(m) for bits, m in models.items()}
    n = min(a.positions, ck.dims.max_positions - a.steps - 1)
    ids = torch.tensor(text_ids(ck.load_tokenizer(), n + 1))
    marks = sorted({int(x) for x in a.marks.split(",") if int(x) <= n})
    ctx = n + a.steps + 1
    caches = {bits: m.new_cache(ctx) for bits, m in models.items()}
    nll = {16: [], 8: []}
    kl: list[float] = []
    rel: list[float] = []  # each position's logit change, RMS over the 16-bit logits' RMS about their mean
    decode: dict = {}
    t_read = {16: 0.0, 8: 0.0}
    t0 = time.time()
    for start in range(0, n, a.chunk):
        end = min(start + a.chunk, n)
        logp = {}
        for bits, m in models.items():
            t = time.perf_counter()
            logits = m.forward(ids[start:end], caches[bits], start, all_logits=True)
            t_read[bits] += time.perf_counter() - t
            logp[bits] = torch.log_softmax(logits.float(), -1)
            del logits
        nxt = ids[start + 1:end + 1]
        for bits in (16, 8):
            nll[bits] += (-logp[bits].gather(1, nxt[:, None])[:, 0]).tolist()
        kl += (logp[16].exp() * (logp[16] - logp[8])).sum(-1).tolist()
        centred = logp[16] - logp[16].mean(-1, keepdim=True)  # the logits less their mean (log_softmax's shift cancels)
        change = (logp[8] - logp[8].mean(-1, keepdim=True)) - centred
        rel += (change.pow(2).mean(-1) / centred.pow(2).mean(-1)).sqrt().tolist()
        del centred, change
        del logp
        if end in marks:
            times = {16: [], 8: []}
            for _ in range(2):  # interleaved: half the steps each way, twice
                for bits in (16, 8):
                    times[bits] += decode_times(models[bits], caches[bits], end, a.steps // 2)
            decode[end] = {bits: {"best_ms": 1e3 * min(v), "median_ms": 1e3 * statistics.median(v)}
                           for bits, v in times.items()}
        print(f"{end:,} positions, {time.time() - t0:.0f} s; mean KL so far {statistics.fmean(kl):.3g}", flush=True)

    def span(lo: int, hi: int) -> dict:
        hi = min(hi, len(kl))
        return {"positions": f"{lo:,}-{hi - 1:,}", "kl_mean": statistics.fmean(kl[lo:hi]),
                "kl_max": max(kl[lo:hi]), "logit_change": statistics.fmean(rel[lo:hi]),
                "ppl_16": math.exp(statistics.fmean(nll[16][lo:hi])), "ppl_8": math.exp(statistics.fmean(nll[8][lo:hi]))}

    spans = [span(0, m) for m in marks] + ([span(max(0, n - tail), n)] if n > tail else [])
    d = ck.dims
    bytes_token = {bits: c.token_bytes for bits, c in caches.items()}
    res = {"date": datetime.date.today().isoformat(), "machine": machine(), "model": Path(a.model).name,
           "command": "python " + " ".join([sys.argv[0]] + sys.argv[1:]), "positions": n, "chunk": a.chunk,
           "layers": d.layers, "kv_heads": d.kv_heads, "head_dim": d.head_dim, "native_decode": native,
           "bytes_per_token": bytes_token, "cache_bytes_at_positions": {b: v * n for b, v in bytes_token.items()},
           "read_s": t_read, "spans": spans, "decode": decode, "rounding": rounding_error(caches[16], n)}
    stem = Path(a.model).name.removesuffix(".gguf")
    from benchmarks.common import RESULTS

    out = Path(a.out) if a.out else RESULTS / f"kv8-quality-{stem}-{res['date']}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    lines = [f"# 8-bit keys and values against 16-bit: {res['model']}", "",
             f"{res['date']}, {res['machine']}. `{res['command']}`", "",
             f"{d.layers} layers x {d.kv_heads} kv heads x {d.head_dim} wide; keys and values a token: "
             f"{bytes_token[16]:,} bytes at 16 bits (bf16), {bytes_token[8]:,} at 8 "
             f"({bytes_token[8] / bytes_token[16]:.3f}x); at {n:,} positions {bytes_token[16] * n / 1e6:,.0f} MB "
             f"and {bytes_token[8] * n / 1e6:,.0f} MB. Native decode step: {native}.", "",
             f"The 16-bit cache's rows rounded to 8 bits: RMS error {res['rounding']['keys']:.4f} of the keys' RMS, "
             f"{res['rounding']['values']:.4f} of the values'.", "",
             "| positions | mean KL (nats) | largest KL | logit change (RMS, relative) | perplexity 16-bit | perplexity 8-bit |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {s['positions']} | {s['kl_mean']:.3g} | {s['kl_max']:.3g} | {s['logit_change']:.3g} | "
              f"{s['ppl_16']:,.6g} | {s['ppl_8']:,.6g} |" for s in spans]
    lines += ["", f"Reading the text in chunks of {a.chunk}: {t_read[16]:.1f} s at 16 bits, {t_read[8]:.1f} s at 8.", "",
              "| decode after | 16-bit best / median ms | 8-bit best / median ms |", "| --- | --- | --- |"]
    lines += [f"| {p:,} | {v[16]['best_ms']:.1f} / {v[16]['median_ms']:.1f} | {v[8]['best_ms']:.1f} / {v[8]['median_ms']:.1f} |"
              for p, v in decode.items()]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(out)


if __name__ == "__main__":
    main()
