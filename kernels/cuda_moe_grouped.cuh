// The tensor-core grouped expert matmuls (kernels/cuda_moe_grouped.cu), called by the MoE ops of
// kernels/cuda_moe.cu when cuda_moe_grouped_fits says the call qualifies.
#ifndef CLLA_KERNELS_CUDA_MOE_GROUPED_CUH
#define CLLA_KERNELS_CUDA_MOE_GROUPED_CUH

#include "kernels/cuda_common.cuh"

// The most experts one launch takes: their pointers travel in the kernel's parameters (2 KiB).
#define GROUPED_MAX_E 256

// 1 when the grouped kernels take a product: 1 <= E <= GROUPED_MAX_E, C and OC multiples of 8,
// the grids within CUDA's limits, and every buffer (the nbufs row buffers, the E weights; NULL
// entries skipped) 16-byte aligned.
int cuda_moe_grouped_fits(int E, int C, int OC, const void *const *bufs, int nbufs, const void *const *weights);

// The contract of moe_expert_matmul_forward / _backward (backend/backend.h), off in device memory.
void cuda_moe_grouped_forward(bf16 *out, const bf16 *inp, const bf16 *const *weights, const int *off, int E, int R,
                              int C, int OC);
void cuda_moe_grouped_backward(bf16 *dinp, float *const *dweights, const bf16 *dout, const bf16 *inp,
                               const bf16 *const *weights, const int *off, int E, int R, int C, int OC);

#endif
