/* Quantisers to GGUF's Q4_K, Q5_K, Q6_K and Q8_0 blocks, from fp32/fp16/bf16 rows. (Being written.) */
#include "mdk.h"
