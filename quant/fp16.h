// IEEE binary16 conversions for the quantizers' stored constants (CQ codebooks, QET codebook
// minimum and step at a = 16): the papers store them as fp16, so the fitted values are rounded
// to fp16 before any code is chosen and the encoder sees exactly what the decoder will.
#ifndef CLLA_QUANT_FP16_H
#define CLLA_QUANT_FP16_H

#include <stdint.h>
#include <string.h>

// Round to nearest, ties to even; beyond the fp16 range gives +-inf, NaN stays NaN.
static inline uint16_t fp16_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);        // rounds past 65504
    if (ax < 0x38800000u) {                                           // fp16 subnormal or zero
        if (ax < 0x33000000u) return sign;                            // below half the smallest
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        int shift = (int)(126 - e);                                    // value / 2^-24 = m 2^(e-126)
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10)), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static inline float fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        if (m == 0) x = sign;
        else {                                                        // subnormal: normalize
            e = 113;
            while (!(m & 0x400u)) { m <<= 1; e--; }
            x = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline float fp16_round(float f) { return fp16_to_float(fp16_from_float(f)); }

#endif
