/* codes.c's formats on AVX-512 VNNI: one row at a time, 256 weights ("a unit") at a time, for 1-4 tokens.
 *
 * A unit's codes are unpacked once into four vectors of 64 (SIMD for each format: the i-quants' grid
 * entries gathered, their signs as byte masks; TQ1_0 by codes.c's scalar reading) with its groups'
 * terms A and B (codes.h),
 * then for each token: per 64 codes one vpdpbusd (16 lanes of 4 products: 8 lanes a 32-group, 4 a
 * 16-group), the lanes scaled by their group's A * dx (a permute of one vector of the unit's groups) and
 * summed in fp32; the B * sx terms as one vector product a unit. The integer sums are exact, so a row's
 * product equals codes.c's portable one up to the order of the fp32 additions.
 */
#include "kraw.h"

#include <string.h>

#include "iq_grids.h"

#if MDK_X86
#include <immintrin.h>

#define A512 "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c"

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

MDK_TARGET(A512)
static MDK_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }  /* (mdk_h2f is a call into cpu.c) */

/* IQ4's grid + 128, for pshufb */
static const uint8_t KV4U[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

/* Q3_K's 16 six-bit scales - 32 as floats times d */
MDK_TARGET(A512)
static MDK_INLINE __m512 q3k_scales(const uint8_t *s, float d) {
    __m128i v = _mm_loadl_epi64((const __m128i *)s);  /* bytes 0..7 */
    __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(v, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    uint32_t x;
    memcpy(&x, s + 8, 4);
    /* scale i = 4j + m: (byte m of x >> 2j) & 3, in dword j */
    __m128i hb = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)x), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hb, 4)), _mm_set1_epi8(32));
    return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
}

/* 8 grid entries of 8 bytes each (tab + 8 idx) as one vector */
MDK_TARGET(A512)
static MDK_INLINE __m512i grid8x8(const uint8_t *tab, const unsigned *idx) {
    uint64_t g[8];
    for (int i = 0; i < 8; i++) memcpy(&g[i], tab + 8 * (size_t)idx[i], 8);
    return _mm512_loadu_si512((const void *)g);
}

/* u = sign ? off - g : off + g for 64 bytes g, sign bit i of m for byte i */
MDK_TARGET(A512)
static MDK_INLINE __m512i signed_codes(__m512i g, uint64_t m, int off) {
    __m512i o = _mm512_set1_epi8((char)off);
    return _mm512_mask_sub_epi8(_mm512_add_epi8(o, g), (__mmask64)m, o, g);
}

/* ksigns of four 7-bit fields of aux, as 32 mask bits (8 a field) */
static MDK_INLINE uint64_t ksigns4(uint32_t aux) {
    return (uint64_t)KSIGNS[aux & 127] | (uint64_t)KSIGNS[(aux >> 7) & 127] << 8 |
           (uint64_t)KSIGNS[(aux >> 14) & 127] << 16 | (uint64_t)KSIGNS[(aux >> 21) & 127] << 24;
}

static MDK_INLINE void i_quant_scales16(const uint8_t *sc, float d, float *A, float *B, int off) {
    for (int j = 0; j < 16; j++) {
        A[j] = d * (0.5f + (float)((sc[j >> 1] >> (4 * (j & 1))) & 15)) * 0.25f;
        B[j] = -(float)off * A[j];
    }
}

/* One unit (256 weights) of a row: its codes in 4 vectors of 64 (c[i] = codes 64 i .. 64 i + 63) and its
 * groups' A and B; returns the groups (8 or 16). TQ1_0 goes through codes.c's reading. */
MDK_TARGET(A512)
static MDK_INLINE int unit(const int fmt, const mdk_codes_info *I, const uint8_t *row, int un, __m512i *c, float *A,
                           float *B) {
    switch (fmt) {
    case MDK_Q3K:
    case MDK_Q2K:
    case MDK_TQ2_0: {  /* 2-bit fields (q >> 2s) & 3 of 32 bytes; Q3_K: + 4 where its mask bit is set */
        const uint8_t *b = row + (size_t)un * I->bs, *qs = fmt == MDK_Q3K ? b + 32 : fmt == MDK_Q2K ? b + 16 : b;
        __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
        for (int i = 0; i < 4; i++) {
            int h = i >> 1, s = 2 * (i & 1);
            __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
            __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * s)), _mm256_set1_epi16((short)(2 * s + 2)), 1);
            c[i] = _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(3));
            if (fmt == MDK_Q3K) {
                __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h + s))),
                                                 _mm256_set1_epi8((char)(1 << (4 * h + s + 1))), 1);
                c[i] = _mm512_mask_add_epi8(c[i], _mm512_test_epi8_mask(hm, bit), c[i], _mm512_set1_epi8(4));
            }
        }
        if (fmt == MDK_Q3K) {
            __m512 a = q3k_scales(b + 96, h2f(rd16(b + 108)));
            _mm512_store_ps(A, a);
            _mm512_store_ps(B, _mm512_mul_ps(a, _mm512_set1_ps(-4.f)));
            return 16;
        }
        if (fmt == MDK_Q2K) {
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
            __m512 d = _mm512_set1_ps(h2f(rd16(b + 80))), dmin = _mm512_set1_ps(-h2f(rd16(b + 82)));
            _mm512_store_ps(A, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15)))));
            _mm512_store_ps(B, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4))));
            return 16;
        }
        float d = h2f(rd16(b + 64));  /* TQ2_0: q - 1 */
        for (int j = 0; j < 8; j++) A[j] = d, B[j] = -d;
        return 8;
    }
    case MDK_IQ4XS:
    case MDK_IQ4NL: {  /* 128-bit lanes [group's 16 bytes, the same, next group's, the same] >> [0, 4, 0, 4] */
        const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KV4U));
        const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                             0x0004000400040004LL, 0x0004000400040004LL);
        const uint8_t *b = row + (size_t)un * (fmt == MDK_IQ4XS ? 136 : 144);
        for (int i = 0; i < 4; i++) {
            __m512i v;
            if (fmt == MDK_IQ4XS) {
                v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 8 + 32 * i)));
            } else {
                v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + 18 * (2 * i) + 2)));
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + 18 * (2 * i + 1) + 2)), 1);
            }
            v = _mm512_shuffle_i64x2(v, v, 0x50);  /* lanes 0, 0, 1, 1 */
            c[i] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(15)));
        }
        __m256 a;
        if (fmt == MDK_IQ4XS) {  /* scale j: nibble j of the 4 bytes at 4, bits 2j..2j+1 of the word at 2, - 32 */
            uint32_t sl;
            memcpy(&sl, b + 4, 4);
            __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                          _mm256_set1_epi32(15));
            __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(rd16(b + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
            __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
            a = _mm256_mul_ps(_mm256_set1_ps(h2f(rd16(b))), _mm256_cvtepi32_ps(sc));
        } else {  /* the 8 blocks' fp16 d */
            uint16_t d[8];
            for (int j = 0; j < 8; j++) d[j] = rd16(b + 18 * j);
            a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        }
        _mm256_store_ps(A, a);
        _mm256_store_ps(B, _mm256_mul_ps(a, _mm256_set1_ps(-128.f)));
        return 8;
    }
    case MDK_IQ2XXS: {
        const uint8_t *b = row + (size_t)un * 66;
        float d = h2f(rd16(b));
        for (int i = 0; i < 4; i++) {  /* groups 2i and 2i + 1 */
            unsigned idx[8];
            uint64_t m = 0;
            for (int h = 0; h < 2; h++) {
                const uint8_t *q = b + 2 + 8 * (2 * i + h);
                uint32_t aux;
                memcpy(&aux, q + 4, 4);
                for (int e = 0; e < 4; e++) idx[4 * h + e] = q[e];
                m |= ksigns4(aux) << (32 * h);
                A[2 * i + h] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
                B[2 * i + h] = -64.f * A[2 * i + h];
            }
            c[i] = signed_codes(grid8x8(IQ2XXS_GRID, idx), m, 64);
        }
        return 8;
    }
    case MDK_IQ2XS: {
        const uint8_t *b = row + (size_t)un * 74;
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            uint64_t m = 0;
            for (int e = 0; e < 8; e++) {
                unsigned q = rd16(b + 2 + 2 * (8 * i + e));
                idx[e] = q & 511;
                m |= (uint64_t)KSIGNS[q >> 9] << (8 * e);
            }
            c[i] = signed_codes(grid8x8(IQ2XS_GRID, idx), m, 64);
        }
        i_quant_scales16(b + 66, h2f(rd16(b)), A, B, 64);
        return 16;
    }
    case MDK_IQ2S: {
        const uint8_t *b = row + (size_t)un * 82, *qs = b + 2, *qh = b + 66;
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            for (int e = 0; e < 8; e++) {
                int n = 8 * i + e;
                idx[e] = qs[n] | ((qh[n >> 2] >> (2 * (n & 3))) & 3) << 8;
            }
            uint64_t m;
            memcpy(&m, b + 34 + 8 * i, 8);
            c[i] = signed_codes(grid8x8(IQ2S_GRID, idx), m, 64);
        }
        i_quant_scales16(b + 74, h2f(rd16(b)), A, B, 64);
        return 16;
    }
    case MDK_IQ3XXS:
    case MDK_IQ3S: {  /* 16 grid entries of 4 bytes a vector, gathered */
        const uint8_t *b = row + (size_t)un * I->bs;
        float d = h2f(rd16(b));
        for (int i = 0; i < 4; i++) {
            __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + 16 * i)));
            uint64_t m;
            if (fmt == MDK_IQ3XXS) {
                uint32_t a0, a1;
                memcpy(&a0, b + 66 + 8 * i, 4);
                memcpy(&a1, b + 70 + 8 * i, 4);
                m = ksigns4(a0) | ksigns4(a1) << 32;
                c[i] = signed_codes(_mm512_i32gather_epi32(idx, (const void *)IQ3XXS_GRID, 4), m, 64);
            } else {
                unsigned hb = rd16(b + 66 + 2 * i);  /* entries 16 i .. 16 i + 15: one bit each */
                idx = _mm512_mask_or_epi32(idx, (__mmask16)hb, idx, _mm512_set1_epi32(256));
                memcpy(&m, b + 74 + 8 * i, 8);
                c[i] = signed_codes(_mm512_i32gather_epi32(idx, (const void *)IQ3S_GRID, 4), m, 16);
            }
        }
        for (int j = 0; j < 8; j++) {
            if (fmt == MDK_IQ3XXS) {
                uint32_t aux;
                memcpy(&aux, b + 66 + 4 * j, 4);
                A[j] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
                B[j] = -64.f * A[j];
            } else {
                A[j] = d * (float)(1 + 2 * ((b[106 + (j >> 1)] >> (4 * (j & 1))) & 15));
                B[j] = -16.f * A[j];
            }
        }
        return 8;
    }
    case MDK_IQ1S:
    case MDK_IQ1M: {  /* u = 8 g + 9 + (delta < 0 ? -1 : 1) */
        const uint8_t *b = row + (size_t)un * I->bs;
        float Dg[16];
        if (fmt == MDK_IQ1S) {
            float d = h2f(rd16(b));
            for (int i = 0; i < 4; i++) {
                unsigned idx[8];
                uint64_t neg = 0;
                for (int h = 0; h < 2; h++) {
                    int g = 2 * i + h;
                    unsigned qh = rd16(b + 34 + 2 * g);
                    for (int e = 0; e < 4; e++) idx[4 * h + e] = b[2 + 4 * g + e] | ((qh >> (3 * e)) & 7) << 8;
                    if (qh & 0x8000) neg |= 0xFFFFFFFFull << (32 * h);
                    Dg[g] = d * (float)(2 * ((qh >> 12) & 7) + 1);
                }
                __m512i g8 = grid8x8((const uint8_t *)IQ1S_GRID8, idx);
                c[i] = _mm512_mask_sub_epi8(_mm512_add_epi8(g8, _mm512_set1_epi8(10)), (__mmask64)neg,
                                            _mm512_add_epi8(g8, _mm512_set1_epi8(10)), _mm512_set1_epi8(2));
            }
            for (int j = 0; j < 8; j++) A[j] = Dg[j] * 0.125f, B[j] = -9.f * A[j];
            return 8;
        }
        unsigned s[4];
        for (int i = 0; i < 4; i++) s[i] = rd16(b + 48 + 2 * i);
        float d = h2f((uint16_t)((s[0] & 0xF000) >> 12 | (s[1] & 0xF000) >> 8 | (s[2] & 0xF000) >> 4 | (s[3] & 0xF000)));
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            uint64_t neg = 0;
            for (int e = 0; e < 8; e++) {
                int n = 8 * i + e;
                unsigned nib = (b[32 + (n >> 1)] >> (4 * (n & 1))) & 15;
                idx[e] = b[n] | (nib & 7) << 8;
                if (nib & 8) neg |= 0xFFull << (8 * e);
            }
            __m512i g8 = _mm512_add_epi8(grid8x8((const uint8_t *)IQ1S_GRID8, idx), _mm512_set1_epi8(10));
            c[i] = _mm512_mask_sub_epi8(g8, (__mmask64)neg, g8, _mm512_set1_epi8(2));
        }
        for (int j = 0; j < 16; j++) {
            A[j] = d * (float)(2 * ((s[j >> 2] >> (3 * (j & 3))) & 7) + 1) * 0.125f;
            B[j] = -9.f * A[j];
        }
        return 16;
    }
    default: {  /* codes.c's reading, one block at a time */
        _Alignas(64) uint8_t u[256];
        float D[16], M[16];
        int per = 256 / I->qk, gb = I->qk / I->gs;
        for (int j = 0; j < per; j++) {
            mdk_codes_block(fmt, row + ((size_t)un * per + j) * I->bs, u + I->qk * j, D, M);
            mdk_codes_terms(fmt, D, M, A + gb * j, B + gb * j);
        }
        for (int i = 0; i < 4; i++) c[i] = _mm512_load_si512((const void *)(u + 64 * i));
        return 256 / I->gs;
    }
    }
}

/* y[t][r - r0] = row r times token a[t], rows r0..r1-1, t < nt (<= 4); k % 256 == 0. Instantiated per
 * format (ROWS512 below) so that unit() is inlined with its format known. */
MDK_TARGET(A512)
static MDK_INLINE void rows512(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt,
                               float *const *y) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    int k = w->k;
    size_t rb = kraw_row_bytes(fmt, k);
    _Alignas(64) float A[16], B[16];
    __m512i c[4];
    /* lane l of chunk i takes group (64 i + 4 l) / gs of the unit */
    __m512i idx[4];
    for (int i = 0; i < 4; i++)
        idx[i] = I->gs == 16 ? _mm512_setr_epi32(4 * i, 4 * i, 4 * i, 4 * i, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1,
                                                 4 * i + 2, 4 * i + 2, 4 * i + 2, 4 * i + 2, 4 * i + 3, 4 * i + 3,
                                                 4 * i + 3, 4 * i + 3)
                             : _mm512_inserti64x4(_mm512_set1_epi32(2 * i), _mm256_set1_epi32(2 * i + 1), 1);
    const __m512i pair = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m512 acc[4], accb[4];
        for (int t = 0; t < nt; t++) acc[t] = accb[t] = _mm512_setzero_ps();
        for (int un = 0; un < k / 256; un++) {
            int G = unit(fmt, I, row, un, c, A, B);
            __mmask16 gm = (__mmask16)(G == 16 ? 0xFFFF : 0xFF);
            __m512 av = _mm512_maskz_load_ps(gm, A), bv = _mm512_maskz_load_ps(gm, B);
            for (int t = 0; t < nt; t++) {
                const int8_t *x = a[t]->q + 256 * un;
                __m512 dx = _mm512_maskz_loadu_ps(0xFF, a[t]->dx + 8 * un), ad, sx;
                if (G == 16) {
                    ad = _mm512_mul_ps(av, _mm512_permutexvar_ps(pair, dx));
                    sx = _mm512_loadu_ps(a[t]->sxh + 16 * un);
                } else {
                    ad = _mm512_mul_ps(av, dx);
                    sx = _mm512_maskz_loadu_ps(0xFF, a[t]->sx + 8 * un);
                }
                accb[t] = _mm512_fmadd_ps(bv, sx, accb[t]);
                for (int i = 0; i < 4; i++) {
                    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[i],
                                                    _mm512_loadu_si512((const void *)(x + 64 * i)));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(idx[i], ad), acc[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], accb[t]));
    }
}

typedef void (*rows_fn)(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
#define ROWS512(F) MDK_TARGET(A512) static void rows_##F(const mdk_matrix *w, int r0, int r1, \
                   const mdk_q8 *const *a, int nt, float *const *y) { rows512(MDK_##F, w, r0, r1, a, nt, y); }
ROWS512(Q2K) ROWS512(Q3K) ROWS512(IQ4NL) ROWS512(IQ4XS) ROWS512(IQ2XXS) ROWS512(IQ2XS) ROWS512(IQ2S)
ROWS512(IQ3XXS) ROWS512(IQ3S) ROWS512(IQ1S) ROWS512(IQ1M) ROWS512(TQ1_0) ROWS512(TQ2_0)
static const rows_fn ROWS[MDK_CODES_N] = {rows_Q2K, rows_Q3K, rows_IQ4NL, rows_IQ4XS, rows_IQ2XXS, rows_IQ2XS,
                                          rows_IQ2S, rows_IQ3XXS, rows_IQ3S, rows_IQ1S, rows_IQ1M, rows_TQ1_0,
                                          rows_TQ2_0};

MDK_TARGET(A512)
static int unit_mem(int fmt, const uint8_t *row, int un, uint8_t *u, float *A, float *B) {
    __m512i c[4];
    int G = unit(fmt, mdk_codes_info_of(fmt), row, un, c, A, B);
    for (int i = 0; i < 4; i++) _mm512_storeu_si512((void *)(u + 64 * i), c[i]);
    return G;
}

/* Rows r0..r1-1 against nt (1..4) tokens on AVX-512; 0 where this path does not take the matrix */
int mdk_codes_x86(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (mdk_path != MDK_PATH_AVX512 || !MDK_IS_CODES(w->fmt) || w->k % 256) return 0;
    ROWS[w->fmt - MDK_Q2K](w, r0, r1, a, nt, y);
    return 1;
}

/* The codes and terms of one unit for gemm.c's panel (its rows' codes in natural order, per group A, B) */
int mdk_codes_unit(int fmt, const uint8_t *row, int un, uint8_t *u, float *A, float *B) {
    if (mdk_path != MDK_PATH_AVX512) return 0;
    return unit_mem(fmt, row, un, u, A, B);
}
#endif
