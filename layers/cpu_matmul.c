// Linear layer without bias, PyTorch weight layout: out = inp @ weight^T.
// All three products are single sgemm calls; OpenBLAS threads them itself (we are outside
// any OpenMP region here, so its OpenMP build uses the whole pool).
#include "layers/cpu_ops.h"

#include <cblas.h>

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {   // empty reduction: sgemm would reject lda = 0; the product is zero
        for (size_t i = 0; i < (size_t)N * OC; i++) out[i] = 0.0f;
        return;
    }
    if (N <= 4) {
        // a few rows (decoding): OpenBLAS's sgemm packs the whole weight for them and runs about
        // 10x slower than a matrix-vector product per row, which reads the weight once
        // (bench/bench_decode.c; measured with OpenBLAS 0.3.21)
        for (int n = 0; n < N; n++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, weight, C, inp + (size_t)n * C, 1, 0.0f,
                        out + (size_t)n * OC, 1);
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
