// Mixture-of-experts ops, first version.
//  - Router matmuls: logits are fp32 (bf16 inputs, fp32 cuBLASLt output). The backward keeps
//    the fp32 dlogits unrounded: inp and weight are widened to fp32 scratch and the two
//    products run as fp32 SGEMMs (no TF32: cuBLAS's default math mode).
//  - Softmax/top-k, dispatch, aux losses and the router softmax backward are kernels over the
//    per-token and per-assignment steps of backend/moe_route_rows.h, which the CPU routing runs
//    too: the same decisions from the same probabilities, no host round trip (model/moe.c reads
//    nothing back during the layer; the per-expert matmuls below fetch the offsets). Dispatch is
//    deterministic without atomics: positions and rows by block scans per expert, capacity
//    drops by counting the assignments that go before each one.
//  - Row gather (zeros for the rows past the kept ones) and weighted scatter are kernels: one
//    thread per (token, channel), the K assignments of a token summed in k order in fp32, then
//    added once (deterministic).
#include "kernels/cuda_common.cuh"

#include <cub/block/block_scan.cuh>
#include <stdlib.h>

#include "backend/moe_route_rows.h"
#include "kernels/cuda_moe_grouped.cuh"

// ---- router matmuls ----

extern "C" void cuda_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E) {
    if (N <= 0 || E <= 0) return;
    if (C <= 0) { CUDA_CHECK(cudaMemsetAsync(logits, 0, (size_t)N * E * sizeof(float), 0)); return; }
    // logits^T (E, N) = W (E, C) @ inp^T: W stored col-major as (C, E) ld C, transposed; inp stored (C, N) ld C
    cuda_lt_matmul(E, N, C, weight, C, true, inp, C, false, logits, E, CUDA_R_32F, 0.0f);
    CUDA_OP_DONE();
}

extern "C" void cuda_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                                         const float *weight, int N, int C, int E) {
    if (N <= 0 || C <= 0 || E <= 0) return;
    cuda_timing_label(__func__);   // its widenings, SGEMMs and the add count as this op
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
    CUDA_OP_DONE();
    cuda_timing_label(NULL);
}

// ---- routing on the device: the steps of backend/moe_route_rows.h, one thread per token or
// assignment, scans per expert; no host transfer. tests/test_moe_dispatch.c replays this
// pipeline on the CPU against the CPU routing. ----

#define MOE_SCAN_THREADS 256
typedef cub::BlockScan<int, MOE_SCAN_THREADS> MoeScan;

__global__ void moe_topk_kernel(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits, int N,
                                int E, int K, int norm_topk) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    moe_topk_row(probs + (size_t)t * E, lse + t, topk_idx + (size_t)t * K, topk_w + (size_t)t * K,
                 logits + (size_t)t * E, E, K, norm_topk);
}

extern "C" void cuda_moe_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                                      int N, int E, int K, int norm_topk) {
    if (N <= 0) return;
    moe_topk_kernel<<<(N + 127) / 128, 128>>>(probs, lse, topk_idx, topk_w, logits, N, E, K, norm_topk);
    CUDA_LAUNCHED();
}

// Step 1, one block per expert: pos[a], the index of assignment a among its expert's in token
// order (a block-wide scan per chunk of assignments), and counts[e].
__global__ void moe_positions_kernel(int *pos, int *counts, const int *topk_idx, int NK) {
    __shared__ typename MoeScan::TempStorage tmp;
    const int e = blockIdx.x;
    int base = 0;
    for (int a0 = 0; a0 < NK; a0 += MOE_SCAN_THREADS) {
        const int a = a0 + threadIdx.x;
        const int mine = a < NK && topk_idx[a] == e;
        int incl, chunk;
        MoeScan(tmp).InclusiveSum(mine, incl, chunk);
        if (mine) pos[a] = base + incl - 1;
        base += chunk;
        __syncthreads();   // tmp is reused by the next chunk's scan
    }
    if (threadIdx.x == 0) counts[e] = base;
}

__global__ void moe_plan_kernel(int *start, int *expert_off, const int *counts, int E, int capacity) {
    moe_dispatch_plan(start, expert_off, counts, E, capacity);
}

__global__ void moe_list_kernel(int *list, const int *start, const int *pos, const int *topk_idx, int NK) {
    const int a = blockIdx.x * blockDim.x + threadIdx.x;
    if (a < NK) list[start[topk_idx[a]] + pos[a]] = a;
}

__global__ void moe_keep_kernel(int *keep, const int *list, const int *start, const int *counts, const float *probs,
                                const int *topk_idx, int NK, int E, int K, int capacity) {
    const int a = blockIdx.x * blockDim.x + threadIdx.x;
    if (a < NK) keep[a] = moe_assignment_kept(a, list, start, counts, probs, topk_idx, E, K, capacity);
}

// Step 5, one block per expert: its kept assignments, in token order, take the rows from
// expert_off[e] on; the dropped ones get -1.
__global__ void moe_rows_kernel(int *row_token, int *assign_row, const int *list, const int *start,
                                const int *expert_off, const int *keep, int K) {
    __shared__ typename MoeScan::TempStorage tmp;
    const int e = blockIdx.x, n = start[e + 1] - start[e];
    int base = expert_off[e];
    for (int i0 = 0; i0 < n; i0 += MOE_SCAN_THREADS) {
        const int i = i0 + threadIdx.x;
        const int a = i < n ? list[start[e] + i] : -1;
        const int kept = a >= 0 && keep[a];
        int incl, chunk;
        MoeScan(tmp).InclusiveSum(kept, incl, chunk);
        if (a >= 0) {
            if (kept) row_token[base + incl - 1] = a / K;
            assign_row[a] = kept ? base + incl - 1 : -1;
        }
        base += chunk;
        __syncthreads();
    }
}

__global__ void moe_rows_tail_kernel(int *row_token, const int *expert_off, int E, int NK) {
    for (int r = expert_off[E] + blockIdx.x * blockDim.x + threadIdx.x; r < NK; r += gridDim.x * blockDim.x)
        row_token[r] = -1;
}

extern "C" void cuda_moe_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                                  const int *topk_idx, int N, int E, int K, int capacity) {
    const int NK = (N > 0 ? N : 0) * K;
    // pos, list, keep (NK each) and start (E + 1) in one scratch buffer
    int *pos = (int *)cuda_scratch(SCRATCH_MOE_A, ((size_t)3 * NK + E + 1) * sizeof(int));
    int *list = pos + NK, *keep = list + NK, *start = keep + NK;
    const unsigned blocks = (unsigned)((NK + 255) / 256);
    moe_positions_kernel<<<E, MOE_SCAN_THREADS>>>(pos, counts, topk_idx, NK);
    CUDA_LAUNCHED();
    moe_plan_kernel<<<1, 1>>>(start, expert_off, counts, E, capacity);
    CUDA_LAUNCHED();
    if (NK > 0) {
        moe_list_kernel<<<blocks, 256>>>(list, start, pos, topk_idx, NK);
        CUDA_LAUNCHED();
        moe_keep_kernel<<<blocks, 256>>>(keep, list, start, counts, probs, topk_idx, NK, E, K, capacity);
        CUDA_LAUNCHED();
        moe_rows_kernel<<<E, MOE_SCAN_THREADS>>>(row_token, assign_row, list, start, expert_off, keep, K);
        CUDA_LAUNCHED();
        moe_rows_tail_kernel<<<blocks, 256>>>(row_token, expert_off, E, NK);
        CUDA_LAUNCHED();
    }
}

// One block: the column sums of probs (one thread per expert, token order, double) and the
// sum of lse^2, combined by thread 0 as the CPU does (bitwise the same from the same inputs).
__global__ void moe_aux_kernel(float *out, const float *probs, const float *lse, const int *counts, int N, int E,
                               int K, float aux_coef, float z_coef) {
    extern __shared__ double psum[];   // E
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double s = 0.0;
        for (int t = 0; t < N; t++) s += probs[(size_t)t * E + e];
        psum[e] = s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    double zsum = 0.0;
    for (int t = 0; t < N; t++) zsum += (double)lse[t] * lse[t];
    moe_aux_combine(out, psum, zsum, counts, N, E, K, aux_coef, z_coef);
}

extern "C" void cuda_moe_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N,
                                     int E, int K, float aux_coef, float z_coef) {
    const size_t bytes = (size_t)E * sizeof(double);
    // past the default 48 KiB (E > 6144) the kernel opts in to more, as the attention kernels do
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(moe_aux_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    moe_aux_kernel<<<1, 256, bytes>>>(out, probs, lse, counts, N > 0 ? N : 0, E, K, aux_coef, z_coef);
    CUDA_LAUNCHED();
}

__global__ void moe_softmax_backward_kernel(float *dlogits, const float *dtopk_w, const float *probs,
                                            const float *lse, const int *topk_idx, const float *topk_w,
                                            const int *counts, int N, int E, int K, int norm_topk, float aux_scale,
                                            float z_scale) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    moe_softmax_backward_row(dlogits + (size_t)t * E, dtopk_w + (size_t)t * K, probs + (size_t)t * E, lse[t],
                             topk_idx + (size_t)t * K, topk_w + (size_t)t * K, counts, N, E, K, norm_topk,
                             aux_scale, z_scale);
}

extern "C" void cuda_moe_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs,
                                                 const float *lse, const int *topk_idx, const float *topk_w,
                                                 const int *counts, int N, int E, int K, int norm_topk,
                                                 float aux_scale, float z_scale) {
    if (N <= 0) return;
    moe_softmax_backward_kernel<<<(N + 127) / 128, 128>>>(dlogits, dtopk_w, probs, lse, topk_idx, topk_w, counts, N,
                                                          E, K, norm_topk, aux_scale, z_scale);
    CUDA_LAUNCHED();
}

// ---- row gather and weighted scatter (bf16 rows) ----

__global__ void moe_gather_forward_kernel(bf16 *out, const bf16 *inp, const int *row_token, int C, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / C;
        const int c = (int)(i % C);
        const int t = row_token[r];
        out[i] = t >= 0 ? inp[(size_t)t * C + c] : to_bf16(0.0f);
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
// Two ways, one contract (backend/backend.h: the row offsets in device memory):
//  - the tensor-core grouped kernels (kernels/cuda_moe_grouped.cu), the default where the shape
//    qualifies (cuda_moe_grouped_fits): one launch per product for all experts, sized on the
//    device, no host round trip. Slower than cuBLASLt per product, faster for the layer: on the
//    H100 the paper MoE config trained at 1.35x the tokens/s of the per-expert way (docs/GPU.md,
//    "MoE", run 10), the host no longer waiting on each layer's offsets.
//  - one cuBLASLt product per non-empty expert (CLLA_MOE_GROUPED=0 or cuda_moe_use_grouped(0),
//    and every shape the grouped kernels decline): the offsets come to the host first, a
//    synchronizing copy per call.
// scripts/gpu_check.sh's op tests and test_gpu_train compare both ways with the CPU.

static int g_grouped_mode = -1;   // -1: CLLA_MOE_GROUPED (or the default) not read yet

extern "C" void cuda_moe_use_grouped(int on) { g_grouped_mode = on < 0 ? -1 : on ? 1 : 0; }

static int grouped_wanted(void) {
    if (g_grouped_mode < 0)
        g_grouped_mode = env_switch("CLLA_MOE_GROUPED", 1, "one cuBLASLt product per expert",
                                    "the tensor-core grouped kernels, offsets read on the device");
    return g_grouped_mode;
}

static float *rows_at(const float *base, int row, int width) {
    return (float *)((bf16 *)base + (size_t)row * width);
}

// The E + 1 row offsets on the host (the per-expert way): a synchronizing copy.
static int *host_offsets(const int *off, int E) {
    int *h = (int *)malloc(((size_t)E + 1) * sizeof(int));
    if (!h) die("moe expert matmul: out of host memory for %d row offsets", E + 1);
    CUDA_CHECK(cudaMemcpy(h, off, ((size_t)E + 1) * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}

extern "C" void cuda_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights,
                                               const int *expert_off, int E, int R, int C, int OC) {
    if (R <= 0 || OC <= 0) return;
    cuda_timing_label(__func__);
    const void *bufs[2] = {out, inp};
    if (grouped_wanted() && cuda_moe_grouped_fits(E, C, OC, bufs, 2, (const void *const *)weights)) {
        cuda_moe_grouped_forward((bf16 *)out, (const bf16 *)inp, (const bf16 *const *)weights, expert_off, E, R, C, OC);
    } else {
        int *off = host_offsets(expert_off, E);
        for (int e = 0; e < E; e++) {
            const int r0 = off[e], n = off[e + 1] - r0;
            if (n > 0) cuda_matmul_forward(rows_at(out, r0, OC), rows_at(inp, r0, C), weights[e], n, C, OC);
        }
        if (R > off[E])
            CUDA_CHECK(cudaMemsetAsync(rows_at(out, off[E], OC), 0, (size_t)(R - off[E]) * OC * sizeof(bf16), 0));
        free(off);
    }
    cuda_timing_label(NULL);
}

extern "C" void cuda_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout,
                                                const float *inp, const float *const *weights,
                                                const int *expert_off, int E, int R, int C, int OC) {
    if (R <= 0 || C <= 0 || OC <= 0) return;
    cuda_timing_label(__func__);
    const void *bufs[3] = {dinp, dout, inp};
    if (grouped_wanted() && cuda_moe_grouped_fits(E, C, OC, bufs, 3, (const void *const *)weights)) {
        cuda_moe_grouped_backward((bf16 *)dinp, dweights, (const bf16 *)dout, (const bf16 *)inp,
                                  (const bf16 *const *)weights, expert_off, E, R, C, OC);
    } else {
        int *off = host_offsets(expert_off, E);
        for (int e = 0; e < E; e++) {
            const int r0 = off[e], n = off[e + 1] - r0;
            if (n > 0)
                cuda_matmul_backward(dinp ? rows_at(dinp, r0, C) : NULL, dweights ? dweights[e] : NULL,
                                     rows_at(dout, r0, OC), rows_at(inp, r0, C), weights[e], n, C, OC);
        }
        free(off);
    }
    cuda_timing_label(NULL);
}
