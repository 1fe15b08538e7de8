"""`mixdesk chat --model bad.gguf`: each bad GGUF input exits 2 with one line naming the file and the
problem, no traceback, nothing written (next to the file or in the user's folders), in bounded time
(tests/test_bad_input.py's checks, on GGUF files written by tests/gguf_files.py)."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as GT

import gguf_files
from engine.sources.tiny_model import write_tiny_model
from bad_input_helpers import chat, home, refused  # noqa: F401  (home: a fixture)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("gguf-src"), "qwen3_moe", hidden=256, ffn=256)


@pytest.fixture
def good(src, tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    return gguf_files.hf_to_gguf(src, d / "model.gguf")


def test_not_a_gguf(capsys, home, tmp_path):
    p = tmp_path / "models" / "x.gguf"
    p.parent.mkdir()
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    refused(capsys, home, chat(p), str(p), "not a GGUF file", folder=p.parent, max_s=10)


def test_truncated_data(capsys, home, good):
    with open(good, "r+b") as f:
        f.truncate(good.stat().st_size - 4096)
    refused(capsys, home, chat(good), str(good), "truncated", folder=good.parent, max_s=10)


def test_unsupported_architecture(capsys, home, src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"general.architecture": "falcon"})
    refused(capsys, home, chat(p), str(p), "'falcon'", "qwen3moe", folder=tmp_path, max_s=10)


def test_unsupported_tensor_type(capsys, home, src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", expert_qtype=GT.Q8_1)  # (gguf-py cannot dequantise it)
    refused(capsys, home, chat(p), str(p), "Q8_1", "not read yet", folder=tmp_path, max_s=10)


def test_missing_split_part(capsys, home, src, tmp_path):
    out = tmp_path / "split" / "m.gguf"
    out.parent.mkdir()
    gguf_files.hf_to_gguf(src, out, split_max_tensors=12)
    parts = sorted(out.parent.glob("*.gguf"))
    parts[1].unlink()
    refused(capsys, home, chat(parts[0]), str(parts[1]), "missing", folder=out.parent, max_s=10)
    refused(capsys, home, chat(out.parent), str(parts[1]), "missing", folder=out.parent, max_s=10)


def test_absurd_string_length(capsys, home, good):
    gguf_files.flip(good, gguf_files.kv_pos(good, "tokenizer.chat_template"), struct.pack("<Q", 1 << 60))
    refused(capsys, home, chat(good), str(good), "tokenizer.chat_template", folder=good.parent, max_s=10)


def test_absurd_array_length(capsys, home, good):
    gguf_files.flip(good, gguf_files.kv_pos(good, "tokenizer.ggml.tokens") + 4, struct.pack("<Q", 1 << 40))
    refused(capsys, home, chat(good), str(good), "tokenizer.ggml.tokens", folder=good.parent, max_s=10)


def test_missing_tensor(capsys, home, src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", skip=("blk.1.ffn_down_exps.weight",))
    refused(capsys, home, chat(p), str(p), "missing tensor 'blk.1.ffn_down_exps.weight'", folder=tmp_path, max_s=10)


def test_shape_disagrees_with_metadata(capsys, home, src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"qwen3moe.expert_count": 8})
    refused(capsys, home, chat(p), str(p), "ffn_gate_inp", "implies", folder=tmp_path, max_s=10)


def test_no_chat_template(capsys, home, src, tmp_path):
    p = gguf_files.hf_to_gguf(src, tmp_path / "m.gguf", extra_kv={"tokenizer.chat_template": None})
    refused(capsys, home, chat(p), str(p), "chat template", folder=tmp_path, max_s=30)


def test_fifo_does_not_hang(capsys, home, tmp_path):
    p = tmp_path / "x.gguf"
    os.mkfifo(p)
    refused(capsys, home, chat(p), str(p), "not a regular file", folder=tmp_path, max_s=10)
