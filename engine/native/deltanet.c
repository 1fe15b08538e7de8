/* The Gated DeltaNet decode step (Qwen3-Next / Qwen3.5-MoE linear-attention layers): one token of one
 * sequence from its input projections' outputs to the gated RMSNorm (out_proj is applied outside).
 *
 * The math is transformers' Qwen3_5MoeGatedDeltaNet for one cached decode token (causal_conv1d_update's
 * torch path, torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel, Qwen3_5MoeRMSNormGated):
 *   y = silu(depthwise causal conv of each channel's last K inputs);  q, k, v = split(y)
 *   q, k L2-normalised per head (1e-6 inside the root), q /= sqrt(Dk)
 *   per value head h, key head h / (Hv/Hk):  g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
 *     S = exp(g) S;  delta = (v - S^T k) beta;  S += k delta^T;  o = S^T q
 *   out[h] = o / sqrt(mean(o^2) + eps) * norm_w * silu(z[h])
 *
 * Memory: the state S [Hv, Dk, Dv] fp32 is the step's traffic (2 MiB a layer in Qwen3.5-35B-A3B), so
 * each head's S is read from memory once and written once. S^T k needs all of S before the update can
 * start, but the output does not need the updated S: with S' = exp(g) S the decayed state,
 *   o = (S' + k delta^T)^T q = S'^T q + delta (k . q),
 * so one read pass sums S^T k and S^T q together (prefetching ahead), and one read-write pass over the
 * head (64 KiB at Dk = Dv = 128, still in L2) stores exp(g) S + k delta^T.
 *
 * Two parallel phases on the pool: (A) conv, silu and the q/k norms by key head (its q and k channels)
 * and by value head (its v channels), each shifting its own channels' conv history, in runs of heads
 * (4 tasks a thread); (B) the state and the output, one task per value head. The hot loops exist for
 * AVX-512 (16 lanes, masked tails), AVX2 (8 lanes) and portable C, chosen at run time by mdk_path;
 * their sums are in a different order from torch's, equal to ~1e-7 relative.
 *
 * Measured at Qwen3.5-35B-A3B's size (2 MiB of state) on a 2-core Zen 5 VM, one call, 1 / 2 threads:
 * AVX-512 45 / 25 us with the state in cache, 84 / 66 us from memory (40 layers' states in turn); a
 * memcpy of 2 MiB (the same 4 MiB of traffic) over the same pool 41 / 20 and 95 / 88 us. AVX2 63 / 36
 * and 98 / 70 us; portable C 149 / 80 and 173 / 105 us; the torch reference ~3.2 ms.
 */
#include "mdk.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#if MDK_X86
#include <immintrin.h>
#endif

#define MAXD 1024  /* the largest head dim (Dk, Dv): a task's per-head vectors are on its stack */

typedef struct {
    int Hk, Dk, Hv, Dv, K, tiled;
    const float *qkv, *conv_w, *a, *b, *A_log, *dt_bias, *z, *norm_w;
    float eps;
    float *conv, *state, *out;
    float *qk;  /* [2, Hk, Dk]: phase A's normalised q (times 1/sqrt(Dk)), then k; phase A puts v in out */
    int ntasks; /* phase A's */
} dn_ctx;

/* ---------------- portable C ---------------- */

static float dot8(const float *a, const float *b, int n) {  /* eight partial sums: vectorises */
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float s = 0.f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int u = 0; u < 8; u++) s += acc[u];
    return s;
}

static float softplus1(float x) { return x > 20.f ? x : log1pf(expf(x)); }  /* torch's, threshold 20 */

/* The conv for K = 4 (the models' size) over n channels, fused with the history's shift: y = h0 w0 + h1 w1
 * + h2 w2 + x w3, then the history becomes h1 h2 x. Written once, compiled per target: GCC vectorises
 * the strided loads with permutes (8192 channels: 3.0 us AVX-512, 4.9 AVX2, 9.5 C, one thread). No FMA
 * contraction in ISO C mode, so the three give the same bits. */
#define CONV4_BODY                                                                               \
    for (int i = 0; i < n; i++) {                                                                \
        float h0 = hist[3 * i], h1 = hist[3 * i + 1], h2 = hist[3 * i + 2], xi = x[i];           \
        y[i] = h0 * w[4 * i] + h1 * w[4 * i + 1] + h2 * w[4 * i + 2] + xi * w[4 * i + 3];        \
        hist[3 * i] = h1;                                                                        \
        hist[3 * i + 1] = h2;                                                                    \
        hist[3 * i + 2] = xi;                                                                    \
    }

static void conv4_c(const float *x, const float *w, float *hist, float *y, int n) { CONV4_BODY }

static void silu_c(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = x[i] / (1.f + expf(-x[i]));
}

/* kv = S^T k, qs = S^T q for one head's S [Dk, Dv]: rows outer, so each row is read once */
static void colsums_c(const float *S, int Dk, int Dv, const float *k, const float *q, float *kv, float *qs) {
    for (int j = 0; j < Dv; j++) kv[j] = qs[j] = 0.f;
    for (int i = 0; i < Dk; i++) {
        const float *row = S + (size_t)i * Dv;
        float ki = k[i], qi = q[i];
        for (int j = 0; j < Dv; j++) { kv[j] += row[j] * ki; qs[j] += row[j] * qi; }
    }
}

/* S = e S + k delta^T */
static void update_c(float *S, int Dk, int Dv, float e, const float *k, const float *delta) {
    for (int i = 0; i < Dk; i++) {
        float *row = S + (size_t)i * Dv, ki = k[i];
        for (int j = 0; j < Dv; j++) row[j] = row[j] * e + ki * delta[j];
    }
}

#if MDK_X86
/* ---------------- AVX2 ---------------- */

/* exp(x), x clamped to [-87, 88]: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p the degree-7 Taylor
 * polynomial (relative error under 2e-8 on that range), 2^n built in the exponent bits */
MDK_TARGET("avx2,fma")
static MDK_INLINE __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  /* ln2 in two parts: exact n * hi */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.f / 5040.f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

MDK_TARGET("avx2,fma")
static void conv4_avx2(const float *x, const float *w, float *hist, float *y, int n) { CONV4_BODY }

MDK_TARGET("avx2,fma")
static void silu_avx2(const float *x, float *y, int n) {
    const __m256 one = _mm256_set1_ps(1.f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), v)))));
    }
    silu_c(x + i, y + i, n - i);
}

/* colsums with 8 lanes: 16 registers cannot hold both sums of a 128-column row, so the sums stay in kv
 * and qs (L1) and four rows go through at once (k and q of the four in registers): each 8 columns
 * cost two loads and two stores of the sums for eight FMAs. The rows 16 ahead are prefetched: without
 * that, reading a 2 MiB state from memory took 120 us against 62 with it (a plain AVX2 read of it 50;
 * one thread, Zen 5); column blocks with the sums in registers were no faster (four strided sweeps) */
MDK_TARGET("avx2,fma")
static void colsums_avx2(const float *S, int Dk, int Dv, const float *k, const float *q, float *kv, float *qs) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(Dv % 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int full = Dv - Dv % 8;
    for (int j = 0; j < Dv; j++) kv[j] = qs[j] = 0.f;
    int i = 0;
    for (; i + 4 <= Dk; i += 4) {
        const float *r0 = S + (size_t)i * Dv, *r1 = r0 + Dv, *r2 = r1 + Dv, *r3 = r2 + Dv;
        __m256 k0 = _mm256_broadcast_ss(k + i), k1 = _mm256_broadcast_ss(k + i + 1), k2 = _mm256_broadcast_ss(k + i + 2),
               k3 = _mm256_broadcast_ss(k + i + 3), q0 = _mm256_broadcast_ss(q + i), q1 = _mm256_broadcast_ss(q + i + 1),
               q2 = _mm256_broadcast_ss(q + i + 2), q3 = _mm256_broadcast_ss(q + i + 3);
        const char *ahead = (const char *)(r0 + (i + 20 <= Dk ? 16 : 0) * (size_t)Dv);  /* rows i+16..i+19 */
        for (int j = 0; j < Dv; j += 8) {
            const int tail = j == full;
            if (!(j & 15)) {
                _mm_prefetch(ahead + 4 * j, _MM_HINT_T0);
                _mm_prefetch(ahead + 4 * (j + Dv), _MM_HINT_T0);
                _mm_prefetch(ahead + 4 * (j + 2 * Dv), _MM_HINT_T0);
                _mm_prefetch(ahead + 4 * (j + 3 * Dv), _MM_HINT_T0);
            }
            __m256 s0 = tail ? _mm256_maskload_ps(r0 + j, m) : _mm256_loadu_ps(r0 + j);
            __m256 s1 = tail ? _mm256_maskload_ps(r1 + j, m) : _mm256_loadu_ps(r1 + j);
            __m256 s2 = tail ? _mm256_maskload_ps(r2 + j, m) : _mm256_loadu_ps(r2 + j);
            __m256 s3 = tail ? _mm256_maskload_ps(r3 + j, m) : _mm256_loadu_ps(r3 + j);
            __m256 ak = tail ? _mm256_maskload_ps(kv + j, m) : _mm256_loadu_ps(kv + j);
            __m256 aq = tail ? _mm256_maskload_ps(qs + j, m) : _mm256_loadu_ps(qs + j);
            ak = _mm256_fmadd_ps(s3, k3, _mm256_fmadd_ps(s2, k2, _mm256_fmadd_ps(s1, k1, _mm256_fmadd_ps(s0, k0, ak))));
            aq = _mm256_fmadd_ps(s3, q3, _mm256_fmadd_ps(s2, q2, _mm256_fmadd_ps(s1, q1, _mm256_fmadd_ps(s0, q0, aq))));
            if (tail) {
                _mm256_maskstore_ps(kv + j, m, ak);
                _mm256_maskstore_ps(qs + j, m, aq);
            } else {
                _mm256_storeu_ps(kv + j, ak);
                _mm256_storeu_ps(qs + j, aq);
            }
        }
    }
    for (; i < Dk; i++) {  /* the last Dk % 4 rows */
        const float *row = S + (size_t)i * Dv;
        for (int j = 0; j < Dv; j++) { kv[j] += row[j] * k[i]; qs[j] += row[j] * q[i]; }
    }
}

MDK_TARGET("avx2,fma")
static void update_avx2(float *S, int Dk, int Dv, float e, const float *k, const float *delta) {
    const __m256 ev = _mm256_set1_ps(e);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(Dv % 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int full = Dv - Dv % 8;
    for (int i = 0; i < Dk; i++) {
        float *row = S + (size_t)i * Dv;
        __m256 ki = _mm256_broadcast_ss(k + i);
        for (int j = 0; j < full; j += 8)
            _mm256_storeu_ps(row + j, _mm256_fmadd_ps(ki, _mm256_loadu_ps(delta + j), _mm256_mul_ps(_mm256_loadu_ps(row + j), ev)));
        if (full < Dv) {
            __m256 s = _mm256_fmadd_ps(ki, _mm256_maskload_ps(delta + full, m), _mm256_mul_ps(_mm256_maskload_ps(row + full, m), ev));
            _mm256_maskstore_ps(row + full, m, s);
        }
    }
}

/* ---------------- AVX-512 ---------------- */
#define A512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"

/* exp(x) as attention.c's (x >= -87 here too; a large x gives inf through scalef, as silu wants) */
MDK_TARGET(A512)
static MDK_INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

MDK_TARGET(A512)
static void conv4_512(const float *x, const float *w, float *hist, float *y, int n) { CONV4_BODY }

MDK_TARGET(A512)
static void silu_512(const float *x, float *y, int n) {
    const __m512 one = _mm512_set1_ps(1.f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(v, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
    }
}

/* colsums for columns j0..j0+w-1 (w <= 128) in eight vectors of 16: 16 sums in registers, each row's
 * 512 bytes read once, the row 16 ahead prefetched. `masked` (a constant at each call) loads the last,
 * partial block with lane masks (a vector entirely past Dv loads nothing: masked loads don't fault);
 * full blocks load plainly: masked loads from memory were slow (a 2 MiB state, one thread, Zen 5:
 * 114 us masked, 70 plain, 47 plain with the prefetch, a plain read of it 45) */
MDK_TARGET(A512)
static MDK_INLINE void cols_512(const float *S, int Dk, int Dv, int j0, int w, const float *k, const float *q,
                                float *kv, float *qs, const int masked) {
    __mmask16 m[8];
    __m512 ak[8], aq[8];
    for (int u = 0; u < 8; u++) {
        int left = w - 16 * u;
        m[u] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        ak[u] = aq[u] = _mm512_setzero_ps();
    }
    const float *row = S + j0;
    for (int i = 0; i < Dk; i++, row += Dv) {
        __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
        const char *ahead = (const char *)(row + (i + 16 < Dk ? 16 : 0) * (size_t)Dv);  /* row i+16 */
        for (int u = 0; u < 8; u++) {
            if (!masked || u * 16 < w) _mm_prefetch(ahead + 64 * u, _MM_HINT_T0);
            __m512 s = masked ? _mm512_maskz_loadu_ps(m[u], row + 16 * u) : _mm512_loadu_ps(row + 16 * u);
            ak[u] = _mm512_fmadd_ps(s, ki, ak[u]);
            aq[u] = _mm512_fmadd_ps(s, qi, aq[u]);
        }
    }
    for (int u = 0; u < 8; u++) {
        _mm512_mask_storeu_ps(kv + j0 + 16 * u, m[u], ak[u]);
        _mm512_mask_storeu_ps(qs + j0 + 16 * u, m[u], aq[u]);
    }
}

MDK_TARGET(A512)
static void colsums_512(const float *S, int Dk, int Dv, const float *k, const float *q, float *kv, float *qs) {
    int j0 = 0;
    for (; j0 + 128 <= Dv; j0 += 128) cols_512(S, Dk, Dv, j0, 128, k, q, kv, qs, 0);
    if (j0 < Dv) cols_512(S, Dk, Dv, j0, Dv - j0, k, q, kv, qs, 1);
}

MDK_TARGET(A512)
static void update_512(float *S, int Dk, int Dv, float e, const float *k, const float *delta) {
    const __m512 ev = _mm512_set1_ps(e);
    const __mmask16 m = (__mmask16)((1u << (Dv % 16)) - 1);
    const int full = Dv - Dv % 16;
    for (int i = 0; i < Dk; i++) {
        float *row = S + (size_t)i * Dv;
        __m512 ki = _mm512_set1_ps(k[i]);
        for (int j = 0; j < full; j += 16)
            _mm512_storeu_ps(row + j, _mm512_fmadd_ps(ki, _mm512_loadu_ps(delta + j), _mm512_mul_ps(_mm512_loadu_ps(row + j), ev)));
        if (m) {
            __m512 s = _mm512_fmadd_ps(ki, _mm512_maskz_loadu_ps(m, delta + full), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + full), ev));
            _mm512_mask_storeu_ps(row + full, m, s);
        }
    }
}
#endif

/* ---------------- dispatch ---------------- */

static void conv4(const float *x, const float *w, float *hist, float *y, int n) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) { conv4_512(x, w, hist, y, n); return; }
    if (mdk_path == MDK_PATH_AVX2) { conv4_avx2(x, w, hist, y, n); return; }
#endif
    conv4_c(x, w, hist, y, n);
}

static void silu(const float *x, float *y, int n) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) { silu_512(x, y, n); return; }
    if (mdk_path == MDK_PATH_AVX2) { silu_avx2(x, y, n); return; }
#endif
    silu_c(x, y, n);
}

static void colsums(const float *S, int Dk, int Dv, const float *k, const float *q, float *kv, float *qs) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) { colsums_512(S, Dk, Dv, k, q, kv, qs); return; }
    if (mdk_path == MDK_PATH_AVX2) { colsums_avx2(S, Dk, Dv, k, q, kv, qs); return; }
#endif
    colsums_c(S, Dk, Dv, k, q, kv, qs);
}

static void update(float *S, int Dk, int Dv, float e, const float *k, const float *delta) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) { update_512(S, Dk, Dv, e, k, delta); return; }
    if (mdk_path == MDK_PATH_AVX2) { update_avx2(S, Dk, Dv, e, k, delta); return; }
#endif
    update_c(S, Dk, Dv, e, k, delta);
}

/* ---------------- the step ---------------- */

/* y[i] = channel c0 + i's conv output (before silu) for n channels, and their histories shifted by this
 * token (each row's entries one left, the input last) */
static void conv_rows(const dn_ctx *c, int c0, int n, float *y) {
    const int K = c->K, H = K - 1;
    const float *x = c->qkv + c0, *w = c->conv_w + (size_t)c0 * K;
    float *hist = c->conv + (size_t)c0 * H;
    if (K == 4) { conv4(x, w, hist, y, n); return; }
    for (int i = 0; i < n; i++) {
        float *hi = hist + (size_t)i * H, s = 0.f;
        const float *wi = w + (size_t)i * K;
        for (int j = 0; j < H; j++) s += hi[j] * wi[j];
        y[i] = s + x[i] * wi[H];
        for (int j = 0; j + 1 < H; j++) hi[j] = hi[j + 1];
        if (H > 0) hi[H - 1] = x[i];
    }
}

/* phase A, unit t: key head t's q and k (t < Hk), else value head t - Hk's v (into out) */
static void conv_unit(const dn_ctx *c, int t) {
    const int Hk = c->Hk, Dk = c->Dk, Dv = c->Dv;
    if (t >= Hk) {
        int h = t - Hk;
        float *v = c->out + (size_t)h * Dv;
        conv_rows(c, 2 * Hk * Dk + h * Dv, Dv, v);
        silu(v, v, Dv);
        return;
    }
    float y[MAXD];
    for (int part = 0; part < 2; part++) {  /* q, then k */
        float *dst = c->qk + (size_t)(part * Hk + t) * Dk;
        conv_rows(c, part * Hk * Dk + t * Dk, Dk, y);
        silu(y, y, Dk);
        float inv = 1.f / sqrtf(dot8(y, y, Dk) + 1e-6f);
        if (part == 0) inv /= sqrtf((float)Dk);
        for (int i = 0; i < Dk; i++) dst[i] = y[i] * inv;
    }
}

/* phase A, task t of c->ntasks: a run of units (a unit is ~0.1 us: one task each, the two threads'
 * fetches of the next task from one cache line cost more than the work) */
static void conv_task(void *p, int t) {
    const dn_ctx *c = (const dn_ctx *)p;
    const int units = c->Hk + c->Hv;
    for (int u = (int)((long long)t * units / c->ntasks); u < (int)((long long)(t + 1) * units / c->ntasks); u++)
        conv_unit(c, u);
}

/* phase B, task h: value head h's state update and gated-normed output */
static void state_task(void *p, int h) {
    const dn_ctx *c = (const dn_ctx *)p;
    const int Dk = c->Dk, Dv = c->Dv, kh = c->tiled ? h % c->Hk : h / (c->Hv / c->Hk);
    const float *q = c->qk + (size_t)kh * Dk, *k = c->qk + (size_t)(c->Hk + kh) * Dk;
    float *S = c->state + (size_t)h * Dk * Dv, *out = c->out + (size_t)h * Dv;  /* out holds v until the end */
    float e = expf(-expf(c->A_log[h]) * softplus1(c->a[h] + c->dt_bias[h]));
    float beta = 1.f / (1.f + expf(-c->b[h]));
    float kv[MAXD], o[MAXD], delta[MAXD];

    colsums(S, Dk, Dv, k, q, kv, o);  /* S^T k, S^T q of the undecayed S */
    float kq = dot8(k, q, Dk);
    for (int j = 0; j < Dv; j++) {
        delta[j] = (out[j] - e * kv[j]) * beta;
        o[j] = e * o[j] + delta[j] * kq;
    }
    update(S, Dk, Dv, e, k, delta);

    float inv = 1.f / sqrtf(dot8(o, o, Dv) / (float)Dv + c->eps), *gate = kv;  /* kv's space reused */
    silu(c->z + (size_t)h * Dv, gate, Dv);
    for (int j = 0; j < Dv; j++) out[j] = o[j] * inv * c->norm_w[j] * gate[j];
}

/* One token of one sequence through a Gated DeltaNet mixer, after its input projections.
 * Hk key heads of Dk, Hv value heads of Dv (Hv a multiple of Hk: value head h uses key head h / (Hv/Hk);
 * tiled != 0: key head h % Hk, the order llama.cpp's converter stores them in),
 * C = 2*Hk*Dk + Hv*Dv conv channels, K conv taps. All float32, contiguous.
 * qkv [C]      in_proj_qkv's output for this token (before the conv)
 * conv [C,K-1] the previous K-1 conv inputs of each channel, oldest first; updated in place (shift in qkv)
 * conv_w [C,K] the depthwise conv weight (transformers' conv1d.weight [C,1,K] squeezed); no bias
 * a, b [Hv]    in_proj_a's and in_proj_b's outputs; A_log, dt_bias [Hv] the layer's parameters
 * z [Hv*Dv]    in_proj_z's output (the output gate)
 * norm_w [Dv]  the gated RMSNorm's weight; eps its epsilon
 * state [Hv,Dk,Dv] the recurrent state; updated in place
 * out [Hv*Dv]  the result (then multiplied by out_proj outside this function)
 * returns 0; -1: bad sizes (a size < 1, Hv not a multiple of Hk, Dk or Dv over 1024, C*K over INT_MAX);
 * -2: out of memory */
MDK_API int mdk_deltanet_step(int Hk, int Dk, int Hv, int Dv, int K, int tiled, const float *qkv, float *conv, const float *conv_w,
                              const float *a, const float *b, const float *A_log, const float *dt_bias, const float *z,
                              const float *norm_w, float eps, float *state, float *out, int threads) {
    if (Hk < 1 || Dk < 1 || Hv < 1 || Dv < 1 || K < 1 || Hv % Hk || Dk > MAXD || Dv > MAXD ||
        2LL * Hk * Dk + (long long)Hv * Dv > INT_MAX / K)  /* channel indices are ints */
        return -1;
    float *qk = (float *)malloc((size_t)2 * Hk * Dk * sizeof(float));  /* 16 KiB at the models' sizes */
    if (!qk) return -2;
    if (threads < 1) threads = 1;
    int na = Hk + Hv < 4 * threads ? Hk + Hv : 4 * threads;
    dn_ctx c = {Hk, Dk, Hv, Dv, K, tiled != 0, qkv, conv_w, a, b, A_log, dt_bias, z, norm_w, eps, conv, state, out, qk, na};
    mdk_parallel(na, conv_task, &c, threads);
    mdk_parallel(Hv, state_task, &c, threads);
    free(qk);
    return 0;
}
