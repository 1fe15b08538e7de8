"""GGUF's 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) in the native tiles (qblock.c):
random valid raw blocks dequantise bit for bit as gguf.quants does and unpack to the very bytes they
came from; their products with int8 activations match a torch reference on every code path this CPU
has, 1 and 2 threads, odd row counts (rows past the last 16-row tile stay raw) and batches 1..64; and
the fused expert call runs a Q5_0 gate/up with a Q8_0 down (the mix llama.cpp's Q4_K_M writes when a
hidden size is not a multiple of 256)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES

from engine import native
from engine.files.gguf.blockquant import NATIVE, BlockQuant, row_bytes
from engine.experts.expert import QuantExpert, run_native
from engine.placement import Tier

from native_helpers import path, q8_reference, rel, threads  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

FORMATS = [GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1]
# rows odd and not a multiple of 16 (7: all raw tail; 145 = 9 tiles + 1 raw row), K = 32 .. 4096
SHAPES = [(7, 32), (33, 96), (145, 576), (49, 4096)]
from qblock_helpers import WITH_MIN, random_raw  # noqa: E402,F401 (shared: tests/qblock_helpers.py)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES + [(16, 64), (0, 64)])
def test_dequantize_is_ggufs_bit_for_bit_and_raw_round_trips(qtype, shape):
    n, k = shape
    raw = random_raw(qtype, n, k, seed=n * k + int(qtype), special=True)
    q = BlockQuant.from_raw(qtype, torch.from_numpy(raw), shape)
    assert q.nbytes == n * row_bytes(qtype, k)  # the file's bytes, no padding
    assert torch.equal(q.raw(), torch.from_numpy(raw))
    want = gq.dequantize(raw, qtype).reshape(n, k) if n else np.zeros((0, k), np.float32)  # (gguf fails on 0 rows)
    got = q.dequantize().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 and every rounding alike
    if n > 3:
        r0, r1 = 3, n - 1  # a range that cuts tiles (and reaches the raw tail)
        assert np.array_equal(q.dequantize(r0, r1).numpy().view(np.uint32), want[r0:r1].view(np.uint32))


def test_q4_1_tiles_are_the_q4_kernels_tiles():
    """Q4_1's tile-block is MDK_Q4's (quant4.c): quant4.c's own dequantiser reads it as gguf does."""
    n, k = 48, 96
    raw = random_raw(GT.Q4_1, n, k, seed=1)
    q = BlockQuant.from_raw(GT.Q4_1, torch.from_numpy(raw), (n, k))
    out = torch.empty(n, k)
    native.lib().mdk_q4_dequantize(q.packed.data_ptr(), n, k, out.data_ptr())
    assert np.array_equal(out.numpy(), gq.dequantize(raw, GT.Q4_1))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_bad_shapes_are_refused(qtype):
    with pytest.raises(ValueError):
        BlockQuant.from_raw(qtype, torch.zeros(4 * 40, dtype=torch.uint8), (4, 40))  # K not a multiple of 32
    assert native.lib().mdk_wq_bytes(NATIVE[qtype], 3, 48) == 0  # the library says so too
    assert native.lib().mdk_wq_pack(NATIVE[qtype], None, 3, 48, None) == -1


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_matches_reference(path, threads, qtype, shape):  # noqa: F811
    n, k = shape
    raw = random_raw(qtype, n, k, seed=n + k + int(qtype))
    q = BlockQuant.from_raw(qtype, torch.from_numpy(raw), shape)
    w = torch.from_numpy(gq.dequantize(raw, qtype).reshape(n, k))
    g = torch.Generator().manual_seed(n * k)
    for batch in (1, 3, 4, 5, 64):
        x = torch.randn(batch, k, generator=g)
        want = q8_reference(x) @ w.t()  # the same arithmetic, summed in another order
        got = q.matmul(x)
        assert got.shape == (batch, n)
        assert rel(got, want) < 2e-4, (batch, rel(got, want))  # fp32 rounding; a layout error is O(1)
        # every row on its own: a wrong tail row or tile lane would hide in the norm of the others
        # (each against the sum of its terms' sizes: a single output may cancel to about 0)
        err = (got - want).abs() / (q8_reference(x).abs() @ w.abs().t()).clamp(min=1e-30)
        assert float(err.max()) < 1e-5, (batch, float(err.max()))


def test_results_do_not_depend_on_threads(monkeypatch):
    raw = random_raw(GT.Q5_0, 1000, 576, seed=0)
    q = BlockQuant.from_raw(GT.Q5_0, torch.from_numpy(raw), (1000, 576))
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(0))
    outs = []
    for n in (1, 2, 3):
        monkeypatch.setattr(native, "_threads", n)
        outs.append(q.matmul(x))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("batch", [1, 4, 7, 64])
def test_fused_expert_q5_0_gate_up_q8_0_down(path, threads, batch):  # noqa: F811
    """engine.experts.expert' one native call (route weight 1) against a torch SwiGLU of the dequantised
    weights, with the activations quantised as the kernel does, both times."""
    d, i = 576, 256
    raw13, raw2 = random_raw(GT.Q5_0, 2 * i, d, seed=13), random_raw(GT.Q8_0, d, i, seed=2)
    w13 = BlockQuant.from_raw(GT.Q5_0, torch.from_numpy(raw13), (2 * i, d))
    w2 = BlockQuant.from_raw(GT.Q8_0, torch.from_numpy(raw2), (d, i))
    ex = QuantExpert(Tier.CPU4, w13, w2, torch.device("cpu"))
    if ex.desc is None:  # until QuantExpert builds block-format descriptors itself
        ex.desc = native.ExpertDesc(w13.desc, w2.desc)
    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(batch)) * 3
    h = q8_reference(x) @ torch.from_numpy(gq.dequantize(raw13, GT.Q5_0)).t()
    a = F.silu(h[:, :i]) * h[:, i:]
    want = q8_reference(a) @ torch.from_numpy(gq.dequantize(raw2, GT.Q8_0)).t()
    got = run_native(ex, x)
    # the intermediate is quantised again: fp32 rounding differences flip a few int8 roundings
    assert rel(got, want) < 1e-3
