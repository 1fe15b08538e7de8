"""The prompt kernel (engine/native/gemm.c): many tokens times a GGUF matrix's own rows, a 16-row panel
unpacked once and every token streamed past it (AVX-512 VNNI). Its products equal the row kernels'
(kraw_x86.c) up to the order of fp32 additions for all 8 block formats, odd row counts, token counts
around its 8-token step, as a plain product, as stacked parts (gate's and up's rows, the dense
projections' q/k/v) and inside the native MoE call (gate+up, then down accumulated with the routing
weights and a bias); the threshold turns it off (0) and on (1); and a CPU without VNNI keeps the row
kernels (the portable path gives the same numbers)."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES

from engine import native
from engine.files.gguf.blockquant import BlockQuant
from engine.experts.expert import QuantExpert, run_jobs
from engine.placement import Tier

from kernels_raw_helpers import FORMATS, rows_of

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

SHAPES = [(768, 2048), (33, 512), (17, 256), (40, 576)]


@pytest.fixture
def avx512():
    lib = native.lib()
    active = lib.mdk_select_path(-1)
    if lib.mdk_select_path(2) != 2:
        lib.mdk_select_path(active)
        pytest.skip("this CPU lacks AVX-512 VNNI: the prompt kernel is not used here")
    yield
    lib.mdk_select_path(active)
    native.gemm_threshold(6)


def both(fn):
    """fn() with the row kernels (threshold 0), then with the prompt kernel for any token count."""
    native.gemm_threshold(0)
    rows = fn()
    native.gemm_threshold(1)
    return rows, fn()


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-6) -> bool:
    return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= tol * float(want.abs().max())


def matrix(qt: GT, n: int, k: int, seed: int, parts: int = 1) -> BlockQuant:
    raw = torch.from_numpy(rows_of(qt, n, k, seed))
    cut = [raw.reshape(-1)] if parts == 1 else [raw[: n // 2].clone().reshape(-1), raw[n // 2:].clone().reshape(-1)]
    return BlockQuant.from_file(qt, cut, (n, k))


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_every_format_gives_the_row_kernels_products(avx512, qt):
    for n, k in [s for s in SHAPES if s[1] % GGML_QUANT_SIZES[qt][0] == 0 and s[1] % 64 == 0]:
        w = matrix(qt, n, k, seed=n + k)
        for T in (1, 6, 8, 9, 16, 37):
            x = torch.randn(T, k, generator=torch.Generator().manual_seed(T + n))
            rows, gemm = both(lambda: w.matmul(x))
            assert close(gemm, rows), (qt.name, n, k, T)


def test_a_two_part_matrix_and_bf16_activations(avx512):
    w = matrix(GT.Q4_K, 64, 512, seed=3, parts=2)
    assert w.desc.w_hi
    x = torch.randn(24, 512, generator=torch.Generator().manual_seed(0))
    rows, gemm = both(lambda: w.matmul(x))
    assert close(gemm, rows)
    xb = x.bfloat16()
    rows, gemm = both(lambda: w.matmul(xb).float())
    assert close(gemm, rows, 1e-2)  # the output is rounded to bf16 on both sides


def test_stacked_parts_as_the_dense_projections_run(avx512):
    """q, k and v of one layer in one native call (mdk_matmul_parts): each part's columns of the output."""
    ms = [matrix(GT.Q4_K, 64, 512, 1), matrix(GT.Q6_K, 32, 512, 2), matrix(GT.Q8_0, 48, 512, 3)]
    x = torch.randn(20, 512, generator=torch.Generator().manual_seed(1))
    rows, gemm = both(lambda: native.dense_linear_parts([m.desc for m in ms], x))
    assert gemm.shape == (20, 144) and close(gemm, rows)
    assert close(gemm[:, 64:96], ms[1].matmul(x), 1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_moe_call_routes_many_tokens_through_it(avx512, monkeypatch, threads):
    """A prompt's experts: several experts, each with a different number of slots (some under the
    threshold, some over), routing weights, and the down matrix's accumulation into the same tokens."""
    monkeypatch.setattr(native, "_threads", threads)
    d, i = 512, 256
    cpu = torch.device("cpu")
    exs = []
    for s, (f13, f2) in enumerate([(GT.Q4_K, GT.Q6_K), (GT.Q5_K, GT.Q8_0), (GT.Q4_0, GT.Q5_1)]):
        w13 = matrix(f13, 2 * i, d, seed=10 + s, parts=2)
        w2 = matrix(f2, d, i, seed=20 + s)
        exs.append(QuantExpert(Tier.CPU4, w13, w2, cpu))
    T = 40
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, d, generator=g) * 0.5
    counts = [3, 30, 27]  # 3 under any threshold, 30 and 27 over
    token = torch.cat([torch.randperm(T, generator=g)[:c] for c in counts])
    weight = torch.rand(len(token), generator=g)
    jobs, a = [], 0
    for ex, c in zip(exs, counts):
        jobs.append((ex, a, c))
        a += c
    native.gemm_threshold(6)
    mixed = run_jobs(jobs, x, token, weight)
    rows, gemm = both(lambda: run_jobs(jobs, x, token, weight))
    # the intermediate is quantised again between the two products: an fp32 rounding difference can
    # move one int8 level, so the MoE output agrees to 1e-4 rather than 1e-6
    assert close(gemm, rows, 1e-4) and close(mixed, rows, 1e-4)


def test_without_vnni_the_row_kernels_run(avx512):
    """The portable path never reaches gemm.c (it says no): the same product, threshold or not."""
    w = matrix(GT.Q4_K, 32, 512, seed=9)
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(4))
    native.lib().mdk_select_path(0)
    rows, gemm = both(lambda: w.matmul(x))
    assert torch.equal(rows, gemm)


def test_the_threshold_reads_its_setting():
    was = native.gemm_threshold()
    try:
        assert native.gemm_threshold(11) == 11 and native.gemm_threshold() == 11
    finally:
        native.gemm_threshold(was)
    assert np.isfinite(was) and was >= 0
