// Inputs on which the place of a bf16 rounding in "out = residual + inp @ W^T" shows bit for bit,
// whatever order a GEMM sums in (tests/gpu/test_gpu_ops.c on the device, tests/test_gpu_tolerance.c
// on the CPU; docs/GPU.md, "Tolerances").
//
// inp (N, C): row n holds one nonzero, a bf16 value in [1, 2), at column n % C; W (OC, C) and the
// residual (N, OC) are bf16, W in [1, 2], the residual in [-8, 8]. Each product of two 8-bit
// significands is exact in fp32, the zeros add nothing, and residual + product is exact too (every
// term a multiple of 2^-15, the sum below 16 in magnitude: 19 bits of fp32's 24): an op that
// rounds once returns bf16(r + p) in any summation order, one that rounds the product first
// returns bf16(r + bf16(p)), and the two differ on about a quarter of the elements.
#ifndef CLLA_TESTS_GPU_ROUNDING_CASE_H
#define CLLA_TESTS_GPU_ROUNDING_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/bf16.h"

static inline float rounding_case_bf16(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)); }

// uniform in [lo, hi), rounded to bf16 (splitmix64 on *state)
static inline float rounding_case_value(uint64_t *state, float lo, float hi) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return rounding_case_bf16(lo + (hi - lo) * (float)((double)(z >> 11) * (1.0 / 9007199254740992.0)));
}

// inp (N, C), w (OC, C), residual (N, OC), as above
static inline void rounding_case_fill(float *inp, float *w, float *residual, int N, int C, int OC, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)N * C; i++) inp[i] = 0.0f;
    for (int n = 0; n < N; n++) inp[(size_t)n * C + n % C] = rounding_case_value(&s, 1.0f, 2.0f);
    for (size_t i = 0; i < (size_t)OC * C; i++) w[i] = rounding_case_value(&s, 1.0f, 2.0f);
    for (size_t i = 0; i < (size_t)N * OC; i++) residual[i] = rounding_case_value(&s, -8.0f, 8.0f);
}

// once (N, OC) = bf16(r + p), twice = bf16(r + bf16(p)); returns how many elements differ
static inline size_t rounding_case_expect(float *once, float *twice, const float *inp, const float *w,
                                          const float *residual, int N, int C, int OC) {
    size_t differ = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            const size_t i = (size_t)n * OC + o;
            const float p = inp[(size_t)n * C + n % C] * w[(size_t)o * C + n % C];
            once[i] = rounding_case_bf16(residual[i] + p);
            twice[i] = rounding_case_bf16(residual[i] + rounding_case_bf16(p));
            differ += once[i] != twice[i];
        }
    return differ;
}

#endif
