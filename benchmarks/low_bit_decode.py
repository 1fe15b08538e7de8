"""Decode on the GGUF files people pick when Q4_K_M does not fit (issue 46, must-show 2): Q3_K_M, Q2_K and
IQ4_XS of the 4-layer full-width and the full-size Qwen3-30B-A3B, Mixdesk against llama.cpp (both its
modes) on the same file, interleaved, with the bytes a token reads and the fraction of the read bandwidth.

    python benchmarks/low_bit_decode.py [--sizes tiny,full] [--recipes Q3_K_M,Q2_K,IQ4_XS] [--rounds 2]

The files are made once under .bench/ by llama.cpp's own quantiser (llama-cpp-python's
llama_model_quantize, allow_requantize) from benchmarks/real_scale_files.py's Q4_K_M files: llama.cpp's
type mix for each recipe over random blocks (IQ4_XS without an importance matrix, as llama-quantize
makes it without one; the i-quants below 4 bits need one, so they are not here). Each file then goes
through benchmarks/real_scale.py (each contender in its own process, memory sampled, the best warm round
of each, the read bandwidth measured before each child), which records it; this script records one
table of them all.

--smoke: Q3_K_M of real_scale_files.py's toy-sized Qwen3 (SMOKE, a few MB; both written once under .bench/)
through real_scale.py with one round of one warm request (16 prompt, 4 new tokens, a 120 s timeout a child),
recorded as the full run is (a test runs it); it exits non-zero when a file's row failed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = {"tiny": "qwen3-30b-a3b-tiny-q4_k_m.gguf", "full": "qwen3-30b-a3b-q4_k_m.gguf",
           "smoke": "qwen3-smoke-q4_k_m.gguf"}  # smoke: real_scale_files.SMOKE, --smoke's


def requantised(size: str, recipe: str) -> Path:
    """.bench/<source stem without q4_k_m>-<recipe>.gguf, made by llama.cpp's quantiser if missing."""
    import llama_cpp

    from benchmarks.common import CACHE

    src = CACHE / SOURCES[size]
    if size == "smoke":
        from benchmarks import real_scale_files

        src = real_scale_files.write(real_scale_files.SMOKE, src)  # a few MB, once
    if not src.exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks/real_scale_files.py"),
                        "qwen3-tiny" if size == "tiny" else "qwen3"], check=True)
    out = CACHE / SOURCES[size].replace("q4_k_m", recipe.lower())
    if out.exists():
        return out
    part = out.with_suffix(".part")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe}")
    p.nthread, p.allow_requantize = 2, True
    t = time.time()
    if llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), ctypes.byref(p)) != 0:
        raise SystemExit(f"llama.cpp's quantiser failed on {src.name} -> {recipe}")
    part.rename(out)
    print(f"wrote {out.name} ({out.stat().st_size / 1e9:.2f} GB) in {time.time() - t:.0f} s", flush=True)
    return out


def main() -> None:
    from benchmarks.common import cpu_tag, machine, record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny,full")
    ap.add_argument("--recipes", default="Q3_K_M,Q2_K,IQ4_XS")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--drop-full", action="store_true",
                    help="delete each full-size file once measured (the three take 42 GB of disk together)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    env = None
    if a.smoke:
        from benchmarks.common import RESULTS

        a.sizes, a.recipes, a.rounds, a.new_tokens = "smoke", "Q3_K_M", 1, 4
        env = {**os.environ, "MIXDESK_BENCH_RESULTS": str(RESULTS)}  # the children record where this run does
    rows = []
    for size in a.sizes.split(","):
        for recipe in a.recipes.split(","):
            path = requantised(size, recipe)
            cmd = [sys.executable, str(ROOT / "benchmarks/real_scale.py"), "--model", str(path), "--placement", "cpu",
                   "--llama", "repack,norepack", "--rounds", str(a.rounds), "--new-tokens", str(a.new_tokens)]
            if a.no_record:
                cmd.append("--no-record")
            if a.smoke:  # real_scale.py's own --smoke takes its toy file, not this one: its settings, spelled out
                cmd += ["--decode-rounds", "2", "--prompt-tokens", "16", "--ctx", "256", "--timeout", "120"]
            print("$", " ".join(cmd[1:]), flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            print(r.stdout[-3000:], r.stderr[-2000:] if r.returncode else "", flush=True)
            if a.drop_full and size == "full":
                path.unlink()
            m = re.search(r"recorded (\S+\.md)", r.stdout)
            if r.returncode or not m:
                rows.append((size, recipe, path, None))
                continue
            rows.append((size, recipe, path, json.loads(Path(m.group(1)).with_suffix(".json").read_text())))
    lines = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    out("### Decode on below-4-bit GGUF files: Mixdesk against llama.cpp on the same file, 2 threads")
    out()
    out("| file | GB | bytes a token read | llama.cpp tok/s | llama.cpp (no repack) tok/s | Mixdesk tok/s | "
        "Mixdesk / faster llama.cpp | Mixdesk of bandwidth bound | llama.cpp of bound |")
    out("|---|---|---|---|---|---|---|---|---|")
    for size, recipe, path, res in rows:
        if res is None:
            out(f"| {path.name} | - | - | - | - | - | failed | - | - |")
            continue
        best = {}
        for run in res["runs"]:
            if run.get("status") == "ok" and run.get("decode_tok_s"):
                if run["label"] not in best or run["decode_tok_s"] > best[run["label"]]["decode_tok_s"]:
                    best[run["label"]] = run
        ll = [best.get("llama.cpp"), best.get("llama.cpp (no repack)")]
        md = best.get("Mixdesk cpu")
        top = max((x for x in ll if x), key=lambda x: x["decode_tok_s"], default=None)
        step = res["step_bytes"]

        def frac(run):
            return f"{run['fraction_of_bound']:.0%}" if run and run.get("fraction_of_bound") else "-"

        out(f"| {path.name} | {res['file_bytes'] / 1e9:.2f} | {step / 1e6:.0f} MB | "
            + " | ".join(f"{x['decode_tok_s']:.2f}" if x else "-" for x in ll)
            + f" | {md['decode_tok_s']:.2f} | **{md['decode_tok_s'] / top['decode_tok_s']:.2f}x** | {frac(md)} | "
              f"{frac(top)} |" if md and top else " | - | - | - | - |")
    out()
    out(f"machine: {machine()}")
    out("command: python benchmarks/low_bit_decode.py " + " ".join(sys.argv[1:]))
    if not a.no_record:
        print("recorded", record(f"low_bit_decode-{a.sizes.replace(',', '-')}-{cpu_tag()}", {"rows": [
            {"size": s, "recipe": r, "file": str(p), "result": res} for s, r, p, res in rows]}, "\n".join(lines)))
    if a.smoke and not a.no_record and any(res is None for *_, res in rows):
        raise SystemExit("a file's run failed (above)")


if __name__ == "__main__":
    main()
