/* The x86 SIMD dot products of kquant.c's K-quant tiles (Q4_K, Q5_K, Q6_K) with int8 activations:
 * AVX-512 VNNI (16 rows, 1..4 tokens a call, one instance per format and token count) and AVX2 (one
 * token, 8 rows at a time). The tile layout and the arithmetic they follow are in kquant.c's opening
 * comment; kquant.c holds the portable C kernel and chooses among the three by mdk_path.
 */
#include "kquant.h"

#include <string.h>

#if MDK_X86
#include <immintrin.h>

static inline int32_t ld4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

#define A512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"

/* The 6-bit scales and minima of a Q4_K/Q5_K tile's 16 rows, to bytes sc[16j + r], mn[16j + r] */
MDK_TARGET(A512)
static MDK_INLINE void scales512(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    const __m512i lo = _mm512_set1_epi8(15), hi = _mm512_set1_epi8(0x30);
    __m512i s0 = _mm512_loadu_si512(s), s1 = _mm512_loadu_si512(s + 64), s2 = _mm512_loadu_si512(s + 128);
    _mm512_storeu_si512(sc, _mm512_or_si512(_mm512_and_si512(s0, lo), _mm512_and_si512(_mm512_slli_epi16(s2, 4), hi)));
    _mm512_storeu_si512(sc + 64, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(s0, 4), lo),
                                                 _mm512_and_si512(_mm512_slli_epi16(s2, 2), hi)));
    _mm512_storeu_si512(mn, _mm512_or_si512(_mm512_and_si512(s1, lo), _mm512_and_si512(s2, hi)));
    _mm512_storeu_si512(mn + 64, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(s1, 4), lo),
                                                 _mm512_and_si512(_mm512_srli_epi16(s2, 2), hi)));
}

/* fmt and nt are constants in each instance below: each super-block's bits are unpacked once for
 * all nt tokens (a batched decode step or a prefill reads each weight from RAM once) */
MDK_TARGET(A512)
static MDK_INLINE void body512(const int fmt, const uint8_t *tile, int nsb, const mdk_q8 *const *a, const int nt,
                               float *const *y) {
    const kq_layout *L = LAY(fmt);
    const __m512i m4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(0x10), b45 = _mm512_set1_epi8(0x30);
    const __m512i z = _mm512_setzero_si512();
    uint8_t sc[128], mn[128];
    __m512 acc[4];
    for (int t = 0; t < 4; t++) acc[t] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *T = tile + (size_t)s * L->tile;
        __m512 part[4], mins[4];
        for (int t = 0; t < 4; t++) part[t] = mins[t] = _mm512_setzero_ps();
        if (fmt != MDK_Q6K) scales512(T + L->soff, sc, mn);

        for (int j = 0; j < 8; j++) {
            const uint8_t *Q = T + L->qoff + L->sub * j;
            __m512i n[8];
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_loadu_si512(Q + 64 * c);
                n[2 * c] = _mm512_and_si512(v, m4);
                n[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            if (fmt == MDK_Q5K) {  /* fifth bits: bit c (elements 4c+i) and 4+c (16+4c+i) -> bit 4 */
                __m512i h = _mm512_loadu_si512(Q + 256);
                n[0] = _mm512_or_si512(n[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), b4));
                n[2] = _mm512_or_si512(n[2], _mm512_and_si512(_mm512_slli_epi16(h, 3), b4));
                n[4] = _mm512_or_si512(n[4], _mm512_and_si512(_mm512_slli_epi16(h, 2), b4));
                n[6] = _mm512_or_si512(n[6], _mm512_and_si512(_mm512_slli_epi16(h, 1), b4));
                n[1] = _mm512_or_si512(n[1], _mm512_and_si512(h, b4));
                n[3] = _mm512_or_si512(n[3], _mm512_and_si512(_mm512_srli_epi16(h, 1), b4));
                n[5] = _mm512_or_si512(n[5], _mm512_and_si512(_mm512_srli_epi16(h, 2), b4));
                n[7] = _mm512_or_si512(n[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), b4));
            }
            if (fmt == MDK_Q6K) {  /* top two bits 2c..2c+1 -> bits 4..5 */
                for (int g = 0; g < 2; g++) {
                    __m512i h = _mm512_loadu_si512(Q + 256 + 64 * g);
                    n[g] = _mm512_or_si512(n[g], _mm512_and_si512(_mm512_slli_epi16(h, 4), b45));
                    n[2 + g] = _mm512_or_si512(n[2 + g], _mm512_and_si512(_mm512_slli_epi16(h, 2), b45));
                    n[4 + g] = _mm512_or_si512(n[4 + g], _mm512_and_si512(h, b45));
                    n[6 + g] = _mm512_or_si512(n[6 + g], _mm512_and_si512(_mm512_srli_epi16(h, 2), b45));
                }
            }
            __m512i s_a, s_b;
            __m512 mnj = _mm512_setzero_ps();
            if (fmt == MDK_Q6K) {
                s_a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(T + L->soff + 32 * j)));
                s_b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(T + L->soff + 32 * j + 16)));
            } else {
                s_a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * j)));
                s_b = s_a;
                mnj = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mn + 16 * j))));
            }
            int b = 8 * s + j;
            for (int t = 0; t < nt; t++) {
                const int8_t *x = a[t]->q + 32 * b;
                __m512i lo = _mm512_dpbusd_epi32(z, n[0], _mm512_set1_epi32(ld4(x)));
                __m512i hi = _mm512_dpbusd_epi32(z, n[1], _mm512_set1_epi32(ld4(x + 16)));
                lo = _mm512_dpbusd_epi32(lo, n[2], _mm512_set1_epi32(ld4(x + 4)));
                hi = _mm512_dpbusd_epi32(hi, n[3], _mm512_set1_epi32(ld4(x + 20)));
                lo = _mm512_dpbusd_epi32(lo, n[4], _mm512_set1_epi32(ld4(x + 8)));
                hi = _mm512_dpbusd_epi32(hi, n[5], _mm512_set1_epi32(ld4(x + 24)));
                lo = _mm512_dpbusd_epi32(lo, n[6], _mm512_set1_epi32(ld4(x + 12)));
                hi = _mm512_dpbusd_epi32(hi, n[7], _mm512_set1_epi32(ld4(x + 28)));
                __m512i v;
                if (fmt == MDK_Q6K) {
                    lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(32 * a[t]->s16[2 * b]));
                    hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * a[t]->s16[2 * b + 1]));
                    v = _mm512_add_epi32(_mm512_mullo_epi32(lo, s_a), _mm512_mullo_epi32(hi, s_b));
                } else {
                    v = _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), s_a);
                    mins[t] = _mm512_fmadd_ps(mnj, _mm512_set1_ps(a[t]->sx[b]), mins[t]);
                }
                part[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(a[t]->dx[b]), part[t]);
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(T + L->doff)));
        __m512 dm = fmt == MDK_Q6K ? _mm512_setzero_ps() : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(T + L->moff)));
        for (int t = 0; t < nt; t++) {
            acc[t] = _mm512_fmadd_ps(d, part[t], acc[t]);
            if (fmt != MDK_Q6K) acc[t] = _mm512_fnmadd_ps(dm, mins[t], acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y[t], acc[t]);
}

#define KQ512(name, fmt, nt) MDK_TARGET(A512) \
    static void name(const uint8_t *tl, int nsb, const mdk_q8 *const *a, float *const *y) { body512(fmt, tl, nsb, a, nt, y); }
KQ512(q4k_1, MDK_Q4K, 1) KQ512(q4k_2, MDK_Q4K, 2) KQ512(q4k_3, MDK_Q4K, 3) KQ512(q4k_4, MDK_Q4K, 4)
KQ512(q5k_1, MDK_Q5K, 1) KQ512(q5k_2, MDK_Q5K, 2) KQ512(q5k_3, MDK_Q5K, 3) KQ512(q5k_4, MDK_Q5K, 4)
KQ512(q6k_1, MDK_Q6K, 1) KQ512(q6k_2, MDK_Q6K, 2) KQ512(q6k_3, MDK_Q6K, 3) KQ512(q6k_4, MDK_Q6K, 4)
#undef KQ512
const mdk_kq512_fn mdk_kq512[3][4] = {{q4k_1, q4k_2, q4k_3, q4k_4}, {q5k_1, q5k_2, q5k_3, q5k_4},
                                      {q6k_1, q6k_2, q6k_3, q6k_4}};

/* AVX2: one token, the two 8-row halves of a tile in turn (maddubs pair sums: at most
 * 2 * 63 * 127 = 16002, two added still fit int16) */
MDK_TARGET("avx2,fma,f16c")
void mdk_kq_rows_avx2(int fmt, const uint8_t *tile, int nsb, const mdk_q8 *a, float *y) {
    const kq_layout *L = LAY(fmt);
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(0x10), b45 = _mm256_set1_epi8(0x30);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    uint8_t sc[128], mn[128];
    for (int s = 0; s < nsb; s++) {
        const uint8_t *T = tile + (size_t)s * L->tile;
        if (fmt != MDK_Q6K)  /* scalar decode of the 16 x 8 scales: a small share of a super-block's work */
            for (int j = 0; j < 8; j++)
                for (int r = 0, c, m; r < 16; r++) {
                    scale_min(T + L->soff, r, j, &c, &m);
                    sc[16 * j + r] = (uint8_t)c;
                    mn[16 * j + r] = (uint8_t)m;
                }
        for (int half = 0; half < 2; half++) {
            __m256 part = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
            for (int j = 0; j < 8; j++) {
                const uint8_t *Q = T + L->qoff + L->sub * j + 32 * half;
                __m256i n[8];
                for (int c = 0; c < 4; c++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(Q + 64 * c));
                    n[2 * c] = _mm256_and_si256(v, m4);
                    n[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
                if (fmt == MDK_Q5K) {
                    __m256i h = _mm256_loadu_si256((const __m256i *)(Q + 256));
                    n[0] = _mm256_or_si256(n[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
                    n[2] = _mm256_or_si256(n[2], _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
                    n[4] = _mm256_or_si256(n[4], _mm256_and_si256(_mm256_slli_epi16(h, 2), b4));
                    n[6] = _mm256_or_si256(n[6], _mm256_and_si256(_mm256_slli_epi16(h, 1), b4));
                    n[1] = _mm256_or_si256(n[1], _mm256_and_si256(h, b4));
                    n[3] = _mm256_or_si256(n[3], _mm256_and_si256(_mm256_srli_epi16(h, 1), b4));
                    n[5] = _mm256_or_si256(n[5], _mm256_and_si256(_mm256_srli_epi16(h, 2), b4));
                    n[7] = _mm256_or_si256(n[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), b4));
                }
                if (fmt == MDK_Q6K)
                    for (int g = 0; g < 2; g++) {
                        __m256i h = _mm256_loadu_si256((const __m256i *)(Q + 256 + 64 * g));
                        n[g] = _mm256_or_si256(n[g], _mm256_and_si256(_mm256_slli_epi16(h, 4), b45));
                        n[2 + g] = _mm256_or_si256(n[2 + g], _mm256_and_si256(_mm256_slli_epi16(h, 2), b45));
                        n[4 + g] = _mm256_or_si256(n[4 + g], _mm256_and_si256(h, b45));
                        n[6 + g] = _mm256_or_si256(n[6 + g], _mm256_and_si256(_mm256_srli_epi16(h, 2), b45));
                    }
                int b = 8 * s + j;
                const int8_t *x = a->q + 32 * b;
#define MB(k, o) _mm256_maddubs_epi16(n[k], _mm256_set1_epi32(ld4(x + (o))))
                __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(MB(0, 0), MB(2, 4)), ones),
                                              _mm256_madd_epi16(_mm256_add_epi16(MB(4, 8), MB(6, 12)), ones));
                __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(MB(1, 16), MB(3, 20)), ones),
                                              _mm256_madd_epi16(_mm256_add_epi16(MB(5, 24), MB(7, 28)), ones));
#undef MB
                __m256i v;
                if (fmt == MDK_Q6K) {
                    __m256i sa = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(T + 32 * j + 8 * half)));
                    __m256i sb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(T + 32 * j + 16 + 8 * half)));
                    lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * a->s16[2 * b]));
                    hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * a->s16[2 * b + 1]));
                    v = _mm256_add_epi32(_mm256_mullo_epi32(lo, sa), _mm256_mullo_epi32(hi, sb));
                } else {
                    __m256i sa = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * j + 8 * half)));
                    __m256 mj = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mn + 16 * j + 8 * half))));
                    v = _mm256_mullo_epi32(_mm256_add_epi32(lo, hi), sa);
                    mins = _mm256_fmadd_ps(mj, _mm256_set1_ps(a->sx[b]), mins);
                }
                part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(a->dx[b]), part);
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(T + L->doff + 16 * half)));
            acc[half] = _mm256_fmadd_ps(d, part, acc[half]);
            if (fmt != MDK_Q6K) {
                __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(T + L->moff + 16 * half)));
                acc[half] = _mm256_fnmadd_ps(dm, mins, acc[half]);
            }
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}
#endif
