/* One decode step (one token) of a Mixtral-style model on the CPU, all layers in one call.
 *
 * Shapes: D hidden, H query heads, G kv heads, Hd head dim, P cached positions (pos + 1 after the
 * write), E experts, K top-k. Per layer, as engine/model.py does it in torch:
 *   h = rms(x) * ln1 (rounded to the model dtype);  qkv = Wqkv . h;  q/k norms and clip where the
 *   family has them (Qwen3-MoE, OLMoE);  rope on q and k;
 *   k, v -> cache[pos] (rounded to the cache's format);  att = softmax(q . K / sqrt(Hd)) . V over the
 *   window, in fp32;  x += Wo . att;
 *   h = rms(x) * ln2;  x += moe(h)   (mdk_moe: route, experts, weighted sum)
 * The residual x stays in its own format (fp32, or the model dtype) and is rounded after each add,
 * as torch does. Python calls this only when every layer's experts are native CPU experts.
 */
#include "mdk.h"

#include <math.h>
#include <string.h>

#if MDK_X86
#include <immintrin.h>
#endif

int mdk_moe(const mdk_expert *const *table, int E, const mdk_matrix *router, int K, int logit_fmt,
            const void *x, int x_fmt, int T, void *out, int out_fmt, int32_t *idx, float *wts, int nthreads);

typedef struct {
    const void *ln1, *ln2;          /* [D] in norm_fmt */
    mdk_matrix wqkv, wo;            /* [(H+2G)Hd, D], [D, H*Hd] */
    const mdk_expert *const *experts;  /* [E] */
    mdk_matrix router;              /* [E, D] */
    void *k, *v;                    /* this layer's cache [G, ctx, Hd] in the model's kv_fmt */
    const float *q_norm, *k_norm;   /* RMSNorm weights of q and k (qk_norm 1: [Hd]; 2: [H*Hd], [G*Hd]) */
} mdk_layer;

typedef struct {
    int layers, D, H, G, Hd, ctx, E, K, window;  /* window 0: none */
    float eps;
    int dtype, resid_fmt, norm_fmt;
    const mdk_layer *layer;
    const void *norm;               /* final norm [D] (norm_fmt) */
    mdk_matrix lm_head;             /* [V, D] */
    int qk_norm;                    /* 0 none; 1 RMSNorm of each q and k head (Qwen3-MoE); 2 of all of q, of all of k (OLMoE) */
    float clip;                     /* > 0: q, k, v clamped to +-clip after the norms (OLMoE's clip_qkv) */
    int kv_fmt;                     /* the KV cache's format: MDK_F32, MDK_BF16 or MDK_F16 */
} mdk_model;

/* v[0..n) = w * (v / rms(v)), in fp32 as the torch forward does it in attention's dtype */
static void rms_inplace(float *v, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) v[i] = w[i] * (v[i] * r);
}

/* y [B, n] = x [B, k] . W^T for B tokens: tasks are row ranges, and inside a task each block of 16
 * rows serves every token before the next is read, so the weights cross the memory bus once */
typedef struct { const mdk_matrix *w; const float *x; const uint16_t *xbf; float *y; int rows, B; } gemv_ctx;

static void gemv_task(void *c, int t) {
    gemv_ctx *g = (gemv_ctx *)c;
    int n = g->w->n, k = g->w->k, a = t * g->rows, b = a + g->rows < n ? a + g->rows : n;
    if (g->B == 1) {
        mdk_dense_rows(g->w, a, b, g->x, g->xbf, g->y + a);
        return;
    }
    for (int r = a; r < b; r += 16) {
        int re = r + 16 < b ? r + 16 : b;
        for (int tk = 0; tk < g->B; tk += 4) {
            int nt = g->B - tk < 4 ? g->B - tk : 4;
            const float *xs[4];
            const uint16_t *xb[4];
            float *ys[4];
            for (int t = 0; t < nt; t++) {
                xs[t] = g->x + (size_t)(tk + t) * k;
                xb[t] = g->xbf ? g->xbf + (size_t)(tk + t) * k : NULL;
                ys[t] = g->y + (size_t)(tk + t) * n + r;
            }
            mdk_dense_rows_multi(g->w, r, re, xs, g->xbf ? xb : NULL, nt, ys);
        }
    }
}

static void gemv(const mdk_matrix *w, const float *x, const uint16_t *xbf, float *y, int B, int nthreads) {
    int tasks = 4 * nthreads, rows = (w->n + tasks - 1) / tasks;  /* see rows_per_task in moe.c */
    if (rows < 64) rows = 64;
    gemv_ctx g = {w, x, xbf, y, rows, B};
    mdk_parallel((w->n + rows - 1) / rows, gemv_task, &g, nthreads);
}

/* h = rms(x) * w, in the model dtype's values (hf fp32; hb the same as bf16 when dtype is bf16) */
static void rmsnorm(const float *x, const void *w, int wfmt, int D, float eps, int dtype, float *hf, uint16_t *hb) {
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float r = 1.f / sqrtf((float)(ss / D) + eps);
    for (int i = 0; i < D; i++) {
        float wi = wfmt == MDK_F32 ? ((const float *)w)[i]
                   : wfmt == MDK_F16 ? mdk_h2f(((const uint16_t *)w)[i]) : mdk_bf2f(((const uint16_t *)w)[i]);
        hf[i] = mdk_round_to(dtype, wi * mdk_round_to(dtype, x[i] * r));
        if (hb) hb[i] = mdk_f2bf(hf[i]);
    }
}

typedef struct {
    const mdk_model *m;
    const float *q;        /* [B, H, Hd] after rope */
    char *const *k, *const *v;   /* per token: its sequence's cache for this layer [G, ctx, Hd] (kv_fmt) */
    const int *first, *last;     /* per token: key positions first..last */
    float *att;            /* [B, H, Hd] */
    float *scores;         /* [B, H, ctx] */
} attn_ctx;

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

/* One token's attention for the query heads of kv group g (they share its keys and values):
 * att[h] = softmax(q[h] . K / sqrt(Hd)) . V over key positions first..last. Portable C; rows of
 * a 16-bit cache are widened into row (Hd floats) one at a time. */
static void attn_group_c(const mdk_model *m, const float *q, const char *kb, const char *vb, int first, int last,
                         float *scores, float *att, int h0, int hpg) {
    int Hd = m->Hd;
    size_t rb = (size_t)Hd * (m->kv_fmt == MDK_F32 ? 4 : 2);
    float scale = 1.f / sqrtf((float)Hd), row[1024];
    for (int h = h0; h < h0 + hpg; h++) {
        float *s = scores + (size_t)h * m->ctx, mx = -INFINITY;
        for (int j = first; j <= last; j++) {
            mdk_load_row(m->kv_fmt, kb + (size_t)j * rb, row, Hd);
            s[j] = dot8(q + (size_t)h * Hd, row, Hd) * scale;
            if (s[j] > mx) mx = s[j];
        }
        float sum = 0.f;
        for (int j = first; j <= last; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
        float *o = att + (size_t)h * Hd, inv = 1.f / sum;
        for (int i = 0; i < Hd; i++) o[i] = 0.f;
        for (int j = first; j <= last; j++) {
            mdk_load_row(m->kv_fmt, vb + (size_t)j * rb, row, Hd);
            float p = s[j] * inv;
            for (int i = 0; i < Hd; i++) o[i] += p * row[i];
        }
    }
}

#if MDK_X86
/* The same with AVX-512 (Hd a multiple of 16, at most 256): each key and value row is loaded once
 * for all the group's heads. (Compiled for the baseline ISA, the C version took 11% of a 4-stream
 * demo step at ~65 positions, and more as the context grows.) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE __m512 kv16(const char *row, int i, int fmt) {  /* 16 cache values from element i, as fp32 */
    if (fmt == MDK_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (fmt == MDK_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void attn_group_avx512(const mdk_model *m, const float *q, const char *kb, const char *vb, int first,
                              int last, float *scores, float *att, int h0, int hpg) {
    int Hd = m->Hd, nv = Hd / 16, fmt = m->kv_fmt;
    size_t rb = (size_t)Hd * (fmt == MDK_F32 ? 4 : 2);
    float scale = 1.f / sqrtf((float)Hd), mx[16], inv[16];
    for (int h = 0; h < hpg; h++) mx[h] = -INFINITY;
    for (int j = first; j <= last; j++) {
        const char *kj = kb + (size_t)j * rb;
        __m512 kr[16];
        for (int v = 0; v < nv; v++) kr[v] = kv16(kj, 16 * v, fmt);
        for (int h = 0; h < hpg; h++) {
            const float *qh = q + (size_t)(h0 + h) * Hd;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), kr[0]);
            for (int v = 1; v < nv; v++) a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * v), kr[v], a);
            float sc = _mm512_reduce_add_ps(a) * scale;
            scores[(size_t)(h0 + h) * m->ctx + j] = sc;
            if (sc > mx[h]) mx[h] = sc;
        }
    }
    for (int h = 0; h < hpg; h++) {
        float *s = scores + (size_t)(h0 + h) * m->ctx, sum = 0.f;
        for (int j = first; j <= last; j++) { s[j] = expf(s[j] - mx[h]); sum += s[j]; }
        inv[h] = 1.f / sum;
        float *o = att + (size_t)(h0 + h) * Hd;
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(o + 16 * v, _mm512_setzero_ps());
    }
    for (int j = first; j <= last; j++) {
        const char *vj = vb + (size_t)j * rb;
        __m512 vr[16];
        for (int v = 0; v < nv; v++) vr[v] = kv16(vj, 16 * v, fmt);
        for (int h = 0; h < hpg; h++) {
            __m512 p = _mm512_set1_ps(scores[(size_t)(h0 + h) * m->ctx + j] * inv[h]);
            float *o = att + (size_t)(h0 + h) * Hd;
            for (int v = 0; v < nv; v++)
                _mm512_storeu_ps(o + 16 * v, _mm512_fmadd_ps(p, vr[v], _mm512_loadu_ps(o + 16 * v)));
        }
    }
}

/* The 16 lane sums of v[0..15] in one vector (lane i: the sum of v[i]), by a transposed reduction:
 * ~45 shuffles and adds where 16 horizontal sums take ~130 */
#define MDK_PAIR(a, b) _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
#define MDK_QUAD(a, b) _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))), \
                                     _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))))
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE __m512 sums16(const __m512 *v) {
    __m512 w0 = MDK_QUAD(MDK_PAIR(v[0], v[1]), MDK_PAIR(v[2], v[3]));
    __m512 w1 = MDK_QUAD(MDK_PAIR(v[4], v[5]), MDK_PAIR(v[6], v[7]));
    __m512 w2 = MDK_QUAD(MDK_PAIR(v[8], v[9]), MDK_PAIR(v[10], v[11]));
    __m512 w3 = MDK_QUAD(MDK_PAIR(v[12], v[13]), MDK_PAIR(v[14], v[15]));
    __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x44), _mm512_shuffle_f32x4(w0, w1, 0xEE));
    __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(w2, w3, 0x44), _mm512_shuffle_f32x4(w2, w3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88), _mm512_shuffle_f32x4(y01, y23, 0xDD));
}
#undef MDK_PAIR
#undef MDK_QUAD

/* exp(x) for x <= 0 (softmax's shifted scores): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p the
 * degree-7 Taylor polynomial (relative error under 2e-8 on that range, below fp32's rounding) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);  /* ln2 in two parts: exact n * hi */
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

/* One query head over its kv group's keys and values, NV = Hd / 16 a constant (4 or 8: head dims
 * 64 and 128). Scores 16 positions at a time, reduced together (sums16); the softmax's exp in
 * vectors; the weighted sum of values in registers, two accumulator sets. Rows of the group are read
 * once per head; a group's rows (a few hundred KB at long contexts) stay in the core's L2. */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE void attn_head_body(const float *qh, const char *kb, const char *vb, int first, int last,
                                      float *s, float *o, int fmt, const int NV) {
    size_t rb = (size_t)NV * 16 * (fmt == MDK_F32 ? 4 : 2);
    float scale = 1.f / sqrtf((float)(NV * 16));
    __m512 q[8], mxv = _mm512_set1_ps(-INFINITY);
    for (int v = 0; v < NV; v++) q[v] = _mm512_loadu_ps(qh + 16 * v);
    int j = first;
    for (; j + 16 <= last + 1; j += 16) {
        __m512 acc[16];
        for (int t = 0; t < 16; t++) {
            const char *kj = kb + (size_t)(j + t) * rb;
            __m512 a = _mm512_mul_ps(q[0], kv16(kj, 0, fmt));
            for (int v = 1; v < NV; v++) a = _mm512_fmadd_ps(q[v], kv16(kj, 16 * v, fmt), a);
            acc[t] = a;
        }
        __m512 sc = _mm512_mul_ps(sums16(acc), _mm512_set1_ps(scale));
        _mm512_storeu_ps(s + j, sc);
        mxv = _mm512_max_ps(mxv, sc);
    }
    float mx = _mm512_reduce_max_ps(mxv);
    for (; j <= last; j++) {
        const char *kj = kb + (size_t)j * rb;
        __m512 a = _mm512_mul_ps(q[0], kv16(kj, 0, fmt));
        for (int v = 1; v < NV; v++) a = _mm512_fmadd_ps(q[v], kv16(kj, 16 * v, fmt), a);
        s[j] = _mm512_reduce_add_ps(a) * scale;
        if (s[j] > mx) mx = s[j];
    }
    __m512 mv = _mm512_set1_ps(mx), sumv = _mm512_setzero_ps();
    for (j = first; j <= last; j += 16) {
        int n = last + 1 - j < 16 ? last + 1 - j : 16;
        __mmask16 k = (__mmask16)((1u << n) - 1u);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(s + j, k, e);
        sumv = _mm512_add_ps(sumv, e);
    }
    float inv = 1.f / _mm512_reduce_add_ps(sumv);
    __m512 o0[8], o1[8];
    for (int v = 0; v < NV; v++) o0[v] = o1[v] = _mm512_setzero_ps();
    for (j = first; j + 1 <= last; j += 2) {
        const char *v0 = vb + (size_t)j * rb, *v1 = v0 + rb;
        __m512 p0 = _mm512_set1_ps(s[j]), p1 = _mm512_set1_ps(s[j + 1]);
        for (int v = 0; v < NV; v++) {
            o0[v] = _mm512_fmadd_ps(p0, kv16(v0, 16 * v, fmt), o0[v]);
            o1[v] = _mm512_fmadd_ps(p1, kv16(v1, 16 * v, fmt), o1[v]);
        }
    }
    if (j <= last) {
        const char *v0 = vb + (size_t)j * rb;
        __m512 p0 = _mm512_set1_ps(s[j]);
        for (int v = 0; v < NV; v++) o0[v] = _mm512_fmadd_ps(p0, kv16(v0, 16 * v, fmt), o0[v]);
    }
    __m512 iv = _mm512_set1_ps(inv);
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(_mm512_add_ps(o0[v], o1[v]), iv));
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void attn_head64(const float *qh, const char *kb, const char *vb, int first, int last, float *s, float *o,
                        int fmt) { attn_head_body(qh, kb, vb, first, last, s, o, fmt, 4); }
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void attn_head128(const float *qh, const char *kb, const char *vb, int first, int last, float *s, float *o,
                         int fmt) { attn_head_body(qh, kb, vb, first, last, s, o, fmt, 8); }
#endif

static void attn_task(void *c, int task) {  /* task = token * G + kv group */
    attn_ctx *a = (attn_ctx *)c;
    const mdk_model *m = a->m;
    int tk = task / m->G, g = task % m->G, Hd = m->Hd, hpg = m->H / m->G;
    const float *q = a->q + (size_t)tk * m->H * Hd;
    size_t group = (size_t)m->ctx * Hd * (m->kv_fmt == MDK_F32 ? 4 : 2);
    const char *kb = a->k[tk] + g * group, *vb = a->v[tk] + g * group;
    float *scores = a->scores + (size_t)tk * m->H * m->ctx, *att = a->att + (size_t)tk * m->H * Hd;
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512 && (Hd == 64 || Hd == 128)) {
        for (int h = g * hpg; h < (g + 1) * hpg; h++)
            (Hd == 64 ? attn_head64 : attn_head128)(q + (size_t)h * Hd, kb, vb, a->first[tk], a->last[tk],
                                                    scores + (size_t)h * m->ctx, att + (size_t)h * Hd, m->kv_fmt);
        return;
    }
    if (mdk_path == MDK_PATH_AVX512 && Hd % 16 == 0 && Hd <= 256 && hpg <= 16) {
        attn_group_avx512(m, q, kb, vb, a->first[tk], a->last[tk], scores, att, g * hpg, hpg);
        return;
    }
#endif
    attn_group_c(m, q, kb, vb, a->first[tk], a->last[tk], scores, att, g * hpg, hpg);
}

#define MAX_BATCH 64

/* One decode step for B sequences (B <= 64): token b's embedding x[b] (resid_fmt) at position pos[b]
 * of its own KV cache, whose keys and values start at kbase[b] / vbase[b] ([layers, G, ctx, Hd] fp32,
 * every cache of the same ctx). On return x holds the last layer's outputs and logits [B, V] (fp32,
 * values of the model dtype, as torch's lm_head gives) are written. cos, sin: [B, Hd] rope rows
 * (sin already signed for the rotate-half trick). The dense weights and each expert any token
 * chose are read once for all B. Returns 0, -1 (scratch memory, or B out of range), -2 (a layer's
 * expert is not a native CPU expert: the caller must not reuse this step). */
MDK_API int mdk_decode_batch(const mdk_model *m, int B, void *x, const int *pos, char *const *kbase,
                             char *const *vbase, const float *cos, const float *sin, float *logits, int nthreads) {
    int D = m->D, H = m->H, G = m->G, Hd = m->Hd, nq = (H + 2 * G) * Hd;
    if (B < 1 || B > MAX_BATCH || m->K > 64) return -1;
    size_t floats = (size_t)B * (2 * D + nq + H * Hd + D) + (size_t)B * H * m->ctx + 64;
    float *xf = (float *)mdk_scratch(8, floats * 4);
    uint16_t *hb = (uint16_t *)mdk_scratch(9, (size_t)B * (D + H * Hd + D) * 2 + 64);
    if (!xf || !hb) return -1;
    float *hf = xf + (size_t)B * D, *qkv = hf + (size_t)B * D, *att = qkv + (size_t)B * nq, *o = att + (size_t)B * H * Hd;
    float *scores = o + (size_t)B * D;
    uint16_t *attb = hb + (size_t)B * D, *hin = attb + (size_t)B * H * Hd;
    int32_t idx[MAX_BATCH * 64];
    float wts[MAX_BATCH * 64];
    char *kl[MAX_BATCH], *vl[MAX_BATCH];
    int first[MAX_BATCH];
    size_t kvsz = m->kv_fmt == MDK_F32 ? 4 : 2, layer_stride = (size_t)G * m->ctx * Hd * kvsz;
    size_t esz = m->resid_fmt == MDK_F32 ? 4 : 2;
    int use_bf = m->dtype == MDK_BF16;
    for (int b = 0; b < B; b++) {
        mdk_load_row(m->resid_fmt, (const char *)x + (size_t)b * D * esz, xf + (size_t)b * D, D);
        first[b] = m->window > 0 && pos[b] + 1 > m->window ? pos[b] - m->window + 1 : 0;
    }
    for (int l = 0; l < m->layers; l++) {
        const mdk_layer *L = &m->layer[l];
        for (int b = 0; b < B; b++) {
            rmsnorm(xf + (size_t)b * D, L->ln1, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D,
                    use_bf ? hb + (size_t)b * D : NULL);
            kl[b] = kbase[b] + l * layer_stride;
            vl[b] = vbase[b] + l * layer_stride;
        }
        gemv(&L->wqkv, hf, use_bf ? hb : NULL, qkv, B, nthreads);
        for (int b = 0; b < B; b++) {
            float *r = qkv + (size_t)b * nq;
            for (int i = 0; i < nq; i++) r[i] = mdk_round_to(m->dtype, r[i]);
            if (m->qk_norm == 1)
                for (int hd = 0; hd < H + G; hd++) rms_inplace(r + (size_t)hd * Hd, hd < H ? L->q_norm : L->k_norm, Hd, m->eps);
            else if (m->qk_norm == 2) {
                rms_inplace(r, L->q_norm, H * Hd, m->eps);
                rms_inplace(r + (size_t)H * Hd, L->k_norm, G * Hd, m->eps);
            }
            if (m->clip > 0.f)
                for (int i = 0; i < nq; i++) r[i] = fminf(fmaxf(r[i], -m->clip), m->clip);
            const float *cb = cos + (size_t)b * Hd, *sb = sin + (size_t)b * Hd;
            for (int hd = 0; hd < H + G; hd++) {  /* rope on q and k heads */
                float *v = r + (size_t)hd * Hd, tmp[1024];
                int half = Hd / 2;
                for (int i = 0; i < Hd; i++) tmp[i] = v[i] * cb[i] + v[(i + half) % Hd] * sb[i];
                memcpy(v, tmp, (size_t)Hd * 4);
            }
            for (int g = 0; g < G; g++) {  /* rounded to the cache's format, as torch's copy into it does */
                mdk_store_row(m->kv_fmt, r + (size_t)(H + g) * Hd, kl[b] + ((size_t)g * m->ctx + pos[b]) * Hd * kvsz, Hd);
                mdk_store_row(m->kv_fmt, r + (size_t)(H + G + g) * Hd, vl[b] + ((size_t)g * m->ctx + pos[b]) * Hd * kvsz, Hd);
            }
        }
        /* q of token b is its row's first H*Hd values: gather them contiguous for the tasks */
        for (int b = 1; b < B; b++) memmove(qkv + (size_t)b * H * Hd, qkv + (size_t)b * nq, (size_t)H * Hd * 4);
        attn_ctx ac = {m, qkv, kl, vl, first, pos, att, scores};
        mdk_parallel(B * G, attn_task, &ac, nthreads);
        for (int i = 0; i < B * H * Hd; i++) {
            att[i] = mdk_round_to(m->dtype, att[i]);
            if (use_bf) attb[i] = mdk_f2bf(att[i]);
        }
        gemv(&L->wo, att, use_bf ? attb : NULL, o, B, nthreads);
        for (int i = 0; i < B * D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
        for (int b = 0; b < B; b++) {
            rmsnorm(xf + (size_t)b * D, L->ln2, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D, NULL);
            mdk_store_row(m->dtype, hf + (size_t)b * D, hin + (size_t)b * D, D);
        }
        void *hin_p = m->dtype == MDK_F32 ? (void *)hf : (void *)hin;
        int rc = mdk_moe(L->experts, m->E, &L->router, m->K, m->dtype, hin_p, m->dtype, B, o, MDK_F32, idx, wts, nthreads);
        if (rc) return rc;
        for (int i = 0; i < B * D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
    }
    for (int b = 0; b < B; b++) {
        mdk_store_row(m->resid_fmt, xf + (size_t)b * D, (char *)x + (size_t)b * D * esz, D);
        rmsnorm(xf + (size_t)b * D, m->norm, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D,
                use_bf ? hb + (size_t)b * D : NULL);
    }
    gemv(&m->lm_head, hf, use_bf ? hb : NULL, logits, B, nthreads);
    if (m->dtype != MDK_F32)
        for (size_t i = 0; i < (size_t)B * m->lm_head.n; i++) logits[i] = mdk_round_to(m->dtype, logits[i]);
    return 0;
}

/* One sequence's decode step, its cache the one its layers point at (see mdk_decode_batch). */
MDK_API int mdk_decode(const mdk_model *m, void *x, int pos, const float *cos, const float *sin, float *logits,
                       int nthreads) {
    char *k = (char *)m->layer[0].k, *v = (char *)m->layer[0].v;
    return mdk_decode_batch(m, 1, x, &pos, &k, &v, cos, sin, logits, nthreads);
}
