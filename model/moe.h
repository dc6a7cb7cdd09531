// The mixture-of-experts FFN (DeepSeek-V2 layout, Switch/GShard load balancing, Megatron-style
// capacity): parameters, activation buffers, forward and backward of one MoE layer, written
// against the Backend op table like the rest of model/. docs/MOE.md describes the layer.
//
//   y = shared(h) + sum over the kept top-K assignments (t, e) of w[t, e] * expert_e(h_t)
//
// Experts and the shared expert are SwiGLU MLPs. Router: fp32 logits, softmax over all E, top-K
// (ties to the lower index), weights renormalized only with norm_topk_prob. Capacity per expert
// and micro-batch ceil(N K / E * moe_capacity_factor) (0 = no dropping); the lowest-probability
// assignments are dropped (ties: the later token). Each expert runs on its own tokens only:
// gather, three matmuls, weighted scatter.
//
// Losses of a layer: aux = moe_aux_loss_coef * E * sum_e f_e P_e (f_e counted before dropping),
// z = moe_z_loss_coef * mean_t logsumexp(logits_t)^2. The model's loss is the LM loss plus the
// sum over MoE layers of aux + z; model_forward returns the LM loss and moe_aux_total the rest.
#ifndef CLLA_MODEL_MOE_H
#define CLLA_MODEL_MOE_H

#include "model/model.h"

// Parameter indices of one MoE layer (-1 where absent).
typedef struct MoeLayerParams {
    int router;                                 // mlp.gate.weight (E, C)
    int *gate_proj, *up_proj, *down_proj;       // [E]: experts.{e}.*_proj.weight
    int shared_gate, shared_up, shared_down;    // shared_experts.*_proj.weight
} MoeLayerParams;

// Activation indices of one MoE layer (in Model.acts). N = B*T tokens, R = N*K rows at most.
typedef struct MoeLayerActs {
    int probs;            // (N, E) f32 softmax of the router logits
    int lse;              // (N) f32 logsumexp of the logits (z-loss)
    int topk_idx;         // (N, K) int32
    int topk_w;           // (N, K) f32 combine weights (before dropping)
    int counts;           // (E) int32 assignments per expert before dropping
    int expert_off;       // (E+1) int32 row ranges of the experts
    int row_token;        // (R) int32
    int assign_row;       // (N, K) int32, -1 = dropped
    int aux;              // (2) f32 the layer's aux and z loss
    int gate_up, act;     // (R, 2Ie) gate | up of one product per expert, (R, Ie) SwiGLU; rows in expert order
    int expert_out;       // (R, C) expert outputs before weighting
    int s_gate_up, s_act;      // (N, 2Is), (N, Is) shared expert
} MoeLayerActs;

typedef struct MoeModel {
    int E, K, Ie, Is;     // routed experts, top-k, routed and shared intermediate sizes (Is 0: none)
    MoeLayerParams *lp;   // [L], filled for MoE layers
    MoeLayerActs *la;     // [L]
    // shared by all layers
    int logits;           // (N, E) f32 router logits
    int xs;               // (R, C) tokens gathered in expert order
    // activation gradients (Model.gacts), reused by every layer
    int dxs, dexpert_out;          // (R, C)
    int dgate_up, dact;            // (R, 2Ie), (R, Ie)
    int ds_gate_up, ds_act;        // (N, 2Is), (N, Is)
    int dtopk_w;                   // (N, K) f32
    int dlogits;                   // (N, E) f32
    const float **h_w;    // [E] host pointer arrays for the grouped expert matmuls
    float **h_dw;         // [E]
} MoeModel;

// Statistics of the last forward, over its MoE layers.
typedef struct MoeStats {
    int layers;               // MoE layers
    double aux_loss;          // sum of the layers' load-balancing losses
    double z_loss;            // sum of the layers' z-losses
    double max_share;         // mean over layers of the most loaded expert's share of assignments
    double min_share;         // same for the least loaded expert
    long long assignments;    // N*K per layer, summed
    long long dropped;        // assignments dropped by the capacity limit, summed
} MoeStats;

// Building (model/params.c, model/activations.c, model_free).
void moe_add_layer_params(Model *m, int l);
void moe_layout_acts(Model *m, TensorTable *acts, TensorTable *gacts);
void moe_free(Model *m);

// Capacity per expert for N tokens (0 = unlimited).
int moe_capacity(const ModelConfig *c, int N);
// Routed-expert parameters a token does NOT pass through: (E - K) experts per MoE layer.
long long moe_inactive_params(const Model *m);

// One MoE layer l: tmp_c (N, C) = MoE(h_mlp of layer l).
void moe_forward(Model *m, int l);
// Its backward given d(tmp_c) in ga.dres: adds d(h_mlp) into ga.dh and the parameter gradients
// (including the aux and z losses' gradients, times loss_scale) into m->grad.
void moe_backward(Model *m, int l, float loss_scale);

// aux + z summed over the MoE layers of the last forward (0 for a dense model).
double moe_aux_total(const Model *m);
// The statistics of the last forward (downloaded from backend memory: a sync on a device).
void moe_last_stats(const Model *m, MoeStats *s);

#endif
