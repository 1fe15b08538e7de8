/* The decode kernel of codes.c's formats on AVX-512 VNNI: rows of 256-weight units against 1-4 tokens.
 *
 * A unit's codes are read as 32 entries of 8 (entry e = codes 8e .. 8e + 7: an i-quant's grid entry, a
 * quarter of a 32-weight group) into 4 vectors in the "entry order": vector i holds entries 4m + i,
 * m = 0..7, in its 8 qwords, so qword m of every vector is group m's (32-weight groups) or group
 * 2m + i / 2's (16-weight groups). The token's int8 activations are put in the same order once a call
 * (a qword permutation per unit). Then a unit is 4 vpdpbusd into one integer vector (two for 16-weight
 * groups) whose lane pairs are groups, scaled once by A * dx and summed in fp32, and one product of the
 * B terms with sx: about 14 vector operations a unit and token where reading each 64 codes' groups apart
 * took 29. Integer sums exact: a row equals codes.c's portable product up to the order of fp32 sums.
 */
#include "kraw.h"

#if MDK_X86
#include "codes_simd.h"

/* [i, i, i, i, 4+i, ...]-style qword indices: entry 4m + i of a unit's 32 qwords */
#define ENTRY_QWORDS(i) _mm512_setr_epi64(i, 4 + (i), 8 + (i), 12 + (i), 16 + (i), 20 + (i), 24 + (i), 28 + (i))

/* Natural order (4 vectors of 64 codes or activations) -> entry order */
MDK_TARGET(A512)
static MDK_INLINE void to_entries(const __m512i *n, __m512i *e) {
    for (int i = 0; i < 4; i++) {
        __m512i idx = _mm512_setr_epi64(i, 4 + i, 8 + i, 12 + i, i, 4 + i, 8 + i, 12 + i);
        __m512i lo = _mm512_permutex2var_epi64(n[0], idx, n[1]), hi = _mm512_permutex2var_epi64(n[2], idx, n[3]);
        e[i] = _mm512_shuffle_i64x2(lo, hi, 0x44);  /* lo's qwords 0-3, then hi's */
    }
}

/* 8 scalar-built qwords: grid entries idx[m] (8 bytes each) */
MDK_TARGET(A512)
static MDK_INLINE __m512i grid_q(const uint8_t *tab, const unsigned *idx) { return grid8x8(tab, idx); }

/* One unit in entry order: codes c[4], terms A and B (group order); returns the groups (8 or 16) */
MDK_TARGET(A512)
static MDK_INLINE int unit_e(const int fmt, const mdk_codes_info *I, const uint8_t *row, int un, __m512i *c, float *A,
                             float *B) {
    const uint8_t *b = row + (size_t)un * I->bs * (256 / I->qk);
    switch (fmt) {
    case MDK_Q3K:
    case MDK_Q2K:
    case MDK_TQ2_0: {  /* qword m of vector i: the qs slice m / 4's qword i, >> 2 (m % 4), & 3 */
        const uint8_t *qs = fmt == MDK_Q3K ? b + 32 : fmt == MDK_Q2K ? b + 16 : b;
        __m512i q = _mm512_loadu_si512((const void *)qs), three = _mm512_set1_epi8(3);
        const __m512i sh = _mm512_setr_epi64(0, 2, 4, 6, 0, 2, 4, 6);
        __m512i hm = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b));
        for (int i = 0; i < 4; i++) {
            __m512i src = _mm512_permutexvar_epi64(_mm512_setr_epi64(i, i, i, i, 4 + i, 4 + i, 4 + i, 4 + i), q);
            c[i] = _mm512_and_si512(_mm512_srlv_epi64(src, sh), three);
            if (fmt == MDK_Q3K) {  /* + 4 where bit m of the mask's bytes 8i.. is set */
                __m512i h = _mm512_srlv_epi64(_mm512_permutexvar_epi64(_mm512_set1_epi64(i), hm),
                                              _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
                c[i] = _mm512_add_epi8(c[i], _mm512_slli_epi64(_mm512_and_si512(h, _mm512_set1_epi8(1)), 2));
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
        float d = h2f(rd16(b + 64));
        for (int j = 0; j < 8; j++) A[j] = d, B[j] = -d;
        return 8;
    }
    case MDK_IQ4XS:
    case MDK_IQ4NL: {  /* qword m of vector i: group m's byte-qword i % 2, nibble i / 2, through the grid */
        const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KV4U)), m4 = _mm512_set1_epi8(15);
        __m512i q0, q1;
        if (fmt == MDK_IQ4XS) {
            q0 = _mm512_loadu_si512((const void *)(b + 8));
            q1 = _mm512_loadu_si512((const void *)(b + 72));
        } else {  /* the 8 blocks' 16 bytes each, at 18 j + 2 */
            q0 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + 2)));
            q1 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + 74)));
            for (int j = 1; j < 4; j++) {
                q0 = _mm512_inserti32x4(q0, _mm_loadu_si128((const __m128i *)(b + 18 * j + 2)), j);
                q1 = _mm512_inserti32x4(q1, _mm_loadu_si128((const __m128i *)(b + 18 * (j + 4) + 2)), j);
            }
        }
        for (int i = 0; i < 4; i++) {
            __m512i idx = _mm512_setr_epi64(i & 1, 2 + (i & 1), 4 + (i & 1), 6 + (i & 1), 8 + (i & 1), 10 + (i & 1),
                                            12 + (i & 1), 14 + (i & 1));
            __m512i v = _mm512_permutex2var_epi64(q0, idx, q1);
            if (i >> 1) v = _mm512_srli_epi16(v, 4);
            c[i] = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, m4));
        }
        iq4_terms(fmt == MDK_IQ4XS, b, A, B);
        return 8;
    }
    case MDK_IQ2XXS: {
        float d = h2f(rd16(b));
        uint32_t aux[8];
        for (int m = 0; m < 8; m++) {
            memcpy(&aux[m], b + 6 + 8 * m, 4);
            A[m] = d * (0.5f + (float)(aux[m] >> 28)) * 0.25f;
            B[m] = -64.f * A[m];
        }
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            uint64_t sg = 0;
            for (int m = 0; m < 8; m++) {
                idx[m] = b[2 + 8 * m + i];
                sg |= (uint64_t)KSIGNS[(aux[m] >> (7 * i)) & 127] << (8 * m);
            }
            c[i] = signed_codes(grid_q(IQ2XXS_GRID, idx), sg, 64);
        }
        return 8;
    }
    case MDK_IQ2XS:
    case MDK_IQ2S: {
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            uint64_t sg = 0;
            for (int m = 0; m < 8; m++) {
                int e = 4 * m + i;
                if (fmt == MDK_IQ2XS) {
                    unsigned q = rd16(b + 2 + 2 * e);
                    idx[m] = q & 511;
                    sg |= (uint64_t)KSIGNS[q >> 9] << (8 * m);
                } else {
                    idx[m] = b[2 + e] | ((b[66 + m] >> (2 * i)) & 3) << 8;
                    sg |= (uint64_t)b[34 + e] << (8 * m);
                }
            }
            c[i] = signed_codes(grid_q(fmt == MDK_IQ2XS ? IQ2XS_GRID : IQ2S_GRID, idx), sg, 64);
        }
        i_quant_scales16(b + (fmt == MDK_IQ2XS ? 66 : 74), h2f(rd16(b)), A, B, 64);
        return 16;
    }
    case MDK_IQ3XXS:
    case MDK_IQ3S: {  /* entry e: grid dwords of bytes 2e, 2e + 1 of qs (word e): vector i takes words 4m + i */
        __m512i qs = _mm512_loadu_si512((const void *)(b + 2));
        uint32_t aux[8];
        uint64_t qh = 0;
        if (fmt == MDK_IQ3XXS) for (int m = 0; m < 8; m++) memcpy(&aux[m], b + 66 + 4 * m, 4);
        else memcpy(&qh, b + 66, 8);
        for (int i = 0; i < 4; i++) {
            __m512i w = _mm512_permutexvar_epi16(_mm512_setr_epi32(i | (4 + i) << 16, (8 + i) | (12 + i) << 16,
                                                                   (16 + i) | (20 + i) << 16, (24 + i) | (28 + i) << 16,
                                                                   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), qs);
            __m512i idx = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(w));
            uint64_t sg = 0;
            __m512i g;
            if (fmt == MDK_IQ3XXS) {
                for (int m = 0; m < 8; m++) sg |= (uint64_t)KSIGNS[(aux[m] >> (7 * i)) & 127] << (8 * m);
                g = _mm512_i32gather_epi32(idx, (const void *)IQ3XXS_GRID, 4);
            } else {  /* grid entries 8m + 2i, + 1: bits 2i, 2i + 1 of qh byte m are their ninth bits */
                __mmask16 hb = (__mmask16)_pext_u64(qh >> (2 * i), 0x0303030303030303ull);
                idx = _mm512_mask_or_epi32(idx, hb, idx, _mm512_set1_epi32(256));
                for (int m = 0; m < 8; m++) sg |= (uint64_t)b[74 + 4 * m + i] << (8 * m);
                g = _mm512_i32gather_epi32(idx, (const void *)IQ3S_GRID, 4);
            }
            c[i] = signed_codes(g, sg, fmt == MDK_IQ3XXS ? 64 : 16);
        }
        iq3_terms(fmt == MDK_IQ3XXS, b, A, B);
        return 8;
    }
    case MDK_IQ1S:
    case MDK_IQ1M: {  /* u = 8 g + 10, - 2 where delta < 0 */
        unsigned qh1[8];
        if (fmt == MDK_IQ1S) {
            float d = h2f(rd16(b));
            for (int m = 0; m < 8; m++) {
                qh1[m] = rd16(b + 34 + 2 * m);
                A[m] = d * (float)(2 * ((qh1[m] >> 12) & 7) + 1) * 0.125f;
                B[m] = -9.f * A[m];
            }
        } else {
            iq1m_terms(b, A, B);
        }
        for (int i = 0; i < 4; i++) {
            unsigned idx[8];
            uint64_t neg = 0;
            for (int m = 0; m < 8; m++) {
                int e = 4 * m + i;
                int n;
                if (fmt == MDK_IQ1S) {
                    idx[m] = b[2 + e] | ((qh1[m] >> (3 * i)) & 7) << 8;
                    n = (qh1[m] & 0x8000) != 0;
                } else {
                    unsigned nib = (b[32 + (e >> 1)] >> (4 * (e & 1))) & 15;
                    idx[m] = b[e] | (nib & 7) << 8;
                    n = (nib & 8) != 0;
                }
                if (n) neg |= 0xFFull << (8 * m);
            }
            __m512i g8 = _mm512_add_epi8(grid_q((const uint8_t *)IQ1S_GRID8, idx), _mm512_set1_epi8(10));
            c[i] = _mm512_mask_sub_epi8(g8, (__mmask64)neg, g8, _mm512_set1_epi8(2));
        }
        return fmt == MDK_IQ1S ? 8 : 16;
    }
    default: {  /* codes.c's reading (TQ1_0, NVFP4), then into entry order */
        _Alignas(64) uint8_t u[256];
        float D[16], M[16];
        int per = 256 / I->qk, gb = I->qk / I->gs;
        for (int j = 0; j < per; j++) {
            mdk_codes_block(fmt, b + (size_t)j * I->bs, u + I->qk * j, D, M);
            mdk_codes_terms(fmt, D, M, A + gb * j, B + gb * j);
        }
        __m512i n[4];
        for (int i = 0; i < 4; i++) n[i] = _mm512_load_si512((const void *)(u + 64 * i));
        to_entries(n, c);
        return 256 / I->gs;
    }
    }
}

/* This thread's activations in entry order, for the few tokens of the last calls (keyed by the
 * quantisation's number, as kraw_x86.c's prepared copies are) */
#define NSLOT 8
typedef struct { const mdk_q8 *a; unsigned long long gen, used; int k; int8_t *buf; int cap; } eslot;
static MDK_TLS eslot slots[NSLOT];
static MDK_TLS unsigned long long clock_;

MDK_TARGET(A512)
static const int8_t *entries_of(const mdk_q8 *a, int k) {
    eslot *best = &slots[0];
    clock_++;
    for (int i = 0; i < NSLOT; i++) {
        eslot *s = &slots[i];
        if (s->a == a && s->gen == a->gen && a->gen && s->k == k) {
            s->used = clock_;
            return s->buf;
        }
        if (s->used < best->used) best = s;
    }
    if (best->cap < k) {
        mdk_raw_free(best->buf);
        best->buf = (int8_t *)mdk_raw_alloc((size_t)k);
        best->cap = best->buf ? k : 0;
        if (!best->buf) { best->a = NULL; return NULL; }
    }
    for (int un = 0; un < k / 256; un++) {
        __m512i n[4], e[4];
        for (int i = 0; i < 4; i++) n[i] = _mm512_loadu_si512((const void *)(a->q + 256 * un + 64 * i));
        to_entries(n, e);
        for (int i = 0; i < 4; i++) _mm512_store_si512((void *)(best->buf + 256 * un + 64 * i), e[i]);
    }
    best->a = a, best->gen = a->gen, best->k = k, best->used = clock_;
    return best->buf;
}

/* y[t][r - r0] = row r times token t, rows r0..r1-1, t < nt (<= 4), x[t] the tokens in entry order */
MDK_TARGET(A512)
static MDK_INLINE void rows_e(const int fmt, const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a,
                              const int8_t *const *x, int nt, float *const *y) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    int k = w->k;
    size_t rb = kraw_row_bytes(fmt, k);
    _Alignas(64) float A[16], B[16];
    __m512i c[4];
    const __m512i pair = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i even = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
    const __m512i odd = _mm512_setr_epi32(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = kraw_row(w, r, rb);
        __m512 acc[4];
        for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
        for (int un = 0; un < k / 256; un++) {
            int G = unit_e(fmt, I, row, un, c, A, B);
            if (G == 8) {
                __m512 ap = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_load_ps(A)));
                __m256 bv = _mm256_load_ps(B);
                for (int t = 0; t < nt; t++) {
                    const int8_t *xt = x[t] + 256 * un;
                    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[0], _mm512_load_si512((const void *)xt));
                    for (int i = 1; i < 4; i++) s = _mm512_dpbusd_epi32(s, c[i], _mm512_load_si512((const void *)(xt + 64 * i)));
                    __m512 dx = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_loadu_ps(a[t]->dx + 8 * un)));
                    __m256 sb = _mm256_mul_ps(bv, _mm256_loadu_ps(a[t]->sx + 8 * un));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ap, dx), acc[t]);
                    acc[t] = _mm512_add_ps(acc[t], _mm512_zextps256_ps512(sb));
                }
            } else {
                __m512 a16 = _mm512_load_ps(A), ae = _mm512_permutexvar_ps(even, a16), ao = _mm512_permutexvar_ps(odd, a16);
                __m512 bv = _mm512_load_ps(B);
                for (int t = 0; t < nt; t++) {
                    const int8_t *xt = x[t] + 256 * un;
                    __m512i se = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[0], _mm512_load_si512((const void *)xt));
                    se = _mm512_dpbusd_epi32(se, c[1], _mm512_load_si512((const void *)(xt + 64)));
                    __m512i so = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[2], _mm512_load_si512((const void *)(xt + 128)));
                    so = _mm512_dpbusd_epi32(so, c[3], _mm512_load_si512((const void *)(xt + 192)));
                    __m512 dx = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_loadu_ps(a[t]->dx + 8 * un)));
                    acc[t] = _mm512_fmadd_ps(bv, _mm512_loadu_ps(a[t]->sxh + 16 * un), acc[t]);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(se), _mm512_mul_ps(ae, dx), acc[t]);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(so), _mm512_mul_ps(ao, dx), acc[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) y[t][r - r0] = _mm512_reduce_add_ps(acc[t]);
    }
}

typedef void (*rows_fn)(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, const int8_t *const *x, int nt,
                        float *const *y);
#define ROWS_E(F) MDK_TARGET(A512) static void rows_##F(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, \
                  const int8_t *const *x, int nt, float *const *y) { rows_e(MDK_##F, w, r0, r1, a, x, nt, y); }
ROWS_E(Q2K) ROWS_E(Q3K) ROWS_E(IQ4NL) ROWS_E(IQ4XS) ROWS_E(IQ2XXS) ROWS_E(IQ2XS) ROWS_E(IQ2S)
ROWS_E(IQ3XXS) ROWS_E(IQ3S) ROWS_E(IQ1S) ROWS_E(IQ1M) ROWS_E(TQ1_0) ROWS_E(TQ2_0) ROWS_E(NVFP4)
static const rows_fn ROWS[MDK_CODES_N] = {rows_Q2K, rows_Q3K, rows_IQ4NL, rows_IQ4XS, rows_IQ2XXS, rows_IQ2XS,
                                          rows_IQ2S, rows_IQ3XXS, rows_IQ3S, rows_IQ1S, rows_IQ1M, rows_TQ1_0,
                                          rows_TQ2_0, rows_NVFP4};

/* Rows r0..r1-1 against nt (1..4) tokens on AVX-512; 0 where this path does not take the matrix */
int mdk_codes_x86(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (mdk_path != MDK_PATH_AVX512 || !MDK_IS_CODES(w->fmt) || w->k % 256) return 0;
    const int8_t *x[4];
    for (int t = 0; t < nt; t++)
        if (!(x[t] = entries_of(a[t], w->k))) return 0;
    ROWS[w->fmt - MDK_Q2K](w, r0, r1, a, x, nt, y);
    return 1;
}
#endif
