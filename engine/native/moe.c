/* One call for a layer's CPU experts: (route ->) gate+up -> SiLU * up -> down -> weighted sum.
 *
 * Shapes: T tokens, D hidden, I ffn, S slots (token, expert) pairs, E experts, K top-k.
 * Two parallel phases over the pool, each split into row ranges so every thread streams its own
 * share of every selected expert's weights:
 *   1. h = w13 . x for a range of gate rows and the same range of up rows, then a = silu(gate) * up
 *      on that range, quantised per token for 4-bit experts (tasks: ranges of the I rows; inside,
 *      16 rows at a time for all the tokens of an expert, so a prefill reads each row from RAM once)
 *   2. out[T, D] = sum over slots of route weight * (w2 . a)   (tasks: ranges of the D rows, so no
 *      two threads write the same output element)
 */
#include "mdk.h"

#include <math.h>
#include <string.h>


#define SUB 16   /* rows per inner step: these stay in cache while every token of an expert uses them */

typedef struct {
    const mdk_expert *const *ex;  /* per job */
    const int32_t *offs;          /* [njobs+1] slot ranges per job */
    const int32_t *tok;           /* [S] token of each slot */
    const float *rw;              /* [S] route weight of each slot */
    int njobs, S, T, D, I;
    const float *xf;              /* [T, D] */
    const uint16_t *xbf;          /* [T, D] bf16 or NULL */
    mdk_q8 *xq;                   /* [T] or NULL */
    float *h, *act;               /* [S, 2I], [S, I] */
    uint16_t *actbf;              /* [S, I] or NULL */
    mdk_q8 *aq;                   /* [S] or NULL */
    float *out;                   /* [T, D] */
    int rows1, rows3;
} moe_ctx;

/* Whether n tokens of w go through gemm.c's kernel (many tokens, raw rows, AVX-512 VNNI) */
static int gemm_fits(const mdk_matrix *w, int n) {
    return mdk_gemm_min > 0 && n >= mdk_gemm_min && MDK_IS_INT(w->fmt) && mdk_gemm_ok(w);
}

static void rows_any(const mdk_matrix *w, int r0, int r1, const float *xf, const uint16_t *xbf, const mdk_q8 *xq,
                     float *y) {
    if (MDK_IS_INT(w->fmt)) mdk_wq_rows(w, r0, r1, xq, y);
    else mdk_dense_rows(w, r0, r1, xf, xbf, y);
}

/* Phase 1 for rows a..b-1 of the gate half and the same rows of the up half, for every slot, then
 * a = silu(gate) * up on those rows, quantised (4-bit w2) or rounded to bf16 (bf16 w2) there too:
 * a task owns whole 32-blocks of a, so no second pass or barrier is needed before phase 3. */
static void phase1(void *c, int t) {
    moe_ctx *m = (moe_ctx *)c;
    int I = m->I, a = t * m->rows1, b = a + m->rows1 < I ? a + m->rows1 : I;
    for (int j = 0; j < m->njobs; j++) {
        const mdk_matrix *w = &m->ex[j]->w13;
        int ns = m->offs[j + 1] - m->offs[j];
        const mdk_q8 **aa;
        float **yy;
        if (gemm_fits(w, ns) && !mdk_gemm_ptrs(ns, &aa, &yy)) {  /* a prompt: every slot against each panel */
            for (int half = 0; half < 2; half++) {
                for (int i = 0; i < ns; i++) {
                    int s = m->offs[j] + i;
                    aa[i] = &m->xq[m->tok[s]];
                    yy[i] = m->h + (size_t)s * 2 * I + half * I + a;
                }
                mdk_gemm_rows(w, half * I + a, half * I + b, aa, ns, yy, NULL, NULL);
            }
        } else
        for (int r = a; r < b; r += SUB) {
            int re = r + SUB < b ? r + SUB : b;
            for (int half = 0; half < 2; half++)
                for (int s = m->offs[j]; s < m->offs[j + 1];) {
                    int ns = m->offs[j + 1] - s < 4 ? m->offs[j + 1] - s : 4;
                    if (MDK_IS_INT(w->fmt) && ns > 1) {  /* up to 4 tokens per read of the rows */
                        const mdk_q8 *aa[4];
                        float *yy[4];
                        for (int t = 0; t < ns; t++) {
                            aa[t] = &m->xq[m->tok[s + t]];
                            yy[t] = m->h + (size_t)(s + t) * 2 * I + half * I + r;
                        }
                        mdk_wq_rows_multi(w, half * I + r, half * I + re, aa, ns, yy);
                        s += ns;
                        continue;
                    }
                    int tk = m->tok[s];
                    rows_any(w, half * I + r, half * I + re, m->xf + (size_t)tk * m->D,
                             m->xbf ? m->xbf + (size_t)tk * m->D : NULL, m->xq ? &m->xq[tk] : NULL,
                             m->h + (size_t)s * 2 * I + half * I + r);
                    s++;
                }
        }
        const mdk_expert *ex = m->ex[j];
        int fmt = ex->w2.fmt;
        for (int s = m->offs[j]; s < m->offs[j + 1]; s++) {
            const float *h = m->h + (size_t)s * 2 * I;
            float *act = m->act + (size_t)s * I;
            if (ex->act == MDK_ACT_SWIGLU_OAI) {
                const float *bg = ex->b13, *bu = ex->b13 ? ex->b13 + I : NULL;
                float lim = ex->limit, al = ex->alpha;
                for (int i = a; i < b; i++) {
                    float g = h[i] + (bg ? bg[i] : 0.f), u = h[I + i] + (bu ? bu[i] : 0.f);
                    g = fminf(g, lim);
                    u = fminf(fmaxf(u, -lim), lim);
                    act[i] = (u + 1.f) * (g / (1.f + expf(-al * g)));
                }
            } else if (ex->act == MDK_ACT_GELU_TANH) {  /* Gemma's GeGLU: gelu(gate, tanh approximation) * up */
                for (int i = a; i < b; i++) {
                    float g = h[i];
                    act[i] = 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * h[I + i];
                }
            } else if (ex->b13) {
                for (int i = a; i < b; i++) {
                    float g = h[i] + ex->b13[i];
                    act[i] = g / (1.f + expf(-g)) * (h[I + i] + ex->b13[I + i]);
                }
            } else
                for (int i = a; i < b; i++) {
                    float g = h[i];
                    act[i] = g / (1.f + expf(-g)) * h[I + i];
                }
            if (MDK_IS_INT(fmt)) mdk_quantize_act_range(act, I, a, b, &m->aq[s]);
            else if (fmt == MDK_BF16 && m->actbf) mdk_store_row(MDK_BF16, act + a, m->actbf + (size_t)s * I + a, b - a);
        }
    }
}

static void phase3(void *c, int t) {
    moe_ctx *m = (moe_ctx *)c;
    int D = m->D, I = m->I, a = t * m->rows3, b = a + m->rows3 < D ? a + m->rows3 : D;
    float y4[4][SUB];
    for (int j = 0; j < m->njobs; j++) {
        const mdk_matrix *w = &m->ex[j]->w2;
        const float *b2 = m->ex[j]->b2;
        int ns = m->offs[j + 1] - m->offs[j];
        const mdk_q8 **aa;
        float **yy;
        if (gemm_fits(w, ns) && !mdk_gemm_ptrs(ns, &aa, &yy)) {  /* out[tok] += rw * (w2 . a + b2) */
            for (int i = 0; i < ns; i++) {
                int s = m->offs[j] + i;
                aa[i] = &m->aq[s];
                yy[i] = m->out + (size_t)m->tok[s] * D + a;
            }
            mdk_gemm_rows(w, a, b, aa, ns, yy, m->rw + m->offs[j], b2);
            continue;
        }
        for (int r = a; r < b; r += SUB) {
            int re = r + SUB < b ? r + SUB : b;
            for (int s = m->offs[j]; s < m->offs[j + 1];) {
                int ns = m->offs[j + 1] - s < 4 ? m->offs[j + 1] - s : 4;
                if (MDK_IS_INT(w->fmt) && ns > 1) {  /* up to 4 slots per read of the rows */
                    const mdk_q8 *aa[4];
                    float *yy[4] = {y4[0], y4[1], y4[2], y4[3]};
                    for (int t = 0; t < ns; t++) aa[t] = &m->aq[s + t];
                    mdk_wq_rows_multi(w, r, re, aa, ns, yy);
                } else {
                    ns = 1;
                    rows_any(w, r, re, m->act + (size_t)s * I, m->actbf ? m->actbf + (size_t)s * I : NULL,
                             m->aq ? &m->aq[s] : NULL, y4[0]);
                }
                for (int t = 0; t < ns; t++) {
                    float *o = m->out + (size_t)m->tok[s + t] * D, rwt = m->rw[s + t];
                    const float *y = y4[t];
                    if (b2)
                        for (int i = r; i < re; i++) o[i] += rwt * (y[i - r] + b2[i]);
                    else
                        for (int i = r; i < re; i++) o[i] += rwt * y[i - r];
                }
                s += ns;
            }
        }
    }
}

typedef struct { const void *x; int fmt, D; float *xf; mdk_q8 *xq; } prep_ctx;

static void prep_task(void *c, int t) {
    prep_ctx *p = (prep_ctx *)c;
    float *xf = p->xf + (size_t)t * p->D;
    mdk_load_row(p->fmt, (const char *)p->x + (size_t)t * p->D * (p->fmt == MDK_F32 ? 4 : 2), xf, p->D);
    if (p->xq) mdk_quantize_act(xf, p->D, &p->xq[t]);
}

static int rows_per_task(int rows, int nthreads) {
    /* 4 tasks a thread: interleaved A/B on the demo's step, 1/2/4/16 a thread measured 13.2/12.5/12.9/13.3
     * ms (median of 12 rounds); fewer, longer streams suit the prefetchers, more balance the threads */
    int per = (rows + 4 * nthreads - 1) / (4 * nthreads);
    per = (per + SUB - 1) / SUB * SUB;
    return per < SUB ? SUB : per;
}

/* Runs njobs experts: job j = expert ex[j] on slots offs[j]..offs[j+1]-1 (tokens tok[s] of x with
 * route weights rw[s]). x [T, D] in x_fmt; out [T, D] (out_fmt) is overwritten with the sum.
 * Every expert of a call has the same D and I. Returns 0, or -1 when the scratch memory failed. */
MDK_API int mdk_experts(const mdk_expert *const *ex, int njobs, const int32_t *offs, const int32_t *tok,
                        const float *rw, const void *x, int x_fmt, int T, void *out, int out_fmt, int nthreads) {
    if (njobs <= 0 || T <= 0) return 0;
    int D = ex[0]->w13.k, I = ex[0]->w2.k, S = offs[njobs];
    int any_q4_in = 0, any_q4_out = 0, any_bf_in = 0, any_bf_out = 0;
    for (int j = 0; j < njobs; j++) {
        any_q4_in |= MDK_IS_INT(ex[j]->w13.fmt);
        any_q4_out |= MDK_IS_INT(ex[j]->w2.fmt);
        any_bf_in |= ex[j]->w13.fmt == MDK_BF16;
        any_bf_out |= ex[j]->w2.fmt == MDK_BF16;
    }
    moe_ctx m;
    memset(&m, 0, sizeof m);
    m.ex = ex; m.offs = offs; m.tok = tok; m.rw = rw; m.njobs = njobs; m.S = S; m.T = T; m.D = D; m.I = I;
    size_t q8x = mdk_q8_bytes(D), q8a = mdk_q8_bytes(I);
    float *xf = (float *)mdk_scratch(0, (size_t)T * D * 4);
    char *xqmem = any_q4_in ? (char *)mdk_scratch(1, (size_t)T * (q8x + sizeof(mdk_q8))) : NULL;
    m.h = (float *)mdk_scratch(2, (size_t)S * 2 * I * 4);
    m.act = (float *)mdk_scratch(3, (size_t)S * I * 4);
    char *aqmem = any_q4_out ? (char *)mdk_scratch(4, (size_t)S * (q8a + sizeof(mdk_q8))) : NULL;
    m.out = (float *)mdk_scratch(5, (size_t)T * D * 4);
    int use_bf = mdk_has_bf16;
    m.actbf = (any_bf_out && use_bf) ? (uint16_t *)mdk_scratch(7, (size_t)S * I * 2) : NULL;
    if (!xf || (any_q4_in && !xqmem) || !m.h || !m.act || (any_q4_out && !aqmem) || !m.out ||
        (any_bf_out && use_bf && !m.actbf))
        return -1;
    if (any_q4_in) {
        m.xq = (mdk_q8 *)xqmem;
        for (int t = 0; t < T; t++) mdk_q8_init(&m.xq[t], xqmem + T * sizeof(mdk_q8) + (size_t)t * q8x, D);
    }
    if (any_q4_out) {
        m.aq = (mdk_q8 *)aqmem;
        for (int s = 0; s < S; s++) mdk_q8_init(&m.aq[s], aqmem + S * sizeof(mdk_q8) + (size_t)s * q8a, I);
    }
    prep_ctx p = {x, x_fmt, D, xf, m.xq};
    mdk_parallel(T, prep_task, &p, T >= 8 ? nthreads : 1);
    m.xf = xf;
    m.xbf = (any_bf_in && use_bf && x_fmt == MDK_BF16) ? (const uint16_t *)x : NULL;
    memset(m.out, 0, (size_t)T * D * 4);

    m.rows1 = (rows_per_task(I, nthreads) + 31) / 32 * 32;  /* whole 32-blocks of the activation */
    mdk_parallel((I + m.rows1 - 1) / m.rows1, phase1, &m, nthreads);
    m.rows3 = rows_per_task(D, nthreads);
    mdk_parallel((D + m.rows3 - 1) / m.rows3, phase3, &m, nthreads);
    for (int t = 0; t < T; t++)
        mdk_store_row(out_fmt, m.out + (size_t)t * D, (char *)out + (size_t)t * D * (out_fmt == MDK_F32 ? 4 : 2), D);
    return 0;
}

/* Routes T tokens with the router W [E, D] (Mixtral: softmax in fp32 over logits rounded to
 * logit_fmt, top-k, renormalised), then runs the selected experts as mdk_experts does. table[e] is
 * expert e, or NULL when it is not a CPU expert: then nothing is computed and -2 is returned;
 * -3: K outside 1..E or E over 1024.
 * idx [T, K] and wts [T, K] receive the routes either way. */
MDK_API int mdk_moe(const mdk_expert *const *table, int E, const mdk_matrix *router, int K, int logit_fmt,
                    const void *x, int x_fmt, int T, void *out, int out_fmt, int32_t *idx, float *wts, int nthreads) {
    if (K <= 0 || K > E || E > 1024) return -3;  /* bad arguments: the caller says which */
    int D = router->k;
    float *xf = (float *)mdk_scratch(6, (size_t)D * 4 + (size_t)E * 4 + 64);
    if (!xf) return -1;
    float *logit = xf + D;
    int missing = 0;
    for (int t = 0; t < T; t++) {
        mdk_load_row(x_fmt, (const char *)x + (size_t)t * D * (x_fmt == MDK_F32 ? 4 : 2), xf, D);
        mdk_dense_rows(router, 0, E, xf, NULL, logit);
        float mx = -INFINITY, sum = 0.f;
        for (int e = 0; e < E; e++) { logit[e] = mdk_round_to(logit_fmt, logit[e]); mx = fmaxf(mx, logit[e]); }
        for (int e = 0; e < E; e++) { logit[e] = expf(logit[e] - mx); sum += logit[e]; }
        float tot = 0.f;
        for (int j = 0; j < K; j++) {  /* top-k by selection; ties go to the lower index, like torch */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int q = 0; q < j; q++) used |= idx[t * K + q] == e;
                if (!used && (best < 0 || logit[e] > logit[best])) best = e;
            }
            idx[t * K + j] = best;
            wts[t * K + j] = logit[best] / sum;
            tot += wts[t * K + j];
            missing |= table[best] == NULL;
        }
        for (int j = 0; j < K; j++) wts[t * K + j] /= tot;
    }
    if (missing) return -2;
    /* group slots by expert (counting sort) */
    int32_t cnt[1024 + 1];
    static int32_t jobs_offs[1024 + 1], slot_tok[65536];
    static float slot_w[65536];
    static const mdk_expert *jobs_ex[1024];
    if ((size_t)T * K > 65536) return -1;
    memset(cnt, 0, sizeof(int32_t) * (E + 1));
    for (int s = 0; s < T * K; s++) cnt[idx[s]]++;
    int nj = 0, at = 0;
    int32_t start[1024];
    for (int e = 0; e < E; e++) {
        start[e] = at;
        if (cnt[e]) { jobs_ex[nj] = table[e]; jobs_offs[nj++] = at; }
        at += cnt[e];
    }
    jobs_offs[nj] = at;
    for (int s = 0; s < T * K; s++) {
        int e = idx[s], pos = start[e]++;
        slot_tok[pos] = s / K;
        slot_w[pos] = wts[s];
    }
    return mdk_experts(jobs_ex, nj, jobs_offs, slot_tok, slot_w, x, x_fmt, T, out, out_fmt, nthreads);
}

typedef struct { const mdk_matrix *w; const float *xf; const uint16_t *xbf; mdk_q8 *xq; int T, rows; float *y; } mm_ctx;

static void mm_task(void *c, int t) {
    mm_ctx *m = (mm_ctx *)c;
    int n = m->w->n, k = m->w->k, a = t * m->rows, b = a + m->rows < n ? a + m->rows : n;
    float y4[4][SUB];
    const mdk_q8 **aa;
    float **yy;
    if (gemm_fits(m->w, m->T) && !mdk_gemm_ptrs(m->T, &aa, &yy)) {
        for (int i = 0; i < m->T; i++) aa[i] = &m->xq[i], yy[i] = m->y + (size_t)i * n + a;
        mdk_gemm_rows(m->w, a, b, aa, m->T, yy, NULL, NULL);
        return;
    }
    for (int r = a; r < b; r += SUB) {
        int re = r + SUB < b ? r + SUB : b;
        for (int tk = 0; tk < m->T;) {
            int nt = m->T - tk < 4 ? m->T - tk : 4;
            if (MDK_IS_INT(m->w->fmt) && nt > 1) {
                const mdk_q8 *aa[4];
                float *yy[4] = {y4[0], y4[1], y4[2], y4[3]};
                for (int t = 0; t < nt; t++) aa[t] = &m->xq[tk + t];
                mdk_wq_rows_multi(m->w, r, re, aa, nt, yy);
            } else {
                nt = 1;
                rows_any(m->w, r, re, m->xf + (size_t)tk * k, m->xbf ? m->xbf + (size_t)tk * k : NULL,
                         m->xq ? &m->xq[tk] : NULL, y4[0]);
            }
            for (int t = 0; t < nt; t++) memcpy(m->y + (size_t)(tk + t) * n + r, y4[t], (size_t)(re - r) * 4);
            tk += nt;
        }
    }
}

/* y [T, N] fp32 = x [T, K] (x_fmt) @ W.T, for one matrix of any format. */
/* The input x [T, k] (x_fmt) as fp32 rows in scratch 0, and int8-quantised (scratch 1) when a weight is
 * an int format (quantised): what every matrix of a call reads. 0, or -1 without scratch memory. */
static int prepare_input(const void *x, int x_fmt, int k, int T, int quantised, int nthreads, float **xf_out,
                         mdk_q8 **xq_out) {
    size_t q8 = mdk_q8_bytes(k);
    float *xf = (float *)mdk_scratch(0, (size_t)T * k * 4);
    char *mem = quantised ? (char *)mdk_scratch(1, (size_t)T * (q8 + sizeof(mdk_q8))) : NULL;
    if (!xf || (quantised && !mem)) return -1;
    mdk_q8 *xq = NULL;
    if (mem) {
        xq = (mdk_q8 *)mem;
        for (int t = 0; t < T; t++) mdk_q8_init(&xq[t], mem + T * sizeof(mdk_q8) + (size_t)t * q8, k);
    }
    prep_ctx p = {x, x_fmt, k, xf, xq};
    mdk_parallel(T, prep_task, &p, T >= 8 ? nthreads : 1);
    *xf_out = xf;
    *xq_out = xq;
    return 0;
}

MDK_API int mdk_matmul(const mdk_matrix *w, const void *x, int x_fmt, int T, float *y, int nthreads) {
    float *xf;
    mdk_q8 *xq;
    if (prepare_input(x, x_fmt, w->k, T, MDK_IS_INT(w->fmt), nthreads, &xf, &xq)) return -1;
    mm_ctx m = {w, xf, (w->fmt == MDK_BF16 && mdk_has_bf16 && x_fmt == MDK_BF16) ? (const uint16_t *)x : NULL,
                xq, T, rows_per_task(w->n, nthreads), y};
    mdk_parallel((w->n + m.rows - 1) / m.rows, mm_task, &m, nthreads);
    return 0;
}

/* Several matrices of one input stacked along their output rows ([q; k; v], DeltaNet's [qkv; z; b; a]),
 * each in its own format, as one call: the input converted (and int8-quantised) once, every part's row
 * blocks one task list for the pool, so the threads meet once instead of once a part. y [T, sum of n]. */
typedef struct { const mdk_matrix *w; int col, a, b; } part_task;
typedef struct { const part_task *tasks; const float *xf; const uint16_t *xbf; mdk_q8 *xq; int T, ld; float *y; } parts_ctx;

static void parts_task(void *c, int t) {
    const parts_ctx *m = (const parts_ctx *)c;
    const part_task *pt = &m->tasks[t];
    const mdk_matrix *w = pt->w;
    int k = w->k;
    float y1[SUB];
    const mdk_q8 **aa;
    float **yy;
    if (gemm_fits(w, m->T) && !mdk_gemm_ptrs(m->T, &aa, &yy)) {
        for (int i = 0; i < m->T; i++) aa[i] = &m->xq[i], yy[i] = m->y + (size_t)i * m->ld + pt->col + pt->a;
        mdk_gemm_rows(w, pt->a, pt->b, aa, m->T, yy, NULL, NULL);
        return;
    }
    for (int r = pt->a; r < pt->b; r += SUB) {
        int re = r + SUB < pt->b ? r + SUB : pt->b;
        for (int tk = 0; tk < m->T; tk++) {
            rows_any(w, r, re, m->xf + (size_t)tk * k, (w->fmt == MDK_BF16 && m->xbf) ? m->xbf + (size_t)tk * k : NULL,
                     m->xq ? &m->xq[tk] : NULL, y1);
            memcpy(m->y + (size_t)tk * m->ld + pt->col + r, y1, (size_t)(re - r) * 4);
        }
    }
}

MDK_API int mdk_matmul_parts(const mdk_matrix *const *ws, int np, const void *x, int x_fmt, int T, float *y,
                             int nthreads) {
    if (np < 1 || np > 8) return -1;
    int k = ws[0]->k, ld = 0, any_int = 0, ntasks = 0;
    for (int p = 0; p < np; p++) {
        if (ws[p]->k != k) return -1;
        ld += ws[p]->n;
        any_int |= MDK_IS_INT(ws[p]->fmt);
    }
    part_task tasks[8 * 64];
    int col = 0;
    for (int p = 0; p < np; p++) {
        int n = ws[p]->n, per = rows_per_task(n, nthreads);
        if ((n + per - 1) / per > 64) per = (n + 63) / 64;
        for (int a = 0; a < n; a += per) tasks[ntasks++] = (part_task){ws[p], col, a, a + per < n ? a + per : n};
        col += n;
    }
    float *xf;
    mdk_q8 *xq;
    if (prepare_input(x, x_fmt, k, T, any_int, nthreads, &xf, &xq)) return -1;
    parts_ctx m = {tasks, xf, (mdk_has_bf16 && x_fmt == MDK_BF16) ? (const uint16_t *)x : NULL, xq, T, ld, y};
    mdk_parallel(ntasks, parts_task, &m, nthreads);
    return 0;
}
