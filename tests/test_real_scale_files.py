"""benchmarks/real_scale_files.py: the full-size files' tensor plans (computed, nothing written), and a
tiny file written by the same code, opened by the engine."""
from __future__ import annotations

from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as GT

from benchmarks import real_scale_files as rsf


def _types(s):
    return {p.name: p.qtype for p in rsf.plan(s)}


def test_qwen3_plan_at_full_size():
    s = rsf.QWEN3
    plan = rsf.plan(s)
    shapes = {p.name: p.shape for p in plan}
    types = {p.name: p.qtype for p in plan}
    assert len(plan) == 3 + 48 * 12
    assert (s.layers, s.hidden, s.experts, s.expert_ffn, s.top_k, s.vocab) == (48, 2048, 128, 768, 8, 151936)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (128, 768, 2048)
    assert shapes["blk.0.ffn_down_exps.weight"] == (128, 2048, 768)
    assert shapes["blk.0.attn_q.weight"] == (4096, 2048) and shapes["blk.0.attn_k.weight"] == (512, 2048)
    assert shapes["blk.0.attn_output.weight"] == (2048, 4096) and shapes["blk.0.attn_q_norm.weight"] == (128,)
    assert shapes["output.weight"] == shapes["token_embd.weight"] == (151936, 2048)
    # llama-quantize's Q4_K_M: Q6_K on use_more_bits(i, 48) layers for attn_v and ffn_down_exps
    more = [i for i in range(48) if i < 6 or i >= 42 or (i - 6) % 3 == 2]
    assert [i for i in range(48) if types[f"blk.{i}.ffn_down_exps.weight"] == GT.Q6_K] == more
    assert [i for i in range(48) if types[f"blk.{i}.attn_v.weight"] == GT.Q6_K] == more
    assert all(types[f"blk.{i}.ffn_down_exps.weight"] == GT.Q4_K for i in range(48) if i not in more)
    assert types["output.weight"] == GT.Q6_K and types["token_embd.weight"] == GT.Q4_K
    assert types["blk.7.ffn_gate_exps.weight"] == types["blk.7.attn_output.weight"] == GT.Q4_K
    assert types["blk.7.ffn_gate_inp.weight"] == types["blk.7.attn_norm.weight"] == GT.F32
    assert types["output_norm.weight"] == types["blk.7.attn_q_norm.weight"] == GT.F32
    assert 18.50e9 < rsf.tensor_bytes(s) < 18.60e9
    assert 1.8e9 < rsf.step_bytes(s) < 2.0e9


def test_mixtral_plan_at_full_size():
    s = rsf.MIXTRAL
    types = _types(s)
    assert s.arch == "llama" and (s.layers, s.hidden, s.experts, s.expert_ffn, s.top_k, s.vocab) == \
        (32, 4096, 8, 14336, 2, 32000)
    assert "blk.0.attn_q_norm.weight" not in types and "blk.31.ffn_up_exps.weight" in types
    more = [i for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2]
    assert [i for i in range(32) if types[f"blk.{i}.ffn_down_exps.weight"] == GT.Q6_K] == more
    # llama-quant.cpp's 8-expert rules: attn_v and attn_k Q8_0, attn_output Q5_K
    assert types["blk.3.attn_v.weight"] == types["blk.3.attn_k.weight"] == GT.Q8_0
    assert types["blk.3.attn_output.weight"] == GT.Q5_K and types["output.weight"] == GT.Q6_K
    assert 28.3e9 < rsf.tensor_bytes(s) < 28.6e9  # more than this machine's 24 GB


def test_synthetic_vocab_is_valid():
    for s in (rsf.QWEN3, rsf.MIXTRAL):
        v = rsf.vocab(s)
        assert len(v["tokens"]) == len(v["types"]) == s.vocab
        assert len(set(v["tokens"])) == s.vocab
        known = set(v["tokens"])
        assert all(a + b in known and a in known and b in known for a, b in (m.split(" ") for m in v["merges"]))
    q = rsf.vocab(rsf.QWEN3)
    assert q["tokens"][151643] == "<|endoftext|>" and q["tokens"][151645] == "<|im_end|>" and q["eos"] == 151645
    assert q["tokens"][151668] == "</think>" and q["pre"] == "qwen2"


SMALL = replace(rsf.QWEN3, name="small", layers=2, hidden=256, experts=4, expert_ffn=256, top_k=2, heads=2,
                kv_heads=1, vocab=512)


def test_small_file_opens_in_the_engine(tmp_path):
    from engine.files.gguf import open_gguf

    out = rsf.write(SMALL, tmp_path / "small.gguf", log=lambda m: None)
    assert out.stat().st_size == rsf.expected_size(SMALL)
    assert not (tmp_path / "small.gguf.part").exists()
    ck = open_gguf(out)
    d = ck.dims
    assert (d.layers, d.hidden, d.experts, d.ffn, d.top_k, d.vocab, d.head_dim) == (2, 256, 4, 256, 2, 512, 128)
    types = _types(SMALL)
    for name, t in ck.file.tensors.items():
        assert t.qtype == types[name], name
    assert ck.tensor_type("model.layers.1.mlp.experts.0.down_proj.weight") == GT.Q6_K  # use_more_bits(1, 2)
    w = ck.read("model.layers.0.self_attn.q_proj.weight")
    assert w.isfinite().all() and 0 < w.abs().max() < 0.1  # small scales: activations stay finite


def test_write_resumes_and_skips(tmp_path):
    out = tmp_path / "small.gguf"
    whole = rsf.write(SMALL, out, log=lambda m: None).read_bytes()
    part = tmp_path / "small.gguf.part"
    out.rename(part)
    with open(part, "r+b") as f:  # cut mid-tensor, as a killed writer leaves it
        f.truncate(len(whole) * 2 // 3)
    msgs = []
    rsf.write(SMALL, out, log=msgs.append)
    assert any("resuming" in m for m in msgs)
    assert out.read_bytes() == whole  # deterministic: the resumed file is the same bytes
    msgs.clear()
    rsf.write(SMALL, out, log=msgs.append)
    assert msgs == []  # there with its planned size: not written again
