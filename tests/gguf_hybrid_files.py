"""Qwen3.5-MoE GGUF files for tests/test_gguf_hybrid*.py: a tiny model (engine/sources/tiny_model.py)
fit for the writer and llama.cpp's converter, the engine's logits on a file, llama.cpp's logits in a
process of its own, and `rewrite`: a GGUF file copied with its metadata or tensors changed (files of
other converters: MTP blocks, older metadata; inconsistent ones).

The tiny model's tokenizer is trained 16 tokens short of its vocabulary: transformers' Qwen3.5
tokenizer class adds <|endoftext|> after the trained ones, and the converter (like our writer) wants
every id inside the embedding. Its dt_bias and linear_attn.norm weights (ones at init) are randomised,
so their head order shows."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT

from engine.files.gguf import open_gguf
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tiny_model, write_tokenizer

CPU = torch.device("cpu")
ARCH = "qwen35moe"


def tiny(folder: Path, seed: int = 3, vocab: int = 320, layers: int = 4, **extra) -> Path:
    """A tiny Qwen3.5-MoE VLM release (engine/sources/tiny_model.py) whose ones-initialised 1-D tensors
    are randomised and whose tokenizer fits inside its vocabulary."""
    from safetensors.torch import load_file, save_file

    write_tiny_model(folder, "qwen3_5_moe", layers=layers, vocab=vocab, seed=seed, tokenizer=False, **extra)
    write_tokenizer(folder, vocab - 16)
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for name, t in sd.items():
        if name.endswith(("linear_attn.dt_bias", "linear_attn.norm.weight")):
            sd[name] = 1 + 0.3 * torch.randn(t.shape, generator=g)
    save_file(sd, str(path), metadata={"format": "pt"})
    return folder


def reference(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def run(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of a prefill, then of one decode step per remaining token."""
    cache = model.new_cache(64)
    got = [model.forward(ids[:prefill], cache, 0, all_logits=True)]
    got += [model.forward(ids[i:i + 1], cache, i) for i in range(prefill, len(ids))]
    return torch.cat(got)


def engine_logits(path: Path, ids: torch.Tensor, prefill: int, dtype=torch.float32) -> torch.Tensor:
    g = open_gguf(path)
    try:
        d = g.dims
        return run(MoEModel(g, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, dtype), ids, prefill)
    finally:
        g.close()


LLAMA_CHECK = """
import sys, numpy as np, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], logits_all=True, n_ctx=64, verbose=False, n_threads=2)
toks = [int(x) for x in sys.argv[3].split(",")]
llm.eval(toks)
np.save(sys.argv[2], np.array(llm.scores[:len(toks)], dtype=np.float32))
"""


def llama_cpp_logits(path: Path, toks: list[int], tmp_path: Path) -> np.ndarray:
    """llama.cpp's logits for toks (one batch), in a process of its own (its threads and allocator)."""
    out = tmp_path / "llama.npy"
    r = subprocess.run([sys.executable, "-c", LLAMA_CHECK, str(path), str(out), ",".join(map(str, toks))],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"llama.cpp could not run {path.name}: {r.stderr[-3000:]}"
    return np.load(out)


def dequantised(ts: list) -> list:
    """A file's block-quantised tensors as their exact F32 values (the same weights, in floats)."""
    from gguf.quants import dequantize

    return [(n, dequantize(d, q).astype(np.float32), GT.F32) if q not in (GT.F32, GT.F16) else (n, d, q)
            for n, d, q in ts]


def with_mtp_block(ts: list) -> list:
    """The block a default (MTP) conversion adds after the last layer: a full-attention MoE layer
    (here layer 3's tensors) and its nextn tensors."""
    extra = [(n.replace("blk.3.", "blk.4."), d, q) for n, d, q in ts if n.startswith("blk.3.")]
    d = np.ones(64, dtype=np.float32)
    extra += [("blk.4.nextn.eh_proj.weight", np.zeros((64, 128), dtype=np.float32), GT.F32),
              ("blk.4.nextn.enorm.weight", d, GT.F32), ("blk.4.nextn.hnorm.weight", d, GT.F32),
              ("blk.4.nextn.shared_head_norm.weight", d, GT.F32)]
    return ts + extra
