"""Gemma 4 as GGUF (llama.cpp's `gemma4`): a tiny Gemma 4 MoE (engine/sources/tiny_model.py, 4 layers: sliding
and global in turn, the global layers' keys their values, 4 experts) written by engine/files/gguf/writer.py as llama.cpp's
converter writes its text model (engine/files/gguf/gemma4.py), and read back by the engine.

- Dims equal the safetensors' (family gemma4_text: the file is the text model); every tensor reads back as the
  source's; the file holds the converter's names (sandwich norms, router scale, per-expert scale as
  ffn_down_exps.scale, layer_output_scale, ffn_gate_up_exps, rope_freqs) and metadata (per-layer kv heads, swa
  pattern and head widths); fp32 logits within 1e-4 of transformers; `mixdesk eval` on the F16 file gives
  transformers' perplexity within 1e-3.
- Files Mixdesk does not run (per-layer embeddings, a dense Gemma 4, a rope_freqs not proportional) are one
  ModelError naming what.
llama.cpp as the reference (its loader; its converter where $LLAMA_CPP_SDIST is set): the end of this file.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.files.gguf import open_gguf
from engine.files.gguf.writer import write_gguf
from engine.sources.tiny_model import CHAT_TEMPLATE, CORPUS, write_tiny_model
from gguf_checks import rewrite, same_types_as_llama_quantize
from gguf_hybrid_files import engine_logits, llama_cpp_logits, reference
from llama_convert import CONVERT, converter  # noqa: F401  (a fixture: the sdist's converter)


def write_gemma_tokenizer(folder: Path, vocab_size: int) -> None:
    """A tiny tokenizer of Gemma's kind (what gguf's LlamaHfVocab, which the converter's Gemma4Model.set_vocab
    uses, requires): BPE with byte fallback (<0x00>..<0xFF> in the vocabulary), spaces as U+2581, a Sequence
    decoder; <pad> <bos> <eos> <unk> as ids 0 to 3 (the tiny model's config), exactly vocab_size tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Replace(" ", "\u2581")
    base.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=specials,
                                                             show_progress=False))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in json.loads(base.to_str())["model"]["merges"]]
    learned = base.get_vocab()
    rest = sorted((t for t in learned if t not in specials), key=learned.get)
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)] + rest)}
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def tiny(folder: Path, seed: int = 3, gemma_tokenizer: bool = True) -> Path:
    """The tiny Gemma 4 (a Gemma-kind tokenizer unless gemma_tokenizer is False: then tiny_model's byte-level
    BPE) with its norms, layer scalars, router scales and per-expert scales randomised (ones at init), so one
    read in the wrong place shows."""
    from safetensors.torch import load_file, save_file

    write_tiny_model(folder, "gemma4", layers=4, seed=seed, tokenizer=not gemma_tokenizer)
    if gemma_tokenizer:
        write_gemma_tokenizer(folder, 320)
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for name, t in sd.items():
        if "language_model" in name and name.endswith(("norm.weight", "layer_scalar", "router.scale",
                                                       "per_expert_scale")):
            sd[name] = 1 + 0.3 * torch.randn(t.shape, generator=g)
    save_file(sd, str(path), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory.mktemp("gemma4") / "hf")


@pytest.fixture(scope="module")
def files(source, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4-gguf")
    return {r: write_gguf(source, root / f"gemma4-{r}.gguf", r)[0] for r in ("f32", "f16")}


@pytest.mark.parametrize("recipe", ["f32", "f16"])
def test_dims_are_the_safetensors(source, files, recipe):
    g = open_gguf(files[recipe])
    try:
        d = g.dims
        assert d == dataclasses.replace(Checkpoint(source).dims, family="gemma4_text")
        assert d.layer_attn == ((2, 16, False, "sliding_attention"), (1, 32, True, "full_attention")) * 2
        assert (d.layer_windows, d.softcap, d.parallel_ffn, d.router_kind) == ((4, None, 4, None), 30.0, 96, "gemma")
        rope = g.config.rope_parameters
        assert rope["full_attention"]["partial_rotary_factor"] == 0.25
        assert rope["full_attention"]["rope_type"] == "proportional"
        assert rope["sliding_attention"]["rope_theta"] == 10000.0 and rope["full_attention"]["rope_theta"] == 1e6
    finally:
        g.close()


def test_f32_file_reads_back_the_source(source, files):
    ref, g = Checkpoint(source), open_gguf(files["f32"])
    try:
        assert set(g.expected) == set(ref.expected)
        for name in ref.expected:
            assert torch.equal(g.read(name), ref.read(name)), name
        assert g.expert_raw_info(0, 0, "w1").name == "blk.0.ffn_gate_up_exps.weight"
        assert g.expert_raw_info(0, 0, "w2").name == "blk.0.ffn_down_exps.weight"
    finally:
        g.close()


def test_the_file_holds_what_the_converter_makes(source, files):
    """Independently of the reader: names, rope_freqs, no vision tower, and the metadata as Gemma4Model writes it."""
    from safetensors.torch import load_file

    sd = {k.replace("language_model.", ""): v for k, v in load_file(str(source / "model.safetensors")).items()}
    r = GGUFReader(files["f32"])
    t = {x.name: torch.from_numpy(np.array(x.data)) for x in r.tensors}
    kv = {k[7:]: f.contents() for k, f in r.fields.items() if k.startswith("gemma4.")}
    assert r.fields["general.architecture"].contents() == "gemma4"
    assert r.fields["tokenizer.ggml.model"].contents() == "gemma4"  # Gemma4Model.set_vocab (LlamaHfVocab)
    assert r.fields["tokenizer.ggml.tokens"].contents()[4] == "<0x00>"
    assert [x.name for x in r.tensors][0] == "rope_freqs.weight"
    assert torch.equal(t["rope_freqs.weight"], torch.tensor([1.0] * 4 + [1e30] * 12))  # a quarter of 32: 4 pairs
    assert not any("vision" in n or "v." == n[:2] or "mm." in n for n in t)
    p = "model.layers.1."
    for hf, name in (("input_layernorm.weight", "attn_norm.weight"),
                     ("post_attention_layernorm.weight", "post_attention_norm.weight"),
                     ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
                     ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
                     ("pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight"),
                     ("post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight"),
                     ("post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight"),
                     ("layer_scalar", "layer_output_scale.weight"), ("router.proj.weight", "ffn_gate_inp.weight"),
                     ("router.scale", "ffn_gate_inp.scale"), ("router.per_expert_scale", "ffn_down_exps.scale"),
                     ("experts.gate_up_proj", "ffn_gate_up_exps.weight"), ("experts.down_proj", "ffn_down_exps.weight"),
                     ("mlp.gate_proj.weight", "ffn_gate.weight"), ("self_attn.k_norm.weight", "attn_k_norm.weight")):
        assert torch.equal(t["blk.1." + name], sd[p + hf]), hf  # nothing shifted, scaled or permuted
    assert "blk.1.attn_v.weight" not in t and "blk.0.attn_v.weight" in t  # the global layers' keys are values
    want = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 96, "expert_feed_forward_length": 128,
            "expert_count": 4, "expert_used_count": 2, "attention.head_count": 4,
            "attention.head_count_kv": [2, 1, 2, 1], "attention.key_length": 32, "attention.value_length": 32,
            "attention.key_length_swa": 16, "attention.value_length_swa": 16, "attention.sliding_window": 4,
            "attention.sliding_window_pattern": [True, False, True, False], "rope.dimension_count": 32,
            "rope.dimension_count_swa": 16, "attention.shared_kv_layers": 0, "embedding_length_per_layer_input": 0,
            "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4, "final_logit_softcapping": 30.0}
    assert {k: kv.get(k) for k in want} == want


def test_fp32_logits_match_transformers(source, files):
    ids = torch.randint(0, 320, (28,), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = reference(source)(ids[None]).logits[0]
    got = engine_logits(files["f32"], ids, 16)
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.slow  # 5 s (a subprocess); tests/test_gguf_hybrid.py keeps one eval of a GGUF in the default run
def test_eval_of_the_f16_file_gives_transformers_perplexity(source, files):
    """`mixdesk eval --dtype fp32 --placement cpu` on the F16 file against transformers on the source: within 1e-3."""
    from transformers import AutoTokenizer

    from engine.model.evaluate import corpus_ids

    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "eval", "--model", str(files["f16"]),
                        "--dtype", "fp32", "--placement", "cpu", "--tokens", "96", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    ppl = float(re.search(r"perplexity ([0-9.]+), 96 tokens", r.stdout)[1])
    g = open_gguf(files["f16"])
    try:
        ids = corpus_ids(g.load_tokenizer(), None, 96)
    finally:
        g.close()
    assert ids == corpus_ids(AutoTokenizer.from_pretrained(str(source)), None, 96)
    ids = torch.tensor(ids)
    with torch.no_grad():
        logits = reference(source)(ids[None]).logits[0, :-1]
    want = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))
    assert abs(ppl - want) / want < 1e-3, (ppl, want)


@pytest.mark.parametrize("kv,tensors,says", [
    ({"embedding_length_per_layer_input": 8}, None, "per-layer embeddings"),
    ({"expert_count": None}, None, "dense Gemma 4"),
    ({"attention.sliding_window_pattern": None}, None, "sliding_window_pattern"),
    (None, "freqs", "proportional rope"),
])
def test_files_mixdesk_does_not_run_are_one_error(files, tmp_path, kv, tensors, says):
    def bad_freqs(ts):
        return [(n, np.full_like(d, 2.0) if n == "rope_freqs.weight" else d, q) for n, d, q in ts]

    path = rewrite(files["f32"], tmp_path / "bad.gguf", kv, bad_freqs if tensors else None)
    with pytest.raises(ModelError, match=says):
        open_gguf(path).close()


def test_a_byte_level_tokenizer_is_written_as_textmodel_does(tmp_path):
    """The converter's LlamaHfVocab fails on a byte-level BPE tokenizer (no byte fallback); the writer then
    writes it as TextModel._set_vocab_gpt2 (a file the engine and llama.cpp run), the rest unchanged."""
    src = tiny(tmp_path / "hf", gemma_tokenizer=False)
    path = write_gguf(src, tmp_path / "t.gguf", "f32")[0]
    assert GGUFReader(path).fields["tokenizer.ggml.model"].contents() == "gpt2"
    g = open_gguf(path)
    try:
        assert g.dims == dataclasses.replace(Checkpoint(src).dims, family="gemma4_text")
    finally:
        g.close()


# ---- llama.cpp as the reference --------------------------------------------------------------------------

def test_llama_cpp_reads_the_file_as_the_engine_does(tmp_path):
    """llama.cpp loads the file (its gemma4 tokenizer too) and gives the engine's logits on it: 5.7e-3 at most
    measured (F32; ggml's CPU GELU is a table of F16 values). The file with the router's scale or the
    per-expert scale set to ones, or rope_freqs all ones (rope over the whole global head), gives 1.6, 1.1 and
    0.7 against the engine's logits (measured): llama.cpp uses each as the engine reads it."""
    pytest.importorskip("llama_cpp")
    src = tiny(tmp_path / "hf", seed=5)
    path = write_gguf(src, tmp_path / "t-f32.gguf", "f32")[0]
    toks = [5, 17, 42, 8, 99, 3, 200, 31, 64, 7, 150, 250]
    got = engine_logits(path, torch.tensor(toks), 6).numpy()
    want = llama_cpp_logits(path, toks, tmp_path)
    assert np.abs(got - want).max() < 1e-2, np.abs(got - want).max(-1)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_same_bytes_as_llama_cpps_converter(converter, tmp_path):  # noqa: F811
    """convert_hf_to_gguf.py and write_gguf write the same bytes, every recipe the converter has (its vocabulary
    through LlamaHfVocab: the Gemma-kind tokenizer; nothing bypassed but the pre-tokenizer lookup, which gemma4
    does not use)."""
    src = tiny(tmp_path / "hf", seed=2)
    for recipe in ("f32", "f16", "bf16", "q8_0"):
        ref, ours = tmp_path / f"ref-{recipe}.gguf", tmp_path / f"ours-{recipe}.gguf"
        run = subprocess.run([sys.executable, "-c", CONVERT, str(converter), str(src), "--outtype", recipe,
                              "--outfile", str(ref)], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        write_gguf(src, ours, recipe, pre="default")
        assert ref.read_bytes() == ours.read_bytes(), recipe


def test_k_quant_types_are_llama_quantizes(tmp_path):
    """Our Q4_K_M and Q5_K_M plans give every tensor the type llama-quantize (llama-cpp-python's
    llama_model_quantize, from our F16 file) gives it; rows of 256, so the K types are kept where they can be."""
    llama_cpp = pytest.importorskip("llama_cpp")
    src = write_tiny_model(tmp_path / "hf", "gemma4", layers=4, seed=4, hidden=256, ffn=256)
    same_types_as_llama_quantize(llama_cpp, write_gguf, src, tmp_path)
