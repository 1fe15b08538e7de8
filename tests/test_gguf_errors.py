"""engine/files/gguf: every bad GGUF input is one ModelError, one line naming the file and the problem,
raised fast and without reading the file whole or writing anything."""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as GT

import gguf_files
from engine.protocol.errors import ModelError
from engine.files.gguf import open_gguf
from engine.sources.tiny_model import write_tiny_model


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("q3"), "qwen3_moe", tokenizer=True)


@pytest.fixture
def good(src, tmp_path):
    return gguf_files.hf_to_gguf(src, tmp_path / "model.gguf")


def refused(path: Path, *words: str, names: Path | None = None) -> str:
    folder = path.parent if path.parent.exists() else None
    before = sorted(os.listdir(folder)) if folder else None
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as e:
        open_gguf(path).close()
    assert time.perf_counter() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg and str(names or path) in msg, msg
    for w in words:
        assert w.lower() in msg.lower(), msg
    if folder:
        assert sorted(os.listdir(folder)) == before
    print("REFUSED:", msg)
    return msg


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    refused(p, "not a GGUF file")


def test_truncated_header(good):
    with open(good, "r+b") as f:
        f.truncate(300)
    refused(good, "truncated")


def test_tiny_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF\x03\0\0\0")
    refused(p, "truncated")


def test_truncated_data(good):
    with open(good, "r+b") as f:
        f.truncate(good.stat().st_size - 4096)
    refused(good, "truncated", "tensor")


@pytest.mark.parametrize("version,words", [(1, ["version 1", "convert"]), (4, ["version 4", "2 and 3"]),
                                           (3 << 16, ["big-endian"])])
def test_unknown_version(good, version, words):
    gguf_files.flip(good, 4, struct.pack("<I", version))
    refused(good, *words)


def test_unsupported_architecture(src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"general.architecture": "falcon"})
    refused(p, "'falcon'", "qwen3moe", "gpt-oss", "llama")


def test_dense_llama_refused(tmp_path):
    src = write_tiny_model(tmp_path / "mx", "mixtral", tokenizer=True)
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"llama.expert_count": 0})
    refused(p, "dense llama", "expert_count")


def test_unsupported_tensor_type(tmp_path):
    src = write_tiny_model(tmp_path / "w", "mixtral", hidden=256, ffn=256, tokenizer=True)
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", expert_qtype=GT.Q8_1)  # (gguf-py cannot dequantise it)
    refused(p, "Q8_1", "not read yet", "Q4_K", "IQ2_XXS")


def test_unknown_tensor_type_code(good):
    gguf_files.flip(good, gguf_files.type_pos(good, "blk.1.attn_v.weight"), struct.pack("<I", 250))
    refused(good, "blk.1.attn_v.weight", "unknown GGML type 250")


def test_tensor_data_out_of_bounds(good):
    pos = gguf_files.type_pos(good, "blk.0.attn_k.weight") + 4
    gguf_files.flip(good, pos, struct.pack("<Q", 1 << 40))
    refused(good, "blk.0.attn_k.weight", "truncated")


def test_duplicated_tensor_name(good):
    gguf_files.flip(good, gguf_files.info_pos(good, "blk.1.attn_q.weight") + 8, b"blk.0.attn_q.weight")
    refused(good, "blk.0.attn_q.weight", "twice")


def test_duplicated_tensor_across_split_parts(src, tmp_path):
    out = tmp_path / "s" / "m.gguf"
    out.parent.mkdir()
    gguf_files.hf_to_gguf(src, out, split_max_tensors=12)
    parts = sorted(out.parent.glob("*.gguf"))
    # a name in part 2 renamed to one that part 1 holds (same length)
    from engine.files.gguf.header import Header

    first = set(Header(parts[0]).tensors)
    second = [n for n in Header(parts[1]).tensors]
    victim = next(n for n in second if any(len(f) == len(n) and f != n for f in first))
    twin = next(f for f in first if len(f) == len(victim))
    gguf_files.flip(parts[1], gguf_files.info_pos(parts[1], victim) + 8, twin.encode())
    refused(parts[0], twin, parts[0].name, names=parts[1])


def test_missing_split_part(src, tmp_path):
    out = tmp_path / "s" / "m.gguf"
    out.parent.mkdir()
    gguf_files.hf_to_gguf(src, out, split_max_tensors=12)
    parts = sorted(out.parent.glob("*.gguf"))
    parts[1].unlink()
    refused(parts[0], "missing", f"{len(parts)} parts", names=parts[1])


@pytest.mark.parametrize("key", ["general.name", "tokenizer.chat_template"])
def test_absurd_string_length(good, key):
    gguf_files.flip(good, gguf_files.kv_pos(good, key), struct.pack("<Q", 1 << 60))
    refused(good, key, "claims")


def test_absurd_array_length(good):
    pos = gguf_files.kv_pos(good, "tokenizer.ggml.tokens") + 4  # after the element type
    gguf_files.flip(good, pos, struct.pack("<Q", 1 << 40))
    refused(good, "tokenizer.ggml.tokens", "array of 1,099,511,627,776")


def test_array_of_strings_past_the_end(good):
    pos = gguf_files.kv_pos(good, "tokenizer.ggml.merges") + 4
    gguf_files.flip(good, pos, struct.pack("<Q", 1 << 23))  # 8M strings: more than the file holds
    refused(good, "tokenizer.ggml.merges")


def test_missing_tensor(src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", skip=("blk.1.attn_k_norm.weight",))
    refused(p, "missing tensor 'blk.1.attn_k_norm.weight'")


def test_missing_expert_tensor(src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", skip=("blk.0.ffn_up_exps.weight",))
    refused(p, "missing tensor 'blk.0.ffn_up_exps.weight'")


@pytest.mark.parametrize("kv,words", [({"qwen3moe.expert_count": 8}, ["ffn_gate_inp", "shape [4, 64]", "implies [8, 64]"]),
                                      ({"qwen3moe.embedding_length": 128}, ["shape", "implies"]),
                                      ({"qwen3moe.attention.head_count": 3}, ["num_key_value_heads", "divide"])])
def test_shapes_that_disagree_with_metadata(src, tmp_path, kv, words):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv=kv)
    refused(p, *words)


def test_metadata_out_of_range(src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"qwen3moe.block_count": 10**6})
    refused(p, "num_hidden_layers", "1,000,000")


def test_folder_cases(src, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "no .gguf")
    two = tmp_path / "two"
    two.mkdir()
    gguf_files.hf_to_gguf(src, two / "a.gguf")
    gguf_files.hf_to_gguf(src, two / "b.gguf")
    refused(two, "several", "a.gguf", "b.gguf")
    (two / "b.gguf").rename(two / "mmproj-b.gguf")  # a vision projector beside the model is not a model
    assert open_gguf(two).path == two / "a.gguf"


def test_fifo_does_not_hang(tmp_path):
    p = tmp_path / "x.gguf"
    os.mkfifo(p)
    refused(p, "not a regular file")


def test_missing_file(tmp_path):
    refused(tmp_path / "nope.gguf", "does not exist")
