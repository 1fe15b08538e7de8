"""The quantisers to GGUF's blocks (engine/native/kquantize.c), read back by gguf's reference
dequantiser (numpy: no tiles, no kernels of ours on the way back).

The bounds below are relative RMSEs |Wq - W| / |W| measured on Gaussian weights (seed 0, 256 x 4096),
rounded up by about 5%: Q4_K 0.0713, Q5_K 0.0357, Q6_K 0.0177, Q8_0 0.0054, Q4_0 0.0859, Q4_1 0.0783,
Q5_0 0.0427, Q5_1 0.0378 (the 5-bit cpu-4 grid, Q4Native: 0.0783).
"""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from engine import native  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

from engine.files.gguf.blockquant import NATIVE, quantize_raw  # noqa: E402

BOUND = {GT.Q4_K: 0.075, GT.Q5_K: 0.0375, GT.Q6_K: 0.0186, GT.Q8_0: 0.0057,
         GT.Q4_0: 0.090, GT.Q4_1: 0.082, GT.Q5_0: 0.045, GT.Q5_1: 0.040}
FORMATS = list(BOUND)
BLOCK32 = [GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1]  # the ones gguf.quants.quantize implements


def gaussian(n=256, k=4096, seed=0, scale=1.0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * scale


def back(raw: torch.Tensor | np.ndarray, qt: GT, shape) -> np.ndarray:
    raw = raw.numpy() if isinstance(raw, torch.Tensor) else raw
    return gguf.quants.dequantize(raw, qt).reshape(shape)


def rel(a: np.ndarray, w) -> float:
    w = np.asarray(w, dtype=np.float32)
    return float(np.linalg.norm(a - w) / np.linalg.norm(w))


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_reproduces_gaussian_within_bound(qt):
    w = gaussian()
    raw = quantize_raw(w, qt)
    assert raw.shape == (256, 4096 // GGML_QUANT_SIZES[qt][0] * GGML_QUANT_SIZES[qt][1])
    got = rel(back(raw, qt, w.shape), w)
    assert got < BOUND[qt], f"{qt.name}: relative RMSE {got:.4f}"
    assert got > 0.5 * BOUND[qt]  # a bound far above the error would test nothing


@pytest.mark.parametrize("qt", BLOCK32, ids=lambda q: q.name)
def test_32_blocks_are_gguf_reference_bytes(qt):
    # gguf's numpy quantisers follow ggml's reference rounding (roundf for Q8_0, truncation of
    # x / d + 8.5 for Q4_0, ...): equal bytes, hence equal error
    for w in (gaussian(64, 1024), torch.distributions.StudentT(3.0).sample((64, 1024)), gaussian(8, 256, scale=1e-3)):
        ours = quantize_raw(w, qt).numpy()
        ref = gguf.quants.quantize(w.numpy(), qt)
        assert np.array_equal(ours, ref), qt.name
        assert rel(back(ours, qt, w.shape), w) <= rel(back(ref, qt, w.shape), w)


def _ggml_base():
    """llama.cpp's libggml-base (from llama-cpp-python, when installed), which exports the reference
    quantize_row_*_ref; None when absent."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
            p = Path(d) / "lib" / name
            if p.exists():
                return ctypes.CDLL(str(p))
    return None


def ggml_ref(lib, w: torch.Tensor, qt: GT) -> np.ndarray:
    f = getattr(lib, "quantize_row_" + qt.name.lower().replace("_k", "_K") + "_ref")
    n, k = w.shape
    block, size = GGML_QUANT_SIZES[qt]
    out = np.zeros((n, k // block * size), np.uint8)
    x = np.ascontiguousarray(w.numpy(), np.float32)
    f(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(n * k))
    return out


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_against_llama_cpp_reference(qt):
    lib = _ggml_base()
    if lib is None:
        pytest.skip("llama.cpp's libggml-base is not installed")
    g = torch.Generator().manual_seed(3)
    for w in (torch.randn(64, 2048, generator=g), torch.randn(64, 2048, generator=g) ** 3,
              torch.randn(64, 2048, generator=g) + 2 * torch.randn(64, 1, generator=g)):
        ours, ref = quantize_raw(w, qt).numpy(), ggml_ref(lib, w, qt)
        if qt in (GT.Q4_K, GT.Q5_K):
            # our d and dmin come from a small search of our own (kquantize.c), so the bytes differ;
            # measured on Gaussian weights: Q4_K 0.0713 vs llama.cpp's 0.0714, Q5_K 0.0357 vs 0.0361
            a, b = rel(back(ours, qt, w.shape), w), rel(back(ref, qt, w.shape), w)
            assert a <= b, f"{qt.name}: {a:.5f} vs llama.cpp's {b:.5f}"
        else:
            assert np.array_equal(ours, ref), qt.name


def test_q4k_beats_q4_0_and_the_5_bit_grid():
    from engine.experts.quant import Q4Native

    g = torch.Generator().manual_seed(5)
    for w in (torch.randn(256, 4096, generator=g), torch.randn(256, 4096, generator=g) / (
            sum(torch.randn(256, 4096, generator=g) ** 2 for _ in range(3)) / 3).sqrt(),
              torch.randn(256, 4096, generator=g) + 0.5 * torch.randn(256, 1, generator=g),
              # rows of mostly positive weights: those super-blocks are stored negated (negative d
              # and dmin); measured relative RMSE 0.072 against the 5-bit grid's 0.078 (0.088 unflipped)
              torch.randn(256, 4096, generator=g) + 3.0, torch.randn(256, 4096, generator=g) - 3.0):
        q4k = rel(back(quantize_raw(w, GT.Q4_K), GT.Q4_K, w.shape), w)
        q40 = rel(back(quantize_raw(w, GT.Q4_0), GT.Q4_0, w.shape), w)
        grid = rel(Q4Native.quantize(w).dequantize().numpy(), w)
        assert q4k < q40 and q4k <= grid, (q4k, q40, grid)
    w = torch.randn(256, 4096, generator=g)
    q5k = rel(back(quantize_raw(w, GT.Q5_K), GT.Q5_K, w.shape), w)
    assert q5k < rel(back(quantize_raw(w, GT.Q5_1), GT.Q5_1, w.shape), w)  # Gaussian: 0.0363 vs 0.0378


def test_positive_super_blocks_are_stored_negated():
    w = torch.randn(16, 1024, generator=torch.Generator().manual_seed(9)) + 3.0
    raw = quantize_raw(w, GT.Q4_K).numpy().reshape(-1, 144)
    d = raw[:, :4].copy().view(np.float16)  # d, dmin per super-block
    assert (d < 0).all()  # mostly positive weights: every super-block flipped
    assert (quantize_raw(-w, GT.Q4_K).numpy().reshape(-1, 144)[:, :4].copy().view(np.float16) >= 0).all()
    assert rel(back(raw, GT.Q4_K, w.shape), w) < 0.03  # the relative error of weights of mean 3, std 1


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_constant_and_zero_rows(qt):
    w = torch.zeros(4, 512)
    w[1], w[2], w[3] = 0.37, -2.5, 1e-2
    got = back(quantize_raw(w, qt), qt, w.shape)
    assert np.all(got[0] == 0.0)  # zero stays exactly zero
    # a constant comes back to within fp16's rounding of its scale (2^-11), or, where that scale is
    # an fp16 subnormal (Q4_K's d for 0.01 is 1.06e-5), its spacing: measured 0.26% off for Q4_K
    for r, tol in ((1, 1e-3), (2, 1e-3), (3, 5e-3)):
        assert np.abs(got[r] - float(w[r, 0])).max() <= tol * abs(float(w[r, 0])), (qt.name, r, got[r][:4])


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_tiny_and_huge_magnitudes(qt):
    # error relative to the weights' size barely depends on it while the block scales stay inside
    # fp16's range; weights of 1e-3 put the K-quants' d among fp16's subnormals (measured Q6_K 0.0180
    # against 0.0177 at 1; at 1e-4 Q6_K 0.049, Q4_K 0.072: the format's limit)
    for s in (1e-3, 1e-2, 1e3, 1e4):
        w = gaussian(32, 2048, seed=7, scale=s)
        assert rel(back(quantize_raw(w, qt), qt, w.shape), w) < 1.2 * BOUND[qt], (qt.name, s)
    with pytest.raises(ValueError):  # a scale past fp16's 65504: no GGUF block holds these weights
        quantize_raw(gaussian(4, 256, scale=1e9), qt)


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_single_outlier(qt):
    w = gaussian(8, 4096, seed=2)
    w[3, 1000] = 100.0
    got = back(quantize_raw(w, qt), qt, w.shape)
    assert np.isfinite(got).all()
    assert abs(got[3, 1000] - 100.0) < 0.5  # measured: at most 0.17 off (Q4_K)
    rest = np.ones(w.shape, bool)
    rest[3, 1000] = False
    # the outlier's block pays (its scale is set by 100: measured, all but the outlier, Q4_K 0.085,
    # Q8_0 0.0093, at most 1.63 x BOUND), the other rows do not
    assert np.linalg.norm((got - w.numpy())[rest]) / np.linalg.norm(w.numpy()[rest]) < 2 * BOUND[qt]
    others = [r for r in range(8) if r != 3]
    assert rel(got[others], w[others]) < BOUND[qt]


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_independent_of_threads_and_path(qt):
    w = gaussian(37, 1024, seed=4)  # a row count that splits unevenly over tasks
    one = quantize_raw(w, qt, threads=1)
    assert torch.equal(one, quantize_raw(w, qt, threads=2))
    assert torch.equal(one, quantize_raw(w, qt, threads=3))
    L = native.lib()
    path = L.mdk_select_path(-1)
    try:
        L.mdk_select_path(0)  # the portable build of the search
        assert torch.equal(one, quantize_raw(w, qt, threads=2))
    finally:
        L.mdk_select_path(path)


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_source_formats_give_the_same_blocks(qt):
    w = gaussian(16, 512, seed=6).bfloat16().float()
    assert torch.equal(w.half().float(), w)  # the same values in all three formats
    a = quantize_raw(w, qt)
    assert torch.equal(a, quantize_raw(w.bfloat16(), qt))
    assert torch.equal(a, quantize_raw(w.half(), qt))


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_bad_shapes_and_values(qt):
    L, fmt = native.lib(), NATIVE[qt]
    block = GGML_QUANT_SIZES[qt][0]
    w = torch.zeros(2, block + 16)
    out = torch.zeros(2, 4096, dtype=torch.uint8)
    assert L.mdk_quantize_blocks(fmt, w.data_ptr(), native.F32, 2, block + 16, out.data_ptr(), 1) == -1
    assert L.mdk_quantize_blocks(fmt, w.data_ptr(), native.Q4, 2, block, out.data_ptr(), 1) == -1
    assert L.mdk_quantize_blocks(native.Q4, w.data_ptr(), native.F32, 2, 256, out.data_ptr(), 1) == -1
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = gaussian(4, 512, seed=8)
        w[2, 300] = bad
        with pytest.raises(ValueError):
            quantize_raw(w, qt)
        with pytest.raises(ValueError):
            quantize_raw(w.bfloat16(), qt, threads=2)
