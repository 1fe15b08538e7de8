"""llama.cpp as the reference for GLM GGUF (`glm4moe`, and GLM-4.7-Flash as `deepseek2`): llama.cpp itself
(llama-cpp-python 0.3.36, ggml-org/llama.cpp@0c1e57098) loads what engine/files/gguf/writer.py writes and gives the
engine's logits on it; its converter (vendored in that release's sdist, where the sdist is here: $LLAMA_CPP_SDIST)
writes the same bytes. The models: tests/gguf_glm_files.py."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from engine.files.gguf.writer import write_gguf
from gguf_checks import rewrite, same_types_as_llama_quantize
from gguf_glm_files import tiny
from gguf_hybrid_files import dequantised, engine_logits, llama_cpp_logits
from llama_convert import CONVERT, converter  # noqa: F401  (a fixture: the sdist's converter)

FAMILIES = ["glm4_moe", "glm4_moe_lite"]


@pytest.mark.parametrize("recipe,bound", [("f32", 1e-2), ("f16", 2e-2), ("q8_0", 1e-2)])
@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_reads_the_file_as_the_engine_does(tmp_path, family, recipe, bound):
    """llama.cpp loads the file and gives the engine's logits on it (1.2e-3 at most measured, F32). Routing to
    the wrong groups, an unscaled route, or GLM-4.7-Flash's rope rotated in halves rather than pairs give 0.5
    to 1.1 on these models (measured). Q8_0: llama.cpp rounds its activations to 8 bits for those matmuls, so
    it runs the file's exact dequantisation, which the engine's reading of the Q8_0 blocks must equal."""
    pytest.importorskip("llama_cpp")
    src = tiny(tmp_path / "hf", family, seed=5)
    path = write_gguf(src, tmp_path / f"t-{recipe}.gguf", recipe)[0]
    toks = [5, 17, 42, 8, 99, 3, 200, 31, 64, 7, 150, 250]
    got = engine_logits(path, torch.tensor(toks), 6).numpy()
    if recipe == "q8_0":
        path = rewrite(path, tmp_path / "dequantised.gguf", tensors=dequantised)
        assert np.array_equal(engine_logits(path, torch.tensor(toks), 6).numpy(), got)
    want = llama_cpp_logits(path, toks, tmp_path)
    assert np.abs(got - want).max() < bound, np.abs(got - want).max(-1)
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_same_bytes_as_llama_cpps_converter(converter, tmp_path, family):  # noqa: F811
    """convert_hf_to_gguf.py --no-mtp (its pre-tokenizer lookup bypassed) and write_gguf write the same
    bytes, every recipe the converter has."""
    src = tiny(tmp_path / "hf", family, seed=2)
    for recipe in ("f32", "f16", "bf16", "q8_0"):
        ref, ours = tmp_path / f"ref-{recipe}.gguf", tmp_path / f"ours-{recipe}.gguf"
        run = subprocess.run([sys.executable, "-c", CONVERT, str(converter), str(src), "--outtype", recipe,
                              "--outfile", str(ref), "--no-mtp"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        write_gguf(src, ours, recipe, pre="default")
        assert ref.read_bytes() == ours.read_bytes(), recipe


@pytest.mark.parametrize("family,extra", [
    ("glm4_moe", dict(hidden=256, ffn=256)),
    ("glm4_moe_lite", dict(hidden=512, ffn=256, intermediate_size=256, q_lora_rank=256, kv_lora_rank=256,
                           qk_nope_head_dim=256, v_head_dim=256))])
def test_k_quant_types_are_llama_quantizes(tmp_path, family, extra):
    """Our Q4_K_M and Q5_K_M plans give every tensor the type llama-quantize (llama-cpp-python's
    llama_model_quantize, from our F16 file) gives it; rows of 256 (512), so the K types are kept where
    they can be (attn_k_b's rows of qk_nope_head_dim, attn_q_b's of q_lora_rank)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    src = tiny(tmp_path / "hf", family, seed=4, **extra)
    same_types_as_llama_quantize(llama_cpp, write_gguf, src, tmp_path)
