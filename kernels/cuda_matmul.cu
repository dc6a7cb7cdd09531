// Matmuls through cuBLASLt: bf16 inputs, fp32 compute and accumulation.
//   forward  out (N, OC) bf16  = inp (N, C) @ W (OC, C)^T
//   backward dinp (N, C) bf16 += dout (N, OC) @ W          (beta = 1: one bf16 rounding)
//            dW (OC, C)  fp32 += dout^T @ inp              (beta = 1, fp32 output)
//
// cuBLASLt is column-major: a row-major (R, K) matrix is the column-major (K, R) matrix
// with leading dimension K, i.e. its transpose. So every product below is written for
// the transposes: out^T = W * inp^T, dinp^T = W^T * dout^T, dW^T = inp^T * dout.
#include "kernels/cuda_common.cuh"

// The largest power of two (at most 256) dividing the address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and sub-buffers of a tensor table can
// start anywhere: tell it the truth so it never picks a kernel that needs more.
static uint32_t alignment_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 2 && (a % al) != 0) al >>= 1;
    return al;
}

// D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C, column-major, C == D.
// A and B are bf16; D is bf16 or fp32 (dtype). lda/ldb/ldd are the stored leading dims.
void cuda_lt_matmul(int m, int n, int k, const void *A, int lda, bool transA, const void *B,
                      int ldb, bool transB, void *D, int ldd, cudaDataType_t dtype, float beta) {
    cublasLtHandle_t lt = cuda_cublaslt();
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = transA ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));

    // Layouts describe the stored matrices (before the transpose op).
    cublasLtMatrixLayout_t la, lb, ld_;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, transA ? k : m, transA ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, transB ? n : k, transB ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld_, dtype, m, n, ldd));

    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws_bytes, sizeof ws_bytes));
    const uint32_t al_a = alignment_of(A), al_b = alignment_of(B), al_d = alignment_of(D);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    // Split-K partial sums reduced in the output type would round a bf16 output more than once
    // (the cpu-bf16 emulation and the GPU tests' tolerances assume one rounding, docs/GPU.md):
    // only no reduction or one in the fp32 compute type.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld_, ld_, pref, 1, &heur, &found));
    if (found == 0)
        die("cuBLASLt found no algorithm for a bf16 matmul (m=%d n=%d k=%d, %s output): "
            "this GPU or cuBLAS version may not support it", m, n, k,
            dtype == CUDA_R_32F ? "fp32" : "bf16");

    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld_, D, ld_, &heur.algo,
                                ws, ws_bytes, 0));

    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld_));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
}

extern "C" void cuda_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) { CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(bf16), 0)); return; }
    // out^T (OC, N) = W (OC, C) @ inp^T: A = W stored col-major as (C, OC) ld C, transposed;
    // B = inp stored col-major (C, N) ld C.
    cuda_lt_matmul(OC, N, C, weight, C, true, inp, C, false, out, OC, CUDA_R_16BF, 0.0f);
}

extern "C" void cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;
    if (dinp) {
        // dinp^T (C, N) += W stored col-major (C, OC) ld C  @  dout^T stored col-major (OC, N) ld OC
        cuda_lt_matmul(C, N, OC, weight, C, false, dout, OC, false, dinp, C, CUDA_R_16BF, 1.0f);
    }
    if (dweight) {
        // dW^T (C, OC) += inp^T stored col-major (C, N) ld C  @  (dout^T)^T: dout^T stored (OC, N) ld OC, transposed
        cuda_lt_matmul(C, OC, N, inp, C, false, dout, OC, true, dweight, C, CUDA_R_32F, 1.0f);
    }
}
