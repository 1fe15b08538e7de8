/* What codes_avx2.c and codes_k23_avx2.c share: the AVX2 target, small helpers, the Q2_K / Q3_K entry.
 * Internal; x86 only. */
#ifndef MDK_CODES_AVX2_H
#define MDK_CODES_AVX2_H

#include "kraw.h"

#include <immintrin.h>
#include <string.h>

#define A2 "avx2,fma,f16c,bmi2"


MDK_TARGET(A2)
static MDK_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* the sum of a vector's 8 lanes */
MDK_TARGET(A2)
static MDK_INLINE float hsum8(__m256 v8) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Q2_K / Q3_K rows r0..r1-1 against nt (1..4) tokens (codes_k23_avx2.c) */
void mdk_k23_avx2(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);

#endif
