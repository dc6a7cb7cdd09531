// The CPU reference backend's ops (fp32, OpenMP, matmuls through OpenBLAS).
//
// Every function here has exactly the signature of the matching Backend function pointer
// (backend/backend.h), whose comments define the semantics; backend_cpu.c puts them in the table.
// Tests may call them directly. Buffers are plain host memory holding fp32.
#ifndef CLLA_LAYERS_CPU_OPS_H
#define CLLA_LAYERS_CPU_OPS_H

#include <stddef.h>

#include "backend/backend.h"

// OpenBLAS's small-matrix bound: an sgemm of M N K at most this (x86-64 with AVX-512,
// kernel/x86_64/*small_kernel_permit*.c of 0.3.21, Debian 12's) runs on its small-matrix kernels,
// which read the operands where they lie instead of packing them. The attention ops cut their
// tile products to stay under it (cpu_attention.c, sgemm_small; cpu_paged_attention.c, GEMM_TOKENS).
#define CPU_SGEMM_SMALL_MNK 1e6

// ---- memory (cpu_memory.c) ----
void *cpu_alloc(size_t bytes);
void cpu_release(void *p);
void cpu_zero(void *p, size_t bytes);
void cpu_upload(void *dst, const void *src, size_t bytes);
void cpu_download(void *dst, const void *src, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
void cpu_store_weights(float *dst, const float *master, size_t n, unsigned long long seed);
void cpu_act_to_host(float *dst_host, const float *src, size_t n);
void cpu_act_from_host(float *dst, const float *src_host, size_t n);

// ---- elementwise (cpu_elementwise.c) ----
void cpu_add_forward(float *out, const float *a, const float *b, size_t n);
void cpu_accumulate(float *dst, const float *src, size_t n);

// ---- token embedding (cpu_embedding.c) ----
void cpu_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C);
void cpu_embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C);

// ---- matmul (cpu_matmul.c) ----
void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC);
void cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC);
void cpu_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight, int N, int C,
                                 int OC);

// ---- RMSNorm (cpu_rmsnorm.c) ----
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                         int N, int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C);

// ---- RoPE (cpu_rope.c) ----
void cpu_rope_forward(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta);
void cpu_rope_backward(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta);
void cpu_rope_rows_forward(float *x, int N, int H, int S, int off, int D, const int *pos, float theta);

// ---- attention over a paged cache, one query per sequence (cpu_paged_attention.c) ----
void cpu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                         const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                         int n, int NH, int NKV, int DK, int DK2, int DV, float scale);

// ---- causal grouped-head attention (cpu_attention.c) ----
void cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                           int NKV, int DQK, int DV, float scale);
void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                            int NKV, int DQK, int DV, float scale);
// The same ops with P and dS rounded to bf16 where the CUDA kernel's tensor-core products read
// them (for the bf16 emulation backend): P before P V and dV, dS before dQ and dK.
void cpu_attention_forward_bf16p(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                 int NH, int NKV, int DQK, int DV, float scale);
void cpu_attention_backward_bf16p(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int DQK, int DV, float scale);

// ---- SwiGLU (cpu_swiglu.c) ----
void cpu_swiglu_forward(float *out, const float *gate, const float *up, int rows, int cols, int ld);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int rows, int cols,
                         int ld);

// ---- softmax cross-entropy (cpu_xent.c) ----
void cpu_xent_forward(float *losses, const float *logits, const int *targets, int N, int V,
                      int ignore_index);
void cpu_xent_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                       int ignore_index, float dloss);

// ---- optimizer (cpu_adamw.c) ----
double cpu_sumsq(const float *g, size_t n);
double cpu_sumsq_stripes(const float *g, size_t lo, size_t stripe, size_t period, size_t end);
void cpu_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                      float beta1, float beta2, float eps, float wd, float grad_scale, int t);

// ---- column copies (cpu_copy.c) ----
void cpu_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                   int N, int width, int accumulate);

// ---- int_group codec round trip (cpu_int_group.c) ----
void cpu_int_group_roundtrip(float *out, const float *in, int N, int W, int bits, int group);

// ---- mixture of experts (cpu_moe.c) ----
void cpu_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E);
void cpu_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                             const float *weight, int N, int C, int E);
void cpu_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C);
void cpu_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C);
void cpu_moe_combine_forward(float *out, const float *expert_out, const float *topk_w, const int *assign_row,
                             int N, int K, int C);
void cpu_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                              const float *topk_w, const int *assign_row, int N, int K, int C);
void cpu_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights, const int *expert_off,
                                   int E, int R, int C, int OC);
void cpu_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                    const float *const *weights, const int *expert_off, int E, int R, int C, int OC);

#endif
