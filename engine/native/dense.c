/* 16-bit (and fp32) weights times one token, fp32 accumulation.
 * AVX-512: fp16 widened by vcvtph2ps; bf16 by vdpbf16ps when the CPU has AVX512-BF16 and the
 * activation is bf16 already (exact: products of two bf16 fit fp32), else widened by a shift.
 * AVX2: the same with F16C and 8 lanes. Portable C otherwise. */
#include "mdk.h"

#if MDK_X86
#include <immintrin.h>
#endif

static float dot_c(int fmt, const void *w, const float *x, int k) {
    float s0 = 0.f, s1 = 0.f;
    int i = 0;
    if (fmt == MDK_F32) {
        const float *p = (const float *)w;
        for (; i + 1 < k; i += 2) { s0 += p[i] * x[i]; s1 += p[i + 1] * x[i + 1]; }
        for (; i < k; i++) s0 += p[i] * x[i];
    } else {
        const uint16_t *p = (const uint16_t *)w;
        for (; i < k; i++) s0 += (fmt == MDK_F16 ? mdk_h2f(p[i]) : mdk_bf2f(p[i])) * x[i];
    }
    return s0 + s1;
}

#if MDK_X86
MDK_TARGET("avx2,fma,f16c")
static float hsum256(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

MDK_TARGET("avx2,fma,f16c")
static __m256 load8(int fmt, const void *w, int i) {
    if (fmt == MDK_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i v = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (fmt == MDK_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

MDK_TARGET("avx2,fma,f16c")
static float dot_avx2(int fmt, const void *w, const float *x, int k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm256_fmadd_ps(load8(fmt, w, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load8(fmt, w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load8(fmt, w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load8(fmt, w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(load8(fmt, w, i), _mm256_loadu_ps(x + i), a0);
    float r = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return r + dot_c(fmt, fmt == MDK_F32 ? (const void *)((const float *)w + i) : (const void *)((const uint16_t *)w + i), x + i, k - i);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static __m512 load16(int fmt, const void *w, int i) {
    if (fmt == MDK_F32) return _mm512_loadu_ps((const float *)w + i);
    __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (fmt == MDK_F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static float dot_avx512(int fmt, const void *w, const float *x, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= k; i += 64) {
        a0 = _mm512_fmadd_ps(load16(fmt, w, i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load16(fmt, w, i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load16(fmt, w, i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load16(fmt, w, i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= k; i += 16) a0 = _mm512_fmadd_ps(load16(fmt, w, i), _mm512_loadu_ps(x + i), a0);
    float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    return r + dot_c(fmt, fmt == MDK_F32 ? (const void *)((const float *)w + i) : (const void *)((const uint16_t *)w + i), x + i, k - i);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
static float dot_bf16(const uint16_t *w, const uint16_t *xbf, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= k; i += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512((const void *)(w + i)), (__m512bh)_mm512_loadu_si512((const void *)(xbf + i)));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512((const void *)(w + i + 32)), (__m512bh)_mm512_loadu_si512((const void *)(xbf + i + 32)));
    }
    for (; i + 32 <= k; i += 32)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512((const void *)(w + i)), (__m512bh)_mm512_loadu_si512((const void *)(xbf + i)));
    float r = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++) r += mdk_bf2f(w[i]) * mdk_bf2f(xbf[i]);
    return r;
}

/* one row against up to four tokens: the row is loaded once for all of them (a batched step).
 * nt is a constant in each caller below, so the accumulators live in registers: with a run-time nt
 * they were kept on the stack, and 2 tokens took 3x the time of one (576x576 rows in cache) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
static MDK_INLINE void dot_bf16_tokens_body(const uint16_t *w, const uint16_t *const *xbf, const int nt, int k,
                                            float *out) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w + i));
        for (int t = 0; t < nt; t++)
            a[t] = _mm512_dpbf16_ps(a[t], wv, (__m512bh)_mm512_loadu_si512((const void *)(xbf[t] + i)));
    }
    for (int t = 0; t < nt; t++) {
        float r = _mm512_reduce_add_ps(a[t]);
        for (int j = i; j < k; j++) r += mdk_bf2f(w[j]) * mdk_bf2f(xbf[t][j]);
        out[t] = r;
    }
}

#define MDK_TOKENS(n) MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c") \
    static void dot_bf16_tokens##n(const uint16_t *w, const uint16_t *const *x, int k, float *o) { dot_bf16_tokens_body(w, x, n, k, o); }
MDK_TOKENS(2)
MDK_TOKENS(3)
MDK_TOKENS(4)
#undef MDK_TOKENS

static void dot_bf16_tokens(const uint16_t *w, const uint16_t *const *xbf, int nt, int k, float *out) {
    if (nt == 1) out[0] = dot_bf16(w, xbf[0], k);
    else (nt == 2 ? dot_bf16_tokens2 : nt == 3 ? dot_bf16_tokens3 : dot_bf16_tokens4)(w, xbf, k, out);
}

/* four rows at once: the activation is loaded once for four weight streams, and four streams per
 * thread keep more reads in flight (long rows ran at ~72% of the bandwidth one at a time) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
static void dot4_bf16(const uint16_t *w, size_t stride, const uint16_t *xbf, int k, float *y) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    const uint16_t *w0 = w, *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh x = (__m512bh)_mm512_loadu_si512((const void *)(xbf + i));
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512((const void *)(w0 + i)), x);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512((const void *)(w1 + i)), x);
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512((const void *)(w2 + i)), x);
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512((const void *)(w3 + i)), x);
    }
    y[0] = _mm512_reduce_add_ps(a0);
    y[1] = _mm512_reduce_add_ps(a1);
    y[2] = _mm512_reduce_add_ps(a2);
    y[3] = _mm512_reduce_add_ps(a3);
    for (; i < k; i++) {
        float xv = mdk_bf2f(xbf[i]);
        y[0] += mdk_bf2f(w0[i]) * xv;
        y[1] += mdk_bf2f(w1[i]) * xv;
        y[2] += mdk_bf2f(w2[i]) * xv;
        y[3] += mdk_bf2f(w3[i]) * xv;
    }
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void dot4_avx512(int fmt, const void *w, size_t stride, const float *x, int k, float *y) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(load16(fmt, w, i), xv, a0);
        a1 = _mm512_fmadd_ps(load16(fmt, w, (int)stride + i), xv, a1);
        a2 = _mm512_fmadd_ps(load16(fmt, w, 2 * (int)stride + i), xv, a2);
        a3 = _mm512_fmadd_ps(load16(fmt, w, 3 * (int)stride + i), xv, a3);
    }
    __m512 acc[4] = {a0, a1, a2, a3};
    size_t esz = fmt == MDK_F32 ? 4 : 2;
    for (int r = 0; r < 4; r++)
        y[r] = _mm512_reduce_add_ps(acc[r]) + dot_c(fmt, (const char *)w + (r * stride + i) * esz, x + i, k - i);
}

MDK_TARGET("avx2,fma,f16c")
static void dot4_avx2(int fmt, const void *w, size_t stride, const float *x, int k, float *y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(load8(fmt, w, i), xv, a0);
        a1 = _mm256_fmadd_ps(load8(fmt, w, (int)stride + i), xv, a1);
        a2 = _mm256_fmadd_ps(load8(fmt, w, 2 * (int)stride + i), xv, a2);
        a3 = _mm256_fmadd_ps(load8(fmt, w, 3 * (int)stride + i), xv, a3);
    }
    __m256 acc[4] = {a0, a1, a2, a3};
    size_t esz = fmt == MDK_F32 ? 4 : 2;
    for (int r = 0; r < 4; r++)
        y[r] = hsum256(acc[r]) + dot_c(fmt, (const char *)w + (r * stride + i) * esz, x + i, k - i);
}
#endif

/* Row r of W: rows n_lo.. come from w_hi where it is set (a mapped checkpoint's gate and up
 * tensors, two places in its file, as one w13: mdk.h) */
static inline const void *dense_row(const mdk_matrix *w, int r, size_t esz) {
    if (w->w_hi && r >= w->n_lo) return (const char *)w->w_hi + (size_t)(r - w->n_lo) * w->k * esz;
    return (const char *)w->w + (size_t)r * w->k * esz;
}

/* One row of W (F16/BF16/F32) dotted with x */
static float dot_row(const mdk_matrix *w, const void *row, const float *x, const uint16_t *xbf) {
    int k = w->k;
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512)
        return (w->fmt == MDK_BF16 && xbf && mdk_has_bf16) ? dot_bf16((const uint16_t *)row, xbf, k)
                                                           : dot_avx512(w->fmt, row, x, k);
    if (mdk_path == MDK_PATH_AVX2) return dot_avx2(w->fmt, row, x, k);
#endif
    (void)xbf;
    return dot_c(w->fmt, row, x, k);
}

/* y[0..r1-r0) = rows r0..r1-1 of W (F16/BF16/F32) dotted with x (fp32; xbf: the same in bf16, or NULL) */
void mdk_dense_rows(const mdk_matrix *w, int r0, int r1, const float *x, const uint16_t *xbf, float *y) {
    int k = w->k;
    size_t esz = w->fmt == MDK_F32 ? 4 : 2;
    int r = r0;
#if MDK_X86
    while (r + 4 <= r1 && mdk_path >= MDK_PATH_AVX2 && k >= 2048) {
        if (w->w_hi && r < w->n_lo && r + 4 > w->n_lo) {  /* 4 rows across the two parts: one by one */
            for (int e = r + 4; r < e; r++) y[r - r0] = dot_row(w, dense_row(w, r, esz), x, xbf);
            continue;
        }
        const void *row = dense_row(w, r, esz);
        if (mdk_path == MDK_PATH_AVX512 && w->fmt == MDK_BF16 && xbf && mdk_has_bf16)
            dot4_bf16((const uint16_t *)row, (size_t)k, xbf, k, y + (r - r0));
        else if (mdk_path == MDK_PATH_AVX512)
            dot4_avx512(w->fmt, row, (size_t)k, x, k, y + (r - r0));
        else
            dot4_avx2(w->fmt, row, (size_t)k, x, k, y + (r - r0));
        r += 4;
    }
#endif
    for (; r < r1; r++) y[r - r0] = dot_row(w, dense_row(w, r, esz), x, xbf);
}

/* As mdk_dense_rows for nt tokens (1..4): y[t][0..r1-r0). Where the weights and activations are
 * bf16 on an AVX512-BF16 CPU each row is read once for all of them; elsewhere token by token. */
void mdk_dense_rows_multi(const mdk_matrix *w, int r0, int r1, const float *const *x, const uint16_t *const *xbf,
                          int nt, float *const *y) {
#if MDK_X86
    if (nt > 1 && mdk_path == MDK_PATH_AVX512 && w->fmt == MDK_BF16 && xbf && xbf[0] && mdk_has_bf16) {
        float out[4];
        for (int r = r0; r < r1; r++) {
            dot_bf16_tokens((const uint16_t *)dense_row(w, r, 2), xbf, nt, w->k, out);
            for (int t = 0; t < nt; t++) y[t][r - r0] = out[t];
        }
        return;
    }
#endif
    for (int t = 0; t < nt; t++) mdk_dense_rows(w, r0, r1, x[t], xbf ? xbf[t] : NULL, y[t]);
}
