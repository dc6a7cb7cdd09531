// The tolerances of the GPU op tests (tests/gpu/test_gpu_ops.c), and the check they make, shared
// with tests/test_gpu_tolerance.c, which shows on the CPU that each bound admits what the CUDA
// op is meant to do and refuses one extra bf16 rounding (docs/GPU.md, "Tolerances").
//
// Per element, ref = the fp32 CPU op's value on the same bf16 inputs, M = max |ref| over the
// tensor:   |gpu - ref| <= atol * M + rtol * |ref|
//
// The rounding-placement argument. bf16 keeps 8 significant bits, so rounding to nearest moves a
// value x by at most 2^-8 |x|. An op that computes in fp32 and rounds its output once gives
// gpu = bf16(ref + d), where d is the fp32 difference of summation order, fma contraction or
// libm (|d| ~ 2^-24 per term, about 10^-5 of M for the sums below); so
//     |gpu - ref| <= 2^-8 |ref + d| + |d| <= 2^-8 |ref| + 2 |d|.
// TOL_ROUND is that bound: rtol 2^-8 (+ 2^-16 for d relative to the value), atol 2^-16 (d
// relative to the tensor). A second rounding anywhere on the path (a bf16 intermediate, a split-K
// partial sum reduced in bf16, an update rounded before it is added) adds up to 2^-8 of the
// intermediate, which exceeds this bound on some element of any tensor of a few thousand values.
// The looser bounds are for ops whose CUDA kernels round inside on purpose (attention's P and
// dS), or whose inputs already differ by a rounding (a sum of two rounded values).
#ifndef CLLA_TESTS_GPU_TOLERANCE_H
#define CLLA_TESTS_GPU_TOLERANCE_H

#include <math.h>
#include <stddef.h>

typedef struct Tol { double atol, rtol; } Tol;
// one bf16 rounding of an fp32 result (elementwise ops, norms, rope, copies, matmul outputs,
// "+=" into a bf16 buffer: cuBLASLt reads C, adds in fp32 and rounds once)
static const Tol TOL_ROUND = {0x1p-16, 0x1p-8 + 0x1p-16};
// sums whose terms are already rounded or that cancel (norm and loss backwards, MoE combine,
// attention forward with bf16 P inside the P V product, accumulate of two rounded values)
static const Tol TOL_SUM = {1e-2, 0x1p-7};
// attention backward: dS and P enter the gradient products as bf16 (a rounding inside a
// cancelling sum)
static const Tol TOL_ATTBWD = {3e-2, 0x1p-6};
// fp32 outputs computed from the same bf16 inputs (rstd, lse, losses, weight gradients):
// summation order only
static const Tol TOL_F32 = {1e-5, 1e-4};
// the fp32 optimizer (same formula, fma contraction only)
static const Tol TOL_OPT = {1e-6, 1e-6};

// The worst |got - ref| / (atol M + rtol |ref|) over n values (0 when equal; > 1 fails; INFINITY
// on a NaN or infinity mismatch). *worst_i: where.
static inline double tol_ratio(const float *ref, const float *got, size_t n, Tol tol, size_t *worst_i) {
    double m = 0.0, worst = 0.0;
    *worst_i = 0;
    for (size_t i = 0; i < n; i++) if (fabs(ref[i]) > m) m = fabs(ref[i]);
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i]) || isinf(got[i]) != isinf(ref[i])) { *worst_i = i; return INFINITY; }
        const double d = fabs((double)got[i] - (double)ref[i]);
        const double lim = tol.atol * m + tol.rtol * fabs(ref[i]);
        const double r = lim > 0.0 ? d / lim : (d > 0.0 ? INFINITY : 0.0);
        if (r > worst) { worst = r; *worst_i = i; }
    }
    return worst;
}

#endif
