/* One decode step (one token) of a Mixtral-style model on the CPU, all layers in one call.
 *
 * Shapes: D hidden, H query heads, G kv heads, Hd head dim, P cached positions (pos + 1 after the
 * write), E experts, K top-k. Per layer, as engine/model.py does it in torch:
 *   h = rms(x) * ln1 (rounded to the model dtype);  qkv = Wqkv . h;  q/k norms and clip where the
 *   family has them (Qwen3-MoE, OLMoE);  rope on q and k;
 *   k, v -> cache[pos];  att = softmax(q . K / sqrt(Hd)) . V over the window;  x += Wo . att;
 *   h = rms(x) * ln2;  x += moe(h)   (mdk_moe: route, experts, weighted sum)
 * The residual x stays in its own format (fp32, or the model dtype) and is rounded after each add,
 * as torch does. Python calls this only when every layer's experts are native CPU experts.
 */
#include "mdk.h"

#include <math.h>
#include <string.h>

int mdk_moe(const mdk_expert *const *table, int E, const mdk_matrix *router, int K, int logit_fmt,
            const void *x, int x_fmt, int T, void *out, int out_fmt, int32_t *idx, float *wts, int nthreads);

typedef struct {
    const void *ln1, *ln2;          /* [D] in norm_fmt */
    mdk_matrix wqkv, wo;            /* [(H+2G)Hd, D], [D, H*Hd] */
    const mdk_expert *const *experts;  /* [E] */
    mdk_matrix router;              /* [E, D] */
    float *k, *v;                   /* this layer's cache [G, ctx, Hd] fp32 */
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
} mdk_model;

/* v[0..n) = w * (v / rms(v)), in fp32 as the torch forward does it in attention's dtype */
static void rms_inplace(float *v, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) v[i] = w[i] * (v[i] * r);
}

typedef struct { const mdk_matrix *w; const float *x; const uint16_t *xbf; float *y; int rows; } gemv_ctx;

static void gemv_task(void *c, int t) {
    gemv_ctx *g = (gemv_ctx *)c;
    int a = t * g->rows, b = a + g->rows < g->w->n ? a + g->rows : g->w->n;
    mdk_dense_rows(g->w, a, b, g->x, g->xbf, g->y + a);
}

static void gemv(const mdk_matrix *w, const float *x, const uint16_t *xbf, float *y, int nthreads) {
    int tasks = 4 * nthreads, rows = (w->n + tasks - 1) / tasks;  /* see rows_per_task in moe.c */
    if (rows < 64) rows = 64;
    gemv_ctx g = {w, x, xbf, y, rows};
    mdk_parallel((w->n + rows - 1) / rows, gemv_task, &g, nthreads);
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
    const float *q;      /* [H, Hd] after rope */
    const float *k, *v;  /* [G, ctx, Hd] */
    int first, last;     /* key positions first..last */
    float *att;          /* [H, Hd] */
    float *scores;       /* [H, ctx] */
} attn_ctx;

static float dot8(const float *a, const float *b, int n) {  /* eight partial sums: vectorises */
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float s = 0.f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int u = 0; u < 8; u++) s += acc[u];
    return s;
}

static void attn_task(void *c, int h) {
    attn_ctx *a = (attn_ctx *)c;
    const mdk_model *m = a->m;
    int Hd = m->Hd, g = h / (m->H / m->G);
    const float *q = a->q + (size_t)h * Hd;
    const float *kb = a->k + (size_t)g * m->ctx * Hd, *vb = a->v + (size_t)g * m->ctx * Hd;
    float *s = a->scores + (size_t)h * m->ctx, mx = -INFINITY, scale = 1.f / sqrtf((float)Hd);
    for (int j = a->first; j <= a->last; j++) {
        s[j] = dot8(q, kb + (size_t)j * Hd, Hd) * scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0.f;
    for (int j = a->first; j <= a->last; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
    float *o = a->att + (size_t)h * Hd, inv = 1.f / sum;
    for (int i = 0; i < Hd; i++) o[i] = 0.f;
    for (int j = a->first; j <= a->last; j++) {
        const float *vj = vb + (size_t)j * Hd;
        float p = s[j] * inv;
        for (int i = 0; i < Hd; i++) o[i] += p * vj[i];
    }
}

/* x [D] (resid_fmt) is the embedded token at position pos; on return it is the last layer's output,
 * and logits [V] (fp32, holding values of the model dtype, as torch's lm_head gives) are written.
 * cos, sin: [Hd] rope rows for pos (sin already signed for the rotate-half trick). Returns 0, or
 * -1 (scratch memory), -2 (a layer's expert is not a native CPU expert: nothing was changed after
 * that layer's attention, so the caller must not reuse this step). */
MDK_API int mdk_decode(const mdk_model *m, void *x, int pos, const float *cos, const float *sin, float *logits,
                       int nthreads) {
    int D = m->D, H = m->H, G = m->G, Hd = m->Hd, nq = (H + 2 * G) * Hd;
    float *xf = (float *)mdk_scratch(8, (size_t)(2 * D + nq + H * Hd + D) * 4 + (size_t)H * m->ctx * 4 + 256);
    uint16_t *hb = (uint16_t *)mdk_scratch(9, (size_t)(D + H * Hd + D) * 2 + 64);
    int32_t idx[64];
    float wts[64];
    if (!xf || !hb || m->K > 64) return -1;
    float *hf = xf + D, *qkv = hf + D, *att = qkv + nq, *o = att + H * Hd, *scores = o + D;
    uint16_t *attb = hb + D, *hin = attb + H * Hd;
    int use_bf = m->dtype == MDK_BF16;
    mdk_load_row(m->resid_fmt, x, xf, D);
    int first = 0;
    if (m->window > 0 && pos - first + 1 > m->window) first = pos - m->window + 1;
    for (int l = 0; l < m->layers; l++) {
        const mdk_layer *L = &m->layer[l];
        rmsnorm(xf, L->ln1, m->norm_fmt, D, m->eps, m->dtype, hf, use_bf ? hb : NULL);
        gemv(&L->wqkv, hf, use_bf ? hb : NULL, qkv, nthreads);
        for (int i = 0; i < nq; i++) qkv[i] = mdk_round_to(m->dtype, qkv[i]);
        if (m->qk_norm == 1)
            for (int hd = 0; hd < H + G; hd++) rms_inplace(qkv + (size_t)hd * Hd, hd < H ? L->q_norm : L->k_norm, Hd, m->eps);
        else if (m->qk_norm == 2) {
            rms_inplace(qkv, L->q_norm, H * Hd, m->eps);
            rms_inplace(qkv + (size_t)H * Hd, L->k_norm, G * Hd, m->eps);
        }
        if (m->clip > 0.f)
            for (int i = 0; i < nq; i++) qkv[i] = fminf(fmaxf(qkv[i], -m->clip), m->clip);
        for (int hd = 0; hd < H + G; hd++) {  /* rope on q and k heads */
            float *v = qkv + (size_t)hd * Hd, tmp[1024];
            int half = Hd / 2;
            for (int i = 0; i < Hd; i++) tmp[i] = v[i] * cos[i] + v[(i + half) % Hd] * sin[i];
            memcpy(v, tmp, (size_t)Hd * 4);
        }
        for (int g = 0; g < G; g++) {
            memcpy(L->k + ((size_t)g * m->ctx + pos) * Hd, qkv + (size_t)(H + g) * Hd, (size_t)Hd * 4);
            memcpy(L->v + ((size_t)g * m->ctx + pos) * Hd, qkv + (size_t)(H + G + g) * Hd, (size_t)Hd * 4);
        }
        attn_ctx ac = {m, qkv, L->k, L->v, first, pos, att, scores};
        mdk_parallel(H, attn_task, &ac, nthreads);
        for (int i = 0; i < H * Hd; i++) {
            att[i] = mdk_round_to(m->dtype, att[i]);
            if (use_bf) attb[i] = mdk_f2bf(att[i]);
        }
        gemv(&L->wo, att, use_bf ? attb : NULL, o, nthreads);
        for (int i = 0; i < D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
        rmsnorm(xf, L->ln2, m->norm_fmt, D, m->eps, m->dtype, hf, NULL);
        mdk_store_row(m->dtype, hf, hin, D);
        void *hin_p = m->dtype == MDK_F32 ? (void *)hf : (void *)hin;
        int rc = mdk_moe(L->experts, m->E, &L->router, m->K, m->dtype, hin_p, m->dtype, 1, o, MDK_F32, idx, wts, nthreads);
        if (rc) return rc;
        for (int i = 0; i < D; i++) xf[i] = mdk_round_to(m->resid_fmt, xf[i] + mdk_round_to(m->dtype, o[i]));
    }
    mdk_store_row(m->resid_fmt, xf, x, D);
    rmsnorm(xf, m->norm, m->norm_fmt, D, m->eps, m->dtype, hf, use_bf ? hb : NULL);
    gemv(&m->lm_head, hf, use_bf ? hb : NULL, logits, nthreads);
    if (m->dtype != MDK_F32)
        for (int i = 0; i < m->lm_head.n; i++) logits[i] = mdk_round_to(m->dtype, logits[i]);
    return 0;
}
