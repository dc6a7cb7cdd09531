// RMSNorm: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps), rows of C.
// One block per row; fp32 sums in a fixed order (block_sum). The weight gradient is a
// reduction over rows done in two passes (fixed row chunks, then the chunks in order), so
// it is deterministic and independent of the GPU.
#include "kernels/cuda_common.cuh"

#define RMS_THREADS 256

__global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight,
                                       int C, float eps) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { const float v = ld(x + c); ss += v * v; }
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = to_bf16(ld(x + c) * r * ld(weight + c));
    if (threadIdx.x == 0) rstd[row] = r;
}

extern "C" void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                     int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_forward_kernel<<<N, RMS_THREADS>>>((bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, C, eps);
    CUDA_LAUNCHED();
}

// dinp += r * (dout w - xhat * mean(dout w xhat)), xhat = x r
__global__ void rmsnorm_backward_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp,
                                             const bf16 *weight, const float *rstd, int C) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C, *dy = dout + row * C;
    bf16 *dx = dinp + row * C;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += ld(dy + c) * ld(weight + c) * (ld(x + c) * r);
    const float mean_dot = block_sum(dot, sh) / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float xhat = ld(x + c) * r;
        dx[c] = to_bf16(ld(dx + c) + r * (ld(dy + c) * ld(weight + c) - xhat * mean_dot));
    }
}

// partial[chunk][c] = sum over the chunk's rows of dout xhat, rows in ascending order.
__global__ void rmsnorm_dweight_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp,
                                               const float *rstd, int N, int C, int rows_per_chunk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    if (c >= C) return;
    const int r0 = chunk * rows_per_chunk;
    const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float acc = 0.0f;
    for (int n = r0; n < r1; n++) {
        const size_t i = (size_t)n * C + c;
        acc += ld(dout + i) * (ld(inp + i) * rstd[n]);
    }
    partial[(size_t)chunk * C + c] = acc;
}

__global__ void rmsnorm_dweight_reduce_kernel(float *dweight, const float *partial, int nchunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < nchunks; k++) acc += partial[(size_t)k * C + c];
    dweight[c] += acc;
}

extern "C" void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                      const float *weight, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_backward_dinp_kernel<<<N, RMS_THREADS>>>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                                                     (const bf16 *)weight, rstd, C);
    CUDA_LAUNCHED();
    // Row chunks: at least 32 rows each, at most 256 chunks; fixed by N alone.
    int nchunks = (N + 31) / 32;
    if (nchunks > 256) nchunks = 256;
    const int rows_per_chunk = (N + nchunks - 1) / nchunks;
    nchunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    float *partial = (float *)cuda_scratch(SCRATCH_PARTIAL, (size_t)nchunks * C * sizeof(float));
    dim3 grid((unsigned)((C + 127) / 128), (unsigned)nchunks);
    rmsnorm_dweight_partial_kernel<<<grid, 128>>>(partial, (const bf16 *)dout, (const bf16 *)inp, rstd, N, C,
                                                 rows_per_chunk);
    CUDA_LAUNCHED();
    rmsnorm_dweight_reduce_kernel<<<(C + 127) / 128, 128>>>(dweight, partial, nchunks, C);
    CUDA_LAUNCHED();
}
