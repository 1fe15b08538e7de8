/* What codes_x86.c (a unit's codes in natural order, for gemm.c's panels) and codes_rows.c (in the
 * decode kernel's order) share: AVX-512 helpers for reading the codes formats. Internal; x86 only. */
#ifndef MDK_CODES_SIMD_H
#define MDK_CODES_SIMD_H

#include "kraw.h"

#include <immintrin.h>
#include <string.h>

#include "iq_grids.h"

#define A512 "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c,bmi2"


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
MDK_TARGET(A512)
static MDK_INLINE uint64_t ksigns4(uint32_t aux) {
    return (uint64_t)KSIGNS[aux & 127] | (uint64_t)KSIGNS[(aux >> 7) & 127] << 8 |
           (uint64_t)KSIGNS[(aux >> 14) & 127] << 16 | (uint64_t)KSIGNS[(aux >> 21) & 127] << 24;
}

MDK_TARGET(A512)
static MDK_INLINE void i_quant_scales16(const uint8_t *sc, float d, float *A, float *B, int off) {
    for (int j = 0; j < 16; j++) {
        A[j] = d * (0.5f + (float)((sc[j >> 1] >> (4 * (j & 1))) & 15)) * 0.25f;
        B[j] = -(float)off * A[j];
    }
}

/* Q2_K's terms: A = d (sc & 15), B = -dmin (sc >> 4) */
MDK_TARGET(A512)
static MDK_INLINE void q2k_terms(const uint8_t *b, float *A, float *B) {
    __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
    __m512 d = _mm512_set1_ps(h2f(rd16(b + 80))), dmin = _mm512_set1_ps(-h2f(rd16(b + 82)));
    _mm512_store_ps(A, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15)))));
    _mm512_store_ps(B, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4))));
}

/* IQ4's terms (8 groups): IQ4_XS d (scale - 32), IQ4_NL each block's d; B = -128 A */
MDK_TARGET(A512)
static MDK_INLINE void iq4_terms(int xs, const uint8_t *b, float *A, float *B) {
    __m256 a;
    if (xs) {  /* scale j: nibble j of the 4 bytes at 4, bits 2j..2j+1 of the word at 2, - 32 */
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
}

/* IQ3's 8 terms: IQ3_XXS d (0.5 + s) 0.5 (s: the top 4 bits of each group's word), IQ3_S d (1 + 2 s) */
MDK_TARGET(A512)
static MDK_INLINE void iq3_terms(int xxs, const uint8_t *b, float *A, float *B) {
    float d = h2f(rd16(b));
    for (int j = 0; j < 8; j++) {
        if (xxs) {
            uint32_t aux;
            memcpy(&aux, b + 66 + 4 * j, 4);
            A[j] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            B[j] = -64.f * A[j];
        } else {
            A[j] = d * (float)(1 + 2 * ((b[106 + (j >> 1)] >> (4 * (j & 1))) & 15));
            B[j] = -16.f * A[j];
        }
    }
}

/* IQ1_M's d (its fp16 spread over the top nibbles of the four scale words) and 16 terms */
MDK_TARGET(A512)
static MDK_INLINE void iq1m_terms(const uint8_t *b, float *A, float *B) {
    unsigned s[4];
    for (int i = 0; i < 4; i++) s[i] = rd16(b + 48 + 2 * i);
    float d = h2f((uint16_t)((s[0] & 0xF000) >> 12 | (s[1] & 0xF000) >> 8 | (s[2] & 0xF000) >> 4 | (s[3] & 0xF000)));
    for (int j = 0; j < 16; j++) {
        A[j] = d * (float)(2 * ((s[j >> 2] >> (3 * (j & 3))) & 7) + 1) * 0.125f;
        B[j] = -9.f * A[j];
    }
}

#endif
