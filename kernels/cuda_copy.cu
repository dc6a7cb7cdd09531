// Column copies between per-token vectors (split a projection's output, build per-head
// keys from parts) and their accumulating backward, on bf16 act buffers.
#include "kernels/cuda_common.cuh"

__global__ void copy_cols_kernel(bf16 *dst, int dst_ld, int dst_off, const bf16 *src, int src_ld, int src_off,
                                 int width, size_t total, int accumulate) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t n = idx / width;
        const int j = (int)(idx % width);
        bf16 *d = dst + n * dst_ld + dst_off + j;
        const bf16 s = src[n * src_ld + src_off + j];
        *d = accumulate ? to_bf16(ld(d) + __bfloat162float(s)) : s;
    }
}

extern "C" void cuda_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                               int N, int width, int accumulate) {
    if (N <= 0 || width <= 0) return;
    const size_t total = (size_t)N * width;
    copy_cols_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)dst, dst_ld, dst_off, (const bf16 *)src, src_ld,
                                                     src_off, width, total, accumulate);
    CUDA_LAUNCHED();
}
