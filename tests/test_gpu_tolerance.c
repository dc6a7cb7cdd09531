// The GPU op tests' one-rounding tolerance (tests/gpu/tolerance.h, TOL_ROUND) on the CPU: what a
// correct CUDA op does passes it, one extra bf16 rounding fails it.
//
// For each op the reference is the fp32 CPU op (layers/) on bf16 inputs, as in
// tests/gpu/test_gpu_ops.c. "faithful" stands for a correct CUDA op: the same value computed in
// another fp32 order (or formula), rounded to bf16 once. "extra" injects one more rounding where a
// kernel could slip one in: silu(gate) stored as bf16 before the product (swiglu); split-K
// partial sums reduced in bf16 (matmul forward: what cuBLASLt's output-type reduction would do,
// kernels/cuda_matmul.cu forbids it); the update rounded before the "+=" (matmul backward dinp).
// faithful must pass (err/tol <= 1) and extra must fail (err/tol > 1). The attention bounds are
// looser on purpose (the kernels round P and dS inside) and are not the subject here.
// matmul_residual_forward's rounding is checked exactly instead (tests/gpu/rounding_case.h): the
// cpu-bf16 emulation must give one rounding of residual + product on every element, on inputs
// where a rounding of the product first changes some.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/bf16.h"
#include "common/rng.h"
#include "tests/gpu/rounding_case.h"
#include "tests/gpu/tolerance.h"
#include "tests/lib/check.h"

static float bf(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)); }

static float *bf16_uniform(size_t n, double lo, double hi, Rng *r) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = bf((float)(lo + (hi - lo) * rng_uniform(r)));
    return x;
}

static void verdict(const char *op, const float *ref, const float *faithful, const float *extra, size_t n) {
    size_t i1, i2;
    double r1 = tol_ratio(ref, faithful, n, TOL_ROUND, &i1), r2 = tol_ratio(ref, extra, n, TOL_ROUND, &i2);
    printf("%-44s one rounding err/tol %.3f | one extra rounding err/tol %.3f\n", op, r1, r2);
    CHECK(r1 <= 1.0, "%s: a single rounding exceeds TOL_ROUND (%.3f at %zu)", op, r1, i1);
    CHECK(r2 > 1.0, "%s: an extra rounding passes TOL_ROUND (%.3f)", op, r2);
}

int main(void) {
    const Backend *cpu = backend_cpu();
    Rng r;
    rng_seed(&r, 11);

    // swiglu: out = silu(g) u
    {
        const size_t n = 100003;
        float *g = bf16_uniform(n, -6, 6, &r), *u = bf16_uniform(n, -2, 2, &r);
        float *ref = malloc(n * sizeof(float)), *f = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
        cpu->swiglu_forward(ref, g, u, 1, (int)n, (int)n);
        for (size_t i = 0; i < n; i++) {
            float s = g[i] * (1.0f / (1.0f + expf(-g[i])));   // another formula for silu
            f[i] = bf(s * u[i]);
            x[i] = bf(bf(s) * u[i]);
        }
        verdict("swiglu_forward (silu stored as bf16)", ref, f, x, n);
        free(g); free(u); free(ref); free(f); free(x);
    }
    // matmul forward: out (N, OC) = inp (N, C) W^T
    {
        const int N = 64, C = 1024, OC = 512;
        float *in = bf16_uniform((size_t)N * C, -1, 1, &r), *w = bf16_uniform((size_t)OC * C, -1, 1, &r);
        float *ref = malloc((size_t)N * OC * sizeof(float)), *f = malloc((size_t)N * OC * sizeof(float));
        float *x = malloc((size_t)N * OC * sizeof(float));
        cpu->matmul_forward(ref, in, w, N, C, OC);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) {
                float lo = 0.0f, hi = 0.0f;   // fp32, in reverse order and in two halves
                for (int c = C / 2 - 1; c >= 0; c--) lo += in[(size_t)i * C + c] * w[(size_t)o * C + c];
                for (int c = C - 1; c >= C / 2; c--) hi += in[(size_t)i * C + c] * w[(size_t)o * C + c];
                f[(size_t)i * OC + o] = bf(lo + hi);
                x[(size_t)i * OC + o] = bf(bf(lo) + bf(hi));
            }
        verdict("matmul_forward (split-K reduced in bf16)", ref, f, x, (size_t)N * OC);
        // backward dinp += dout W: old values in bf16, the update in fp32
        float *dout = bf16_uniform((size_t)N * OC, -1, 1, &r), *old = bf16_uniform((size_t)N * C, -4, 4, &r);
        float *dref = malloc((size_t)N * C * sizeof(float)), *df = malloc((size_t)N * C * sizeof(float));
        float *dx = malloc((size_t)N * C * sizeof(float)), *upd = calloc((size_t)N * C, sizeof(float));
        for (size_t i = 0; i < (size_t)N * C; i++) dref[i] = old[i];
        cpu->matmul_backward(dref, NULL, dout, in, w, N, C, OC);   // ref: old + update, fp32
        cpu->matmul_backward(upd, NULL, dout, in, w, N, C, OC);    // the update alone
        for (size_t i = 0; i < (size_t)N * C; i++) {
            df[i] = bf(old[i] + upd[i]);
            dx[i] = bf(old[i] + bf(upd[i]));
        }
        verdict("matmul_backward dinp (update rounded before +=)", dref, df, dx, (size_t)N * C);
        free(in); free(w); free(ref); free(f); free(x); free(dout); free(old); free(dref); free(df); free(dx); free(upd);
    }
    // matmul_residual_forward: cpu-bf16 rounds residual + product once, bit for bit
    {
        const int N = 300, C = 72, OC = 40;
        float *in = malloc((size_t)N * C * sizeof(float)), *w = malloc((size_t)OC * C * sizeof(float));
        float *res = malloc((size_t)N * OC * sizeof(float)), *out = malloc((size_t)N * OC * sizeof(float));
        float *once = malloc((size_t)N * OC * sizeof(float)), *twice = malloc((size_t)N * OC * sizeof(float));
        rounding_case_fill(in, w, res, N, C, OC, 7);
        const size_t visible = rounding_case_expect(once, twice, in, w, res, N, C, OC);
        backend_cpu_bf16()->matmul_residual_forward(out, res, in, w, N, C, OC);
        size_t same = 0;
        for (size_t i = 0; i < (size_t)N * OC; i++) same += out[i] == once[i];
        printf("%-44s %zu of %zu elements tell one rounding from two; cpu-bf16 equals one rounding on %zu\n",
               "matmul_residual_forward (rounds once)", visible, (size_t)N * OC, same);
        CHECK(visible > 0, "matmul_residual_forward: no element tells one rounding from two");
        CHECK(same == (size_t)N * OC, "matmul_residual_forward: cpu-bf16 is not one rounding on %zu elements",
              (size_t)N * OC - same);
        free(in); free(w); free(res); free(out); free(once); free(twice);
    }
    printf("test_gpu_tolerance: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
