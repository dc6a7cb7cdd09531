// Mixture-of-experts ops, first version.
//  - Router matmuls: logits are fp32 (bf16 inputs, fp32 cuBLASLt output). The backward keeps
//    the fp32 dlogits unrounded: inp and weight are widened to fp32 scratch and the two
//    products run as fp32 SGEMMs (no TF32: cuBLAS's default math mode).
//  - Softmax/top-k, dispatch, aux losses and the router softmax backward run the CPU
//    reference (backend/moe_routing.c) on host copies of the small (N, E) fp32 / int32 buffers:
//    identical routing decisions on both backends by construction, at the cost of a few
//    synchronous transfers per layer. Moving them to kernels is future work.
//  - Row gather and weighted scatter are kernels: one thread per (token, channel), the K
//    assignments of a token summed in k order in fp32, then added once (deterministic).
#include "kernels/cuda_common.cuh"

#include <stdlib.h>

extern "C" {
#include "backend/moe_routing.h"
}

// ---- router matmuls ----

extern "C" void cuda_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E) {
    if (N <= 0 || E <= 0) return;
    if (C <= 0) { CUDA_CHECK(cudaMemsetAsync(logits, 0, (size_t)N * E * sizeof(float), 0)); return; }
    // logits^T (E, N) = W (E, C) @ inp^T: W stored col-major as (C, E) ld C, transposed; inp stored (C, N) ld C
    cuda_lt_matmul(E, N, C, weight, C, true, inp, C, false, logits, E, CUDA_R_32F, 0.0f);
}

extern "C" void cuda_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                                         const float *weight, int N, int C, int E) {
    if (N <= 0 || C <= 0 || E <= 0) return;
    cublasHandle_t h = cuda_cublas();
    const float one = 1.0f, zero = 0.0f;
    if (dweight) {
        float *inp32 = (float *)cuda_scratch(SCRATCH_MOE_A, (size_t)N * C * sizeof(float));
        cuda_bf16_to_f32(inp32, (const bf16 *)inp, (size_t)N * C);
        // dW^T (C, E) += inp^T (C, N) @ dlogits (N, E): inp32 stored (C, N) ld C; dlogits stored (E, N) ld E, transposed
        CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, E, N, &one, inp32, C, dlogits, E, &one, dweight, C));
    }
    if (dinp) {
        float *w32 = (float *)cuda_scratch(SCRATCH_MOE_B, (size_t)E * C * sizeof(float));
        float *tmp = (float *)cuda_scratch(SCRATCH_MOE_C, (size_t)N * C * sizeof(float));
        cuda_bf16_to_f32(w32, (const bf16 *)weight, (size_t)E * C);
        // tmp^T (C, N) = W^T (C, E) @ dlogits^T (E, N): W stored (C, E) ld C; dlogits stored (E, N) ld E
        CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, E, &one, w32, C, dlogits, E, &zero, tmp, C));
        cuda_add_f32_to_bf16((bf16 *)dinp, tmp, (size_t)N * C);
    }
}

// ---- routing on the host (the CPU reference) ----

static void *host_copy(const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (!h) die("out of host memory staging %zu bytes of MoE routing data", bytes);
    if (bytes) CUDA_CHECK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static void *host_buf(size_t bytes) {
    void *h = calloc(bytes ? bytes : 1, 1);
    if (!h) die("out of host memory staging %zu bytes of MoE routing data", bytes);
    return h;
}

static void to_dev(void *dev, const void *h, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dev, h, bytes, cudaMemcpyHostToDevice));
}

extern "C" void cuda_moe_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                                      int N, int E, int K, int norm_topk) {
    if (N <= 0) return;
    const size_t ne = (size_t)N * E * sizeof(float), nk = (size_t)N * K;
    float *hl = (float *)host_copy(logits, ne);
    float *hp = (float *)host_buf(ne), *hlse = (float *)host_buf((size_t)N * sizeof(float));
    int *hi = (int *)host_buf(nk * sizeof(int));
    float *hw = (float *)host_buf(nk * sizeof(float));
    moe_route_topk_forward(hp, hlse, hi, hw, hl, N, E, K, norm_topk);
    to_dev(probs, hp, ne);
    to_dev(lse, hlse, (size_t)N * sizeof(float));
    to_dev(topk_idx, hi, nk * sizeof(int));
    to_dev(topk_w, hw, nk * sizeof(float));
    free(hl); free(hp); free(hlse); free(hi); free(hw);
}

extern "C" void cuda_moe_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                                  const int *topk_idx, int N, int E, int K, int capacity) {
    const size_t nk = (size_t)(N > 0 ? N : 0) * K;
    float *hp = (float *)host_copy(probs, (size_t)(N > 0 ? N : 0) * E * sizeof(float));
    int *hi = (int *)host_copy(topk_idx, nk * sizeof(int));
    int *hc = (int *)host_buf((size_t)E * sizeof(int)), *ho = (int *)host_buf(((size_t)E + 1) * sizeof(int));
    int *hrt = (int *)host_buf(nk * sizeof(int)), *har = (int *)host_buf(nk * sizeof(int));
    moe_route_dispatch(hc, ho, hrt, har, hp, hi, N, E, K, capacity);
    to_dev(counts, hc, (size_t)E * sizeof(int));
    to_dev(expert_off, ho, ((size_t)E + 1) * sizeof(int));
    to_dev(row_token, hrt, nk * sizeof(int));
    to_dev(assign_row, har, nk * sizeof(int));
    free(hp); free(hi); free(hc); free(ho); free(hrt); free(har);
}

extern "C" void cuda_moe_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N,
                                     int E, int K, float aux_coef, float z_coef) {
    const size_t n = (size_t)(N > 0 ? N : 0);
    float *hp = (float *)host_copy(probs, n * E * sizeof(float));
    float *hl = (float *)host_copy(lse, n * sizeof(float));
    int *hc = (int *)host_copy(counts, (size_t)E * sizeof(int));
    float ho[2] = {0.0f, 0.0f};
    moe_route_aux_forward(ho, hp, hl, hc, N, E, K, aux_coef, z_coef);
    to_dev(out, ho, sizeof ho);
    free(hp); free(hl); free(hc);
}

extern "C" void cuda_moe_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs,
                                                 const float *lse, const int *topk_idx, const float *topk_w,
                                                 const int *counts, int N, int E, int K, int norm_topk,
                                                 float aux_scale, float z_scale) {
    if (N <= 0) return;
    const size_t ne = (size_t)N * E, nk = (size_t)N * K;
    float *hdl = (float *)host_copy(dlogits, ne * sizeof(float));
    float *hdw = (float *)host_copy(dtopk_w, nk * sizeof(float));
    float *hp = (float *)host_copy(probs, ne * sizeof(float));
    float *hl = (float *)host_copy(lse, (size_t)N * sizeof(float));
    int *hi = (int *)host_copy(topk_idx, nk * sizeof(int));
    float *hw = (float *)host_copy(topk_w, nk * sizeof(float));
    int *hc = (int *)host_copy(counts, (size_t)E * sizeof(int));
    moe_route_router_softmax_backward(hdl, hdw, hp, hl, hi, hw, hc, N, E, K, norm_topk, aux_scale, z_scale);
    to_dev(dlogits, hdl, ne * sizeof(float));
    free(hdl); free(hdw); free(hp); free(hl); free(hi); free(hw); free(hc);
}

// ---- row gather and weighted scatter (bf16 rows) ----

__global__ void moe_gather_forward_kernel(bf16 *out, const bf16 *inp, const int *row_token, int C, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / C;
        const int c = (int)(i % C);
        out[i] = inp[(size_t)row_token[r] * C + c];
    }
}

extern "C" void cuda_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C) {
    if (R <= 0 || C <= 0) return;
    const size_t total = (size_t)R * C;
    moe_gather_forward_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)out, (const bf16 *)inp, row_token, C, total);
    CUDA_LAUNCHED();
}

// dst row t += sum over k (k order, kept only) of [w[t, k] *] src row assign_row[t, k].
// w == NULL: unweighted (the gather's backward).
__global__ void moe_rows_sum_kernel(bf16 *dst, const bf16 *src, const float *w, const int *assign_row, int K,
                                    int C, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / C;
        const int c = (int)(i % C);
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const int r = assign_row[t * K + k];
            if (r < 0) continue;
            const float v = ld(src + (size_t)r * C + c);
            acc += w ? w[t * K + k] * v : v;
        }
        dst[i] = to_bf16(ld(dst + i) + acc);
    }
}

extern "C" void cuda_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C) {
    if (N <= 0 || C <= 0 || K <= 0) return;
    const size_t total = (size_t)N * C;
    moe_rows_sum_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)dinp, (const bf16 *)dout, NULL, assign_row, K, C, total);
    CUDA_LAUNCHED();
}

extern "C" void cuda_moe_combine_forward(float *out, const float *expert_out, const float *topk_w,
                                         const int *assign_row, int N, int K, int C) {
    if (N <= 0 || C <= 0 || K <= 0) return;
    const size_t total = (size_t)N * C;
    moe_rows_sum_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)out, (const bf16 *)expert_out, topk_w, assign_row,
                                                        K, C, total);
    CUDA_LAUNCHED();
}

// dexpert_out row assign_row[a] += topk_w[a] * dout row a / K (each kept row has exactly one
// assignment, so threads never share an output element).
__global__ void moe_combine_dexpert_kernel(bf16 *dexpert_out, const bf16 *dout, const float *topk_w,
                                           const int *assign_row, int K, int C, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t a = i / C;
        const int c = (int)(i % C);
        const int r = assign_row[a];
        if (r < 0) continue;
        bf16 *d = dexpert_out + (size_t)r * C + c;
        *d = to_bf16(ld(d) + topk_w[a] * ld(dout + (a / K) * C + c));
    }
}

// dtopk_w[a] += dot(dout row a / K, expert_out row assign_row[a]): one block per assignment.
__global__ void moe_combine_dw_kernel(float *dtopk_w, const bf16 *dout, const bf16 *expert_out,
                                      const int *assign_row, int K, int C) {
    __shared__ float sh[32];
    const size_t a = blockIdx.x;
    const int r = assign_row[a];
    if (r < 0) return;   // uniform over the block
    const bf16 *g = dout + (a / K) * C, *y = expert_out + (size_t)r * C;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += ld(g + c) * ld(y + c);
    dot = block_sum(dot, sh);
    if (threadIdx.x == 0) dtopk_w[a] += dot;
}

extern "C" void cuda_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout,
                                          const float *expert_out, const float *topk_w, const int *assign_row,
                                          int N, int K, int C) {
    if (N <= 0 || C <= 0 || K <= 0) return;
    const size_t total = (size_t)N * K * C;
    moe_combine_dexpert_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)dexpert_out, (const bf16 *)dout, topk_w,
                                                               assign_row, K, C, total);
    CUDA_LAUNCHED();
    moe_combine_dw_kernel<<<(unsigned)((size_t)N * K), 256>>>(dtopk_w, (const bf16 *)dout, (const bf16 *)expert_out,
                                                              assign_row, K, C);
    CUDA_LAUNCHED();
}

// ---- grouped expert matmuls ----
// First version: one cuBLASLt call per non-empty expert (expert_off and the pointer arrays
// are host arrays, as the contract says). A grouped GEMM (cublasGemmGroupedBatchedEx or a
// CUTLASS grouped kernel) would cut the launches; the results would not change.

static float *rows_at(const float *base, int row, int width) {
    return (float *)((bf16 *)base + (size_t)row * width);
}

extern "C" void cuda_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights,
                                               const int *expert_off, int E, int C, int OC) {
    for (int e = 0; e < E; e++) {
        const int r0 = expert_off[e], n = expert_off[e + 1] - r0;
        if (n > 0) cuda_matmul_forward(rows_at(out, r0, OC), rows_at(inp, r0, C), weights[e], n, C, OC);
    }
}

extern "C" void cuda_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout,
                                                const float *inp, const float *const *weights,
                                                const int *expert_off, int E, int C, int OC) {
    for (int e = 0; e < E; e++) {
        const int r0 = expert_off[e], n = expert_off[e + 1] - r0;
        if (n > 0)
            cuda_matmul_backward(dinp ? rows_at(dinp, r0, C) : NULL, dweights ? dweights[e] : NULL,
                                 rows_at(dout, r0, OC), rows_at(inp, r0, C), weights[e], n, C, OC);
    }
}
