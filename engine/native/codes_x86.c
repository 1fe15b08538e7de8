/* codes.c's formats on AVX-512 VNNI: a unit of 256 weights' codes in natural order, for gemm.c's panels
 * (a prompt's products run its VNNI kernel on them; the decode kernel reads units in its own order,
 * codes_rows.c). Each format's codes are unpacked in registers: 2-bit fields by variable shifts (and
 * Q3_K's mask bits), IQ4 nibbles through pshufb, the i-quants' grid entries gathered with their signs as
 * byte masks; TQ1_0 by codes.c's scalar reading. With the groups' terms A and B (codes.h).
 */
#include "kraw.h"

#if MDK_X86
#include "codes_simd.h"

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
            q2k_terms(b, A, B);
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
        iq4_terms(fmt == MDK_IQ4XS, b, A, B);
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
        iq3_terms(fmt == MDK_IQ3XXS, b, A, B);
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
        iq1m_terms(b, A, B);
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

MDK_TARGET(A512)
static int unit_mem(int fmt, const uint8_t *row, int un, uint8_t *u, float *A, float *B) {
    __m512i c[4];
    int G = unit(fmt, mdk_codes_info_of(fmt), row, un, c, A, B);
    for (int i = 0; i < 4; i++) _mm512_storeu_si512((void *)(u + 64 * i), c[i]);
    return G;
}

/* The codes and terms of one unit for gemm.c's panel (its rows' codes in natural order, per group A, B) */
int mdk_codes_unit(int fmt, const uint8_t *row, int un, uint8_t *u, float *A, float *B) {
    if (mdk_path != MDK_PATH_AVX512) return 0;
    return unit_mem(fmt, row, un, u, A, B);
}
#endif
