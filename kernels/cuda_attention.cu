// Causal softmax attention with grouped heads, first version: cuBLAS strided-batched GEMMs
// and row-softmax kernels, the full (T, T) score matrix materialised as the contract asks
// (att receives fp32 probabilities). Query head h reads kv head h / (NH / NKV).
//
// Layouts (row-major): q (B, T, NH, DQK), k (B, T, NKV, DQK), v (B, T, NKV, DV),
// out (B, T, NH, DV), att (B, NH, T, T). For one head h, Q_h of batch row b is a (T, DQK)
// matrix with row stride NH * DQK, and batch rows are T * NH * DQK apart: so each GEMM runs
// once per query head, batched over b. cuBLAS is column-major: a row-major (R, K) matrix
// with row stride ld is the column-major (K, R) matrix with leading dimension ld.
//
// Precision: scores and probabilities are fp32 (GEMM output and softmax); the P @ V and
// gradient GEMMs take bf16 copies of P and dS (tensor cores want one input type), with
// fp32 accumulation. dk and dv are accumulated over a group's NH / NKV query heads in fp32
// scratch, then added to the bf16 gradients once.
#include "kernels/cuda_common.cuh"

// C (m, n) = alpha op(A) op(B) + beta C, column-major, bf16 A and B, batched with strides.
static void gemm_sb(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                    long long sA, const void *B, int ldb, long long sB, float beta, void *C,
                    cudaDataType_t ctype, int ldc, long long sC, int batch) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cuda_cublas(), ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                                            A, CUDA_R_16BF, lda, sA, B, CUDA_R_16BF, ldb, sB, &beta,
                                            C, ctype, ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
}

#define ATT_ROWS_PER_BLOCK 4   // one warp per row

// In place on fp32 scores (already scaled): causal softmax of row (b, h, t) over s <= t,
// zeros above the diagonal; also writes the bf16 copy pb.
__global__ void causal_softmax_kernel(float *att, bf16 *pb, int T, size_t rows) {
    const size_t row = (size_t)blockIdx.x * ATT_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = (int)(row % T);
    float *a = att + row * T;
    bf16 *p = pb + row * T;
    float m = -INFINITY;
    for (int s = lane; s <= t; s += 32) m = fmaxf(m, a[s]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += 32) sum += expf(a[s] - m);
    sum = warp_sum(sum);
    for (int s = lane; s < T; s += 32) {
        const float v = s <= t ? expf(a[s] - m) / sum : 0.0f;
        a[s] = v;
        p[s] = to_bf16(v);
    }
}

// Row (b, h, t): dS = P (dP - sum_s P dP) over s <= t, 0 above the diagonal; bf16 copies of
// P and dS for the gradient GEMMs. dp (fp32, the caller's scratch) is left as it is.
__global__ void causal_softmax_backward_kernel(bf16 *dsb, bf16 *pb, const float *dp, const float *att,
                                               int T, size_t rows) {
    const size_t row = (size_t)blockIdx.x * ATT_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = (int)(row % T);
    const float *a = att + row * T, *d = dp + row * T;
    float dot = 0.0f;
    for (int s = lane; s <= t; s += 32) dot += a[s] * d[s];
    dot = warp_sum(dot);
    for (int s = lane; s < T; s += 32) {
        const float pv = s <= t ? a[s] : 0.0f;
        const float ds = s <= t ? pv * (d[s] - dot) : 0.0f;
        pb[row * T + s] = to_bf16(pv);
        dsb[row * T + s] = to_bf16(ds);
    }
}

static void check_heads(int NH, int NKV) {
    if (NKV <= 0 || NH % NKV != 0)
        die("attention: %d query heads cannot be grouped over %d kv heads: num_key_value_heads must divide num_attention_heads", NH, NKV);
}

extern "C" void cuda_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                                       int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_heads(NH, NKV);
    const int G = NH / NKV;
    const size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    bf16 *pb = (bf16 *)cuda_scratch(SCRATCH_ATT_P, (size_t)B * NH * TT * sizeof(bf16));
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
    bf16 *O = (bf16 *)out;

    // scores^T (T_k, T_q) = scale * K_j (T_k, DQK) @ Q_h^T, written straight into att (fp32).
    for (int h = 0; h < NH; h++) {
        const int j = h / G;
        gemm_sb(true, false, T, T, DQK, scale,
                K + (size_t)j * DQK, NKV * DQK, (long long)T * NKV * DQK,
                Q + (size_t)h * DQK, NH * DQK, (long long)T * NH * DQK,
                0.0f, att + (size_t)h * TT, CUDA_R_32F, T, (long long)NH * TT, B);
    }
    causal_softmax_kernel<<<(unsigned)((rows + ATT_ROWS_PER_BLOCK - 1) / ATT_ROWS_PER_BLOCK), 32 * ATT_ROWS_PER_BLOCK>>>(
        att, pb, T, rows);
    CUDA_LAUNCHED();
    // out_h^T (DV, T_q) = V_j^T (DV, T_k) @ P^T (T_k, T_q)
    for (int h = 0; h < NH; h++) {
        const int j = h / G;
        gemm_sb(false, false, DV, T, T, 1.0f,
                V + (size_t)j * DV, NKV * DV, (long long)T * NKV * DV,
                pb + (size_t)h * TT, T, (long long)NH * TT,
                0.0f, O + (size_t)h * DV, CUDA_R_16BF, NH * DV, (long long)T * NH * DV, B);
    }
}

extern "C" void cuda_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                        const float *att, const float *q, const float *k, const float *v,
                                        int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_heads(NH, NKV);
    const int G = NH / NKV;
    const size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    const size_t nk = (size_t)B * T * NKV * DQK, nv = (size_t)B * T * NKV * DV;
    bf16 *pb = (bf16 *)cuda_scratch(SCRATCH_ATT_P, (size_t)B * NH * TT * sizeof(bf16));
    bf16 *dsb = (bf16 *)cuda_scratch(SCRATCH_ATT_DS, (size_t)B * NH * TT * sizeof(bf16));
    float *dk_acc = (float *)cuda_scratch(SCRATCH_ATT_DK, nk * sizeof(float));
    float *dv_acc = (float *)cuda_scratch(SCRATCH_ATT_DV, nv * sizeof(float));
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v, *dO = (const bf16 *)dout;
    bf16 *dQ = (bf16 *)dq, *dK = (bf16 *)dk, *dV = (bf16 *)dv;

    // dP^T (T_k, T_q) = V_j (T_k, DV) @ dO_h^T, into the caller's fp32 scratch.
    for (int h = 0; h < NH; h++) {
        const int j = h / G;
        gemm_sb(true, false, T, T, DV, 1.0f,
                V + (size_t)j * DV, NKV * DV, (long long)T * NKV * DV,
                dO + (size_t)h * DV, NH * DV, (long long)T * NH * DV,
                0.0f, scratch + (size_t)h * TT, CUDA_R_32F, T, (long long)NH * TT, B);
    }
    causal_softmax_backward_kernel<<<(unsigned)((rows + ATT_ROWS_PER_BLOCK - 1) / ATT_ROWS_PER_BLOCK),
                                     32 * ATT_ROWS_PER_BLOCK>>>(dsb, pb, scratch, att, T, rows);
    CUDA_LAUNCHED();
    for (int h = 0; h < NH; h++) {
        const int j = h / G;
        const float beta_kv = (h % G == 0) ? 0.0f : 1.0f;   // first head of the group starts the sum
        // dQ_h^T (DQK, T_q) += scale * K_j^T (DQK, T_k) @ dS^T (T_k, T_q)
        gemm_sb(false, false, DQK, T, T, scale,
                K + (size_t)j * DQK, NKV * DQK, (long long)T * NKV * DQK,
                dsb + (size_t)h * TT, T, (long long)NH * TT,
                1.0f, dQ + (size_t)h * DQK, CUDA_R_16BF, NH * DQK, (long long)T * NH * DQK, B);
        // dK_j^T (DQK, T_k) (+)= scale * Q_h^T (DQK, T_q) @ dS (T_q, T_k)
        gemm_sb(false, true, DQK, T, T, scale,
                Q + (size_t)h * DQK, NH * DQK, (long long)T * NH * DQK,
                dsb + (size_t)h * TT, T, (long long)NH * TT,
                beta_kv, dk_acc + (size_t)j * DQK, CUDA_R_32F, NKV * DQK, (long long)T * NKV * DQK, B);
        // dV_j^T (DV, T_k) (+)= dO_h^T (DV, T_q) @ P (T_q, T_k)
        gemm_sb(false, true, DV, T, T, 1.0f,
                dO + (size_t)h * DV, NH * DV, (long long)T * NH * DV,
                pb + (size_t)h * TT, T, (long long)NH * TT,
                beta_kv, dv_acc + (size_t)j * DV, CUDA_R_32F, NKV * DV, (long long)T * NKV * DV, B);
    }
    cuda_add_f32_to_bf16(dK, dk_acc, nk);
    cuda_add_f32_to_bf16(dV, dv_acc, nv);
}
