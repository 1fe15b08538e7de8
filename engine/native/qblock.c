/* GGUF's 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) in the kernel's tiles, their
 * dequantisation, and their dot products with int8 activations (mdk_q8, natural element order).
 *
 * Every format is read as w = d * u + m per block of 32, with u unsigned (what the u8 x s8 integer
 * dot products want): Q4_0 u = nibble, m = -8 d; Q4_1 u = nibble, m stored; Q5_0 u = nibble + 16 *
 * fifth bit, m = -16 d; Q5_1 the same with m stored; Q8_0 u = q + 128, m = -128 d. So
 *   sum(w * x) = d * dx * sum(u * xq) + m * sx,   sx = dx * sum(xq) (the activation's own sums).
 * (The AVX2 path reads Q8_0 signed, m = 0: maddubs would saturate on u = 255.)
 *
 * Layout: rows in tiles of 16; for each tile and block of 32, 16 x the raw block's bytes:
 *   4-bit formats: four 64-byte vectors V0..V3; byte 4r+i of Vc is row r's raw qs[4c+i], so its low
 *     nibble is element 4c+i and its high nibble element 16+4c+i, exactly as GGUF pairs them (and as
 *     MDK_Q4's tiles do: Q4_1's tile-block is MDK_Q4's). Lane r of a 32-bit dot product is row r.
 *   5-bit formats: then 8 x 64-bit masks H0..H7: bit 4r+i of Hj is the fifth bit of row r's element
 *     4j+i, the byte the 4-bit unpack puts in lane r, byte i of chunk j. AVX-512 adds 16 to exactly
 *     those bytes with one masked add (no shuffles to spread bits into bytes).
 *   Q8_0: eight 64-byte vectors W0..W7; byte 4r+i of Wj is row r's q[4j+i] ^ 0x80 (= u).
 *   then the 16 rows' fp16 d, then (Q4_1, Q5_1) their fp16 m.
 * Rows past the last full tile (n % 16 of them) stay in the raw layout after the tiles and run the
 * portable row loop: the tiles then take exactly the file's bytes (4.5 / 5 / 5.5 / 6 / 8.5 bits a
 * weight), with no padding rows, and unpack gives the file's bytes back.
 */
#include "mdk.h"

#include <string.h>

#if MDK_X86
#include <immintrin.h>
#endif

/* per format (compile-time constants inside the SIMD bodies, which are specialised per format) */
#define QB_BITS(f) ((f) == MDK_Q8_0 ? 8 : ((f) == MDK_Q5_0 || (f) == MDK_Q5_1) ? 5 : 4)
#define QB_HASM(f) ((f) == MDK_Q4_1 || (f) == MDK_Q5_1)
#define QB_C(f) ((f) == MDK_Q8_0 ? -128.f : (f) == MDK_Q4_0 ? -8.f : (f) == MDK_Q5_0 ? -16.f : 0.f)  /* m / d */
#define QB_QOFF(f) (2 + 2 * QB_HASM(f) + (QB_BITS(f) == 5 ? 4 : 0))       /* raw: qs after d, m, qh */
#define QB_RB(f) (QB_QOFF(f) + (QB_BITS(f) == 8 ? 32 : 16))                  /* raw block bytes */
#define QB_TBB(f) (16 * QB_RB(f))                                            /* tile-block bytes */
#define QB_HOFF 256                                                          /* tile: fifth-bit masks */
#define QB_DOFF(f) ((QB_BITS(f) == 8 ? 512 : 256) + (QB_BITS(f) == 5 ? 64 : 0))
#define QB_MOFF(f) (QB_DOFF(f) + 32)

static inline uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static int shape_ok(int fmt, int n, int k) { return MDK_IS_QB(fmt) && n >= 0 && k > 0 && k % 32 == 0; }

size_t mdk_qb_bytes(int fmt, int n, int k) {
    return shape_ok(fmt, n, k) ? (size_t)n * (size_t)(k / 32) * QB_RB(fmt) : 0;
}

/* the raw tail: rows 16 * (n / 16) .. n-1, after the tiles */
static const uint8_t *tail_row(int fmt, const uint8_t *t, int n, int k, int r) {
    size_t nb = (size_t)(k / 32);
    return t + (size_t)(n / 16) * nb * QB_TBB(fmt) + (size_t)(r - n / 16 * 16) * nb * QB_RB(fmt);
}

/* row rr's raw block p -> the tile-block tb, and back; the fifth bits go in and out for all 16
 * rows of a tile-block at once (qh_put: each mask gathers a nibble from every row) */
static void tile_put(int f, uint8_t *tb, int rr, const uint8_t *p) {
    const uint8_t *qs = p + QB_QOFF(f);
    memcpy(tb + QB_DOFF(f) + 2 * rr, p, 2);
    if (QB_HASM(f)) memcpy(tb + QB_MOFF(f) + 2 * rr, p + 2, 2);
    if (QB_BITS(f) == 8) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) tb[64 * j + 4 * rr + i] = qs[4 * j + i] ^ 0x80;
        return;
    }
    for (int c = 0; c < 4; c++) memcpy(tb + 64 * c + 4 * rr, qs + 4 * c, 4);
}

static void qh_put(int f, uint8_t *tb, const uint8_t *const *p) {  /* p[r]: row r's raw block */
    uint32_t qh[16];
    for (int r = 0; r < 16; r++) qh[r] = le32(p[r] + 2 + 2 * QB_HASM(f));
    for (int j = 0; j < 8; j++)
        for (int r = 0; r < 16; r += 2)
            tb[QB_HOFF + 8 * j + r / 2] = (uint8_t)(((qh[r] >> 4 * j) & 15) | ((qh[r + 1] >> 4 * j) & 15) << 4);
}

static void tile_get(int f, const uint8_t *tb, int rr, uint8_t *p) {  /* all but the fifth bits */
    uint8_t *qs = p + QB_QOFF(f);
    memcpy(p, tb + QB_DOFF(f) + 2 * rr, 2);
    if (QB_HASM(f)) memcpy(p + 2, tb + QB_MOFF(f) + 2 * rr, 2);
    if (QB_BITS(f) == 8) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) qs[4 * j + i] = tb[64 * j + 4 * rr + i] ^ 0x80;
        return;
    }
    for (int c = 0; c < 4; c++) memcpy(qs + 4 * c, tb + 64 * c + 4 * rr, 4);
}

static void qh_get(int f, const uint8_t *tb, int rr, uint8_t *p) {  /* row rr's fifth bits -> its raw qh */
    uint32_t qh = 0;
    for (int j = 0; j < 8; j++) qh |= (uint32_t)((tb[QB_HOFF + 8 * j + rr / 2] >> 4 * (rr & 1)) & 15) << 4 * j;
    uint8_t *h = p + 2 + 2 * QB_HASM(f);
    for (int i = 0; i < 4; i++) h[i] = (uint8_t)(qh >> 8 * i);
}

static void tile_get_row(int f, const uint8_t *tb, int rr, uint8_t *p) {  /* one whole raw block */
    tile_get(f, tb, rr, p);
    if (QB_BITS(f) == 5) qh_get(f, tb, rr, p);
}

/* u[32] (the unsigned values of w = d * u + m) of one raw block */
static void raw_values(int f, const uint8_t *p, uint8_t *u) {
    const uint8_t *qs = p + QB_QOFF(f);
    if (QB_BITS(f) == 8) {
        for (int i = 0; i < 32; i++) u[i] = qs[i] ^ 0x80;
        return;
    }
    for (int i = 0; i < 16; i++) { u[i] = qs[i] & 15; u[16 + i] = qs[i] >> 4; }
    if (QB_BITS(f) == 5) {
        uint32_t qh = le32(p + 2 + 2 * QB_HASM(f));
        for (int i = 0; i < 32; i++) u[i] |= (uint8_t)(((qh >> i) & 1) << 4);
    }
}

/* row r's block b as raw bytes, wherever it lives (a tile or the tail) */
static void block_raw(int f, const uint8_t *t, int n, int k, int r, int b, uint8_t *p) {
    int nb = k / 32;
    if (r < n / 16 * 16) tile_get_row(f, t + ((size_t)(r / 16) * nb + b) * QB_TBB(f), r % 16, p);
    else memcpy(p, tail_row(f, t, n, k, r) + (size_t)b * QB_RB(f), QB_RB(f));
}

int mdk_qb_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *t) {
    if (!shape_ok(fmt, n, k)) return -1;
    int nb = k / 32, full = n / 16 * 16;
    size_t rb = QB_RB(fmt), row = (size_t)nb * rb;
    for (int r0 = 0; r0 < full; r0 += 16)
        for (int b = 0; b < nb; b++) {
            uint8_t *tb = t + ((size_t)(r0 / 16) * nb + b) * QB_TBB(fmt);
            const uint8_t *p[16];
            for (int r = 0; r < 16; r++) tile_put(fmt, tb, r, p[r] = raw + (r0 + r) * row + b * rb);
            if (QB_BITS(fmt) == 5) qh_put(fmt, tb, p);
        }
    if (n > full) memcpy((uint8_t *)tail_row(fmt, t, n, k, full), raw + (size_t)full * row, (size_t)(n - full) * row);
    return 0;
}

int mdk_qb_unpack(int fmt, const uint8_t *t, int n, int k, uint8_t *raw) {
    if (!shape_ok(fmt, n, k)) return -1;
    int nb = k / 32, full = n / 16 * 16;
    size_t rb = QB_RB(fmt), row = (size_t)nb * rb;
    for (int r0 = 0; r0 < full; r0 += 16)
        for (int b = 0; b < nb; b++) {
            const uint8_t *tb = t + ((size_t)(r0 / 16) * nb + b) * QB_TBB(fmt);
            for (int r = 0; r < 16; r++) tile_get_row(fmt, tb, r, raw + (r0 + r) * row + b * rb);
        }
    if (n > full) memcpy(raw + (size_t)full * row, tail_row(fmt, t, n, k, full), (size_t)(n - full) * row);
    return 0;
}

/* Bit-exact with gguf.quants.dequantize: the same float operations in the same order (numpy's
 * d * q, or (d * q) + m, each rounded: two statements, and -std=c11 keeps GCC from fusing them). */
void mdk_qb_dequantize(int fmt, const uint8_t *t, int n, int k, int r0, int r1, float *out) {
    if (!shape_ok(fmt, n, k) || r0 < 0 || r1 > n || r0 >= r1) return;
    int nb = k / 32;
    uint8_t p[34], u[32];
    for (int r = r0; r < r1; r++)
        for (int b = 0; b < nb; b++) {
            block_raw(fmt, t, n, k, r, b, p);
            raw_values(fmt, p, u);
            float d = mdk_h2f(le16(p)), *o = out + (size_t)(r - r0) * k + 32 * b;
            if (QB_HASM(fmt)) {
                float m = mdk_h2f(le16(p + 2));
                for (int i = 0; i < 32; i++) {
                    float dq = d * (float)u[i];
                    o[i] = dq + m;
                }
            } else {
                int off = (int)QB_C(fmt);  /* the signed value is u + (m / d): exact in int */
                for (int i = 0; i < 32; i++) o[i] = d * (float)(u[i] + off);
            }
        }
}

/* ---------------- dot products ---------------- */
/* one raw block against 32 int8 activations (scale dx, sx = dx * their sum) */
static float block_dot(int f, const uint8_t *p, const int8_t *x, float dx, float sx) {
    uint8_t u[32];
    raw_values(f, p, u);
    int s = 0;
    for (int i = 0; i < 32; i++) s += u[i] * x[i];
    float d = mdk_h2f(le16(p)), m = QB_HASM(f) ? mdk_h2f(le16(p + 2)) : QB_C(f) * d;
    return d * dx * (float)s + m * sx;
}

/* one row of raw blocks against one token (the tail rows, on every path) */
static float raw_row_dot(int f, const uint8_t *row, int nb, const mdk_q8 *a) {
    float acc = 0.f;
    for (int b = 0; b < nb; b++) acc += block_dot(f, row + (size_t)b * QB_RB(f), a->q + 32 * b, a->dx[b], a->sx[b]);
    return acc;
}

/* one tile of 16 rows against one token: the portable path */
static void tile_c(int f, const uint8_t *tile, int nb, const mdk_q8 *a, float *y) {
    float acc[16] = {0};
    uint8_t p[34];
    for (int b = 0; b < nb; b++) {
        const uint8_t *tb = tile + (size_t)b * QB_TBB(f);
        for (int r = 0; r < 16; r++) {
            tile_get_row(f, tb, r, p);
            acc[r] += block_dot(f, p, a->q + 32 * b, a->dx[b], a->sx[b]);
        }
    }
    memcpy(y, acc, sizeof acc);
}

typedef void (*tiles_fn)(const uint8_t *tile, int nb, const mdk_q8 *const *a, float *const *y);

#if MDK_X86
static inline int32_t load4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* AVX2, one token: rows 0..7 in the low 32 bytes of each vector, 8..15 in the high ones */
MDK_TARGET("avx2,fma,f16c")
static MDK_INLINE void tile_avx2_body(const uint8_t *tile, int nb, const mdk_q8 *a, float *y, const int f) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), c16 = _mm256_set1_epi8(16);
    const __m256i flip = _mm256_set1_epi8((char)0x80), bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    /* 16 where the mask's bit k (k = byte) is set: the fifth bits of 8 rows of chunk j */
#define FIFTH(j, h) _mm256_and_si256(c16, _mm256_cmpeq_epi8(bit, _mm256_and_si256(bit, _mm256_shuffle_epi8( \
        _mm256_set1_epi32((int)le32(tb + QB_HOFF + 8 * (j) + 4 * (h))), spread))))
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const uint8_t *tb = tile + (size_t)b * QB_TBB(f);
        const int8_t *x = a->q + 32 * b;
        for (int h = 0; h < 2; h++) {
            __m256i s = _mm256_setzero_si256();
            if (QB_BITS(f) == 8)
                for (int j = 0; j < 8; j++) {
                    __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(tb + 64 * j + 32 * h)), flip);
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(load4(x + 4 * j)), w));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
            else
                for (int c = 0; c < 4; c++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(tb + 64 * c + 32 * h));
                    __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                    if (QB_BITS(f) == 5) { lo = _mm256_or_si256(lo, FIFTH(c, h)); hi = _mm256_or_si256(hi, FIFTH(c + 4, h)); }
                    /* at most 2 * 31 * 127 per maddubs pair, twice: 15748, no saturation */
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load4(x + 4 * c))),
                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load4(x + 16 + 4 * c))));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tb + QB_DOFF(f) + 16 * h)));
            __m256 sd = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(a->dx[b]));
            if (QB_HASM(f)) {
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tb + QB_MOFF(f) + 16 * h)));
                acc[h] = _mm256_fmadd_ps(sd, d, _mm256_fmadd_ps(m, _mm256_set1_ps(a->sx[b]), acc[h]));
            } else {
                float c = f == MDK_Q8_0 ? 0.f : QB_C(f);  /* Q8_0 ran signed here */
                acc[h] = _mm256_fmadd_ps(_mm256_add_ps(sd, _mm256_set1_ps(c * a->sx[b])), d, acc[h]);
            }
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
#undef FIFTH
}

#define T512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"

/* AVX-512, nt (1..4) tokens against one tile: each block's values are unpacked once for all of them */
MDK_TARGET(T512)
static MDK_INLINE void tiles_avx512_body(const uint8_t *tile, int nb, const mdk_q8 *const *a, float *const *y,
                                         const int f, const int nt) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), c16 = _mm512_set1_epi8(16);
    const int nc = nt == 1 ? 4 : 2;  /* independent dpbusd chains a token */
    __m512 acc[4], accm[4];
    for (int t = 0; t < nt; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *tb = tile + (size_t)b * QB_TBB(f);
        __m512i u[8];
        if (QB_BITS(f) == 8)
            for (int j = 0; j < 8; j++) u[j] = _mm512_loadu_si512((const void *)(tb + 64 * j));
        else
            for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_loadu_si512((const void *)(tb + 64 * c));
                u[c] = _mm512_and_si512(v, lo4);
                u[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            }
        if (QB_BITS(f) == 5)
            for (int j = 0; j < 8; j++) {
                uint64_t k;
                memcpy(&k, tb + QB_HOFF + 8 * j, 8);
                u[j] = _mm512_mask_add_epi8(u[j], (__mmask64)k, u[j], c16);
            }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tb + QB_DOFF(f))));
        __m512 m = QB_HASM(f) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tb + QB_MOFF(f)))) : d;
        for (int t = 0; t < nt; t++) {
            const int8_t *x = a[t]->q + 32 * b;
            __m512i s[4];
            for (int c = 0; c < nc; c++) s[c] = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) s[j % nc] = _mm512_dpbusd_epi32(s[j % nc], u[j], _mm512_set1_epi32(load4(x + 4 * j)));
            for (int c = 1; c < nc; c++) s[0] = _mm512_add_epi32(s[0], s[c]);
            __m512 sf = _mm512_cvtepi32_ps(s[0]), dx = _mm512_set1_ps(a[t]->dx[b]);
            if (QB_HASM(f)) {
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(sf, dx), d, acc[t]);
                accm[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[t]->sx[b]), accm[t]);
            } else  /* m = c d: d * (dx s + c sx) */
                acc[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(sf, dx, _mm512_set1_ps(QB_C(f) * a[t]->sx[b])), d, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y[t], QB_HASM(f) ? _mm512_add_ps(acc[t], accm[t]) : acc[t]);
}

#define QB_AVX2(F) MDK_TARGET("avx2,fma,f16c") static void avx2_##F(const uint8_t *t, int nb, const mdk_q8 *const *a, \
        float *const *y) { tile_avx2_body(t, nb, a[0], y[0], MDK_##F); }
#define QB_512(F, N) MDK_TARGET(T512) static void avx512_##F##_##N(const uint8_t *t, int nb, const mdk_q8 *const *a, \
        float *const *y) { tiles_avx512_body(t, nb, a, y, MDK_##F, N); }
#define QB_FMT(F) QB_AVX2(F) QB_512(F, 1) QB_512(F, 2) QB_512(F, 3) QB_512(F, 4)
QB_FMT(Q8_0) QB_FMT(Q4_0) QB_FMT(Q4_1) QB_FMT(Q5_0) QB_FMT(Q5_1)
#define QB_ROW(F) {avx512_##F##_1, avx512_##F##_2, avx512_##F##_3, avx512_##F##_4}
static const tiles_fn AVX512_FN[5][4] = {QB_ROW(Q8_0), QB_ROW(Q4_0), QB_ROW(Q4_1), QB_ROW(Q5_0), QB_ROW(Q5_1)};
static const tiles_fn AVX2_FN[5] = {avx2_Q8_0, avx2_Q4_0, avx2_Q4_1, avx2_Q5_0, avx2_Q5_1};
#endif

/* nt tokens against one tile, on the active path */
static void tile_tokens(int f, const uint8_t *tile, int nb, const mdk_q8 *const *a, int nt, float *const *y) {
#if MDK_X86
    if (mdk_path == MDK_PATH_AVX512) { AVX512_FN[f - MDK_Q8_0][nt - 1](tile, nb, a, y); return; }
    if (mdk_path == MDK_PATH_AVX2) {  /* token by token: the tile stays in L1 between them */
        for (int t = 0; t < nt; t++) AVX2_FN[f - MDK_Q8_0](tile, nb, a + t, y + t);
        return;
    }
#endif
    for (int t = 0; t < nt; t++) tile_c(f, tile, nb, a[t], y[t]);
}

/* y[t][0..r1-r0) = rows r0..r1-1 (any range) dotted with token a[t], t < nt. A range that
 * cuts a tile computes the whole tile and keeps its part. */
void mdk_qb_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (nt > 4) {  /* (moe.c passes at most 4) */
        mdk_qb_rows_multi(w, r0, r1, a + 4, nt - 4, y + 4);
        nt = 4;
    }
    if (nt <= 0) return;
    int f = w->fmt, n = w->n, k = w->k, nb = k / 32, full = n / 16 * 16;
    const uint8_t *base = (const uint8_t *)w->w;
    float tmp[4][16];
    int r = r0;
    while (r < r1 && r < full) {
        int t0 = r / 16 * 16, lo = r - t0, hi = r1 - t0 < 16 ? r1 - t0 : 16;
        float *dst[4];
        for (int t = 0; t < nt; t++) dst[t] = lo == 0 && hi == 16 ? y[t] + (r - r0) : tmp[t];
        tile_tokens(f, base + (size_t)(t0 / 16) * nb * QB_TBB(f), nb, a, nt, dst);
        if (dst[0] == tmp[0])
            for (int t = 0; t < nt; t++) memcpy(y[t] + (r - r0), tmp[t] + lo, (size_t)(hi - lo) * 4);
        r = t0 + hi;
    }
    for (; r < r1; r++)
        for (int t = 0; t < nt; t++) y[t][r - r0] = raw_row_dot(f, tail_row(f, base, n, k, r), nb, a[t]);
}

void mdk_qb_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    mdk_qb_rows_multi(w, r0, r1, &a, 1, &y);
}
