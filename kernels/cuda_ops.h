// The CUDA backend's ops, one per Backend function pointer (backend/backend.h defines the
// semantics; backend_cuda.cu puts them in the table). C linkage, callable from C tests.
// "act"/weight pointers point to bf16 device memory although typed float*.
#ifndef CLLA_KERNELS_CUDA_OPS_H
#define CLLA_KERNELS_CUDA_OPS_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// The widest attention head (DQK and DV) the attention kernels hold in registers (8 a lane):
// the table's max_head_width, so a wider model is refused when it is built.
#define CUDA_ATT_MAX_D 256

// ---- memory (cuda_memory.cu) ----
void *cuda_alloc(size_t bytes);
void cuda_release(void *p);
void cuda_zero(void *p, size_t bytes);
void cuda_upload(void *dst, const void *src, size_t bytes);
void cuda_download(void *dst, const void *src, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);
void cuda_store_weights(float *dst, const float *master, size_t n, unsigned long long seed);
void cuda_act_to_host(float *dst_host, const float *src, size_t n);
void cuda_act_from_host(float *dst, const float *src_host, size_t n);

// ---- elementwise (cuda_elementwise.cu) and SwiGLU (cuda_swiglu.cu) ----
void cuda_add_forward(float *out, const float *a, const float *b, size_t n);
void cuda_accumulate(float *dst, const float *src, size_t n);
void cuda_swiglu_forward(float *out, const float *gate, const float *up, int rows, int cols, int stride);
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, int rows, int cols, int stride);

// ---- token embedding (cuda_embedding.cu) ----
void cuda_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C);
void cuda_embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C);

// ---- matmul (cuda_matmul.cu) ----
void cuda_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC);
void cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC);
void cuda_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight,
                                  int N, int C, int OC);

// ---- RMSNorm (cuda_rmsnorm.cu) ----
void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                          int N, int C, float eps);
void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

// ---- RoPE (cuda_rope.cu) ----
void cuda_rope_forward(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta);
void cuda_rope_backward(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta);

// ---- decoding (cuda_decode.cu) ----
void cuda_rope_rows_forward(float *x, int N, int H, int S, int off, int D, const int *pos, float theta);
void cuda_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                          const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                          int n, int NH, int NKV, int DK, int DK2, int DV, float scale);

// ---- causal grouped-head attention, no T x T matrix (cuda_attention.cu) ----
void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                            int NKV, int DQK, int DV, float scale);
void cuda_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                             int NKV, int DQK, int DV, float scale);

// ---- softmax cross-entropy (cuda_xent.cu) ----
void cuda_xent_forward(float *losses, const float *logits, const int *targets, int N, int V,
                       int ignore_index);
void cuda_xent_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                        int ignore_index, float dloss);

// ---- optimizer (cuda_adamw.cu) ----
double cuda_sumsq(const float *g, size_t n);
double cuda_sumsq_stripes(const float *g, size_t lo, size_t stripe, size_t period, size_t end);
void cuda_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, float grad_scale, int t);
void cuda_adamw_update_store(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,
                             float beta2, float eps, float wd, float grad_scale, int t, float *store,
                             unsigned long long seed);

// ---- column copies (cuda_copy.cu) ----
void cuda_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                    int N, int width, int accumulate);

// ---- the int_group codec's round trip (cuda_int_group.cu) ----
void cuda_int_group_roundtrip(float *out, const float *in, int N, int W, int bits, int group);

// ---- mixture of experts (cuda_moe.cu) ----
void cuda_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E);
void cuda_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                              const float *weight, int N, int C, int E);
void cuda_moe_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                           int N, int E, int K, int norm_topk);
void cuda_moe_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                       const int *topk_idx, int N, int E, int K, int capacity);
void cuda_moe_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N,
                          int E, int K, float aux_coef, float z_coef);
void cuda_moe_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs,
                                      const float *lse, const int *topk_idx, const float *topk_w,
                                      const int *counts, int N, int E, int K, int norm_topk,
                                      float aux_scale, float z_scale);
void cuda_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C);
void cuda_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C);
void cuda_moe_combine_forward(float *out, const float *expert_out, const float *topk_w,
                              const int *assign_row, int N, int K, int C);
void cuda_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                               const float *topk_w, const int *assign_row, int N, int K, int C);
void cuda_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights,
                                    const int *expert_off, int E, int R, int C, int OC);
void cuda_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                     const float *const *weights, const int *expert_off, int E, int R, int C, int OC);

#ifdef __cplusplus
}
#endif

#endif
