/* Eight float lanes for the quantisers' searches (kquantize.c, kquantize_low.c).
 * The searches fit 8 sub-blocks at once, one a lane. With GCC / Clang a lane set is a vector type
 * (AVX2 where the including function is built for it, two SSE2 halves otherwise): written with plain
 * scalar selects, the compiler turned the loops into branches. Elsewhere (MSVC) it is a plain array.
 * Either way each lane does exactly the scalar float operations, so the bytes do not depend on the
 * build. Include after mdk.h, <math.h> and <string.h>. */
#ifndef MDK_LANES_H
#define MDK_LANES_H
#if defined(__GNUC__) || defined(__clang__)
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  /* vf never crosses a call: everything here is inlined */
#endif
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vm __attribute__((vector_size(32)));  /* a mask: all ones or zero a lane */
static MDK_INLINE vf vb(float s) { vf v = {s, s, s, s, s, s, s, s}; return v; }
static MDK_INLINE vf vadd(vf a, vf b) { return a + b; }
static MDK_INLINE vf vsub(vf a, vf b) { return a - b; }
static MDK_INLINE vf vmul(vf a, vf b) { return a * b; }
static MDK_INLINE vf vdiv(vf a, vf b) { return a / b; }
static MDK_INLINE vm vlt(vf a, vf b) { return a < b; }
static MDK_INLINE vm vand(vm a, vm b) { return a & b; }
static MDK_INLINE vf vsel(vm m, vf a, vf b) { return (vf)(((vm)a & m) | ((vm)b & ~m)); }
static MDK_INLINE vf vabs(vf a) { return (vf)((vm)a & 0x7fffffff); }
static MDK_INLINE vf vneg(vf a) { return (vf)((vm)a ^ (int32_t)0x80000000); }
#else
typedef struct { float v[8]; } vf;
typedef struct { int v[8]; } vm;
#define LANEWISE(T, expr) { T r; for (int j = 0; j < 8; j++) r.v[j] = (expr); return r; }
static MDK_INLINE vf vb(float s) LANEWISE(vf, s)
static MDK_INLINE vf vadd(vf a, vf b) LANEWISE(vf, a.v[j] + b.v[j])
static MDK_INLINE vf vsub(vf a, vf b) LANEWISE(vf, a.v[j] - b.v[j])
static MDK_INLINE vf vmul(vf a, vf b) LANEWISE(vf, a.v[j] * b.v[j])
static MDK_INLINE vf vdiv(vf a, vf b) LANEWISE(vf, a.v[j] / b.v[j])
static MDK_INLINE vm vlt(vf a, vf b) LANEWISE(vm, a.v[j] < b.v[j] ? -1 : 0)
static MDK_INLINE vm vand(vm a, vm b) LANEWISE(vm, a.v[j] & b.v[j])
static MDK_INLINE vf vsel(vm m, vf a, vf b) LANEWISE(vf, m.v[j] ? a.v[j] : b.v[j])
static MDK_INLINE vf vabs(vf a) LANEWISE(vf, fabsf(a.v[j]))
static MDK_INLINE vf vneg(vf a) LANEWISE(vf, -a.v[j])
#endif
static MDK_INLINE vf vld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static MDK_INLINE void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }
static MDK_INLINE vf vrnd(vf v) { return vsub(vadd(v, vb(12582912.f)), vb(12582912.f)); }  /* round half even */
static MDK_INLINE vf vclamp(vf v, vf lo, vf hi) { v = vsel(vlt(v, lo), lo, v); return vsel(vlt(hi, v), hi, v); }

/* The weighted least-squares scale ts and minimum tm of x ~ ts * L + tm over n elements of levels L
 * (sw, sx: the sums of the weights and of weight * x), as llama.cpp's make_qkx2/3_quants refit it: a
 * positive minimum refits the scale alone with minimum 0. The lanes whose system is singular: 0 in
 * the mask returned (their ts, tm are not to be taken). */
static MDK_INLINE vm lsq_scale_min(const vf *xt, const vf *wt, const vf *L, int n, vf sw, vf sx, vf *ts, vf *tm) {
    vf zero = vb(0.f), sl = zero, sl2 = zero, sxl = zero;
    for (int i = 0; i < n; i++) {
        vf wl = vmul(wt[i], L[i]);
        sl = vadd(sl, wl);
        sl2 = vadd(sl2, vmul(wl, L[i]));
        sxl = vadd(sxl, vmul(wl, xt[i]));
    }
    vf D = vsub(vmul(sw, sl2), vmul(sl, sl));
    vm ok = vlt(zero, D);
    vf Ds = vsel(ok, D, vb(1.f));
    vf a = vdiv(vsub(vmul(sw, sxl), vmul(sx, sl)), Ds), b = vdiv(vsub(vmul(sl2, sx), vmul(sl, sxl)), Ds);
    vm pos = vlt(zero, b);
    *ts = vsel(pos, vdiv(sxl, vsel(vlt(zero, sl2), sl2, vb(1.f))), a);
    *tm = vsel(pos, zero, b);
    return ok;
}
#endif
