/* The machine's arithmetic peak, measured: back-to-back independent multiply-adds on every thread, for
 * the benchmarks' "fraction of peak" (benchmarks/prefill.py). kind 0: int8 vpdpbusd (VNNI; 128 ops an
 * instruction: 64 products and their sums), 1: fp32 FMA (32 ops), 2: bf16 vdpbf16ps (64 ops). Returns
 * the ops done, iters a task, 16 tasks a thread (the caller times the call), 0 where the CPU lacks the instruction. */
#include "mdk.h"

#if MDK_X86
#include <immintrin.h>

typedef struct { int kind; long iters; } pk_ctx;

#define ACC 12

MDK_TARGET("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,fma")
static void peak_task(void *arg, int t) {
    const pk_ctx *c = arg;
    (void)t;
    __m512 f[ACC];
    __m512i a[ACC];
    for (int i = 0; i < ACC; i++) { f[i] = _mm512_set1_ps((float)i); a[i] = _mm512_set1_epi32(i); }
    __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (long n = 0; n < c->iters; n++) {
        for (int i = 0; i < ACC; i++) {
            if (c->kind == 0) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
            else if (c->kind == 1) f[i] = _mm512_fmadd_ps(f[i], x, y);
            else f[i] = _mm512_dpbf16_ps(f[i], (__m512bh)_mm512_castps_si512(x), (__m512bh)_mm512_castps_si512(y));
        }
        __asm__ volatile("" : "+v"(u));  /* keep the loop from being folded */
    }
    __m512 sum = f[0];
    __m512i isum = a[0];
    for (int i = 1; i < ACC; i++) { sum = _mm512_add_ps(sum, f[i]); isum = _mm512_add_epi32(isum, a[i]); }
    volatile float sink = _mm512_reduce_add_ps(sum) + (float)_mm512_reduce_add_epi32(isum);
    (void)sink;
}
#endif

MDK_API double mdk_peak(int kind, long iters, int nthreads) {
#if MDK_X86
    if (mdk_path != MDK_PATH_AVX512 || (kind == 2 && !mdk_has_bf16) || kind < 0 || kind > 2) return 0.0;
    int tasks = 16 * (nthreads > 0 ? nthreads : 1);  /* many tasks: no thread idles if one starts late */
    pk_ctx c = {kind, iters};
    mdk_parallel(tasks, peak_task, &c, nthreads);
    static const int ops[3] = {128, 32, 64};
    return (double)iters * ACC * ops[kind] * tasks;
#else
    (void)kind; (void)iters; (void)nthreads;
    return 0.0;
#endif
}
