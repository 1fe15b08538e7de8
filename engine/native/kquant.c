/* K-quant weights (GGUF's Q4_K, Q5_K, Q6_K: super-blocks of 256 weights) in the kernel's tiles,
 * their dequantisation, and their dot products with int8 activations (the portable C one here, the
 * AVX-512 VNNI and AVX2 ones in kquant_x86.c; kquant.h: the layout's offsets, shared); and the
 * generic mdk_wq_* entry points of every GGUF block format, which send the 32-weight formats to
 * qblock.c.
 *
 * The values (ggml's block_q4_K / q5_K / q6_K, as gguf/quants.py reads them):
 *   Q4_K  w = (d * sc_j) * q - (dmin * m_j), q in 0..15, j the sub-block of 32 (6-bit sc_j, m_j)
 *   Q5_K  the same with q in 0..31 (a fifth bit from qh)
 *   Q6_K  w = (d * sc_s) * (q - 32), q in 0..63, s the sub-block of 16 (int8 sc_s)
 *
 * Tiles: 16 rows x one super-block each (row tiles in order, super-blocks inside), built from the
 * raw rows at load. A tile holds exactly the bits of its 16 raw blocks, rearranged so that in an
 * integer dot product's 32-bit lanes, lane r is row r (as quant4.c's Q4 tiles; llama.cpp's repacked
 * GEMVs interleave rows for the same reason): a broadcast of 4 activation bytes multiplies 16 rows,
 * and the 16 rows' scales of a sub-block load as one vector. So the tiles are the raw bytes' size,
 * 4.5 / 5.5 / 6.5625 bits a weight, except that the last row tile is padded with zero rows to 16:
 * at most 15 rows a matrix (none in the models we know), and every kernel reads whole tiles.
 *   Q6_K first: its int8 scales, 256 B: byte 16s+r (the tile is read in one forward sweep: with the
 *          scales read between the sub-blocks Q6_K streamed at 16 GB/s from L3, Q4_K at 23)
 *   per sub-block j of 32 (Q6_K: 32-block), in order, 256 / 320 / 384 bytes:
 *     V0..V3 (64 B each): byte 4r+i of Vc holds row r's element 4c+i in its low nibble, element
 *          16+4c+i in its high one (quant4.c's order)
 *     Q5_K: then 64 B: byte 4r+i, bit c: fifth bit of element 4c+i; bit 4+c: of 16+4c+i
 *     Q6_K: then H0, H1 (64 B each): byte 4r+i, bits 2c..2c+1: the top two bits of element 4c+i
 *          (H0) / 16+4c+i (H1)
 *     (the high bits next to their nibbles: with them 2 KB apart, Q5_K and Q6_K streamed from RAM
 *     at 6-15 GB/s against Q4_K's 22-40 GB/s in the same runs, in cache at the same speed)
 *   d, dmin: 16 fp16 each (Q6_K: d only, at 3328. Its tile is 52.5 cache lines, so every other one
 *          starts mid-line: putting d first in those measured no faster, within the noise)
 *   Q4_K/Q5_K scales, 192 B = S0, S1, S2 (64 B each), byte 16j+r for j = 0..3:
 *          S0 = sc_j & 15 | (sc_{j+4} & 15) << 4;  S1: the same of m;
 *          S2 = sc_j >> 4 | (sc_{j+4} >> 4) << 2 | (m_j >> 4) << 4 | (m_{j+4} >> 4) << 6
 *          (four vector ops decode all 16 rows' 8 scales and minima to bytes)
 *
 * Dot products: activations are int8 per block of 32 (mdk_q8), which is a Q4_K/Q5_K sub-block, so
 * per sub-block sum(w x) = d dx sc_j sum(q xq) - dmin m_j sx. Q6_K's q - 32 uses the activation's
 * sums per 16 (s16): sum((q - 32) xq) = sum(q xq) - 32 s16, both halves of a 32-block summed in
 * integers before the one float multiply by dx.
 * Bit-exact dequantisation: the same float ops in numpy's order; no FMA contraction, since the
 * build is ISO C (-std=c11: GCC's -ffp-contract=off) and the SIMD code writes its FMAs explicitly.
 */
#include "kquant.h"

#include <string.h>

/* One row's super-block: q unsigned (Q6_K: 0..63, the weight is q - 32), sc[8] and m[8] (Q6_K: sc[16]) */
typedef struct { uint8_t q[256]; int sc[16], mn[8]; uint16_t d, dmin; } kq_fields;

static uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static void raw_fields(int fmt, const uint8_t *b, kq_fields *f) {
    memset(f, 0, sizeof *f);
    if (fmt == MDK_Q6K) {
        const uint8_t *ql = b, *qh = b + 128;
        for (int e = 0; e < 256; e++) {  /* half h of 128, chunk i of 32 in it, j in the chunk */
            int h = e >> 7, i = (e >> 5) & 3, j = e & 31;
            int lo = (ql[64 * h + 32 * (i & 1) + j] >> (4 * (i >> 1))) & 15, hi = (qh[32 * h + j] >> (2 * i)) & 3;
            f->q[e] = (uint8_t)(lo | hi << 4);
        }
        for (int s = 0; s < 16; s++) f->sc[s] = (int8_t)b[192 + s];
        f->d = rd16(b + 208);
        f->dmin = 0;
        return;
    }
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (fmt == MDK_Q5K ? 48 : 16);
    f->d = rd16(b);
    f->dmin = rd16(b + 2);
    for (int j = 0; j < 4; j++) {  /* gguf's Q4_K.get_scale_min */
        f->sc[j] = s[j] & 63;
        f->mn[j] = s[j + 4] & 63;
        f->sc[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4;
        f->mn[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
    for (int e = 0; e < 256; e++) {
        int j = e >> 5, l = e & 31;
        int q = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
        if (fmt == MDK_Q5K) q |= ((qh[l] >> j) & 1) << 4;
        f->q[e] = (uint8_t)q;
    }
}

static void raw_store(int fmt, const kq_fields *f, uint8_t *b) {  /* the inverse: every bit of b is a field's */
    memset(b, 0, (size_t)LAY(fmt)->raw);
    if (fmt == MDK_Q6K) {
        for (int e = 0; e < 256; e++) {
            int h = e >> 7, i = (e >> 5) & 3, j = e & 31;
            b[64 * h + 32 * (i & 1) + j] |= (uint8_t)((f->q[e] & 15) << (4 * (i >> 1)));
            b[128 + 32 * h + j] |= (uint8_t)((f->q[e] >> 4) << (2 * i));
        }
        for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)f->sc[s];
        memcpy(b + 208, &f->d, 2);
        return;
    }
    uint8_t *s = b + 4, *qh = b + 16, *qs = b + (fmt == MDK_Q5K ? 48 : 16);
    memcpy(b, &f->d, 2);
    memcpy(b + 2, &f->dmin, 2);
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(f->sc[j] | (f->sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(f->mn[j] | (f->mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((f->sc[j + 4] & 15) | (f->mn[j + 4] & 15) << 4);
    }
    for (int e = 0; e < 256; e++) {
        int j = e >> 5, l = e & 31;
        qs[32 * (j >> 1) + l] |= (uint8_t)((f->q[e] & 15) << (4 * (j & 1)));
        if (fmt == MDK_Q5K) qh[l] |= (uint8_t)(((f->q[e] >> 4) & 1) << j);
    }
}

/* Where element e (0..255) of row r lives in a tile: its nibble's byte and shift, and its high
 * bits' byte and shift (Q5_K: one bit, Q6_K: two) */
static void tile_pos(int fmt, int e, int r, int *nb, int *ns, int *hb, int *hs) {
    int j = e >> 5, el = e & 31, c = (el & 15) >> 2, i = el & 3, J = LAY(fmt)->qoff + LAY(fmt)->sub * j;
    *nb = J + 64 * c + 4 * r + i;
    *ns = el < 16 ? 0 : 4;
    if (fmt == MDK_Q5K) { *hb = J + 256 + 4 * r + i; *hs = el < 16 ? c : 4 + c; }
    else { *hb = J + 256 + (el < 16 ? 0 : 64) + 4 * r + i; *hs = 2 * c; }
}

static void tile_fields(int fmt, const uint8_t *t, int r, kq_fields *f) {
    const kq_layout *L = LAY(fmt);
    for (int e = 0; e < 256; e++) {
        int nb, ns, hb, hs;
        tile_pos(fmt, e, r, &nb, &ns, &hb, &hs);
        int q = (t[nb] >> ns) & 15;
        if (fmt == MDK_Q5K) q |= ((t[hb] >> hs) & 1) << 4;
        if (fmt == MDK_Q6K) q |= ((t[hb] >> hs) & 3) << 4;
        f->q[e] = (uint8_t)q;
    }
    f->d = rd16(t + L->doff + 2 * r);
    if (fmt == MDK_Q6K) {
        for (int s = 0; s < 16; s++) f->sc[s] = (int8_t)t[L->soff + 16 * s + r];
        f->dmin = 0;
        return;
    }
    f->dmin = rd16(t + L->moff + 2 * r);
    const uint8_t *s = t + L->soff;
    for (int j = 0; j < 4; j++) {
        int s0 = s[16 * j + r], s1 = s[64 + 16 * j + r], s2 = s[128 + 16 * j + r];
        f->sc[j] = (s0 & 15) | (s2 & 3) << 4;
        f->sc[j + 4] = (s0 >> 4) | ((s2 >> 2) & 3) << 4;
        f->mn[j] = (s1 & 15) | ((s2 >> 4) & 3) << 4;
        f->mn[j + 4] = (s1 >> 4) | ((s2 >> 6) & 3) << 4;
    }
}

static void tile_store(int fmt, uint8_t *t, int r, const kq_fields *f) {  /* ORs into a zeroed tile */
    const kq_layout *L = LAY(fmt);
    for (int e = 0; e < 256; e++) {
        int nb, ns, hb, hs;
        tile_pos(fmt, e, r, &nb, &ns, &hb, &hs);
        t[nb] |= (uint8_t)((f->q[e] & 15) << ns);
        if (fmt != MDK_Q4K) t[hb] |= (uint8_t)((f->q[e] >> 4) << hs);
    }
    memcpy(t + L->doff + 2 * r, &f->d, 2);
    if (fmt == MDK_Q6K) {
        for (int s = 0; s < 16; s++) t[L->soff + 16 * s + r] = (uint8_t)f->sc[s];
        return;
    }
    memcpy(t + L->moff + 2 * r, &f->dmin, 2);
    uint8_t *s = t + L->soff;
    for (int j = 0; j < 4; j++) {
        s[16 * j + r] = (uint8_t)((f->sc[j] & 15) | (f->sc[j + 4] & 15) << 4);
        s[64 + 16 * j + r] = (uint8_t)((f->mn[j] & 15) | (f->mn[j + 4] & 15) << 4);
        s[128 + 16 * j + r] = (uint8_t)((f->sc[j] >> 4) | (f->sc[j + 4] >> 4) << 2 | (f->mn[j] >> 4) << 4 |
                                        (f->mn[j + 4] >> 4) << 6);
    }
}

/* ---------------- layout: bytes, repack, unpack, dequantise ---------------- */
static int kq_shape_ok(int n, int k) { return n > 0 && k > 0 && k % 256 == 0; }

static size_t kq_bytes(int fmt, int n, int k) {
    if (!kq_shape_ok(n, k)) return 0;
    return (size_t)((n + 15) / 16) * (size_t)(k / 256) * (size_t)LAY(fmt)->tile;
}

static uint8_t *tile_at(int fmt, const uint8_t *t, int k, int r, int s) {  /* row r's tile, super-block s */
    return (uint8_t *)t + ((size_t)(r / 16) * (size_t)(k / 256) + (size_t)s) * (size_t)LAY(fmt)->tile;
}

static int kq_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *t) {
    if (!kq_shape_ok(n, k)) return -1;
    const kq_layout *L = LAY(fmt);
    int nsb = k / 256;
    kq_fields f;
    memset(t, 0, kq_bytes(fmt, n, k));
    for (int r = 0; r < n; r++)
        for (int s = 0; s < nsb; s++) {
            raw_fields(fmt, raw + ((size_t)r * nsb + s) * L->raw, &f);
            tile_store(fmt, tile_at(fmt, t, k, r, s), r % 16, &f);
        }
    return 0;
}

static int kq_unpack(int fmt, const uint8_t *t, int n, int k, uint8_t *raw) {
    if (!kq_shape_ok(n, k)) return -1;
    const kq_layout *L = LAY(fmt);
    int nsb = k / 256;
    kq_fields f;
    for (int r = 0; r < n; r++)
        for (int s = 0; s < nsb; s++) {
            tile_fields(fmt, tile_at(fmt, t, k, r, s), r % 16, &f);
            raw_store(fmt, &f, raw + ((size_t)r * nsb + s) * L->raw);
        }
    return 0;
}

/* out[r - r0][0..k) for rows r0..r1-1, in gguf/quants.py's float ops and order */
static void kq_dequantize(int fmt, const uint8_t *t, int n, int k, int r0, int r1, float *out) {
    if (!kq_shape_ok(n, k) || r0 < 0 || r1 > n) return;
    kq_fields f;
    for (int r = r0; r < r1; r++)
        for (int s = 0; s < k / 256; s++) {
            tile_fields(fmt, tile_at(fmt, t, k, r, s), r % 16, &f);
            float *o = out + (size_t)(r - r0) * k + 256 * s, d = mdk_h2f(f.d), dmin = mdk_h2f(f.dmin);
            if (fmt == MDK_Q6K) {
                for (int e = 0; e < 256; e++) o[e] = (d * (float)f.sc[e >> 4]) * (float)((int)f.q[e] - 32);
                continue;
            }
            for (int j = 0; j < 8; j++) {
                float ds = d * (float)f.sc[j], dm = dmin * (float)f.mn[j];
                for (int e = 32 * j; e < 32 * j + 32; e++) o[e] = ds * (float)f.q[e] - dm;
            }
        }
}

/* ---------------- 16 rows (one row tile) against nt tokens: y[t][16] ---------------- */
/* portable C (the SIMD kernels: kquant_x86.c) */
static void rows_c(int fmt, const uint8_t *tile, int nsb, const mdk_q8 *const *a, int nt, float *const *y) {
    const kq_layout *L = LAY(fmt);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 16; r++) y[t][r] = 0.f;
    for (int s = 0; s < nsb; s++) {
        const uint8_t *T = tile + (size_t)s * L->tile;
        for (int r = 0; r < 16; r++) {
            float d = mdk_h2f(rd16(T + L->doff + 2 * r)), dmin = fmt == MDK_Q6K ? 0.f : mdk_h2f(rd16(T + L->moff + 2 * r));
            float part[4] = {0}, mins[4] = {0};
            for (int j = 0; j < 8; j++) {
                const uint8_t *Q = T + L->qoff + L->sub * j;
                int lo[4] = {0}, hi[4] = {0}, b = 8 * s + j;
                for (int c = 0; c < 4; c++)
                    for (int i = 0; i < 4; i++) {
                        int byte = Q[64 * c + 4 * r + i], ql = byte & 15, qh = byte >> 4;
                        if (fmt == MDK_Q5K) {
                            int h = Q[256 + 4 * r + i];
                            ql |= ((h >> c) & 1) << 4;
                            qh |= ((h >> (4 + c)) & 1) << 4;
                        } else if (fmt == MDK_Q6K) {
                            ql |= ((Q[256 + 4 * r + i] >> (2 * c)) & 3) << 4;
                            qh |= ((Q[320 + 4 * r + i] >> (2 * c)) & 3) << 4;
                        }
                        for (int t = 0; t < nt; t++) {
                            const int8_t *x = a[t]->q + 32 * b;
                            lo[t] += ql * x[4 * c + i];
                            hi[t] += qh * x[16 + 4 * c + i];
                        }
                    }
                for (int t = 0; t < nt; t++) {
                    if (fmt == MDK_Q6K) {
                        int v = (int8_t)T[32 * j + r] * (lo[t] - 32 * a[t]->s16[2 * b]) +
                                (int8_t)T[32 * j + 16 + r] * (hi[t] - 32 * a[t]->s16[2 * b + 1]);
                        part[t] += (float)v * a[t]->dx[b];
                    } else {
                        int sc, mn;
                        scale_min(T + L->soff, r, j, &sc, &mn);
                        part[t] += (float)(sc * (lo[t] + hi[t])) * a[t]->dx[b];
                        mins[t] += (float)mn * a[t]->sx[b];
                    }
                }
            }
            for (int t = 0; t < nt; t++) y[t][r] += d * part[t] - dmin * mins[t];
        }
    }
}

/* rows r0..r1-1 (r0 % 16 == 0) against nt tokens (1..4): y[t][r - r0] */
static void kq_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    int fmt = w->fmt, nsb = w->k / 256;
    const uint8_t *base = (const uint8_t *)w->w;
    float tmp[4][16];
    for (int r = r0; r < r1; r += 16) {
        const uint8_t *tile = base + (size_t)(r / 16) * nsb * LAY(fmt)->tile;
        int n = r1 - r < 16 ? r1 - r : 16;
        float *dst[4];
        for (int t = 0; t < nt; t++) dst[t] = n == 16 ? y[t] + (r - r0) : tmp[t];
#if MDK_X86
        if (mdk_path == MDK_PATH_AVX512) mdk_kq512[fmt - MDK_Q4K][nt - 1](tile, nsb, a, dst);
        else if (mdk_path == MDK_PATH_AVX2)
            for (int t = 0; t < nt; t++) mdk_kq_rows_avx2(fmt, tile, nsb, a[t], dst[t]);
        else
#endif
            rows_c(fmt, tile, nsb, a, nt, dst);
        if (n < 16)
            for (int t = 0; t < nt; t++) memcpy(y[t] + (r - r0), tmp[t], (size_t)n * 4);
    }
}

static void kq_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    kq_rows_multi(w, r0, r1, &a, 1, &y);
}

/* ---------------- the generic entry points of every GGUF block format ---------------- */
MDK_API size_t mdk_wq_bytes(int fmt, int n, int k) {
    if (MDK_IS_QB(fmt)) return mdk_qb_bytes(fmt, n, k);
    if (MDK_IS_KQ(fmt)) return kq_bytes(fmt, n, k);
    return 0;
}

MDK_API int mdk_wq_pack(int fmt, const uint8_t *raw, int n, int k, uint8_t *tiles) {
    if (MDK_IS_QB(fmt)) return mdk_qb_pack(fmt, raw, n, k, tiles);
    if (MDK_IS_KQ(fmt)) return kq_pack(fmt, raw, n, k, tiles);
    return -1;
}

MDK_API int mdk_wq_unpack(int fmt, const uint8_t *tiles, int n, int k, uint8_t *raw) {
    if (MDK_IS_QB(fmt)) return mdk_qb_unpack(fmt, tiles, n, k, raw);
    if (MDK_IS_KQ(fmt)) return kq_unpack(fmt, tiles, n, k, raw);
    return -1;
}

MDK_API void mdk_wq_dequantize(int fmt, const uint8_t *tiles, int n, int k, int r0, int r1, float *out) {
    if (MDK_IS_QB(fmt)) mdk_qb_dequantize(fmt, tiles, n, k, r0, r1, out);
    else if (MDK_IS_KQ(fmt)) kq_dequantize(fmt, tiles, n, k, r0, r1, out);
}

void mdk_wq_rows(const mdk_matrix *w, int r0, int r1, const mdk_q8 *a, float *y) {
    if (w->raw) mdk_raw_rows_multi(w, r0, r1, &a, 1, &y);  /* the file's rows (kraw.c) */
    else if (MDK_IS_Q4(w->fmt)) mdk_q4_rows(w, r0, r1, a, y);
    else if (MDK_IS_QB(w->fmt)) mdk_qb_rows(w, r0, r1, a, y);
    else kq_rows(w, r0, r1, a, y);
}

void mdk_wq_rows_multi(const mdk_matrix *w, int r0, int r1, const mdk_q8 *const *a, int nt, float *const *y) {
    if (w->raw) mdk_raw_rows_multi(w, r0, r1, a, nt, y);
    else if (MDK_IS_Q4(w->fmt)) mdk_q4_rows_multi(w, r0, r1, a, nt, y);
    else if (MDK_IS_QB(w->fmt)) mdk_qb_rows_multi(w, r0, r1, a, nt, y);
    else kq_rows_multi(w, r0, r1, a, nt, y);
}
