"""GPT-OSS (engine/families/gpt_oss.py, fused.py) against transformers' own GptOss classes: tiny
random models written by its save_pretrained, with the experts as 16-bit fused tensors or as the
release's MXFP4 blocks and scales, single file and sharded. fp32 logits within 1e-4 over a prefill
that crosses the sliding window and 12 decode steps, for all-CPU and mixed placements; identical
greedy tokens; the native kernel's biases and clamped SwiGLU against torch's; MXFP4 decoding
bit-identical to transformers'; the 4-bit tiers' error; and bad checkpoints refused by name."""
import json

import pytest
import torch

from engine import native
from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.experts.expert import Expert16, QuantExpert
from engine.files.fused_experts import float_to_mxfp4, mxfp4_to_float
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tiny_model
from family_checks import eval_matches_transformers, greedy_matches_transformers, logit_error, run  # noqa: E402

CPU = torch.device("cpu")
KINDS = ["bf16-fused", "mxfp4"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(kind: str, sharded: bool = False):
        key = (kind, sharded)
        if key not in made:
            made[key] = write_tiny_model(tmp_path_factory.mktemp("gpt_oss"), "gpt_oss", seed=3, mxfp4=kind == "mxfp4",
                                         shard_size="50KB" if sharded else None)
        return made[key]
    return get


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("where", ["all-cpu", "mixed"])
def test_logits_match_transformers(folders, kind, sharded, where):
    folder = folders(kind, sharded)
    ck = Checkpoint(folder)
    d = ck.dims
    assert d.family == "gpt_oss" and ck.mxfp4 == (kind == "mxfp4") and (len(ck.files) > 1) == sharded
    assert d.layer_windows == (4, None) and d.attn_sinks and d.router_kind == "topk_softmax"
    assert logit_error(ck, where) < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_are_identical(folders, kind):
    greedy_matches_transformers(folders(kind))


@pytest.mark.skipif(not native.available(), reason="the native library is not built")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tier", [Tier.CPU16, Tier.CPU4])
def test_native_biases_and_clamped_swiglu_match_torch(folders, kind, tier):
    """The native kernel's GPT-OSS expert (biases, clamp, alpha) against the torch path on the same
    form (cpu-4: Q4 tiles from 16-bit weights, MX4 tiles from MXFP4); large inputs so the clamps bind."""
    ck = Checkpoint(folders(kind))
    model = MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, tier), CPU, torch.float32)
    x = torch.randn(9, ck.dims.hidden, generator=torch.Generator().manual_seed(1)) * 30
    checked = 0
    for block in model.moe:
        for ex in block.experts:
            assert ex.desc is not None and ex.desc.act == 1 and ex.desc.b13 and ex.desc.b2
            got = ex(x)
            ex.desc, desc = None, ex.desc  # the torch path on the same weights
            want = ex(x)
            ex.desc = desc
            h = (x @ (ex.w13.t() if isinstance(ex, Expert16) else ex.w13.dequantize().t()))[:, :ck.dims.ffn]
            assert (h + ex.glu.b13[:ck.dims.ffn]).max() > 7  # the gate clamp binds somewhere
            tol = 1e-4 if tier == Tier.CPU16 else 0.02  # cpu-4: int8 activations against torch's fp32
            assert (got - want).abs().max() <= tol * want.abs().max(), tier
            checked += 1
    assert checked == ck.dims.layers * ck.dims.experts


def test_mxfp4_decodes_as_transformers_does_and_exactly_in_bf16():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    w = torch.randn(3, 8, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-6, 1, 8)[None, :, None]
    blocks, scales = float_to_mxfp4(w.reshape(24, 96))
    blocks, scales = blocks.reshape(3, 8, 3, 16), scales.reshape(3, 8, 3)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [3, 96, 8] (x @ W layout)
    ours = torch.stack([mxfp4_to_float(blocks[e], scales[e], torch.float32) for e in range(3)])  # [3, 8, 96]
    assert torch.equal(ours, theirs.transpose(1, 2))
    assert torch.equal(torch.stack([mxfp4_to_float(blocks[e], scales[e]) for e in range(3)]).float(), ours)
    err = (ours - w).norm() / w.norm()
    assert 0.01 < err < 0.2, err  # MXFP4 itself is lossy (E2M1: 8 magnitudes a block)


@pytest.mark.skipif(not native.available(), reason="the native library is not built")
def test_cpu4_runs_the_released_mxfp4_blocks_exactly(folders):
    """cpu-4 of an MXFP4 expert is its released blocks in the Q4 kernel's tiles (no 16-bit detour,
    no second rounding): it stands for exactly the values the 16-bit tiers run, on every kernel path."""
    from engine.experts.quant import MX4Native, Q4Native

    ck = Checkpoint(folders("mxfp4"))
    d = ck.dims
    m16 = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    m4 = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU4), CPU, torch.float32)
    for b4, b16 in zip(m4.moe, m16.moe):
        for q, ref in zip(b4.experts, b16.experts):
            assert isinstance(q.w13, MX4Native) and isinstance(q.w2, MX4Native)
            assert torch.equal(q.w13.dequantize(), ref.w13) and torch.equal(q.w2.dequantize(), ref.w2)
            assert q.nbytes == Q4Native.quantize(ref.w13).nbytes + Q4Native.quantize(ref.w2).nbytes
    # the same expert on the portable, AVX2 and AVX-512 paths (int8 activations: ~0.7% from fp32)
    x = torch.randn(5, d.hidden, generator=torch.Generator().manual_seed(2))
    ex, ref = m4.moe[1].experts[2], m16.moe[1].experts[2]
    want = ref(x)
    try:
        for cap in (0, 1, 2):
            native.set_path(cap)
            assert (ex(x) - want).norm() / want.norm() < 0.02, cap
    finally:
        native.set_path(-1)


def test_4bit_tiers_run_the_mxfp4_release(folders):
    """cpu-4 runs the released blocks, gpu-4 quantises the exact MXFP4 values into NF4: logits stay
    close to the 16-bit run of the same weights (measured 0.05-0.08 relative on this tiny model,
    whose random weights amplify errors)."""
    ck = Checkpoint(folders("mxfp4"))
    d = ck.dims
    ids = torch.randint(0, d.vocab, (28,), generator=torch.Generator().manual_seed(11))
    want = run(MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32), ids)
    for tiers in ([Tier.CPU4], [Tier.GPU4], [Tier.CPU4, Tier.GPU4, Tier.CPU16, Tier.GPU16]):
        model = MoEModel(ck, Placement.random(d.layers, d.experts, tiers, seed=1), CPU, torch.bfloat16)
        assert all(isinstance(ex, QuantExpert) == (ex.tier.bits == 4) for b in model.moe for ex in b.experts)
        got = run(model, ids)
        rel = float((got - want).norm() / want.norm())
        assert rel < 0.15, (tiers, rel)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.5


def test_eval_gives_transformers_perplexity(folders, tmp_path, window_cache):
    eval_matches_transformers(folders("mxfp4"), tmp_path)


def test_bad_gpt_oss_checkpoints_are_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_tiny_model(tmp_path / "g", "gpt_oss", mxfp4=True, tokenizer=False)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ModelError, match="config.json: is a FP8-quantised checkpoint"):
        Checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    f = folder / "model.safetensors"
    t = load_file(str(f))
    t["model.layers.1.mlp.experts.down_proj_scales"] = t["model.layers.1.mlp.experts.down_proj_scales"][:, :, :1].contiguous()
    save_file(t, str(f))
    with pytest.raises(ModelError, match=r"model.safetensors: tensor 'model.layers.1.mlp.experts.down_proj_scales' "
                                         r"has shape \[4, 64, 1\] but config.json implies \[4, 64, 4\]"):
        Checkpoint(folder)
    # a byte tensor where a float belongs (and the reverse) is named
    t = load_file(str(write_tiny_model(tmp_path / "m", "mixtral", tokenizer=False) / "model.safetensors"))
    t["model.norm.weight"] = torch.zeros(64, dtype=torch.uint8)
    save_file(t, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(ModelError, match="tensor 'model.norm.weight' has dtype U8; Mixdesk reads 16- and 32-bit"):
        Checkpoint(tmp_path / "m")
