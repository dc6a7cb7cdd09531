// The tensor-core attention kernels (kernels/cuda_attention_tc.cu), called by the op in
// kernels/cuda_attention.cu when cuda_attention_tc_fits says they take the call.
#ifndef CLLA_KERNELS_CUDA_ATTENTION_TC_CUH
#define CLLA_KERNELS_CUDA_ATTENTION_TC_CUH

#include "kernels/cuda_common.cuh"

// 1 when the tensor-core kernels take a call with these head widths, B * NH (heads) and buffers
// (every non-NULL pointer of ptrs 16-byte aligned) on the current device, and they are not
// turned off.
int cuda_attention_tc_fits(int DQK, int DV, long long heads, const void *const *ptrs, int nptrs);

// The forward: out (B, T, NH, DV) and lse (B, NH, T), as cuda_attention_forward.
void cuda_attention_tc_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH,
                               int NKV, int DQK, int DV, float scale);

// The backward after Delta = rowsum(dO * O) (B, NH, T): dq, dk, dv += their gradients.
void cuda_attention_tc_backward(bf16 *dq, bf16 *dk, bf16 *dv, const float *delta, const bf16 *dout, const float *lse,
                                const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV, int DQK,
                                int DV, float scale);

#endif
