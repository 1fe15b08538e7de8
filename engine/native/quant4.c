/* 4-bit experts: quantisation, the kernel's weight layout, and Q4 x Q8 dot products.
 *
 * Grid: blocks of 32 along K, w = q * d + m with q in 0..15, d = (max - min) / 15 and m = min,
 * both stored as fp16 (llama.cpp's Q4_1 grid; the minimum halves the error of a symmetric grid on
 * skewed blocks). The activation is quantised once per call to int8 per block of 32 (scale dx =
 * amax / 127), so the dot product is integer:  sum(w * x) = d * dx * sum(q * xq) + m * dx * sum(xq).
 *
 * Layout: elements are visited in "kernel order". K splits into groups of 128 (then at most one
 * tail of 64 and one of 32). A group is two superblocks A (elements 0..63) and B (64..127); a
 * superblock is two blocks b0, b1 interleaved in chunks of 4: position p holds element
 * e(p) = 32 * ((p >> 2) & 1) + 4 * (p >> 3) + (p & 3). Byte p of a group's 64 packed bytes holds A[p]
 * in its low nibble and B[p] in its high nibble. So one 64-byte load, a mask and a shift give 128
 * weights, and in an integer dot product's 32-bit lanes (4 bytes each) even lanes belong to b0 and
 * odd lanes to b1: one 64-bit broadcast of the pair of block scales scales a whole vector.
 * A tail of 64 packs byte j = (pos j) | (pos 32 + j) << 4; a tail of 32 is natural: j | (16 + j).
 */
#include "mdk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if MDK_X86
#include <immintrin.h>
#endif

static inline int e_of(int p) { return 32 * ((p >> 2) & 1) + 4 * (p >> 3) + (p & 3); }

/* the element stored at kernel position i of a row of k */
static inline int elem_at(int i, int k) {
    int full = k / 128 * 128;
    if (i < full) return (i & ~127) + (i & 64) + e_of(i & 63);
    if (k - full >= 64 && i < full + 64) return full + e_of(i - full);
    return i;
}

size_t mdk_q8_bytes(int k) { return (size_t)k + 2 * (size_t)(k / 32) * sizeof(float) + 128; }

void mdk_q8_init(mdk_q8 *a, void *mem, int k) {
    a->dx = (float *)mem;
    a->sx = a->dx + k / 32;
    a->q = (int8_t *)(a->sx + k / 32);
}

/* Quantise x[e0..e1) (e0 a multiple of 128, e1 = k or a multiple of 128) into a. */
static void quantize_range(const float *x, int k, int e0, int e1, mdk_q8 *a) {
    int8_t nat[128];
    for (int g = e0; g < e1; g += 128) {
        int n = e1 - g < 128 ? e1 - g : 128;
        for (int b = 0; b < n; b += 32) {
            const float *xb = x + g + b;
            float amax = 0.f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                int q = (int)lrintf(xb[i] * inv);
                q = q > 127 ? 127 : (q < -127 ? -127 : q);
                nat[b + i] = (int8_t)q;
                sum += q;
            }
            a->dx[(g + b) / 32] = dx;
            a->sx[(g + b) / 32] = dx * (float)sum;
        }
        for (int i = 0; i < n; i++) a->q[g + i] = nat[elem_at(g + i, k) - g];
    }
}

void mdk_quantize_act(const float *x, int k, mdk_q8 *a) { quantize_range(x, k, 0, k, a); }
void mdk_quantize_act_range(const float *x, int k, int e0, int e1, mdk_q8 *a) { quantize_range(x, k, e0, e1, a); }

/* ---------------- weights: quantise and repack, dequantise ---------------- */
typedef struct {
    const void *src;
    int fmt, n, k;
    uint8_t *qs;
    uint16_t *d, *m;
    float *out;
} qjob;

#define QROWS 16

static void quantize_rows(void *c, int t) {
    qjob *j = (qjob *)c;
    int k = j->k, nb = k / 32;
    float *row = (float *)malloc((size_t)k * sizeof(float));
    uint8_t *q = (uint8_t *)malloc((size_t)k);
    if (!row || !q) { free(row); free(q); return; }
    size_t esz = j->fmt == MDK_F32 ? 4 : 2;
    for (int r = t * QROWS; r < j->n && r < (t + 1) * QROWS; r++) {
        mdk_load_row(j->fmt, (const char *)j->src + (size_t)r * k * esz, row, k);
        uint16_t *dr = j->d + (size_t)r * nb, *mr = j->m + (size_t)r * nb;
        for (int b = 0; b < nb; b++) {
            const float *w = row + 32 * b;
            float lo = w[0], hi = w[0];
            for (int i = 1; i < 32; i++) { lo = fminf(lo, w[i]); hi = fmaxf(hi, w[i]); }
            float scale = (hi - lo) / 15.f;
            if (scale < 1e-10f) scale = 1e-10f;
            dr[b] = mdk_f2h(scale);
            mr[b] = mdk_f2h(lo);
            float df = mdk_h2f(dr[b]), mf = mdk_h2f(mr[b]);  /* quantise against the stored grid */
            for (int i = 0; i < 32; i++) {
                int v = df > 0.f ? (int)lrintf((w[i] - mf) / df) : 0;
                q[32 * b + i] = (uint8_t)(v < 0 ? 0 : (v > 15 ? 15 : v));
            }
        }
        uint8_t *out = j->qs + (size_t)r * (k / 2);
        int full = k / 128 * 128, at = 0;
        for (int g = 0; g < full; g += 128)
            for (int p = 0; p < 64; p++) out[at++] = (uint8_t)(q[g + e_of(p)] | q[g + 64 + e_of(p)] << 4);
        int rest = full;
        if (k - rest >= 64) {
            for (int j2 = 0; j2 < 32; j2++) out[at++] = (uint8_t)(q[rest + e_of(j2)] | q[rest + e_of(32 + j2)] << 4);
            rest += 64;
        }
        if (k - rest == 32)
            for (int j2 = 0; j2 < 16; j2++) out[at++] = (uint8_t)(q[rest + j2] | q[rest + 16 + j2] << 4);
    }
    free(row);
    free(q);
}

/* W [n, k] (fmt F32/F16/BF16) -> packed nibbles qs [n, k/2], fp16 d and m [n, k/32]. k % 32 == 0. */
MDK_API void mdk_q4_quantize(const void *src, int fmt, int n, int k, uint8_t *qs, uint16_t *d, uint16_t *m,
                             int nthreads) {
    qjob j = {src, fmt, n, k, qs, d, m, NULL};
    mdk_parallel((n + QROWS - 1) / QROWS, quantize_rows, &j, nthreads);
}

/* the nibble at kernel position pos of a packed row */
static inline int nib_at(const uint8_t *p, int pos, int k) {
    int full = k / 128 * 128, byte, hi;
    if (pos < full) { byte = (pos & ~127) / 2 + (pos & 63); hi = (pos & 64) != 0; }
    else if (k - full >= 64 && pos < full + 64) { byte = full / 2 + ((pos - full) & 31); hi = pos - full >= 32; }
    else { int base = k - 32, t = pos - base; byte = base / 2 + (t & 15); hi = t >= 16; }
    return hi ? p[byte] >> 4 : p[byte] & 15;
}

/* The weight a Q4 matrix stands for, fp32 [n, k] in natural order. */
MDK_API void mdk_q4_dequantize(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int n, int k, float *out) {
    int nb = k / 32;
    for (int r = 0; r < n; r++) {
        const uint8_t *p = qs + (size_t)r * (k / 2);
        float *o = out + (size_t)r * k;
        for (int pos = 0; pos < k; pos++) {
            int i = elem_at(pos, k);
            o[i] = (float)nib_at(p, pos, k) * mdk_h2f(d[(size_t)r * nb + i / 32]) + mdk_h2f(m[(size_t)r * nb + i / 32]);
        }
    }
}

/* ---------------- dot products: one row of W against one token ---------------- */
static float tail32(const uint8_t *qs, const int8_t *xq, float sc) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += (qs[j] & 15) * xq[j] + (qs[j] >> 4) * xq[16 + j];
    return (float)s * sc;
}

static float dot_c(const uint8_t *qs, const float *sc, const mdk_q8 *a, int k) {
    int full = k / 128 * 128, done = 0;
    float r = 0.f;
    for (int g = 0; g < full; g += 128, done += 128) {
        const uint8_t *p = qs + g / 2;
        int s[4] = {0, 0, 0, 0};
        for (int i = 0; i < 64; i++) {
            int odd = (i >> 2) & 1;
            s[odd] += (p[i] & 15) * a->q[g + i];
            s[2 + odd] += (p[i] >> 4) * a->q[g + 64 + i];
        }
        for (int b = 0; b < 4; b++) r += (float)s[b] * sc[g / 32 + b];
    }
    if (k - done >= 64) {
        const uint8_t *p = qs + done / 2;
        int s[2] = {0, 0};
        for (int i = 0; i < 64; i++) {
            int nib = i < 32 ? p[i] & 15 : p[i - 32] >> 4;
            s[(i >> 2) & 1] += nib * a->q[done + i];
        }
        r += (float)s[0] * sc[done / 32] + (float)s[1] * sc[done / 32 + 1];
        done += 64;
    }
    if (k - done == 32) r += tail32(qs + done / 2, a->q + done, sc[done / 32]);
    return r;
}

#if MDK_X86
MDK_TARGET("avx2,fma,f16c")
static float dot_avx2(const uint8_t *qs, const float *sc, const mdk_q8 *a, int k) {
    int G = k / 128, done = 128 * G;
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *x = a->q + 128 * g;
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32));
        __m256i ia = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v0, mask), _mm256_loadu_si256((const __m256i *)x)), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v1, mask), _mm256_loadu_si256((const __m256i *)(x + 32))), ones));
        __m256i ib = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), mask),
                                                   _mm256_loadu_si256((const __m256i *)(x + 64))), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), mask),
                                                   _mm256_loadu_si256((const __m256i *)(x + 96))), ones));
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(sc + 4 * g))), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib), _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(sc + 4 * g + 2))), acc1);
    }
    if (k - done >= 64) {
        const int8_t *x = a->q + done;
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + done / 2));
        __m256i i0 = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, mask), _mm256_loadu_si256((const __m256i *)x)), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask),
                                                   _mm256_loadu_si256((const __m256i *)(x + 32))), ones));
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(sc + done / 32))), acc0);
        done += 64;
    }
    __m256 s = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    if (k - done == 32) r += tail32(qs + done / 2, a->q + done, sc[done / 32]);
    return r;
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c")
static float dot_avx512(const uint8_t *qs, const float *sc, const mdk_q8 *a, int k) {
    int G = k / 128, done = 128 * G;
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * g));
        __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        __m512i ia = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512((const void *)(a->q + 128 * g)));
        __m512i ib = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512((const void *)(a->q + 128 * g + 64)));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc + 4 * g))), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib), _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc + 4 * g + 2))), acc1);
    }
    if (k - done >= 64) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + done / 2));
        const __m256i m8 = _mm256_set1_epi8(0x0f);
        __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m8)),
                                       _mm256_and_si256(_mm256_srli_epi16(v, 4), m8), 1);
        __m512i i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)(a->q + done)));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_castpd_ps(_mm512_set1_pd(*(const double *)(sc + done / 32))), acc0);
        done += 64;
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (k - done == 32) r += tail32(qs + done / 2, a->q + done, sc[done / 32]);
    return r;
}

/* sc[b] = d[b] * dx[b] for every block; returns sum(m[b] * sx[b]) (the minimum term) */
MDK_TARGET("avx512f,avx512vl,avx2,fma,f16c")
static float scales_avx512(const uint16_t *d, const uint16_t *m, const mdk_q8 *a, int nb, float *sc) {
    __m512 mt = _mm512_setzero_ps();
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + b)));
        _mm512_storeu_ps(sc + b, _mm512_mul_ps(dv, _mm512_loadu_ps(a->dx + b)));
        mt = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + b))), _mm512_loadu_ps(a->sx + b), mt);
    }
    float r = _mm512_reduce_add_ps(mt);
    for (; b < nb; b++) {
        sc[b] = mdk_h2f(d[b]) * a->dx[b];
        r += mdk_h2f(m[b]) * a->sx[b];
    }
    return r;
}

MDK_TARGET("avx2,fma,f16c")
static float scales_avx2(const uint16_t *d, const uint16_t *m, const mdk_q8 *a, int nb, float *sc) {
    __m256 mt = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b)));
        _mm256_storeu_ps(sc + b, _mm256_mul_ps(dv, _mm256_loadu_ps(a->dx + b)));
        mt = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b))), _mm256_loadu_ps(a->sx + b), mt);
    }
    float t[8], r = 0.f;
    _mm256_storeu_ps(t, mt);
    for (int i = 0; i < 8; i++) r += t[i];
    for (; b < nb; b++) {
        sc[b] = mdk_h2f(d[b]) * a->dx[b];
        r += mdk_h2f(m[b]) * a->sx[b];
    }
    return r;
}
#endif

static float scales_c(const uint16_t *d, const uint16_t *m, const mdk_q8 *a, int nb, float *sc) {
    float r = 0.f;
    for (int b = 0; b < nb; b++) {
        sc[b] = mdk_h2f(d[b]) * a->dx[b];
        r += mdk_h2f(m[b]) * a->sx[b];
    }
    return r;
}

#define MAX_BLOCKS 4096 /* k up to 131072 */

/* y[0..r1-r0) = rows r0..r1-1 of W (MDK_Q4) dotted with one quantised token */
void mdk_q4_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    float sc[MAX_BLOCKS];
    int k = w->k, nb = k / 32;
    const uint8_t *qs = (const uint8_t *)w->w;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = qs + (size_t)r * (k / 2);
        const uint16_t *d = w->d + (size_t)r * nb, *m = w->m + (size_t)r * nb;
#if MDK_X86
        if (mdk_path == MDK_PATH_AVX512) { float mt = scales_avx512(d, m, a, nb, sc); y[r - r0] = dot_avx512(q, sc, a, k) + mt; continue; }
        if (mdk_path == MDK_PATH_AVX2) { float mt = scales_avx2(d, m, a, nb, sc); y[r - r0] = dot_avx2(q, sc, a, k) + mt; continue; }
#endif
        float mt = scales_c(d, m, a, nb, sc);
        y[r - r0] = dot_c(q, sc, a, k) + mt;
    }
}
