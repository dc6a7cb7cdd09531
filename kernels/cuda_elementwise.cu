// Elementwise ops on bf16 act buffers, computed in fp32 and rounded to nearest once.
#include "kernels/cuda_common.cuh"

// out may alias a or b (the residual stream adds in place): each element is read before
// it is written by the same thread.
__global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = to_bf16(ld(a + i) + ld(b + i));
}

extern "C" void cuda_add_forward(float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    add_kernel<<<ew_blocks(n, 256), 256>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    CUDA_LAUNCHED();
}

extern "C" void cuda_accumulate(float *dst, const float *src, size_t n) {
    if (!n) return;
    add_kernel<<<ew_blocks(n, 256), 256>>>((bf16 *)dst, (const bf16 *)dst, (const bf16 *)src, n);
    CUDA_LAUNCHED();
}

__global__ void add_f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_bf16(ld(dst + i) + src[i]);
}

void cuda_add_f32_to_bf16(bf16 *dst, const float *src, size_t n) {
    if (!n) return;
    add_f32_to_bf16_kernel<<<ew_blocks(n, 256), 256>>>(dst, src, n);
    CUDA_LAUNCHED();
}

__global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ld(src + i);
}

void cuda_bf16_to_f32(float *dst, const bf16 *src, size_t n) {
    if (!n) return;
    bf16_to_f32_kernel<<<ew_blocks(n, 256), 256>>>(dst, src, n);
    CUDA_LAUNCHED();
}
