/* K-quant (Q4_K, Q5_K, Q6_K) and Q8_0 weights: GGUF blocks repacked into the kernel's tiles, their
 * dequantisation, and their dot products with int8 activations. (Being written.) */
#include "mdk.h"
