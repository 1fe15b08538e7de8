/* Attention of one decode token over its sequence's KV cache (the native decode step's, decode.c).
 *
 * For the query heads h0..h0+hpg-1 of one kv group: att[h] = softmax(q[h] . K / sqrt(Hd)) . V over
 * key positions first..last, in fp32, the cache's rows widened from its format as they are read.
 * Three versions, chosen at run time: AVX-512 head by head for head dims 64 and 128 (scores 16
 * positions at a time with one transposed reduction, exp in vectors, the weighted values summed in
 * registers), the rows taken in blocks of 128 positions that every head of the group goes through
 * before the next block is read; AVX-512 by kv group for other multiples of 16 (each key and value
 * row loaded once for the group's heads); portable C. Measured on the demo after 896-token prompts:
 * the per-head version +15-23% at one stream over the by-group one, which was +16% over the C one
 * (benchmarks/results/concurrent_streams-prompt896-2026-12-01.md); the blocks (2026-12-04, the
 * 4-layer full-width Qwen3-30B-A3B, best decode step): after 4,096 positions 11.2-11.6 -> 8.3 ms,
 * after 16,384 14.7-18.2 -> 13.3-13.6 ms.
 * An 8-bit cache (MDK_KV8, engine/kv/int8.py) is read as it is stored: each 16 codes widened and times
 * their block's fp16 scale (the exact values torch's dequantisation gives), so a long context's
 * rows cross the memory bus at 1.0625 bytes a value instead of 2.
 */
#include "mdk.h"

#include <math.h>
#include <string.h>

#if MDK_X86
#include <immintrin.h>
#include "vexp.h"
#endif

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

/* One 8-bit row (Hd codes, then Hd/32 fp16 scales) from fp32 values: scale = absmax/127 rounded to
 * fp16, code = the nearest integer (ties to even, as torch.round) to value / scale, within +-127;
 * exactly engine/kv/int8.py pack's arithmetic, so the native step and the torch forward write the same
 * bytes. Other formats: mdk_store_row. */
void mdk_kv_store(int fmt, const float *src, void *dst, int Hd) {
    if (fmt != MDK_KV8) {
        mdk_store_row(fmt, src, dst, Hd);
        return;
    }
    int8_t *codes = (int8_t *)dst;
    char *scales = (char *)dst + Hd;
    for (int b = 0; b < Hd / 32; b++) {
        const float *x = src + 32 * b;
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.f;
        uint16_t h = mdk_f2h(d > 65504.f ? 65504.f : d);
        float s = mdk_h2f(h);
        for (int i = 0; i < 32; i++) {
            float c = s > 0.f ? nearbyintf(x[i] / s) : 0.f;
            codes[32 * b + i] = (int8_t)(c > 127.f ? 127.f : c < -127.f ? -127.f : c);
        }
        memcpy(scales + 2 * b, &h, 2);
    }
}

/* One cached row widened to fp32 (any cache format). */
static void load_kv_row(int fmt, const char *src, float *dst, int Hd) {
    if (fmt != MDK_KV8) {
        mdk_load_row(fmt, src, dst, Hd);
        return;
    }
    for (int b = 0; b < Hd / 32; b++) {
        uint16_t h;
        memcpy(&h, src + Hd + 2 * b, 2);
        float s = mdk_h2f(h);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)((const int8_t *)src)[32 * b + i] * s;
    }
}

/* One token's attention for the query heads of kv group g (they share its keys and values):
 * att[h] = softmax(q[h] . K / sqrt(Hd)) . V over key positions first..last. Portable C; rows of
 * a 16- or 8-bit cache are widened into row (Hd floats) one at a time. */
static void attn_group_c(const mdk_kv *m, const float *q, const char *kb, const char *vb, int first, int last,
                         float *scores, float *att, int h0, int hpg) {
    int Hd = m->Hd;
    size_t rb = mdk_kv_row_bytes(m->fmt, Hd);
    float scale = 1.f / sqrtf((float)Hd), row[1024];
    for (int h = h0; h < h0 + hpg; h++) {
        float *s = scores + (size_t)h * m->ctx, mx = -INFINITY;
        for (int j = first; j <= last; j++) {
            load_kv_row(m->fmt, kb + (size_t)j * rb, row, Hd);
            s[j] = dot8(q + (size_t)h * Hd, row, Hd) * scale;
            if (s[j] > mx) mx = s[j];
        }
        float sum = 0.f;
        for (int j = first; j <= last; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
        float *o = att + (size_t)h * Hd, inv = 1.f / sum;
        for (int i = 0; i < Hd; i++) o[i] = 0.f;
        for (int j = first; j <= last; j++) {
            load_kv_row(m->fmt, vb + (size_t)j * rb, row, Hd);
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
static MDK_INLINE __m512 kv16(const char *row, int i, int fmt, int Hd) {  /* 16 cache values from element i, as fp32 */
    if (fmt == MDK_F32) return _mm512_loadu_ps((const float *)row + i);
    if (fmt == MDK_KV8) {  /* 16 codes times their block's scale (the scales follow the row's Hd codes) */
        uint16_t h;
        memcpy(&h, row + Hd + 2 * (i / 32), 2);
        __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i))));
        return _mm512_mul_ps(c, _mm512_set1_ps(_cvtsh_ss(h)));
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (fmt == MDK_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void attn_group_avx512(const mdk_kv *m, const float *q, const char *kb, const char *vb, int first,
                              int last, float *scores, float *att, int h0, int hpg) {
    int Hd = m->Hd, nv = Hd / 16, fmt = m->fmt;
    size_t rb = mdk_kv_row_bytes(fmt, Hd);
    float scale = 1.f / sqrtf((float)Hd), mx[16], inv[16];
    for (int h = 0; h < hpg; h++) mx[h] = -INFINITY;
    for (int j = first; j <= last; j++) {
        const char *kj = kb + (size_t)j * rb;
        __m512 kr[16];
        for (int v = 0; v < nv; v++) kr[v] = kv16(kj, 16 * v, fmt, Hd);
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
        for (int v = 0; v < nv; v++) vr[v] = kv16(vj, 16 * v, fmt, Hd);
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


/* The query heads h0..h0+hpg-1 of one kv group over its keys and values, NV = Hd / 16 a constant (4
 * or 8: head dims 64 and 128). Scores 16 positions at a time, reduced together (sums16); the softmax's
 * exp in vectors; the weighted sum of values in registers, two accumulator sets. The keys, then the
 * values, are taken in blocks of 128 positions (32 KB of bf16 rows: the core's L1) and every head
 * goes through a block before the next is read, so a long context's rows come from memory once per
 * group, not once per head (at 16K positions a group's keys are 4 MB: eight passes over them took
 * most of a decode step). The sums are those of one head at a time, in the same order. */
#define ATT_BLOCK 128

/* An 8-bit row's block scales (Hd/32 of them, at most 4 here) as fp32 into sc[0..3]. */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE void kv8_scales(const char *row, int Hd, float *sc) {
    uint64_t h = 0;
    memcpy(&h, row + Hd, (size_t)Hd / 16);
    _mm_storeu_ps(sc, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)));
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE __m512 kv8_codes(const char *row, int i) {  /* 16 codes from element i, as fp32, unscaled */
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i))));
}

/* q . row (16 partial sums) for one key row. At 8 bits each block's partial dot is scaled once (two
 * vectors of codes, then one FMA by its scale) instead of every 16 codes being scaled as they load:
 * measured (4-layer full-width Qwen3-30B-A3B, best decode step after 16,384 positions, 2 cores) 13.2 ms
 * -> 13.0, against 11.6-12.7 ms at bf16 in the same runs (benchmarks/kv8_quality.py): the widening
 * costs about what the halved bytes save there. */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE __m512 key_dot(const __m512 *qv, const char *kj, int fmt, const int NV) {
    const int Hd = NV * 16;
    if (fmt == MDK_KV8) {
        float sc[4];
        kv8_scales(kj, Hd, sc);
        __m512 a = _mm512_setzero_ps();
        for (int b = 0; b < NV / 2; b++) {
            __m512 t = _mm512_mul_ps(qv[2 * b], kv8_codes(kj, 32 * b));
            t = _mm512_fmadd_ps(qv[2 * b + 1], kv8_codes(kj, 32 * b + 16), t);
            a = _mm512_fmadd_ps(t, _mm512_set1_ps(sc[b]), a);
        }
        return a;
    }
    __m512 a = _mm512_mul_ps(qv[0], kv16(kj, 0, fmt, Hd));
    for (int v = 1; v < NV; v++) a = _mm512_fmadd_ps(qv[v], kv16(kj, 16 * v, fmt, Hd), a);
    return a;
}

/* o += p * row for one value row; at 8 bits p times each block's scale once, then the codes. */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE void value_acc(__m512 *o, float p, const char *vj, int fmt, const int NV) {
    const int Hd = NV * 16;
    if (fmt == MDK_KV8) {
        float sc[4];
        kv8_scales(vj, Hd, sc);
        for (int b = 0; b < NV / 2; b++) {
            __m512 pb = _mm512_set1_ps(p * sc[b]);
            o[2 * b] = _mm512_fmadd_ps(pb, kv8_codes(vj, 32 * b), o[2 * b]);
            o[2 * b + 1] = _mm512_fmadd_ps(pb, kv8_codes(vj, 32 * b + 16), o[2 * b + 1]);
        }
        return;
    }
    __m512 pv = _mm512_set1_ps(p);
    for (int v = 0; v < NV; v++) o[v] = _mm512_fmadd_ps(pv, kv16(vj, 16 * v, fmt, Hd), o[v]);
}
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static MDK_INLINE void attn_heads_body(const float *q, int hpg, const char *kb, const char *vb, int first, int last,
                                       float *scores, int ctx, float *att, int fmt, const int NV) {
    const int Hd = NV * 16;
    size_t rb = mdk_kv_row_bytes(fmt, Hd);
    float scale = 1.f / sqrtf((float)(NV * 16)), mx[16], inv[16];
    __m512 mxv[16];
    for (int h = 0; h < hpg; h++) mxv[h] = _mm512_set1_ps(-INFINITY);
    for (int b = first; b <= last; b += ATT_BLOCK) {
        int end = b + ATT_BLOCK - 1 < last ? b + ATT_BLOCK - 1 : last;  /* the block's last position */
        for (int h = 0; h < hpg; h++) {
            const float *qh = q + (size_t)h * NV * 16;
            float *s = scores + (size_t)h * ctx;
            __m512 qv[8];
            for (int v = 0; v < NV; v++) qv[v] = _mm512_loadu_ps(qh + 16 * v);
            int j = b;
            for (; j + 16 <= end + 1; j += 16) {
                __m512 acc[16];
                for (int t = 0; t < 16; t++) {
                    acc[t] = key_dot(qv, kb + (size_t)(j + t) * rb, fmt, NV);
                }
                __m512 sc = _mm512_mul_ps(sums16(acc), _mm512_set1_ps(scale));
                _mm512_storeu_ps(s + j, sc);
                mxv[h] = _mm512_max_ps(mxv[h], sc);
            }
            for (; j <= end; j++) {  /* the last block's tail */
                s[j] = _mm512_reduce_add_ps(key_dot(qv, kb + (size_t)j * rb, fmt, NV)) * scale;
                mxv[h] = _mm512_mask_max_ps(mxv[h], 1, mxv[h], _mm512_set1_ps(s[j]));
            }
        }
    }
    for (int h = 0; h < hpg; h++) {
        float *s = scores + (size_t)h * ctx;
        mx[h] = _mm512_reduce_max_ps(mxv[h]);
        __m512 mv = _mm512_set1_ps(mx[h]), sumv = _mm512_setzero_ps();
        for (int j = first; j <= last; j += 16) {
            int n = last + 1 - j < 16 ? last + 1 - j : 16;
            __mmask16 k = (__mmask16)((1u << n) - 1u);
            __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv));
            e = _mm512_maskz_mov_ps(k, e);
            _mm512_mask_storeu_ps(s + j, k, e);
            sumv = _mm512_add_ps(sumv, e);
        }
        inv[h] = 1.f / _mm512_reduce_add_ps(sumv);
    }
    _Alignas(64) float part[2][16][128];  /* each head's two accumulator sets between blocks */
    memset(part, 0, sizeof(float) * 2 * 16 * 128);
    for (int b = first; b <= last; b += ATT_BLOCK) {
        int end = b + ATT_BLOCK - 1 < last ? b + ATT_BLOCK - 1 : last;
        for (int h = 0; h < hpg; h++) {
            const float *s = scores + (size_t)h * ctx;
            __m512 o0[8], o1[8];
            for (int v = 0; v < NV; v++) { o0[v] = _mm512_load_ps(part[0][h] + 16 * v); o1[v] = _mm512_load_ps(part[1][h] + 16 * v); }
            int j = b;
            for (; j + 1 <= end; j += 2) {
                const char *v0 = vb + (size_t)j * rb;
                value_acc(o0, s[j], v0, fmt, NV);
                value_acc(o1, s[j + 1], v0 + rb, fmt, NV);
            }
            if (j <= end)  /* an odd count: the last position alone (blocks are even, so only the last block) */
                value_acc(o0, s[j], vb + (size_t)j * rb, fmt, NV);
            for (int v = 0; v < NV; v++) { _mm512_store_ps(part[0][h] + 16 * v, o0[v]); _mm512_store_ps(part[1][h] + 16 * v, o1[v]); }
        }
    }
    for (int h = 0; h < hpg; h++) {
        __m512 iv = _mm512_set1_ps(inv[h]);
        for (int v = 0; v < NV; v++)
            _mm512_storeu_ps(att + (size_t)h * NV * 16 + 16 * v,
                             _mm512_mul_ps(_mm512_add_ps(_mm512_load_ps(part[0][h] + 16 * v), _mm512_load_ps(part[1][h] + 16 * v)), iv));
    }
}

/* One copy of the body per (format, head dim): the format a constant, kv16's choice is made at compile time
 * rather than in the inner loops. */
#define ATT_HEADS(name, NV)                                                                                     \
    MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")                                                     \
    static void name(const float *q, int hpg, const char *kb, const char *vb, int first, int last, float *s,   \
                     int ctx, float *o, int fmt) {                                                             \
        switch (fmt) {                                                                                         \
        case MDK_F32: attn_heads_body(q, hpg, kb, vb, first, last, s, ctx, o, MDK_F32, NV); break;             \
        case MDK_F16: attn_heads_body(q, hpg, kb, vb, first, last, s, ctx, o, MDK_F16, NV); break;             \
        case MDK_KV8: attn_heads_body(q, hpg, kb, vb, first, last, s, ctx, o, MDK_KV8, NV); break;             \
        default: attn_heads_body(q, hpg, kb, vb, first, last, s, ctx, o, MDK_BF16, NV); break;                 \
        }                                                                                                      \
    }
ATT_HEADS(attn_heads64, 4)
ATT_HEADS(attn_heads128, 8)
#undef ATT_HEADS
#endif

void mdk_attend(const mdk_kv *m, const float *q, const char *kb, const char *vb, int first, int last, int h0,
                int hpg, float *scores, float *att) {
    int Hd = m->Hd;
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512 && (Hd == 64 || Hd == 128) && hpg <= 16) {
        (Hd == 64 ? attn_heads64 : attn_heads128)(q + (size_t)h0 * Hd, hpg, kb, vb, first, last,
                                                  scores + (size_t)h0 * m->ctx, m->ctx, att + (size_t)h0 * Hd, m->fmt);
        return;
    }
    if (mdk_path == MDK_PATH_AVX512 && Hd % 16 == 0 && Hd <= 256 && hpg <= 16) {
        attn_group_avx512(m, q, kb, vb, first, last, scores, att, h0, hpg);
        return;
    }
#endif
    attn_group_c(m, q, kb, vb, first, last, scores, att, h0, hpg);
}
