/* What kraw.c (portable) and kraw_x86.c (AVX-512 VNNI, AVX2) share: the raw block sizes, where a
 * row of a raw matrix lives (one place, or gate's rows in one and up's in another), the per-thread
 * buffer the SIMD kernels prepare each token's activation in, and the SIMD entry point. Internal. */
#ifndef MDK_KRAW_H
#define MDK_KRAW_H

#include "mdk.h"

#include "codes.h"

static inline int kraw_qk(int fmt) {  /* weights a block */
    return MDK_IS_CODES(fmt) ? mdk_codes_info_of(fmt)->qk : MDK_IS_KQ(fmt) ? 256 : 32;
}

static inline int kraw_bsize(int fmt) {  /* bytes a ggml block */
    if (MDK_IS_CODES(fmt)) return mdk_codes_info_of(fmt)->bs;
    switch (fmt) {
    case MDK_Q4K: return 144;
    case MDK_Q5K: return 176;
    case MDK_Q6K: return 210;
    case MDK_Q8_0: return 34;
    case MDK_Q4_0: return 18;
    case MDK_Q4_1: return 20;
    case MDK_Q5_0: return 22;
    case MDK_Q5_1: return 24;
    default: return 0;
    }
}

/* a little-endian 16-bit field (an fp16 scale) of a block, at any alignment */
static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline size_t kraw_row_bytes(int fmt, int k) { return (size_t)(k / kraw_qk(fmt)) * (size_t)kraw_bsize(fmt); }

/* row r of a raw matrix: w + r * rb, or w_hi + (r - n_lo) * rb for r >= n_lo when w_hi is set */
static inline const uint8_t *kraw_row(const mdk_matrix *w, int r, size_t rb) {
    if (w->w_hi && r >= w->n_lo) return (const uint8_t *)w->w_hi + (size_t)(r - w->n_lo) * rb;
    return (const uint8_t *)w->w + (size_t)r * rb;
}

#if defined(_MSC_VER)
#define MDK_TLS __declspec(thread)
#else
#define MDK_TLS _Thread_local
#endif

void *mdk_raw_alloc(size_t bytes);  /* 64-byte aligned, or NULL */
void mdk_raw_free(void *p);

/* kraw.c's portable terms of blocks b0..b1-1 of one row of a 32-weight format against one token */
float mdk_raw_blocks_dot(int fmt, const uint8_t *row, int b0, int b1, const mdk_q8 *a);

#if MDK_X86
/* rows r0..r1-1 against nt (1..4) tokens on the active SIMD path; 0 when that path has no kernel for
 * w->fmt (or the buffer failed): the caller then runs the portable one */
int mdk_raw_x86(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
/* this thread's copy of a token's int8 values in a kernel's order (kraw_x86.c prep), kept under its
 * mdk_q8.gen; NULL if the buffer failed. MDK_PREP_K23: codes_avx2.c's Q2_K / Q3_K order (each 128
 * values' 4 chunks of 32 with their dwords transposed in each 128-bit half) */
#define MDK_PREP_K23 3
const uint8_t *mdk_prepared_act(int kind, const mdk_q8 *a, int k);

/* Software prefetch. A group reads its rows' blocks in turn: 4 (AVX2: 2) streams a row apart, each
 * block's fields not in address order (Q6_K: ql, qh, scales, d); the hardware prefetchers fell behind
 * on it (Q6_K [2048, 768] from RAM: 11 GB/s against the tiles' 36, one thread). So each block step
 * prefetches the next slice, in address order, of the rows a later group reads (PF_ROWS on: their
 * bytes are contiguous, or nearly: a seam between two parts only wastes a few prefetches). Spread
 * over the steps and in address order measured better than each row's block a few rows on (Qwen3's
 * gate+up at T = 1, 2 threads: 0.97-1.12 x the tiles against 0.93-0.95) or all of it at once. */
#if defined(__GNUC__) || defined(__clang__)  /* (GCC 12 -std=c11 dropped _mm_prefetch here: no prefetch in the object) */
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#include <immintrin.h>
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#endif
#define PF_ROWS 8  /* rows ahead (AVX-512: 2 groups; 12 and 16 measured no better) */

typedef struct { const uint8_t *base; size_t step, span; } pf_plan;  /* base NULL: none */

static inline void pf_slice(const pf_plan *pf, int s) {  /* slice s of the region: [s step, (s + 1) step) */
    if (!pf->base) return;
    size_t o = (size_t)s * pf->step, end = o + pf->step < pf->span ? o + pf->step : pf->span;
    for (; o < end; o += 64) PREFETCH(pf->base + o);
}

#define SEL0(i) (int)(0x80808000u | (unsigned)(i))  /* pshufb: byte i to byte 0 of the lane, zeros above */
#define SEL3(i) (int)((unsigned)(i) << 24 | 0x808080u)  /* byte i to byte 3 of the lane, zeros below */

/* 4 (AVX2: 2) rows against nt tokens: y[t][row] */
typedef void (*kraw_rows_fn)(const uint8_t *const *rows, int nb, const uint8_t *const *act, const pf_plan *pf, float (*y)[4]);

/* kraw_narrow.c: AVX2 kernels in 128-bit vectors for CPUs that split each 256-bit operation in two
 * (mdk_narrow), [nt - 1]; 2 rows a call, the activations prepared as for the 256-bit kernels (K6) */
extern const kraw_rows_fn mdk_q6k_narrow[4];
#endif

#endif
