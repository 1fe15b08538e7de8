/* Quantisers to GGUF's blocks (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; Q3_K and Q2_K in
 * kquantize_low.c) from fp32/fp16/bf16
 * rows: the bytes a .gguf file holds (ggml's block structs), n rows of k / block blocks.
 *
 * The searches are llama.cpp's reference quantisers' (ggml-quants.c, no importance matrix), the
 * same float operations in the same order:
 *   Q4_K / Q5_K  per 32-weight sub-block make_qkx2_quants (weight av_x + |x|; Q4_K nstep 20, rmin -1,
 *                rdelta 0.1; Q5_K 15, -0.5, 0.1), the 8 scales and 8 minimums to 6 bits under the
 *                fp16 d and dmin, every q again against the stored scales;
 *   Q6_K         per 16-weight sub-block make_qx_quants (rmse_type 1), int8 scales under fp16 d;
 *   Q8_0 amax / 127 and roundf; Q4_0 / Q5_0 the largest magnitude to -8 / -16; Q4_1 / Q5_1 min/max.
 * Departures, each measured (relative RMSE, Gaussian weights unless said):
 *   - Q4_K / Q5_K: d and dmin are each the best of max / 63 (the reference's), / 63.5, / 64, / 65
 *     by the super-block's true error (Q4_K 0.0718 -> 0.0713, Q5_K 0.0362 -> 0.0357; the
 *     installed llama.cpp's reference: 0.0714, 0.0361), and a super-block of mostly all-positive
 *     sub-blocks is stored negated (block_k);
 *   - where an fp16 step (d, dmin; Q6_K's d) is subnormal, weights of about 1e-3 and below, the
 *     sub-block scales are rounded against the stored step (at weights of 1e-4: Q6_K 0.114 -> 0.049);
 *   - q of a K-quant sub-block whose stored scale is 0 is written 0 (its values are -dm anyway).
 * Q6_K and the 32-weight formats give the bytes of llama.cpp's quantize_row_*_ref (compared by the
 * tests where llama.cpp is installed), the 32-weight formats also gguf.quants'.
 *
 * Deterministic: rows are independent and each is quantised by the same code whatever the thread
 * count, and the AVX2 build of the search (the same C compiled for wider vectors, with no FMA
 * contraction under -std=c11) gives the portable build's bytes.
 * Returns 0; -1 when k is not a multiple of the block, fmt or src_fmt is unknown, a weight is NaN or
 * infinite, a block's fp16 scale would overflow (|d| > 65504: the format cannot hold such weights),
 * or memory runs out. On -1 the contents of raw are unspecified.
 */
#include "mdk.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define QK 256  /* a K-quant super-block */

/* Round half to even for |v| < 2^22 (what llama.cpp's nearest_int does), in float so the loops
 * vectorise: adding 1.5 * 2^23 leaves no fraction bits. Needs strict IEEE order (no -ffast-math). */
static MDK_INLINE float rnd(float v) { return (v + 12582912.f) - 12582912.f; }
static MDK_INLINE float clampf(float v, float lo, float hi) { v = v < lo ? lo : v; return v > hi ? hi : v; }

#include "lanes.h"  /* 8 lanes: the searches fit 8 sub-blocks at once */

/* ---------------- the searches ---------------- */

/* Q4_K / Q5_K: for each of 8 sub-blocks of 32 (xt[i]: element i of each), scale s >= 0 and
 * minimum m <= 0 with x ~ s * l + m, l in 0..nmax (make_qkx2_quants): the best, by squared error
 * weighted by w = av_x + |x| (av_x: the sub-block's rms), of the min/max grid and of nstep + 1
 * weighted least-squares fits, one for each candidate grid iscale = (nmax + rmin + rdelta * step) /
 * (max - min). The minimum stays <= 0: the format stores -m as a 6-bit multiple of dmin >= 0. */
static MDK_INLINE void fit_min8(const vf *xt, float nmax, float rmin, float rdelta, int nstep,
                                float *scale, float *the_min) {
    vf wt[32], L[32];
    vf zero = vb(0.f), vmax = vb(nmax), s2 = zero;
    for (int i = 0; i < 32; i++) s2 = vadd(s2, vmul(xt[i], xt[i]));
    float av[8];
    vst(av, s2);
    for (int j = 0; j < 8; j++) av[j] = sqrtf(av[j] / 32.f);
    vf avx = vld(av), mn = xt[0], mx = xt[0], sw = zero, sx = zero;
    for (int i = 0; i < 32; i++) {
        vf v = xt[i], w = vadd(avx, vabs(v));
        wt[i] = w;
        mn = vsel(vlt(v, mn), v, mn);
        mx = vsel(vlt(mx, v), v, mx);
        sw = vadd(sw, w);
        sx = vadd(sx, vmul(w, v));
    }
    mn = vsel(vlt(zero, mn), zero, mn);
    vm live = vlt(mn, mx);  /* not all equal; a flat lane gets a dummy range and is fixed at the end */
    vf rng = vsel(live, vsub(mx, mn), vb(1.f)), isc0 = vdiv(vmax, rng);
    vf sc = vdiv(vb(1.f), isc0), mi = mn, best = zero;
    for (int i = 0; i < 32; i++) {  /* the min/max grid */
        vf l = vrnd(vclamp(vmul(isc0, vsub(xt[i], mn)), zero, vmax));
        vf d = vsub(vadd(vmul(sc, l), mn), xt[i]);
        best = vadd(best, vmul(vmul(wt[i], d), d));
    }
    for (int is = 0; is <= nstep; is++) {
        vf isc = vdiv(vb(rmin + rdelta * (float)is + nmax), rng), ts, tm, e = zero;
        for (int i = 0; i < 32; i++) L[i] = vrnd(vclamp(vmul(isc, vsub(xt[i], mn)), zero, vmax));
        vm ok = lsq_scale_min(xt, wt, L, 32, sw, sx, &ts, &tm);
        for (int i = 0; i < 32; i++) {
            vf d = vsub(vadd(vmul(ts, L[i]), tm), xt[i]);
            e = vadd(e, vmul(vmul(wt[i], d), d));
        }
        vm take = vand(ok, vlt(e, best));
        best = vsel(take, e, best);
        sc = vsel(take, ts, sc);
        mi = vsel(take, tm, mi);
    }
    vst(scale, vsel(live, sc, zero));
    vst(the_min, vneg(vsel(live, mi, mn)));
}

/* Q6_K: for each of 8 sub-blocks of 16 (x: 128 values), the signed scale of x ~ scale * l, l in
 * -nmax..nmax-1 (make_qx_quants, rmse_type 1: each weight counts x^2): the grid that maps the
 * largest-magnitude weight to -nmax, then 18 more, -(nmax + 0.1 i) / max for i = -9..9 but 0, each
 * taken when its least-squares gain sumlx^2 / suml2 is larger. */
static MDK_INLINE void fit_signed8(const float *x, float nmax, float *scale) {
    vf xt[16];
    for (int i = 0; i < 16; i++) {
        float t[8];
        for (int j = 0; j < 8; j++) t[j] = x[16 * j + i];
        xt[i] = vld(t);
    }
    vf zero = vb(0.f), amax = zero, max = zero, sc = zero, best = zero;
    for (int i = 0; i < 16; i++) {
        vf a = vabs(xt[i]);
        vm g = vlt(amax, a);
        max = vsel(g, xt[i], max);
        amax = vsel(g, a, amax);
    }
    vf maxs = vsel(vlt(zero, amax), max, vb(1.f)), lo = vb(-nmax), hi = vb(nmax - 1.f);
    for (int t = 0; t < 19; t++) {  /* -nmax first, then nmax + 0.1 * (-9..-1, 1..9) */
        int is = t == 0 ? 0 : (t <= 9 ? t - 10 : t - 9);
        vf isc = vdiv(vb(-(nmax + 0.1f * (float)is)), maxs), slx = zero, sl2 = zero;
        for (int i = 0; i < 16; i++) {
            vf v = xt[i], l = vrnd(vclamp(vmul(isc, v), lo, hi)), w = vmul(v, v);
            slx = vadd(slx, vmul(vmul(w, v), l));
            sl2 = vadd(sl2, vmul(vmul(w, l), l));
        }
        vm nz = vlt(zero, sl2);
        vf s = vsel(nz, vdiv(slx, vsel(nz, sl2, vb(1.f))), zero);
        vm take = t == 0 ? vlt(vb(-1.f), zero) /* all */ : vand(nz, vlt(vmul(best, sl2), vmul(slx, slx)));
        sc = vsel(take, s, sc);
        best = vsel(take, vmul(s, slx), best);
    }
    vst(scale, vsel(vlt(amax, vb(1e-15f)), zero, sc));
}

/* ---------------- one row ---------------- */

static int half_ok(uint16_t h) { return (h & 0x7c00) != 0x7c00; }  /* finite in fp16 */
static int subnormal(uint16_t h) { return (h & 0x7c00) == 0 && (h & 0x3ff) != 0; }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* The 8 values v (scales or minimums, >= 0) as 6-bit multiples l of one fp16 step: the step is
 * vmax / den (den 63: llama.cpp's), l = round(v * den / vmax) as the reference rounds them, or, where
 * the step is an fp16 subnormal (weights of ~1e-3 and below) whose rounding can move it by percents,
 * l = round(v / step as stored). */
static MDK_INLINE void six_bit(float vmax, float den, const float *v, uint16_t *h, float *step, uint8_t *l) {
    *h = mdk_f2h(vmax / den);
    *step = mdk_h2f(*h);
    float inv = vmax > 0.f ? den / vmax : 0.f;
    if (subnormal(*h)) inv = 1.f / *step;
    for (int j = 0; j < 8; j++) l[j] = (uint8_t)clampf(rnd(inv * v[j]), 0.f, 63.f);
}

/* The squared error of a super-block (xt: transposed, as in fit_min8) for stored scales d * ls and
 * minimums dmin * lm, with each q chosen against them. */
static MDK_INLINE float k_err(const vf *xt, float d, const uint8_t *ls, float dmin, const uint8_t *lm, float nmax) {
    float a[8], b[8];
    for (int j = 0; j < 8; j++) { a[j] = d * ls[j]; b[j] = dmin * lm[j]; }
    vf zero = vb(0.f), dd = vld(a), dm = vld(b), e = zero;
    vm live = vlt(zero, dd);
    vf dds = vsel(live, dd, vb(1.f));
    for (int i = 0; i < 32; i++) {
        vf l = vsel(live, vrnd(vclamp(vdiv(vadd(xt[i], dm), dds), zero, vb(nmax))), zero);
        vf r = vsub(vsub(vmul(dd, l), dm), xt[i]);
        e = vadd(e, vmul(r, r));
    }
    vst(a, e);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Q4_K (nmax 15) or Q5_K (nmax 31): 256 weights -> 144 or 176 bytes. 0, or -1: fp16 overflow. */
static MDK_INLINE int block_k(const float *x0, int q5, uint8_t *y) {
    float nmax = q5 ? 31.f : 15.f, scales[8], mins[8], neg[QK];
    uint8_t L[QK], sc[12] = {0};
    float max_scale = 0.f, max_min = 0.f;
    /* The format holds w = d * ls * q - dmin * lm with lm >= 0, so for d, dmin >= 0 a sub-block's
     * lowest level is <= 0 and a sub-block of only positive weights wastes levels (the search clamps
     * its minimum to 0). Where more sub-blocks are all positive than all negative, the super-block is
     * quantised negated and d and dmin are stored negated: the same values, and now the all-negative
     * ones are the fewer. Measured, rows with a mean of +3 sigma: relative RMSE 0.088 -> 0.072 (the
     * 5-bit grid: 0.078); zero-mean weights are never flipped (the reference's bytes). */
    int pos = 0, negs = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x0[32 * j], hi = x0[32 * j];
        for (int i = 1; i < 32; i++) {
            lo = x0[32 * j + i] < lo ? x0[32 * j + i] : lo;
            hi = x0[32 * j + i] > hi ? x0[32 * j + i] : hi;
        }
        pos += lo > 0.f;
        negs += hi < 0.f;
    }
    int flip = pos > negs;
    const float *x = x0;
    if (flip) {
        for (int i = 0; i < QK; i++) neg[i] = -x0[i];
        x = neg;
    }
    vf xt[32];
    for (int i = 0; i < 32; i++) {  /* transposed: xt[i] holds element i of each sub-block */
        float t[8];
        for (int j = 0; j < 8; j++) t[j] = x[32 * j + i];
        xt[i] = vld(t);
    }
    if (q5) fit_min8(xt, nmax, -0.5f, 0.1f, 15, scales, mins);
    else fit_min8(xt, nmax, -1.f, 0.1f, 20, scales, mins);
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    /* d and dmin: the reference's max / 63 first, then a few smaller ones (the largest sub-block's
     * 6-bit scale then clips at 63 while the others get finer), each scored by the super-block's
     * squared error with q against the stored scales; ties keep the earlier */
    static const float DEN[] = {63.f, 63.5f, 64.f, 65.f};
    uint8_t ls[8], lm[8];
    uint16_t d16 = 0, m16 = 0;
    float d = 0.f, dmin = 0.f;
    six_bit(max_min, 63.f, mins, &m16, &dmin, lm);
    float best = INFINITY;
    for (int c = 0; c < (int)(sizeof DEN / sizeof DEN[0]); c++) {
        uint16_t h; float dc; uint8_t l8[8];
        six_bit(max_scale, DEN[c], scales, &h, &dc, l8);
        float e = k_err(xt, dc, l8, dmin, lm, nmax);
        if (e < best) { best = e; d16 = h; d = dc; memcpy(ls, l8, 8); }
    }
    best = INFINITY;
    for (int c = 0; c < (int)(sizeof DEN / sizeof DEN[0]); c++) {
        uint16_t h; float mc; uint8_t l8[8];
        six_bit(max_min, DEN[c], mins, &h, &mc, l8);
        float e = k_err(xt, d, ls, mc, l8, nmax);
        if (e < best) { best = e; m16 = h; dmin = mc; memcpy(lm, l8, 8); }
    }
    if (!half_ok(d16) || !half_ok(m16)) return -1;
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {  /* q against the scales as stored */
        float dd = d * ls[j], dm = dmin * lm[j];
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = dd != 0.f ? (uint8_t)rnd(clampf((x[32 * j + i] + dm) / dd, 0.f, nmax)) : 0;
    }
    put16(y, flip ? (uint16_t)(d16 ^ 0x8000) : d16);
    put16(y + 2, flip ? (uint16_t)(m16 ^ 0x8000) : m16);
    memcpy(y + 4, sc, 12);
    if (!q5) {
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[16 + 32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
        return 0;
    }
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int a = L[64 * c + l], b = L[64 * c + 32 + l];
            qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
            ql[32 * c + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
        }
    return 0;
}

/* Q6_K: 256 weights -> 210 bytes (ql[128], qh[64], int8 scales[16], fp16 d). */
static MDK_INLINE int block_q6k(const float *x, uint8_t *y) {
    float scales[16], max_scale = 0.f, max_abs = 0.f;
    uint8_t L[QK];
    fit_signed8(x, 32.f, scales);
    fit_signed8(x + 128, 32.f, scales + 8);
    for (int b = 0; b < 16; b++) {
        if (fabsf(scales[b]) > max_abs) { max_abs = fabsf(scales[b]); max_scale = scales[b]; }
    }
    memset(y, 0, 210);
    if (max_abs < 1e-15f) return 0;  /* all (near) zero: d = 0 */
    float iscale = -128.f / max_scale;
    uint16_t d16 = mdk_f2h(1.f / iscale);
    if (!half_ok(d16)) return -1;
    float d = mdk_h2f(d16);
    int8_t sc[16];
    if (subnormal(d16)) iscale = 1.f / d;  /* as in block_k: a subnormal d is rounded by percents */
    for (int b = 0; b < 16; b++) sc[b] = (int8_t)clampf(rnd(iscale * scales[b]), -128.f, 127.f);
    for (int b = 0; b < 16; b++) {
        float dd = d * sc[b];
        for (int i = 0; i < 16; i++)
            L[16 * b + i] = dd != 0.f ? (uint8_t)(rnd(clampf(x[16 * b + i] / dd, -32.f, 31.f)) + 32.f) : 32;
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((q[0] & 0xF) | ((q[64] & 0xF) << 4));
            ql[64 * h + 32 + l] = (uint8_t)((q[32] & 0xF) | ((q[96] & 0xF) << 4));
            qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
        }
    memcpy(y + 192, sc, 16);
    put16(y + 208, d16);
    return 0;
}

/* The 32-weight formats, as llama.cpp's quantize_row_*_ref: 0, or -1 on fp16 overflow. */
static int block_32(int fmt, const float *x, uint8_t *y) {
    uint8_t q[32];
    if (fmt == MDK_Q8_0) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
        uint16_t d16 = mdk_f2h(d);
        put16(y, d16);
        for (int i = 0; i < 32; i++) y[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);  /* roundf: half away, as ggml */
        return half_ok(d16) ? 0 : -1;
    }
    int five = fmt == MDK_Q5_0 || fmt == MDK_Q5_1, qmax = five ? 31 : 15, off;
    uint16_t d16, m16 = 0;
    if (fmt == MDK_Q4_0 || fmt == MDK_Q5_0) {  /* symmetric: the largest magnitude, with its sign, to -8 / -16 */
        float amax = 0.f, max = 0.f;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
        float d = max / (five ? -16.f : -8.f), id = d != 0.f ? 1.f / d : 0.f, bias = five ? 16.5f : 8.5f;
        d16 = mdk_f2h(d);
        for (int i = 0; i < 32; i++) {
            int v = (int)(x[i] * id + bias);  /* truncation, as the reference's (int8_t) cast */
            q[i] = (uint8_t)(v < 0 ? 0 : (v > qmax ? qmax : v));
        }
        off = 2;
    } else {  /* Q4_1 / Q5_1: min/max */
        float mn = x[0], mx = x[0];
        for (int i = 1; i < 32; i++) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
        float d = (mx - mn) / (float)qmax, id = d != 0.f ? 1.f / d : 0.f;
        d16 = mdk_f2h(d);
        m16 = mdk_f2h(mn);
        for (int i = 0; i < 32; i++) {
            int v = (int)((x[i] - mn) * id + 0.5f);
            q[i] = (uint8_t)(v < 0 ? 0 : (v > qmax ? qmax : v));
        }
        put16(y + 2, m16);
        off = 4;
    }
    put16(y, d16);
    if (five) {
        uint32_t qh = 0;
        for (int i = 0; i < 32; i++) qh |= (uint32_t)(q[i] >> 4) << i;
        memcpy(y + off, &qh, 4);
        off += 4;
    }
    for (int i = 0; i < 16; i++) y[off + i] = (uint8_t)((q[i] & 0xF) | ((q[16 + i] & 0xF) << 4));
    return half_ok(d16) && half_ok(m16) ? 0 : -1;
}

static int low(int fmt) { return fmt == MDK_Q3K || fmt == MDK_Q2K; }  /* kquantize_low.c */
static int block_of(int fmt) { return MDK_IS_KQ(fmt) || low(fmt) ? QK : 32; }
static int block_bytes(int fmt) {
    static const int b[] = {144, 176, 210, 34, 18, 20, 22, 24};  /* MDK_Q4K .. MDK_Q5_1 */
    return fmt == MDK_Q3K ? 110 : (fmt == MDK_Q2K ? 84 : b[fmt - MDK_Q4K]);
}

static MDK_INLINE int row_blocks(int fmt, const float *x, int k, uint8_t *y) {
    int bad = 0, nb = k / block_of(fmt), bb = block_bytes(fmt);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * block_of(fmt);
        uint8_t *yb = y + (size_t)b * bb;
        if (fmt == MDK_Q4K || fmt == MDK_Q5K) bad |= block_k(xb, fmt == MDK_Q5K, yb);
        else if (fmt == MDK_Q6K) bad |= block_q6k(xb, yb);
        else if (low(fmt)) bad |= mdk_block_low(fmt, xb, yb);
        else bad |= block_32(fmt, xb, yb);
    }
    return bad;
}

static int row_blocks_c(int fmt, const float *x, int k, uint8_t *y) { return row_blocks(fmt, x, k, y); }
#if MDK_X86
/* The same C compiled for AVX2 (no FMA: the bytes must not depend on the path). */
MDK_TARGET("avx2")
static int row_blocks_avx2(int fmt, const float *x, int k, uint8_t *y) { return row_blocks(fmt, x, k, y); }
#else
#define row_blocks_avx2 row_blocks_c
#endif

/* ---------------- rows in parallel ---------------- */

#define ROWS_PER_TASK 4

typedef struct {
    int fmt, sfmt, n, k;
    const char *src;
    uint8_t *raw;
    atomic_int bad;
} qjob;

static int finite_row(const float *x, int k) {
    int bad = 0;
    for (int i = 0; i < k; i++) bad |= (x[i] - x[i]) != 0.f;  /* NaN for NaN and +-Inf */
    return !bad;
}

static void quantize_task(void *c, int t) {
    qjob *j = (qjob *)c;
    size_t esz = j->sfmt == MDK_F32 ? 4 : 2, rb = (size_t)(j->k / block_of(j->fmt)) * block_bytes(j->fmt);
    float *buf = j->sfmt == MDK_F32 ? NULL : (float *)malloc((size_t)j->k * sizeof(float));
    if (j->sfmt != MDK_F32 && !buf) { atomic_store(&j->bad, 1); return; }
    int (*rows)(int, const float *, int, uint8_t *) = mdk_path >= MDK_PATH_AVX2 ? row_blocks_avx2 : row_blocks_c;
    for (int r = t * ROWS_PER_TASK; r < j->n && r < (t + 1) * ROWS_PER_TASK; r++) {
        const void *s = j->src + (size_t)r * j->k * esz;
        const float *x = (const float *)s;
        if (buf) { mdk_load_row(j->sfmt, s, buf, j->k); x = buf; }
        if (!finite_row(x, j->k) || rows(j->fmt, x, j->k, j->raw + (size_t)r * rb)) atomic_store(&j->bad, 1);
    }
    free(buf);
}

MDK_API int mdk_quantize_blocks(int fmt, const void *src, int src_fmt, int n, int k, uint8_t *raw, int nthreads) {
    if (!(MDK_IS_KQ(fmt) || MDK_IS_QB(fmt) || low(fmt)) || (src_fmt != MDK_F32 && src_fmt != MDK_F16 && src_fmt != MDK_BF16))
        return -1;
    if (n < 0 || k <= 0 || k % block_of(fmt)) return -1;
    qjob j = {fmt, src_fmt, n, k, (const char *)src, raw, 0};
    mdk_parallel((n + ROWS_PER_TASK - 1) / ROWS_PER_TASK, quantize_task, &j, nthreads < 1 ? 1 : nthreads);
    return atomic_load(&j.bad) ? -1 : 0;
}
