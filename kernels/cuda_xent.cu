// Softmax cross-entropy over V classes: one block per row, fp32 max / sum in a fixed
// order. Ignored rows produce loss 0 and no gradient. A target outside [0, V) that is not
// ignore_index gives a NaN loss (the CPU reference asserts; a kernel cannot stop the run).
#include "kernels/cuda_common.cuh"

#define XENT_THREADS 512

// max and sum(exp(l - max)) of one row, shared by every thread of the block.
static __device__ void row_stats(const bf16 *l, int V, float *sh, float *m_out, float *sum_out) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, ld(l + i));
    m = block_max(m, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(ld(l + i) - m);
    *sum_out = block_sum(s, sh);
    *m_out = m;
}

__global__ void xent_forward_kernel(float *losses, const bf16 *logits, const int *targets, int V, int ignore_index) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int tgt = targets[row];
    if (tgt == ignore_index) { if (threadIdx.x == 0) losses[row] = 0.0f; return; }
    const bf16 *l = logits + row * V;
    float m, sum;
    row_stats(l, V, sh, &m, &sum);
    if (threadIdx.x == 0)
        losses[row] = (tgt >= 0 && tgt < V) ? logf(sum) - (ld(l + tgt) - m) : __int_as_float(0x7FC00000);
}

__global__ void xent_backward_kernel(bf16 *dlogits, const bf16 *logits, const int *targets, int V,
                                     int ignore_index, float dloss) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const int tgt = targets[row];
    if (tgt == ignore_index) return;
    const bf16 *l = logits + row * V;
    bf16 *dl = dlogits + row * V;
    float m, sum;
    row_stats(l, V, sh, &m, &sum);
    // a target outside [0, V) (never from checked data) gets NaN here as its loss did in the
    // forward, instead of a gradient without its one-hot term (the CPU op asserts)
    const float shift = (tgt >= 0 && tgt < V) ? m + logf(sum) : __int_as_float(0x7FC00000);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float p = expf(ld(l + i) - shift);
        dl[i] = to_bf16(ld(dl + i) + dloss * (p - (i == tgt ? 1.0f : 0.0f)));
    }
}

extern "C" void cuda_xent_forward(float *losses, const float *logits, const int *targets, int N, int V,
                                  int ignore_index) {
    if (N <= 0) return;
    xent_forward_kernel<<<N, XENT_THREADS>>>(losses, (const bf16 *)logits, targets, V, ignore_index);
    CUDA_LAUNCHED();
}

extern "C" void cuda_xent_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                                   int ignore_index, float dloss) {
    if (N <= 0 || V <= 0) return;
    xent_backward_kernel<<<N, XENT_THREADS>>>((bf16 *)dlogits, (const bf16 *)logits, targets, V, ignore_index, dloss);
    CUDA_LAUNCHED();
}
