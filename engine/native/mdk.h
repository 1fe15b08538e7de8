/* Mixdesk's CPU expert kernels: shared declarations.
 *
 * Shapes: a weight matrix is W [N, K] (out, in), row-major; x [T, K]; y = x @ W.T [T, N].
 * Formats of one matrix:
 *   MDK_Q4   4-bit, blocks of 32 along K with an fp16 scale d and an fp16 minimum m per block:
 *            w = q * d + m, q in 0..15, in tiles of 16 rows (see quant4.c); d and m unused.
 *   MDK_MX4  MXFP4 (GPT-OSS's released experts) in the same tiles: each nibble is an E2M1 code,
 *            read through a table as q = 2 * value + 12 (0..24), with d = 2^(e - 128), m = -12 d
 *            for the block's E8M0 exponent e: the released weights exactly (quant4.c).
 *   MDK_F16, MDK_BF16, MDK_F32   plain row-major weights.
 * Activations and outputs are fp32, fp16 or bf16 (MDK_F32 / MDK_F16 / MDK_BF16 codes).
 *
 * One binary serves every x86-64 CPU: each kernel exists for AVX-512 (VNNI, BF16), AVX2 (FMA,
 * F16C) and portable C, and the path is chosen at run time from CPUID (cpu.c).
 */
#ifndef MDK_H
#define MDK_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MDK_API __declspec(dllexport)
#else
#define MDK_API __attribute__((visibility("default")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MDK_TARGET(s) __attribute__((target(s)))
#else /* MSVC compiles intrinsics without per-function target flags */
#define MDK_TARGET(s)
#endif

#if defined(_MSC_VER)
#define MDK_INLINE __forceinline
#else
#define MDK_INLINE inline __attribute__((always_inline))
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define MDK_X86 1
#else
#define MDK_X86 0
#endif

enum { MDK_F32 = 0, MDK_F16 = 1, MDK_BF16 = 2, MDK_Q4 = 3, MDK_MX4 = 4,
       /* GGUF's block formats, each repacked into tiles of its own (kquant.c: 256-weight super-blocks;
        * qblock.c: 32-weight blocks). Their values are exactly gguf.quants.dequantize's. */
       MDK_Q4K = 5, MDK_Q5K = 6, MDK_Q6K = 7,
       MDK_Q8_0 = 8, MDK_Q4_0 = 9, MDK_Q4_1 = 10, MDK_Q5_0 = 11, MDK_Q5_1 = 12,
       /* a KV cache's 8-bit rows (engine/kv/int8.py): Hd int8 codes, then Hd/32 fp16 scales (one a block of 32) */
       MDK_KV8 = 13,
       /* GGUF's formats read as codes and group scales (codes.c), on the file's own rows only */
       MDK_Q2K = 14, MDK_Q3K = 15, MDK_IQ4NL = 16, MDK_IQ4XS = 17, MDK_IQ2XXS = 18, MDK_IQ2XS = 19,
       MDK_IQ2S = 20, MDK_IQ3XXS = 21, MDK_IQ3S = 22, MDK_IQ1S = 23, MDK_IQ1M = 24, MDK_TQ1_0 = 25,
       MDK_TQ2_0 = 26, MDK_NVFP4 = 27 };
#define MDK_CODES_N 14
#define MDK_IS_CODES(fmt) ((fmt) >= MDK_Q2K && (fmt) <= MDK_NVFP4)  /* codes.c */
#define MDK_IS_Q4(fmt) ((fmt) == MDK_Q4 || (fmt) == MDK_MX4)  /* both use the Q4 tiles and dot products */
#define MDK_IS_KQ(fmt) ((fmt) >= MDK_Q4K && (fmt) <= MDK_Q6K)      /* kquant.c */
#define MDK_IS_QB(fmt) ((fmt) >= MDK_Q8_0 && (fmt) <= MDK_Q5_1)    /* qblock.c */
#define MDK_IS_INT(fmt) (MDK_IS_Q4(fmt) || MDK_IS_KQ(fmt) || MDK_IS_QB(fmt) || MDK_IS_CODES(fmt))  /* int8 activations */
enum { MDK_PATH_C = 0, MDK_PATH_AVX2 = 1, MDK_PATH_AVX512 = 2 };

typedef struct {
    int fmt;          /* MDK_Q4 / MDK_F16 / MDK_BF16 / MDK_F32 */
    int n, k;         /* rows (out features), columns (in features) */
    const void *w;    /* weights; for MDK_Q4 the packed nibbles [n, k/2] */
    const uint16_t *d, *m;  /* MDK_Q4 only: fp16 scale and minimum [n, k/32] */
    int raw;          /* GGUF block formats: 0 the kernel's tiles (kquant.c, qblock.c); 1 the file's own
                         rows: n rows of k / block ggml blocks, row-major (kraw.c), e.g. a mapped file */
    const void *w_hi; /* raw only, or NULL: rows r >= n_lo are at w_hi + (r - n_lo) * row bytes, not at
                         w + r * row bytes (an expert's w13: gate's rows and up's, two places in a file) */
    int n_lo;
} mdk_matrix;

enum { MDK_ACT_SILU = 0, MDK_ACT_SWIGLU_OAI = 1, MDK_ACT_GELU_TANH = 2 };

typedef struct {
    mdk_matrix w13;   /* [2I, D]: gate rows then up rows */
    mdk_matrix w2;    /* [D, I] */
    const float *b13; /* [2I] bias added to gate and up, or NULL (GPT-OSS) */
    const float *b2;  /* [D] bias added to down's output before the route weight, or NULL */
    int act;          /* MDK_ACT_SILU: silu(gate) * up; MDK_ACT_GELU_TANH: gelu_tanh(gate) * up (Gemma);
                         MDK_ACT_SWIGLU_OAI: g = min(gate, limit),
                         (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) */
    float alpha, limit;
} mdk_expert;

/* ---- cpu.c: features, path, thread pool ---- */
extern int mdk_path;      /* the active path (MDK_PATH_*) */
extern int mdk_has_bf16;  /* AVX512-BF16 present (and the AVX-512 path active) */
extern int mdk_has_amx;   /* AMX tiles (bf16 and int8) usable, allowed, and the AVX-512 path active */
extern int mdk_narrow;    /* the AVX2 path runs its 128-bit kernels where it has them (kraw_narrow.c) */
/* flash_amx.c: a prompt's attention over a bf16 cache in AMX tiles (flash.c calls it; -1: not here) */
int mdk_flash_amx(const float *q, long qs, int H, int G, int Hd, int n, int q0, int window, float scale,
                  const uint16_t *k, const uint16_t *v, long gs, long ks, float *out, long os, int nthreads);
typedef void (*mdk_task_fn)(void *ctx, int task);
void mdk_parallel(int ntasks, mdk_task_fn fn, void *ctx, int nthreads);
void *mdk_scratch(int slot, size_t bytes);  /* per-slot growing buffer, 64-byte aligned */

/* ---- convert.c: scalar conversions ---- */
float mdk_h2f(uint16_t h);
uint16_t mdk_f2h(float f);
static inline float mdk_bf2f(uint16_t b) { union { uint32_t u; float f; } v; v.u = (uint32_t)b << 16; return v.f; }
static inline uint16_t mdk_f2bf(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    v.u += 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)(v.u >> 16);
}
void mdk_load_row(int fmt, const void *src, float *dst, int n);   /* any activation fmt -> fp32 */
void mdk_store_row(int fmt, const float *src, void *dst, int n);  /* fp32 -> activation fmt */
static inline float mdk_round_to(int fmt, float v) {               /* v as stored in fmt, back in fp32 */
    if (fmt == MDK_BF16) return mdk_bf2f(mdk_f2bf(v));
    if (fmt == MDK_F16) return mdk_h2f(mdk_f2h(v));
    return v;
}

/* ---- quant4.c ---- */
typedef struct {          /* one token's activation, quantised for the int8 dot products (MDK_IS_INT) */
    int8_t *q;            /* [k] int8, in the kernel's element order */
    float *dx;            /* [k/32] scale per natural block */
    float *sx;            /* [k/32] dx * sum(q) of the block (for the minimum term) */
    int16_t *s16;         /* [k/16] sum(q) of each half block (Q6_K's sub-blocks of 16: its -32 offset term) */
    float *sxh;           /* [k/16] dx * s16 (gemm.c: the offset term of formats with scales per 16) */
    unsigned long long gen;  /* this quantisation's number, unique in the process (mdk_q8_init and
                                mdk_quantize_act set a new one; mdk_quantize_act_range, which tasks run on
                                parts of one activation at once, does not: init before it). kraw_x86.c keeps
                                each thread's copies of a token in its kernels' order under it */
} mdk_q8;
size_t mdk_q8_bytes(int k);
void mdk_q8_init(mdk_q8 *a, void *mem, int k);
void mdk_quantize_act(const float *x, int k, mdk_q8 *out);
void mdk_quantize_act_range(const float *x, int k, int e0, int e1, mdk_q8 *a);
void mdk_q4_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y);  /* y[r - r0], r0 % 16 == 0 */
void mdk_q4_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);

MDK_API void mdk_q4_dequantize_fmt(const uint8_t *packed, int fmt, int n, int k, float *out);

/* ---- kquant.c (Q4_K, Q5_K, Q6_K) and qblock.c (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) ----
 * raw: GGUF's own rows, n rows of (k / block) blocks in ggml's block structs, as the file holds them;
 * multiplied in place where mdk_matrix.raw is set (kraw.c: no copy, e.g. a read-only mapped file).
 * tiles: the kernel's layout, built from raw at load ("repack"); the same bytes a weight as raw
 * (bytes_for(fmt, n, k) == n * raw row bytes) unless a comment in the file says otherwise and why.
 * The generic entry points (kquant.c) dispatch on fmt to the qblock.c functions of the same shape. */
MDK_API size_t mdk_wq_bytes(int fmt, int n, int k);                        /* bytes of the tiles */
MDK_API int mdk_wq_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *tiles);    /* 0, or -1: bad shape */
MDK_API int mdk_wq_unpack(int fmt, const uint8_t *tiles, int n, int k, uint8_t *raw);  /* the inverse */
MDK_API void mdk_wq_dequantize(int fmt, const uint8_t *tiles, int n, int k, int r0, int r1, float *out); /* rows r0..r1-1 */
void mdk_wq_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y);  /* as mdk_q4_rows, any MDK_IS_INT fmt */
void mdk_wq_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
/* kraw.c, kraw_x86.c: the same products and values on raw rows (w->raw = 1), any row range */
void mdk_raw_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
MDK_API void mdk_raw_dequantize(const mdk_matrix *w, int r0, int r1, float *out);  /* rows r0..r1-1 [r1-r0, k] */
size_t mdk_qb_bytes(int fmt, int n, int k);                                /* qblock.c, for MDK_IS_QB */
int mdk_qb_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *tiles);
int mdk_qb_unpack(int fmt, const uint8_t *tiles, int n, int k, uint8_t *raw);
void mdk_qb_dequantize(int fmt, const uint8_t *tiles, int n, int k, int r0, int r1, float *out);
void mdk_qb_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y);
void mdk_qb_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y);
int mdk_block_low(int fmt, const float *x, uint8_t *y);  /* kquantize_low.c: one Q3_K / Q2_K super-block */
/* kquantize.c: fp32/fp16/bf16 rows [n, k] (src_fmt) -> raw GGUF blocks of fmt (any MDK_IS_KQ/QB);
 * llama.cpp-style scale searches, deterministic and independent of nthreads. 0, or -1: bad shape. */
MDK_API int mdk_quantize_blocks(int fmt, const void *src, int src_fmt, int n, int k, uint8_t *raw, int nthreads);

/* ---- gemm.c: many tokens times raw rows (a prompt's products; AVX-512 VNNI) ---- */
extern int mdk_gemm_min;  /* tokens from which a call takes it */
int mdk_gemm_ok(const mdk_matrix *w);
int mdk_gemm_ptrs(int n, const mdk_q8 ***a, float ***y);  /* this thread's pointer arrays of n */
int mdk_gemm_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y,
                  const float *wts, const float *bias);

/* ---- dense.c ---- */
void mdk_dense_rows(const mdk_matrix *w, int r0, int r1, const float *x, const uint16_t *xbf, float *y);
void mdk_dense_rows_multi(const mdk_matrix *w, int r0, int r1, const float *const *x, const uint16_t *const *xbf,
                          int nt, float *const *y);

/* ---- attention.c ---- */
typedef struct { int Hd, ctx, fmt; } mdk_kv;  /* head dim, positions a cache holds, its format (MDK_F32/BF16/F16/KV8) */
static inline size_t mdk_kv_row_bytes(int fmt, int Hd) {  /* bytes of one cached row of Hd values */
    return fmt == MDK_KV8 ? (size_t)Hd + (size_t)Hd / 16 : (size_t)Hd * (fmt == MDK_F32 ? 4 : 2);
}
void mdk_kv_store(int fmt, const float *src, void *dst, int Hd);  /* one row into the cache, rounded to its format */
void mdk_attend(const mdk_kv *kv, const float *q, const char *kb, const char *vb, int first, int last, int h0,
                int hpg, float *scores, float *att);  /* q, scores, att: the token's [H, Hd], [H, ctx], [H, Hd] */

#endif
