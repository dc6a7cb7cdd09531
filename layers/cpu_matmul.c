// Linear layer without bias, PyTorch weight layout: out = inp @ weight^T.
// All three products are single sgemm calls; OpenBLAS threads them itself (we are outside
// any OpenMP region here, so its OpenMP build uses the whole pool).
#include "layers/cpu_ops.h"

#include <cblas.h>
#include <stddef.h>

// A few rows (decoding: one token per sequence): OpenBLAS's sgemm packs the whole weight for
// them and ran 5-10x slower than reading it once (bench/bench_decode.c, OpenBLAS 0.3.21). Here
// each weight row is read once and dotted with every input row while it is in cache; rows of the
// output are split over the threads. 32 independent accumulators per dot (a fixed order) let the
// compiler vectorize without reassociating and keep four vector add chains in flight.
#define SMALL_N 16

static float dot32(const float *restrict a, const float *restrict b, int n) {
    float acc[32] = {0};
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        #pragma omp simd
        for (int j = 0; j < 32; j++) acc[j] += a[i + j] * b[i + j];
    }
    for (; i < n; i++) acc[0] += a[i] * b[i];
    for (int w = 16; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static void matmul_few_rows(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    #pragma omp parallel for schedule(static) if ((size_t)OC * C >= ((size_t)1 << 15))
    for (int o = 0; o < OC; o++) {
        const float *w = weight + (size_t)o * C;
        for (int n = 0; n < N; n++) out[(size_t)n * OC + o] = dot32(inp + (size_t)n * C, w, C);
    }
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {   // empty reduction: sgemm would reject lda = 0; the product is zero
        for (size_t i = 0; i < (size_t)N * OC; i++) out[i] = 0.0f;
        return;
    }
    if (N <= SMALL_N) {
        matmul_few_rows(out, inp, weight, N, C, OC);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, weight, C, 0.0f, out, OC);
}

// dinp (N, C) += dout (N, OC) @ weight (OC, C)
// dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
// beta = 1 gives the accumulate semantics for free. Either output may be NULL: the
// first layer's input (embedding output) still needs dinp, but e.g. a frozen or input-side
// consumer may skip it.
void cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;   // every product is empty: += 0
    if (dinp && N <= 4) {   // a few rows: matrix-vector products, as in the forward
        for (int n = 0; n < N; n++)
            cblas_sgemv(CblasRowMajor, CblasTrans, OC, C, 1.0f, weight, C, dout + (size_t)n * OC, 1, 1.0f,
                        dinp + (size_t)n * C, 1);
    } else if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                    1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}
