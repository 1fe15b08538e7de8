"""GLM as GGUF: GLM-4.5 (`glm4_moe`, llama.cpp's `glm4moe`) and GLM-4.7-Flash (`glm4_moe_lite`, which llama.cpp
converts as `deepseek2`): tiny models (3 layers: one dense, two with 4 experts in 2 groups; tests/gguf_glm_files.py)
written by engine/files/gguf/writer.py as llama.cpp's converter writes them (--no-mtp), and read back by the engine.

- Dims equal the safetensors' (dense first layer, groups, routed scale; GLM-4.7-Flash's MLA and interleaved
  rope); every tensor reads back as the source's (kv_b_proj joined from attn_k_b and attn_v_b); the file holds
  the converter's names, split and metadata; fp32 logits within 1e-4 of transformers over a prefill and decode
  steps; `mixdesk eval` on the F16 file gives transformers' perplexity within 1e-3.
- Files with an MTP block and deepseek2 files of converters before the kv_b split read the same; Q8_0 matrices
  stay blocks; inconsistent metadata, and deepseek2 models not shaped as GLM-4.7-Flash, are one ModelError naming
  the key; the writer refuses sources the converter would write wrong.
llama.cpp as the reference (its loader and its converter): tests/test_gguf_glm_llama_cpp.py.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
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
from gguf_glm_files import ARCH, tiny, with_kv_b, with_mtp_block
from gguf_hybrid_files import engine_logits, reference

FAMILIES = ["glm4_moe", "glm4_moe_lite"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return {f: tiny(tmp_path_factory.mktemp(f) / "hf", f) for f in FAMILIES}


@pytest.fixture(scope="module")
def files(sources, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("glm-gguf")
    return {(f, r): write_gguf(sources[f], root / f"{f}-{r}.gguf", r)[0] for f in FAMILIES for r in ("f32", "f16")}


# ---- the engine reads what the writer wrote ---------------------------------------------------------

@pytest.mark.parametrize("recipe", ["f32", "f16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_dims_are_the_safetensors(sources, files, family, recipe):
    g = open_gguf(files[family, recipe])
    try:
        d = g.dims
        assert d == Checkpoint(sources[family]).dims
        assert (d.family, d.dense_first, d.layers, d.dense_ffn, d.route_groups, d.shared_ffn, d.shared_gated) == \
            (family, 1, 2, 96, (2, 1), 128, False)
        if family == "glm4_moe":
            assert d.route_scale == 1.5 and d.rot_dim == 16 and d.qk_norm == "head" and d.qkv_bias
        else:
            assert d.route_scale == 1.8 and d.mla == (24, 32, 16, 8, 20) and d.rope_interleave
            assert d.mixers == ("mla",) * 3 and d.kv_heads == 1 and d.head_dim == 8
    finally:
        g.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_file_reads_back_the_source(sources, files, family):
    """Every tensor the engine reads is the source's, exactly (kv_b_proj joined from the converter's halves);
    the experts of MoE layer l are the file's block l + 1."""
    ref, g = Checkpoint(sources[family]), open_gguf(files[family, "f32"])
    try:
        assert set(g.expected) == set(ref.expected)
        for name in ref.expected:
            assert torch.equal(g.read(name), ref.read(name)), name
        assert g.expert_key(0, 3, "w2") == "model.layers.1.mlp.experts.3.down_proj.weight"
        assert torch.equal(g.expert_float(1, 2)[1], ref.read("model.layers.2.mlp.experts.2.down_proj.weight"))
        assert g.expert_raw_info(0, 0, "w1").name == "blk.1.ffn_gate_exps.weight"
        if family == "glm4_moe_lite":
            kv_b = "model.layers.0.self_attn.kv_b_proj.weight"
            assert g.tensor_type(kv_b) == GT.F32 and g.raw_view(kv_b) is None
            assert g.info(kv_b).nbytes == 4 * 4 * 32 * (16 + 20)  # attn_k_b and attn_v_b: H R (N + V) floats
    finally:
        g.close()


def test_the_files_hold_what_the_converter_makes(sources, files):
    """Independently of the reader: names, the kv_b split, and the metadata as llama.cpp's converter writes them."""
    from safetensors.torch import load_file

    for family in FAMILIES:
        sd = load_file(str(sources[family] / "model.safetensors"))
        r = GGUFReader(files[family, "f32"])
        t = {x.name: torch.from_numpy(np.array(x.data)) for x in r.tensors}
        a = ARCH[family]
        kv = {k[len(a) + 1:]: f.contents() for k, f in r.fields.items() if k.startswith(a + ".")}
        p = "model.layers.1."
        assert torch.equal(t["blk.1.exp_probs_b.bias"], sd[p + "mlp.gate.e_score_correction_bias"])
        assert torch.equal(t["blk.1.ffn_gate_inp.weight"], sd[p + "mlp.gate.weight"])
        assert torch.equal(t["blk.1.ffn_up_shexp.weight"], sd[p + "mlp.shared_experts.up_proj.weight"])
        assert torch.equal(t["blk.0.ffn_down.weight"], sd["model.layers.0.mlp.down_proj.weight"])
        assert torch.equal(t["blk.2.ffn_gate_exps.weight"][3], sd["model.layers.2.mlp.experts.3.gate_proj.weight"])
        assert "blk.0.ffn_gate_exps.weight" not in t and "blk.1.ffn_gate.weight" not in t
        assert not any(".nextn." in n or n.startswith("blk.3.") for n in t)
        common = dict(block_count=3, leading_dense_block_count=1, expert_count=4, expert_used_count=2,
                      expert_group_count=2, expert_group_used_count=1, expert_shared_count=1,
                      expert_feed_forward_length=128, feed_forward_length=96, expert_weights_norm=True,
                      expert_gating_func=2)
        assert {k: kv.get(k) for k in common} == common
        assert "nextn_predict_layers" not in kv
        if family == "glm4_moe":  # nothing transformed: q rows as released, norms plain
            assert torch.equal(t["blk.1.attn_q.weight"], sd[p + "self_attn.q_proj.weight"])
            assert torch.equal(t["blk.1.attn_q.bias"], sd[p + "self_attn.q_proj.bias"])
            assert torch.equal(t["blk.1.post_attention_norm.weight"], sd[p + "post_attention_layernorm.weight"])
            assert torch.equal(t["blk.1.attn_k_norm.weight"], sd[p + "self_attn.k_norm.weight"])
            assert (kv["rope.dimension_count"], kv["attention.key_length"]) == (16, 32)
            assert kv["attention.head_count_kv"] == 2
            assert kv["expert_weights_scale"] == pytest.approx(1.5)
            continue
        kv_b = sd[p + "self_attn.kv_b_proj.weight"].view(4, 36, 32)  # [H, N + V, R]
        assert torch.equal(t["blk.1.attn_k_b.weight"], kv_b[:, :16].transpose(1, 2))  # [H, R, N]
        assert torch.equal(t["blk.1.attn_v_b.weight"], kv_b[:, 16:])
        assert "blk.1.attn_kv_b.weight" not in t
        assert torch.equal(t["blk.1.attn_q_b.weight"], sd[p + "self_attn.q_b_proj.weight"])  # rope rows not moved
        assert torch.equal(t["blk.1.attn_kv_a_mqa.weight"], sd[p + "self_attn.kv_a_proj_with_mqa.weight"])
        assert torch.equal(t["blk.1.attn_q_a_norm.weight"], sd[p + "self_attn.q_a_layernorm.weight"])
        assert torch.equal(t["blk.1.ffn_norm.weight"], sd[p + "post_attention_layernorm.weight"])
        mla = dict(q_lora_rank=24, kv_lora_rank=32, key_length=40, value_length=32, key_length_mla=24,
                   value_length_mla=20, head_count_kv=1)
        assert {k: kv.get("attention." + k) for k in mla} == mla
        assert (kv["rope.dimension_count"], kv["vocab_size"]) == (8, 320)
        assert kv["expert_weights_scale"] == pytest.approx(1.8)


def test_names_agree_with_gguf_tensor_map(files):
    """engine/files/gguf/names.py's name of every dense tensor is gguf's TensorNameMap's for the architecture (the
    correction bias as filter_tensors renames it; kv_b_proj, which the converter splits, as the oldest files
    hold it)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    from engine.files.gguf.names import gguf_name

    for family in FAMILIES:
        g = open_gguf(files[family, "f32"])
        try:
            arch = next(a for a, n in MODEL_ARCH_NAMES.items() if n == g.arch)
            tmap = get_tensor_name_map(arch, g.dims.decoder_layers)
            for hf in g.expected.dense:
                want = tmap.get_name(hf.replace("e_score_correction_bias", "e_score_correction.bias"),
                                     try_suffixes=(".weight", ".bias"))
                assert gguf_name(hf, g.arch) == want, (hf, want)
        finally:
            g.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_match_transformers(sources, files, family):
    ids = torch.randint(0, 320, (28,), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = reference(sources[family])(ids[None]).logits[0]
    got = engine_logits(files[family, "f32"], ids, 16)
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.slow  # 3 s each (a subprocess); tests/test_gguf_hybrid.py keeps one eval of a GGUF in the default run
@pytest.mark.parametrize("family", FAMILIES)
def test_eval_of_the_f16_file_gives_transformers_perplexity(sources, files, family, window_cache):
    """`mixdesk eval --dtype fp32 --placement cpu` on the F16 file, against transformers on the source
    (full precision) over the same tokens: within 1e-3 (F16's rounding of the matrices)."""
    from transformers import AutoTokenizer

    from engine.model.evaluate import corpus_ids

    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "eval", "--model", str(files[family, "f16"]),
                        "--dtype", "fp32", "--placement", "cpu", "--tokens", "96", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    ppl = float(re.search(r"perplexity ([0-9.]+), 96 tokens", r.stdout)[1])
    g = open_gguf(files[family, "f16"])
    try:
        ids = corpus_ids(g.load_tokenizer(), None, 96)
    finally:
        g.close()
    assert ids == corpus_ids(AutoTokenizer.from_pretrained(str(sources[family])), None, 96)  # the source's tokenizer
    ids = torch.tensor(ids)
    with torch.no_grad():
        logits = reference(sources[family])(ids[None]).logits[0, :-1]
    want = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))
    assert abs(ppl - want) / want < 1e-3, (ppl, want)


# ---- files of other converters, blocks --------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_blocks_and_older_converters_files(files, tmp_path, family):
    """A file with the MTP block (block_count 4, nextn_predict_layers 1, blk.3 a whole MoE layer and its nextn
    tensors) runs as the file without it; so does a deepseek2 file of the converters before the kv_b split
    (attn_kv_b as released, key_length / value_length the heads', no _mla keys)."""
    ids = torch.randint(0, 320, (10,), generator=torch.Generator().manual_seed(2))
    src = files[family, "f32"]
    want = engine_logits(src, ids, 6)
    others = [rewrite(src, tmp_path / "mtp.gguf", {"block_count": 4, "nextn_predict_layers": 1},
                      lambda ts: with_mtp_block(ts, 2))]
    if family == "glm4_moe_lite":
        others.append(rewrite(src, tmp_path / "old.gguf", {"attention.key_length": 24, "attention.value_length": 20,
                                                           "attention.key_length_mla": None,
                                                           "attention.value_length_mla": None}, with_kv_b))
    g0 = open_gguf(src)
    d0 = g0.dims
    g0.close()
    for path in others:
        g = open_gguf(path)
        assert g.dims == d0, path.name
        g.close()
        assert torch.equal(engine_logits(path, ids, 6), want), path.name


@pytest.fixture(scope="module")
def q8_files(sources, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("glm-q8")
    return {f: write_gguf(sources[f], root / f"{f}-q8_0.gguf", "q8_0")[0] for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_matrices_stay_blocks(sources, q8_files, family):
    """Q8_0: the matrices (the dense layer's MLP, the shared expert, MLA's q_a and kv_a) are the file's
    blocks, mapped; attn_k_b and attn_q_b (rows of 16 and 24: not whole Q8_0 blocks) are F16 as the converter
    falls back, and kv_b_proj is presented joined in F32. Every block read is the exact dequantisation read()
    gives."""
    g, ref = open_gguf(q8_files[family]), Checkpoint(sources[family])
    try:
        names = ["model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight"]
        if family == "glm4_moe_lite":
            names += [f"model.layers.1.self_attn.{n}.weight" for n in ("q_a_proj", "kv_a_proj_with_mqa")]
            assert g.file.tensors["blk.1.attn_k_b.weight"].qtype == GT.F16
            assert g.file.tensors["blk.1.attn_q_b.weight"].qtype == GT.F16
            assert g.file.tensors["blk.1.attn_v_b.weight"].qtype == GT.Q8_0
            assert g.tensor_type("model.layers.1.self_attn.kv_b_proj.weight") == GT.F32
        for n in names:
            assert g.tensor_type(n) == GT.Q8_0 and g.raw_view(n) is not None, n
        for name, shape in g.expected.dense.items():
            t, v = g.tensor_type(name), g.read(name).float()
            if t not in (GT.F32, GT.F16, GT.BF16):
                assert torch.equal(dequantize_rows(t, g.read_raw(name), shape[-1]).reshape(shape).float(), v), name
            want = ref.read(name).float()
            assert (v - want).abs().max() <= 0.01 * want.abs().max(), name  # Q8_0's rounding
    finally:
        g.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_file_at_bf16_through_the_native_kernels(q8_files, family):
    """bf16 through the native kernels (the file's blocks, mapped) gives fp32's perplexity within 5%."""
    from engine import native
    from engine.model.evaluate import perplexity
    from engine.runtime.load import load

    if not native.available():
        pytest.skip("the native library is not built here")
    ids = torch.randint(3, 300, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    ppl = {}
    for dtype in ("fp32", "bf16"):
        ld = load(q8_files[family], placement="cpu", device="cpu", dtype=dtype)
        try:
            ppl[dtype] = perplexity(ld.model, ids)
        finally:
            ld.ckpt.close()
    assert abs(ppl["bf16"] - ppl["fp32"]) / ppl["fp32"] < 0.05, ppl


# ---- bad metadata, other deepseek2 models, sources the converter gets wrong -------------------------------

def _drop(prefix: str):
    return lambda ts: [(n, d, q) for n, d, q in ts if not n.startswith(prefix)]


@pytest.mark.parametrize("family,kv,tensors,words", [
    ("glm4_moe", {"expert_group_count": 3}, None, ["'glm4moe.expert_group_count' is 3", "4 experts"]),
    ("glm4_moe", {"expert_group_used_count": 3}, None, ["'glm4moe.expert_group_used_count' is 3"]),
    ("glm4_moe", {"leading_dense_block_count": 3}, None, ["'glm4moe.leading_dense_block_count' is 3"]),
    ("glm4_moe", {"nextn_predict_layers": 3}, None, ["'glm4moe.nextn_predict_layers' is 3"]),
    ("glm4_moe", {"expert_gating_func": 1}, None, ["'glm4moe.expert_gating_func' is 1 (softmax)"]),
    ("glm4_moe", {"rope.dimension_count": 7}, None, ["'glm4moe.rope.dimension_count' is 7"]),
    ("glm4_moe", {"expert_shared_count": None}, None, ["lacks the metadata 'glm4moe.expert_shared_count'"]),
    ("glm4_moe", {"expert_weights_scale": -1.0}, None, ["'glm4moe.expert_weights_scale' is -1.0"]),
    ("glm4_moe", None, _drop("blk.1.exp_probs_b"), ["is missing tensor 'blk.1.exp_probs_b.bias'"]),
    ("glm4_moe_lite", {"expert_group_count": 3}, None, ["'deepseek2.expert_group_count' is 3"]),
    # a deepseek2 file without the gating key: llama.cpp routes it with softmax (DeepSeek-V2)
    ("glm4_moe_lite", {"expert_gating_func": None}, None,
     ["'deepseek2.expert_gating_func' is absent", "softmax", "47 layers"]),
    ("glm4_moe_lite", {"rope.scaling.type": "yarn"}, None, ["'deepseek2.rope.scaling.type' is 'yarn'"]),
    ("glm4_moe_lite", {"attention.temperature_scale": 0.1}, None, ["'deepseek2.attention.temperature_scale'"]),
    ("glm4_moe_lite", {"attention.key_length_mla": 8}, None, ["'deepseek2.attention.key_length_mla' is 8"]),
    ("glm4_moe_lite", {"attention.key_length": 99}, None, ["'deepseek2.attention.key_length' is 99", "40"]),
    ("glm4_moe_lite", {"rope.dimension_count": 5}, None, ["'deepseek2.rope.dimension_count' is 5"]),
    # consistent, but not what the tensors are
    ("glm4_moe_lite", {"attention.kv_lora_rank": 16, "attention.key_length": 24, "attention.value_length": 16},
     None, ["has shape", "metadata implies"]),
    ("glm4_moe_lite", None, _drop("blk.0.attn_k_b"), ["is missing tensor 'blk.0.attn_k_b.weight'"]),
])
def test_inconsistent_metadata_is_one_clear_error(files, tmp_path, family, kv, tensors, words):
    bad = rewrite(files[family, "f32"], tmp_path / "bad.gguf", kv, tensors)
    with pytest.raises(ModelError) as e:
        open_gguf(bad)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg
    for w in words:
        assert w in msg, msg


def test_deepseek2_without_gating_key_at_glm_4_7_flash_shape(files, tmp_path):
    """llama.cpp's own rule for deepseek2 files without expert_gating_func (GLM-4.7-Flash's release has none):
    sigmoid for 47 (or 48) layers and a 154,880-token vocabulary, softmax (refused) otherwise. Only the
    metadata is read here (the tensors stay the tiny model's)."""
    from engine.files.gguf.config import hf_config_dict
    from engine.files.gguf.reader import GGUFFile

    shape = {"expert_gating_func": None, "vocab_size": 154880, "block_count": 48, "nextn_predict_layers": 1}
    for kv, ok in ((shape, True), ({**shape, "vocab_size": 151552}, False), ({**shape, "block_count": 47}, False)):
        f = GGUFFile(rewrite(files["glm4_moe_lite", "f32"], tmp_path / "shaped.gguf", kv))
        try:
            if ok:
                raw = hf_config_dict(f)
                assert raw["num_hidden_layers"] == 47 and raw["mlp_layer_types"][:2] == ["dense", "sparse"]
            else:
                with pytest.raises(ModelError, match="'deepseek2.expert_gating_func' is absent"):
                    hf_config_dict(f)
        finally:
            f.close()


def test_writer_refuses_what_the_converter_writes_wrong(sources, tmp_path):
    """A GLM-4.7-Flash source whose dense layers only mlp_layer_types says (the converter writes
    leading_dense_block_count from first_k_dense_replace: 0), or whose rope is not interleaved (llama.cpp
    rotates deepseek2's as pairs): refused, naming the field."""
    for fields, word in (({"first_k_dense_replace": None}, "first_k_dense_replace"),
                         ({"rope_interleave": False}, "rope_interleave")):
        src = tmp_path / word
        shutil.copytree(sources["glm4_moe_lite"], src)
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(fields)
        (src / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
        with pytest.raises(ModelError, match=word):
            write_gguf(src, tmp_path / f"{word}.gguf", "f32")


def test_bad_files_are_refused_by_the_cli(files, tmp_path, capsys, home):  # noqa: F811
    """`mixdesk chat --model bad.gguf`: exit 2, one line naming the key, nothing written."""
    from bad_input_helpers import chat, refused

    d = tmp_path / "models"
    d.mkdir()
    bad = rewrite(files["glm4_moe", "f32"], d / "groups.gguf", {"expert_group_count": 3})
    refused(capsys, home, chat(bad), str(bad), "glm4moe.expert_group_count", folder=d, max_s=30)
    bad = rewrite(files["glm4_moe_lite", "f32"], d / "v2.gguf", {"expert_gating_func": 1})
    refused(capsys, home, chat(bad), str(bad), "deepseek2.expert_gating_func", folder=d, max_s=30)


from bad_input_helpers import home  # noqa: E402,F401  (a fixture: the user's folders, checked for writes)
