/* A prompt's attention over its sequence's cache, flash-style (AVX-512): no n-by-n scores in memory.
 *
 * n queries at key positions q0..q0+n-1 (keys 0..S-1 of one sequence, S = q0 + n; a query sees the
 * keys at or before its own position, within `window` of it when the layer slides) for H query heads
 * over G kv groups (query head h reads group h / (H / G), as repeat_kv does). For each group the
 * keys are packed once a call into blocks of 32 (fp32, dim-major: [Hd][32]) and the values into key
 * pairs (bf16 [S/2][Hd][2] for vdpbf16ps, or fp32 rows where the CPU has no AVX512-BF16); then each
 * task takes 128 query rows (the group's heads x a run of positions) through the key blocks they see:
 * scores 8 rows x 32 keys in fp32 FMAs (exact, as torch's fp32 SDPA), the online softmax (running
 * max and sum per row, the output rescaled when the max grows), the weights times the values in
 * bf16 dot products into fp32 (the weights rounded to bf16: 2^-9 relative each) or fp32 FMAs.
 * The torch path (scaled_dot_product_attention) stays where this returns non-zero: no AVX-512, a
 * head dim other than 64/128/256, values of another width (engine/native/flash.py). A bf16 cache on a
 * CPU with AMX goes to flash_amx.c (the same method in tiles) first.
 */
#include "mdk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <malloc.h>
#endif

#if MDK_X86
#include <immintrin.h>
#include "vexp.h"

#define KB 32     /* keys a block */
#define ROWS 128  /* query rows a task */

typedef struct {
    const float *q;
    long qs;                    /* floats between one token's query rows and the next's */
    int H, G, R, Hd, n, q0, S, window, pv16, qb;
    float scale;
    const void *k, *v;
    int fmt;                    /* the cache's format: MDK_F32 / MDK_F16 / MDK_BF16 */
    long gs, ks;                /* elements between kv groups, between key rows */
    float *out;
    long os;                    /* floats between one token's output row and the next's */
    int g;                      /* the group being computed */
    float *kp;                  /* [blocks][Hd][KB] */
    void *vp;                   /* bf16 [S/2][Hd][2] or fp32 [S][Hd] */
} fl_ctx;

static void *aligned(size_t bytes) {
#if defined(_WIN32)
    return _aligned_malloc(bytes, 64);
#else
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) ? NULL : p;
#endif
}

static void aligned_free(void *p) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

static MDK_INLINE float cache_at(const void *base, int fmt, long i) {
    if (fmt == MDK_BF16) return mdk_bf2f(((const uint16_t *)base)[i]);
    if (fmt == MDK_F16) return mdk_h2f(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

static void pack_task(void *arg, int b) {  /* key block b of group c->g into kp and vp */
    const fl_ctx *c = arg;
    int Hd = c->Hd;
    long base = (long)c->g * c->gs;
    float *kp = c->kp + (long)b * Hd * KB;
    for (int j = 0; j < KB; j++) {
        int key = b * KB + j;
        long row = base + (long)key * c->ks;
        for (int d = 0; d < Hd; d++) {
            float kv = key < c->S ? cache_at(c->k, c->fmt, row + d) : 0.f;
            float vv = key < c->S ? cache_at(c->v, c->fmt, row + d) : 0.f;
            kp[d * KB + j] = kv;
            if (c->pv16) ((uint16_t *)c->vp)[(((long)key >> 1) * Hd + d) * 2 + (key & 1)] = mdk_f2bf(vv);
            else ((float *)c->vp)[(long)key * Hd + d] = vv;
        }
    }
}

/* s[r][0..31] = scale * q_r . k for 8 query rows and one key block (kp: [Hd][32]) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void scores8(const float *const *qr, const float *kp, int Hd, float scale, float *s) {
    __m512 a[8][2];
    for (int r = 0; r < 8; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int d = 0; d < Hd; d++) {
        __m512 k0 = _mm512_load_ps(kp + d * KB), k1 = _mm512_load_ps(kp + d * KB + 16);
        for (int r = 0; r < 8; r++) {
            __m512 qv = _mm512_set1_ps(qr[r][d]);
            a[r][0] = _mm512_fmadd_ps(qv, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(qv, k1, a[r][1]);
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < 8; r++) {
        _mm512_store_ps(s + r * KB, _mm512_mul_ps(a[r][0], sc));
        _mm512_store_ps(s + r * KB + 16, _mm512_mul_ps(a[r][1], sc));
    }
}

/* One row's online softmax over one block: its keys lo..hi (block-relative, inclusive) seen, the
 * running max m and sum l updated, its output row o rescaled; the weights into p (bf16 pairs or
 * fp32). Returns 0 where the row sees none of the block's keys (p left unused). */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
static int softmax_row(const float *s, int lo, int hi, float *m, float *l, float *o, int Hd, void *p, int pv16) {
    if (lo < 0) lo = 0;
    if (hi > KB - 1) hi = KB - 1;
    if (hi < lo) return 0;
    __mmask32 k = (__mmask32)((0xffffffffu >> (31 - hi)) & (0xffffffffu << lo));
    __mmask16 k0 = (__mmask16)k, k1 = (__mmask16)(k >> 16);
    __m512 s0 = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), k0, _mm512_load_ps(s));
    __m512 s1 = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), k1, _mm512_load_ps(s + 16));
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    float mnew = mx > *m ? mx : *m;
    __m512 mv = _mm512_set1_ps(mnew);
    __m512 e0 = _mm512_maskz_mov_ps(k0, exp512(_mm512_sub_ps(s0, mv)));
    __m512 e1 = _mm512_maskz_mov_ps(k1, exp512(_mm512_sub_ps(s1, mv)));
    if (mnew > *m) {
        float alpha = *m == -INFINITY ? 0.f : expf(*m - mnew);
        __m512 av = _mm512_set1_ps(alpha);
        for (int d = 0; d < Hd; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), av));
        *l *= alpha;
        *m = mnew;
    }
    *l += _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    if (pv16) {
        __m256i b0 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(e0),
            _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(e0), 16), _mm512_set1_epi32(1)))), 16));
        __m256i b1 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(e1),
            _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(e1), 16), _mm512_set1_epi32(1)))), 16));
        _mm256_store_si256((__m256i *)p, b0);  /* weights are finite and >= 0: round to nearest even */
        _mm256_store_si256((__m256i *)p + 1, b1);
    } else {
        _mm512_store_ps((float *)p, e0);
        _mm512_store_ps((float *)p + 16, e1);
    }
    return 1;
}

/* o_r += p_r . V over one block for RR rows (NV = Hd / 16 vectors a row): bf16 pairs ... */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
static MDK_INLINE void pv_bf16(int RR, int NV, float *const *o, const uint32_t *const *p, const uint16_t *vp) {
    __m512 acc[2][16];
    for (int r = 0; r < RR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_load_ps(o[r] + v * 16);
    for (int j = 0; j < KB / 2; j++) {
        const uint16_t *row = vp + (long)j * NV * 32;
        for (int r = 0; r < RR; r++) {
            __m512bh pa = (__m512bh)_mm512_set1_epi32((int)p[r][j]);
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pa, (__m512bh)_mm512_loadu_si512((const void *)(row + v * 32)));
        }
    }
    for (int r = 0; r < RR; r++)
        for (int v = 0; v < NV; v++) _mm512_store_ps(o[r] + v * 16, acc[r][v]);
}

/* ... or fp32 rows */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE void pv_f32(int RR, int NV, float *const *o, const float *const *p, const float *vf) {
    __m512 acc[2][16];
    for (int r = 0; r < RR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_load_ps(o[r] + v * 16);
    for (int j = 0; j < KB; j++) {
        const float *row = vf + (long)j * NV * 16;
        for (int r = 0; r < RR; r++) {
            __m512 pa = _mm512_set1_ps(p[r][j]);
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(row + v * 16), acc[r][v]);
        }
    }
    for (int r = 0; r < RR; r++)
        for (int v = 0; v < NV; v++) _mm512_store_ps(o[r] + v * 16, acc[r][v]);
}

#define PV_CASES(F, T, VP)                                                                   \
    do {                                                                                     \
        if (NV == 4) { if (RR == 2) F(2, 4, o, (T)p, VP); else F(1, 4, o, (T)p, VP); }       \
        else if (NV == 8) { if (RR == 2) F(2, 8, o, (T)p, VP); else F(1, 8, o, (T)p, VP); }  \
        else F(1, 16, o, (T)p, VP);                                                          \
    } while (0)

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
static void pv_block_bf16(int RR, int NV, float *const *o, const void *const *p, const uint16_t *vp) {
    PV_CASES(pv_bf16, const uint32_t *const *, vp);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void pv_block_f32(int RR, int NV, float *const *o, const void *const *p, const float *vf) {
    PV_CASES(pv_f32, const float *const *, vf);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
static void attend_task(void *arg, int t) {
    const fl_ctx *c = arg;
    int Hd = c->Hd, R = c->R, NV = Hd / 16;
    int i0 = t * c->qb, np = c->n - i0 < c->qb ? c->n - i0 : c->qb, nr = np * R;
    _Alignas(64) float o[ROWS * 256];
    _Alignas(64) float s[ROWS * KB];
    _Alignas(64) float pbuf[ROWS * KB];  /* bf16 pairs use the first half of each row's 32 floats */
    float m[ROWS], l[ROWS];
    int seen[ROWS];
    const float *qr[ROWS];
    for (int r = 0; r < nr; r++) {
        int pi = r / R, h = c->g * R + r % R;
        qr[r] = c->q + (long)(i0 + pi) * c->qs + (long)h * Hd;
        m[r] = -INFINITY;
        l[r] = 0.f;
        memset(o + (long)r * Hd, 0, sizeof(float) * Hd);
    }
    int first_pos = c->q0 + i0, last_pos = c->q0 + i0 + np - 1;
    int kmin = c->window > 0 ? first_pos - c->window + 1 : 0;
    if (kmin < 0) kmin = 0;
    for (int b = kmin / KB; b * KB <= last_pos; b++) {
        int kb0 = b * KB;
        const float *kp = c->kp + (long)b * Hd * KB;
        for (int r = 0; r < nr; r += 8) {
            const float *q8[8];
            for (int i = 0; i < 8; i++) q8[i] = qr[r + i < nr ? r + i : nr - 1];
            scores8(q8, kp, Hd, c->scale, s + (long)r * KB);
        }
        for (int r = 0; r < nr; r++) {
            int pos = c->q0 + i0 + r / R;
            int lo = (c->window > 0 ? pos - c->window + 1 : 0) - kb0, hi = pos - kb0;
            seen[r] = softmax_row(s + (long)r * KB, lo, hi, m + r, l + r, o + (long)r * Hd, Hd, pbuf + (long)r * KB, c->pv16);
        }
        const void *vblk = c->pv16 ? (const void *)((const uint16_t *)c->vp + (long)kb0 * Hd)
                                   : (const void *)((const float *)c->vp + (long)kb0 * Hd);
        int RR = NV <= 8 ? 2 : 1;
        for (int r = 0; r < nr;) {
            if (!seen[r]) { r++; continue; }
            int two = RR == 2 && r + 1 < nr && seen[r + 1];
            float *orow[2] = {o + (long)r * Hd, o + (long)(r + 1) * Hd};
            const void *prow[2] = {pbuf + (long)r * KB, pbuf + (long)(r + 1) * KB};
            if (c->pv16) pv_block_bf16(two ? 2 : 1, NV, orow, prow, vblk);
            else pv_block_f32(two ? 2 : 1, NV, orow, prow, vblk);
            r += two ? 2 : 1;
        }
    }
    for (int r = 0; r < nr; r++) {
        int pi = r / R, h = c->g * R + r % R;
        float *dst = c->out + (long)(i0 + pi) * c->os + (long)h * Hd;
        __m512 inv = _mm512_set1_ps(l[r] > 0.f ? 1.f / l[r] : 0.f);
        for (int d = 0; d < Hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_load_ps(o + (long)r * Hd + d), inv));
    }
}
#endif

/* Returns 0 when done; -1 where this CPU or build has no AVX-512 path, -2 for a shape it does not
 * take, -3 when memory for the packed keys and values is not there: the caller computes it in torch. */
MDK_API int mdk_flash(const float *q, long qs, int H, int G, int Hd, int n, int q0, int window, float scale,
                      const void *k, const void *v, int fmt, long gs, long ks, float *out, long os, int pv16,
                      int nthreads) {
#if MDK_X86
    if (mdk_path != MDK_PATH_AVX512) return -1;
    if (G <= 0 || H % G || (Hd != 64 && Hd != 128 && Hd != 256) || n <= 0 || q0 < 0 || H / G > ROWS) return -2;
    if (fmt != MDK_F32 && fmt != MDK_BF16 && fmt != MDK_F16) return -2;
    if (fmt == MDK_BF16 && pv16 && mdk_has_bf16) {  /* AMX tiles where the CPU has them (flash_amx.c) */
        int rc = mdk_flash_amx(q, qs, H, G, Hd, n, q0, window, scale, (const uint16_t *)k, (const uint16_t *)v,
                               gs, ks, out, os, nthreads);
        if (rc != -1) return rc;
    }
    fl_ctx c = {.q = q, .qs = qs, .H = H, .G = G, .R = H / G, .Hd = Hd, .n = n, .q0 = q0, .S = q0 + n,
                .window = window, .pv16 = pv16 && mdk_has_bf16, .scale = scale, .k = k, .v = v, .fmt = fmt,
                .gs = gs, .ks = ks, .out = out, .os = os};
    c.qb = ROWS / c.R;
    int blocks = (c.S + KB - 1) / KB;
    /* a call's own buffers (one group's keys and values at a time: 6 bytes a key and dim), freed
     * at its end so a long prompt's attention holds no memory after it */
    size_t kbytes = (size_t)blocks * KB * Hd * sizeof(float), vbytes = (size_t)blocks * KB * Hd * (c.pv16 ? 2 : 4);
    void *kp = aligned(kbytes), *vp = aligned(vbytes);
    if (!kp || !vp) {
        aligned_free(kp);
        aligned_free(vp);
        return -3;
    }
    c.kp = kp;
    c.vp = vp;
    int tasks = (n + c.qb - 1) / c.qb;
    for (int g = 0; g < G; g++) {
        c.g = g;
        mdk_parallel(blocks, pack_task, &c, nthreads);
        mdk_parallel(tasks, attend_task, &c, nthreads);
    }
    aligned_free(kp);
    aligned_free(vp);
    return 0;
#else
    (void)q; (void)qs; (void)H; (void)G; (void)Hd; (void)n; (void)q0; (void)window; (void)scale; (void)k;
    (void)v; (void)fmt; (void)gs; (void)ks; (void)out; (void)os; (void)pv16; (void)nthreads;
    return -1;
#endif
}
