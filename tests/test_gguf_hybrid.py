"""Qwen3.5-MoE as GGUF (llama.cpp's `qwen35moe`): a tiny model (4 layers: 3 Gated DeltaNet, 1 gated
attention; 2 key heads serving 4 value heads, so the converter's grouped -> tiled value-head order
matters) written by engine/files/gguf/writer.py as llama.cpp's converter writes it, and read back by the engine.

- Dims equal the safetensors' (family qwen3_5_moe_text); every tensor reads back as the source's;
  the file holds the converter's transformations; fp32 logits within 1e-4 of transformers over a
  prefill and decode steps; `mixdesk eval` on the F16 file gives transformers' perplexity within 1e-3.
- Block-quantised matrices stay blocks, reordered losslessly; transformers 5's fused experts write
  the same tensors; MTP blocks and files of older converters read; inconsistent metadata is one
  ModelError naming the key.
llama.cpp as the reference (its loader, quantizer and converter): tests/test_gguf_hybrid_llama_cpp.py.
The model and the file helpers: tests/gguf_hybrid_files.py.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT, GGUFReader

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.files.gguf import open_gguf
from engine.files.gguf.values import dequantize_rows
from engine.files.gguf.writer import write_gguf
from gguf_checks import rewrite
from gguf_hybrid_files import ARCH, engine_logits, reference, tiny, with_mtp_block


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return tiny(tmp_path_factory.mktemp("q35") / "hf")


@pytest.fixture(scope="module")
def files(source, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("q35-gguf")
    return {r: write_gguf(source, root / f"tiny-{r}.gguf", r)[0] for r in ("f32", "f16")}


def text_dims(d):
    """The GGUF's Dims: the text model's, its DeltaNet value heads in the file's tiled order."""
    return dataclasses.replace(d, family="qwen3_5_moe_text", tiled_heads=d.linear[0] != d.linear[2])


def as_filed(name: str, t: torch.Tensor, d) -> torch.Tensor:
    """A source tensor in the order the engine reads it from the file: the DeltaNet's value heads tiled."""
    from engine.files.gguf import qwen35

    fix = qwen35.fixes(d, tiled=False).get(name)
    hk, dk, hv, dv, _ = d.linear
    heads = qwen35.tiled_heads(hk, hv)
    if name.endswith("dt_bias") or name.endswith("A_log"):
        out = torch.empty_like(t)
        out[heads] = t
        return out
    if name.endswith("conv1d.weight"):
        from engine.files.gguf.layout import head_rows

        rows = torch.cat([torch.arange(2 * hk * dk), head_rows(heads, dv, 2 * hk * dk)])
        out = torch.empty_like(t)
        out[rows] = t
        return out
    if fix is None or (fix.rows is None and fix.cols is None):
        return t
    out = torch.empty_like(t)
    if fix.rows is not None:
        out[fix.rows] = t
    else:
        g = len(fix.cols)
        out.view(t.shape[0], g, fix.width)[:, fix.cols] = t.view(t.shape[0], g, fix.width)
    return out


# ---- the engine reads what the writer wrote ---------------------------------------------------------

@pytest.mark.parametrize("recipe", ["f32", "f16"])
def test_dims_are_the_safetensors(source, files, recipe):
    g = open_gguf(files[recipe])
    try:
        assert g.dims == text_dims(Checkpoint(source).dims)
        assert g.dims.linear == (2, 16, 4, 24, 4) and g.dims.rot_dim == 8
        assert g.dims.mixers == ("deltanet", "deltanet", "deltanet", "attention")
    finally:
        g.close()


def test_f32_file_reads_back_the_source(source, files):
    """Every tensor the engine reads is the source's: the value heads back in grouped order, the
    norms' 1 + w and ssm_a's -exp(A_log) undone (to fp32 rounding), conv1d unsqueezed."""
    ref, g = Checkpoint(source), open_gguf(files["f32"])
    try:
        assert set(g.expected) == set(ref.expected)
        for name in ref.expected:
            want, got = as_filed(name, ref.read(name).float(), ref.dims), g.read(name).float()
            assert got.shape == want.shape, name
            if name.endswith(("A_log", "norm.weight")) and "linear_attn.norm" not in name:
                assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), name
            else:
                assert torch.equal(got, want), name
    finally:
        g.close()


def test_the_file_holds_what_the_converter_makes(source, files):
    """Independently of the reader: the F32 file's tensors as llama.cpp's converter transforms them."""
    from safetensors.torch import load_file

    sd = {k.replace("language_model.", ""): v for k, v in load_file(str(source / "model.safetensors")).items()}
    t = {x.name: torch.from_numpy(np.array(x.data)) for x in GGUFReader(files["f32"]).tensors}
    p, b = "model.layers.0.", "blk.0."
    tiled = lambda w, width: w.reshape(2, 2, width, *w.shape[1:]).transpose(0, 1).reshape(w.shape)  # noqa: E731
    assert torch.equal(t[b + "attn_norm.weight"], sd[p + "input_layernorm.weight"] + 1)
    assert torch.equal(t[b + "post_attention_norm.weight"], sd[p + "post_attention_layernorm.weight"] + 1)
    assert torch.equal(t["blk.3.attn_q_norm.weight"], sd["model.layers.3.self_attn.q_norm.weight"] + 1)
    assert torch.equal(t["output_norm.weight"], sd["model.norm.weight"] + 1)
    assert torch.equal(t[b + "ssm_norm.weight"], sd[p + "linear_attn.norm.weight"])  # the gated norm: plain
    assert torch.equal(t[b + "ssm_a"], -torch.exp(tiled(sd[p + "linear_attn.A_log"][:, None], 1)[:, 0]))
    assert torch.equal(t[b + "ssm_dt.bias"], tiled(sd[p + "linear_attn.dt_bias"][:, None], 1)[:, 0])
    qkv = sd[p + "linear_attn.in_proj_qkv.weight"]
    assert torch.equal(t[b + "attn_qkv.weight"], torch.cat([qkv[:64], tiled(qkv[64:], 24)]))
    assert torch.equal(t[b + "attn_gate.weight"], tiled(sd[p + "linear_attn.in_proj_z.weight"], 24))
    assert torch.equal(t[b + "ssm_beta.weight"], tiled(sd[p + "linear_attn.in_proj_b.weight"], 1))
    assert torch.equal(t[b + "ssm_alpha.weight"], tiled(sd[p + "linear_attn.in_proj_a.weight"], 1))
    assert torch.equal(t[b + "ssm_out.weight"], tiled(sd[p + "linear_attn.out_proj.weight"].t(), 24).t())
    conv = sd[p + "linear_attn.conv1d.weight"][:, 0]
    assert torch.equal(t[b + "ssm_conv1d.weight"], torch.cat([conv[:64], tiled(conv[64:], 24)]))
    assert torch.equal(t["blk.3.attn_q.weight"], sd["model.layers.3.self_attn.q_proj.weight"])  # [q; gate] a head
    assert torch.equal(t[b + "ffn_gate_inp_shexp.weight"], sd[p + "mlp.shared_expert_gate.weight"])
    r = GGUFReader(files["f32"])
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith(ARCH)}
    assert kv[f"{ARCH}.ssm.group_count"] == 2 and kv[f"{ARCH}.ssm.time_step_rank"] == 4
    assert kv[f"{ARCH}.ssm.state_size"] == 16 and kv[f"{ARCH}.ssm.inner_size"] == 96
    assert kv[f"{ARCH}.ssm.conv_kernel"] == 4 and kv[f"{ARCH}.full_attention_interval"] == 4
    assert kv[f"{ARCH}.attention.recurrent_layers"] == [True, True, True, False]
    assert kv[f"{ARCH}.rope.dimension_count"] == 8 and kv[f"{ARCH}.rope.dimension_sections"] == [11, 11, 10, 0]
    assert kv[f"{ARCH}.expert_shared_feed_forward_length"] == 48 and f"{ARCH}.nextn_predict_layers" not in kv
    assert not any(x.name.startswith(("v.", "mm.")) or "visual" in x.name for x in r.tensors)


def test_fp32_logits_match_transformers(source, files):
    ids = torch.randint(0, 320, (28,), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = reference(source)(ids[None]).logits[0]
    got = engine_logits(files["f32"], ids, 16)
    assert (got - want).abs().max().item() < 1e-4


def test_eval_of_the_f16_file_gives_transformers_perplexity(source, files, window_cache):
    """`mixdesk eval --dtype fp32 --placement cpu` on the F16 file, against transformers on the source
    (full precision) over the same tokens: within 1e-3 (F16's rounding of the matrices)."""
    from transformers import AutoTokenizer

    from engine.model.evaluate import corpus_ids

    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "eval", "--model", str(files["f16"]), "--dtype",
                        "fp32", "--placement", "cpu", "--tokens", "96", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    ppl = float(re.search(r"perplexity ([0-9.]+), 96 tokens", r.stdout)[1])
    g = open_gguf(files["f16"])
    try:
        ids = corpus_ids(g.load_tokenizer(), None, 96)
    finally:
        g.close()
    # the file's tokenizer is the source's
    assert ids == corpus_ids(AutoTokenizer.from_pretrained(str(source)), None, 96)
    ids = torch.tensor(ids)
    with torch.no_grad():
        logits = reference(source)(ids[None]).logits[0, :-1]
    want = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))
    assert abs(ppl - want) / want < 1e-3, (ppl, want)


# ---- blocks, layouts, files of other converters -----------------------------------------------------------

@pytest.mark.parametrize("dv", [24, 32])
def test_q8_0_matrices_stay_blocks(source, tmp_path, dv):
    """Q8_0: the DeltaNet's matrices are the file's blocks as they are, mapped (raw_view), their value heads
    in the file's tiled order, which the mixer reads so (Dims.tiled_heads): out_proj stays Q8_0 whatever
    the head width. Every block read is the exact dequantisation read() gives; the norms, conv1d and
    A_log are F32."""
    from engine import native
    from engine.files.gguf.blockquant import BlockQuant
    from engine.model.evaluate import perplexity
    from engine.runtime.load import load

    src = source if dv == 24 else tiny(tmp_path / "hf", seed=2, linear_key_head_dim=32, linear_value_head_dim=32)
    path = write_gguf(src, tmp_path / "q8.gguf", "q8_0")[0]
    g, ref = open_gguf(path), Checkpoint(src)
    try:
        q = "model.layers.0.linear_attn."
        for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
            assert g.tensor_type(q + n + ".weight") == GT.Q8_0 and g.raw_view(q + n + ".weight") is not None
        for n in ("A_log", "conv1d.weight", "dt_bias"):
            assert g.tensor_type(q + n) == GT.F32
        assert g.raw_view("model.layers.3.self_attn.q_proj.weight") is not None  # untouched by the converter
        for name, shape in g.expected.dense.items():
            t, v = g.tensor_type(name), g.read(name).float()
            if t not in (GT.F32, GT.F16, GT.BF16):
                assert torch.equal(dequantize_rows(t, g.read_raw(name), shape[-1]).reshape(shape).float(), v), name
            want = as_filed(name, ref.read(name).float(), ref.dims)
            assert (v - want).abs().max() <= 0.01 * want.abs().max(), name  # Q8_0's rounding, not a misplaced head
    finally:
        g.close()
    if not native.available():
        return
    ids = torch.randint(3, 300, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    ppl = {}
    for dtype in ("fp32", "bf16"):
        ld = load(path, placement="cpu", device="cpu", dtype=dtype)
        try:
            mixer = ld.model.layers[0].mixer
            if dtype == "bf16":  # the native kernels run the file's blocks
                assert all(isinstance(w, BlockQuant) for w in (*getattr(mixer.w_in, "parts", [mixer.w_in]), mixer.wo))
            ppl[dtype] = perplexity(ld.model, ids)
        finally:
            ld.ckpt.close()
    assert abs(ppl["bf16"] - ppl["fp32"]) / ppl["fp32"] < 0.05, ppl  # 1.4% measured (bf16, int8 activations)


def test_fused_experts_write_the_same_tensors(source, tmp_path):
    """transformers 5's fused experts (gate_up_proj [E, 2I, D], down_proj [E, D, I]) give the tensors
    per-expert weights give (Qwen2MoeModel.modify_tensors splits gate_up in halves)."""
    import shutil

    from safetensors.torch import load_file, save_file

    fused = tmp_path / "fused"
    shutil.copytree(source, fused)
    sd = load_file(str(fused / "model.safetensors"))
    for l in range(4):
        p = f"model.language_model.layers.{l}.mlp.experts."
        gate = [sd.pop(p + f"{e}.gate_proj.weight") for e in range(4)]
        up = [sd.pop(p + f"{e}.up_proj.weight") for e in range(4)]
        sd[p + "gate_up_proj"] = torch.stack([torch.cat([a, b]) for a, b in zip(gate, up)])
        sd[p + "down_proj"] = torch.stack([sd.pop(p + f"{e}.down_proj.weight") for e in range(4)])
    save_file(sd, str(fused / "model.safetensors"), metadata={"format": "pt"})
    a = {t.name: t for t in GGUFReader(write_gguf(source, tmp_path / "a.gguf", "f16")[0]).tensors}
    b = {t.name: t for t in GGUFReader(write_gguf(fused, tmp_path / "b.gguf", "f16")[0]).tensors}
    assert set(a) == set(b)
    for name, t in a.items():
        assert t.tensor_type == b[name].tensor_type and np.array_equal(np.array(t.data), np.array(b[name].data)), name




def test_mtp_blocks_and_older_converters_files(files, tmp_path):
    """A file with the MTP block (block_count 5, nextn_predict_layers 1, recurrent_layers for 5 blocks)
    and a file of an older converter (no recurrent_layers, no dimension_sections: layers from
    full_attention_interval) run as the file without them: the same Dims, the same logits."""
    ids = torch.randint(0, 320, (10,), generator=torch.Generator().manual_seed(2))
    want = engine_logits(files["f32"], ids, 6)
    mtp = rewrite(files["f32"], tmp_path / "mtp.gguf", {"block_count": 5, "nextn_predict_layers": 1,
                                                        "attention.recurrent_layers": [True, True, True, False, False]},
                  with_mtp_block)
    old = rewrite(files["f32"], tmp_path / "old.gguf", {"attention.recurrent_layers": None,
                                                        "rope.dimension_sections": None})
    g0 = open_gguf(files["f32"])
    d0 = g0.dims
    g0.close()
    for path in (mtp, old):
        g = open_gguf(path)
        assert g.dims == d0, path.name
        g.close()
        assert torch.equal(engine_logits(path, ids, 6), want), path.name


@pytest.mark.parametrize("kv,words", [
    ({"ssm.group_count": 3}, ["'qwen35moe.ssm.group_count' is 3", "'qwen35moe.ssm.time_step_rank' (4)"]),
    ({"ssm.group_count": 0}, ["'qwen35moe.ssm.group_count' is 0"]),
    ({"ssm.inner_size": 95}, ["'qwen35moe.ssm.inner_size' (95)"]),
    ({"ssm.conv_kernel": 0}, ["'qwen35moe.ssm.conv_kernel' is 0"]),
    ({"attention.recurrent_layers": [True, False]}, ["'qwen35moe.attention.recurrent_layers'", "4 blocks"]),
    ({"nextn_predict_layers": 4}, ["'qwen35moe.nextn_predict_layers' is 4"]),
    ({"rope.dimension_count": 7}, ["'qwen35moe.rope.dimension_count' is 7"]),
    # consistent, but not what the tensors are
    ({"ssm.state_size": 8}, ["tensor 'blk.0.attn_qkv.weight' has shape", "metadata implies"]),
    ({"ssm.group_count": None}, ["lacks the metadata 'qwen35moe.ssm.group_count'"]),
])
def test_inconsistent_metadata_is_one_clear_error(files, tmp_path, kv, words):
    bad = rewrite(files["f32"], tmp_path / "bad.gguf", kv)
    with pytest.raises(ModelError) as e:
        open_gguf(bad)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg
    for w in words:
        assert w in msg, msg


def test_bad_files_are_refused_by_the_cli(files, tmp_path, capsys, home):  # noqa: F811
    """`mixdesk chat --model bad.gguf`: exit 2, one line naming the key (or the tensor), nothing written."""
    from bad_input_helpers import chat, refused

    d = tmp_path / "models"
    d.mkdir()
    bad = rewrite(files["f32"], d / "groups.gguf", {"ssm.group_count": 3})
    refused(capsys, home, chat(bad), str(bad), "qwen35moe.ssm.group_count", folder=d, max_s=30)
    # values the converter cannot have written (-exp(A_log) > 0): found as the weights are read, after the
    # tokenizer's conversion was cached in the user's cache folder, so only the model's folder is watched
    flip = lambda ts: [(n, -x if n == "blk.1.ssm_a" else x, q) for n, x, q in ts]  # noqa: E731
    bad = rewrite(files["f32"], d / "a.gguf", tensors=flip)
    unwatched = tmp_path / "unwatched"
    unwatched.mkdir()
    refused(capsys, unwatched, chat(bad), str(bad), "blk.1.ssm_a", "-exp(A_log)", folder=d, max_s=60)


from bad_input_helpers import home  # noqa: E402,F401  (a fixture: the user's folders, checked for writes)
