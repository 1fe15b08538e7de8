/* Many tokens times a GGUF matrix in the file's own rows (raw blocks): a prompt's products.
 *
 * Shapes: W [N, K] raw ggml blocks (kraw.h); T tokens' activations as mdk_q8 (int8 per block of 32,
 * quantised once per layer); y[t][r] = sum_k W[r, k] x[t, k].
 *
 * Why this and not kraw_x86.c's kernels: those read 4 rows of blocks and rearrange them in registers
 * for at most 4 tokens a call, so a prompt pays the rearrangement again every 4 tokens (about 20% of
 * the machine's int8 peak at 4,096 tokens, measured). Here a panel of 16 rows is unpacked once into
 * the integer dot product's order, in a small buffer that stays in L1/L2, and then every token of the
 * call streams past it:
 *   panel  u8 [K/4][16][4]: lane r of a 64-byte vector is row r, its 4 bytes 4 consecutive weights
 *          (the format's unsigned codes: Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, Q8_0 q + 128, ...), and per
 *          block of 32 (Q6_K: of 16) the rows' float scale A and offset B as vectors [16]
 *   kernel per block of 32 and token t: 8 vpdpbusd (a broadcast of 4 activation bytes times 16 rows,
 *          no horizontal sums), then y += A * dx_t * isum + B * sx_t in fp32: a weight is A u + B/32-ish,
 *          B is what the format's minimum or offset gives (Q4_K -dmin m, Q4_1 m, Q4_0 -8 d, Q8_0 -128 d,
 *          Q6_K -32 d sc per 16), sx_t = dx_t * sum(xq) over the block (sxh: over 16)
 * The integer sums are exact, so a product equals kraw.c's up to the order of the fp32 additions.
 * Measured on one Zen 5 core: the kernel alone 620-760 GOPS against 730-910 for back-to-back vpdpbusd.
 *
 * AVX-512 VNNI only (mdk_path == MDK_PATH_AVX512); elsewhere mdk_gemm_ok says no and the callers keep
 * the row kernels. The caller splits the rows among threads (any range; panels of 16 inside).
 */
#include "kraw.h"

#include <stdlib.h>
#include <string.h>

#if MDK_X86
#include <immintrin.h>

#define A512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define NTOK 8  /* tokens per kernel call: 8 int and 8 float accumulators */


/* ---------------- one panel: 16 rows unpacked ---------------- */
typedef struct {
    int k, cap;
    uint8_t *w;        /* [k/4][16][4] */
    float *A, *B;      /* [G][16], G = k/32 scale groups (Q6_K: k/16) */
    uint8_t *rows;     /* [16][k]: the rows' codes in natural order, before the transpose */
    float *RA, *RB;    /* [16][G]: the rows' A and B, before the transpose */
} panel;

static MDK_TLS panel P;  /* each thread's own */

static int panel_reserve(int k) {
    if (P.cap >= k) return 1;
    mdk_raw_free(P.w);
    size_t g = (size_t)(k / 16) * 16 * 4;  /* bytes of one [G][16] float array, at most */
    P.w = (uint8_t *)mdk_raw_alloc((size_t)16 * k * 2 + 4 * g + 256);
    if (!P.w) { P.cap = 0; return 0; }
    P.rows = P.w + (size_t)16 * k;
    P.A = (float *)(P.rows + (size_t)16 * k);
    P.B = (float *)((uint8_t *)P.A + g);
    P.RA = (float *)((uint8_t *)P.B + g);
    P.RB = (float *)((uint8_t *)P.RA + g);
    P.cap = k;
    return 1;
}

MDK_TARGET(A512)
static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* Q4_K/Q5_K's 12 scale bytes -> sc[0..7] (bytes 0..7 of out) and mn[0..7] (8..15), gguf's get_scale_min
 * for all 8 sub-blocks at once (the masks llama.cpp's kernels use) */
static inline void scales_mins(const uint8_t *s, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
    memcpy(out, u, 16);
}

/* Scale groups of 16 weights (Q6_K, and the codes formats with 16-weight groups), else of 32 */
static int g16(int fmt) { return fmt == MDK_Q6K || (MDK_IS_CODES(fmt) && mdk_codes_info_of(fmt)->gs == 16); }

/* Row r (0..15) of the panel from one raw row: its codes into P.rows[r], its A and B into P.RA/RB[r]. */
MDK_TARGET(A512)
static void unpack_row(int fmt, const uint8_t *row, int k, int r) {
    uint8_t *o = P.rows + (size_t)r * k;
    if (MDK_IS_CODES(fmt)) {  /* codes_x86.c: a unit of 256 weights at a time, codes and group terms */
        int G = g16(fmt) ? k / 16 : k / 32;
        float *ra = P.RA + (size_t)r * G, *rbm = P.RB + (size_t)r * G, A[16], B[16];
        for (int un = 0; un < k / 256; un++) {
            int n = mdk_codes_unit(fmt, row, un, o + 256 * un, A, B);
            memcpy(ra + n * un, A, sizeof(float) * n);
            memcpy(rbm + n * un, B, sizeof(float) * n);
        }
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    if (fmt == MDK_Q4K || fmt == MDK_Q5K) {
        const int bs = fmt == MDK_Q4K ? 144 : 176, q0 = fmt == MDK_Q4K ? 16 : 48;
        float *ra = P.RA + (size_t)r * (k / 32), *rbm = P.RB + (size_t)r * (k / 32);
        for (int s = 0; s < k / 256; s++) {
            const uint8_t *b = row + (size_t)s * bs;
            __m256i qh = fmt == MDK_Q5K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(b + q0 + 32 * p));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (fmt == MDK_Q5K) {  /* bit 2p (lo) / 2p+1 (hi) of qh[l]: the fifth bit, 16 */
                    __m256i bl = _mm256_set1_epi8((char)(1 << (2 * p))), bh = _mm256_set1_epi8((char)(2 << (2 * p)));
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl),
                                                              _mm256_set1_epi8(16)));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh),
                                                              _mm256_set1_epi8(16)));
                }
                _mm256_storeu_si256((__m256i *)(o + 256 * s + 64 * p), lo);
                _mm256_storeu_si256((__m256i *)(o + 256 * s + 64 * p + 32), hi);
            }
            uint8_t sm[16];
            scales_mins(b + 4, sm);
            __m128i v = _mm_loadu_si128((const __m128i *)sm);
            __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
            _mm256_storeu_ps(ra + 8 * s, _mm256_mul_ps(_mm256_set1_ps(h2f(b)), sc));             /* d sc */
            _mm256_storeu_ps(rbm + 8 * s, _mm256_mul_ps(_mm256_set1_ps(-h2f(b + 2)), mn));      /* -(dmin m) */
        }
        return;
    }
    if (fmt == MDK_Q6K) {
        const __m256i m3 = _mm256_set1_epi8(3);
        float *ra = P.RA + (size_t)r * (k / 16), *rbm = P.RB + (size_t)r * (k / 16);
        for (int s = 0; s < k / 256; s++) {
            const uint8_t *b = row + (size_t)s * 210;
            for (int h = 0; h < 2; h++) {  /* chunk i of 32: ql[64h + 32 (i & 1)] >> 4 (i >> 1), qh >> 2i */
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h)),
                        l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32)),
                        qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
                __m256i c[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
                for (int i = 0; i < 4; i++) {
                    __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), m3);
                    c[i] = _mm256_or_si256(c[i], _mm256_slli_epi16(hb, 4));
                    _mm256_storeu_si256((__m256i *)(o + 256 * s + 128 * h + 32 * i), c[i]);
                }
            }
            /* w = d sc_g (q - 32): A = d sc_g, B = -32 A, per group of 16 */
            __m512 a = _mm512_mul_ps(_mm512_set1_ps(h2f(b + 208)),
                                     _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192)))));
            _mm512_storeu_ps(ra + 16 * s, a);
            _mm512_storeu_ps(rbm + 16 * s, _mm512_mul_ps(_mm512_set1_ps(-32.f), a));
        }
        return;
    }
    /* the 32-weight blocks: u unsigned, w = d u + m (m: Q4_1/Q5_1's own, else -8 d, -16 d, -128 d) */
    const int bs = kraw_bsize(fmt);
    float *ra = P.RA + (size_t)r * (k / 32), *rbm = P.RB + (size_t)r * (k / 32);
    for (int bl = 0; bl < k / 32; bl++) {
        const uint8_t *p = row + (size_t)bl * bs;
        uint8_t *u = o + 32 * bl;
        float d = h2f(p), m;
        if (fmt == MDK_Q8_0) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(p + 2));
            _mm256_storeu_si256((__m256i *)u, _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
            m = -128.f * d;
        } else {
            int hasm = fmt == MDK_Q4_1 || fmt == MDK_Q5_1, five = fmt == MDK_Q5_0 || fmt == MDK_Q5_1;
            const uint8_t *qs = p + 2 + 2 * hasm + 4 * five;
            __m128i v = _mm_loadu_si128((const __m128i *)qs), m4x = _mm_set1_epi8(15);
            __m256i uu = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4x), _mm_and_si128(v, m4x));
            if (five) {  /* bit i of qh: the fifth bit of weight i */
                uint32_t qh;
                memcpy(&qh, p + 2 + 2 * hasm, 4);
                __mmask32 bits = (__mmask32)qh;
                uu = _mm256_or_si256(uu, _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(16)));
            }
            _mm256_storeu_si256((__m256i *)u, uu);
            m = hasm ? h2f(p + 2) : (fmt == MDK_Q4_0 ? -8.f : -16.f) * d;
        }
        ra[bl] = d;
        rbm[bl] = m;
    }
}

/* P.RA/RB [16][G] -> P.A/B [G][16] */
MDK_TARGET(A512)
static void transpose_scales(int G) {
    for (int g = 0; g < G; g++)
        for (int r = 0; r < 16; r++) {
            P.A[g * 16 + r] = P.RA[(size_t)r * G + g];
            P.B[g * 16 + r] = P.RB[(size_t)r * G + g];
        }
}

/* P.rows [16][k] -> P.w [k/4][16][4]: 16 x 16 dword transposes */
MDK_TARGET(A512)
static void transpose_panel(int k) {
    for (int c = 0; c < k / 64; c++) {
        __m512i a[16], b[16];
        for (int r = 0; r < 16; r++) a[r] = _mm512_loadu_si512(P.rows + (size_t)r * k + 64 * c);
        for (int r = 0; r < 16; r += 2) {
            b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
            b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
        }
        for (int r = 0; r < 16; r += 4) {
            a[r] = _mm512_unpacklo_epi64(b[r], b[r + 2]);
            a[r + 1] = _mm512_unpackhi_epi64(b[r], b[r + 2]);
            a[r + 2] = _mm512_unpacklo_epi64(b[r + 1], b[r + 3]);
            a[r + 3] = _mm512_unpackhi_epi64(b[r + 1], b[r + 3]);
        }
        /* a[4g + i] holds, in each 128-bit chunk l, dword i of rows 4g..4g+3 at quad 4l + i' ... */
        for (int g = 0; g < 4; g++) {
            b[4 * g + 0] = _mm512_shuffle_i32x4(a[g], a[4 + g], 0x88);
            b[4 * g + 1] = _mm512_shuffle_i32x4(a[g], a[4 + g], 0xDD);
            b[4 * g + 2] = _mm512_shuffle_i32x4(a[8 + g], a[12 + g], 0x88);
            b[4 * g + 3] = _mm512_shuffle_i32x4(a[8 + g], a[12 + g], 0xDD);
        }
        for (int g = 0; g < 4; g++) {
            __m512i x0 = _mm512_shuffle_i32x4(b[4 * g], b[4 * g + 2], 0x88);
            __m512i x1 = _mm512_shuffle_i32x4(b[4 * g + 1], b[4 * g + 3], 0x88);
            __m512i x2 = _mm512_shuffle_i32x4(b[4 * g], b[4 * g + 2], 0xDD);
            __m512i x3 = _mm512_shuffle_i32x4(b[4 * g + 1], b[4 * g + 3], 0xDD);
            uint8_t *o = P.w + (size_t)(16 * c) * 64;
            _mm512_storeu_si512(o + 64 * (g + 0), x0);
            _mm512_storeu_si512(o + 64 * (g + 4), x1);
            _mm512_storeu_si512(o + 64 * (g + 8), x2);
            _mm512_storeu_si512(o + 64 * (g + 12), x3);
        }
    }
}

/* Rows p..p+nr-1 of w into the panel (rows past nr repeat the last: their results are dropped). */
MDK_TARGET(A512)
static void fill_panel(const mdk_matrix *w, int p, int nr) {
    size_t rb = kraw_row_bytes(w->fmt, w->k);
    for (int r = 0; r < 16; r++) unpack_row(w->fmt, kraw_row(w, p + (r < nr ? r : nr - 1), rb), w->k, r);
    transpose_panel(w->k);
    transpose_scales(g16(w->fmt) ? w->k / 16 : w->k / 32);
}

#define BC4(p) _mm512_set1_epi32(*(const int32_t *)(p))  /* 4 activation bytes to every lane */

/* acc[t] (16 rows) = the panel times token a[t], t < NT; G16: scale groups of 16 (Q6_K). The tokens'
 * pointers and the sums are locals (written to acc once at the end): with acc and the tokens behind
 * pointers the compiler stored every sum and reloaded every pointer after each FMA (measured: 420
 * against 650+ GOPS). */
MDK_TARGET(A512)
static MDK_INLINE void kern(int k, const mdk_q8 *const *a, const int NT, const int G16, __m512 *out) {
    const int8_t *xq[NTOK];
    const float *dx[NTOK], *sx[NTOK];
    __m512 acc[NTOK];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        xq[t] = a[t]->q, dx[t] = a[t]->dx, sx[t] = G16 ? a[t]->sxh : a[t]->sx;
        acc[t] = _mm512_setzero_ps();
    }
    const uint8_t *wq = P.w;
    const float *PA = P.A, *PB = P.B;
    for (int j = 0; j < k / 32; j++, wq += 512) {
        __m512i lo[NTOK], hi[NTOK];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            __m512i W = _mm512_load_si512(wq + 64 * q);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                __m512i X = BC4(xq[t] + 32 * j + 4 * q);
                if (G16 && q >= 4) hi[t] = _mm512_dpbusd_epi32(hi[t], W, X);
                else lo[t] = _mm512_dpbusd_epi32(lo[t], W, X);
            }
        }
        if (!G16) {
            __m512 A = _mm512_load_ps(PA + 16 * j), B = _mm512_load_ps(PB + 16 * j);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(lo[t]), A);
                acc[t] = _mm512_fmadd_ps(f, _mm512_set1_ps(dx[t][j]), acc[t]);
                acc[t] = _mm512_fmadd_ps(B, _mm512_set1_ps(sx[t][j]), acc[t]);
            }
        } else {
            __m512 A0 = _mm512_load_ps(PA + 32 * j), A1 = _mm512_load_ps(PA + 32 * j + 16);
            __m512 B0 = _mm512_load_ps(PB + 32 * j), B1 = _mm512_load_ps(PB + 32 * j + 16);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[t]), A1, _mm512_mul_ps(_mm512_cvtepi32_ps(lo[t]), A0));
                acc[t] = _mm512_fmadd_ps(f, _mm512_set1_ps(dx[t][j]), acc[t]);
                acc[t] = _mm512_fmadd_ps(B0, _mm512_set1_ps(sx[t][2 * j]), acc[t]);
                acc[t] = _mm512_fmadd_ps(B1, _mm512_set1_ps(sx[t][2 * j + 1]), acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) out[t] = acc[t];
}

typedef void (*kern_fn)(int k, const mdk_q8 *const *a, __m512 *acc);
#define KERN(n, g) MDK_TARGET(A512) static void kern_##n##_##g(int k, const mdk_q8 *const *a, __m512 *acc) { kern(k, a, n, g, acc); }
KERN(1, 0) KERN(2, 0) KERN(3, 0) KERN(4, 0) KERN(5, 0) KERN(6, 0) KERN(7, 0) KERN(8, 0)
KERN(1, 1) KERN(2, 1) KERN(3, 1) KERN(4, 1) KERN(5, 1) KERN(6, 1) KERN(7, 1) KERN(8, 1)
static const kern_fn KERNS[2][NTOK] = {
    {kern_1_0, kern_2_0, kern_3_0, kern_4_0, kern_5_0, kern_6_0, kern_7_0, kern_8_0},
    {kern_1_1, kern_2_1, kern_3_1, kern_4_1, kern_5_1, kern_6_1, kern_7_1, kern_8_1}};

MDK_TARGET(A512)
static void gemm512(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y,
                    const float *wts, const float *bias) {
    const kern_fn *K = KERNS[g16(w->fmt)];
    for (int p = r0; p < r1; p += 16) {
        int nr = r1 - p < 16 ? r1 - p : 16;
        __mmask16 mask = (__mmask16)(nr == 16 ? 0xFFFF : (1u << nr) - 1);
        fill_panel(w, p, nr);
        __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + p) : _mm512_setzero_ps();
        for (int t0 = 0; t0 < nt; t0 += NTOK) {
            int n = nt - t0 < NTOK ? nt - t0 : NTOK;
            __m512 acc[NTOK];
            K[n - 1](w->k, a + t0, acc);
            for (int t = 0; t < n; t++) {
                float *dst = y[t0 + t] + (p - r0);
                if (!wts) {
                    _mm512_mask_storeu_ps(dst, mask, acc[t]);
                } else {  /* out += route weight * (y + bias) */
                    __m512 old = _mm512_maskz_loadu_ps(mask, dst);
                    _mm512_mask_storeu_ps(dst, mask, _mm512_fmadd_ps(_mm512_add_ps(acc[t], bv),
                                                                     _mm512_set1_ps(wts[t0 + t]), old));
                }
            }
        }
    }
}
#endif

/* This thread's arrays of n token pointers and output pointers (the callers' gathers), or NULL */
static MDK_TLS const mdk_q8 **tok_ptrs;
static MDK_TLS float **out_ptrs;
static MDK_TLS int ptrs_cap;

int mdk_gemm_ptrs(int n, const mdk_q8 ***a, float ***y) {
    if (n > ptrs_cap) {
        mdk_raw_free((void *)tok_ptrs);
        mdk_raw_free(out_ptrs);
        tok_ptrs = (const mdk_q8 **)mdk_raw_alloc((size_t)n * sizeof(void *));
        out_ptrs = (float **)mdk_raw_alloc((size_t)n * sizeof(void *));
        ptrs_cap = tok_ptrs && out_ptrs ? n : 0;
        if (!ptrs_cap) return -1;
    }
    *a = tok_ptrs, *y = out_ptrs;
    return 0;
}

/* From how many tokens a matrix goes through this kernel rather than the row kernels (measured: see
 * tests/test_gemm.py, benchmarks/prefill.py; MIXDESK_GEMM_MIN sets it, 0 turns the kernel off) */
int mdk_gemm_min = 6;

/* The threshold in use; want >= 0 sets it (tests and benchmarks compare the two kernels) */
MDK_API int mdk_gemm_threshold(int want) {
    static int read_env = 0;
    if (!read_env) {
        const char *e = getenv("MIXDESK_GEMM_MIN");
        if (e && *e) mdk_gemm_min = atoi(e);
        read_env = 1;
    }
    if (want >= 0) mdk_gemm_min = want;
    return mdk_gemm_min;
}

int mdk_gemm_ok(const mdk_matrix *w) {
#if MDK_X86
    if (MDK_IS_CODES(w->fmt)) return mdk_path == MDK_PATH_AVX512 && w->raw && w->k % 256 == 0 && w->k > 0;
    return mdk_path == MDK_PATH_AVX512 && w->raw && (MDK_IS_KQ(w->fmt) || MDK_IS_QB(w->fmt)) && w->k % 64 == 0 &&
           w->k > 0;
#else
    (void)w;
    return 0;
#endif
}

/* y[t][r - r0] = row r of w times token a[t] (rows r0..r1-1, tokens t < nt); with wts, y[t][r - r0] +=
 * wts[t] * (that + bias[r]) (bias may be NULL) instead. 0, or -1: not for this matrix or CPU (mdk_gemm_ok)
 * or no memory for the panel; the caller then runs the row kernels. */
int mdk_gemm_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y,
                  const float *wts, const float *bias) {
#if MDK_X86
    if (!mdk_gemm_ok(w) || !panel_reserve(w->k)) return -1;
    if (nt > 0 && r0 < r1) gemm512(w, r0, r1, a, nt, y, wts, bias);
    return 0;
#else
    (void)w, (void)r0, (void)r1, (void)a, (void)nt, (void)y, (void)wts, (void)bias;
    return -1;
#endif
}

/* For tests: y [nt, n] = x [nt, k] (fp32) times w, through this kernel, reps times (benchmarks: the
 * activations quantised once); -1 where it does not apply. */
MDK_API int mdk_gemm_test(const mdk_matrix *w, const float *x, int nt, float *y, int reps) {
    size_t each = mdk_q8_bytes(w->k);
    char *mem = (char *)mdk_raw_alloc((size_t)nt * (each + sizeof(mdk_q8)) + 64);
    if (!mem) return -1;
    mdk_q8 *q = (mdk_q8 *)mem;
    const mdk_q8 *qp[256];
    float *yp[256];
    if (nt > 256) { mdk_raw_free(mem); return -1; }
    for (int t = 0; t < nt; t++) {
        mdk_q8_init(&q[t], mem + nt * sizeof(mdk_q8) + (size_t)t * each, w->k);
        mdk_quantize_act(x + (size_t)t * w->k, w->k, &q[t]);
        qp[t] = &q[t];
        yp[t] = y + (size_t)t * w->n;
    }
    int rc = 0;
    for (int i = 0; i < reps && !rc; i++) rc = mdk_gemm_rows(w, 0, w->n, qp, nt, yp, NULL, NULL);
    mdk_raw_free(mem);
    return rc;
}
