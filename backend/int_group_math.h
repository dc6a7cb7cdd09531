// The int_group quantizer's arithmetic, shared by the CPU op, the cache codec's
// encode/decode and (through CLLA_HD) CUDA kernels, so every path gives the same bits.
//
// Symmetric b-bit codes in [-Imax, Imax], Imax = 2^(b-1) - 1. The CLLA paper prints the
// range as [-(2^(b-1)-1), 2^b-1]; that upper bound is a typo for a symmetric quantizer
// (2^b - 1 codes above zero would need b+1 bits), so we use the symmetric range.
// Rounding: to nearest, ties to even (rintf in the default rounding mode).
#ifndef CLLA_BACKEND_INT_GROUP_MATH_H
#define CLLA_BACKEND_INT_GROUP_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CLLA_HD __host__ __device__
#else
#define CLLA_HD
#endif

static inline CLLA_HD int int_group_imax(int bits) { return (1 << (bits - 1)) - 1; }

// Smallest bf16 value >= x (x >= 0, finite): the stored scale. Returned as fp32 bits.
static inline CLLA_HD float bf16_round_up(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (u & 0xffffu) u = (u & 0xffff0000u) + 0x10000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

// One step of a group's max |x|, NaN kept (fmaxf would drop it, and a NaN among finite values
// then decoded to a finite number, a different one in the cache than in the round trip).
static inline CLLA_HD float int_group_absmax_step(float acc, float x) {
    const float a = fabsf(x);
    return a > acc || a != a ? a : acc;
}

// Largest bf16 value <= x (x >= 0, finite).
static inline CLLA_HD float bf16_round_down(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

// Scale of a group from its max |x|: bf16 rounded up, so |x / scale| <= Imax. 0 for a zero group;
// NaN or inf (a group holding one) stays so. A finite group near the top of the float range
// (absmax / Imax rounding up past FLT_MAX / Imax) gets the largest bf16 scale whose Imax x scale
// is finite, its largest values then clamped to Imax: it decoded to inf, or at 2 bits (a scale
// of inf and codes of 0) to NaN, as if the group had held one.
static inline CLLA_HD float int_group_scale(float absmax, int bits) {
    if (!(absmax > 0.0f)) return absmax == 0.0f ? 0.0f : absmax;
    const float imax = (float)int_group_imax(bits), s = bf16_round_up(absmax / imax);
    const float top = bf16_round_down(3.40282346638528859812e+38f / imax);   // FLT_MAX / Imax, in bf16
    return absmax <= 3.40282346638528859812e+38f && s > top ? top : s;
}

// Code of one value given its group's scale: 0 when the group is all zeros, and when its scale is
// not finite (a group holding a NaN or an inf), so that every value of that group decodes to
// code * scale = NaN in every path, instead of converting a NaN to int (undefined).
static inline CLLA_HD int int_group_code(float x, float scale, int bits) {
    if (!(scale > 0.0f) || isinf(scale)) return 0;
    int imax = int_group_imax(bits);
    float q = rintf(x / scale);
    if (q > (float)imax) q = (float)imax;
    if (q < (float)-imax) q = (float)-imax;
    return (int)q;
}

#endif
