/* Quantisers to GGUF's 3- and 2-bit K-quant blocks (Q3_K, Q2_K) from fp32 rows: the tiers cpu-3
 * and cpu-2 (engine/placement), built one expert at a time off the decode thread. kquantize.c's
 * mdk_quantize_blocks calls mdk_block_low for a super-block of 256 weights.
 *
 * Q3_K is llama.cpp's quantize_row_q3_K_ref (no importance matrix), the same float operations in the
 * same order: per 16-weight sub-block make_q3_quants (the largest magnitude to -4, then 5 rounds of
 * moving single weights' levels while the least-squares gain grows, weights x^2), the 16 signed
 * scales to 6 bits under one fp16 d, every q again against the stored scales.
 * Q2_K is llama.cpp's quantize_row_q2_K_impl (its search when an importance matrix is given) with
 * every importance 1: weights sqrt(sigma^2 + x^2), make_qkx3_quants (36 steps from nmax - 0.9, by
 * squared error) per 16-weight sub-block, 8 at once (lanes.h), and the scales and minimums to 4 bits
 * by make_qp_quants weighted by each sub-block's weight sum. Measured against the reference search
 * (make_qkx2_quants by absolute error, scales max / 15), relative RMSE on 256 x 4096 weights:
 * Gaussian 0.297 -> 0.268, Student-t(4) 0.344 -> 0.302, rows offset by N(0, 1) 0.203 -> 0.187
 * (Q3_K's reference search: 0.151, 0.184, 0.129; Q4_K 0.071, 0.087, 0.049), 2026-12-05.
 * As in kquantize.c, a sub-block whose stored scale is 0 keeps q = 0 (its values are -dm anyway), and
 * where Q3_K's fp16 step is subnormal its scales are rounded against the stored step. Built twice,
 * portable and AVX2 (chosen at run time), with the same bytes.
 * Returns 0, or -1 when an fp16 step overflows (|d| > 65504). */
#include "mdk.h"

#include <math.h>
#include <string.h>

#include "lanes.h"

#define QK 256

static MDK_INLINE float rnd(float v) { return (v + 12582912.f) - 12582912.f; }  /* llama.cpp's nearest_int */
static MDK_INLINE int near(float v) { return (int)rnd(v); }
static MDK_INLINE int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
static int half_ok(uint16_t h) { return (h & 0x7c00) != 0x7c00; }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* the 2-bit fields of a K-quant block: q[32 i + l] holds L[128 h + 32 i' ...] as ggml packs them */
static MDK_INLINE void pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* ---------------- Q3_K ---------------- */

static MDK_INLINE float make_q3(const float *x, int8_t *L) {  /* n 16, nmax 4, rmse */
    const int nmax = 4;
    float max = 0.f, amax = 0.f;
    for (int i = 0; i < 16; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < 1e-15f) { memset(L, 0, 16); return 0.f; }
    float iscale = -nmax / max, sumlx = 0.f, suml2 = 0.f;
    for (int i = 0; i < 16; i++) {
        int l = clampi(near(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < 16; i++) {
            float w = x[i] * x[i], slx = sumlx - w * x[i] * L[i];
            if (slx > 0.f) {
                float sl2 = suml2 - w * L[i] * L[i];
                int nl = clampi(near(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (nl != L[i]) {
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0.f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl; sumlx = slx; suml2 = sl2; changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < 16; i++) L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

static MDK_INLINE int block_q3k(const float *x, uint8_t *y) {
    uint8_t *hmask = y, *qs = y + 32, *sc = y + 96;
    int8_t Ls[QK];
    uint8_t L[QK];
    float scales[16], max_scale = 0.f, amax = 0.f;
    for (int j = 0; j < 16; j++) {
        scales[j] = make_q3(x + 16 * j, Ls + 16 * j);
        if (fabsf(scales[j]) > amax) { amax = fabsf(scales[j]); max_scale = scales[j]; }
    }
    memset(y, 0, 110);
    uint16_t d16 = 0;
    if (max_scale != 0.f) {
        float iscale = -32.f / max_scale;
        d16 = mdk_f2h(1.f / iscale);
        if (!half_ok(d16)) return -1;
        if ((d16 & 0x7c00) == 0) iscale = mdk_h2f(d16) != 0.f ? 1.f / mdk_h2f(d16) : 0.f;  /* subnormal step */
        for (int j = 0; j < 16; j++) {
            int l = clampi(near(iscale * scales[j]), -32, 31) + 32;
            if (j < 8) sc[j] = (uint8_t)(l & 0xF);
            else sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
            sc[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
    }
    put16(y + 108, d16);
    float d_all = mdk_h2f(d16);
    for (int j = 0; j < 16; j++) {
        int s = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        s = (s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        float d = d_all * s;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = d != 0.f ? (uint8_t)(clampi(near(x[16 * j + i] / d), -4, 3) + 4) : 4;
    }
    /* the high bit of weight j goes to hmask[j % 32], bit j / 32 */
    for (int j = 0; j < QK; j++)
        if (L[j] > 3) { hmask[j % 32] |= (uint8_t)(1 << (j / 32)); L[j] -= 4; }
    pack2(L, qs);
    return 0;
}

/* ---------------- Q2_K ---------------- */

/* Q2_K's search for 8 sub-blocks of 16 at once (xt[i], wt[i]: element i of each and its weight):
 * scale s >= 0 and minimum m <= 0 with x ~ s * l + m, l in 0..3, the best by weighted squared error
 * of the min/max grid and of 37 weighted least-squares fits, one for each grid iscale =
 * (3 - 0.9 + 0.05 * step) / (max - min) (make_qkx3_quants, as quantize_row_q2_K_impl calls it). */
static MDK_INLINE void fit_min8(const vf *xt, const vf *wt, float *scale, float *the_min) {
    const float nmax = 3.f, rmin = -0.9f, rdelta = 0.05f;
    const int nstep = 36;
    vf L[16], zero = vb(0.f), vmax = vb(nmax), mn = xt[0], mx = xt[0], sw = zero, sx = zero;
    for (int i = 0; i < 16; i++) {
        mn = vsel(vlt(xt[i], mn), xt[i], mn);
        mx = vsel(vlt(mx, xt[i]), xt[i], mx);
        sw = vadd(sw, wt[i]);
        sx = vadd(sx, vmul(wt[i], xt[i]));
    }
    mn = vsel(vlt(zero, mn), zero, mn);
    vm live = vlt(mn, mx);  /* a flat lane gets a dummy range and scale 0 at the end */
    vf rng = vsel(live, vsub(mx, mn), vb(1.f)), isc0 = vdiv(vmax, rng);
    vf sc = vdiv(vb(1.f), isc0), mi = mn, best = zero;
    for (int i = 0; i < 16; i++) {
        vf l = vrnd(vclamp(vmul(isc0, vsub(xt[i], mn)), zero, vmax));
        vf d = vsub(vadd(vmul(sc, l), mn), xt[i]);
        best = vadd(best, vmul(wt[i], vmul(d, d)));
    }
    for (int is = 0; is <= nstep; is++) {  /* as llama.cpp's: each grid from the minimum taken so far */
        rng = vsel(live, vsub(mx, mi), vb(1.f));
        vf isc = vdiv(vb(rmin + rdelta * (float)is + nmax), rng), ts, tm, e = zero;
        for (int i = 0; i < 16; i++) L[i] = vrnd(vclamp(vmul(isc, vsub(xt[i], mi)), zero, vmax));
        vm ok = lsq_scale_min(xt, wt, L, 16, sw, sx, &ts, &tm);
        for (int i = 0; i < 16; i++) {
            vf d = vsub(vadd(vmul(ts, L[i]), tm), xt[i]);
            e = vadd(e, vmul(wt[i], vmul(d, d)));
        }
        vm take = vand(ok, vlt(e, best));
        best = vsel(take, e, best);
        sc = vsel(take, ts, sc);
        mi = vsel(take, tm, mi);
    }
    vst(scale, vsel(live, sc, zero));
    vst(the_min, vneg(mi));
}

/* v (16 values >= 0) as multiples l in 0..nmax of one step, weighted by qw (make_qp_quants) */
static MDK_INLINE float fit_step(const float *v, const float *qw, int nmax, uint8_t *L) {
    float max = 0.f;
    for (int i = 0; i < 16; i++) max = v[i] > max ? v[i] : max;
    if (max < 1e-15f) { memset(L, 0, 16); return 0.f; }
    float iscale = nmax / max, scale = 1.f / iscale, best = 0.f;
    for (int i = 0; i < 16; i++) {
        float diff = v[i] - scale * near(iscale * v[i]);
        best += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (!is) continue;
        float isc = (0.1f * is + nmax) / max, sc = 1.f / isc, mse = 0.f;
        for (int i = 0; i < 16; i++) {
            int l = near(isc * v[i]);
            l = l < nmax ? l : nmax;
            float diff = v[i] - sc * l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best) { best = mse; iscale = isc; }
    }
    float sumlx = 0.f, suml2 = 0.f;
    for (int i = 0; i < 16; i++) {
        int l = near(iscale * v[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += qw[i] * v[i] * l;
        suml2 += qw[i] * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < 16; i++) {
            float slx = sumlx - qw[i] * v[i] * L[i], sl2 = suml2 - qw[i] * L[i] * L[i];
            if (slx > 0.f && sl2 > 0.f) {
                int nl = near(v[i] * sl2 / slx);
                nl = nl < nmax ? nl : nmax;
                if (nl != L[i]) {
                    slx += qw[i] * v[i] * nl;
                    sl2 += qw[i] * nl * nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) { L[i] = (uint8_t)nl; sumlx = slx; suml2 = sl2; changed++; }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.f ? sumlx / suml2 : 0.f;
}

static MDK_INLINE int block_q2k(const float *x, uint8_t *y) {
    uint8_t L[QK], Ls[16], Lm[16];
    float scales[16], mins[16], sw[16];
    float sumx2 = 0.f;
    for (int j = 0; j < QK; j++) sumx2 += x[j] * x[j];
    float sigma2 = sumx2 / QK;
    for (int h = 0; h < 2; h++) {  /* sub-blocks 8h .. 8h + 7, one a lane */
        vf xt[16], wt[16];
        for (int i = 0; i < 16; i++) {
            float t[8], w[8];
            for (int j = 0; j < 8; j++) {
                t[j] = x[16 * (8 * h + j) + i];
                w[j] = sqrtf(sigma2 + t[j] * t[j]);
            }
            xt[i] = vld(t);
            wt[i] = vld(w);
        }
        for (int j = 0; j < 8; j++) {  /* each sub-block's weight sum, in element order */
            float s = 0.f;
            for (int i = 0; i < 16; i++) s += sqrtf(sigma2 + x[16 * (8 * h + j) + i] * x[16 * (8 * h + j) + i]);
            sw[8 * h + j] = s;
        }
        fit_min8(xt, wt, scales + 8 * h, mins + 8 * h);
    }
    float dm = fit_step(scales, sw, 15, Ls), mm = fit_step(mins, sw, 15, Lm);
    uint16_t d16 = mdk_f2h(dm), m16 = mdk_f2h(mm);
    if (!half_ok(d16) || !half_ok(m16)) return -1;
    dm = mdk_h2f(d16);
    mm = mdk_h2f(m16);
    for (int j = 0; j < 16; j++) {
        y[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        float d = dm * Ls[j], m = mm * Lm[j];
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = d != 0.f ? (uint8_t)clampi(near((x[16 * j + i] + m) / d), 0, 3) : 0;
    }
    pack2(L, y + 16);
    put16(y + 80, d16);
    put16(y + 82, m16);
    return 0;
}

static int low_c(int fmt, const float *x, uint8_t *y) { return fmt == MDK_Q3K ? block_q3k(x, y) : block_q2k(x, y); }
#if MDK_X86
/* the same C built for AVX2 (no FMA contraction under -std=c11: the bytes do not depend on the path) */
MDK_TARGET("avx2")
static int low_avx2(int fmt, const float *x, uint8_t *y) { return fmt == MDK_Q3K ? block_q3k(x, y) : block_q2k(x, y); }
#else
#define low_avx2 low_c
#endif

int mdk_block_low(int fmt, const float *x, uint8_t *y) {
    return (mdk_path >= MDK_PATH_AVX2 ? low_avx2 : low_c)(fmt, x, y);
}
