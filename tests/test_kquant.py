"""GGUF's K-quants (Q4_K, Q5_K, Q6_K) in the native tiles (engine/native/kquant.c): dequantised bit
for bit as gguf.quants does, unpacked to exactly the raw bytes, and multiplied on every code path this
CPU has against a torch reference; the fused expert with mixed formats; and the native decode step
with block-format dense matrices against the torch layer loop."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

from engine import native
from engine.files.gguf.blockquant import BlockQuant
from engine.experts.expert import QuantExpert
from engine.placement import Tier

from native_helpers import path, threads  # noqa: F401  (fixtures: every code path, 1 and 2 threads)

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

KQ = [GT.Q4_K, GT.Q5_K, GT.Q6_K]
from kquant_helpers import D_AT, random_raw, scaled  # noqa: E402,F401 (shared: tests/kquant_helpers.py)


def q8_exact(x: torch.Tensor) -> torch.Tensor:
    """The activation as the int8 kernels see it (mdk_quantize_act): per block of 32, q = round(x * 127 /
    amax) with a true division (torch's `127.0 / t` multiplies by a reciprocal, one ulp off at times,
    which moved a level and the product by ~1e-4)."""
    T, K = x.shape
    xb = x.float().reshape(T, K // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = (xb * inv).round().clamp(-127, 127)
    return (q * (amax / 127.0)).reshape(T, K)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


@pytest.mark.parametrize("qt", KQ, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 256), (17, 512), (37, 4096), (16, 768)])
def test_dequantize_is_gguf_bit_for_bit_and_raw_round_trips(qt, shape):
    n, k = shape
    raw = random_raw(qt, n, k, seed=n * k + qt)
    bq = BlockQuant.from_raw(qt, torch.from_numpy(raw), shape)
    want = quants.dequantize(raw, qt)  # [n, k] fp32
    got = bq.dequantize().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit, signs of zeros too
    assert np.array_equal(bq.raw().numpy(), raw)
    r0, r1 = n // 3, n - n // 4  # a row range, as the embedding's lookups ask
    assert np.array_equal(bq.dequantize(r0, r1).numpy().view(np.uint32), want[r0:r1].view(np.uint32))
    tiles = (n + 15) // 16 * 16 * raw.shape[1]  # the raw bytes, the last tile padded to 16 rows
    assert bq.nbytes == tiles


@pytest.mark.parametrize("qt", KQ, ids=lambda q: q.name)
def test_bad_shapes_are_refused(qt):
    with pytest.raises(ValueError):
        BlockQuant.from_raw(qt, torch.zeros(4 * 100, dtype=torch.uint8), (4, 200))  # K not a multiple of 256
    with pytest.raises(ValueError):  # a byte count that is not the shape's
        BlockQuant.from_raw(qt, torch.zeros(7, dtype=torch.uint8), (1, 256))
    assert native.lib().mdk_wq_pack(native.Q4K + KQ.index(qt), None, 4, 320, None) == -1


@pytest.mark.parametrize("qt", KQ, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(37, 256), (19, 512), (133, 4096)])
@pytest.mark.parametrize("batch", [1, 3, 4, 5, 64])
def test_matmul_matches_reference(path, threads, qt, shape, batch):  # noqa: F811
    n, k = shape
    raw = random_raw(qt, n, k, seed=n + k + batch)
    bq = BlockQuant.from_raw(qt, torch.from_numpy(raw), shape)
    x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch))
    want = q8_exact(x) @ bq.dequantize().t()  # the same arithmetic, summed in another order
    got = bq.matmul(x)
    assert rel(got, want) < 2e-6  # fp32 rounding (a layout or offset error would be O(1))


def test_results_do_not_depend_on_threads_or_batch(monkeypatch):
    """Each row's sum is one kernel's whatever the threads and however many tokens share a read."""
    raw = random_raw(GT.Q6_K, 100, 1024, seed=3)
    bq = BlockQuant.from_raw(GT.Q6_K, torch.from_numpy(raw), (100, 1024))
    x = torch.randn(5, 1024, generator=torch.Generator().manual_seed(0))
    outs = []
    for n in (1, 2, 3):
        monkeypatch.setattr(native, "_threads", n)
        outs.append(bq.matmul(x))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert torch.equal(torch.cat([bq.matmul(x[i:i + 1]) for i in range(5)]), outs[0])


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_fused_expert_mixed_formats(path, threads, batch):  # noqa: F811
    """One expert, gate/up in Q4_K and down in Q6_K (a Q4_K_M file's mix), through the native fused
    call (mdk_experts), against torch's SwiGLU of the dequantised weights on the kernel's activations."""
    d, i = 512, 768
    w13 = scaled(GT.Q4_K, 2 * i, d, seed=1, std=d ** -0.5)
    w2 = scaled(GT.Q6_K, d, i, seed=2, std=i ** -0.5)
    ex = QuantExpert(Tier.CPU4, w13, w2, torch.device("cpu"))
    assert ex.desc is not None
    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(batch))
    h = q8_exact(x) @ w13.dequantize().t()
    a = F.silu(h[:, :i]) * h[:, i:]
    want = q8_exact(a) @ w2.dequantize().t()
    # the intermediate is quantised again: fp32 rounding differences can flip an int8 rounding
    assert rel(ex(x), want) < 1e-3


@pytest.fixture(scope="module")
def wide(tmp_path_factory):  # hidden 256 and H * Hd 256: the K-quants' rows are 256 wide
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("wide"), hidden=256, ffn=256, heads=4, kv_heads=2,
                              tokenizer=False)


@pytest.mark.parametrize("fused_qkv", [True, False], ids=["qkv-one-format", "qkv-three-formats"])
def test_native_decode_step_with_block_dense_weights(request, wide, fused_qkv):
    """The model's dense matrices swapped for block weights (q, k, v in Q4_K / Q5_K / Q6_K or one Q4_K
    matrix, wo Q4_K, the tied embedding and lm_head Q6_K, as a Q4_K_M file holds them): the one-call
    native step gives the torch layer loop's logits (same kernels, rounded at the same points)."""
    from engine.files.checkpoint import Checkpoint
    from engine.experts.dense_forms import Stacked
    from engine.model.forward import MoEModel
    from engine.native import choice
    from engine.model.native_step import DecodeStep
    from engine.placement import Placement

    ck = Checkpoint(wide)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU4), torch.device("cpu"), torch.bfloat16)
    D, H, G, Hd = d.hidden, d.heads, d.kv_heads, d.head_dim
    for l, layer in enumerate(m.layers):
        if fused_qkv:
            layer.wqkv = scaled(GT.Q4_K, (H + 2 * G) * Hd, D, seed=10 + l, std=0.5 * D ** -0.5)
        else:
            layer.wqkv = Stacked([scaled(GT.Q4_K, H * Hd, D, 20 + l, 0.5 * D ** -0.5),
                                  scaled(GT.Q5_K, G * Hd, D, 30 + l, 0.5 * D ** -0.5),
                                  scaled(GT.Q6_K, G * Hd, D, 40 + l, 0.5 * D ** -0.5)])
        layer.wo = scaled(GT.Q4_K, D, H * Hd, seed=50 + l, std=0.5 * (H * Hd) ** -0.5)
    m.embed = m.lm_head = scaled(GT.Q6_K, d.vocab, D, seed=60, std=1.0)
    assert choice.whole_step(m)
    step = m.native_step = DecodeStep(m)
    assert choice.step_ready(m) and step.layers[0].nqkv == (1 if fused_qkv else 3)
    assert [step.layers[0].qkv[i].fmt for i in range(step.layers[0].nqkv)] == (
        [native.Q4K] if fused_qkv else [native.Q4K, native.Q5K, native.Q6K])
    assert step.layers[0].wo.fmt == native.Q4K and step.desc.lm_head.fmt == native.Q6K
    ids = torch.randint(0, d.vocab, (24,), generator=torch.Generator().manual_seed(0))
    outs = []
    for use in (True, False):
        m.native_step = step if use else None
        cache = m.new_cache(64)
        m.forward(ids[:8], cache, 0)
        outs.append(torch.cat([m.forward(ids[i:i + 1], cache, i) for i in range(8, 24)]))
    assert torch.equal(outs[0], outs[1])
    # a batch of two sequences in one native call: each row that sequence's own logits
    caches = [m.new_cache(64) for _ in range(2)]
    m.native_step = None
    for c, s in zip(caches, (ids[:8], ids[4:12])):
        m.forward(s, c, 0)
    solo = [m.forward(ids[8:9], caches[0], 8), m.forward(ids[12:13], caches[1], 8)]
    caches = [m.new_cache(64) for _ in range(2)]
    for c, s in zip(caches, (ids[:8], ids[4:12])):
        m.forward(s, c, 0)
    both = step(torch.stack([ids[8], ids[12]]), caches, [8, 8])
    assert torch.equal(both, torch.cat(solo))
