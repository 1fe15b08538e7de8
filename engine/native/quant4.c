/* 4-bit experts: quantisation, the kernel's weight layout, and Q4 x Q8 dot products.
 *
 * Grid: blocks of 32 along K, w = q * d + m with q in 0..15, d = (max - min) / 15 and m = min,
 * both stored as fp16 (llama.cpp's Q4_1 grid; the minimum lowers the error of a symmetric grid on
 * skewed blocks). The activation is quantised once per call to int8 per block of 32 (scale dx =
 * amax / 127), so the dot product is integer:  sum(w * x) = d * dx * sum(q * xq) + m * dx * sum(xq).
 *
 * Layout: rows in tiles of 16 (the last one padded with zero rows). For each tile and block of 32,
 * 320 bytes: four 64-byte vectors V0..V3, then the 16 rows' fp16 d, then their fp16 m. Byte 4r+i of
 * Vc holds row r's element 4c+i of the block in its low nibble and element 16+4c+i in its high
 * nibble. So in an integer dot product's 32-bit lanes, lane r is row r: a broadcast of 4 activation
 * bytes multiplies 16 rows at once, the 16 lane sums are the 16 rows' block sums (no horizontal
 * reduction), and the 16 row scales of the block load as one vector. (llama.cpp's repacked Q4_0
 * GEMV interleaves rows for the same reason.) One tile-block is one 320-byte stream: the layout is
 * written once when an expert is built, from the 16-bit source.
 *
 * MDK_MX4 (MXFP4, as gpt-oss is released) uses the same tiles: a nibble holds the E2M1 code, and
 * the kernels read it through MX4_Q as q = 2 * value + 12 in 0..24, unsigned as the dot product
 * wants. With d = 2^(e - 128) and m = -12 d (e the block's E8M0 exponent), q * d + m is the
 * released value exactly, so MXFP4 experts run at 4 bits without being rounded again. (maddubs
 * then sums at most 2 * 24 * 127 = 6096 per pair, 12192 with both nibbles: still no saturation.)
 */
#include "mdk.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if MDK_X86
#include <immintrin.h>
#endif

#define TB 320 /* bytes per (tile, block) */

/* E2M1 code -> q = 2 * value + 12 (values 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives) */
static const uint8_t MX4_Q[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
static const uint8_t ID_Q[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

size_t mdk_q8_bytes(int k) {
    return (size_t)k + 2 * (size_t)(k / 32) * sizeof(float) + (size_t)(k / 16) * (2 + sizeof(float)) + 128;
}

static atomic_ullong q8_gen;  /* the last mdk_q8.gen handed out */

static unsigned long long next_gen(void) { return atomic_fetch_add(&q8_gen, 1) + 1; }

void mdk_q8_init(mdk_q8 *a, void *mem, int k) {
    a->dx = (float *)mem;
    a->sx = a->dx + k / 32;
    a->q = (int8_t *)(a->sx + k / 32);
    a->s16 = (int16_t *)(a->q + k);  /* k is a multiple of 32: aligned */
    a->sxh = (float *)(a->s16 + k / 16);
    a->gen = next_gen();
}

#if MDK_X86
/* quantize_range's arithmetic 16 lanes at a time (a prompt quantises every token of every layer: the
 * scalar loop took 5 ns a value, as long as the products it feeds). The same values bit for bit: the
 * same fp32 multiply, and cvtps rounds to nearest even as lrintf does in the default mode. */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
static void quantize_range512(const float *x, int e0, int e1, mdk_q8 *a) {
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    for (int b0 = e0; b0 < e1; b0 += 32) {
        __m512 v0 = _mm512_loadu_ps(x + b0), v1 = _mm512_loadu_ps(x + b0 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        __m512 vi = _mm512_set1_ps(inv);
        __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vi)), lo), hi);
        __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vi)), lo), hi);
        _mm_storeu_si128((__m128i *)(a->q + b0), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(a->q + b0 + 16), _mm512_cvtepi32_epi8(q1));
        int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
        a->dx[b0 / 32] = dx;
        a->sx[b0 / 32] = dx * (float)(s0 + s1);
        a->s16[b0 / 16] = (int16_t)s0;
        a->s16[b0 / 16 + 1] = (int16_t)s1;
        a->sxh[b0 / 16] = dx * (float)s0;
        a->sxh[b0 / 16 + 1] = dx * (float)s1;
    }
}
#endif

/* Quantise x[e0..e1) (multiples of 32) into a, per block of 32. */
void mdk_quantize_act_range(const float *x, int k, int e0, int e1, mdk_q8 *a) {
    (void)k;
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) {
        quantize_range512(x, e0, e1, a);
        return;
    }
#endif
    for (int b0 = e0; b0 < e1; b0 += 32) {
        const float *xb = x + b0;
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            int q = (int)lrintf(xb[i] * inv);
            q = q > 127 ? 127 : (q < -127 ? -127 : q);
            a->q[b0 + i] = (int8_t)q;
            sum[i >> 4] += q;
        }
        a->dx[b0 / 32] = dx;
        a->sx[b0 / 32] = dx * (float)(sum[0] + sum[1]);
        a->s16[b0 / 16] = (int16_t)sum[0];
        a->s16[b0 / 16 + 1] = (int16_t)sum[1];
        a->sxh[b0 / 16] = dx * (float)sum[0];
        a->sxh[b0 / 16 + 1] = dx * (float)sum[1];
    }
}

void mdk_quantize_act(const float *x, int k, mdk_q8 *a) {
    mdk_quantize_act_range(x, k, 0, k, a);
    a->gen = next_gen();
}

/* ---------------- weights: quantise and repack, dequantise ---------------- */
MDK_API size_t mdk_q4_bytes(int n, int k) { return (size_t)((n + 15) / 16) * (size_t)(k / 32) * TB; }

typedef struct { const void *src; int fmt, n, k; uint8_t *out; } qjob;

static void quantize_tile(void *c, int t) {
    qjob *j = (qjob *)c;
    int k = j->k, nb = k / 32;
    float *row = (float *)malloc((size_t)k * sizeof(float));
    uint8_t *q = (uint8_t *)malloc((size_t)16 * k);
    if (!row || !q) { free(row); free(q); return; }
    size_t esz = j->fmt == MDK_F32 ? 4 : 2;
    uint8_t *tile = j->out + (size_t)t * nb * TB;
    memset(tile, 0, (size_t)nb * TB);
    for (int r = 0; r < 16 && 16 * t + r < j->n; r++) {
        mdk_load_row(j->fmt, (const char *)j->src + (size_t)(16 * t + r) * k * esz, row, k);
        uint8_t *qr = q + (size_t)r * k;
        for (int b = 0; b < nb; b++) {
            const float *w = row + 32 * b;
            float lo = w[0], hi = w[0];
            for (int i = 1; i < 32; i++) { lo = fminf(lo, w[i]); hi = fmaxf(hi, w[i]); }
            float scale = (hi - lo) / 15.f;
            if (scale < 1e-10f) scale = 1e-10f;
            uint16_t d16 = mdk_f2h(scale), m16 = mdk_f2h(lo);
            float df = mdk_h2f(d16), mf = mdk_h2f(m16);  /* quantise against the stored grid */
            for (int i = 0; i < 32; i++) {
                int v = df > 0.f ? (int)lrintf((w[i] - mf) / df) : 0;
                qr[32 * b + i] = (uint8_t)(v < 0 ? 0 : (v > 15 ? 15 : v));
            }
            uint8_t *blk = tile + (size_t)b * TB;
            memcpy(blk + 256 + 2 * r, &d16, 2);
            memcpy(blk + 288 + 2 * r, &m16, 2);
            for (int cc = 0; cc < 4; cc++)
                for (int i = 0; i < 4; i++)
                    blk[64 * cc + 4 * r + i] = (uint8_t)(qr[32 * b + 4 * cc + i] | qr[32 * b + 16 + 4 * cc + i] << 4);
        }
    }
    free(row);
    free(q);
}

/* W [n, k] (fmt F32/F16/BF16) -> the tiled layout (mdk_q4_bytes(n, k) bytes). k % 32 == 0. */
MDK_API void mdk_q4_quantize(const void *src, int fmt, int n, int k, uint8_t *out, int nthreads) {
    qjob j = {src, fmt, n, k, out};
    mdk_parallel((n + 15) / 16, quantize_tile, &j, nthreads);
}

/* MXFP4 blocks [n, k/32, 16] (two E2M1 codes a byte, the low nibble first) and E8M0 scales
 * [n, k/32] -> the tiles of MDK_MX4. Returns 0, or -1 when a block's scale has no fp16 d and m
 * (exponent outside 2^-24..2^12, or 255, E8M0's NaN): the caller then rounds that matrix to Q4. */
MDK_API int mdk_mx4_pack(const uint8_t *blocks, const uint8_t *scales, int n, int k, uint8_t *out) {
    int nb = k / 32;
    for (size_t i = 0; i < (size_t)n * nb; i++)
        if (scales[i] < 128 - 24 || scales[i] > 128 + 12) return -1;
    memset(out, 0, mdk_q4_bytes(n, k));
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            const uint8_t *src = blocks + ((size_t)r * nb + b) * 16;
            uint8_t code[32];
            for (int j = 0; j < 16; j++) { code[2 * j] = src[j] & 15; code[2 * j + 1] = src[j] >> 4; }
            uint8_t *blk = out + ((size_t)(r / 16) * nb + b) * TB;
            int rr = r % 16;
            float d = ldexpf(1.f, (int)scales[(size_t)r * nb + b] - 128);
            uint16_t d16 = mdk_f2h(d), m16 = mdk_f2h(-12.f * d);
            memcpy(blk + 256 + 2 * rr, &d16, 2);
            memcpy(blk + 288 + 2 * rr, &m16, 2);
            for (int cc = 0; cc < 4; cc++)
                for (int i = 0; i < 4; i++)
                    blk[64 * cc + 4 * rr + i] = (uint8_t)(code[4 * cc + i] | code[16 + 4 * cc + i] << 4);
        }
    return 0;
}

/* The weight a Q4 or MX4 matrix stands for, fp32 [n, k]. */
MDK_API void mdk_q4_dequantize(const uint8_t *packed, int n, int k, float *out) {
    mdk_q4_dequantize_fmt(packed, MDK_Q4, n, k, out);
}

MDK_API void mdk_q4_dequantize_fmt(const uint8_t *packed, int fmt, int n, int k, float *out) {
    const uint8_t *lut = fmt == MDK_MX4 ? MX4_Q : ID_Q;
    int nb = k / 32;
    for (int r = 0; r < n; r++) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = packed + ((size_t)(r / 16) * nb + b) * TB;
            uint16_t d16, m16;
            memcpy(&d16, blk + 256 + 2 * (r % 16), 2);
            memcpy(&m16, blk + 288 + 2 * (r % 16), 2);
            float d = mdk_h2f(d16), m = mdk_h2f(m16);
            float *o = out + (size_t)r * k + 32 * b;
            for (int cc = 0; cc < 4; cc++)
                for (int i = 0; i < 4; i++) {
                    uint8_t byte = blk[64 * cc + 4 * (r % 16) + i];
                    o[4 * cc + i] = (float)lut[byte & 15] * d + m;
                    o[16 + 4 * cc + i] = (float)lut[byte >> 4] * d + m;
                }
        }
    }
}

/* ---------------- one tile of 16 rows against one token: y[16] ---------------- */
static void tile_c(const uint8_t *tile, int nb, const mdk_q8 *a, float *y, const uint8_t *lut) {
    float acc[16] = {0};
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = tile + (size_t)b * TB;
        const int8_t *x = a->q + 32 * b;
        for (int r = 0; r < 16; r++) {
            int s = 0;
            for (int cc = 0; cc < 4; cc++)
                for (int i = 0; i < 4; i++) {
                    uint8_t byte = blk[64 * cc + 4 * r + i];
                    s += lut[byte & 15] * x[4 * cc + i] + lut[byte >> 4] * x[16 + 4 * cc + i];
                }
            uint16_t d16, m16;
            memcpy(&d16, blk + 256 + 2 * r, 2);
            memcpy(&m16, blk + 288 + 2 * r, 2);
            acc[r] += mdk_h2f(d16) * a->dx[b] * (float)s + mdk_h2f(m16) * a->sx[b];
        }
    }
    memcpy(y, acc, sizeof acc);
}

#if MDK_X86
static inline int32_t load4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

MDK_TARGET("avx2,fma,f16c")
static void tile_avx2(const uint8_t *tile, int nb, const mdk_q8 *a, float *y, const uint8_t *lut) {
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut));
#define NIB2(v) _mm256_shuffle_epi8(tab, _mm256_and_si256((v), mask))  /* nibble -> q (identity for Q4) */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = tile + (size_t)b * TB;
        const int8_t *x = a->q + 32 * b;
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int cc = 0; cc < 4; cc++) {
            __m256i xl = _mm256_set1_epi32(load4(x + 4 * cc)), xh = _mm256_set1_epi32(load4(x + 16 + 4 * cc));
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * cc));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * cc + 32));
            __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(NIB2(v0), xl),
                                          _mm256_maddubs_epi16(NIB2(_mm256_srli_epi16(v0, 4)), xh));
            __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(NIB2(v1), xl),
                                          _mm256_maddubs_epi16(NIB2(_mm256_srli_epi16(v1, 4)), xh));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
        }
        __m256 dx = _mm256_set1_ps(a->dx[b]), sx = _mm256_set1_ps(a->sx[b]);
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256)));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 272)));
        __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 288)));
        __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 304)));
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s0), dx), d0, _mm256_fmadd_ps(m0, sx, acc0));
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s1), dx), d1, _mm256_fmadd_ps(m1, sx, acc1));
    }
    _mm256_storeu_ps(y, acc0);
    _mm256_storeu_ps(y + 8, acc1);
#undef NIB2
}
/* (maddubs sums two u8*s8 products into int16: at most 2 * 15 * 127 = 3810 per pair, no saturation;
 * adding the low- and high-nibble pairs gives at most 7620.) */

/* mx is a constant in each of the two callers below, so Q4's hot path has no shuffle and no branch */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static MDK_INLINE void tile_avx512_body(const uint8_t *tile, int nb, const mdk_q8 *a,
                                                                   float *y, const int mx) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)MX4_Q));
#define NIB(v) (mx ? _mm512_shuffle_epi8(tab, _mm512_and_si512((v), mask)) : _mm512_and_si512((v), mask))
    __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = tile + (size_t)b * TB;
        const int8_t *x = a->q + 32 * b;
        __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
        __m512i i2 = _mm512_setzero_si512(), i3 = _mm512_setzero_si512();
        __m512i v0 = _mm512_loadu_si512((const void *)blk), v1 = _mm512_loadu_si512((const void *)(blk + 64));
        __m512i v2 = _mm512_loadu_si512((const void *)(blk + 128)), v3 = _mm512_loadu_si512((const void *)(blk + 192));
        i0 = _mm512_dpbusd_epi32(i0, NIB(v0), _mm512_set1_epi32(load4(x)));
        i1 = _mm512_dpbusd_epi32(i1, NIB(_mm512_srli_epi16(v0, 4)), _mm512_set1_epi32(load4(x + 16)));
        i2 = _mm512_dpbusd_epi32(i2, NIB(v1), _mm512_set1_epi32(load4(x + 4)));
        i3 = _mm512_dpbusd_epi32(i3, NIB(_mm512_srli_epi16(v1, 4)), _mm512_set1_epi32(load4(x + 20)));
        i0 = _mm512_dpbusd_epi32(i0, NIB(v2), _mm512_set1_epi32(load4(x + 8)));
        i1 = _mm512_dpbusd_epi32(i1, NIB(_mm512_srli_epi16(v2, 4)), _mm512_set1_epi32(load4(x + 24)));
        i2 = _mm512_dpbusd_epi32(i2, NIB(v3), _mm512_set1_epi32(load4(x + 12)));
        i3 = _mm512_dpbusd_epi32(i3, NIB(_mm512_srli_epi16(v3, 4)), _mm512_set1_epi32(load4(x + 28)));
        __m512i s = _mm512_add_epi32(_mm512_add_epi32(i0, i1), _mm512_add_epi32(i2, i3));
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->dx[b])), d, acc);
        accm = _mm512_fmadd_ps(m, _mm512_set1_ps(a->sx[b]), accm);
    }
    _mm512_storeu_ps(y, _mm512_add_ps(acc, accm));
#undef NIB
}

/* Up to 4 tokens against one tile: each block's nibbles are loaded and unpacked once for all of
 * them (a batched decode step or a prefill reads each weight once, and does not unpack it per token) */
MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static MDK_INLINE void tiles_avx512_body(const uint8_t *tile, int nb, const mdk_q8 *const *a, int nt, float *const *y,
                                         const int mx) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)MX4_Q));
#define NIBM(v) (mx ? _mm512_shuffle_epi8(tab, _mm512_and_si512((v), mask)) : _mm512_and_si512((v), mask))
    __m512 acc[4], accm[4];
    for (int t = 0; t < 4; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = tile + (size_t)b * TB;
        __m512i v0 = _mm512_loadu_si512((const void *)blk), v1 = _mm512_loadu_si512((const void *)(blk + 64));
        __m512i v2 = _mm512_loadu_si512((const void *)(blk + 128)), v3 = _mm512_loadu_si512((const void *)(blk + 192));
        __m512i n0 = NIBM(v0), n1 = NIBM(_mm512_srli_epi16(v0, 4)), n2 = NIBM(v1), n3 = NIBM(_mm512_srli_epi16(v1, 4));
        __m512i n4 = NIBM(v2), n5 = NIBM(_mm512_srli_epi16(v2, 4)), n6 = NIBM(v3), n7 = NIBM(_mm512_srli_epi16(v3, 4));
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        for (int t = 0; t < nt; t++) {
            const int8_t *x = a[t]->q + 32 * b;
            __m512i i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), n0, _mm512_set1_epi32(load4(x)));
            __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), n1, _mm512_set1_epi32(load4(x + 16)));
            i0 = _mm512_dpbusd_epi32(i0, n2, _mm512_set1_epi32(load4(x + 4)));
            i1 = _mm512_dpbusd_epi32(i1, n3, _mm512_set1_epi32(load4(x + 20)));
            i0 = _mm512_dpbusd_epi32(i0, n4, _mm512_set1_epi32(load4(x + 8)));
            i1 = _mm512_dpbusd_epi32(i1, n5, _mm512_set1_epi32(load4(x + 24)));
            i0 = _mm512_dpbusd_epi32(i0, n6, _mm512_set1_epi32(load4(x + 12)));
            i1 = _mm512_dpbusd_epi32(i1, n7, _mm512_set1_epi32(load4(x + 28)));
            __m512 sf = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(sf, _mm512_set1_ps(a[t]->dx[b])), d, acc[t]);
            accm[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[t]->sx[b]), accm[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y[t], _mm512_add_ps(acc[t], accm[t]));
#undef NIBM
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static void tiles_avx512_q4(const uint8_t *tile, int nb, const mdk_q8 *const *a, int nt, float *const *y) {
    tiles_avx512_body(tile, nb, a, nt, y, 0);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static void tiles_avx512_mx4(const uint8_t *tile, int nb, const mdk_q8 *const *a, int nt, float *const *y) {
    tiles_avx512_body(tile, nb, a, nt, y, 1);
}

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static void tile_avx512_q4(const uint8_t *tile, int nb, const mdk_q8 *a, float *y) { tile_avx512_body(tile, nb, a, y, 0); }

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
static void tile_avx512_mx4(const uint8_t *tile, int nb, const mdk_q8 *a, float *y) { tile_avx512_body(tile, nb, a, y, 1); }
#endif

/* y[0..r1-r0) = rows r0..r1-1 of W (MDK_Q4; r0 a multiple of 16) dotted with one quantised token */
void mdk_q4_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    int nb = w->k / 32;
    const uint8_t *base = (const uint8_t *)w->w;
    const uint8_t *lut = w->fmt == MDK_MX4 ? MX4_Q : ID_Q;
    float tmp[16];
    for (int r = r0; r < r1; r += 16) {
        const uint8_t *tile = base + (size_t)(r / 16) * nb * TB;
        int n = r1 - r < 16 ? r1 - r : 16;
        float *dst = n == 16 ? y + (r - r0) : tmp;
#if MDK_X86
        if (mdk_path == MDK_PATH_AVX512) (lut == ID_Q ? tile_avx512_q4 : tile_avx512_mx4)(tile, nb, a, dst);
        else if (mdk_path == MDK_PATH_AVX2) tile_avx2(tile, nb, a, dst, lut);
        else
#endif
            tile_c(tile, nb, a, dst, lut);
        if (n < 16) memcpy(y + (r - r0), tmp, (size_t)n * 4);
    }
}

/* As mdk_q4_rows for nt tokens (1..4) at once: y[t][0..r1-r0) for token a[t]. The AVX-512 path
 * unpacks each block once for all of them; the others run token by token. */
void mdk_q4_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512 && nt > 1) {
        int nb = w->k / 32;
        const uint8_t *base = (const uint8_t *)w->w;
        int mx = w->fmt == MDK_MX4;
        float tmp[4][16];
        for (int r = r0; r < r1; r += 16) {
            const uint8_t *tile = base + (size_t)(r / 16) * nb * TB;
            int n = r1 - r < 16 ? r1 - r : 16;
            float *dst[4];
            for (int t = 0; t < nt; t++) dst[t] = n == 16 ? y[t] + (r - r0) : tmp[t];
            (mx ? tiles_avx512_mx4 : tiles_avx512_q4)(tile, nb, a, nt, dst);
            if (n < 16)
                for (int t = 0; t < nt; t++) memcpy(y[t] + (r - r0), tmp[t], (size_t)n * 4);
        }
        return;
    }
#endif
    for (int t = 0; t < nt; t++) mdk_q4_rows(w, r0, r1, a[t], y[t]);
}
