/* GGUF's 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) in the kernel's tiles, their
 * dequantisation, and their dot products with int8 activations. (Being written.) */
#include "mdk.h"
