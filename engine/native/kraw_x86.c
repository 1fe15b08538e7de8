/* The x86 SIMD kernels of raw GGUF rows (kraw.c: the layout and the arithmetic), AVX-512 VNNI and
 * AVX2, for all 8 block formats (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
 *
 * Why the rows are reshuffled in registers: in a raw row, the 64 bytes of one load are 16 dwords of
 * 4 weights of ONE row and of several sub-blocks, and a sub-block's 32 weights span 8 dwords. The
 * tiles (kquant.c) put one row per 32-bit lane, so an integer dot product adds each lane's 4
 * products straight into that row's sum. Here each kernel loads 4 rows (AVX2: 2) and permutes their
 * dwords so that lane (row, sub-block) of every vector holds a dword of that row and sub-block: 8
 * vectors accumulate into one vector of 16 (row, sub-block) sums, no horizontal reduction, and one
 * float fold per 16 sums, as the tiles'. The permutes are shared by the tokens of a call (1..4).
 * Each token's activation is rearranged once to the matching order (prep, kept per thread under
 * the token's mdk_q8.gen: the callers run 16 rows a call, and the copy serves all their calls), so
 * that a 16-byte broadcast load feeds each dot product.
 *
 * Lanes (AVX-512): chunk r (128 bits) = row r of the group, lane j inside it:
 *   Q4_K/Q5_K  lane p = sub-block pair p (vectors of low nibbles: sub-block 2p; high: 2p+1); the 8
 *              vectors of a super-block are the dwords (h, m): bytes 16h + 4m.. of each pair's 32
 *   Q6_K       lane q: 16-weight group 8H + q (low nibbles) / 8H + 4 + q (high) of half H
 *   32-weight  lane b: block 4u + b of a unit of 4 blocks (Q8_0: 8 vectors, the blocks' dwords; the
 *              4-bit formats: 4, low and high nibbles; every field sits at an even offset, so a 16-bit
 *              permute gathers them from the 34 / 18 / 20 / 22 / 24-byte blocks)
 * AVX2: the same with 2 rows, a row per 128-bit half; its u8 x s8 products are maddubs pairs summed
 * in int16 while they cannot saturate (at most 30480 / 31496 / 32004 / 15748; Q8_0 signed, |q| times
 * sign(x, q): 32512), then madd to int32.
 *
 * Integer sums are exact and equal to the tiles' (the same products of the same int8 activations):
 * Q4_K's, Q4_0's and Q4_1's high nibbles are read as (byte & 0xF0), 16 times the value, the sum
 * shifted back exactly; Q8_0 as q + 128 (u8), less 128 * sum(xq). Float terms are folded per lane and
 * the 4 lanes of a row summed at the end of the row, so results differ from the tiles' only in fp32
 * rounding. Rows past a multiple of 4 (2) reuse the last row's pointer (results dropped); Q8_0..Q5_1
 * blocks past a multiple of 4 run kraw.c's portable terms.
 */
#include "kraw.h"

#include <string.h>

#if MDK_X86
#include <immintrin.h>

#define A512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define A2 "avx2,fma,f16c"


/* ---------------- activation prep: one token in each format's order (AVX2, both paths) ----------------
 * K4 (Q4_K, Q5_K): per super-block 256 bytes: at 128 nib + 32m + 16h, for p = 0..3 the 4 bytes at
 *   64p + 32 nib + 16h + 4m (nib 0: sub-block 2p's, 1: 2p+1's); then per super-block 16 floats: dx
 *   of sub-blocks 0,2,4,6, of 1,3,5,7, then sx of the same.
 * K6 (Q6_K): per super-block 256 bytes: at 64 (2H + nib) + 16 (2 (m & 1) + (m >> 1)), for q = 0..3
 *   the 4 bytes at 128H + 64 nib + 16q + 4m; then per super-block 16 int32 32 * s16[g] and 16
 *   floats dx[g / 2], g = 0..15 the 16-weight groups.
 * QB (the 32-weight formats): per unit of 4 blocks 128 bytes: at 32 (i & 3) + 16 (i >> 2), for b = 0..3
 *   the 4 bytes at 32b + 4i (the blocks' dword i: 4-bit formats' low nibbles of qs dword i are dword i,
 *   their high nibbles dword 4 + i); then per unit 4 int32 sum(xq), 4 floats dx, 4 floats sx. */
enum { KIND_K4, KIND_K6, KIND_QB, KIND_K23 = MDK_PREP_K23 };

static size_t prep_bytes(int kind, int k) {
    if (kind == KIND_K23) return (size_t)k + (size_t)(k / 256) * 64;
    if (kind == KIND_K4) return (size_t)k + (size_t)(k / 256) * 64;
    if (kind == KIND_K6) return (size_t)k + (size_t)(k / 256) * 128;
    return (size_t)(k / 128) * (128 + 48);
}

MDK_TARGET(A2)
static MDK_INLINE void tr4x4_256(const __m256i *Y, __m256i *O) {  /* in each 128-bit half, O[m][j] = Y[j][m] */
    __m256i t0 = _mm256_unpacklo_epi32(Y[0], Y[1]), t1 = _mm256_unpackhi_epi32(Y[0], Y[1]);
    __m256i t2 = _mm256_unpacklo_epi32(Y[2], Y[3]), t3 = _mm256_unpackhi_epi32(Y[2], Y[3]);
    O[0] = _mm256_unpacklo_epi64(t0, t2);
    O[1] = _mm256_unpackhi_epi64(t0, t2);
    O[2] = _mm256_unpacklo_epi64(t1, t3);
    O[3] = _mm256_unpackhi_epi64(t1, t3);
}

MDK_TARGET(A2)
static void prep(int kind, const mdk_q8 *a, int k, uint8_t *out) {
    const int8_t *x = a->q;
    if (kind == KIND_K23) {  /* each half's 4 chunks of 32, dwords transposed in each 128-bit half; then
                                per super-block and half the int16 pairs (4 s16[g], 0), lane d's group g */
        int16_t *x4 = (int16_t *)(out + k);
        for (int h = 0; h < k / 128; h++) {
            __m256i Y[4], O[4];
            for (int c = 0; c < 4; c++) Y[c] = _mm256_loadu_si256((const __m256i *)(x + 128 * h + 32 * c));
            tr4x4_256(Y, O);
            for (int v = 0; v < 4; v++) _mm256_storeu_si256((__m256i *)(out + 128 * h + 32 * v), O[v]);
            for (int d = 0; d < 8; d++) {
                x4[16 * h + 2 * d] = (int16_t)(4 * a->s16[8 * h + 2 * (d % 4) + d / 4]);
                x4[16 * h + 2 * d + 1] = 0;
            }
        }
    } else if (kind == KIND_K4) {
        float *f = (float *)(out + k);
        const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        for (int s = 0; s < k / 256; s++) {
            for (int nib = 0; nib < 2; nib++) {
                __m256i Y[4], O[4];
                for (int p = 0; p < 4; p++) Y[p] = _mm256_loadu_si256((const __m256i *)(x + 256 * s + 64 * p + 32 * nib));
                tr4x4_256(Y, O);
                for (int m = 0; m < 4; m++) _mm256_storeu_si256((__m256i *)(out + 256 * s + 128 * nib + 32 * m), O[m]);
            }
            _mm256_storeu_ps(f + 16 * s, _mm256_permutevar8x32_ps(_mm256_loadu_ps(a->dx + 8 * s), ev));
            _mm256_storeu_ps(f + 16 * s + 8, _mm256_permutevar8x32_ps(_mm256_loadu_ps(a->sx + 8 * s), ev));
        }
    } else if (kind == KIND_K6) {
        int32_t *si = (int32_t *)(out + k);
        const __m256i il = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (int s = 0; s < k / 256; s++) {
            for (int g = 0; g < 4; g++) {  /* g = 2H + nib: the 64 bytes at 64g */
                __m256i A = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(x + 256 * s + 64 * g)), il);
                __m256i B = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(x + 256 * s + 64 * g + 32)), il);
                _mm256_storeu_si256((__m256i *)(out + 256 * s + 64 * g), _mm256_unpacklo_epi64(A, B));       /* m 0 | 2 */
                _mm256_storeu_si256((__m256i *)(out + 256 * s + 64 * g + 32), _mm256_unpackhi_epi64(A, B));  /* m 1 | 3 */
            }
            int32_t *g = si + 32 * s;
            __m128i s16 = _mm_loadu_si128((const __m128i *)(a->s16 + 16 * s));
            _mm256_storeu_si256((__m256i *)g, _mm256_slli_epi32(_mm256_cvtepi16_epi32(s16), 5));
            s16 = _mm_loadu_si128((const __m128i *)(a->s16 + 16 * s + 8));
            _mm256_storeu_si256((__m256i *)(g + 8), _mm256_slli_epi32(_mm256_cvtepi16_epi32(s16), 5));
            __m256 dx = _mm256_loadu_ps(a->dx + 8 * s);
            _mm256_storeu_ps((float *)(g + 16), _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
            _mm256_storeu_ps((float *)(g + 24), _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
        }
    } else {
        int nu = k / 128;
        int32_t *si = (int32_t *)(out + (size_t)nu * 128);
        for (int u = 0; u < nu; u++) {
            __m256i Y[4], O[4];
            for (int b = 0; b < 4; b++) Y[b] = _mm256_loadu_si256((const __m256i *)(x + 128 * u + 32 * b));
            tr4x4_256(Y, O);
            for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(out + 128 * u + 32 * i), O[i]);
            for (int b = 0; b < 4; b++) {
                int blk = 4 * u + b;
                si[12 * u + b] = a->s16[2 * blk] + a->s16[2 * blk + 1];
                ((float *)si)[12 * u + 4 + b] = a->dx[blk];
                ((float *)si)[12 * u + 8 + b] = a->sx[blk];
            }
        }
    }
}

/* This thread's prepared copies of recent tokens, keyed by (mdk_q8, gen, kind, k): a few entries
 * (a call takes at most 4 tokens), least recently used replaced */
#define NSLOT 8
typedef struct { const mdk_q8 *a; unsigned long long gen, used; int kind, k; uint8_t *buf; size_t cap; } act_slot;
static MDK_TLS act_slot slots[NSLOT];
static MDK_TLS unsigned long long slot_clock;

const uint8_t *mdk_prepared_act(int kind, const mdk_q8 *a, int k) {
    act_slot *best = &slots[0];
    slot_clock++;
    for (int i = 0; i < NSLOT; i++) {
        act_slot *s = &slots[i];
        if (s->a == a && s->gen == a->gen && a->gen && s->kind == kind && s->k == k) {
            s->used = slot_clock;
            return s->buf;
        }
        if (s->used < best->used) best = s;
    }
    size_t need = prep_bytes(kind, k) + 64;
    if (best->cap < need) {
        mdk_raw_free(best->buf);
        best->buf = (uint8_t *)mdk_raw_alloc(need);
        best->cap = best->buf ? need : 0;
        if (!best->buf) { best->a = NULL; return NULL; }
    }
    prep(kind, a, k, best->buf);
    best->a = a, best->gen = a->gen, best->kind = kind, best->k = k, best->used = slot_clock;
    return best->buf;
}

/* ======================= AVX-512 VNNI: 4 rows a call ======================= */

/* the qs dwords (h, m) of one super-block of 4 rows (Q4_K/Q5_K: 128 bytes a row at q0) -> T[m]:
 * chunk r lane p = row r, pair p, dword (h, m) */
MDK_TARGET(A512)
static MDK_INLINE void k4_transpose512(const uint8_t *const *b, size_t q0, int h, __m512i *T) {
    const __m512i I = _mm512_add_epi32(_mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27),
                                       _mm512_set1_epi32(4 * h));
    __m512i R[4];
    for (int r = 0; r < 4; r++)  /* chunk m lane p = row r's dword (p, h, m) */
        R[r] = _mm512_permutex2var_epi32(_mm512_loadu_si512(b[r] + q0), I, _mm512_loadu_si512(b[r] + q0 + 64));
    __m512i a = _mm512_shuffle_i32x4(R[0], R[1], 0x44), c = _mm512_shuffle_i32x4(R[2], R[3], 0x44);
    __m512i bb = _mm512_shuffle_i32x4(R[0], R[1], 0xEE), d = _mm512_shuffle_i32x4(R[2], R[3], 0xEE);
    T[0] = _mm512_shuffle_i32x4(a, c, 0x88);
    T[1] = _mm512_shuffle_i32x4(a, c, 0xDD);
    T[2] = _mm512_shuffle_i32x4(bb, d, 0x88);
    T[3] = _mm512_shuffle_i32x4(bb, d, 0xDD);
}

/* Q4_K/Q5_K scales of 4 rows (the first 16 bytes of each block: d, dmin, 12 scale bytes) -> per lane
 * (row, pair p): sc and mn of sub-blocks 2p (l) and 2p+1 (h), d and dmin */
typedef struct { __m512i scl, sch; __m512 mnl, mnh, d, dm; } k4_scales512;

MDK_TARGET(A512)
static MDK_INLINE void k4_scales512_get(const uint8_t *const *b, k4_scales512 *S) {
    static const uint16_t didx[32] = {0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24,
                                      1, 1, 1, 1, 9, 9, 9, 9, 17, 17, 17, 17, 25, 25, 25, 25};
    __m512i Z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)b[0]));  /* chunk r: [d|dmin, u0, u1, u2] */
    Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)b[1]), 1);
    Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)b[2]), 2);
    Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)b[3]), 3);
    /* dwords 1, 2 of A: sc 0..3, mn 0..3; of B: sc 4..7 = u2 & 15 | (u0 >> 6) << 4, mn 4..7 = u2 >> 4 | (u1 >> 6) << 4 */
    const __m512i c3f = _mm512_set1_epi8(0x3f), c0f = _mm512_set1_epi8(0x0f), c30 = _mm512_set1_epi8(0x30);
    __m512i A = _mm512_and_si512(Z, c3f);
    __m512i P = _mm512_srlv_epi32(_mm512_shuffle_epi32(Z, _MM_PERM_DDDD), _mm512_set4_epi32(0, 4, 0, 0));
    __m512i B = _mm512_ternarylogic_epi32(P, c0f, _mm512_and_si512(_mm512_srli_epi32(Z, 2), c30), 0xEA);
    __m512i C = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(A), _mm512_castsi512_ps(B), 0x99));
    /* C chunk r bytes: sc0..3, mn0..3, sc4..7, mn4..7 */
    S->scl = _mm512_shuffle_epi8(C, _mm512_set4_epi32(SEL0(10), SEL0(8), SEL0(2), SEL0(0)));
    S->sch = _mm512_shuffle_epi8(C, _mm512_set4_epi32(SEL0(11), SEL0(9), SEL0(3), SEL0(1)));
    S->mnl = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(C, _mm512_set4_epi32(SEL0(14), SEL0(12), SEL0(6), SEL0(4))));
    S->mnh = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(C, _mm512_set4_epi32(SEL0(15), SEL0(13), SEL0(7), SEL0(5))));
    __m512i D = _mm512_permutexvar_epi16(_mm512_loadu_si512(didx), Z);
    S->d = _mm512_cvtph_ps(_mm512_castsi512_si256(D));
    S->dm = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(D, 1));
}

MDK_TARGET(A512)
static MDK_INLINE void store4x4_512(const __m512 *acc, int nt, float (*y)[4]) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int t = 0; t < nt; t++) {  /* sum the 4 lanes of each chunk (row) */
        __m512 v = _mm512_add_ps(acc[t], _mm512_permute_ps(acc[t], 0x4E));
        v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
        _mm_storeu_ps(y[t], _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, v)));
    }
}

#define BCAST16(p) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p)))

/* Q4_K and Q5_K: nt tokens, 4 rows */
MDK_TARGET(A512)
static MDK_INLINE void k45_body512(const int fmt, const uint8_t *const *rows, int nsb, const uint8_t *const *act,
                                   const pf_plan *pf, const int nt, float (*y)[4]) {
    const int bs = fmt == MDK_Q5K ? 176 : 144, ch = nt <= 2 ? 2 : 1;  /* dpbusd chains a token and nibble */
    const __m512i m4 = _mm512_set1_epi8(15), mf0 = _mm512_set1_epi8((char)0xF0), c16 = _mm512_set1_epi8(16);
    const __m512i blo = _mm512_set4_epi32(0x40404040, 0x10101010, 0x04040404, 0x01010101);  /* bit 2p, lane p */
    const __m512i bhi = _mm512_add_epi8(blo, blo);                                            /* bit 2p + 1 */
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *b[4] = {rows[0] + (size_t)bs * s, rows[1] + (size_t)bs * s, rows[2] + (size_t)bs * s,
                               rows[3] + (size_t)bs * s};
        pf_slice(pf, s);
        __m512i Y01 = _mm512_setzero_si512(), Y23 = Y01;
        if (fmt == MDK_Q5K) {  /* the 32 qh bytes of rows 0,1 and 2,3 */
            Y01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b[0] + 16))),
                                     _mm256_loadu_si256((const __m256i *)(b[1] + 16)), 1);
            Y23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b[2] + 16))),
                                     _mm256_loadu_si256((const __m256i *)(b[3] + 16)), 1);
        }
        __m512i al[4][2], ah[4][2];
        for (int t = 0; t < nt; t++) al[t][0] = al[t][1] = ah[t][0] = ah[t][1] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i T[4];
            k4_transpose512(b, fmt == MDK_Q5K ? 48 : 16, h, T);
            for (int m = 0; m < 4; m++) {
                __m512i L = _mm512_and_si512(T[m], m4), H;
                if (fmt == MDK_Q5K) {  /* chunk r: row r's qh dword 4h + m (the bytes l of every pair); bit 2p / 2p+1: +16 */
                    int i = 4 * h + m;
                    __m512i QH = _mm512_permutex2var_epi32(Y01, _mm512_setr_epi32(i, i, i, i, 8 + i, 8 + i, 8 + i, 8 + i,
                        16 + i, 16 + i, 16 + i, 16 + i, 24 + i, 24 + i, 24 + i, 24 + i), Y23);
                    H = _mm512_and_si512(_mm512_srli_epi16(T[m], 4), m4);
                    L = _mm512_mask_add_epi8(L, _mm512_test_epi8_mask(QH, blo), L, c16);
                    H = _mm512_mask_add_epi8(H, _mm512_test_epi8_mask(QH, bhi), H, c16);
                } else
                    H = _mm512_and_si512(T[m], mf0);  /* 16 x the high nibble */
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xq = act[t] + 256 * (size_t)s + 32 * m + 16 * h;
                    int c = ch == 2 ? m & 1 : 0;
                    al[t][c] = _mm512_dpbusd_epi32(al[t][c], L, BCAST16(xq));
                    ah[t][c] = _mm512_dpbusd_epi32(ah[t][c], H, BCAST16(xq + 128));
                }
            }
        }
        k4_scales512 S;
        k4_scales512_get(b, &S);
        for (int t = 0; t < nt; t++) {
            const float *xf = (const float *)(act[t] + (size_t)nsb * 256) + 16 * s;
            __m512i l = al[t][0], hh = ah[t][0];
            if (ch == 2) l = _mm512_add_epi32(l, al[t][1]), hh = _mm512_add_epi32(hh, ah[t][1]);
            if (fmt == MDK_Q4K) hh = _mm512_srai_epi32(hh, 4);
            __m512 dxl = _mm512_broadcast_f32x4(_mm_loadu_ps(xf)), dxh = _mm512_broadcast_f32x4(_mm_loadu_ps(xf + 4));
            __m512 sxl = _mm512_broadcast_f32x4(_mm_loadu_ps(xf + 8)), sxh = _mm512_broadcast_f32x4(_mm_loadu_ps(xf + 12));
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(l, S.scl)), dxl);
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(hh, S.sch)), dxh, f);
            acc[t] = _mm512_fmadd_ps(f, S.d, acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_fmadd_ps(S.mnh, sxh, _mm512_mul_ps(S.mnl, sxl)), S.dm, acc[t]);
        }
    }
    store4x4_512(acc, nt, y);
}

/* Q6_K: nt tokens, 4 rows */
MDK_TARGET(A512)
static MDK_INLINE void k6_body512(const uint8_t *const *rows, int nsb, const uint8_t *const *act, const pf_plan *pf,
                                  const int nt, float (*y)[4]) {
    /* ql: rows (0,1) / (2,3) -> chunks [r m=2a, r' m=2a, r m=2a+1, r' m=2a+1], lane q: dword 4q+m */
    const __m512i IA0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    /* qh (64 bytes a row, 8 dwords a half): lane q of T's dword 4q+m takes qh dword 8H + 4(q & 1) + m */
    const __m512i IB0 = _mm512_setr_epi32(0, 4, 0, 4, 16, 20, 16, 20, 1, 5, 1, 5, 17, 21, 17, 21);
    const __m512i shq = _mm512_set4_epi32(2, 2, 0, 0);  /* lanes q = 2, 3: the chunks i = 1, 3 of qh's bits */
    const __m512i c0f = _mm512_set1_epi8(0x0f), c33 = _mm512_set1_epi8(0x33);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *b[4] = {rows[0] + (size_t)210 * s, rows[1] + (size_t)210 * s, rows[2] + (size_t)210 * s,
                               rows[3] + (size_t)210 * s};
        pf_slice(pf, s);
        __m512 f[4];
        for (int t = 0; t < nt; t++) f[t] = _mm512_setzero_ps();
        __m512i Z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b[0] + 192)));  /* scales, chunk = row */
        Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)(b[1] + 192)), 1);
        Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)(b[2] + 192)), 2);
        Z = _mm512_inserti32x4(Z, _mm_loadu_si128((const __m128i *)(b[3] + 192)), 3);
        for (int H = 0; H < 2; H++) {
            __m512i T[4], QH[4];
            for (int a = 0; a < 2; a++) {
                __m512i ia = _mm512_add_epi32(IA0, _mm512_set1_epi32(2 * a));
                __m512i ib = _mm512_add_epi32(IB0, _mm512_set1_epi32(8 * H + 2 * a));
                __m512i x01 = _mm512_permutex2var_epi32(_mm512_loadu_si512(b[0] + 64 * H), ia, _mm512_loadu_si512(b[1] + 64 * H));
                __m512i x23 = _mm512_permutex2var_epi32(_mm512_loadu_si512(b[2] + 64 * H), ia, _mm512_loadu_si512(b[3] + 64 * H));
                T[2 * a] = _mm512_shuffle_i32x4(x01, x23, 0x44);
                T[2 * a + 1] = _mm512_shuffle_i32x4(x01, x23, 0xEE);
                __m512i q01 = _mm512_permutex2var_epi32(_mm512_loadu_si512(b[0] + 128), ib, _mm512_loadu_si512(b[1] + 128));
                __m512i q23 = _mm512_permutex2var_epi32(_mm512_loadu_si512(b[2] + 128), ib, _mm512_loadu_si512(b[3] + 128));
                QH[2 * a] = _mm512_shuffle_i32x4(q01, q23, 0x44);
                QH[2 * a + 1] = _mm512_shuffle_i32x4(q01, q23, 0xEE);
            }
            __m512i alo[4], ahi[4];
            for (int t = 0; t < nt; t++) alo[t] = ahi[t] = _mm512_setzero_si512();
            for (int m = 0; m < 4; m++) {
                __m512i qh = _mm512_and_si512(_mm512_srlv_epi32(QH[m], shq), c33);  /* lo field bits 0-1, hi 4-5 */
                __m512i lo = _mm512_ternarylogic_epi32(c0f, T[m], _mm512_slli_epi16(qh, 4), 0xCA);
                __m512i hi = _mm512_ternarylogic_epi32(c0f, _mm512_srli_epi16(T[m], 4), qh, 0xCA);
                int o = 128 * H + 16 * (2 * (m & 1) + (m >> 1));
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xq = act[t] + 256 * (size_t)s + o;
                    alo[t] = _mm512_dpbusd_epi32(alo[t], lo, BCAST16(xq));
                    ahi[t] = _mm512_dpbusd_epi32(ahi[t], hi, BCAST16(xq + 64));
                }
            }
            /* lane q of (H, nib): int8 scale 8H + 4 nib + q, sign-extended */
            __m512i sl = _mm512_srai_epi32(_mm512_shuffle_epi8(Z, _mm512_set4_epi32(SEL3(8 * H + 3), SEL3(8 * H + 2),
                                                                                   SEL3(8 * H + 1), SEL3(8 * H))), 24);
            __m512i sh = _mm512_srai_epi32(_mm512_shuffle_epi8(Z, _mm512_set4_epi32(SEL3(8 * H + 7), SEL3(8 * H + 6),
                                                                                   SEL3(8 * H + 5), SEL3(8 * H + 4))), 24);
            for (int t = 0; t < nt; t++) {
                const int32_t *xi = (const int32_t *)(act[t] + (size_t)nsb * 256) + 32 * s + 8 * H;
                const float *xd = (const float *)(xi + 16);
                __m512i v = _mm512_mullo_epi32(_mm512_sub_epi32(alo[t], BCAST16(xi)), sl);
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_broadcast_f32x4(_mm_loadu_ps(xd)), f[t]);
                v = _mm512_mullo_epi32(_mm512_sub_epi32(ahi[t], BCAST16(xi + 4)), sh);
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_broadcast_f32x4(_mm_loadu_ps(xd + 4)), f[t]);
            }
        }
        uint64_t dd = (uint64_t)rd16(b[0] + 208) | (uint64_t)rd16(b[1] + 208) << 16 | (uint64_t)rd16(b[2] + 208) << 32 |
                      (uint64_t)rd16(b[3] + 208) << 48;
        __m512 D = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                         _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dd))));
        for (int t = 0; t < nt; t++) acc[t] = _mm512_fmadd_ps(f[t], D, acc[t]);
    }
    store4x4_512(acc, nt, y);
}

/* Q8_0: nt tokens, 4 rows, nb blocks a row (a multiple of 4) */
MDK_TARGET(A512)
static MDK_INLINE void q8_body512(const uint8_t *const *rows, int nb, const uint8_t *const *act, const pf_plan *pf,
                                  const int nt, float (*y)[4]) {
    /* per row and unit (136 bytes; every field at an even offset): the words of qs dword i of block b
     * to chunk i & 3, lane b of G[i >> 2] (i < 4: from the 128 bytes at the unit's start, i >= 4: at +8) */
    static const uint16_t gi[2][32] = {
        {1, 2, 18, 19, 35, 36, 52, 53, 3, 4, 20, 21, 37, 38, 54, 55, 5, 6, 22, 23, 39, 40, 56, 57, 7, 8, 24, 25, 41, 42, 58, 59},
        {5, 6, 22, 23, 39, 40, 56, 57, 7, 8, 24, 25, 41, 42, 58, 59, 9, 10, 26, 27, 43, 44, 60, 61, 11, 12, 28, 29, 45, 46, 62, 63}};
    const __m512i G0 = _mm512_loadu_si512(gi[0]), G1 = _mm512_loadu_si512(gi[1]), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int u = 0; u < nb / 4; u++) {
        const uint8_t *b[4] = {rows[0] + (size_t)136 * u, rows[1] + (size_t)136 * u, rows[2] + (size_t)136 * u,
                               rows[3] + (size_t)136 * u};
        pf_slice(pf, u);
        __m512i ai[4];
        for (int t = 0; t < nt; t++) ai[t] = _mm512_setzero_si512();
        for (int k = 0; k < 2; k++) {
            __m512i G[4];
            for (int r = 0; r < 4; r++)
                G[r] = _mm512_permutex2var_epi16(_mm512_loadu_si512(b[r] + 8 * k), k ? G1 : G0, _mm512_loadu_si512(b[r] + 8 * k + 64));
            __m512i a = _mm512_shuffle_i32x4(G[0], G[1], 0x44), c = _mm512_shuffle_i32x4(G[2], G[3], 0x44);
            __m512i bb = _mm512_shuffle_i32x4(G[0], G[1], 0xEE), d = _mm512_shuffle_i32x4(G[2], G[3], 0xEE);
            __m512i T[4] = {_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(a, c, 0xDD),
                            _mm512_shuffle_i32x4(bb, d, 0x88), _mm512_shuffle_i32x4(bb, d, 0xDD)};
            for (int i = 0; i < 4; i++) {
                __m512i U = _mm512_xor_si512(T[i], flip);  /* q + 128 */
                for (int t = 0; t < nt; t++)
                    ai[t] = _mm512_dpbusd_epi32(ai[t], U, BCAST16(act[t] + 128 * (size_t)u + 32 * i + 16 * k));
            }
        }
        uint64_t dd[4];
        for (int r = 0; r < 4; r++)
            dd[r] = (uint64_t)rd16(b[r]) | (uint64_t)rd16(b[r] + 34) << 16 | (uint64_t)rd16(b[r] + 68) << 32 |
                    (uint64_t)rd16(b[r] + 102) << 48;
        __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dd));
        for (int t = 0; t < nt; t++) {
            const int32_t *xi = (const int32_t *)(act[t] + (size_t)(nb / 4) * 128) + 12 * u;
            __m512i v = _mm512_sub_epi32(ai[t], _mm512_slli_epi32(BCAST16(xi), 7));  /* less 128 sum(xq) */
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(xi + 4))));
            acc[t] = _mm512_fmadd_ps(f, D, acc[t]);
        }
    }
    store4x4_512(acc, nt, y);
}


/* Q4_0, Q4_1, Q5_0, Q5_1 (w = d u + m per block of 32, u the nibble, plus 16 x qh's bit): nt tokens,
 * 4 rows, nb blocks a row (a multiple of 4). Per row and unit of 4 blocks (72..96 bytes, every field
 * at an even offset): one word permute gathers the qs dwords (G: chunk i lane b = block b's dword i),
 * another d, m and qh (X: words d0..d3, m0..m3, then qh dwords 0..3) */
#define QB_BS(f) ((f) == MDK_Q4_0 ? 18 : (f) == MDK_Q4_1 ? 20 : (f) == MDK_Q5_0 ? 22 : 24)
#define QB_MIN(f) ((f) == MDK_Q4_1 || (f) == MDK_Q5_1)
#define QB_FIVE(f) ((f) == MDK_Q5_0 || (f) == MDK_Q5_1)
#define QB_SH(f) ((f) == MDK_Q4_0 ? 3 : 4)  /* no minimum: m = -(1 << QB_SH) d */
static const uint16_t qb_gidx[4][32] = {  /* [f - MDK_Q4_0]: the words of the qs dwords, chunk i lane b */
    {1, 2, 10, 11, 19, 20, 28, 29, 3, 4, 12, 13, 21, 22, 30, 31, 5, 6, 14, 15, 23, 24, 60, 61, 7, 8, 16, 17, 25, 26, 62, 63},
    {2, 3, 12, 13, 22, 23, 56, 57, 4, 5, 14, 15, 24, 25, 58, 59, 6, 7, 16, 17, 26, 27, 60, 61, 8, 9, 18, 19, 28, 29, 62, 63},
    {3, 4, 14, 15, 25, 26, 56, 57, 5, 6, 16, 17, 27, 28, 58, 59, 7, 8, 18, 19, 29, 30, 60, 61, 9, 10, 20, 21, 31, 52, 62, 63},
    {4, 5, 16, 17, 28, 29, 56, 57, 6, 7, 18, 19, 30, 31, 58, 59, 8, 9, 20, 21, 48, 49, 60, 61, 10, 11, 22, 23, 50, 51, 62, 63}};
static const uint16_t qb_xidx[4][32] = {  /* d0..d3, m0..m3 (Q4_1, Q5_1), qh0 lo, hi, .. qh3 (Q5_0, Q5_1) */
    {0, 9, 18, 27, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {0, 10, 20, 30, 1, 11, 21, 31, 0, 0, 0, 0, 0, 0, 0, 0},
    {0, 11, 22, 53, 0, 0, 0, 0, 1, 2, 12, 13, 23, 24, 54, 55},
    {0, 12, 24, 52, 1, 13, 25, 53, 2, 3, 14, 15, 26, 27, 54, 55}};

MDK_TARGET(A512)
static MDK_INLINE void qb4_body512(const int f, const uint8_t *const *rows, int nb, const uint8_t *const *act,
                                   const pf_plan *pf, const int nt, float (*y)[4]) {
    const int bs = QB_BS(f), ub = 4 * bs;
    const __m512i GI = _mm512_loadu_si512(qb_gidx[f - MDK_Q4_0]), XI = _mm512_loadu_si512(qb_xidx[f - MDK_Q4_0]);
    const __m512i m4 = _mm512_set1_epi8(15), mf0 = _mm512_set1_epi8((char)0xF0), c16 = _mm512_set1_epi8(16);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int u = 0; u < nb / 4; u++) {
        const uint8_t *b[4] = {rows[0] + (size_t)ub * u, rows[1] + (size_t)ub * u, rows[2] + (size_t)ub * u,
                               rows[3] + (size_t)ub * u};
        pf_slice(pf, u);
        __m512i G[4], X[4];
        for (int r = 0; r < 4; r++) {
            __m512i lo = _mm512_loadu_si512(b[r]), hi = _mm512_loadu_si512(b[r] + ub - 64);
            G[r] = _mm512_permutex2var_epi16(lo, GI, hi);
            X[r] = _mm512_permutex2var_epi16(lo, XI, hi);
        }
        __m512i a = _mm512_shuffle_i32x4(G[0], G[1], 0x44), c = _mm512_shuffle_i32x4(G[2], G[3], 0x44);
        __m512i bb = _mm512_shuffle_i32x4(G[0], G[1], 0xEE), d = _mm512_shuffle_i32x4(G[2], G[3], 0xEE);
        __m512i T[4] = {_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(a, c, 0xDD),
                        _mm512_shuffle_i32x4(bb, d, 0x88), _mm512_shuffle_i32x4(bb, d, 0xDD)};
        /* X[r] qwords 0: d, 1: m, 2-3: qh. D (16 halves, lane (r, b)) = X[0..3] qword 0; M qword 1; QH chunk r = qwords 2-3 */
        __m512i x01 = _mm512_unpacklo_epi64(X[0], X[1]), x23 = _mm512_unpacklo_epi64(X[2], X[3]);
        __m512i y01 = _mm512_unpackhi_epi64(X[0], X[1]), y23 = _mm512_unpackhi_epi64(X[2], X[3]);
        __m512 D = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_castsi512_si128(x01)),
                                                           _mm512_castsi512_si128(x23), 1));
        __m512 M = _mm512_setzero_ps();
        if (QB_MIN(f))
            M = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_castsi512_si128(y01)),
                                                        _mm512_castsi512_si128(y23), 1));
        __m512i QH = _mm512_setzero_si512();
        if (QB_FIVE(f)) {  /* chunk 1 of x01: [X0 q2, X1 q2], of y01: [X0 q3, X1 q3] */
            __m512i r0 = _mm512_unpacklo_epi64(x01, y01), r1 = _mm512_unpackhi_epi64(x01, y01);
            __m512i r2 = _mm512_unpacklo_epi64(x23, y23), r3 = _mm512_unpackhi_epi64(x23, y23);
            QH = _mm512_shuffle_i32x4(_mm512_shuffle_i32x4(r0, r1, 0x55), _mm512_shuffle_i32x4(r2, r3, 0x55), 0x88);
        }
        __m512i al[4], ah[4];
        for (int t = 0; t < nt; t++) al[t] = ah[t] = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            __m512i L = _mm512_and_si512(T[i], m4), H;
            if (QB_FIVE(f)) {  /* byte j of lane (r, b): elements 4i + j (low) and 16 + 4i + j (high): qh bits */
                const int q = i >> 1, sh = 4 * (i & 1);
                __m512i bits = _mm512_set1_epi32((int)(0x08040201u << sh));
                __m512i ql = _mm512_shuffle_epi8(QH, _mm512_set4_epi32(0x0C0C0C0C + q * 0x01010101, 0x08080808 + q * 0x01010101,
                                                                       0x04040404 + q * 0x01010101, q * 0x01010101));
                __m512i qh = _mm512_shuffle_epi8(QH, _mm512_set4_epi32(0x0E0E0E0E + q * 0x01010101, 0x0A0A0A0A + q * 0x01010101,
                                                                       0x06060606 + q * 0x01010101, 0x02020202 + q * 0x01010101));
                H = _mm512_and_si512(_mm512_srli_epi16(T[i], 4), m4);
                L = _mm512_mask_add_epi8(L, _mm512_test_epi8_mask(ql, bits), L, c16);
                H = _mm512_mask_add_epi8(H, _mm512_test_epi8_mask(qh, bits), H, c16);
            } else
                H = _mm512_and_si512(T[i], mf0);  /* 16 x the high nibble */
            for (int t = 0; t < nt; t++) {
                const uint8_t *xq = act[t] + 128 * (size_t)u + 32 * i;
                al[t] = _mm512_dpbusd_epi32(al[t], L, BCAST16(xq));
                ah[t] = _mm512_dpbusd_epi32(ah[t], H, BCAST16(xq + 16));
            }
        }
        for (int t = 0; t < nt; t++) {
            const int32_t *xi = (const int32_t *)(act[t] + (size_t)(nb / 4) * 128) + 12 * u;
            __m512i sum = _mm512_add_epi32(al[t], QB_FIVE(f) ? ah[t] : _mm512_srai_epi32(ah[t], 4));
            __m512 dx = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(xi + 4)));
            if (QB_MIN(f)) {
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), dx), D, acc[t]);
                acc[t] = _mm512_fmadd_ps(M, _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(xi + 8))), acc[t]);
            } else {
                sum = _mm512_sub_epi32(sum, _mm512_slli_epi32(BCAST16(xi), QB_SH(f)));  /* u - 8 or u - 16 */
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), dx), D, acc[t]);
            }
        }
    }
    store4x4_512(acc, nt, y);
}

#define R512(name, call) MDK_TARGET(A512) static void name(const uint8_t *const *rows, int nb, const uint8_t *const *act, \
                                                            const pf_plan *pf, float (*y)[4]) { call; }
R512(q4k512_1, k45_body512(MDK_Q4K, rows, nb, act, pf, 1, y)) R512(q4k512_2, k45_body512(MDK_Q4K, rows, nb, act, pf, 2, y))
R512(q4k512_3, k45_body512(MDK_Q4K, rows, nb, act, pf, 3, y)) R512(q4k512_4, k45_body512(MDK_Q4K, rows, nb, act, pf, 4, y))
R512(q5k512_1, k45_body512(MDK_Q5K, rows, nb, act, pf, 1, y)) R512(q5k512_2, k45_body512(MDK_Q5K, rows, nb, act, pf, 2, y))
R512(q5k512_3, k45_body512(MDK_Q5K, rows, nb, act, pf, 3, y)) R512(q5k512_4, k45_body512(MDK_Q5K, rows, nb, act, pf, 4, y))
R512(q6k512_1, k6_body512(rows, nb, act, pf, 1, y)) R512(q6k512_2, k6_body512(rows, nb, act, pf, 2, y))
R512(q6k512_3, k6_body512(rows, nb, act, pf, 3, y)) R512(q6k512_4, k6_body512(rows, nb, act, pf, 4, y))
R512(q80512_1, q8_body512(rows, nb, act, pf, 1, y)) R512(q80512_2, q8_body512(rows, nb, act, pf, 2, y))
R512(q80512_3, q8_body512(rows, nb, act, pf, 3, y)) R512(q80512_4, q8_body512(rows, nb, act, pf, 4, y))
#define QB512(F) R512(F##_512_1, qb4_body512(MDK_##F, rows, nb, act, pf, 1, y)) \
    R512(F##_512_2, qb4_body512(MDK_##F, rows, nb, act, pf, 2, y)) R512(F##_512_3, qb4_body512(MDK_##F, rows, nb, act, pf, 3, y)) \
    R512(F##_512_4, qb4_body512(MDK_##F, rows, nb, act, pf, 4, y))
QB512(Q4_0) QB512(Q4_1) QB512(Q5_0) QB512(Q5_1)
#undef QB512
#undef R512

/* ======================= AVX2: 2 rows a call, a row per 128-bit half ======================= */
#define BC16(p) _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p)))
/* [a's half | b's half], the low halves or (hi) the high ones */
#define HALVES(a, b, hi) ((hi) ? _mm256_permute2x128_si256(a, b, 0x31) : _mm256_permute2x128_si256(a, b, 0x20))

MDK_TARGET(A2)
static MDK_INLINE void store2_256(const __m256 *acc, int nt, float (*y)[4]) {
    for (int t = 0; t < nt; t++) {  /* sum the 4 lanes of each half (row) */
        __m256 v = _mm256_add_ps(acc[t], _mm256_permute_ps(acc[t], 0x4E));
        v = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
        y[t][0] = _mm256_cvtss_f32(v);
        y[t][1] = _mm_cvtss_f32(_mm256_extractf128_ps(v, 1));
    }
}

/* Q4_K and Q5_K: nt tokens, 2 rows */
MDK_TARGET(A2)
static MDK_INLINE void k45_body256(const int fmt, const uint8_t *const *rows, int nsb, const uint8_t *const *act,
                                   const pf_plan *pf, const int nt, float (*y)[4]) {
    const int bs = fmt == MDK_Q5K ? 176 : 144, q0 = fmt == MDK_Q5K ? 48 : 16;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), c16 = _mm256_set1_epi8(16);
    const __m256i c3f = _mm256_set1_epi8(0x3f), c30 = _mm256_set1_epi8(0x30);
    const __m256i blo = _mm256_setr_epi32(0x01010101, 0x04040404, 0x10101010, 0x40404040, 0x01010101, 0x04040404,
                                          0x10101010, 0x40404040);
    const __m256i bhi = _mm256_add_epi8(blo, blo);
    __m256 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *b0 = rows[0] + (size_t)bs * s, *b1 = rows[1] + (size_t)bs * s;
        pf_slice(pf, s);
        __m256i O0[4], O1[4], Y[4];
        for (int p = 0; p < 4; p++) Y[p] = _mm256_loadu_si256((const __m256i *)(b0 + q0 + 32 * p));
        tr4x4_256(Y, O0);  /* half h of O[m]: row 0's pairs 0..3, dword (h, m) */
        for (int p = 0; p < 4; p++) Y[p] = _mm256_loadu_si256((const __m256i *)(b1 + q0 + 32 * p));
        tr4x4_256(Y, O1);
        __m256i Q0 = _mm256_setzero_si256(), Q1 = Q0;
        if (fmt == MDK_Q5K) {  /* qh: [row 0 bytes 0..15 | row 1 bytes 0..15], and 16..31 */
            __m256i r0 = _mm256_loadu_si256((const __m256i *)(b0 + 16)), r1 = _mm256_loadu_si256((const __m256i *)(b1 + 16));
            Q0 = _mm256_permute2x128_si256(r0, r1, 0x20);
            Q1 = _mm256_permute2x128_si256(r0, r1, 0x31);
        }
        __m256i al[4], ah[4], pl[4], ph[4];  /* int32 sums; int16 pair sums (Q4_K: all 8 dwords, 8 x 3810;
                                                Q5_K: the 4 of a half, 4 x 7874) */
        for (int t = 0; t < nt; t++) al[t] = ah[t] = pl[t] = ph[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            for (int m = 0; m < 4; m++) {
                __m256i T = HALVES(O0[m], O1[m], h);
                __m256i L = _mm256_and_si256(T, m4), H = _mm256_and_si256(_mm256_srli_epi16(T, 4), m4);
                if (fmt == MDK_Q5K) {
                    __m256i QH = h ? Q1 : Q0;
                    QH = m == 0 ? _mm256_shuffle_epi32(QH, 0x00) : m == 1 ? _mm256_shuffle_epi32(QH, 0x55)
                       : m == 2 ? _mm256_shuffle_epi32(QH, 0xAA) : _mm256_shuffle_epi32(QH, 0xFF);
                    L = _mm256_or_si256(L, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(QH, blo), blo), c16));
                    H = _mm256_or_si256(H, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(QH, bhi), bhi), c16));
                }
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xq = act[t] + 256 * (size_t)s + 32 * m + 16 * h;
                    pl[t] = _mm256_add_epi16(pl[t], _mm256_maddubs_epi16(L, BC16(xq)));
                    ph[t] = _mm256_add_epi16(ph[t], _mm256_maddubs_epi16(H, BC16(xq + 128)));
                }
            }
            if (fmt == MDK_Q5K || h == 1)
                for (int t = 0; t < nt; t++) {
                    al[t] = _mm256_add_epi32(al[t], _mm256_madd_epi16(pl[t], ones));
                    ah[t] = _mm256_add_epi32(ah[t], _mm256_madd_epi16(ph[t], ones));
                    pl[t] = ph[t] = _mm256_setzero_si256();
                }
        }
        /* scales: Z = [row 0's first 16 bytes | row 1's] (see k4_scales512_get) */
        __m256i Z = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b0)),
                                            _mm_loadu_si128((const __m128i *)b1), 1);
        __m256i A = _mm256_and_si256(Z, c3f);
        __m256i P = _mm256_srlv_epi32(_mm256_shuffle_epi32(Z, 0xFF), _mm256_setr_epi32(0, 0, 4, 0, 0, 0, 4, 0));
        __m256i B = _mm256_or_si256(_mm256_and_si256(P, m4), _mm256_and_si256(_mm256_srli_epi32(Z, 2), c30));
        __m256i C = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(A), _mm256_castsi256_ps(B), 0x99));
        __m256i scl = _mm256_shuffle_epi8(C, _mm256_setr_epi32(SEL0(0), SEL0(2), SEL0(8), SEL0(10), SEL0(0), SEL0(2), SEL0(8), SEL0(10)));
        __m256i sch = _mm256_shuffle_epi8(C, _mm256_setr_epi32(SEL0(1), SEL0(3), SEL0(9), SEL0(11), SEL0(1), SEL0(3), SEL0(9), SEL0(11)));
        __m256 mnl = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(C, _mm256_setr_epi32(SEL0(4), SEL0(6), SEL0(12), SEL0(14), SEL0(4), SEL0(6), SEL0(12), SEL0(14))));
        __m256 mnh = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(C, _mm256_setr_epi32(SEL0(5), SEL0(7), SEL0(13), SEL0(15), SEL0(5), SEL0(7), SEL0(13), SEL0(15))));
        uint64_t dd = (uint64_t)rd16(b0) | (uint64_t)rd16(b0 + 2) << 16 | (uint64_t)rd16(b1) << 32 | (uint64_t)rd16(b1 + 2) << 48;
        __m256 dv = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dd)));  /* d0 dm0 d1 dm1 */
        __m256 D = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
        __m256 DM = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
        for (int t = 0; t < nt; t++) {
            const float *xf = (const float *)(act[t] + (size_t)nsb * 256) + 16 * s;
            __m256 dxl = _mm256_broadcast_ps((const __m128 *)xf), dxh = _mm256_broadcast_ps((const __m128 *)(xf + 4));
            __m256 sxl = _mm256_broadcast_ps((const __m128 *)(xf + 8)), sxh = _mm256_broadcast_ps((const __m128 *)(xf + 12));
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(al[t], scl)), dxl);
            f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(ah[t], sch)), dxh, f);
            acc[t] = _mm256_fmadd_ps(f, D, acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_fmadd_ps(mnh, sxh, _mm256_mul_ps(mnl, sxl)), DM, acc[t]);
        }
    }
    store2_256(acc, nt, y);
}

/* Q6_K: nt tokens, 2 rows */
MDK_TARGET(A2)
static MDK_INLINE void k6_body256(const uint8_t *const *rows, int nsb, const uint8_t *const *act, const pf_plan *pf,
                                  const int nt, float (*y)[4]) {
    const __m256i il = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), ones = _mm256_set1_epi16(1);
    const __m256i iq0 = _mm256_setr_epi32(0, 4, 0, 4, 1, 5, 1, 5), iq1 = _mm256_setr_epi32(2, 6, 2, 6, 3, 7, 3, 7);
    const __m256i shq = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    const __m256i c0f = _mm256_set1_epi8(0x0f), c30 = _mm256_set1_epi8(0x30), c33 = _mm256_set1_epi8(0x33);
    __m256 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const uint8_t *b0 = rows[0] + (size_t)210 * s, *b1 = rows[1] + (size_t)210 * s;
        pf_slice(pf, s);
        __m256i Z = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 192))),
                                            _mm_loadu_si128((const __m128i *)(b1 + 192)), 1);
        __m256 f[4];
        for (int t = 0; t < nt; t++) f[t] = _mm256_setzero_ps();
        for (int H = 0; H < 2; H++) {
            __m256i W[2][2], S[2][2];  /* [row][0: m 0 | 2, 1: m 1 | 3] */
            const uint8_t *bb[2] = {b0, b1};
            for (int r = 0; r < 2; r++) {
                __m256i A = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(bb[r] + 64 * H)), il);
                __m256i B = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(bb[r] + 64 * H + 32)), il);
                W[r][0] = _mm256_unpacklo_epi64(A, B);
                W[r][1] = _mm256_unpackhi_epi64(A, B);
                __m256i Q = _mm256_loadu_si256((const __m256i *)(bb[r] + 128 + 32 * H));
                S[r][0] = _mm256_permutevar8x32_epi32(Q, iq0);  /* m 0 | 1 */
                S[r][1] = _mm256_permutevar8x32_epi32(Q, iq1);  /* m 2 | 3 */
            }
            __m256i pl[4], ph[4], alo[4], ahi[4];
            for (int t = 0; t < nt; t++) alo[t] = ahi[t] = pl[t] = ph[t] = _mm256_setzero_si256();
            for (int m = 0; m < 4; m++) {
                __m256i T = HALVES(W[0][m & 1], W[1][m & 1], m >> 1);  /* W: m 0,2 in halves 0,1 of W[.][0]; 1,3 of W[.][1] */
                __m256i qh = HALVES(S[0][m >> 1], S[1][m >> 1], m & 1);
                qh = _mm256_and_si256(_mm256_srlv_epi32(qh, shq), c33);
                __m256i lo = _mm256_or_si256(_mm256_and_si256(T, c0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), c30));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(T, 4), c0f), _mm256_and_si256(qh, c30));
                int o = 128 * H + 16 * (2 * (m & 1) + (m >> 1));
                for (int t = 0; t < nt; t++) {  /* two maddubs pairs of q <= 63 per int16: at most 32004 */
                    const uint8_t *xq = act[t] + 256 * (size_t)s + o;
                    __m256i pl1 = _mm256_maddubs_epi16(lo, BC16(xq)), ph1 = _mm256_maddubs_epi16(hi, BC16(xq + 64));
                    if (m & 1) {
                        alo[t] = _mm256_add_epi32(alo[t], _mm256_madd_epi16(_mm256_add_epi16(pl[t], pl1), ones));
                        ahi[t] = _mm256_add_epi32(ahi[t], _mm256_madd_epi16(_mm256_add_epi16(ph[t], ph1), ones));
                    } else {
                        pl[t] = pl1;
                        ph[t] = ph1;
                    }
                }
            }
            __m256i sl = _mm256_srai_epi32(_mm256_shuffle_epi8(Z, _mm256_setr_epi32(SEL3(8 * H), SEL3(8 * H + 1), SEL3(8 * H + 2),
                SEL3(8 * H + 3), SEL3(8 * H), SEL3(8 * H + 1), SEL3(8 * H + 2), SEL3(8 * H + 3))), 24);
            __m256i sh = _mm256_srai_epi32(_mm256_shuffle_epi8(Z, _mm256_setr_epi32(SEL3(8 * H + 4), SEL3(8 * H + 5), SEL3(8 * H + 6),
                SEL3(8 * H + 7), SEL3(8 * H + 4), SEL3(8 * H + 5), SEL3(8 * H + 6), SEL3(8 * H + 7))), 24);
            for (int t = 0; t < nt; t++) {
                const int32_t *xi = (const int32_t *)(act[t] + (size_t)nsb * 256) + 32 * s + 8 * H;
                const float *xd = (const float *)(xi + 16);
                __m256i v = _mm256_mullo_epi32(_mm256_sub_epi32(alo[t], BC16(xi)), sl);
                f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_broadcast_ps((const __m128 *)xd), f[t]);
                v = _mm256_mullo_epi32(_mm256_sub_epi32(ahi[t], BC16(xi + 4)), sh);
                f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_broadcast_ps((const __m128 *)(xd + 4)), f[t]);
            }
        }
        uint32_t dd = (uint32_t)rd16(b0 + 208) | (uint32_t)rd16(b1 + 208) << 16;
        __m256 D = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))),
                                            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(f[t], D, acc[t]);
    }
    store2_256(acc, nt, y);
}

/* Q8_0: nt tokens, 2 rows, nb blocks a row (a multiple of 4) */
MDK_TARGET(A2)
static MDK_INLINE void q8_body256(const uint8_t *const *rows, int nb, const uint8_t *const *act, const pf_plan *pf,
                                  const int nt, float (*y)[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int u = 0; u < nb / 4; u++) {
        const uint8_t *b0 = rows[0] + (size_t)136 * u, *b1 = rows[1] + (size_t)136 * u;
        pf_slice(pf, u);
        __m256i Y[4], O0[4], O1[4];
        for (int b = 0; b < 4; b++) Y[b] = _mm256_loadu_si256((const __m256i *)(b0 + 34 * b + 2));
        tr4x4_256(Y, O0);  /* half h of O[i]: row 0's blocks 0..3, dword 4h + i */
        for (int b = 0; b < 4; b++) Y[b] = _mm256_loadu_si256((const __m256i *)(b1 + 34 * b + 2));
        tr4x4_256(Y, O1);
        __m256i ai[4];
        for (int t = 0; t < nt; t++) ai[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {  /* dword 4h + i */
            int h = j >> 2, i = j & 3;
            __m256i T = HALVES(O0[i], O1[i], h), aT = _mm256_abs_epi8(T);
            for (int t = 0; t < nt; t++) {  /* |q| * sign(x, q): pairs at most 2 * 128 * 127 */
                __m256i x = BC16(act[t] + 128 * (size_t)u + 32 * i + 16 * h);
                ai[t] = _mm256_add_epi32(ai[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aT, _mm256_sign_epi8(x, T)), ones));
            }
        }
        uint64_t dd = (uint64_t)rd16(b0) | (uint64_t)rd16(b0 + 34) << 16 | (uint64_t)rd16(b0 + 68) << 32 | (uint64_t)rd16(b0 + 102) << 48;
        uint64_t de = (uint64_t)rd16(b1) | (uint64_t)rd16(b1 + 34) << 16 | (uint64_t)rd16(b1 + 68) << 32 | (uint64_t)rd16(b1 + 102) << 48;
        __m256 D = _mm256_cvtph_ps(_mm_set_epi64x((long long)de, (long long)dd));
        for (int t = 0; t < nt; t++) {  /* (signed products: no 128 * sum term) */
            const float *xd = (const float *)(act[t] + (size_t)(nb / 4) * 128) + 12 * u + 4;
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(ai[t]), _mm256_broadcast_ps((const __m128 *)xd));
            acc[t] = _mm256_fmadd_ps(f, D, acc[t]);
        }
    }
    store2_256(acc, nt, y);
}

/* Q4_0, Q4_1, Q5_0, Q5_1: nt tokens, 2 rows (a row per half), nb blocks a row (a multiple of 4) */
MDK_TARGET(A2)
static MDK_INLINE void qb4_body256(const int f, const uint8_t *const *rows, int nb, const uint8_t *const *act,
                                   const pf_plan *pf, const int nt, float (*y)[4]) {
    const int bs = QB_BS(f), ub = 4 * bs, qoff = 2 + 2 * QB_MIN(f) + 4 * QB_FIVE(f), hoff = 2 + 2 * QB_MIN(f);
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), c16 = _mm256_set1_epi8(16);
    __m256 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int u = 0; u < nb / 4; u++) {
        const uint8_t *b0 = rows[0] + (size_t)ub * u, *b1 = rows[1] + (size_t)ub * u;
        pf_slice(pf, u);
        __m256i Y[4], T[4];
        for (int b = 0; b < 4; b++)  /* [row 0's qs of block b | row 1's] */
            Y[b] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + bs * b + qoff))),
                                           _mm_loadu_si128((const __m128i *)(b1 + bs * b + qoff)), 1);
        tr4x4_256(Y, T);  /* T[i]: half r = row r's blocks 0..3, dword i */
        uint64_t dd = 0, de = 0, md = 0, me = 0;
        for (int b = 0; b < 4; b++) {
            dd |= (uint64_t)rd16(b0 + bs * b) << 16 * b, de |= (uint64_t)rd16(b1 + bs * b) << 16 * b;
            if (QB_MIN(f)) md |= (uint64_t)rd16(b0 + bs * b + 2) << 16 * b, me |= (uint64_t)rd16(b1 + bs * b + 2) << 16 * b;
        }
        __m256 D = _mm256_cvtph_ps(_mm_set_epi64x((long long)de, (long long)dd));
        __m256 M = QB_MIN(f) ? _mm256_cvtph_ps(_mm_set_epi64x((long long)me, (long long)md)) : _mm256_setzero_ps();
        __m256i QH = _mm256_setzero_si256();
        if (QB_FIVE(f)) {
            uint32_t q[8];
            for (int b = 0; b < 4; b++) memcpy(q + b, b0 + bs * b + hoff, 4), memcpy(q + 4 + b, b1 + bs * b + hoff, 4);
            QH = _mm256_loadu_si256((const __m256i *)q);
        }
        __m256i ai[4];
        for (int t = 0; t < nt; t++) ai[t] = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256i L = _mm256_and_si256(T[i], m4), H = _mm256_and_si256(_mm256_srli_epi16(T[i], 4), m4);
            if (QB_FIVE(f)) {  /* as qb4_body512 */
                const int q = i >> 1, sh = 4 * (i & 1);
                const __m256i bits = _mm256_set1_epi32((int)(0x08040201u << sh)), rep = _mm256_set1_epi8((char)q);
                const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
                __m256i ql = _mm256_shuffle_epi8(QH, _mm256_add_epi8(lanes, rep));
                __m256i qh = _mm256_shuffle_epi8(QH, _mm256_add_epi8(lanes, _mm256_add_epi8(rep, _mm256_set1_epi8(2))));
                L = _mm256_or_si256(L, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(ql, bits), bits), c16));
                H = _mm256_or_si256(H, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bits), bits), c16));
            }
            for (int t = 0; t < nt; t++) {  /* u <= 31: both maddubs pairs together at most 15748 */
                const uint8_t *xq = act[t] + 128 * (size_t)u + 32 * i;
                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(L, BC16(xq)), _mm256_maddubs_epi16(H, BC16(xq + 16)));
                ai[t] = _mm256_add_epi32(ai[t], _mm256_madd_epi16(p, ones));
            }
        }
        for (int t = 0; t < nt; t++) {
            const int32_t *xi = (const int32_t *)(act[t] + (size_t)(nb / 4) * 128) + 12 * u;
            __m256 dx = _mm256_broadcast_ps((const __m128 *)(xi + 4));
            __m256i sum = ai[t];
            if (!QB_MIN(f)) sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(BC16(xi), QB_SH(f)));  /* u - 8 or u - 16 */
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), dx), D, acc[t]);
            if (QB_MIN(f)) acc[t] = _mm256_fmadd_ps(M, _mm256_broadcast_ps((const __m128 *)(xi + 8)), acc[t]);
        }
    }
    store2_256(acc, nt, y);
}

#define R256(name, call) MDK_TARGET(A2) static void name(const uint8_t *const *rows, int nb, const uint8_t *const *act, \
                                                          const pf_plan *pf, float (*y)[4]) { call; }
R256(q4k256_1, k45_body256(MDK_Q4K, rows, nb, act, pf, 1, y)) R256(q4k256_2, k45_body256(MDK_Q4K, rows, nb, act, pf, 2, y))
R256(q4k256_3, k45_body256(MDK_Q4K, rows, nb, act, pf, 3, y)) R256(q4k256_4, k45_body256(MDK_Q4K, rows, nb, act, pf, 4, y))
R256(q5k256_1, k45_body256(MDK_Q5K, rows, nb, act, pf, 1, y)) R256(q5k256_2, k45_body256(MDK_Q5K, rows, nb, act, pf, 2, y))
R256(q5k256_3, k45_body256(MDK_Q5K, rows, nb, act, pf, 3, y)) R256(q5k256_4, k45_body256(MDK_Q5K, rows, nb, act, pf, 4, y))
R256(q6k256_1, k6_body256(rows, nb, act, pf, 1, y)) R256(q6k256_2, k6_body256(rows, nb, act, pf, 2, y))
R256(q6k256_3, k6_body256(rows, nb, act, pf, 3, y)) R256(q6k256_4, k6_body256(rows, nb, act, pf, 4, y))
R256(q80256_1, q8_body256(rows, nb, act, pf, 1, y)) R256(q80256_2, q8_body256(rows, nb, act, pf, 2, y))
R256(q80256_3, q8_body256(rows, nb, act, pf, 3, y)) R256(q80256_4, q8_body256(rows, nb, act, pf, 4, y))
#define QB256(F) R256(F##_256_1, qb4_body256(MDK_##F, rows, nb, act, pf, 1, y)) \
    R256(F##_256_2, qb4_body256(MDK_##F, rows, nb, act, pf, 2, y)) R256(F##_256_3, qb4_body256(MDK_##F, rows, nb, act, pf, 3, y)) \
    R256(F##_256_4, qb4_body256(MDK_##F, rows, nb, act, pf, 4, y))
QB256(Q4_0) QB256(Q4_1) QB256(Q5_0) QB256(Q5_1)
#undef QB256
#undef R256

/* ======================= the dispatcher ======================= */
typedef struct { int rows, kind; kraw_rows_fn fn[4]; } raw_kernel;  /* rows a call, prep kind, [nt - 1] */

static const raw_kernel K512[8] = {  /* [fmt - MDK_Q4K]: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 */
    {4, KIND_K4, {q4k512_1, q4k512_2, q4k512_3, q4k512_4}},
    {4, KIND_K4, {q5k512_1, q5k512_2, q5k512_3, q5k512_4}},
    {4, KIND_K6, {q6k512_1, q6k512_2, q6k512_3, q6k512_4}},
    {4, KIND_QB, {q80512_1, q80512_2, q80512_3, q80512_4}},
    {4, KIND_QB, {Q4_0_512_1, Q4_0_512_2, Q4_0_512_3, Q4_0_512_4}},
    {4, KIND_QB, {Q4_1_512_1, Q4_1_512_2, Q4_1_512_3, Q4_1_512_4}},
    {4, KIND_QB, {Q5_0_512_1, Q5_0_512_2, Q5_0_512_3, Q5_0_512_4}},
    {4, KIND_QB, {Q5_1_512_1, Q5_1_512_2, Q5_1_512_3, Q5_1_512_4}},
};
static const raw_kernel K256[8] = {
    {2, KIND_K4, {q4k256_1, q4k256_2, q4k256_3, q4k256_4}},
    {2, KIND_K4, {q5k256_1, q5k256_2, q5k256_3, q5k256_4}},
    {2, KIND_K6, {q6k256_1, q6k256_2, q6k256_3, q6k256_4}},
    {2, KIND_QB, {q80256_1, q80256_2, q80256_3, q80256_4}},
    {2, KIND_QB, {Q4_0_256_1, Q4_0_256_2, Q4_0_256_3, Q4_0_256_4}},
    {2, KIND_QB, {Q4_1_256_1, Q4_1_256_2, Q4_1_256_3, Q4_1_256_4}},
    {2, KIND_QB, {Q5_0_256_1, Q5_0_256_2, Q5_0_256_3, Q5_0_256_4}},
    {2, KIND_QB, {Q5_1_256_1, Q5_1_256_2, Q5_1_256_3, Q5_1_256_4}},
};
int mdk_raw_x86(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    int fmt = w->fmt;
    if (!(MDK_IS_KQ(fmt) || MDK_IS_QB(fmt)) || (mdk_path != MDK_PATH_AVX512 && mdk_path != MDK_PATH_AVX2)) return 0;
    const raw_kernel *K = mdk_path == MDK_PATH_AVX512 ? &K512[fmt - MDK_Q4K] : &K256[fmt - MDK_Q4K];
    /* the same rows, prep and lanes in 128-bit vectors where 256-bit ones are split (kraw_narrow.c) */
    const kraw_rows_fn *fn = mdk_path == MDK_PATH_AVX2 && mdk_narrow && fmt == MDK_Q6K ? mdk_q6k_narrow : K->fn;
    int k = w->k, R = K->rows, qb = MDK_IS_QB(fmt);
    int nb = qb ? k / 32 : k / 256, nb4 = qb ? nb / 4 * 4 : nb;  /* 32-weight formats: units of 4 blocks */
    size_t rb = kraw_row_bytes(fmt, k);
    const uint8_t *act[4];
    for (int t = 0; t < nt; t++)
        if (!(act[t] = mdk_prepared_act(K->kind, a[t], k))) return 0;
    for (int r = r0; r < r1; r += R) {
        const uint8_t *rows[4];
        for (int j = 0; j < R; j++) rows[j] = kraw_row(w, r + j < r1 ? r + j : r1 - 1, rb);
        float out[4][4];
        pf_plan pf = {r + PF_ROWS < w->n ? kraw_row(w, r + PF_ROWS, rb) : NULL, 0, (size_t)R * rb};
        int steps = qb ? nb4 / 4 : nb4;  /* the kernel's block steps (32-weight formats: units of 4) */
        pf.step = steps ? (pf.span / steps + 63) / 64 * 64 : 0;
        if (nb4) fn[nt - 1](rows, nb4, act, &pf, out);
        else memset(out, 0, sizeof out);
        for (int j = 0; j < R && r + j < r1; j++)
            for (int t = 0; t < nt; t++)  /* (blocks past the last unit of 4: the portable kernel's terms) */
                y[t][r - r0 + j] = nb4 < nb ? out[t][j] + mdk_raw_blocks_dot(fmt, rows[j], nb4, nb, a[t]) : out[t][j];
    }
    return 1;
}
#endif
