/* codes.c's formats on AVX2 (the consumer CPUs without AVX-512): rows of 256-weight units, 1-4 tokens.
 *
 * A unit is read into 8 vectors of 32 signed values v = u - off (|v| <= 127; Q2_K keeps its unsigned
 * codes 0..3 and its minimum term), each format unpacked with AVX2 (2-bit fields by shifts, Q3_K's mask
 * bits by compares, IQ4's and NVFP4's nibbles through pshufb on signed grids, the i-quants' grid
 * entries loaded a few at a time with their sign bits turned into byte masks). A product of 32 values
 * is llama.cpp's AVX2 one: maddubs(|v|, sign(x, v)) (no saturation: two products of at most 127 * 127),
 * madd with ones into 8 int32 lanes, scaled by the group's A * dx (a 32-weight group a vector, or two
 * 16-weight groups a half each) and summed in fp32. Integer sums exact: a row equals codes.c's portable
 * product up to the order of the fp32 additions. Q2_K and Q3_K have their own kernels (codes_k23_avx2.c),
 * IQ4_XS and IQ4_NL their own rows (rows_iq4: a group at a time).
 */
#include "kraw.h"

#if MDK_X86
#include <immintrin.h>
#include <string.h>

#include "codes_avx2.h"
#include "iq_grids.h"

static const int8_t KV4S[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t NVS[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 32 sign bits -> bytes -1 where set, else 0 */
MDK_TARGET(A2)
static MDK_INLINE __m256i bits_to_bytes(uint32_t m) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}

/* g with the bytes whose bit is set in m negated */
MDK_TARGET(A2)
static MDK_INLINE __m256i signed32(__m256i g, uint32_t m) {
    __m256i s = bits_to_bytes(m);
    return _mm256_sub_epi8(_mm256_xor_si256(g, s), s);
}

MDK_TARGET(A2)
static MDK_INLINE __m256i four_entries(const uint8_t *tab, unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    uint64_t g[4];
    memcpy(&g[0], tab + 8 * (size_t)i0, 8);
    memcpy(&g[1], tab + 8 * (size_t)i1, 8);
    memcpy(&g[2], tab + 8 * (size_t)i2, 8);
    memcpy(&g[3], tab + 8 * (size_t)i3, 8);
    return _mm256_loadu_si256((const __m256i *)g);
}

static MDK_INLINE uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)KSIGNS[aux & 127] | (uint32_t)KSIGNS[(aux >> 7) & 127] << 8 |
           (uint32_t)KSIGNS[(aux >> 14) & 127] << 16 | (uint32_t)KSIGNS[(aux >> 21) & 127] << 24;
}

/* One unit: v[8] (32 values each, natural order), per group A (and B: Q2_K's minimum term, else 0);
 * returns the groups (8 or 16). */
MDK_TARGET(A2)
static MDK_INLINE int unit2(const int fmt, const mdk_codes_info *I, const uint8_t *row, int un, __m256i *v, float *A,
                            float *B) {
    const uint8_t *b = row + (size_t)un * I->bs * (256 / I->qk);
    const __m256i three = _mm256_set1_epi8(3);
    switch (fmt) {
    case MDK_Q2K:
    case MDK_Q3K:
    case MDK_TQ2_0: {
        const uint8_t *qs = fmt == MDK_Q3K ? b + 32 : fmt == MDK_Q2K ? b + 16 : b;
        __m256i hm = _mm256_loadu_si256((const __m256i *)b);
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), three);
                if (fmt == MDK_Q3K) {  /* - 4 where the mask bit is clear */
                    __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
                    __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                    c = _mm256_sub_epi8(c, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
                } else if (fmt == MDK_TQ2_0) {
                    c = _mm256_sub_epi8(c, _mm256_set1_epi8(1));
                }
                v[4 * h + s] = c;
            }
        }
        if (fmt == MDK_Q3K) {
            float d = h2f(rd16(b + 108));
            const uint8_t *s = b + 96;
            for (int i = 0; i < 16; i++) {
                int lo = (s[i & 7] >> (4 * (i >> 3))) & 15, hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
                A[i] = d * (float)((lo | hi << 4) - 32);
                B[i] = 0.f;
            }
            return 16;
        }
        if (fmt == MDK_Q2K) {
            float d = h2f(rd16(b + 80)), dmin = h2f(rd16(b + 82));
            for (int g = 0; g < 16; g++) A[g] = d * (float)(b[g] & 15), B[g] = -(dmin * (float)(b[g] >> 4));
            return 16;
        }
        float d = h2f(rd16(b + 64));
        for (int g = 0; g < 8; g++) A[g] = d, B[g] = 0.f;
        return 8;
    }
    case MDK_NVFP4: {  /* 4 blocks of 36: 4 scale bytes, then 32 bytes (4 groups of 16: lo 8, hi 8); IQ4_XS and
                          IQ4_NL have their own rows (rows_iq4) */
        const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)NVS));
        for (int j = 0; j < 4; j++) {
            const uint8_t *p = b + 36 * j;
            __m128i q = _mm_loadu_si128((const __m128i *)(p + 4)), q2 = _mm_loadu_si128((const __m128i *)(p + 20));
            for (int h = 0; h < 2; h++) {  /* groups 2h, 2h + 1 of the block: 8 bytes each */
                __m128i x = h ? q2 : q, lo = _mm_and_si128(x, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(15));
                /* group 2h: lo bytes 0..7 then hi bytes 0..7; group 2h + 1: lo 8..15, hi 8..15 */
                __m256i g = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
                v[2 * j + h] = _mm256_shuffle_epi8(tab, g);
            }
            for (int s = 0; s < 4; s++) {
                unsigned x = p[s], e = (x >> 3) & 15, m = x & 7;
                float raw = e == 0 ? (float)m * 0x1p-9f : (1.f + (float)m / 8.f) * (float)(1 << e) * 0x1p-7f;
                A[4 * j + s] = (x == 0 || x == 0x7F) ? 0.f : raw * 0.5f;
                B[4 * j + s] = 0.f;
            }
        }
        return 16;
    }
    case MDK_IQ2XXS: {
        float d = h2f(rd16(b));
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = b + 2 + 8 * g;
            uint32_t aux;
            memcpy(&aux, q + 4, 4);
            v[g] = signed32(four_entries(IQ2XXS_GRID, q[0], q[1], q[2], q[3]), ksigns4(aux));
            A[g] = d * (0.5f + (float)(aux >> 28)) * 0.25f, B[g] = 0.f;
        }
        return 8;
    }
    case MDK_IQ2XS:
    case MDK_IQ2S: {
        float d = h2f(rd16(b));
        for (int j = 0; j < 8; j++) {  /* entries 4j .. 4j + 3 */
            unsigned idx[4];
            uint32_t m = 0;
            for (int e = 0; e < 4; e++) {
                int n = 4 * j + e;
                if (fmt == MDK_IQ2XS) {
                    unsigned q = rd16(b + 2 + 2 * n);
                    idx[e] = q & 511;
                    m |= (uint32_t)KSIGNS[q >> 9] << (8 * e);
                } else {
                    idx[e] = b[2 + n] | ((b[66 + (n >> 2)] >> (2 * (n & 3))) & 3) << 8;
                    m |= (uint32_t)b[34 + n] << (8 * e);
                }
            }
            v[j] = signed32(four_entries(fmt == MDK_IQ2XS ? IQ2XS_GRID : IQ2S_GRID, idx[0], idx[1], idx[2], idx[3]), m);
        }
        const uint8_t *sc = b + (fmt == MDK_IQ2XS ? 66 : 74);
        for (int j = 0; j < 16; j++) A[j] = d * (0.5f + (float)((sc[j >> 1] >> (4 * (j & 1))) & 15)) * 0.25f, B[j] = 0.f;
        return 16;
    }
    case MDK_IQ3XXS:
    case MDK_IQ3S: {  /* a group of 32: 8 grid dwords, gathered */
        float d = h2f(rd16(b));
        for (int g = 0; g < 8; g++) {
            __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * g)));
            uint32_t m;
            __m256i gv;
            if (fmt == MDK_IQ3XXS) {
                uint32_t aux;
                memcpy(&aux, b + 66 + 4 * g, 4);
                m = ksigns4(aux);
                gv = _mm256_i32gather_epi32((const int *)IQ3XXS_GRID, idx, 4);
                A[g] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            } else {  /* grid entries 8g .. 8g + 7: bit e of qh byte g is entry 8g + e's ninth bit */
                __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[66 + g]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                              _mm256_set1_epi32(1));
                idx = _mm256_or_si256(idx, _mm256_slli_epi32(hb, 8));
                memcpy(&m, b + 74 + 4 * g, 4);
                gv = _mm256_i32gather_epi32((const int *)IQ3S_GRID, idx, 4);
                A[g] = d * (float)(1 + 2 * ((b[106 + (g >> 1)] >> (4 * (g & 1))) & 15));
            }
            v[g] = signed32(gv, m);
            B[g] = 0.f;
        }
        return 8;
    }
    case MDK_IQ1S:
    case MDK_IQ1M: {  /* v = 8 g + 1, or - 1 where delta < 0 */
        unsigned s4[4];
        float d1 = 0.f;
        if (fmt == MDK_IQ1M) {
            for (int i = 0; i < 4; i++) s4[i] = rd16(b + 48 + 2 * i);
            d1 = h2f((uint16_t)((s4[0] & 0xF000) >> 12 | (s4[1] & 0xF000) >> 8 | (s4[2] & 0xF000) >> 4 | (s4[3] & 0xF000)));
        }
        for (int j = 0; j < 8; j++) {  /* entries 4j .. 4j + 3 */
            unsigned idx[4];
            uint32_t neg = 0;
            for (int e = 0; e < 4; e++) {
                int n = 4 * j + e, ng;
                if (fmt == MDK_IQ1S) {
                    unsigned qh = rd16(b + 34 + 2 * j);
                    idx[e] = b[2 + n] | ((qh >> (3 * e)) & 7) << 8;
                    ng = (qh & 0x8000) != 0;
                } else {
                    unsigned nib = (b[32 + (n >> 1)] >> (4 * (n & 1))) & 15;
                    idx[e] = b[n] | (nib & 7) << 8;
                    ng = (nib & 8) != 0;
                }
                if (ng) neg |= 0xFFu << (8 * e);
            }
            __m256i g8 = four_entries((const uint8_t *)IQ1S_GRID8, idx[0], idx[1], idx[2], idx[3]);
            __m256i one = _mm256_set1_epi8(1);
            v[j] = _mm256_sub_epi8(_mm256_add_epi8(g8, one), _mm256_and_si256(bits_to_bytes(neg), _mm256_set1_epi8(2)));
        }
        if (fmt == MDK_IQ1S) {
            float d = h2f(rd16(b));
            for (int g = 0; g < 8; g++) {
                unsigned qh = rd16(b + 34 + 2 * g);
                A[g] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f, B[g] = 0.f;
            }
            return 8;
        }
        for (int j = 0; j < 16; j++) A[j] = d1 * (float)(2 * ((s4[j >> 2] >> (3 * (j & 3))) & 7) + 1) * 0.125f, B[j] = 0.f;
        return 16;
    }
    default: {  /* codes.c's reading (TQ1_0) */
        uint8_t u[256];
        float D[16], M[16], Bt[16];
        int per = 256 / I->qk, gb = I->qk / I->gs;
        for (int j = 0; j < per; j++) {
            mdk_codes_block(fmt, b + (size_t)j * I->bs, u + I->qk * j, D, M);
            mdk_codes_terms(fmt, D, M, A + gb * j, Bt + gb * j);
        }
        for (int j = 0; j < 8; j++)
            v[j] = _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(u + 32 * j)), _mm256_set1_epi8((char)I->off));
        for (int g = 0; g < 256 / I->gs; g++) B[g] = 0.f;
        return 256 / I->gs;
    }
    }
}

/* y[t][r - r0] = row r times token t, rows r0..r1-1, t < nt (<= 4) */
MDK_TARGET(A2)
static MDK_INLINE void rows2(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt,
                             float *const *y) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    int k = w->k;
    size_t rb = kraw_row_bytes(fmt, k);
    float A[16], B[16];
    __m256i v[8], av[8];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m256 acc[4], accbv[4];
        for (int t = 0; t < nt; t++) acc[t] = accbv[t] = _mm256_setzero_ps();
        for (int un = 0; un < k / 256; un++) {
            int G = unit2(fmt, I, row, un, v, A, B);
            const int uns = fmt == MDK_Q2K;  /* codes 0..3, unsigned: no sign to move */
            for (int j = 0; j < 8; j++) av[j] = uns ? v[j] : _mm256_sign_epi8(v[j], v[j]);
            for (int t = 0; t < nt; t++) {
                const int8_t *x = a[t]->q + 256 * un;
                const float *dx = a[t]->dx + 8 * un;
                for (int j = 0; j < 8; j++) {
                    __m256i xj = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av[j], uns ? xj : _mm256_sign_epi8(xj, v[j])), ones);
                    __m256 s = G == 8 ? _mm256_set1_ps(A[j] * dx[j])
                                      : _mm256_set_m128(_mm_set1_ps(A[2 * j + 1] * dx[j]), _mm_set1_ps(A[2 * j] * dx[j]));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[t]);
                }
                if (uns) {  /* Q2_K's minimum terms: B . sxh over the unit's 16 groups */
                    const float *sx = a[t]->sxh + 16 * un;
                    accbv[t] = _mm256_fmadd_ps(_mm256_loadu_ps(B), _mm256_loadu_ps(sx), accbv[t]);
                    accbv[t] = _mm256_fmadd_ps(_mm256_loadu_ps(B + 8), _mm256_loadu_ps(sx + 8), accbv[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = hsum8(_mm256_add_ps(acc[t], accbv[t]));
    }
}

/* IQ4_XS and IQ4_NL, a group at a time: rows2 decodes a unit's 8 groups first (v[8] and av[8]: with the
 * accumulators more than AVX2's 16 registers, so they went through the stack) and then takes each token;
 * here each group's two vectors are made, used by every token and dropped. Two accumulators a token (even
 * and odd groups) halve the chain of dependent fmadds; the 8 scales are made in one vector; the rows 2 on
 * are prefetched a unit at a time (perf put the samples on the weights' loads). On the AVX2-only AMD EPYC,
 * one process interleaved: a [16384, 2048] IQ4_XS at 1 token, 2 threads, 7.8 -> 10.6 G weights/s (best of
 * 12; 4 tokens unchanged); decode of the tiny Qwen3 IQ4_XS file faster in 8 of 10 rounds, mean 18.1 -> 19.2
 * tok/s, best 20.6 -> 22.2. */
MDK_TARGET(A2)
static MDK_INLINE void rows_iq4(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt,
                                float *const *y) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    const int k = w->k;
    const size_t rb = kraw_row_bytes(fmt, k), ub = (size_t)I->bs * (256 / I->qk);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KV4S));
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m256 acc[4][2];
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        const uint8_t *pfrow = r + 2 < r1 ? kraw_row(w, r + 2, rb) : NULL;  /* 2 rows on: 4 and 8 measured no better */
        for (int un = 0; un < k / 256; un++) {
            const uint8_t *b = row + (size_t)un * ub;
            if (pfrow) {
                const uint8_t *pf = pfrow + (size_t)un * ub;
                for (size_t o = 0; o < ub; o += 64) PREFETCH(pf + o);
                PREFETCH(pf + ub - 1);
            }
            __m256 A;
            if (fmt == MDK_IQ4XS) {  /* the 8 groups' 6-bit scales at once: low nibbles in bytes 4..7, high pairs in the u16 at 2 */
                uint32_t lo;
                memcpy(&lo, b + 4, 4);
                const __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                                   _mm256_set1_epi32(15));
                const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)rd16(b + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                                   _mm256_set1_epi32(3));
                const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
                A = _mm256_mul_ps(_mm256_set1_ps(h2f(rd16(b))), _mm256_cvtepi32_ps(sc));
            } else {
                A = _mm256_setr_ps(h2f(rd16(b)), h2f(rd16(b + 18)), h2f(rd16(b + 36)), h2f(rd16(b + 54)), h2f(rd16(b + 72)),
                                   h2f(rd16(b + 90)), h2f(rd16(b + 108)), h2f(rd16(b + 126)));
            }
            float S[4][8];  /* each group's weight scale times the token's activation scale */
            for (int t = 0; t < nt; t++) _mm256_storeu_ps(S[t], _mm256_mul_ps(A, _mm256_loadu_ps(a[t]->dx + 8 * un)));
            for (int j = 0; j < 8; j++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(fmt == MDK_IQ4XS ? b + 8 + 16 * j : b + 18 * j + 2));
                const __m256i v = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4));
                const __m256i av = _mm256_sign_epi8(v, v);
                for (int t = 0; t < nt; t++) {
                    const __m256i xj = _mm256_loadu_si256((const __m256i *)(a[t]->q + 256 * un + 32 * j));
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(xj, v)), ones);
                    acc[t][j & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&S[t][j]), acc[t][j & 1]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = hsum8(_mm256_add_ps(acc[t][0], acc[t][1]));
    }
}

typedef void (*rows_fn)(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
/* nt a constant in each copy: the accumulators stay in registers (with nt passed through, each group's
 * fmadd went through acc[] on the stack: IQ4_XS decode of the tiny Qwen3 file, one process interleaved,
 * best of 6 rounds 16.0 -> 17.9 tok/s, faster in 5 of the 6 pairs, on the AVX2-only AMD EPYC) */
#define BY_NT(KERNEL, F) MDK_TARGET(A2) static void KERNEL##_##F(const mdk_matrix *w, int r0, int r1, \
                 const mdk_q8 *const *a, int nt, float *const *y) { \
    switch (nt) { \
    case 1: KERNEL(MDK_##F, w, r0, r1, a, 1, y); break; \
    case 2: KERNEL(MDK_##F, w, r0, r1, a, 2, y); break; \
    case 3: KERNEL(MDK_##F, w, r0, r1, a, 3, y); break; \
    default: KERNEL(MDK_##F, w, r0, r1, a, 4, y); break; \
    } }
BY_NT(rows_iq4, IQ4NL) BY_NT(rows_iq4, IQ4XS)
BY_NT(rows2, IQ2XXS) BY_NT(rows2, IQ2XS) BY_NT(rows2, IQ2S) BY_NT(rows2, IQ3XXS) BY_NT(rows2, IQ3S)
BY_NT(rows2, IQ1S) BY_NT(rows2, IQ1M) BY_NT(rows2, TQ1_0) BY_NT(rows2, TQ2_0) BY_NT(rows2, NVFP4)
static const rows_fn ROWS[MDK_CODES_N] = {NULL, NULL, rows_iq4_IQ4NL, rows_iq4_IQ4XS, rows2_IQ2XXS, rows2_IQ2XS,
                                          rows2_IQ2S, rows2_IQ3XXS, rows2_IQ3S, rows2_IQ1S, rows2_IQ1M, rows2_TQ1_0,
                                          rows2_TQ2_0, rows2_NVFP4};

/* Rows r0..r1-1 against nt (1..4) tokens on the AVX2 path; 0 where it does not take the matrix */
int mdk_codes_avx2(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (mdk_path != MDK_PATH_AVX2 || !MDK_IS_CODES(w->fmt) || w->k % 256) return 0;
    if (w->fmt == MDK_Q2K || w->fmt == MDK_Q3K) mdk_k23_avx2(w, r0, r1, a, nt, y);  /* codes_k23_avx2.c */
    else ROWS[w->fmt - MDK_Q2K](w, r0, r1, a, nt, y);
    return 1;
}
#endif
