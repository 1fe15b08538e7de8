"""A long prompt's CPU-resident GGUF experts copied to the GPU for the prompt (issue 45, item 6): the
file's own rows cross as they are and are dequantised there by torch ops (engine/files/gguf/torch_dequant.py).
Checked on the CPU: every block format equals gguf's reference dequantiser bit for bit; a GGUF expert
is copyable, its 16-bit copy equals the file's values exactly and answers as the native kernels do;
the prefill's copy path (MoE._prefill with copy_wins) gives the logits the CPU path gives. The same on
a CUDA device in the gpu-marked test."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT, quants

from engine import native
from engine.files.gguf.blockquant import BlockQuant, quantize_raw
from engine.experts.expert import Expert16, QuantExpert
from engine.files.gguf import torch_dequant
from engine.files.gguf.writer import write_gguf
from engine.runtime.load import load
from engine.experts.offload import OffloadCosts
from engine.sources.tiny_model import write_tiny_model

from gguf_blocks import CODES_TYPES, random_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

SHAPE = dict(layers=2, hidden=256, ffn=512, experts=8, top_k=2, heads=4, kv_heads=2, vocab=320)


@pytest.mark.parametrize("qtype", sorted(torch_dequant.BLOCKS, key=lambda t: t.name), ids=lambda t: t.name)
def test_every_block_format_equals_ggufs_dequantiser_bit_for_bit(qtype):
    g = torch.Generator().manual_seed(int(qtype))
    w = torch.randn(12, 512, generator=g) * torch.rand(12, 1, generator=g) * 4  # rows of unlike scales
    # (the types no quantiser here makes: random valid blocks, tests/gguf_blocks.py)
    raw = torch.from_numpy(random_rows(qtype, 12, 512, int(qtype))) if qtype in CODES_TYPES else quantize_raw(w, qtype)
    want = quants.dequantize(raw.numpy(), qtype)
    got = torch_dequant.dequantize(raw.reshape(-1), qtype, 512)  # flat, as a file's rows are held
    assert got.dtype == torch.float32 and got.shape == (12, 512)
    assert np.array_equal(got.numpy(), want)


def test_a_format_it_does_not_expand_is_not_copyable():
    assert not torch_dequant.supported(GT.IQ2_XXS) and torch_dequant.supported(GT.Q4_K)


@pytest.fixture(scope="module")
def file(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    src = write_tiny_model(root / "src", "qwen3_moe", **SHAPE)
    return write_gguf(src, root / "qwen3-q4_k_m.gguf", "q4_k_m")[0]


def test_a_gguf_expert_is_copyable_and_its_copy_holds_the_files_values(file):
    ld = load(file, placement="cpu", device="cpu", dtype="bf16")
    try:
        ex = ld.model.moe[0].experts[3]
        assert isinstance(ex, QuantExpert) and isinstance(ex.w13, BlockQuant) and ex.copyable
        copy = ex.to(torch.device("cpu"), torch.float32)
        assert isinstance(copy, Expert16) and copy.w13.dtype == torch.float32
        exact13, exact2 = ld.ckpt.expert_float(0, 3)
        assert torch.equal(copy.w13, exact13) and torch.equal(copy.w2, exact2)
        x = torch.randn(5, SHAPE["hidden"], generator=torch.Generator().manual_seed(1))
        native_y, copy_y = ex(x), copy(x)  # int8 activations against fp32 ones: close, not equal
        assert float((native_y - copy_y).abs().max() / copy_y.abs().max()) < 0.03
        assert ex.nbytes < copy.nbytes / 3  # what crosses: the file's rows, not 16 bits a weight
    finally:
        ld.ckpt.close()


def copy_always(model) -> None:
    """Offload costs under which every CPU expert's copy wins (the CPU costs far more than a copy)."""
    model.set_offload(OffloadCosts(cpu_fixed_s=1.0, cpu_per_token_s=1.0, gpu_fixed_s=0.0, gpu_per_token_s=0.0,
                                   h2d_bytes_per_s=1e15))


def prefill_logits(file, device, copy: bool):
    ld = load(file, placement="cpu", device=device, dtype="fp32" if device == "cpu" else "bf16", ctx=128)
    try:
        m = ld.model
        if copy:
            copy_always(m)
        ids = torch.randint(3, SHAPE["vocab"], (48,), generator=torch.Generator().manual_seed(2))
        out = m.forward(ids, m.new_cache(128), 0, all_logits=True).float().cpu()
        return out, sum(b.copied for b in m.moe)
    finally:
        ld.ckpt.close()


def test_the_prefill_copy_path_gives_the_cpu_paths_logits(file):
    """On the CPU as its own 'accelerator' the copy path runs end to end (MoE._prefill's accel jobs)."""
    want, copied = prefill_logits(file, "cpu", copy=False)
    got, copied_now = prefill_logits(file, "cpu", copy=True)
    assert copied == 0 and copied_now > 0
    assert float((got - want).abs().max() / want.abs().max()) < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_a_copied_gguf_expert_answers_as_on_the_cpu(file):
    ld = load(file, placement="cpu", device="cuda", dtype="bf16")
    try:
        ex = ld.model.moe[0].experts[3]
        copy = ex.to(torch.device("cuda"), torch.bfloat16)
        exact13, _ = ld.ckpt.expert_float(0, 3)
        assert copy.w13.is_cuda and torch.equal(copy.w13.float().cpu(), exact13.to(torch.bfloat16).float())
        x = torch.randn(64, SHAPE["hidden"], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        y_cpu, y_gpu = ex(x).float(), copy(x.cuda()).float().cpu()
        assert float((y_cpu - y_gpu).abs().max() / y_cpu.abs().max()) < 0.05
    finally:
        ld.ckpt.close()
    want, _ = prefill_logits(file, "cuda", copy=False)
    got, copied = prefill_logits(file, "cuda", copy=True)
    assert copied > 0 and float((got - want).abs().max() / want.abs().max()) < 0.05
