/* GGUF block weights multiplied and dequantised in the file's own layout ("raw": a matrix with
 * mdk_matrix.raw = 1): n rows of k / block ggml block structs, row-major, exactly as a .gguf file
 * holds them, so the engine can run a read-only mapping of the file with no copy. (The tiles of
 * kquant.c / qblock.c are a repack of the same rows: faster to multiply on some shapes, but a copy.)
 * An expert's w13 [2I, D] is gate's rows then up's, two places in the file: rows r >= n_lo are read
 * from w_hi (mdk.h).
 *
 * This file: the portable C kernel of all 8 formats (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1), the dequantisation (bit for bit gguf.quants.dequantize's, as kquant.c / qblock.c are), and
 * the dispatch to the SIMD kernels of kraw_x86.c on the active path.
 *
 * The arithmetic is the tiles' (kquant.c and qblock.c's opening comments): activations are mdk_q8
 * (int8 per block of 32, natural order); per 32-block the integer sum of u * xq is exact, and the
 * block's float terms are the tiles' own, so a raw product equals the tiled one up to the order of
 * the fp32 additions.
 *   Q4_K/Q5_K  y += d * sum_j (float)(sc_j * s_j) * dx_j  -  dmin * sum_j mn_j * sx_j   (per super-block)
 *   Q6_K       y += d * sum_b (float)(sc_2b (s_2b - 32 s16_2b) + sc_2b+1 (s_2b+1 - 32 s16_2b+1)) * dx_b
 *   32-blocks  y += d * dx * s + m * sx   (m = the stored minimum, or -8 d, -16 d, -128 d: w = d u + m)
 */
#define _POSIX_C_SOURCE 200112L  /* posix_memalign under -std=c11 */
#include "kraw.h"

#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <malloc.h>
#endif

static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* ---------------- aligned memory (kraw_x86.c's per-thread copies of tokens) ---------------- */
void *mdk_raw_alloc(size_t bytes) {
#if defined(_WIN32)
    return _aligned_malloc(bytes, 64);
#else
    void *p;
    return posix_memalign(&p, 64, bytes) ? NULL : p;
#endif
}

void mdk_raw_free(void *p) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

/* ---------------- one raw block's fields ---------------- */
/* K-quants: q unsigned (Q6_K: 0..63, the weight is q - 32), sc[8] and mn[8] (Q6_K: sc[16]) */
typedef struct { uint8_t q[256]; int sc[16], mn[8]; float d, dmin; } kfields;

static void k_fields(int fmt, const uint8_t *b, kfields *f) {
    if (fmt == MDK_Q6K) {
        const uint8_t *ql = b, *qh = b + 128;
        for (int e = 0; e < 256; e++) {  /* half h of 128, chunk i of 32 in it, j in the chunk */
            int h = e >> 7, i = (e >> 5) & 3, j = e & 31;
            int lo = (ql[64 * h + 32 * (i & 1) + j] >> (4 * (i >> 1))) & 15, hi = (qh[32 * h + j] >> (2 * i)) & 3;
            f->q[e] = (uint8_t)(lo | hi << 4);
        }
        for (int s = 0; s < 16; s++) f->sc[s] = (int8_t)b[192 + s];
        f->d = mdk_h2f(rd16(b + 208));
        f->dmin = 0.f;
        return;
    }
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (fmt == MDK_Q5K ? 48 : 16);
    f->d = mdk_h2f(rd16(b));
    f->dmin = mdk_h2f(rd16(b + 2));
    for (int j = 0; j < 4; j++) {  /* gguf's Q4_K.get_scale_min */
        f->sc[j] = s[j] & 63;
        f->mn[j] = s[j + 4] & 63;
        f->sc[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4;
        f->mn[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
    for (int e = 0; e < 256; e++) {
        int j = e >> 5, l = e & 31;
        int q = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
        if (fmt == MDK_Q5K) q |= ((qh[l] >> j) & 1) << 4;
        f->q[e] = (uint8_t)q;
    }
}

/* 32-weight blocks: w = d * u + m with u unsigned (qblock.c's reading) */
#define QB_HASM(f) ((f) == MDK_Q4_1 || (f) == MDK_Q5_1)
#define QB_C(f) ((f) == MDK_Q8_0 ? -128.f : (f) == MDK_Q4_0 ? -8.f : (f) == MDK_Q5_0 ? -16.f : 0.f)  /* m / d */

static void b_values(int f, const uint8_t *p, uint8_t *u) {
    int five = f == MDK_Q5_0 || f == MDK_Q5_1;
    const uint8_t *qs = p + 2 + 2 * QB_HASM(f) + (five ? 4 : 0);
    if (f == MDK_Q8_0) {
        for (int i = 0; i < 32; i++) u[i] = qs[i] ^ 0x80;
        return;
    }
    for (int i = 0; i < 16; i++) { u[i] = qs[i] & 15; u[16 + i] = qs[i] >> 4; }
    if (five) {
        uint32_t qh = rd32(p + 2 + 2 * QB_HASM(f));
        for (int i = 0; i < 32; i++) u[i] |= (uint8_t)(((qh >> i) & 1) << 4);
    }
}

/* ---------------- dequantisation: gguf/quants.py's float ops, in its order ---------------- */
MDK_API void mdk_raw_dequantize(const mdk_matrix *w, int r0, int r1, float *out) {
    int fmt = w->fmt, k = w->k, qk = kraw_qk(fmt);
    if (!(MDK_IS_KQ(fmt) || MDK_IS_QB(fmt) || MDK_IS_CODES(fmt)) || k <= 0 || k % qk || r0 < 0 || r1 > w->n ||
        r0 >= r1)
        return;
    size_t rb = kraw_row_bytes(fmt, k);
    if (MDK_IS_CODES(fmt)) {  /* (codes.c, in gguf-py's order likewise) */
        for (int r = r0; r < r1; r++) mdk_codes_dequantize_row(fmt, kraw_row(w, r, rb), k, out + (size_t)(r - r0) * k);
        return;
    }
    int bs = kraw_bsize(fmt), nb = k / qk;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = row + (size_t)b * bs;
            float *o = out + (size_t)(r - r0) * k + (size_t)qk * b;
            if (MDK_IS_KQ(fmt)) {
                kfields f;
                k_fields(fmt, p, &f);
                if (fmt == MDK_Q6K) {
                    for (int e = 0; e < 256; e++) o[e] = (f.d * (float)f.sc[e >> 4]) * (float)((int)f.q[e] - 32);
                    continue;
                }
                for (int j = 0; j < 8; j++) {
                    float ds = f.d * (float)f.sc[j], dm = f.dmin * (float)f.mn[j];
                    for (int e = 32 * j; e < 32 * j + 32; e++) o[e] = ds * (float)f.q[e] - dm;
                }
                continue;
            }
            uint8_t u[32];
            b_values(fmt, p, u);
            float d = mdk_h2f(rd16(p));
            if (QB_HASM(fmt)) {
                float m = mdk_h2f(rd16(p + 2));
                for (int i = 0; i < 32; i++) {
                    float dq = d * (float)u[i];
                    o[i] = dq + m;
                }
            } else {
                int off = (int)QB_C(fmt);  /* the signed value is u + (m / d): exact in int */
                for (int i = 0; i < 32; i++) o[i] = d * (float)(u[i] + off);
            }
        }
    }
}

/* ---------------- portable products: one row against nt tokens ---------------- */
static void row_c(int fmt, const uint8_t *row, int k, const mdk_q8 *const *a, int nt, float *y) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (MDK_IS_KQ(fmt)) {
        kfields f;
        for (int s = 0; s < k / 256; s++) {
            k_fields(fmt, row + (size_t)s * kraw_bsize(fmt), &f);
            for (int t = 0; t < nt; t++) {
                float part = 0.f, mins = 0.f;
                for (int j = 0; j < 8; j++) {
                    int b = 8 * s + j, lo = 0, hi = 0;
                    const int8_t *x = a[t]->q + 32 * b;
                    const uint8_t *q = f.q + 32 * j;
                    for (int i = 0; i < 16; i++) { lo += q[i] * x[i]; hi += q[16 + i] * x[16 + i]; }
                    if (fmt == MDK_Q6K) {
                        int v = f.sc[2 * j] * (lo - 32 * a[t]->s16[2 * b]) + f.sc[2 * j + 1] * (hi - 32 * a[t]->s16[2 * b + 1]);
                        part += (float)v * a[t]->dx[b];
                    } else {
                        part += (float)(f.sc[j] * (lo + hi)) * a[t]->dx[b];
                        mins += (float)f.mn[j] * a[t]->sx[b];
                    }
                }
                acc[t] += f.d * part - f.dmin * mins;
            }
        }
    } else {
        int bs = kraw_bsize(fmt);
        uint8_t u[32];
        for (int b = 0; b < k / 32; b++) {
            const uint8_t *p = row + (size_t)b * bs;
            b_values(fmt, p, u);
            float d = mdk_h2f(rd16(p)), m = QB_HASM(fmt) ? mdk_h2f(rd16(p + 2)) : QB_C(fmt) * d;
            for (int t = 0; t < nt; t++) {
                const int8_t *x = a[t]->q + 32 * b;
                int s = 0;
                for (int i = 0; i < 32; i++) s += u[i] * x[i];
                acc[t] += d * a[t]->dx[b] * (float)s + m * a[t]->sx[b];
            }
        }
    }
    for (int t = 0; t < nt; t++) y[t] = acc[t];
}

float mdk_raw_blocks_dot(int fmt, const uint8_t *row, int b0, int b1, const mdk_q8 *a) {
    int bs = kraw_bsize(fmt);
    uint8_t u[32];
    float acc = 0.f;
    for (int b = b0; b < b1; b++) {  /* (row_c's terms for these blocks, in its order) */
        const uint8_t *p = row + (size_t)b * bs;
        b_values(fmt, p, u);
        float d = mdk_h2f(rd16(p)), m = QB_HASM(fmt) ? mdk_h2f(rd16(p + 2)) : QB_C(fmt) * d;
        const int8_t *x = a->q + 32 * b;
        int s = 0;
        for (int i = 0; i < 32; i++) s += u[i] * x[i];
        acc += d * a->dx[b] * (float)s + m * a->sx[b];
    }
    return acc;
}

/* y[t][0..r1-r0) = rows r0..r1-1 (any range) dotted with token a[t], t < nt */
void mdk_raw_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    while (nt > 4) {  /* (the callers pass at most 4) */
        mdk_raw_rows_multi(w, r0, r1, a, 4, y);
        a += 4, y += 4, nt -= 4;
    }
    if (nt <= 0 || r0 >= r1) return;
#if MDK_X86
    if (MDK_IS_CODES(w->fmt) ? mdk_codes_x86(w, r0, r1, a, nt, y) || mdk_codes_avx2(w, r0, r1, a, nt, y)
                             : mdk_path != MDK_PATH_C && mdk_raw_x86(w, r0, r1, a, nt, y))
        return;
#endif
    size_t rb = kraw_row_bytes(w->fmt, w->k);
    for (int r = r0; r < r1; r++) {
        float out[4];
        if (MDK_IS_CODES(w->fmt)) mdk_codes_row(w->fmt, kraw_row(w, r, rb), w->k, a, nt, out);
        else row_c(w->fmt, kraw_row(w, r, rb), w->k, a, nt, out);
        for (int t = 0; t < nt; t++) y[t][r - r0] = out[t];
    }
}
