"""The CPU tiers below 4 bits (issue 46, item 2): cpu-3 (Q3_K) and cpu-2 (Q2_K).

The quantisers (engine/native/kquantize_low.c) against llama.cpp's searches written out here in float32
step by step (Q3_K: quantize_row_q3_K_ref; Q2_K: quantize_row_q2_K_impl with every importance 1),
byte for byte on every code path; their error; the tiers built from a 16-bit expert and from a GGUF
file (its own blocks where they are that small already, never a second rounding); what the planner
offers (the user's lowest precision, only tiers that hold fewer bytes); and the engine re-planning
when the setting changes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import quants

from engine import native
from engine.blockquant import BlockQuant, quantize_raw

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")
f32 = np.float32


@pytest.fixture(params=[0, 1], ids=["portable", "avx2"])
def path(request):
    lib = native.lib()
    if lib.mdk_select_path(request.param) != request.param:
        lib.mdk_select_path(2)
        pytest.skip("this CPU lacks that path")
    yield request.param
    lib.mdk_select_path(2)


# ---- llama.cpp's searches, one float32 operation at a time ----
def near(v) -> int:
    return int(f32(f32(v) + f32(12582912.0)) - f32(12582912.0))


def half(v) -> float:
    return f32(np.float16(v))


def make_q3(x):
    amax, mx = f32(0), f32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f32(1e-15):
        return f32(0), [0] * 16
    isc = f32(f32(-4) / mx)
    L, slx, sl2 = [], f32(0), f32(0)
    for v in x:
        l = min(max(near(isc * v), -4), 3)
        L.append(l)
        w = f32(v * v)
        slx = f32(slx + f32(f32(w * v) * f32(l)))
        sl2 = f32(sl2 + f32(f32(w * f32(l)) * f32(l)))
    for _ in range(5):
        changed = 0
        for i, v in enumerate(x):
            w = f32(v * v)
            s = f32(slx - f32(f32(w * v) * f32(L[i])))
            if s > 0:
                s2 = f32(sl2 - f32(f32(w * f32(L[i])) * f32(L[i])))
                nl = min(max(near(f32(f32(v * s2) / s)), -4), 3)
                if nl != L[i]:
                    s = f32(s + f32(f32(w * v) * f32(nl)))
                    s2 = f32(s2 + f32(f32(w * f32(nl)) * f32(nl)))
                    if s2 > 0 and f32(f32(s * s) * sl2) > f32(f32(slx * slx) * s2):
                        L[i], slx, sl2, changed = nl, s, s2, changed + 1
        if not changed:
            break
    return f32(slx / sl2), [l + 4 for l in L]


def q3k_block(x) -> bytes:
    scales = []
    amax, max_scale = f32(0), f32(0)
    for j in range(16):
        s, _ = make_q3(x[16 * j:16 * j + 16])
        scales.append(s)
        if abs(s) > amax:
            amax, max_scale = abs(s), s
    sc = [0] * 12
    d = f32(0)
    if max_scale != 0:
        isc = f32(f32(-32) / max_scale)
        for j in range(16):
            l = min(max(near(isc * scales[j]), -32), 31) + 32
            if j < 8:
                sc[j] = l & 0xF
            else:
                sc[j - 8] |= (l & 0xF) << 4
            sc[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))
        d = half(f32(1) / isc)
    L = []
    for j in range(16):
        s = (sc[j] & 0xF if j < 8 else sc[j - 8] >> 4) | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)
        dd = f32(d * f32(s - 32))
        L += [min(max(near(f32(v / dd)), -4), 3) + 4 if dd != 0 else 4 for v in x[16 * j:16 * j + 16]]
    hmask = [0] * 32
    for j in range(256):
        if L[j] > 3:
            hmask[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    return bytes(hmask) + pack2(L) + bytes(sc) + np.float16(d).tobytes()


def pack2(L) -> bytes:
    out = []
    for j in range(0, 256, 128):
        out += [L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6 for l in range(32)]
    return bytes(out)


def fit_min(x, w):  # make_qkx3_quants(16, 3, x, w, L, &min, Laux, -0.9, 0.05, 36, false)
    mn, mx, sw, sx = x[0], x[0], w[0], f32(w[0] * x[0])
    for i in range(1, 16):
        mn, mx = min(mn, x[i]), max(mx, x[i])
        sw, sx = f32(sw + w[i]), f32(sx + f32(w[i] * x[i]))
    mn = min(mn, f32(0))
    if mx <= mn:
        return f32(0), f32(-mn)
    isc = f32(f32(3) / f32(mx - mn))
    scale, best = f32(f32(1) / isc), f32(0)
    for i in range(16):
        l = min(max(near(f32(isc * f32(x[i] - mn))), 0), 3)
        d = f32(f32(f32(scale * f32(l)) + mn) - x[i])
        best = f32(best + f32(w[i] * f32(d * d)))
    for step in range(37):
        isc = f32(f32(f32(f32(-0.9) + f32(f32(0.05) * f32(step))) + f32(3)) / f32(mx - mn))
        sl = sl2 = sxl = f32(0)
        L = []
        for i in range(16):
            l = f32(min(max(near(f32(isc * f32(x[i] - mn))), 0), 3))
            L.append(l)
            wl = f32(w[i] * l)
            sl, sl2, sxl = f32(sl + wl), f32(sl2 + f32(wl * l)), f32(sxl + f32(wl * x[i]))
        D = f32(f32(sw * sl2) - f32(sl * sl))
        if D > 0:
            s = f32(f32(f32(sw * sxl) - f32(sx * sl)) / D)
            m = f32(f32(f32(sl2 * sx) - f32(sl * sxl)) / D)
            if m > 0:
                m, s = f32(0), f32(sxl / sl2)
            e = f32(0)
            for i in range(16):
                d = f32(f32(f32(s * L[i]) + m) - x[i])
                e = f32(e + f32(w[i] * f32(d * d)))
            if e < best:
                best, scale, mn = e, s, m
    return scale, f32(-mn)


def fit_step(v, qw):  # make_qp_quants(16, 15, v, L, qw)
    mx = max(v)
    if mx < f32(1e-15):
        return f32(0), [0] * 16
    isc = f32(f32(15) / mx)
    scale, best = f32(f32(1) / isc), f32(0)
    for i in range(16):
        d = f32(v[i] - f32(scale * f32(near(f32(isc * v[i])))))
        best = f32(best + f32(f32(qw[i] * d) * d))
    for k in [-4, -3, -2, -1, 1, 2, 3, 4]:
        i2 = f32(f32(f32(f32(0.1) * f32(k)) + f32(15)) / mx)
        s2, mse = f32(f32(1) / i2), f32(0)
        for i in range(16):
            d = f32(v[i] - f32(s2 * f32(min(near(f32(i2 * v[i])), 15))))
            mse = f32(mse + f32(f32(qw[i] * d) * d))
        if mse < best:
            best, isc = mse, i2
    L = [min(near(f32(isc * v[i])), 15) for i in range(16)]
    slx = sl2 = f32(0)
    for i in range(16):
        slx, sl2 = f32(slx + f32(f32(qw[i] * v[i]) * f32(L[i]))), f32(sl2 + f32(f32(qw[i] * f32(L[i])) * f32(L[i])))
    for _ in range(5):
        changed = 0
        for i in range(16):
            a = f32(slx - f32(f32(qw[i] * v[i]) * f32(L[i])))
            b = f32(sl2 - f32(f32(qw[i] * f32(L[i])) * f32(L[i])))
            if a > 0 and b > 0:
                nl = min(near(f32(f32(v[i] * b) / a)), 15)
                if nl != L[i]:
                    a = f32(a + f32(f32(qw[i] * v[i]) * f32(nl)))
                    b = f32(b + f32(f32(qw[i] * f32(nl)) * f32(nl)))
                    if f32(f32(a * a) * sl2) > f32(f32(slx * slx) * b):
                        L[i], slx, sl2, changed = nl, a, b, changed + 1
        if not changed:
            break
    return (f32(slx / sl2) if sl2 > 0 else f32(0)), L


def q2k_block(x) -> bytes:
    s2 = f32(0)
    for v in x:
        s2 = f32(s2 + f32(v * v))
    sigma2 = f32(s2 / f32(256))
    scales, mins, sws = [], [], []
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        w = [f32(np.sqrt(f32(sigma2 + f32(v * v)))) for v in xs]
        sw = f32(0)
        for v in w:
            sw = f32(sw + v)
        s, m = fit_min(xs, w)
        scales.append(s)
        mins.append(m)
        sws.append(sw)
    dm, Ls = fit_step(scales, sws)
    mm, Lm = fit_step(mins, sws)
    dm, mm = half(dm), half(mm)
    L = []
    for j in range(16):
        d, m = f32(dm * f32(Ls[j])), f32(mm * f32(Lm[j]))
        L += [min(max(near(f32(f32(v + m) / d)), 0), 3) if d != 0 else 0 for v in x[16 * j:16 * j + 16]]
    return bytes(Ls[j] | Lm[j] << 4 for j in range(16)) + pack2(L) + np.float16(dm).tobytes() + np.float16(mm).tobytes()


@pytest.mark.parametrize("qt,ref", [(GT.Q3_K, q3k_block), (GT.Q2_K, q2k_block)], ids=["Q3_K", "Q2_K"])
def test_the_quantisers_write_llama_cpps_bytes_on_every_path(qt, ref, path):
    g = torch.Generator().manual_seed(7)
    w = torch.cat([torch.randn(1, 512, generator=g), torch.randn(1, 512, generator=g) * 1e-3 + 0.01])
    got = quantize_raw(w, qt, threads=1).numpy()
    for r in range(w.shape[0]):
        x = [f32(v) for v in w[r].numpy()]
        want = b"".join(ref(x[b * 256:(b + 1) * 256]) for b in range(2))
        assert got[r].tobytes() == want, f"row {r}"


@pytest.mark.parametrize("qt,bound", [(GT.Q3_K, 0.16), (GT.Q2_K, 0.28)], ids=["Q3_K", "Q2_K"])
def test_their_error_and_that_the_kernels_run_them(qt, bound):
    """Relative RMSE on Gaussian weights (measured 0.151 and 0.268; Q4_K 0.071), and the product of
    the tier's BlockQuant equals the dequantised weight's up to the int8 activations' rounding."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 1024, generator=g)
    q = BlockQuant.quantize(w, qt, threads=2)
    back = torch.from_numpy(quants.dequantize(q.raw().numpy(), qt)).reshape(w.shape)
    assert torch.equal(q.dequantize(), back)
    err = float(((back - w).pow(2).mean() / w.pow(2).mean()).sqrt())
    assert err < bound, err
    x = torch.randn(3, 1024, generator=g)
    y = q.matmul(x)
    ref = x @ back.T
    assert float((y - ref).norm() / ref.norm()) < 0.02


def test_bad_weights_are_refused_not_written():
    w = torch.randn(2, 256)
    w[1, 5] = float("nan")
    with pytest.raises(ValueError, match="Q2_K"):
        quantize_raw(w, GT.Q2_K, threads=1)
    with pytest.raises(ValueError, match="Q3_K"):
        quantize_raw(torch.full((1, 256), 1e7), GT.Q3_K, threads=1)  # d would overflow fp16
