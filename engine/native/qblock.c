/* GGUF's 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) in the kernel's tiles, their
 * dequantisation, and their dot products with int8 activations. (Being written.) */
#include "mdk.h"

#include <string.h>

size_t mdk_qb_bytes(int fmt, int n, int k) { (void)fmt; (void)n; (void)k; return 0; }
int mdk_qb_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *t) { (void)fmt; (void)raw; (void)n; (void)k; (void)t; return -1; }
int mdk_qb_unpack(int fmt, const uint8_t *t, int n, int k, uint8_t *raw) { (void)fmt; (void)t; (void)n; (void)k; (void)raw; return -1; }
void mdk_qb_dequantize(int fmt, const uint8_t *t, int n, int k, int r0, int r1, float *out) {
    (void)fmt; (void)t; (void)n; (void)k; (void)r0; (void)r1; (void)out;
}
void mdk_qb_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    (void)w; (void)a; memset(y, 0, sizeof(float) * (size_t)(r1 - r0));
}
void mdk_qb_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    for (int t = 0; t < nt; t++) mdk_qb_rows(w, r0, r1, a[t], y[t]);
}
