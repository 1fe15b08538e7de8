/* K-quant weights (Q4_K, Q5_K, Q6_K: super-blocks of 256) in the kernel's tiles, their
 * dequantisation, and their dot products with int8 activations; and the generic mdk_wq_* entry
 * points of every GGUF block format, which send the 32-weight formats to qblock.c.
 * (The K-quant half is being written.) */
#include "mdk.h"

#include <string.h>

static size_t kq_bytes(int fmt, int n, int k) { (void)fmt; (void)n; (void)k; return 0; }
static int kq_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *t) { (void)fmt; (void)raw; (void)n; (void)k; (void)t; return -1; }
static int kq_unpack(int fmt, const uint8_t *t, int n, int k, uint8_t *raw) { (void)fmt; (void)t; (void)n; (void)k; (void)raw; return -1; }
static void kq_dequantize(int fmt, const uint8_t *t, int n, int k, int r0, int r1, float *out) {
    (void)fmt; (void)t; (void)n; (void)k; (void)r0; (void)r1; (void)out;
}
static void kq_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    (void)w; (void)a; memset(y, 0, sizeof(float) * (size_t)(r1 - r0));
}

MDK_API size_t mdk_wq_bytes(int fmt, int n, int k) {
    if (MDK_IS_QB(fmt)) return mdk_qb_bytes(fmt, n, k);
    if (MDK_IS_KQ(fmt)) return kq_bytes(fmt, n, k);
    return 0;
}

MDK_API int mdk_wq_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *tiles) {
    if (MDK_IS_QB(fmt)) return mdk_qb_pack(fmt, raw, n, k, tiles);
    if (MDK_IS_KQ(fmt)) return kq_pack(fmt, raw, n, k, tiles);
    return -1;
}

MDK_API int mdk_wq_unpack(int fmt, const uint8_t *tiles, int n, int k, uint8_t *raw) {
    if (MDK_IS_QB(fmt)) return mdk_qb_unpack(fmt, tiles, n, k, raw);
    if (MDK_IS_KQ(fmt)) return kq_unpack(fmt, tiles, n, k, raw);
    return -1;
}

MDK_API void mdk_wq_dequantize(int fmt, const uint8_t *tiles, int n, int k, int r0, int r1, float *out) {
    if (MDK_IS_QB(fmt)) mdk_qb_dequantize(fmt, tiles, n, k, r0, r1, out);
    else if (MDK_IS_KQ(fmt)) kq_dequantize(fmt, tiles, n, k, r0, r1, out);
}

void mdk_wq_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    if (MDK_IS_Q4(w->fmt)) mdk_q4_rows(w, r0, r1, a, y);
    else if (MDK_IS_QB(w->fmt)) mdk_qb_rows(w, r0, r1, a, y);
    else kq_rows(w, r0, r1, a, y);
}

void mdk_wq_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (MDK_IS_Q4(w->fmt)) mdk_q4_rows_multi(w, r0, r1, a, nt, y);
    else if (MDK_IS_QB(w->fmt)) mdk_qb_rows_multi(w, r0, r1, a, nt, y);
    else for (int t = 0; t < nt; t++) kq_rows(w, r0, r1, a[t], y[t]);
}
