"""End-to-end decode with 4-bit experts, in one run: the demo model with every expert cpu-4, next to
the engine at cpu-16, and next to llama.cpp at Q4_0 on the same model converted to GGUF (when
llama-cpp-python is installed; it is only a benchmark peer, none of its code is in the project).

    python benchmarks/q4_end_to_end.py [--new-tokens 128]

llama.cpp setup, once (about 15 minutes on 2 cores): `pip download --no-deps --no-binary :all:
-d .bench/llama llama-cpp-python==0.3.36 && pip install .bench/llama/llama_cpp_python-0.3.36.tar.gz
sentencepiece`. The script converts the demo with the sdist's own convert_hf_to_gguf.py and
quantises it to Q4_0 with llama_cpp.llama_model_quantize, caching both under .bench/.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, read_bandwidth, record  # noqa: E402

SDIST = CACHE / "llama" / "llama_cpp_python-0.3.36.tar.gz"


def engine_decode(path: Path, tier: str, prompt: list[int], new: int, reps: int):
    from engine.generate import SamplingParams
    from engine.load import load
    from engine.placement import Placement, Tier

    loaded = load(path, "cpu", device="cpu")
    d = loaded.ckpt.dims
    loaded.model.apply(Placement.uniform(d.layers, d.experts, Tier(tier)))
    gen = loaded.generator
    gen.eos_ids.clear()
    best = 0.0
    for _ in range(reps):
        gen.cache.tokens = []
        fin = list(gen.stream(prompt, SamplingParams(max_new_tokens=new)))[-1]
        best = max(best, fin.decode_tok_s)
    return best, loaded.model.expert_bytes()["host"]


def gguf_q4_0(model_dir: Path) -> Path | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    out = CACHE / "demo-q4_0.gguf"
    if out.exists():
        return out
    if not SDIST.exists():
        return None
    src = CACHE / "llama" / "src"
    if not src.exists():
        with tarfile.open(SDIST) as tf:
            tf.extractall(src, filter="data")
    root = next(src.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    f16 = CACHE / "demo-f16.gguf"
    if not f16.exists():
        env = {"PYTHONPATH": str(root / "gguf-py"), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", "f16",
                        "--outfile", str(f16)], check=True, env=env)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc})")
    return out


def llama_decode(gguf: Path, prompt: list[int], new: int, reps: int) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), n_threads=2, n_ctx=512, verbose=False)
    best = 0.0
    for _ in range(reps):
        llm.reset()
        n, t_first = 0, None
        t0 = time.perf_counter()
        for _tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
            if n == new:
                break
        best = max(best, (n - 1) / (time.perf_counter() - t_first))
    del llm
    return best


def main() -> None:
    from engine.demo import demo_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    path = demo_dir()
    if not (path / "config.json").exists():
        sys.exit("build the demo first: mixdesk demo-model")
    prompt = torch.randint(100, 49000, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    bw = read_bandwidth()
    rates, sizes = {}, {}
    for tier in ("cpu-4", "cpu-16"):
        rates[f"engine {tier}"], sizes[tier] = engine_decode(path, tier, prompt, a.new_tokens, a.repeats)
    gguf = gguf_q4_0(path)
    if gguf is not None:
        rates["llama.cpp Q4_0"] = llama_decode(gguf, prompt, a.new_tokens, a.repeats)
    bw2 = read_bandwidth()
    peer = "llama.cpp Q4_0" if gguf is not None else "engine cpu-16"
    ratio = rates["engine cpu-4"] / rates[peer]
    rows = ["| run | decode tok/s |", "|---|---|", *[f"| {k} | {v:.2f} |" for k, v in rates.items()], "",
            f"- ratio engine cpu-4 / {peer}: **{ratio:.2f}x**",
            f"- engine cpu-4 / engine cpu-16: {rates['engine cpu-4'] / rates['engine cpu-16']:.2f}x",
            f"- expert bytes in RAM: cpu-4 {sizes['cpu-4'] / 2**20:.0f} MiB, cpu-16 {sizes['cpu-16'] / 2**20:.0f} MiB",
            f"- read bandwidth before/after: {bw / 1e9:.1f} / {bw2 / 1e9:.1f} GB/s",
            f"- demo model, 32-token prompt, {a.new_tokens} new tokens, greedy, 2 threads, best of {a.repeats}"]
    if gguf is None:
        rows.append("- llama-cpp-python is not installed here: compared with the engine's cpu-16 instead")
    table = "\n".join(rows)
    print(table)
    print(f"recorded {record('q4_end_to_end', {'decode_tok_s': rates, 'ratio': ratio, 'peer': peer}, table)}")


if __name__ == "__main__":
    main()
