// SwiGLU: out = silu(gate) * up, elementwise over rows x cols, gate and up rows stride apart; fp32 math on
// bf16 storage.
#include "kernels/cuda_common.cuh"

// expf (not __expf): full precision, as the CPU reference. g -> -inf gives 1/(1+inf) = 0.
static __device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// element i of the (rows, cols) output: row i / cols, column i % cols; gate and up rows stride apart
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, int cols, int stride, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t o = i / cols * stride + i % cols;
        const float g = ld(gate + o);
        out[i] = to_bf16(g * sigmoid(g) * ld(up + o));
    }
}

// dgate += dout * up * s (1 + g (1 - s)) ; dup += dout * g * s ; s = sigmoid(g)
__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                       const bf16 *up, int cols, int stride, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t o = i / cols * stride + i % cols;
        const float g = ld(gate + o), u = ld(up + o), d = ld(dout + i);
        const float s = sigmoid(g);
        dgate[o] = to_bf16(ld(dgate + o) + d * u * s * (1.0f + g * (1.0f - s)));
        dup[o] = to_bf16(ld(dup + o) + d * g * s);
    }
}

extern "C" void cuda_swiglu_forward(float *out, const float *gate, const float *up, int rows, int cols, int stride) {
    const size_t n = (size_t)rows * cols;
    if (!n) return;
    swiglu_forward_kernel<<<ew_blocks(n, 256), 256>>>((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, cols, stride, n);
    CUDA_LAUNCHED();
}

extern "C" void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                     const float *up, int rows, int cols, int stride) {
    const size_t n = (size_t)rows * cols;
    if (!n) return;
    swiglu_backward_kernel<<<ew_blocks(n, 256), 256>>>((bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout,
                                                       (const bf16 *)gate, (const bf16 *)up, cols, stride, n);
    CUDA_LAUNCHED();
}
