/* One decode step (one token) of a Mixtral-style model on the CPU, all layers in one call.
 *
 * Shapes: D hidden, H query heads, G kv heads, Hd head dim, P cached positions (pos + 1 after the
 * write), E experts, K top-k. Per layer, as engine/model/forward.py does it in torch:
 *   h = rms(x) * ln1 (rounded to the model dtype);  qkv = Wqkv . h (one matrix, or q, k and v as up
 *   to three stacked parts of different formats);  q/k norms and clip where the
 *   family has them (Qwen3-MoE, OLMoE);  rope on q and k;
 *   k, v -> cache[pos] (rounded to the cache's format);  att = softmax(q . K / sqrt(Hd)) . V over the
 *   window, in fp32;  x += Wo . att;
 *   h = rms(x) * ln2;  x += moe(h)   (mdk_moe: route, experts, weighted sum)
 * The residual x stays in its own format (fp32, or the model dtype) and is rounded after each add,
 * as torch does. Python calls this only when every layer's experts are native CPU experts.
 * Every dense matrix but the router may be 16-bit, fp32 or a GGUF block format (MDK_IS_INT: then its
 * input is quantised to int8 once per token, for all the parts that read it, as mdk_matmul does, so
 * the step gives the torch forward's values exactly).
 */
#include "mdk.h"

#include <math.h>
#include <string.h>

int mdk_moe(const mdk_expert *const *table, int E, const mdk_matrix *router, int K, int logit_fmt,
            const void *x, int x_fmt, int T, void *out, int out_fmt, int32_t *idx, float *wts, int nthreads);

typedef struct {
    const void *ln1, *ln2;          /* [D] in norm_fmt */
    mdk_matrix qkv[3];              /* [(H+2G)Hd, D] as nqkv stacked parts: [q; k; v] in one, or three */
    int nqkv;
    mdk_matrix wo;                  /* [D, H*Hd] */
    const mdk_expert *const *experts;  /* [E] */
    mdk_matrix router;              /* [E, D] */
    void *k, *v;                    /* this layer's cache [G, ctx, row] in the model's kv_fmt (mdk_kv_row_bytes) */
    const float *q_norm, *k_norm;   /* RMSNorm weights of q and k (qk_norm 1: [Hd]; 2: [H*Hd], [G*Hd]) */
} mdk_layer;

typedef struct {
    int layers, D, H, G, Hd, ctx, E, K, window;  /* window 0: none */
    float eps;
    int dtype, resid_fmt, norm_fmt;
    const mdk_layer *layer;
    const void *norm;               /* final norm [D] (norm_fmt) */
    mdk_matrix lm_head;             /* [V, D] */
    int qk_norm;                    /* 0 none; 1 RMSNorm of each q and k head (Qwen3-MoE); 2 of all of q, of all of k (OLMoE) */
    float clip;                     /* > 0: q, k, v clamped to +-clip after the norms (OLMoE's clip_qkv) */
    int kv_fmt;                     /* the KV cache's format: MDK_F32, MDK_BF16, MDK_F16 or MDK_KV8 (8-bit rows) */
} mdk_model;

/* v[0..n) = w * (v / rms(v)), in fp32 as the torch forward does it in attention's dtype */
static void rms_inplace(float *v, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) v[i] = w[i] * (v[i] * r);
}

/* y [B, ldy] (columns from each part's first row on) = x [B, k] . W^T for B tokens and np parts
 * stacked along the rows, in one dispatch: tasks are row ranges of a part, and inside a task each
 * block of 16 rows serves every token before the next is read, so the weights cross the memory bus
 * once. xq: the tokens quantised (read by the MDK_IS_INT parts; NULL when there are none). */
typedef struct {
    const mdk_matrix *w; int np; const float *x; const uint16_t *xbf; const mdk_q8 *xq; float *y; int ldy, B;
    int rows[3], first[4];        /* per part: rows a task, its first task */
} gemv_ctx;

static void gemv_task(void *c, int t) {
    gemv_ctx *g = (gemv_ctx *)c;
    int p = 0;
    while (t >= g->first[p + 1]) p++;
    const mdk_matrix *w = &g->w[p];
    int off = 0;
    for (int q = 0; q < p; q++) off += g->w[q].n;
    int n = w->n, k = w->k, a = (t - g->first[p]) * g->rows[p], b = a + g->rows[p] < n ? a + g->rows[p] : n;
    int isq = MDK_IS_INT(w->fmt);
    if (g->B == 1) {
        if (isq) mdk_wq_rows(w, a, b, g->xq, g->y + off + a);
        else mdk_dense_rows(w, a, b, g->x, g->xbf, g->y + off + a);
        return;
    }
    for (int r = a; r < b; r += 16) {
        int re = r + 16 < b ? r + 16 : b;
        for (int tk = 0; tk < g->B; tk += 4) {
            int nt = g->B - tk < 4 ? g->B - tk : 4;
            const float *xs[4];
            const uint16_t *xb[4];
            const mdk_q8 *xq[4];
            float *ys[4];
            for (int t = 0; t < nt; t++) {
                xs[t] = g->x + (size_t)(tk + t) * k;
                xb[t] = g->xbf ? g->xbf + (size_t)(tk + t) * k : NULL;
                xq[t] = isq ? &g->xq[tk + t] : NULL;
                ys[t] = g->y + (size_t)(tk + t) * g->ldy + off + r;
            }
            if (isq) mdk_wq_rows_multi(w, r, re, xq, nt, ys);
            else mdk_dense_rows_multi(w, r, re, xs, g->xbf ? xb : NULL, nt, ys);
        }
    }
}

static void gemv(const mdk_matrix *w, int np, const float *x, const uint16_t *xbf, const mdk_q8 *xq, float *y,
                 int B, int nthreads) {
    gemv_ctx g = {w, np, x, xbf, xq, y, 0, B, {0}, {0}};
    for (int p = 0; p < np; p++) {
        int tasks = 4 * nthreads, rows = (w[p].n + tasks - 1) / tasks;  /* see rows_per_task in moe.c */
        if (rows < 64) rows = 64;
        rows = (rows + 15) / 16 * 16;  /* whole tiles of the block formats */
        g.rows[p] = rows;
        g.first[p + 1] = g.first[p] + (w[p].n + rows - 1) / rows;
        g.ldy += w[p].n;
    }
    mdk_parallel(g.first[np], gemv_task, &g, nthreads);
}

typedef struct { const float *x; int k; mdk_q8 *q; } quant_ctx;

static void quant_task(void *c, int t) {
    quant_ctx *q = (quant_ctx *)c;
    mdk_quantize_act(q->x + (size_t)t * q->k, q->k, &q->q[t]);
}

/* x [B, k] quantised per token into scratch slot `slot` when one of the np matrices is an int8
 * format, else NULL (and nothing done); ok is cleared when the scratch memory failed */
static mdk_q8 *quantize_for(const mdk_matrix *w, int np, const float *x, int B, int slot, int nthreads, int *ok) {
    int any = 0;
    for (int p = 0; p < np; p++) any |= MDK_IS_INT(w[p].fmt);
    if (!any) return NULL;
    int k = w[0].k;
    size_t each = mdk_q8_bytes(k);
    char *mem = (char *)mdk_scratch(slot, (size_t)B * (sizeof(mdk_q8) + each) + 64);
    if (!mem) { *ok = 0; return NULL; }
    mdk_q8 *q = (mdk_q8 *)mem;
    for (int b = 0; b < B; b++) mdk_q8_init(&q[b], mem + B * sizeof(mdk_q8) + (size_t)b * each, k);
    quant_ctx qc = {x, k, q};
    mdk_parallel(B, quant_task, &qc, B >= 8 ? nthreads : 1);
    return q;
}

/* h = rms(x) * w, in the model dtype's values (hf fp32; hb the same as bf16 when dtype is bf16) */
static void rmsnorm(const float *x, const void *w, int wfmt, int D, float eps, int dtype, float *hf, uint16_t *hb) {
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float r = 1.f / sqrtf((float)(ss / D) + eps);
    for (int i = 0; i < D; i++) {
        float wi = wfmt == MDK_F32 ? ((const float *)w)[i]
                   : wfmt == MDK_F16 ? mdk_h2f(((const uint16_t *)w)[i]) : mdk_bf2f(((const uint16_t *)w)[i]);
        hf[i] = mdk_round_to(dtype, wi * mdk_round_to(dtype, x[i] * r));
        if (hb) hb[i] = mdk_f2bf(hf[i]);
    }
}

typedef struct {
    const mdk_model *m;
    const float *q;        /* [B, H, Hd] after rope */
    char *const *k, *const *v;   /* per token: its sequence's cache for this layer [G, ctx, Hd] (kv_fmt) */
    const int *first, *last;     /* per token: key positions first..last */
    float *att;            /* [B, H, Hd] */
    float *scores;         /* [B, H, ctx] */
} attn_ctx;

static void attn_task(void *c, int task) {  /* task = token * G + kv group (attention.c) */
    attn_ctx *a = (attn_ctx *)c;
    const mdk_model *m = a->m;
    int tk = task / m->G, g = task % m->G, Hd = m->Hd, hpg = m->H / m->G;
    mdk_kv kv = {Hd, m->ctx, m->kv_fmt};
    size_t group = (size_t)m->ctx * mdk_kv_row_bytes(m->kv_fmt, Hd);
    mdk_attend(&kv, a->q + (size_t)tk * m->H * Hd, a->k[tk] + g * group, a->v[tk] + g * group, a->first[tk],
               a->last[tk], g * hpg, hpg, a->scores + (size_t)tk * m->H * m->ctx, a->att + (size_t)tk * m->H * Hd);
}

#define MAX_BATCH 64

/* One decode step for B sequences (B <= 64): token b's embedding x[b] (resid_fmt) at position pos[b]
 * of its own KV cache, whose keys and values start at kbase[b] / vbase[b] ([layers, G, ctx, row] in kv_fmt,
 * every cache of the same ctx). On return x holds the last layer's outputs and logits [B, V] (fp32,
 * values of the model dtype, as torch's lm_head gives) are written. cos, sin: [B, Hd] rope rows
 * (sin already signed for the rotate-half trick). The dense weights and each expert any token
 * chose are read once for all B. Returns 0, -1 (scratch memory, or B out of range), -2 (a layer's
 * expert is not a native CPU expert: the caller must not reuse this step). */
MDK_API int mdk_decode_batch(const mdk_model *m, int B, void *x, const int *pos, char *const *kbase,
                             char *const *vbase, const float *cos, const float *sin, float *logits, int nthreads) {
    int D = m->D, H = m->H, G = m->G, Hd = m->Hd, nq = (H + 2 * G) * Hd;
    if (B < 1 || B > MAX_BATCH || m->K > 64) return -1;
    size_t floats = (size_t)B * (2 * D + nq + H * Hd + D) + (size_t)B * H * m->ctx + 64;
    float *xf = (float *)mdk_scratch(8, floats * 4);
    uint16_t *hb = (uint16_t *)mdk_scratch(9, (size_t)B * (D + H * Hd + D) * 2 + 64);
    if (!xf || !hb) return -1;
    float *hf = xf + (size_t)B * D, *qkv = hf + (size_t)B * D, *att = qkv + (size_t)B * nq, *o = att + (size_t)B * H * Hd;
    float *scores = o + (size_t)B * D;
    uint16_t *attb = hb + (size_t)B * D, *hin = attb + (size_t)B * H * Hd;
    int ok = 1;
    int32_t idx[MAX_BATCH * 64];
    float wts[MAX_BATCH * 64];
    char *kl[MAX_BATCH], *vl[MAX_BATCH];
    int first[MAX_BATCH];
    size_t rowb = mdk_kv_row_bytes(m->kv_fmt, Hd), layer_stride = (size_t)G * m->ctx * rowb;
    size_t esz = m->resid_fmt == MDK_F32 ? 4 : 2;
    int use_bf = m->dtype == MDK_BF16;
    for (int b = 0; b < B; b++) {
        mdk_load_row(m->resid_fmt, (const char *)x + (size_t)b * D * esz, xf + (size_t)b * D, D);
        first[b] = m->window > 0 && pos[b] + 1 > m->window ? pos[b] - m->window + 1 : 0;
    }
    for (int l = 0; l < m->layers; l++) {
        const mdk_layer *L = &m->layer[l];
        for (int b = 0; b < B; b++) {
            rmsnorm(xf + (size_t)b * D, L->ln1, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D,
                    use_bf ? hb + (size_t)b * D : NULL);
            kl[b] = kbase[b] + l * layer_stride;
            vl[b] = vbase[b] + l * layer_stride;
        }
        mdk_q8 *hq = quantize_for(L->qkv, L->nqkv, hf, B, 10, nthreads, &ok);
        if (!ok) return -1;
        gemv(L->qkv, L->nqkv, hf, use_bf ? hb : NULL, hq, qkv, B, nthreads);
        for (int b = 0; b < B; b++) {
            float *r = qkv + (size_t)b * nq;
            for (int i = 0; i < nq; i++) r[i] = mdk_round_to(m->dtype, r[i]);
            if (m->qk_norm == 1)
                for (int hd = 0; hd < H + G; hd++) rms_inplace(r + (size_t)hd * Hd, hd < H ? L->q_norm : L->k_norm, Hd, m->eps);
            else if (m->qk_norm == 2) {
                rms_inplace(r, L->q_norm, H * Hd, m->eps);
                rms_inplace(r + (size_t)H * Hd, L->k_norm, G * Hd, m->eps);
            }
            if (m->clip > 0.f)
                for (int i = 0; i < nq; i++) r[i] = fminf(fmaxf(r[i], -m->clip), m->clip);
            const float *cb = cos + (size_t)b * Hd, *sb = sin + (size_t)b * Hd;
            for (int hd = 0; hd < H + G; hd++) {  /* rope on q and k heads */
                float *v = r + (size_t)hd * Hd, tmp[1024];
                int half = Hd / 2;
                for (int i = 0; i < Hd; i++) tmp[i] = v[i] * cb[i] + v[(i + half) % Hd] * sb[i];
                memcpy(v, tmp, (size_t)Hd * 4);
            }
            for (int g = 0; g < G; g++) {  /* rounded to the cache's format, as the torch forward's store does */
                mdk_kv_store(m->kv_fmt, r + (size_t)(H + g) * Hd, kl[b] + ((size_t)g * m->ctx + pos[b]) * rowb, Hd);
                mdk_kv_store(m->kv_fmt, r + (size_t)(H + G + g) * Hd, vl[b] + ((size_t)g * m->ctx + pos[b]) * rowb, Hd);
            }
        }
        /* q of token b is its row's first H*Hd values: gather them contiguous for the tasks */
        for (int b = 1; b < B; b++) memmove(qkv + (size_t)b * H * Hd, qkv + (size_t)b * nq, (size_t)H * Hd * 4);
        attn_ctx ac = {m, qkv, kl, vl, first, pos, att, scores};
        mdk_parallel(B * G, attn_task, &ac, nthreads);
        for (int i = 0; i < B * H * Hd; i++) {
            att[i] = mdk_round_to(m->dtype, att[i]);
            if (use_bf) attb[i] = mdk_f2bf(att[i]);
        }
        mdk_q8 *aq = quantize_for(&L->wo, 1, att, B, 11, nthreads, &ok);
        if (!ok) return -1;
        gemv(&L->wo, 1, att, use_bf ? attb : NULL, aq, o, B, nthreads);
        for (int i = 0; i < B * D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
        for (int b = 0; b < B; b++) {
            rmsnorm(xf + (size_t)b * D, L->ln2, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D, NULL);
            mdk_store_row(m->dtype, hf + (size_t)b * D, hin + (size_t)b * D, D);
        }
        void *hin_p = m->dtype == MDK_F32 ? (void *)hf : (void *)hin;
        int rc = mdk_moe(L->experts, m->E, &L->router, m->K, m->dtype, hin_p, m->dtype, B, o, MDK_F32, idx, wts, nthreads);
        if (rc) return rc;
        for (int i = 0; i < B * D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
    }
    for (int b = 0; b < B; b++) {
        mdk_store_row(m->resid_fmt, xf + (size_t)b * D, (char *)x + (size_t)b * D * esz, D);
        rmsnorm(xf + (size_t)b * D, m->norm, m->norm_fmt, D, m->eps, m->dtype, hf + (size_t)b * D,
                use_bf ? hb + (size_t)b * D : NULL);
    }
    mdk_q8 *fq = quantize_for(&m->lm_head, 1, hf, B, 10, nthreads, &ok);
    if (!ok) return -1;
    gemv(&m->lm_head, 1, hf, use_bf ? hb : NULL, fq, logits, B, nthreads);
    if (m->dtype != MDK_F32)
        for (size_t i = 0; i < (size_t)B * m->lm_head.n; i++) logits[i] = mdk_round_to(m->dtype, logits[i]);
    return 0;
}

/* One sequence's decode step, its cache the one its layers point at (see mdk_decode_batch). */
MDK_API int mdk_decode(const mdk_model *m, void *x, int pos, const float *cos, const float *sin, float *logits,
                       int nthreads) {
    char *k = (char *)m->layer[0].k, *v = (char *)m->layer[0].v;
    return mdk_decode_batch(m, 1, x, &pos, &k, &v, cos, sin, logits, nthreads);
}
