/* Q2_K and Q3_K (the tiers cpu-2 and cpu-3, and the files' own 2- and 3-bit matrices) on AVX2: rows of
 * 256-weight units against 1-4 tokens, called by codes_avx2.c's dispatcher. Integer sums exact: a row
 * equals codes.c's portable product up to the order of the fp32 additions. */
#include "kraw.h"

#if MDK_X86
#include "codes_avx2.h"

/* A unit's header: its 16 groups' integer scales, int8, and d; Q2_K's dmin and minimums m (the high
 * nibbles), Q3_K's dmin 4 d (its codes' -4 as a minimum term, -4 d sc) and m 0. Q3_K's 6-bit scales come
 * from 12 bytes in 32-bit words, as ggml's dequantize_row_q3_K reads them, built in registers: written
 * as four 32-bit stores and read back as one 128-bit load they stalled store forwarding (15% of its time). */
MDK_TARGET(A2)
static MDK_INLINE __m128i k23_unit(const int q3, const uint8_t *b, float *d, float *dmin, __m128i *m) {
    if (q3) {
        uint32_t aux[3];
        const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
        memcpy(aux, b + 96, 12);
        *d = h2f(rd16(b + 108));
        *dmin = 4.f * *d;
        *m = _mm_setzero_si128();
        return _mm_sub_epi8(_mm_setr_epi32((int)((aux[0] & k2) | (((aux[2] >> 0) & k1) << 4)),
                                           (int)((aux[1] & k2) | (((aux[2] >> 2) & k1) << 4)),
                                           (int)(((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4)),
                                           (int)(((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4))),
                            _mm_set1_epi8(32));
    }
    __m128i raw = _mm_loadu_si128((const __m128i *)b);
    *d = h2f(rd16(b + 80));
    *dmin = h2f(rd16(b + 82));
    *m = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
    return _mm_and_si128(raw, _mm_set1_epi8(15));
}

/* Q2_K and Q3_K (the tiers cpu-2 and cpu-3) as llama.cpp's AVX2 kernels multiply them: unsigned codes
 * (Q2_K 0..3; Q3_K 0..7, its -4 moved into the minimum term: B = -4 d sc), maddubs(u, x) into int16 pairs,
 * madd with the groups' integer scales (16-weight groups: each half of a 32-value chunk its own) into
 * int32, one fp32 fma a chunk by d * dx; B . sxh for the minimum terms: 5 vector operations a chunk
 * and token, where rows2's float scales per 16-weight group took about 10; the token count a constant
 * (K23), so the accumulators stay in registers. AMD EPYC (Zen 1, AVX2 only), 2 threads, Qwen3's
 * gate+up [1536, 2048] from memory, 1 token, G weights/s against rows2: Q2_K 7.4 -> 14.9, Q3_K 6.9 ->
 * 10.9 (Q4_K's own AVX2 kernel: 12.0). Now
 * Q3_K's kernel for 1 token (and the fallback where no prepared copy could be allocated); the lanes
 * kernel below runs the rest. */
MDK_TARGET(A2)
static MDK_INLINE void rows_k23(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt,
                                float *const *y) {
    int k = w->k;
    size_t rb = kraw_row_bytes(fmt, k);
    const int q3 = fmt == MDK_Q3K, bsz = q3 ? 110 : 84;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    /* chunk c % 4 of a half: int16 lane 2c % 8 in the low 128 bits, lane (2c + 1) % 8 in the high */
    static const int8_t SH[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
         14, 15, 14, 15}};
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m256 acc[4], accb[4];
        for (int t = 0; t < nt; t++) acc[t] = accb[t] = _mm256_setzero_ps();
        for (int un = 0; un < k / 256; un++) {
            const uint8_t *b = row + (size_t)un * bsz;
            float d, dmin;
            __m128i m;
            const __m128i sc8 = k23_unit(q3, b, &d, &dmin, &m);
            /* minimum terms B[g]: Q2_K -dmin m_g; Q3_K -4 d sc_g */
            __m256 B0, B1;
            if (q3) {
                B0 = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)));
                B1 = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))));
            } else {
                B0 = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m)));
                B1 = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(m, 8))));
            }
            float dd[4][8];
            for (int t = 0; t < nt; t++) {
                _mm256_storeu_ps(dd[t], _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps(a[t]->dx + 8 * un)));
                const float *sx = a[t]->sxh + 16 * un;
                accb[t] = _mm256_fmadd_ps(B0, _mm256_loadu_ps(sx), accb[t]);
                accb[t] = _mm256_fmadd_ps(B1, _mm256_loadu_ps(sx + 8), accb[t]);
            }
            const __m256i half0 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));
            const __m256i half1 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
            const uint8_t *qs = q3 ? b + 32 : b + 16;
            const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
            for (int c = 0; c < 8; c++) {  /* chunk c: values 32c..32c+31, groups 2c and 2c + 1 */
                const int h = c >> 2, s2 = c & 3;
                __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), three);
                if (q3)  /* + 4 where the mask bit is set */
                    v = _mm256_or_si256(v, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hm, c), 2), four));
                const __m256i scv = _mm256_shuffle_epi8(h ? half1 : half0, _mm256_loadu_si256((const __m256i *)SH[s2]));
                for (int t = 0; t < nt; t++) {
                    __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)(a[t]->q + 256 * un + 32 * c)));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, scv)), _mm256_broadcast_ss(dd[t] + c), acc[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = hsum8(_mm256_add_ps(acc[t], accb[t]));
    }
}


/* The same products with a lane per 16-weight group (kraw_x86.c's idea for Q4_K): the token's values
 * are prepared once per thread in an order (MDK_PREP_K23) where dword lane d of vector v of half h holds
 * positions 4v + 16 (d / 4) .. + 3 of chunk 4h + d % 4, so the codes of a row come out in that order
 * with an in-lane dword broadcast and a shift by 2 (d % 4) per lane (Q3_K's mask bit likewise): lane d
 * is group 8h + 2 (d % 4) + d / 4 in all 4 vectors of a half. Per half and token: 4 maddubs summed in
 * int16 (at most 4 x 2 x 7 x 128 = 7168; Q3_K's -4 taken off as 4 s16[g], prepared in lane order), one
 * madd with the groups' scales; per unit and token one fp32 fold (the chunks' dx broadcast from
 * mdk_q8); Q2_K's minimum terms in integers, a chunk a lane (madd of the minimums with s16).
 * AMD EPYC Zen 1, 2 threads, Qwen3's gate+up [1536, 2048] from memory, G weights/s, rows_k23 -> this:
 * Q2_K 1 token 16.3 -> 17.2, 4 tokens 21 -> 26.6; Q3_K 4 tokens 18.5 -> 22.2 (Q4_K 17.3 / 27.5). At
 * 1 token the operations a vector bound it on Zen 1 (pshufd, srlv, and, maddubs, add: about one
 * 256-bit operation a cycle), as they bound Q4_K: Q2_K's fewer bytes pay no more there. */
#define BCAST32(x, v) ((v) == 0 ? _mm256_shuffle_epi32(x, 0x00) : (v) == 1 ? _mm256_shuffle_epi32(x, 0x55) \
                       : (v) == 2 ? _mm256_shuffle_epi32(x, 0xAA) : _mm256_shuffle_epi32(x, 0xFF))
MDK_TARGET(A2)
static MDK_INLINE void rows_k23l(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a,
                                 const uint8_t *const *act, int nt, float *const *y) {
    int k = w->k;
    size_t rb = kraw_row_bytes(fmt, k);
    const int q3 = fmt == MDK_Q3K, bsz = q3 ? 110 : 84;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i sh2 = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m256i sh1 = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);  /* Q3_K: mask bit 4h + d % 4 to bit 2 */
    /* int16 scale i of a half's 8 (groups 8h + i) to lane d's pair: i = 2 (d % 4) + d / 4 */
    const __m256i scp = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 2, 3, 2, 3, 6, 7, 6, 7,
                                         10, 11, 10, 11, 14, 15, 14, 15);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m256 acc[4], accb[4];
        for (int t = 0; t < nt; t++) acc[t] = accb[t] = _mm256_setzero_ps();
        for (int un = 0; un < k / 256; un++) {
            const uint8_t *b = row + (size_t)un * bsz;
            float d, dmin;  /* (Q3_K's dmin and minimums are not used here: its -4 is in the prepared copy) */
            __m128i m;
            const __m128i sc8 = k23_unit(q3, b, &d, &dmin, &m);
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            const __m256i S[2] = {_mm256_shuffle_epi8(_mm256_permute2x128_si256(sc16, sc16, 0x00), scp),
                                  _mm256_shuffle_epi8(_mm256_permute2x128_si256(sc16, sc16, 0x11), scp)};
            const uint8_t *qs = q3 ? b + 32 : b + 16;
            const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
            __m256 F[4];
            for (int t = 0; t < nt; t++) F[t] = _mm256_setzero_ps();
            for (int h = 0; h < 2; h++) {
                const __m256i Q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                /* the mask bits 4h.. at bit 2 of each byte (then lane d's bit 2 + d % 4 after its shift) */
                const __m256i HH = h ? _mm256_srli_epi16(hm, 2) : _mm256_slli_epi16(hm, 2);
                __m256i P[4];
                for (int t = 0; t < nt; t++) P[t] = _mm256_setzero_si256();
                for (int v = 0; v < 4; v++) {
                    __m256i W = _mm256_and_si256(_mm256_srlv_epi32(BCAST32(Q, v), sh2), three);
                    if (q3) W = _mm256_or_si256(W, _mm256_and_si256(_mm256_srlv_epi32(BCAST32(HH, v), sh1), four));
                    for (int t = 0; t < nt; t++)
                        P[t] = _mm256_add_epi16(P[t], _mm256_maddubs_epi16(W, _mm256_loadu_si256(
                                   (const __m256i *)(act[t] + 256 * (size_t)un + 128 * h + 32 * v))));
                }
                for (int t = 0; t < nt; t++) {
                    if (q3)  /* the codes' -4: 4 s16[g] off each lane's pair sum (prepared in lane order) */
                        P[t] = _mm256_sub_epi16(P[t], _mm256_loadu_si256((const __m256i *)(act[t] + k) + 2 * un + h));
                    F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(P[t], S[h])),
                                           _mm256_broadcast_ps((const __m128 *)(a[t]->dx + 8 * un + 4 * h)), F[t]);
                }
            }
            const __m256 D = _mm256_set1_ps(d);
            for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(F[t], D, acc[t]);
            if (!q3) {  /* Q2_K's minimum terms -dmin m_g s16_g dx_c, in integers a chunk (its two groups) */
                const __m256i m16 = _mm256_cvtepu8_epi16(m);
                const __m256 DM = _mm256_set1_ps(-dmin);
                for (int t = 0; t < nt; t++) {
                    __m256i mi = _mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)(a[t]->s16 + 16 * un)));
                    accb[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(mi), _mm256_loadu_ps(a[t]->dx + 8 * un)),
                                              DM, accb[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = hsum8(_mm256_add_ps(acc[t], accb[t]));
    }
}

/* Q2_K: the lanes kernel. Q3_K: the lanes kernel from 2 tokens; for 1 token rows_k23 (its mask bits
 * cost the lanes kernel 4 more operations a vector: 11.1 against 11.6 G weights/s, see rows_k23l) */
#define K23(F, fmt) MDK_TARGET(A2) static void F(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, \
                                                 float *const *y) {                                              \
    const uint8_t *act[4];                                                                                       \
    int ok = fmt == MDK_Q2K || nt > 1;                                                                           \
    for (int t = 0; ok && t < nt; t++) ok = (act[t] = mdk_prepared_act(MDK_PREP_K23, a[t], w->k)) != NULL;       \
    if (!ok) { /* (or no buffer for the prepared copy) */                                                    \
        if (nt == 1) rows_k23(fmt, w, r0, r1, a, 1, y); else rows_k23(fmt, w, r0, r1, a, nt < 4 ? nt : 4, y);   \
        return;                                                                                                  \
    }                                                                                                            \
    switch (nt) {                                                                                                \
    case 1: rows_k23l(fmt, w, r0, r1, a, act, 1, y); return;                                                     \
    case 2: rows_k23l(fmt, w, r0, r1, a, act, 2, y); return;                                                     \
    case 3: rows_k23l(fmt, w, r0, r1, a, act, 3, y); return;                                                     \
    default: rows_k23l(fmt, w, r0, r1, a, act, 4, y); return;                                                    \
    }                                                                                                            \
}
K23(rows_q2k, MDK_Q2K) K23(rows_q3k, MDK_Q3K)

void mdk_k23_avx2(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (w->fmt == MDK_Q2K) rows_q2k(w, r0, r1, a, nt, y);
    else rows_q3k(w, r0, r1, a, nt, y);
}
#endif
