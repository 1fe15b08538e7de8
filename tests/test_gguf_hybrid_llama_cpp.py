"""llama.cpp as the reference for Qwen3.5-MoE GGUF (`qwen35moe`): llama.cpp itself (llama-cpp-python
0.3.36, ggml-org/llama.cpp@0c1e57098) loads what engine/files/gguf/writer.py writes and gives the engine's
logits on it; its quantizer gives the types our K-quant plans give; its converter (vendored in that
release's sdist, where the sdist is here) writes the same bytes. The model: tests/gguf_hybrid_files.py."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT

from engine.files.gguf.writer import write_gguf
from gguf_checks import rewrite, same_types_as_llama_quantize
from gguf_hybrid_files import dequantised, engine_logits, llama_cpp_logits, tiny
from llama_convert import CONVERT, converter  # noqa: E402,F401 (shared: tests/llama_convert.py)


@pytest.mark.parametrize("recipe,bound", [("f32", 1e-2), ("f16", 2e-2), ("q8_0", 1e-2)])
def test_llama_cpp_reads_the_file_as_the_engine_does(tmp_path, recipe, bound):
    """llama.cpp (llama-cpp-python) loads the file and gives the engine's logits on it. Its loader takes
    the value head width as ssm.state_size (Dk = Dv, as in every release), so this model has both 16.
    A wrong head order, norm or A_log gives differences of order 1 (2.4-2.7 measured on a wider model).
    Q8_0: llama.cpp rounds its activations to 8 bits for those matmuls (0.2 from its own F32 run of the
    same weights, measured), so it runs the file's exact dequantisation, which the engine's reading of
    the Q8_0 blocks (value heads reordered as blocks) must equal."""
    pytest.importorskip("llama_cpp")
    src = tiny(tmp_path / "hf", seed=5, linear_value_head_dim=16)
    path = write_gguf(src, tmp_path / f"t-{recipe}.gguf", recipe)[0]
    toks = [5, 17, 42, 8, 99, 3, 200, 31, 64, 7, 150, 250]
    got = engine_logits(path, torch.tensor(toks), 6).numpy()
    if recipe == "q8_0":
        path = rewrite(path, tmp_path / "dequantised.gguf", tensors=dequantised)
        assert np.array_equal(engine_logits(path, torch.tensor(toks), 6).numpy(), got)
    want = llama_cpp_logits(path, toks, tmp_path)
    assert np.abs(got - want).max() < bound, np.abs(got - want).max(-1)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_q4_k_m_types_are_llama_quantizes(tmp_path):
    """Our Q4_K_M and Q5_K_M plans give every tensor the type llama-quantize (llama-cpp-python's
    llama_model_quantize, from our F16 file) gives it: ssm_conv1d and the [1, D] shared-expert gate
    stay F32, attn_qkv counts with attn_v; rows of 256 here, so the K types are kept."""
    llama_cpp = pytest.importorskip("llama_cpp")
    src = tiny(tmp_path / "hf", seed=4, layers=8, hidden=256, ffn=256, head_dim=64, linear_key_head_dim=128,
               linear_value_head_dim=128)
    for b in same_types_as_llama_quantize(llama_cpp, write_gguf, src, tmp_path).values():
        assert b["blk.0.ssm_conv1d.weight"] == GT.F32 and b["blk.0.ffn_gate_inp_shexp.weight"] == GT.F32


@pytest.mark.parametrize("dv", [24, 32])
def test_same_bytes_as_llama_cpps_converter(converter, tmp_path, dv):
    """convert_hf_to_gguf.py --no-mtp (its pre-tokenizer lookup bypassed) and write_gguf write the same
    bytes, every recipe the converter has."""
    src = tiny(tmp_path / "hf", seed=2, linear_key_head_dim=dv, linear_value_head_dim=dv) if dv == 32 else \
        tiny(tmp_path / "hf", seed=2)
    for recipe in ("f32", "f16", "bf16", "q8_0"):
        ref, ours = tmp_path / f"ref-{recipe}.gguf", tmp_path / f"ours-{recipe}.gguf"
        run = subprocess.run([sys.executable, "-c", CONVERT, str(converter), str(src), "--outtype", recipe,
                              "--outfile", str(ref), "--no-mtp"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        write_gguf(src, ours, recipe, pre="default")
        assert ref.read_bytes() == ours.read_bytes(), recipe
