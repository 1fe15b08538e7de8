/* The "codes" formats (codes.c: GGUF's below-4-bit K-quants, the i-quants and the ternary types), on
 * the file's own rows: what kraw.c, kraw_x86.c and gemm.c ask of them. Internal. */
#ifndef MDK_CODES_H
#define MDK_CODES_H

#include "mdk.h"

typedef struct {
    int qk, bs, gs, off;  /* weights a block, bytes a block, weights a scale group, the codes' offset */
    float mul;            /* weight = D * ((u - off) * mul) (Q2_K: D * u - M) */
} mdk_codes_info;

const mdk_codes_info *mdk_codes_info_of(int fmt);  /* NULL for another format */

/* one block: u [qk] codes, D and M [qk / gs] (M: Q2_K's minimum, else untouched) */
void mdk_codes_block(int fmt, const uint8_t *b, uint8_t *u, float *D, float *M);
/* D, M -> the product's A and B per group: y += A dx sum(u x) + B sx */
void mdk_codes_terms(int fmt, const float *D, const float *M, float *A, float *B);
void mdk_codes_dequantize_row(int fmt, const uint8_t *row, int k, float *out);
void mdk_codes_row(int fmt, const uint8_t *row, int k, const mdk_q8 *const *a, int nt, float *y);

#if MDK_X86
/* codes_x86.c (AVX-512): rows r0..r1-1 against nt (1..4) tokens, 0 where it does not take them; and one
 * unit of 256 weights' codes and group terms for gemm.c (0: not on this path; else the groups) */
int mdk_codes_x86(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
int mdk_codes_unit(int fmt, const uint8_t *row, int un, uint8_t *u, float *A, float *B);
/* codes_avx2.c: the same rows on the AVX2 path */
int mdk_codes_avx2(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
#endif

#endif
