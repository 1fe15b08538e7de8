/* A prompt's attention in AMX bf16 tiles (flash.c's method, Intel Xeon since Sapphire Rapids).
 *
 * The same online softmax as flash.c, for a bf16 cache: per kv group the keys are packed once a call
 * as the tiles read them (K: [S/16][Hd/2][16 keys][2] bf16, V: [S/32][Hd/16][16 key pairs][16 dims][2]),
 * each task's 128 query rows (the group's heads x a run of positions) rounded to bf16 (as a bf16 model's
 * queries are: 2^-9 relative each), and then for each block of 64 keys and each 16 rows:
 *   scores   4 tiles of 16 rows x 16 keys, tdpbf16ps over Hd in steps of 32 (fp32 sums)
 *   softmax  per row in AVX-512: running max, the row's output rescaled when it grows, the weights
 *            exp(s - max) rounded to bf16 (as flash.c's bf16 values path), their sum kept in fp32 lanes
 *   values   the 16 output rows loaded into 4 tiles at a time (64 dims), += weights . V, stored back
 * so no n-by-n scores exist, and each block's keys and values stay in cache while all 128 rows use them.
 * Equal to flash.c's bf16 path up to the queries' rounding and the order of the fp32 sums.
 */
#include "amx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if MDK_AMX
#include <immintrin.h>
#include "vexp.h"

#define KB 64     /* keys a block */
#define ROWS 128  /* query rows a task */
#define A512 "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"

typedef struct {
    const float *q;
    long qs;
    int H, G, R, Hd, n, q0, S, window, qb, g;
    float scale;
    const uint16_t *k, *v;
    long gs, ks;
    float *out;
    long os;
    uint16_t *kp, *vp;  /* the group's packed keys and values */
} ax_ctx;

/* key block b (64 keys) of group c->g into kp and vp; keys past S are zeros */
static void pack_task(void *arg, int b) {
    const ax_ctx *c = arg;
    int Hd = c->Hd;
    long base = (long)c->g * c->gs;
    for (int j = 0; j < KB; j++) {
        int key = b * KB + j;
        const uint16_t *kr = c->k + base + (long)key * c->ks, *vr = c->v + base + (long)key * c->ks;
        uint16_t *kd = c->kp + ((long)(key >> 4) * (Hd / 2)) * 32 + (key & 15) * 2;
        uint16_t *vd = c->vp + ((long)(key >> 5) * (Hd / 16)) * 512 + ((key & 31) >> 1) * 32 + (key & 1);
        for (int d = 0; d < Hd; d++) {
            uint16_t kv = key < c->S ? kr[d] : 0, vv = key < c->S ? vr[d] : 0;
            kd[(d >> 1) * 32 + (d & 1)] = kv;
            vd[(d >> 4) * 512 + (d & 15) * 2] = vv;
        }
    }
}

/* One row's online softmax over one block of 64 keys (its keys lo..hi seen, block-relative): the
 * scores scaled, the running max m updated, the row's output o rescaled when it grows (and its sum lanes lv), the weights
 * into p as bf16 (zeros where unseen). */
MDK_TARGET(A512)
static void softmax64(const float *s, float scale, int lo, int hi, float *m, __m512 *lv, float *o, int Hd,
                      uint16_t *p) {
    if (lo < 0) lo = 0;
    if (hi > KB - 1) hi = KB - 1;
    if (hi < lo) {
        memset(p, 0, KB * 2);
        return;
    }
    uint64_t k = (~0ull >> (63 - hi)) & (~0ull << lo);
    __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale), v[4];
    for (int i = 0; i < 4; i++)
        v[i] = _mm512_mask_mov_ps(ninf, (__mmask16)(k >> (16 * i)), _mm512_mul_ps(_mm512_load_ps(s + 16 * i), sc));
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3])));
    if (mx > *m) {
        if (*m != -INFINITY) {
            __m512 a = _mm512_set1_ps(expf(*m - mx));
            for (int d = 0; d < Hd; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), a));
            *lv = _mm512_mul_ps(*lv, a);
        }
        *m = mx;
    }
    __m512 mv = _mm512_set1_ps(*m), e[4];
    for (int i = 0; i < 4; i++) e[i] = _mm512_maskz_mov_ps((__mmask16)(k >> (16 * i)), exp512(_mm512_sub_ps(v[i], mv)));
    *lv = _mm512_add_ps(*lv, _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3])));
    /* weights are finite and >= 0: round to nearest even, 32 at a time */
    _mm512_store_si512((void *)p, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
    _mm512_store_si512((void *)(p + 32), (__m512i)_mm512_cvtne2ps_pbh(e[3], e[2]));
}

MDK_TARGET(A512)
static void attend_task(void *arg, int t) {
    const ax_ctx *c = arg;
    int Hd = c->Hd, R = c->R;
    int i0 = t * c->qb, np = c->n - i0 < c->qb ? c->n - i0 : c->qb, nr = np * R, ng = (nr + 15) / 16;
    _Alignas(64) float o[ROWS * 256];
    _Alignas(64) uint16_t qb[ROWS * 256];
    _Alignas(64) float s[16 * KB];
    _Alignas(64) uint16_t pb[16 * KB];
    float m[ROWS];
    __m512 lv[ROWS];
    for (int r = 0; r < ng * 16; r++) {
        uint16_t *qd = qb + (long)r * Hd;
        if (r < nr) {
            const float *qr = c->q + (long)(i0 + r / R) * c->qs + (long)(c->g * R + r % R) * Hd;
            for (int d = 0; d < Hd; d += 32)
                _mm512_store_si512((void *)(qd + d), (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qr + d + 16),
                                                                                  _mm512_loadu_ps(qr + d)));
        } else {
            memset(qd, 0, (size_t)Hd * 2);
        }
        m[r] = -INFINITY;
        lv[r] = _mm512_setzero_ps();
        memset(o + (long)r * Hd, 0, sizeof(float) * Hd);
    }
    amx_config(16);
    int first_pos = c->q0 + i0, last_pos = c->q0 + i0 + np - 1;
    int kmin = c->window > 0 ? first_pos - c->window + 1 : 0;
    if (kmin < 0) kmin = 0;
    const long qstride = (long)Hd * 2, ostride = (long)Hd * 4;
    for (int b = kmin / KB; b * KB <= last_pos; b++) {
        int kb0 = b * KB;
        const uint16_t *kblk = c->kp + (long)b * 4 * (Hd / 2) * 32;  /* 4 chunks of 16 keys */
        const uint16_t *vblk = c->vp + (long)b * 2 * (Hd / 16) * 512;  /* 2 chunks of 32 keys */
        for (int g = 0; g < ng; g++) {
            int r0 = 16 * g;
            if (c->q0 + i0 + (r0 + 15 < nr ? r0 + 15 : nr - 1) / R < kb0) continue;  /* no row sees it yet */
            /* scores: tiles 0-3 the 4 chunks of 16 keys, tile 4 the rows' queries, 5 a chunk's keys */
            TZERO(0); TZERO(1); TZERO(2); TZERO(3);
            for (int d = 0; d < Hd; d += 32) {
                TLOAD(4, qb + (long)r0 * Hd + d, qstride);
                const uint16_t *kc = kblk + (long)(d / 2) * 32;
                TLOAD(5, kc, 64); TDP_BF16(0, 4, 5);
                TLOAD(6, kc + (long)(Hd / 2) * 32, 64); TDP_BF16(1, 4, 6);
                TLOAD(5, kc + (long)2 * (Hd / 2) * 32, 64); TDP_BF16(2, 4, 5);
                TLOAD(6, kc + (long)3 * (Hd / 2) * 32, 64); TDP_BF16(3, 4, 6);
            }
            TSTORE(0, s, KB * 4); TSTORE(1, s + 16, KB * 4); TSTORE(2, s + 32, KB * 4); TSTORE(3, s + 48, KB * 4);
            for (int i = 0; i < 16; i++) {
                int r = r0 + i;
                if (r >= nr) {
                    memset(pb + i * KB, 0, KB * 2);
                    continue;
                }
                int pos = c->q0 + i0 + r / R;
                int lo = (c->window > 0 ? pos - c->window + 1 : 0) - kb0, hi = pos - kb0;
                softmax64(s + i * KB, c->scale, lo, hi, m + r, lv + r, o + (long)r * Hd, Hd, pb + i * KB);
            }
            /* values: the rows' outputs, 64 dims (4 tiles) at a time, += weights (tile 4, 32 keys) . V */
            for (int h = 0; h < Hd; h += 64) {
                float *orow = o + (long)r0 * Hd + h;
                TLOAD(0, orow, ostride); TLOAD(1, orow + 16, ostride);
                TLOAD(2, orow + 32, ostride); TLOAD(3, orow + 48, ostride);
                for (int kc = 0; kc < 2; kc++) {
                    TLOAD(4, pb + kc * 32, KB * 2);
                    const uint16_t *vc = vblk + ((long)kc * (Hd / 16) + h / 16) * 512;
                    TLOAD(5, vc, 64); TDP_BF16(0, 4, 5);
                    TLOAD(6, vc + 512, 64); TDP_BF16(1, 4, 6);
                    TLOAD(5, vc + 1024, 64); TDP_BF16(2, 4, 5);
                    TLOAD(6, vc + 1536, 64); TDP_BF16(3, 4, 6);
                }
                TSTORE(0, orow, ostride); TSTORE(1, orow + 16, ostride);
                TSTORE(2, orow + 32, ostride); TSTORE(3, orow + 48, ostride);
            }
        }
    }
    TRELEASE();
    for (int r = 0; r < nr; r++) {
        int pi = r / R, h = c->g * R + r % R;
        float l = _mm512_reduce_add_ps(lv[r]);
        float *dst = c->out + (long)(i0 + pi) * c->os + (long)h * Hd;
        __m512 inv = _mm512_set1_ps(l > 0.f ? 1.f / l : 0.f);
        for (int d = 0; d < Hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_load_ps(o + (long)r * Hd + d), inv));
    }
}
#endif

static long amx_calls;  /* calls that ran here (tests see the path taken) */

MDK_API long mdk_flash_amx_calls(void) { return amx_calls; }

/* flash.c's call for a bf16 cache where AMX is in use: 0 when done, -1 not here (no AMX, or a head dim
 * not a multiple of 64), -3 no memory for the packed keys and values. */
int mdk_flash_amx(const float *q, long qs, int H, int G, int Hd, int n, int q0, int window, float scale,
                  const uint16_t *k, const uint16_t *v, long gs, long ks, float *out, long os, int nthreads) {
#if MDK_AMX
    if (!mdk_has_amx || Hd % 64 || Hd > 256 || H / G > ROWS) return -1;
    ax_ctx c = {.q = q, .qs = qs, .H = H, .G = G, .R = H / G, .Hd = Hd, .n = n, .q0 = q0, .S = q0 + n,
                .window = window, .scale = scale, .k = k, .v = v, .gs = gs, .ks = ks, .out = out, .os = os};
    c.qb = ROWS / c.R;
    int blocks = (c.S + KB - 1) / KB;
    size_t bytes = (size_t)blocks * KB * Hd * 2;  /* each of K and V; freed at the end of the call */
    void *kp = NULL, *vp = NULL;
    if (posix_memalign(&kp, 64, bytes) || posix_memalign(&vp, 64, bytes)) {
        free(kp);
        return -3;
    }
    c.kp = kp;
    c.vp = vp;
    int tasks = (n + c.qb - 1) / c.qb;
    for (int g = 0; g < G; g++) {
        c.g = g;
        mdk_parallel(blocks, pack_task, &c, nthreads);
        mdk_parallel(tasks, attend_task, &c, nthreads);
    }
    free(kp);
    free(vp);
    amx_calls++;
    return 0;
#else
    (void)q; (void)qs; (void)H; (void)G; (void)Hd; (void)n; (void)q0; (void)window; (void)scale; (void)k;
    (void)v; (void)gs; (void)ks; (void)out; (void)os; (void)nthreads;
    return -1;
#endif
}
