// MoE routing on host memory, shared by the CPU and CUDA backends (backend/moe_routing.c).
#ifndef CLLA_BACKEND_MOE_ROUTING_H
#define CLLA_BACKEND_MOE_ROUTING_H

void moe_route_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                          int N, int E, int K, int norm_topk);
void moe_route_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                      const int *topk_idx, int N, int E, int K, int capacity);
void moe_route_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N, int E,
                         int K, float aux_coef, float z_coef);
void moe_route_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                                     const int *topk_idx, const float *topk_w, const int *counts, int N, int E,
                                     int K, int norm_topk, float aux_scale, float z_scale);

#endif
