/* Quantisers to GGUF's blocks (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) from fp32/fp16/bf16
 * rows, with llama.cpp-style scale searches. (Being written.) */
#include "mdk.h"

MDK_API int mdk_quantize_blocks(int fmt, const void *src, int src_fmt, int n, int k, uint8_t *raw, int nthreads) {
    (void)fmt; (void)src; (void)src_fmt; (void)n; (void)k; (void)raw; (void)nthreads;
    return -1;
}
