/* GGUF's formats below 4 bits and the i-quants, on the file's own rows ("codes" formats): Q2_K, Q3_K,
 * IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0.
 *
 * Each block is read into one form the integer kernels share: a code u (0..255) per weight and per
 * group of gs weights (16 or 32) a float D and, for Q2_K alone, a float M, with
 *     weight = D * ((u - off) * mul)        (mul 1, or 1/8 for IQ1's deltas of 1/8: u = 8 (g + delta) + 9)
 *     weight = D * u - M                    (Q2_K: its minimum)
 * where off is the format's constant (Q3_K 4, IQ4 128, IQ2/IQ3_XXS 64, IQ3_S 16, IQ1 9, TQ 1, NVFP4 12). D and M
 * are computed in gguf-py's float order (gguf/quants.py), so the dequantisation below equals
 * gguf.quants.dequantize bit for bit; the i-quants' grids are its tables (iq_grids.h, generated).
 * A product is then exact integer sums per group and float terms, as kraw.c's:
 *     y += A_g * dx * sum_g(u x) + B_g * sx_g,   A = D * mul, B = -off * A - M
 * with the activations int8 per block of 32 (mdk_q8; sx_g over the group: sx, or sxh for groups of 16).
 */
#include "codes.h"

#include <math.h>
#include <string.h>

#include "iq_grids.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static const int8_t KV4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* fmt - MDK_Q2K: weights a block, bytes a block, weights a group, off, mul */
static const mdk_codes_info INFO[MDK_CODES_N] = {
    {256, 84, 16, 0, 1.f},     /* Q2_K */
    {256, 110, 16, 4, 1.f},    /* Q3_K */
    {32, 18, 32, 128, 1.f},    /* IQ4_NL */
    {256, 136, 32, 128, 1.f},  /* IQ4_XS */
    {256, 66, 32, 64, 1.f},    /* IQ2_XXS */
    {256, 74, 16, 64, 1.f},    /* IQ2_XS */
    {256, 82, 16, 64, 1.f},    /* IQ2_S */
    {256, 98, 32, 64, 1.f},    /* IQ3_XXS */
    {256, 110, 32, 16, 1.f},   /* IQ3_S */
    {256, 50, 32, 9, 0.125f},  /* IQ1_S */
    {256, 56, 16, 9, 0.125f},  /* IQ1_M */
    {256, 54, 32, 1, 1.f},     /* TQ1_0 */
    {256, 66, 32, 1, 1.f},     /* TQ2_0 */
    {64, 36, 16, 12, 1.f},     /* NVFP4: 4 unsigned E4M3 scales of 16, E2M1 values doubled (u = 2 v + 12) */
};

const mdk_codes_info *mdk_codes_info_of(int fmt) { return MDK_IS_CODES(fmt) ? &INFO[fmt - MDK_Q2K] : NULL; }

/* 8 signed grid values into u: value = sign ? -g : g, u = value + off */
static void signed8(const uint8_t *g, uint8_t signs, int off, uint8_t *u) {
    for (int j = 0; j < 8; j++) u[j] = (uint8_t)(((signs >> j) & 1 ? -(int)g[j] : (int)g[j]) + off);
}

/* IQ1's 8 values of {-1, 0, 1} plus delta (+-1/8): u = 8 (g + delta) + 9, delta's sign from neg */
static void iq1_8(const int8_t *g, int neg, uint8_t *u) {
    for (int j = 0; j < 8; j++) u[j] = (uint8_t)(8 * g[j] + (neg ? -1 : 1) + 9);
}

void mdk_codes_block(int fmt, const uint8_t *b, uint8_t *u, float *D, float *M) {
    switch (fmt) {
    case MDK_Q2K: {
        const uint8_t *sc = b, *qs = b + 16;
        float d = mdk_h2f(rd16(b + 80)), dmin = mdk_h2f(rd16(b + 82));
        for (int g = 0; g < 16; g++) D[g] = d * (float)(sc[g] & 15), M[g] = dmin * (float)(sc[g] >> 4);
        for (int e = 0; e < 256; e++) u[e] = (qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3;
        return;
    }
    case MDK_Q3K: {
        const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
        float d = mdk_h2f(rd16(b + 108));
        for (int i = 0; i < 16; i++) {
            int lo = (s[i & 7] >> (4 * (i >> 3))) & 15, hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            D[i] = d * (float)((lo | hi << 4) - 32);
        }
        for (int e = 0; e < 256; e++) {
            int l = e & 31, ql = (qs[32 * (e >> 7) + l] >> (2 * ((e & 127) >> 5))) & 3, h = (hm[l] >> (e >> 5)) & 1;
            u[e] = (uint8_t)(ql + 4 * h);  /* q = ql - 4 (1 - h) = u - 4 */
        }
        return;
    }
    case MDK_IQ4NL: {
        D[0] = mdk_h2f(rd16(b));
        for (int e = 0; e < 32; e++) u[e] = (uint8_t)(KV4[(b[2 + (e & 15)] >> (4 * (e >> 4))) & 15] + 128);
        return;
    }
    case MDK_IQ4XS: {
        float d = mdk_h2f(rd16(b));
        unsigned sh = rd16(b + 2);
        const uint8_t *sl = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++) {
            int sc = (((sl[j >> 1] >> (4 * (j & 1))) & 15) | ((sh >> (2 * j)) & 3) << 4) - 32;
            D[j] = d * (float)sc;
            for (int e = 0; e < 32; e++) u[32 * j + e] = (uint8_t)(KV4[(qs[16 * j + (e & 15)] >> (4 * (e >> 4))) & 15] + 128);
        }
        return;
    }
    case MDK_IQ2XXS: {
        float d = mdk_h2f(rd16(b));
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = b + 2 + 8 * g;
            uint32_t aux = rd32(q + 4);
            D[g] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int i = 0; i < 4; i++) signed8(IQ2XXS_GRID + 8 * q[i], KSIGNS[(aux >> (7 * i)) & 127], 64, u + 32 * g + 8 * i);
        }
        return;
    }
    case MDK_IQ2XS: {
        float d = mdk_h2f(rd16(b));
        const uint8_t *qs = b + 2, *sc = b + 66;
        for (int j = 0; j < 16; j++) D[j] = d * (0.5f + (float)((sc[j >> 1] >> (4 * (j & 1))) & 15)) * 0.25f;
        for (int i = 0; i < 32; i++) {
            unsigned q = rd16(qs + 2 * i);
            signed8(IQ2XS_GRID + 8 * (q & 511), KSIGNS[q >> 9], 64, u + 8 * i);
        }
        return;
    }
    case MDK_IQ2S: {
        float d = mdk_h2f(rd16(b));
        const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *sc = b + 74;
        for (int j = 0; j < 16; j++) D[j] = d * (0.5f + (float)((sc[j >> 1] >> (4 * (j & 1))) & 15)) * 0.25f;
        for (int i = 0; i < 32; i++) {
            unsigned idx = qs[i] | ((qh[i >> 2] >> (2 * (i & 3))) & 3) << 8;
            signed8(IQ2S_GRID + 8 * idx, signs[i], 64, u + 8 * i);
        }
        return;
    }
    case MDK_IQ3XXS: {
        float d = mdk_h2f(rd16(b));
        const uint8_t *qs = b + 2, *sas = b + 66;
        for (int g = 0; g < 8; g++) {
            uint32_t aux = rd32(sas + 4 * g);
            D[g] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int i = 0; i < 4; i++) {
                uint8_t gv[8];
                memcpy(gv, IQ3XXS_GRID + 4 * qs[8 * g + 2 * i], 4);
                memcpy(gv + 4, IQ3XXS_GRID + 4 * qs[8 * g + 2 * i + 1], 4);
                signed8(gv, KSIGNS[(aux >> (7 * i)) & 127], 64, u + 32 * g + 8 * i);
            }
        }
        return;
    }
    case MDK_IQ3S: {
        float d = mdk_h2f(rd16(b));
        const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *sc = b + 106;
        for (int j = 0; j < 8; j++) D[j] = d * (float)(1 + 2 * ((sc[j >> 1] >> (4 * (j & 1))) & 15));
        for (int i = 0; i < 32; i++) {  /* 8 values: grid entries 2i and 2i + 1 */
            uint8_t gv[8];
            for (int h = 0; h < 2; h++) {
                int e = 2 * i + h;
                unsigned idx = qs[e] | ((qh[e >> 3] >> (e & 7)) & 1) << 8;
                memcpy(gv + 4 * h, IQ3S_GRID + 4 * idx, 4);
            }
            signed8(gv, signs[i], 16, u + 8 * i);
        }
        return;
    }
    case MDK_IQ1S: {
        float d = mdk_h2f(rd16(b));
        const uint8_t *qs = b + 2, *qh = b + 34;
        for (int g = 0; g < 8; g++) {
            unsigned h = rd16(qh + 2 * g);
            D[g] = d * (float)(2 * ((h >> 12) & 7) + 1);
            for (int i = 0; i < 4; i++)
                iq1_8(IQ1S_GRID + 8 * (qs[4 * g + i] | ((h >> (3 * i)) & 7) << 8), (h & 0x8000) != 0, u + 32 * g + 8 * i);
        }
        return;
    }
    case MDK_IQ1M: {
        const uint8_t *qs = b, *qh = b + 32, *sc = b + 48;
        unsigned s[4];
        for (int i = 0; i < 4; i++) s[i] = rd16(sc + 2 * i);
        float d = mdk_h2f((uint16_t)((s[0] & 0xF000) >> 12 | (s[1] & 0xF000) >> 8 | (s[2] & 0xF000) >> 4 | (s[3] & 0xF000)));
        for (int j = 0; j < 16; j++) D[j] = d * (float)(2 * ((s[j >> 2] >> (3 * (j & 3))) & 7) + 1);
        for (int i = 0; i < 32; i++) {
            unsigned nib = (qh[i >> 1] >> (4 * (i & 1))) & 15;
            iq1_8(IQ1S_GRID + 8 * (qs[i] | (nib & 7) << 8), (nib & 8) != 0, u + 8 * i);
        }
        return;
    }
    case MDK_TQ1_0: {
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        const uint8_t *qs = b, *qh = b + 48;
        D[0] = mdk_h2f(rd16(b + 52));
        for (int p = 0; p < 5; p++) {
            for (int l = 0; l < 32; l++) u[32 * p + l] = (uint8_t)(((unsigned)(uint8_t)(qs[l] * pow3[p]) * 3) >> 8);
            for (int l = 0; l < 16; l++) u[160 + 16 * p + l] = (uint8_t)(((unsigned)(uint8_t)(qs[32 + l] * pow3[p]) * 3) >> 8);
        }
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 4; l++) u[240 + 4 * p + l] = (uint8_t)(((unsigned)(uint8_t)(qh[l] * pow3[p]) * 3) >> 8);
        for (int g = 1; g < 8; g++) D[g] = D[0];
        return;
    }
    case MDK_NVFP4: {  /* gguf-py's ue4m3_to_fp32 (with its 0.5: the values are E2M1 doubled), exact in fp32 */
        static const int8_t KV[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        for (int j = 0; j < 4; j++) {
            unsigned x = b[j], e = (x >> 3) & 15, m = x & 7;
            float raw = e == 0 ? (float)m * 0x1p-9f : (1.f + (float)m / 8.f) * ldexpf(1.f, (int)e - 7);
            D[j] = (x == 0 || x == 0x7F) ? 0.f : raw * 0.5f;
            for (int i = 0; i < 8; i++) {
                uint8_t q = b[4 + 8 * j + i];
                u[16 * j + i] = (uint8_t)(KV[q & 15] + 12);
                u[16 * j + 8 + i] = (uint8_t)(KV[q >> 4] + 12);
            }
        }
        return;
    }
    case MDK_TQ2_0: {
        D[0] = mdk_h2f(rd16(b + 64));
        for (int e = 0; e < 256; e++) u[e] = (b[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3;
        for (int g = 1; g < 8; g++) D[g] = D[0];
        return;
    }
    default:
        return;
    }
}

/* Blocks of one row, dequantised in gguf-py's float order */
void mdk_codes_dequantize_row(int fmt, const uint8_t *row, int k, float *out) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    uint8_t u[256];
    float D[16], M[16];
    for (int b = 0; b < k / I->qk; b++) {
        mdk_codes_block(fmt, row + (size_t)b * I->bs, u, D, M);
        float *o = out + (size_t)b * I->qk;
        for (int e = 0; e < I->qk; e++) {
            int g = e / I->gs;
            if (fmt == MDK_Q2K) o[e] = D[g] * (float)u[e] - M[g];
            else if (I->mul != 1.f) o[e] = D[g] * ((float)((int)u[e] - I->off) * I->mul);
            else o[e] = D[g] * (float)((int)u[e] - I->off);
        }
    }
}

/* The product terms of one block: A[g] and B[g] (see the top) */
void mdk_codes_terms(int fmt, const float *D, const float *M, float *A, float *B) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    for (int g = 0; g < I->qk / I->gs; g++) {
        A[g] = D[g] * I->mul;
        B[g] = -(float)I->off * A[g] - (fmt == MDK_Q2K ? M[g] : 0.f);
    }
}

/* y[t] = one row times token a[t], t < nt (portable C: exact integer sums per group) */
void mdk_codes_row(int fmt, const uint8_t *row, int k, const mdk_q8 *const *a, int nt, float *y) {
    const mdk_codes_info *I = mdk_codes_info_of(fmt);
    uint8_t u[256];
    float D[16], M[16], A[16], B[16], acc[4] = {0.f, 0.f, 0.f, 0.f};
    int gs = I->gs;
    for (int b = 0; b < k / I->qk; b++) {
        mdk_codes_block(fmt, row + (size_t)b * I->bs, u, D, M);
        mdk_codes_terms(fmt, D, M, A, B);
        for (int t = 0; t < nt; t++) {
            const int8_t *x = a[t]->q + (size_t)b * I->qk;
            float part = 0.f;
            for (int g = 0; g < I->qk / gs; g++) {
                int s = 0, blk = (b * I->qk + g * gs) / 32;  /* the activation's block of 32 */
                for (int i = 0; i < gs; i++) s += u[g * gs + i] * x[g * gs + i];
                float sx = gs == 32 ? a[t]->sx[blk] : a[t]->sxh[(b * I->qk + g * gs) / 16];
                part += A[g] * a[t]->dx[blk] * (float)s + B[g] * sx;
            }
            acc[t] += part;
        }
    }
    for (int t = 0; t < nt; t++) y[t] = acc[t];
}
