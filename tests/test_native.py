"""The native CPU kernels against torch references, on every code path this CPU has (portable C,
AVX2, AVX-512), with 1 and 2 threads, odd row counts, K multiples of 32 and batches 1..64; and the
engine with the library switched off (the torch fallback)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.experts.expert import Expert16, QuantExpert
from engine.placement import Tier
from engine.experts.quant import Q4Native

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

SHAPES = [(1, 32), (17, 64), (33, 96), (130, 576), (257, 4096), (16, 160)]
from native_helpers import PATHS, path, q8_reference, rel, threads  # noqa: E402,F401 (shared: tests/native_helpers.py)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_q4_matmul_matches_reference(path, threads, shape, batch):
    n, k = shape
    g = torch.Generator().manual_seed(n * k + batch)
    w = torch.randn(n, k, generator=g)
    q = Q4Native.quantize(w)
    x = torch.randn(batch, k, generator=g)
    want = q8_reference(x) @ q.dequantize().t()  # the same arithmetic, summed in another order
    assert rel(q.matmul(x), want) < 2e-4  # fp32 rounding (a layout error would be O(1))
    assert rel(q.dequantize(), w) < 0.12  # the 4-bit grid itself (see test_quant's bound)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_mx4_matmul_matches_reference(path, threads, shape, batch):
    """MXFP4 blocks (gpt-oss's release format) in the Q4 tiles: dequantised exactly, and the integer
    kernel's product equals the reference's on every path (the table lookup of each nibble)."""
    from engine.files.fused_experts import mxfp4_to_float
    from engine.experts.quant import MX4Native

    n, k = shape
    g = torch.Generator().manual_seed(n * k + batch)
    blocks = torch.randint(0, 256, (n, k // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(128 - 24, 128 + 13, (n, k // 32), generator=g, dtype=torch.uint8)
    q = MX4Native.pack(blocks, scales)
    w = mxfp4_to_float(blocks, scales, torch.float32)
    assert torch.equal(q.dequantize(), w)
    x = torch.randn(batch, k, generator=g)
    assert rel(q.matmul(x), q8_reference(x) @ w.t()) < 2e-4
    scales[n // 2, 0] = 255  # E8M0's NaN (and exponents past fp16's range) have no tile form
    assert MX4Native.pack(blocks, scales) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES + [(5, 2048), (7, 14336)])
@pytest.mark.parametrize("batch", [1, 2, 64])
def test_dense_matmul_matches_reference(path, threads, dtype, shape, batch):
    n, k = shape
    g = torch.Generator().manual_seed(n + k + batch)
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(batch, k, generator=g).to(dtype)
    got = native.matmul(native.matrix(w), x)
    assert got.dtype == torch.float32
    assert rel(got, x.float() @ w.float().t()) < 1e-5  # fp32 accumulation in both


def swiglu(x, w13, w2):
    h = x.float() @ w13.float().t()
    g, u = h.split(w2.shape[1], dim=-1)
    return (F.silu(g) * u) @ w2.float().t()


@pytest.mark.parametrize("batch", [1, 5, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_expert_16bit(path, threads, batch, dtype):
    g = torch.Generator().manual_seed(batch)
    d, i = 96, 160
    w13, w2 = torch.randn(2 * i, d, generator=g) * 0.1, torch.randn(d, i, generator=g) * 0.1
    ex = Expert16(Tier.CPU16, w13.to(dtype), w2.to(dtype))
    assert ex.desc is not None
    x = torch.randn(batch, d, generator=g).to(dtype)
    want = swiglu(x, ex.w13, ex.w2)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # 16-bit: only the output's rounding differs
    assert rel(ex(x), want) < tol


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_fused_expert_4bit(path, threads, batch):
    g = torch.Generator().manual_seed(batch)
    d, i = 576, 1536
    w13, w2 = torch.randn(2 * i, d, generator=g) * d ** -0.5, torch.randn(d, i, generator=g) * i ** -0.5
    ex = QuantExpert(Tier.CPU4, Q4Native.quantize(w13), Q4Native.quantize(w2), torch.device("cpu"))
    x = torch.randn(batch, d, generator=g)
    h = q8_reference(x) @ ex.w13.dequantize().t()
    a = F.silu(h[:, :i]) * h[:, i:]
    want = q8_reference(a) @ ex.w2.dequantize().t()
    # the intermediate is quantised again: fp32 rounding differences flip a few int8 roundings
    assert rel(ex(x), want) < 1e-3


def test_results_do_not_depend_on_threads(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 576, generator=g)
    q = Q4Native.quantize(w)
    x = torch.randn(4, 576, generator=g)
    outs = []
    for n in (1, 2, 3):
        monkeypatch.setattr(native, "_threads", n)
        outs.append(q.matmul(x))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_status_names_the_kernel():
    s = native.status()
    assert s.startswith("native ") and any(p in s for p in native.PATHS)


FALLBACK = r"""
import torch, sys
from engine import native
from engine.files.checkpoint import Checkpoint
from engine.runtime.generate import Generator, SamplingParams
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.experts.quant import cpu4_format, Int4CPU
assert not native.available(), native.status()
print(native.status())
assert cpu4_format() is Int4CPU
ck = Checkpoint(sys.argv[1]); d = ck.dims
m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), torch.device("cpu"), torch.float32)
assert m.native_step is None and all(getattr(ex, "desc", None) is None for b in m.moe for ex in b.experts)
gen = Generator(m, ck.load_tokenizer(), eos_ids=set(), ctx=128)
fin = list(gen.stream([5, 6, 7, 8], SamplingParams(max_new_tokens=12)))[-1]
print(" ".join(map(str, fin.token_ids)))
"""


def test_engine_runs_with_the_native_library_disabled(tiny, reference):
    """MIXDESK_NATIVE=0: the torch kernels, said once, with the same greedy tokens as transformers."""
    env = {**os.environ, "MIXDESK_NATIVE": "0"}
    r = subprocess.run([sys.executable, "-c", FALLBACK, str(tiny)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    status, tokens = r.stdout.strip().splitlines()[-2:]
    assert "torch (native kernels unavailable: disabled by MIXDESK_NATIVE=0)" in status
    assert r.stderr.count("native CPU kernels unavailable") == 1
    with torch.no_grad():
        out = reference(tiny).generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=12, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)
    assert [int(t) for t in tokens.split()] == out[0, 4:].tolist()


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("win"), sliding_window=8, tokenizer=False)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from engine.sources.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("q3"), "qwen3_moe", tokenizer=False)


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):  # renormalised routes, so the native router serves it: q/k norms over all heads, clip
    from engine.sources.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("olmoe"), "olmoe", norm_topk_prob=True, clip_qkv=0.5,
                            tokenizer=False)


@pytest.fixture(scope="module")
def hd64(tmp_path_factory):  # head dims 64 and 128 take the AVX-512 attention kernels of their own
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("hd64"), head_dim=64, tokenizer=False)


@pytest.fixture(scope="module")
def hd128(tmp_path_factory):
    from engine.sources.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("hd128"), "qwen3_moe", head_dim=128, tokenizer=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tier", [Tier.CPU16, Tier.CPU4])
@pytest.mark.parametrize("which", ["tiny", "windowed", "qwen3", "olmoe", "hd64", "hd128"])
def test_native_decode_step_equals_the_layer_loop(request, which, dtype, tier):
    """The one-call decode step gives the logits of the torch layer loop (same kernels for the
    experts): equal in 16-bit, where both round at the same points, within fp32 rounding in fp32.
    Qwen3-MoE's per-head q/k norms and OLMoE's whole-q/k norms and clip run inside it too."""
    native_step_equals_layer_loop(request, which, dtype, tier)


@pytest.mark.parametrize("which", ["windowed", "qwen3", "hd64"])
def test_native_decode_step_on_every_kernel_path(request, path, which):
    """The same on the portable C and AVX2 paths (the attention has a C and an AVX-512 version)."""
    native_step_equals_layer_loop(request, which, torch.float32, Tier.CPU16)


def native_step_equals_layer_loop(request, which, dtype, tier):
    from engine.files.checkpoint import Checkpoint
    from engine.model.forward import MoEModel
    from engine.native import choice
    from engine.placement import Placement

    ck = Checkpoint(request.getfixturevalue(which))
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, tier), torch.device("cpu"), dtype)
    assert choice.step_ready(m)
    ids = torch.randint(0, d.vocab, (30,), generator=torch.Generator().manual_seed(0))
    outs = []
    step = m.native_step
    for use in (True, False):
        m.native_step = step if use else None
        cache = m.new_cache(64)
        m.forward(ids[:10], cache, 0)
        outs.append(torch.cat([m.forward(ids[i:i + 1], cache, i) for i in range(10, 30)]))
    m.native_step = step
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    if d.qk_norm and tier == Tier.CPU4 and dtype == torch.float32:
        # the norms' and the attention's fp32 sums run in another order than torch's (~1e-7; cpu-16
        # above holds 1e-5); at 4 bits that can move an activation across an int8 level of the expert
        # kernel (1/127 of its block's range). Head dim 128 measured 2.2e-3.
        tol = 4e-3
    assert (outs[0] - outs[1]).abs().max().item() <= tol * outs[1].abs().max().item()
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))


def test_bad_routing_arguments_are_refused_not_crashed():
    """top-k larger than the expert count reaches the native router as an error code, never as an
    out-of-bounds read; the block then raises in Python (the engine thread reports it)."""
    import ctypes

    from engine.layers.router import SoftmaxTopK
    from engine.model.moe import MoEBlock

    g = torch.Generator().manual_seed(0)
    experts = [Expert16(Tier.CPU16, torch.randn(64, 32, generator=g), torch.randn(32, 32, generator=g))
               for _ in range(2)]
    gate = torch.randn(2, 32, generator=g)
    block = MoEBlock(SoftmaxTopK(gate, 3), experts, torch.device("cpu"))
    x = torch.randn(1, 32, generator=g)
    idx, wts, out = torch.empty(1, 3, dtype=torch.int32), torch.empty(1, 3), torch.empty(1, 32)
    rc = native.lib().mdk_moe(block.table, 2, ctypes.byref(block.router_matrix), 3, native.F32, x.data_ptr(),
                              native.F32, 1, out.data_ptr(), native.F32, idx.data_ptr(), wts.data_ptr(), 1)
    assert rc == -3
    with pytest.raises(RuntimeError):
        block(x)
