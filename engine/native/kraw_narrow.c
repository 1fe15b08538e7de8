/* AVX2 kernels of raw GGUF rows in 128-bit vectors, for CPUs that run each 256-bit operation as two
 * 128-bit halves (AMD Zen 1 and Zen+: mdk_narrow, cpu.c).
 *
 * Why: kraw_x86.c's AVX2 kernels put a row in each 128-bit half of a 256-bit vector, and gather the
 * two rows' dwords into one vector with lane-crossing permutes (vperm2i128, vpermd) every 64
 * weights. On Intel and on Zen 2 and later those are one operation; on Zen 1 vperm2i128 is 8 and
 * vpermd 3, and the rest of the arithmetic costs two a vector anyway, so the permutes were the
 * largest share of Q6_K's work (Qwen3's [32768, 2048] output-shaped Q6_K, 2 threads, from memory:
 * 11.1 G weights/s where Q4_K ran 20.6). Here each row is its own 128-bit vector: the same dwords
 * are gathered by in-lane unpacks, and the operations a weight are about two thirds of before.
 *
 * Lanes, sums and folds are kraw_x86.c's (a row's half of its 256-bit kernel), so the integer sums
 * are equal to it and the results differ only in fp32 rounding; the activations are read in the
 * order kraw_x86.c prepares them (K6). */
#include "kraw.h"

#if MDK_X86
#include <immintrin.h>

#define A2N "avx2,fma,f16c"

#define LD(p) _mm_loadu_si128((const __m128i *)(p))

MDK_TARGET(A2N)
static MDK_INLINE float hsum4(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

/* Q6_K: nt tokens, 2 rows. Half H of a super-block: lane q of T[m] = dword m of the low-nibble bytes
 * of 16-weight group 8H + q (its high nibbles: group 8H + 4 + q); QH[m] the matching 2-bit pairs */
MDK_TARGET(A2N)
static MDK_INLINE void k6_body128(const uint8_t *const *rows, int nsb, const uint8_t *const *act, const pf_plan *pf,
                                  const int nt, float (*y)[4]) {
    const __m128i c0f = _mm_set1_epi8(0x0f), c30 = _mm_set1_epi8(0x30), c33 = _mm_set1_epi8(0x33);
    const __m128i ones = _mm_set1_epi16(1);
    __m128 acc[2][4];
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < nt; t++) acc[r][t] = _mm_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        pf_slice(pf, s);
        for (int r = 0; r < 2; r++) {
            const uint8_t *b = rows[r] + (size_t)210 * s;
            const __m128i Z = LD(b + 192);
            __m128 f[4];
            for (int t = 0; t < nt; t++) f[t] = _mm_setzero_ps();
            for (int H = 0; H < 2; H++) {
                const uint8_t *ql = b + 64 * H, *qp = b + 128 + 32 * H;
                __m128i a0 = LD(ql), a1 = LD(ql + 16), b0 = LD(ql + 32), b1 = LD(ql + 48);
                __m128i t0 = _mm_unpacklo_epi32(a0, a1), t1 = _mm_unpackhi_epi32(a0, a1);
                __m128i t2 = _mm_unpacklo_epi32(b0, b1), t3 = _mm_unpackhi_epi32(b0, b1);
                const __m128i T[4] = {_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2),
                                      _mm_unpacklo_epi64(t1, t3), _mm_unpackhi_epi64(t1, t3)};
                const __m128i q0 = LD(qp), q1 = LD(qp + 16);
                __m128i u0 = _mm_unpacklo_epi32(q0, q1), u1 = _mm_unpackhi_epi32(q0, q1);
                __m128i v0 = _mm_srli_epi32(u0, 2), v1 = _mm_srli_epi32(u1, 2);  /* (q_m, q_m+4, q_m >> 2, q_m+4 >> 2) */
                const __m128i QH[4] = {_mm_unpacklo_epi64(u0, v0), _mm_unpackhi_epi64(u0, v0),
                                       _mm_unpacklo_epi64(u1, v1), _mm_unpackhi_epi64(u1, v1)};
                __m128i pl[4], ph[4], alo[4], ahi[4];
                for (int t = 0; t < nt; t++) alo[t] = ahi[t] = pl[t] = ph[t] = _mm_setzero_si128();
                for (int m = 0; m < 4; m++) {
                    __m128i qh = _mm_and_si128(QH[m], c33);
                    __m128i lo = _mm_or_si128(_mm_and_si128(T[m], c0f), _mm_and_si128(_mm_slli_epi16(qh, 4), c30));
                    __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(T[m], 4), c0f), _mm_and_si128(qh, c30));
                    int o = 128 * H + 16 * (2 * (m & 1) + (m >> 1));
                    for (int t = 0; t < nt; t++) {  /* two maddubs pairs of q <= 63 per int16: at most 32004 */
                        const uint8_t *xq = act[t] + 256 * (size_t)s + o;
                        __m128i pl1 = _mm_maddubs_epi16(lo, LD(xq)), ph1 = _mm_maddubs_epi16(hi, LD(xq + 64));
                        if (m & 1) {
                            alo[t] = _mm_add_epi32(alo[t], _mm_madd_epi16(_mm_add_epi16(pl[t], pl1), ones));
                            ahi[t] = _mm_add_epi32(ahi[t], _mm_madd_epi16(_mm_add_epi16(ph[t], ph1), ones));
                        } else {
                            pl[t] = pl1;
                            ph[t] = ph1;
                        }
                    }
                }
                __m128i sl = _mm_srai_epi32(_mm_shuffle_epi8(Z, _mm_setr_epi32(SEL3(8 * H), SEL3(8 * H + 1), SEL3(8 * H + 2),
                                                                                SEL3(8 * H + 3))), 24);
                __m128i sh = _mm_srai_epi32(_mm_shuffle_epi8(Z, _mm_setr_epi32(SEL3(8 * H + 4), SEL3(8 * H + 5),
                                                                                SEL3(8 * H + 6), SEL3(8 * H + 7))), 24);
                for (int t = 0; t < nt; t++) {
                    const int32_t *xi = (const int32_t *)(act[t] + (size_t)nsb * 256) + 32 * s + 8 * H;
                    const float *xd = (const float *)(xi + 16);
                    __m128i v = _mm_mullo_epi32(_mm_sub_epi32(alo[t], LD(xi)), sl);
                    f[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(v), _mm_loadu_ps(xd), f[t]);
                    v = _mm_mullo_epi32(_mm_sub_epi32(ahi[t], LD(xi + 4)), sh);
                    f[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(v), _mm_loadu_ps(xd + 4), f[t]);
                }
            }
            __m128 D = _mm_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(b + 208))));
            for (int t = 0; t < nt; t++) acc[r][t] = _mm_fmadd_ps(f[t], D, acc[r][t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        y[t][0] = hsum4(acc[0][t]);
        y[t][1] = hsum4(acc[1][t]);
    }
}

#define RN(name, call) MDK_TARGET(A2N) static void name(const uint8_t *const *rows, int nb, const uint8_t *const *act, \
                                                         const pf_plan *pf, float (*y)[4]) { call; }
RN(q6kn_1, k6_body128(rows, nb, act, pf, 1, y)) RN(q6kn_2, k6_body128(rows, nb, act, pf, 2, y))
RN(q6kn_3, k6_body128(rows, nb, act, pf, 3, y)) RN(q6kn_4, k6_body128(rows, nb, act, pf, 4, y))
#undef RN

const kraw_rows_fn mdk_q6k_narrow[4] = {q6kn_1, q6kn_2, q6kn_3, q6kn_4};
#endif
