/* CPU features, the active code path, a small thread pool and scratch buffers.
 *
 * Why a pool of our own and not OpenMP: torch ships its own OpenMP runtime, and a second one in the
 * same process keeps its own spinning threads, which oversubscribes a 2-core machine. Our workers
 * spin only briefly after a call (a decode step calls us back within microseconds), then sleep, so
 * between calls torch's threads have the cores to themselves. Each call says how many threads it
 * may use (the engine passes torch's own thread count).
 */
#define _GNU_SOURCE
#include "mdk.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(_WIN32)
#include <intrin.h>
#include <windows.h>
#else
#include <pthread.h>
#endif
#if MDK_X86 && !defined(_WIN32)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if MDK_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

int mdk_path = MDK_PATH_C;
int mdk_has_bf16 = 0;
int mdk_has_amx = 0;
int mdk_narrow = 0;
static int detected_path = MDK_PATH_C, detected_bf16 = 0, detected_amx = 0, amx_allowed = 1, detected_split = 0;

#if MDK_X86
static void cpuid(int leaf, int sub, unsigned r[4]) {
#if defined(_WIN32)
    int v[4];
    __cpuidex(v, leaf, sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i];
#else
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#endif
}

static unsigned long long xgetbv0(void) {
#if defined(_WIN32)
    return _xgetbv(0);
#else
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
#endif
}
#endif

/* AMX's tile data is a large register state Linux hands out only on request (arch_prctl, kernel 5.16+):
 * asked once for the process, its threads included. Elsewhere (Windows, macOS, older kernels): no AMX. */
static int amx_permitted(void) {
#if MDK_X86 && defined(__linux__)
    const long get_perm = 0x1022, req_perm = 0x1023, xtiledata = 18;
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, req_perm, xtiledata) != 0) return 0;
    if (syscall(SYS_arch_prctl, get_perm, &bits) != 0) return 0;
    return (int)((bits >> xtiledata) & 1);
#else
    return 0;
#endif
}

static void detect(void) {
#if MDK_X86
    unsigned r[4], r7[4], r71[4];
    cpuid(0, 0, r);
    unsigned maxleaf = r[0];
    int amd = r[1] == 0x68747541u && r[3] == 0x69746e65u && r[2] == 0x444d4163u;  /* "AuthenticAMD" */
    cpuid(1, 0, r);
    unsigned fam = (r[0] >> 8) & 0xf, model = (r[0] >> 4) & 0xf;
    if (fam == 0xf) fam += (r[0] >> 20) & 0xff, model |= ((r[0] >> 16) & 0xf) << 4;
    /* Zen 1 and Zen+ (family 17h, models below 30h) run each 256-bit operation as two 128-bit ones and
     * lane-crossing permutes as several: kraw_narrow.c's 128-bit kernels measured faster there */
    detected_split = amd && fam == 0x17 && model < 0x30;
    int osxsave = (r[2] >> 27) & 1, fma = (r[2] >> 12) & 1, f16c = (r[2] >> 29) & 1, avx = (r[2] >> 28) & 1;
    if (!osxsave || !avx || maxleaf < 7) return;
    unsigned long long xcr0 = xgetbv0();
    int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6;
    cpuid(7, 0, r7);
    cpuid(7, 1, r71);
    int avx2 = (r7[1] >> 5) & 1;
    int avx512f = (r7[1] >> 16) & 1, avx512bw = (r7[1] >> 30) & 1, avx512vl = (r7[1] >> 31) & 1;
    int vnni = (r7[2] >> 11) & 1, bf16 = (r71[0] >> 5) & 1;
    if (os_avx && avx2 && fma && f16c) detected_path = MDK_PATH_AVX2;
    if (os_avx512 && avx512f && avx512bw && avx512vl && vnni && detected_path == MDK_PATH_AVX2) {
        detected_path = MDK_PATH_AVX512;
        detected_bf16 = bf16;
    }
    /* AMX (Intel Xeon since Sapphire Rapids): tiles, bf16 and int8 products; the OS must save the tile
     * state (XCR0 bits 17-18) and grant it to this process */
    int amx_tile = (r7[3] >> 24) & 1, amx_bf16 = (r7[3] >> 22) & 1, amx_int8 = (r7[3] >> 25) & 1;
    if (detected_path == MDK_PATH_AVX512 && detected_bf16 && amx_tile && amx_bf16 && amx_int8 &&
        ((xcr0 >> 17) & 3) == 3)
        detected_amx = amx_permitted();
#endif
}

/* Returns the active path; `want` < 0 keeps it, else asks for that path (capped at what the CPU has). */
MDK_API int mdk_select_path(int want) {
    static int done = 0;
    if (!done) {
        detect();
        done = 1;
        mdk_path = detected_path;
        mdk_has_bf16 = detected_bf16;
        mdk_narrow = detected_split;
    }
    if (want >= 0) {
        mdk_path = want < detected_path ? want : detected_path;
        mdk_has_bf16 = mdk_path == MDK_PATH_AVX512 && detected_bf16;
    }
    mdk_has_amx = mdk_path == MDK_PATH_AVX512 && detected_amx && amx_allowed;
    return mdk_path;
}

/* The AVX2 path's 128-bit kernels (kraw_narrow.c) in use (1) or not (0), where they exist: want 0 or 1
 * sets it (tests run both on any AVX2 CPU), < 0 asks; on by default where the CPU splits 256-bit
 * operations (detect). Read only on the AVX2 path. */
MDK_API int mdk_narrow_kernels(int want) {
    mdk_select_path(-1);
    if (want >= 0) mdk_narrow = want != 0;
    return mdk_narrow;
}

/* AMX tiles in use (1) or not (0); want 0 turns them off, 1 on where the CPU and OS have them (tests and
 * benchmarks compare both paths; MIXDESK_AMX=0 at load), < 0 asks. */
MDK_API int mdk_amx(int want) {
    mdk_select_path(-1);
    if (want >= 0) amx_allowed = want;
    mdk_has_amx = mdk_path == MDK_PATH_AVX512 && detected_amx && amx_allowed;
    return mdk_has_amx;
}

/* The layout of the structs Python fills (engine/native/__init__.py): a library built before a change
 * of them is refused as out of date. 2: mdk_expert gained biases and an activation (GPT-OSS); 3: mdk_layer and mdk_model q/k norms;
 * 4: mdk_model's kv_fmt (16-bit KV caches); 5: mdk_layer's qkv as up to three parts (any dense format);
 * 6: mdk_matrix's raw, w_hi, n_lo (GGUF blocks in the file's own rows, kraw.c). */
MDK_API int mdk_abi(void) { return 8; }  /* 8: MDK_KV8 caches in mdk_model.kv_fmt */

MDK_API int mdk_cpu_has_bf16(void) { return mdk_has_bf16; }

/* ---------------- thread pool ---------------- */
#define MAX_THREADS 256

#if defined(_WIN32)
typedef CRITICAL_SECTION mtx_t_;
typedef CONDITION_VARIABLE cnd_t_;
#define LOCK(m) EnterCriticalSection(m)
#define UNLOCK(m) LeaveCriticalSection(m)
#define WAIT(c, m) SleepConditionVariableCS(c, m, INFINITE)
#define BROADCAST(c) WakeAllConditionVariable(c)
#define RELAX() YieldProcessor()
#else
typedef pthread_mutex_t mtx_t_;
typedef pthread_cond_t cnd_t_;
#define LOCK(m) pthread_mutex_lock(m)
#define UNLOCK(m) pthread_mutex_unlock(m)
#define WAIT(c, m) pthread_cond_wait(c, m)
#define BROADCAST(c) pthread_cond_broadcast(c)
#if MDK_X86
#define RELAX() _mm_pause()
#else
#define RELAX() ((void)0)
#endif
#endif

static struct {
    mtx_t_ mu;
    cnd_t_ cv;
    int started;          /* workers created so far */
    atomic_uint gen;      /* bumped once per dispatch */
    atomic_int sleepers;  /* workers blocked on cv */
    atomic_int next;      /* next task index to take */
    atomic_int pending;   /* workers of this dispatch not yet done */
    int ntasks, nworkers; /* this dispatch */
    mdk_task_fn fn;
    void *ctx;
    double spin_s;        /* how long an idle worker spins before it sleeps */
} pool;

static unsigned start_gen[MAX_THREADS];

static double now_s(void) {
#if defined(_WIN32)
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
#endif
}

/* Denormal floats flushed to zero, on input and output (FTZ, DAZ): a Gated DeltaNet state decays
 * towards zero through the denormal range, and x86 takes a microcode assist on every denormal
 * operand (measured: a 512-token prompt's delta rule 30x slower in torch, the native step several
 * times). Values that small (< 1.2e-38) change no result a model gives. Set for good in the pool's own
 * threads, and in a caller of mdk_parallel only for the call (its thread may be the GUI's: Qt's own
 * float code must keep IEEE behaviour); torch's ops in the forward likewise (engine/model/forward.py). */
static unsigned flush_denormals(void) {
#if MDK_X86
    unsigned was = _mm_getcsr();
    _mm_setcsr(was | 0x8040);
    return was;
#else
    return 0;
#endif
}

static void restore_csr(unsigned was) {
#if MDK_X86
    _mm_setcsr(was);
#else
    (void)was;
#endif
}

static void run_tasks(void) {
    int i;
    while ((i = atomic_fetch_add(&pool.next, 1)) < pool.ntasks) pool.fn(pool.ctx, i);
}

#if defined(_WIN32)
static DWORD WINAPI worker(LPVOID arg)
#else
static void *worker(void *arg)
#endif
{
    int id = (int)(intptr_t)arg;  /* 1..started */
    unsigned seen = start_gen[id];  /* the generation before the dispatch that created it */
    flush_denormals();
    for (;;) {
        double t0 = now_s();
        int spins = 0;
        while (atomic_load(&pool.gen) == seen) {
            RELAX();
            if (++spins % 256 == 0 && now_s() - t0 > pool.spin_s) {
                LOCK(&pool.mu);
                atomic_fetch_add(&pool.sleepers, 1);
                while (atomic_load(&pool.gen) == seen) WAIT(&pool.cv, &pool.mu);
                atomic_fetch_sub(&pool.sleepers, 1);
                UNLOCK(&pool.mu);
            }
        }
        seen = atomic_load(&pool.gen);
        if (id < pool.nworkers + 1) {
            run_tasks();
            atomic_fetch_sub(&pool.pending, 1);
        }
    }
    return 0;
}

static void pool_grow(int want) {
    if (pool.started == 0) {
#if defined(_WIN32)
        InitializeCriticalSection(&pool.mu);
        InitializeConditionVariable(&pool.cv);
#else
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.cv, NULL);
#endif
        const char *s = getenv("MIXDESK_SPIN_US");
        pool.spin_s = (s ? atof(s) : 50.0) * 1e-6;
    }
    while (pool.started < want && pool.started < MAX_THREADS - 1) {
        intptr_t id = pool.started + 1;
        start_gen[id] = atomic_load(&pool.gen);
#if defined(_WIN32)
        HANDLE h = CreateThread(NULL, 0, worker, (LPVOID)id, 0, NULL);
        if (!h) break;
        CloseHandle(h);
#else
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &at, worker, (void *)id);
        pthread_attr_destroy(&at);
        if (rc) break;
#endif
        pool.started++;
    }
}

/* Runs fn(ctx, 0..ntasks-1) on up to nthreads threads (the caller is one of them) and returns
 * when all are done. Not re-entrant: the engine calls it from one thread at a time. */
void mdk_parallel(int ntasks, mdk_task_fn fn, void *ctx, int nthreads) {
    if (ntasks <= 0) return;
    unsigned csr = flush_denormals();
    int workers = nthreads - 1;
    if (workers > ntasks - 1) workers = ntasks - 1;
    if (workers > 0) pool_grow(workers);
    if (workers > pool.started) workers = pool.started;
    if (workers <= 0) {
        for (int i = 0; i < ntasks; i++) fn(ctx, i);
        restore_csr(csr);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.ntasks = ntasks;
    pool.nworkers = workers;
    atomic_store(&pool.next, 0);
    atomic_store(&pool.pending, workers);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        LOCK(&pool.mu);
        BROADCAST(&pool.cv);
        UNLOCK(&pool.mu);
    }
    run_tasks();
    while (atomic_load(&pool.pending) > 0) RELAX();
    restore_csr(csr);
}

MDK_API int mdk_pool_threads(void) { return pool.started + 1; }

/* ---------------- scratch ---------------- */
#define SLOTS 12
static void *scratch_mem[SLOTS];
static size_t scratch_size[SLOTS];

void *mdk_scratch(int slot, size_t bytes) {
    if (bytes > scratch_size[slot]) {
        size_t n = bytes + bytes / 4 + 4096;
#if defined(_WIN32)
        _aligned_free(scratch_mem[slot]);
        scratch_mem[slot] = _aligned_malloc(n, 64);
#else
        free(scratch_mem[slot]);
        if (posix_memalign(&scratch_mem[slot], 64, n)) scratch_mem[slot] = NULL;
#endif
        scratch_size[slot] = scratch_mem[slot] ? n : 0;
    }
    return scratch_mem[slot];
}

/* Python's extension-module build expects this symbol; the engine loads the library with ctypes. */
MDK_API void *PyInit__mdk(void) { return NULL; }
