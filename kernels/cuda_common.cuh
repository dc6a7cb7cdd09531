// Shared by the CUDA backend's translation units: error checks, bf16 helpers, block
// reductions with a fixed order, the cuBLAS handles and grow-only scratch buffers.
#ifndef CLLA_KERNELS_CUDA_COMMON_CUH
#define CLLA_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_ops.h"

typedef __nv_bfloat16 bf16;

extern "C" void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
extern "C" int env_switch(const char *name, int dflt, const char *what0, const char *what1);   // common/util.h

// Every CUDA error ends here: the call, its site and function, and a hint that fits the error
// (a missing device, memory, or a kernel fault with how to find the op that caused it).
void cuda_fail(cudaError_t err, const char *what, const char *file, int line, const char *func)
    __attribute__((noreturn));
// CLLA_CUDA_SYNC=1 in the environment: synchronize after every kernel launch and library call,
// so an asynchronous fault is reported at the op that caused it (slow; for debugging).
int cuda_sync_debug(void);
// After a kernel launch or a cuBLAS call: launch errors, and in sync-debug mode the kernel's own.
void cuda_after_launch(const char *file, int line, const char *func);

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) cuda_fail(err_, #call, __FILE__, __LINE__, __func__);    \
    } while (0)

#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t st_ = (call);                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                 \
            die("cuBLAS error in %s (%s:%d, %s): %s (status %d)", #call, __FILE__, __LINE__, \
                __func__, cublasGetStatusString(st_), (int)st_);                         \
        if (cuda_sync_debug()) cuda_after_launch(__FILE__, __LINE__, __func__);          \
    } while (0)

// After a kernel launch: launch-configuration errors surface here, at their launch site;
// with CLLA_CUDA_SYNC=1 the kernel's execution errors too; with per-op timing on
// (cuda_timing_enable, backend_cuda.h) the GPU time since the previous mark goes to __func__.
#define CUDA_LAUNCHED() cuda_after_launch(__FILE__, __LINE__, __func__)
// Per-op timing mark after library calls (cuBLAS) that CUDA_LAUNCHED does not follow.
void cuda_timing_mark(const char *op);
#define CUDA_OP_DONE() cuda_timing_mark(__func__)
// An op built from other ops (the grouped expert matmuls): while a label is set, every mark is
// attributed to it instead of the inner op. NULL clears it. Returns the label it replaces, so
// that an op inside a labelled one can keep the outer label and restore it.
const char *cuda_timing_label(const char *op);

// Grid size for a grid-stride elementwise loop: enough blocks to fill any current GPU,
// capped so that the grid never depends on the device (results never depend on it anyway).
static inline unsigned int ew_blocks(size_t n, unsigned int threads) {
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 65536;
    return (unsigned int)(b < 1 ? 1 : (b > cap ? cap : b));
}

// ---- bf16 <-> fp32 on the device ----
static __device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }

// ---- deterministic reductions ----
// Warp sum with a fixed butterfly: every lane gets the same, order-fixed result.
static __device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
    return x;
}
static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
    return x;
}
static __device__ __forceinline__ double warp_sum_d(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
    return x;
}

// Block-wide sum/max (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `sh` is __shared__ float[32]. Warp partials are combined in warp order.
static __device__ __forceinline__ float block_sum(float x, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();                       // sh may still be read by a previous call
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(x);
}
static __device__ __forceinline__ float block_max(float x, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(x);
}

// ---- context (cuda_context.cu) ----
cublasHandle_t cuda_cublas(void);
cublasLtHandle_t cuda_cublaslt(void);
// cuBLASLt workspace (device memory) and its size.
void *cuda_lt_workspace(size_t *bytes);

// D (m, n) = op(A) @ op(B) + beta D, column-major, bf16 A and B, D bf16 or fp32 (dtype),
// fp32 compute, through cuBLASLt (cuda_matmul.cu).
void cuda_lt_matmul(int m, int n, int k, const void *A, int lda, bool transA, const void *B, int ldb,
                    bool transB, void *D, int ldd, cudaDataType_t dtype, float beta);
// The same with a separate accumulate input: D = op(A) @ op(B) + beta C, C laid out as D.
void cuda_lt_matmul_c(int m, int n, int k, const void *A, int lda, bool transA, const void *B, int ldb,
                      bool transB, const void *C, void *D, int ldd, cudaDataType_t dtype, float beta);

// dst (bf16) += src (fp32), n elements (cuda_elementwise.cu).
void cuda_add_f32_to_bf16(bf16 *dst, const float *src, size_t n);
// dst (fp32) = src (bf16), n elements (cuda_elementwise.cu).
void cuda_bf16_to_f32(float *dst, const bf16 *src, size_t n);

// Grow-only device scratch, one buffer per slot so that one op can hold several at once.
// The contents are undefined on return; a grow frees the old buffer (cudaFree synchronizes,
// so no kernel still uses it).
enum CudaScratchSlot {
    SCRATCH_EMB = 0,      // embedding backward: sort keys, values and CUB temporaries
    SCRATCH_PARTIAL,      // row-chunk partial sums (rmsnorm dweight, sumsq)
    SCRATCH_ROPE,         // rope cos/sin table
    SCRATCH_MOE_A,        // MoE router backward: fp32 copies of inp and weight, fp32 dinp; dispatch: positions, list, keep flags
    SCRATCH_MOE_B,
    SCRATCH_MOE_C,
    SCRATCH_DEC_PTRS,     // paged attention: the streams' block pointer tables
    SCRATCH_DEC_TABLE,    // paged attention: block tables and lengths of the rows
    SCRATCH_DEC_SCORES,   // paged attention: fp32 scores / probabilities (n, NH, longest)
    SCRATCH_DINP,         // matmul backward: the fp32 product dout @ W of a chunk of rows
    SCRATCH_NSLOTS
};
void *cuda_scratch(enum CudaScratchSlot slot, size_t bytes);

#endif
