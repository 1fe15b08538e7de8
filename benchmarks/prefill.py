"""A long prompt's reading, Mixdesk against llama.cpp (both its modes) on the same GGUF file and the
same token ids: prefill tok/s at each prompt length, its GFLOP/s and fraction of the machine's peak
(measured in the same run), and decode tok/s after each.

    python benchmarks/prefill.py [--tiny | --model qwen3|PATH.gguf] [--lengths 512,4096,16384]
        [--decode-after 128] [--llama repack,norepack] [--rounds 1] [--new-tokens 16] [--threads 2]
        [--ballast-gb 0] [--no-record] [--smoke]

`--smoke`: benchmarks/real_scale_files.py's toy-sized Qwen3 (~10 MB), prompts of 32 and 64 tokens, decode
after 48, 2 new tokens, a 120 s timeout: every stage in seconds.

Each contender runs in its own subprocess (benchmarks/real_scale.py's run_child: memory sampled every
0.2 s), loads the file once, then for each length reads a fresh prompt of that many tokens (the
first `length` ids of one random list, the same for every contender) and decodes `--new-tokens`
greedy tokens after it. Before the timed lengths each child reads one 512-token prompt and throws it
away (the file's pages and the kernels' buffers warm, as in a chat's second request). Contenders
alternate (llama repack, llama no-repack, Mixdesk) for `--rounds` rounds; the best round of each
is compared.

FLOPs of a prompt: 2 x the weights a token multiplies (every attention projection and the router,
top-k / E of each expert tensor; not the embedding, and the output matrix once: only the last
token's logits) x its tokens, plus attention: 4 x heads x head dim x the keys each query sees, per
attention layer (QK and PV, two FLOPs a multiply-add). Peaks, from engine/native/peak.c on the same
threads: int8 (vpdpbusd, the experts' and projections' products), fp32 FMA and bf16 (attention).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

GB = 1e9


def _phase(name: str) -> None:
    print("@" + json.dumps({"phase": name, "t": time.time()}), flush=True)


def child_llama(a, ids: list[int]) -> dict:
    import llama_cpp
    import numpy as np

    if a.placement == "norepack":
        import llama_cpp.llama_cpp as low

        defaults = low.llama_model_default_params

        def no_extra_bufts():
            p = defaults()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = no_extra_bufts
    _phase("load")
    llm = llama_cpp.Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.ctx,
                          n_batch=512, use_mmap=True, verbose=False)
    n_vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))

    def one(n: int) -> tuple[float, float]:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids[:n])
        tok, pre = argmax(), n / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(a.new_tokens):
            llm.eval([tok])
            tok = argmax()
        return pre, a.new_tokens / (time.perf_counter() - t)

    return run_lengths(a, one)


def child_mixdesk(a, ids: list[int]) -> dict:
    from engine.runtime.client import Client
    from engine.protocol.sampling import SamplingParams

    _phase("load")
    client = Client()
    try:
        loaded = client.load(a.model, "cpu", "cpu", "auto", a.ctx)
        params = SamplingParams(max_new_tokens=a.new_tokens + 1)  # the first token ends the prompt's reading

        def one(n: int) -> tuple[float, float]:
            done = client.generate(prompt_ids=ids[:n], params=params, fresh=True)
            return done.prefill_tok_s, done.decode_tok_s

        return {**run_lengths(a, one), "description": loaded.description}
    finally:
        client.close()


def run_lengths(a, one) -> dict:
    _phase("warm-up")
    one(min(512, max(a.lengths)))
    out = {"prefill_tok_s": {}, "decode_tok_s": {}}
    for n in sorted(set(a.lengths + a.decode_after)):
        _phase(f"prompt {n}")
        pre, dec = one(n)
        out["prefill_tok_s"][str(n)], out["decode_tok_s"][str(n)] = pre, dec
        print(f"# {n} tokens: prefill {pre:.1f} tok/s, decode after {dec:.2f} tok/s", file=sys.stderr, flush=True)
    return out


def child_main(a) -> None:
    ids = json.loads(Path(a.ids_file).read_text())
    try:
        out = (child_llama if a.child == "llama" else child_mixdesk)(a, ids)
        print("=" + json.dumps(out), flush=True)
    except Exception as e:
        import traceback

        traceback.print_exc()
        print("=" + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)


# --- the parent ----------------------------------------------------------------------------------

def prompt_flops(path: Path, n: int) -> tuple[float, float]:
    """(matrix FLOPs, attention FLOPs) of reading an n-token prompt of the GGUF file at `path`."""
    from engine.files.gguf.reader import GGUFFile

    f = GGUFFile(path)
    arch = f.get("general.architecture")
    E, K = f.get(f"{arch}.expert_count"), f.get(f"{arch}.expert_used_count")
    H, L = f.get(f"{arch}.attention.head_count"), f.get(f"{arch}.block_count")
    Hd = f.get(f"{arch}.attention.key_length") or f.get(f"{arch}.embedding_length") // H
    per_token = 0
    for name, ti in f.tensors.items():
        count = 1
        for s in ti.shape:
            count *= int(s)
        if name in ("token_embd.weight", "output.weight") or name.endswith("norm.weight"):
            continue
        per_token += count * K // E if "_exps" in name else count
    vocab_out = f.tensors.get("output.weight") or f.tensors["token_embd.weight"]
    out_params = 1
    for s in vocab_out.shape:
        out_params *= int(s)
    matrix = 2.0 * per_token * n + 2.0 * out_params  # the output matrix for the last token only
    attention = 4.0 * H * Hd * L * (n * (n + 1) / 2)  # query i sees i + 1 keys
    return matrix, attention


def peaks(threads: int) -> dict[str, float]:
    """ops/s of int8 vpdpbusd, fp32 FMA and bf16 vdpbf16ps on `threads` threads (engine/native/peak.c),
    the best of three 50 ms runs each; {} without the AVX-512 path."""
    from engine import native

    L = native.lib()
    out = {}
    for kind, name in ((0, "int8"), (1, "fp32"), (2, "bf16")):
        if L is None or L.mdk_peak(kind, 10000, threads) == 0:
            continue
        best = 0.0
        for _ in range(3):
            t = time.perf_counter()
            ops = L.mdk_peak(kind, 1_000_000, threads)
            best = max(best, ops / (time.perf_counter() - t))
        out[name] = best
    return out


def parent_main(a) -> None:
    import torch

    from benchmarks import real_scale as rs
    from benchmarks import real_scale_files as files
    from benchmarks.common import cpu_tag, machine, read_bandwidth, record

    torch.set_num_threads(a.threads)
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    if a.smoke:
        a.model_path = files.write(files.SMOKE, log=lambda m: print(m, flush=True))
    elif a.tiny or a.model in files.SHAPES:
        a.model_path = files.ensure("qwen3-tiny" if a.tiny else a.model, log=lambda m: print(m, flush=True))
    else:
        a.model_path = Path(a.model).expanduser().resolve()
    _, file_bytes, vocab = rs.step_bytes_of(a.model_path)
    top = max(a.lengths + a.decode_after)
    a.ctx = top + a.new_tokens + 64
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(300, min(vocab, 32000) - 300, (top,), generator=g).tolist()
    ids_file = Path(a.record_dir or "/tmp") / f"prefill-ids-{top}.json"
    ids_file.write_text(json.dumps(ids))

    sides = [("llama.cpp" + ("" if v == "repack" else " (no repack)"), "llama", v) for v in a.llama.split(",") if v]
    sides.append(("Mixdesk", "mixdesk", "cpu"))
    ballast = rs.start_ballast(a.ballast_gb) if a.ballast_gb else None
    runs, pk = [], {}
    try:
        for r in range(a.rounds):
            for label, side, placement in sides:
                pk_now = peaks(a.threads)
                for k, v in pk_now.items():
                    pk.setdefault(k, []).append(v)
                bw = read_bandwidth(512)
                print(f"round {r + 1}: {label} (read bandwidth {bw / GB:.1f} GB/s, int8 peak "
                      f"{pk_now.get('int8', 0) / 1e9:.0f} GOPS)", flush=True)
                cmd = [sys.executable, str(HERE), "--child", side, "--model", str(a.model_path), "--placement",
                       placement, "--threads", str(a.threads), "--ctx", str(a.ctx), "--new-tokens", str(a.new_tokens),
                       "--lengths", ",".join(map(str, a.lengths)), "--decode-after",
                       ",".join(map(str, a.decode_after)), "--ids-file", str(ids_file)]
                res = rs.run_child(a, side, placement, ids, lambda m: print(m, flush=True), cmd=cmd)
                res.update(label=label, round=r + 1, bandwidth=bw)
                runs.append(res)
                print(f"  -> {res['status']}: prefill {res.get('prefill_tok_s')}, decode {res.get('decode_tok_s')}",
                      flush=True)
    finally:
        if ballast is not None:
            ballast.kill()
            ballast.wait()

    def best(label: str, what: str, n: int) -> float | None:
        vals = [r[what][str(n)] for r in runs if r["label"] == label and r["status"].startswith("ok")
                and str(n) in r.get(what, {})]
        return max(vals) if vals else None

    peak = {k: max(v) for k, v in pk.items()}
    out(f"### {a.model_path.name} ({file_bytes / GB:.2f} GB): a prompt read, {a.threads} threads")
    out()
    out(f"Peaks measured in this run (engine/native/peak.c, {a.threads} threads): "
        + ", ".join(f"{k} {v / 1e9:.0f} G ops/s" for k, v in peak.items()) + ". Read bandwidth "
        f"{min(r['bandwidth'] for r in runs) / GB:.1f}-{max(r['bandwidth'] for r in runs) / GB:.1f} GB/s.")
    out()
    labels = [s[0] for s in sides]
    out("| prompt tokens | " + " | ".join(f"{lab} prefill tok/s" for lab in labels)
        + " | Mixdesk / faster llama.cpp | Mixdesk GFLOP/s (matrices + attention) | of int8 peak |")
    out("|---" * (len(labels) + 4) + "|")
    table = {}
    for n in sorted(a.lengths):
        vals = {lab: best(lab, "prefill_tok_s", n) for lab in labels}
        peers = [v for lab, v in vals.items() if lab != "Mixdesk" and v]
        mine = vals.get("Mixdesk")
        mat, att = prompt_flops(a.model_path, n)
        gflops = (mat + att) / (n / mine) / 1e9 if mine else None
        ratio = mine / max(peers) if mine and peers else None
        table[n] = {"prefill": vals, "ratio": ratio, "gflops": gflops, "matrix_flops": mat, "attention_flops": att}
        frac = gflops * 1e9 / peak["int8"] if gflops and peak.get("int8") else None
        out(f"| {n:,} | " + " | ".join(f"{v:.1f}" if v else "-" for v in vals.values())
            + f" | {'**%.2fx**' % ratio if ratio else '-'} | "
            + (f"{gflops:.0f} ({mat / (mat + att):.0%} matrices)" if gflops else "-")
            + f" | {'%.0f%%' % (100 * frac) if frac else '-'} |")
    out()
    out("| decode after | " + " | ".join(f"{lab} tok/s" for lab in labels) + " |")
    out("|---" * (len(labels) + 1) + "|")
    for n in sorted(set(a.lengths + a.decode_after)):
        out(f"| {n:,} tokens | " + " | ".join(f"{v:.2f}" if (v := best(lab, 'decode_tok_s', n)) else "-"
                                             for lab in labels) + " |")
    m = [table[n]["prefill"].get("Mixdesk") for n in sorted(a.lengths)]
    if len(m) > 1 and all(m):
        out()
        out(f"Mixdesk's prefill at {max(a.lengths):,} tokens is {m[-1] / m[0]:.0%} of its rate at {min(a.lengths):,}.")
    out()
    out("| run | round | status | peak RssAnon GB | peak RssFile GB |")
    out("|---|---|---|---|---|")
    for r in runs:
        out(f"| {r['label']} | {r['round']} | {r['status'][:150]} | {r['peak'].get('RssAnon', 0) / GB:.2f} | "
            f"{r['peak'].get('RssFile', 0) / GB:.2f} |")
    out()
    out(f"machine: {machine()}")
    out(f"command: python benchmarks/{HERE.name} " + " ".join(sys.argv[1:]))
    if not a.no_record:
        name = f"prefill-{a.model_path.stem}-{cpu_tag()}"  # each CPU kind's record of the day kept
        print(f"recorded {record(name, {'file': str(a.model_path), 'runs': runs, 'peaks': peak, 'table': table}, chr(10).join(lines))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3", help="qwen3 | a GGUF file")
    ap.add_argument("--tiny", action="store_true", help="the 4-layer, full-width Qwen3-30B-A3B (0.66 GB)")
    ap.add_argument("--lengths", default="512,4096,16384")
    ap.add_argument("--decode-after", default="128", help="more prompt lengths to time decode after")
    ap.add_argument("--llama", default="repack,norepack")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ballast-gb", type=float, default=0)
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--ctx", type=int, default=0)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    ap.add_argument("--record-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=["llama", "mixdesk"], help=argparse.SUPPRESS)
    ap.add_argument("--placement", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke and not a.child:
        a.lengths, a.decode_after, a.new_tokens, a.rounds, a.timeout = "32,64", "48", 2, 1, 120
    a.lengths = [int(x) for x in a.lengths.split(",") if x]
    a.decode_after = [int(x) for x in a.decode_after.split(",") if x]
    if a.child:
        child_main(a)
    else:
        parent_main(a)


if __name__ == "__main__":
    main()
