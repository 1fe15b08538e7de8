/* What kquant.c and its x86 dot products (kquant_x86.c) share: the tile layout of each K-quant
 * format (kquant.c's opening comment), the scalar scale decoder, and the SIMD kernels. Internal. */
#ifndef MDK_KQUANT_H
#define MDK_KQUANT_H

#include "mdk.h"

typedef struct { int raw, tile, sub, qoff, doff, moff, soff; } kq_layout;  /* bytes: raw block, tile, one
                                                                              sub-block's bits; offsets */
static const kq_layout KQ[3] = {
    {144, 2304, 256, 0, 2048, 2080, 2112},  /* Q4_K */
    {176, 2816, 320, 0, 2560, 2592, 2624},  /* Q5_K */
    {210, 3360, 384, 256, 3328, 0, 0},      /* Q6_K */
};
#define LAY(fmt) (&KQ[(fmt) - MDK_Q4K])

/* Row r's scale and minimum of sub-block j from a Q4_K/Q5_K tile's S0, S1, S2 */
static inline void scale_min(const uint8_t *S, int r, int j, int *sc, int *mn) {
    int jj = j & 3, hi = j >> 2, s0 = S[16 * jj + r], s1 = S[64 + 16 * jj + r], s2 = S[128 + 16 * jj + r];
    *sc = ((s0 >> (4 * hi)) & 15) | ((s2 >> (2 * hi)) & 3) << 4;
    *mn = ((s1 >> (4 * hi)) & 15) | ((s2 >> (4 + 2 * hi)) & 3) << 4;
}

#if MDK_X86
/* 16 rows (one row tile, nsb super-blocks) against nt tokens: y[t][16] */
typedef void (*mdk_kq512_fn)(const uint8_t *tile, int nsb, const mdk_q8 *const *a, float *const *y);
extern const mdk_kq512_fn mdk_kq512[3][4];  /* AVX-512 VNNI, [fmt - MDK_Q4K][nt - 1] */
void mdk_kq_rows_avx2(int fmt, const uint8_t *tile, int nsb, const mdk_q8 *a, float *y);  /* one token */
#endif

#endif
