"""llama.cpp as the benchmark peer, through llama-cpp-python (none of its code is in the project).

Setup, once (about 5-15 minutes on 2 cores): `pip download --no-deps --no-binary :all: -d .bench/llama
llama-cpp-python==0.3.36 && pip install .bench/llama/llama_cpp_python-0.3.36.tar.gz sentencepiece`.
A build that runs on either CPU these machines have (no AMX: an AMX build segfaults on quantised
models, see MACHINE-NOTES) took about 20 minutes with `nice -n 15`: CMAKE_BUILD_PARALLEL_LEVEL=2
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
-DGGML_AMX_BF16=OFF". Its CPU_REPACK buffer (on by default) copies Q4_K weights into anonymous memory at
load; benchmarks/real_scale.py measures it with and without.
Models are converted with the sdist's own convert_hf_to_gguf.py and quantised with
llama_cpp.llama_model_quantize, cached under .bench/. `experts_only_q4_0` also writes a GGUF whose
expert tensors alone are Q4_0 (quantised by gguf-py, llama.cpp's own Python package) and the rest
F16: the same split Mixdesk's cpu-4 tier makes (only experts are 4-bit).
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.common import CACHE

SDIST = CACHE / "llama" / "llama_cpp_python-0.3.36.tar.gz"


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return SDIST.exists()


def _llama_src() -> Path:
    src = CACHE / "llama" / "src"
    if not src.exists():
        with tarfile.open(SDIST) as tf:
            tf.extractall(src, filter="data")
    return next(src.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"


def convert_f16(model_dir: Path, out: Path) -> Path:
    if not out.exists():
        root = _llama_src()
        env = {"PYTHONPATH": str(root / "gguf-py"), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", "f16",
                        "--outfile", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def quantize(f16: Path, out: Path, ftype: str = "Q4_0") -> Path:
    import llama_cpp

    if not out.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        params.nthread = 2
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), params) != 0:
            raise RuntimeError(f"llama_model_quantize failed on {f16}")
    return out


def experts_only_q4_0(f16: Path, out: Path) -> Path:
    """A copy of the F16 GGUF with the expert tensors (ffn_*_exps) in Q4_0, the rest as they are."""
    if out.exists():
        return out
    sys.path.insert(0, str(_llama_src() / "gguf-py"))
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    from gguf.quants import quantize as gq

    r = GGUFReader(str(f16))
    arch = r.fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    tmp = out.with_suffix(".part")
    w = GGUFWriter(str(tmp), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = field.types[0]
        if vt.name == "ARRAY":
            sub = field.types[1]
            vals = [field.parts[i] for i in field.data]
            if sub.name == "STRING":
                vals = [bytes(v).decode("utf-8", "replace") for v in vals]
            else:
                vals = [v.tolist()[0] for v in vals]
            w.add_key_value(name, vals, vt, sub_type=sub)
        elif vt.name == "STRING":
            w.add_key_value(name, bytes(field.parts[field.data[0]]).decode(), vt)
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], vt)
    for t in r.tensors:
        data = np.array(t.data)
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order
        data = data.reshape(shape)
        if "_exps" in t.name:
            q = gq(data.astype(np.float32), GGMLQuantizationType.Q4_0)
            w.add_tensor(t.name, q, raw_dtype=GGMLQuantizationType.Q4_0)
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def load(gguf: Path, threads: int = 2):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                           n_batch=512, verbose=False)


def decode_tok_s(llm, prompt: list[int], new: int) -> float:
    """Greedy decode tokens/s after the prompt (time from the first new token to the last)."""
    llm.reset()
    n, t_first = 0, None
    for _tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
        if n == new:
            break
    return (n - 1) / (time.perf_counter() - t_first)


def prefill_tok_s(llm, prompt: list[int]) -> float:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    return len(prompt) / (time.perf_counter() - t0)
