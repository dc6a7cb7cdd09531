// bf16 conversions and the stochastic-rounding hash, shared by host C and CUDA device code.
//
// The CUDA backend writes its bf16 weight copies from the fp32 masters with stochastic
// rounding: element i of a store_weights(dst, master, n, seed) call is rounded with the
// 32-bit value sr_hash32(seed, i). The hash depends only on (seed, i), never on the launch
// configuration, so the host can predict every rounded bit (tests/test_sr_hash.c, and a
// CPU bf16-emulation mode later).
//
// Plain C11 when included from C; every function is __host__ __device__ under nvcc.
#ifndef CLLA_BACKEND_BF16_H
#define CLLA_BACKEND_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SR_HD __host__ __device__
#else
#define SR_HD
#endif

// The bits of an fp32 value and back (memcpy: well defined in C and C++, folded by compilers).
static inline SR_HD uint32_t sr_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

static inline SR_HD float sr_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// The splitmix64 finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits whose output
// bits each depend on every input bit.
static inline SR_HD uint64_t sr_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// 32 random bits for element `index` of a stream named by `seed`. The seed is mixed first,
// so nearby seeds (step s and s + 1) give unrelated streams; then the index is added as a
// Weyl sequence and mixed again (counter-based: no state, any element in any order).
static inline SR_HD uint32_t sr_hash32(uint64_t seed, uint64_t index) {
    const uint64_t z = sr_mix64(seed + 0x9E3779B97F4A7C15ull) + (index + 1) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(sr_mix64(z) >> 32);
}

// bf16 (as its 16 bits) -> fp32: exact.
static inline SR_HD float sr_bf16_to_f32(uint16_t h) {
    return sr_bits_f32((uint32_t)h << 16);
}

// fp32 -> bf16 bits, round to nearest, ties to even (what __float2bfloat16 does). NaN stays
// a (quiet) NaN; values beyond the bf16 range round to +-inf.
static inline SR_HD uint16_t sr_f32_to_bf16_rne(float x) {
    const uint32_t u = sr_f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) {               // inf or NaN: truncate, keep NaN a NaN
        return (uint16_t)((u >> 16) | ((u & 0x007FFFFFu) ? 0x0040u : 0u));
    }
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// fp32 -> bf16 bits, stochastic rounding with 32 random bits r (the low 16 are used): the
// magnitude rounds up with probability (dropped 16 bits) / 65536, so E[result] = x exactly
// for every finite x whose rounding up stays finite. Sign-magnitude format: adding to the
// low bits moves away from zero for either sign, so the rule is symmetric. A magnitude
// above the largest finite bf16 may round up to inf (as the next representable step).
// NaN and inf are truncated as in the nearest rounding.
static inline SR_HD uint16_t sr_f32_to_bf16_sr(float x, uint32_t r) {
    const uint32_t u = sr_f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) {
        return (uint16_t)((u >> 16) | ((u & 0x007FFFFFu) ? 0x0040u : 0u));
    }
    return (uint16_t)((u + (r & 0xFFFFu)) >> 16);
}

// Element i of store_weights(dst, master, n, seed): the value the CUDA backend stores.
static inline SR_HD uint16_t sr_round_weight(float x, uint64_t seed, uint64_t i) {
    return sr_f32_to_bf16_sr(x, sr_hash32(seed, i));
}

#undef SR_HD
#endif
