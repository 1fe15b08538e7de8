/* Scalar conversions between fp32, fp16 and bf16 (round to nearest even), and whole rows. */
#include "mdk.h"

#include <string.h>

float mdk_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t mdk_f2h(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - exp;
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)exp << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++; /* may carry into the exponent: correct */
    return (uint16_t)(sign | r);
}

void mdk_load_row(int fmt, const void *src, float *dst, int n) {
    if (fmt == MDK_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (fmt == MDK_F16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int i = 0; i < n; i++) dst[i] = mdk_h2f(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int i = 0; i < n; i++) dst[i] = mdk_bf2f(s[i]);
    }
}

void mdk_store_row(int fmt, const float *src, void *dst, int n) {
    if (fmt == MDK_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (fmt == MDK_F16) {
        uint16_t *d = (uint16_t *)dst;
        for (int i = 0; i < n; i++) d[i] = mdk_f2h(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int i = 0; i < n; i++) d[i] = mdk_f2bf(src[i]);
    }
}
