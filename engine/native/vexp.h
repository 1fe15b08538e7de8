/* Vector exp for the softmaxes (attention.c's decode, flash.c's prompt): x86 with AVX-512 only. */
#ifndef MDK_VEXP_H
#define MDK_VEXP_H

#include "mdk.h"
#include <immintrin.h>

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

#endif
