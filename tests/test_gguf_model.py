"""A GGUF file as a model (issue 26): tiny Mixtral, Qwen3-MoE and GPT-OSS written in llama.cpp's layout
(engine/files/gguf/writer.py, Q4_K_M-style types quantised by our own quantisers), run by the engine.

- fp32 parity against transformers on the file's own dequantised weights (gguf.quants.dequantize of
  each tensor, mapped to transformers' parameters here, independently of engine/files/gguf's names): max
  logit difference < 1e-4, identical greedy tokens; every expert on the CPU, on the accelerator
  tiers, and mixed; one file and split files.
- GPT-OSS from MXFP4: the GGUF file and the safetensors release it came from give the same logits.
- At bf16 the CPU tiers run the file's own blocks (native K-quant/32-block kernels, int8
  activations): logits within a measured bound of the reference, a file's 4-bit experts are the
  same form in cpu-4 and cpu-16 (no second rounding), gpu-4's NF4 is a second rounding, bounded.
- `mixdesk chat --model x.gguf` answers.
"""
from __future__ import annotations

import pytest
import torch

from engine import native
from engine.files.gguf.writer import write_gguf
from engine.runtime.load import load
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tiny_model

from gguf_reference import ppl as _ppl, reference

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

# rows of 256 (hidden and expert width) so the Q4_K_M recipe keeps K-quants, as on a real model
SHAPE = dict(layers=2, hidden=256, ffn=256, experts=4, top_k=2, heads=4, kv_heads=2, vocab=320)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-model")
    return {fam: write_tiny_model(root / fam, fam, **SHAPE) for fam in ("mixtral", "qwen3_moe")}


@pytest.fixture(scope="module")
def files(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-files")
    return {fam: write_gguf(src, root / f"{fam}-q4_k_m.gguf", "q4_k_m")[0] for fam, src in sources.items()}


def placements(d):
    return {"cpu": Placement.uniform(d.layers, d.experts, Tier.CPU16),
            "gpu": Placement.uniform(d.layers, d.experts, Tier.GPU16),
            "mixed": Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], 3)}


@pytest.mark.parametrize("fam", ["mixtral", "qwen3_moe"])
def test_fp32_parity_with_transformers_on_the_files_weights(fam, sources, files):
    ref = reference(sources[fam], files[fam])
    ids = torch.tensor([5, 17, 9, 200, 33, 7, 101, 64])
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    probe = load(files[fam], placement="cpu", device="cpu", dtype="fp32")
    d = probe.ckpt.dims
    probe.ckpt.close()
    for name, pl in placements(d).items():
        ld = load(files[fam], placement=pl, device="cpu", dtype="fp32")
        try:
            got = ld.model.forward(ids, ld.model.new_cache(32), 0, all_logits=True)
            assert (got - want).abs().max() < 1e-4, (name, float((got - want).abs().max()))
            assert torch.equal(got.argmax(-1), want.argmax(-1)), name
        finally:
            ld.ckpt.close()


def test_split_files_give_the_same_logits(sources, files, tmp_path):
    parts = write_gguf(sources["mixtral"], tmp_path / "m.gguf", "q4_k_m", split=3)
    assert len(parts) == 3 and parts[0].name.endswith("-00001-of-00003.gguf")
    ids = torch.tensor([3, 4, 5, 6])
    out = []
    for p in (files["mixtral"], parts[0]):
        ld = load(p, placement="cpu", device="cpu", dtype="fp32")
        out.append(ld.model.forward(ids, ld.model.new_cache(8), 0, all_logits=True))
        ld.ckpt.close()
    assert torch.equal(out[0], out[1])


def test_mixtral_gguf_made_by_the_tests_writer_chats_from_the_cli(files, tmp_path, window_cache):
    """`mixdesk chat --model tiny-q4km.gguf --prompt hi`: one process, as a user runs it."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--model", str(files["mixtral"]),
                        "--prompt", "hi", "--max-new-tokens", "6"], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "decode" in r.stderr and "tok/s" in r.stderr
    assert not any(p.name != files["mixtral"].name for p in files["mixtral"].parent.iterdir()
                   if p.name.startswith("mixtral-q4_k_m")), "nothing is written next to the file"


@pytest.mark.parametrize("fam", ["mixtral", "qwen3_moe"])
def test_eval_at_the_accelerator_tiers_gives_the_reference_perplexity(fam, sources, files):
    """`mixdesk eval --dtype fp32 --device cpu --placement gpu`: the accelerator tiers (run by torch on
    the CPU device) hold the exact dequantisation, so the perplexity is transformers' on the file's
    weights, to 1e-3; `--dtype bf16 --placement cpu` runs the file's blocks natively (int8 activations,
    bf16 dense matmul inputs) and stays within a bound: on 2026-12-01, 3 token sets x 2 families gave
    fp32 within 1.5e-6 and bf16 within 0.14% of the reference; the bound allows 1%."""
    from engine.model.evaluate import perplexity

    ids = torch.randint(3, SHAPE["vocab"], (96,), generator=torch.Generator().manual_seed(1))
    want = _ppl(reference(sources[fam], files[fam]), ids)
    got = {}
    for dtype, pl in (("fp32", "gpu"), ("bf16", "cpu")):
        ld = load(files[fam], placement=pl, device="cpu", dtype=dtype)
        try:
            got[dtype] = perplexity(ld.model, ids.tolist())
        finally:
            ld.ckpt.close()
    assert abs(got["fp32"] - want) / want < 1e-3, (got, want)
    assert abs(got["bf16"] - want) / want < 0.01, (got, want)


def test_tiers_of_a_q4_k_m_file(files):
    """A Q4_K_M file's gate/up are Q4_K (they cannot fall), its down matrices Q6_K in some layers: cpu-4
    keeps the file's Q4_K blocks as they are (the same bytes) and re-quantises only the Q6_K ones;
    cpu-16 holds the file's blocks, gpu-16 the exact dequantisation, gpu-4 NF4 of it (a second
    rounding, bounded). The planner's sizes follow."""
    from gguf import GGMLQuantizationType as GT

    from engine.files.gguf.blockquant import BlockQuant
    from engine.experts.gguf_tiers import requantised_share
    from engine.experts.tier_bytes import tier_bytes

    ld = load(files["mixtral"], placement="cpu", device="cpu", dtype="bf16")
    try:
        ck, m = ld.ckpt, ld.model
        assert "Q4_K_M GGUF" in ck.format_label() and 0 < requantised_share(ck) < 1
        layer = next(l for l in range(ck.dims.layers) if ck.expert_raw(l, 2, "w2")[0] == GT.Q6_K)
        a, b = m.build(layer, 2, Tier.CPU16), m.build(layer, 2, Tier.CPU4)
        assert isinstance(a.w13, BlockQuant) and isinstance(b.w13, BlockQuant)
        assert a.w13.qtype == b.w13.qtype == GT.Q4_K and torch.equal(a.w13.raw(), b.w13.raw())
        assert a.w2.qtype == GT.Q6_K and b.w2.qtype == GT.Q4_K and b.nbytes < a.nbytes
        exact13, exact2 = ck.expert_float(layer, 2)
        assert torch.equal(a.w13.dequantize(), exact13) and torch.equal(a.w2.dequantize(), exact2)
        g16 = m.build(layer, 2, Tier.GPU16)
        assert torch.equal(g16.w13.float(), exact13.to(torch.bfloat16).float())
        g4 = m.build(layer, 2, Tier.GPU4)
        rel = float((g4.w13.dequantize() - exact13).norm() / exact13.norm())
        assert 0 < rel < 0.12, rel  # NF4 of the file's values: a second rounding, ~0.09 measured
        sizes = tier_bytes(ck, 2)
        assert sizes["cpu-4"] < sizes["cpu-16"] < sizes["gpu-16"] // 3
    finally:
        ld.ckpt.close()


def test_an_eight_bit_file_drops_to_four_bits_and_back_bit_identically(sources, tmp_path):
    """A Q8_0 file's experts can fall to cpu-4 (re-quantised from the exact dequantisation) and come
    back to the file's own blocks: 16 -> 4 -> 16 gives the same bytes."""
    path = write_gguf(sources["mixtral"], tmp_path / "m-q8_0.gguf", "q8_0")[0]
    ld = load(path, placement="cpu", device="cpu", dtype="bf16")
    try:
        m, ck = ld.model, ld.ckpt
        before = m.moe[0].experts[1].w13.raw().clone()
        small = m.move(0, 1, Tier.CPU4)
        assert small < ck.expert_nbytes()  # 4.5 bits a weight where the file holds 8.5
        m.move(0, 1, Tier.CPU16)
        assert torch.equal(m.moe[0].experts[1].w13.raw(), before)
    finally:
        ld.ckpt.close()


def test_a_16_bit_checkpoints_dense_matrices_in_q8_0_for_the_benchmark(sources):
    """benchmarks/cpu_vs_llama_cpp.py's 'cpu-4, dense Q8_0' row: the dense matrices quantised to Q8_0
    on the CPU run natively (one decode step equals the torch layer loop's logits closely)."""
    from gguf import GGMLQuantizationType as GT

    from engine.files.gguf.blockquant import BlockQuant
    from engine.runtime.load import open_checkpoint
    from engine.model.forward import MoEModel

    ck = open_checkpoint(sources["mixtral"])
    try:
        d = ck.dims
        pl = Placement.uniform(d.layers, d.experts, Tier.CPU4)
        a = MoEModel(ck, pl, torch.device("cpu"), torch.bfloat16)
        b = MoEModel(ck, pl, torch.device("cpu"), torch.bfloat16, dense_blocks=GT.Q8_0)
        assert isinstance(b.layers[0].wo, BlockQuant) and b.dense_bytes() < 0.6 * a.dense_bytes()
        assert b.native_step is not None
        ids = torch.tensor([5, 6, 7, 8])
        la = a.forward(ids, a.new_cache(16), 0)
        lb = b.forward(ids, b.new_cache(16), 0)
        assert float((la - lb).abs().max()) < 0.05 * float(la.abs().max())
    finally:
        ck.close()


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """A tiny GPT-OSS with MXFP4 experts, as released, and its GGUF (the experts stay MXFP4)."""
    root = tmp_path_factory.mktemp("gguf-gpt-oss")
    src = write_tiny_model(root / "src", "gpt_oss", seed=3, mxfp4=True)
    return src, write_gguf(src, root / "gpt-oss.gguf", "f32")[0]  # dense exact; experts stay MXFP4


def test_gpt_oss_gguf_gives_the_releases_logits(gpt_oss):
    """GPT-OSS's GGUF holds the release's MXFP4 blocks (exact in bf16 and fp32), so the engine on the file
    equals the engine on the safetensors release (itself checked against transformers in
    tests/test_gpt_oss.py), every expert on the CPU, on the accelerator tiers and mixed; at bf16 the
    CPU runs the file's MXFP4 blocks in the native kernel."""
    from gguf import GGMLQuantizationType as GT

    from engine.experts.quant import MX4Native

    src, path = gpt_oss
    ids = torch.tensor([5, 17, 9, 200, 33, 7, 101, 64])
    ref = load(src, placement="gpu", device="cpu", dtype="fp32")
    want = ref.model.forward(ids, ref.model.new_cache(32), 0, all_logits=True)
    d = ref.ckpt.dims
    ref.ckpt.close()
    for name, pl in placements(d).items():
        ld = load(path, placement=pl, device="cpu", dtype="fp32")
        try:
            assert ld.ckpt.expert_formats() == {GT.MXFP4}
            got = ld.model.forward(ids, ld.model.new_cache(32), 0, all_logits=True)
            assert (got - want).abs().max() < 1e-4, (name, float((got - want).abs().max()))
        finally:
            ld.ckpt.close()
    ld = load(path, placement="cpu", device="cpu", dtype="bf16")
    try:
        ex = ld.model.moe[0].experts[0]
        assert isinstance(ex.w13, MX4Native) and ld.model.build(0, 0, Tier.CPU4).w13.fmt == ex.w13.fmt
        got = ld.model.forward(ids, ld.model.new_cache(32), 0, all_logits=True)
        assert float((got - want).abs().max()) < 0.05 * float(want.abs().max())  # bf16 activations
    finally:
        ld.ckpt.close()
