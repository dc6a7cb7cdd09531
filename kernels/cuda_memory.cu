// Device memory, host <-> device transfers, and the fp32 <-> bf16 conversions at the edges:
// act buffers converted on the host side, weights rounded stochastically on the device.
#include "kernels/cuda_common.cuh"
#include "backend/bf16.h"

#include <stdlib.h>

extern "C" void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    // cudaMalloc(0) may return NULL; one byte keeps "alloc never returns NULL" true.
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        die("cudaMalloc of %zu bytes failed (%s; %zu of %zu MiB free on the device): use a "
            "smaller model, batch or sequence length, or free the GPU", bytes,
            cudaGetErrorString(err), free_b >> 20, total_b >> 20);
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

extern "C" void cuda_release(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

extern "C" void cuda_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
}

extern "C" void cuda_upload(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

extern "C" void cuda_download(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

// Ordered on the legacy default stream like every other op (no host synchronization).
extern "C" void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

// dst[i] = stochastic bf16 rounding of master[i] with the bits sr_hash32(seed, i): the
// same function the host uses (backend/bf16.h), so a store is predictable bit for bit.
__global__ void store_weights_kernel(uint16_t *dst, const float *master, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = sr_round_weight(master[i], seed, i);
}

extern "C" void cuda_store_weights(float *dst, const float *master, size_t n, unsigned long long seed) {
    if (!n) return;
    store_weights_kernel<<<ew_blocks(n, 256), 256>>>((uint16_t *)dst, master, n, (uint64_t)seed);
    CUDA_LAUNCHED();
}

// Conversions of act buffers go through the host: they serve checkpoints, tests and
// logging, never the training step, so a pageable copy plus a host loop is enough.
extern "C" void cuda_act_to_host(float *dst_host, const float *src, size_t n) {
    if (!n) return;
    uint16_t *tmp = (uint16_t *)malloc(n * sizeof(uint16_t));
    if (!tmp) die("out of host memory converting %zu bf16 values", n);
    CUDA_CHECK(cudaMemcpy(tmp, src, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) dst_host[i] = sr_bf16_to_f32(tmp[i]);
    free(tmp);
}

// fp32 -> bf16 with round-to-nearest-even (deterministic; the stochastic rounding is for
// the weight update, where the expectation matters).
extern "C" void cuda_act_from_host(float *dst, const float *src_host, size_t n) {
    if (!n) return;
    uint16_t *tmp = (uint16_t *)malloc(n * sizeof(uint16_t));
    if (!tmp) die("out of host memory converting %zu values to bf16", n);
    for (size_t i = 0; i < n; i++) tmp[i] = sr_f32_to_bf16_rne(src_host[i]);
    CUDA_CHECK(cudaMemcpy(dst, tmp, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(tmp);
}
