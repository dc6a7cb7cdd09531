// The model orchestration: which op runs on which buffer, in which order, forward and
// backward. Written once against the Backend op table (backend/backend.h); the CPU and
// CUDA backends supply the ops. All buffers are entries of tensor tables.
#ifndef CLLA_MODEL_MODEL_H
#define CLLA_MODEL_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/cache.h"
#include "model/config.h"
#include "model/shard.h"
#include "model/tensor_table.h"

// Indices into Model.params (-1 where the layer has no such tensor).
typedef struct LayerParams {
    int input_norm, post_norm;
    int q_proj, o_proj;                 // q_proj absent with query LoRA
    int k_proj, v_proj;                 // plain K/V (producers of MHA/GQA/CLA)
    int q_a_proj, q_a_norm, q_b_proj;   // query LoRA (q_lora_rank > 0)
    int kv_a_proj;                      // latent producers: [kv_lora_rank + rope, C] (latent | k_rope)
    int kv_a_norm;                      // latent producers: RMSNorm of the latent
    int k_rope_proj;                    // latent consumers that project their own k_rope: [rope, C]
    int kv_b_proj;                      // latent: [NH * (D + DV), kv_lora_rank] (absent: latent_kvproj consumers)
    int gate_proj, up_proj, down_proj;   // up_proj joined to gate_proj: one (2I, C) matrix (model/params.c)
} LayerParams;

// Indices into Model.acts, per layer (-1 where the layer's attention kind has none).
typedef struct LayerActs {
    int res_in;          // (B,T,C) residual stream entering the layer
    int h_attn;          // (B,T,C) input_layernorm output
    int rstd_attn;       // (B*T) f32
    int q;               // (B,T,NH,DQK) after RoPE; DQK = D (+ rope dims for latent models)
    int cq, cq_norm, rstd_q;   // query LoRA: (B,T,Rq) down-projection, its RMSNorm, (B*T) f32
    int kv_a;            // latent producer: (B,T,r+DR) kv_a_proj output
    int c_raw;           // latent producer: (B,T,r) latent before its RMSNorm
    int rstd_c;          // latent producer: (B*T) f32
    int k_rope;          // latent consumer with its own rope key: (B,T,DR) after RoPE
    int kv;              // latent: (B,T,NH,D+DV) kv_b_proj output, per head [k_nope | v]
    int k, v;            // latent: (B,T,NH,D+DR) keys [k_nope | k_rope], (B,T,NH,DV) values
    int lse;             // (B,NH,T) f32 log-sum-exp of each attention score row
    int att_out;         // (B,T,NH,DV)
    int res_mid;         // (B,T,C) residual after attention
    int h_mlp;           // (B,T,C) post_attention_layernorm output
    int rstd_mlp;        // (B*T) f32
    int gate_up, act;   // (B,T,2I) gate_proj | up_proj outputs, one product; (B,T,I) silu(gate)*up
} LayerActs;

// Indices into Model.acts, per cache slot (the cache layer's payload in training).
typedef struct SlotActs {
    int k;               // plain: (B,T,NKV,D) after RoPE
    int v;               // plain: (B,T,NKV,DV)
    int c;               // latent: (B,T,r) normalized (and codec round-tripped) latent
    int k_rope;          // latent: (B,T,DR) the producer's rope key after RoPE
} SlotActs;

// Indices into Model.grads_act: activation gradients. One layer's worth is reused by
// every layer; slot gradients live per slot because consumers (later layers) add into
// them before their producer's backward runs.
typedef struct GradActs {
    int dres;            // (B,T,C) gradient of the residual stream (accumulates through layers)
    int dh;              // (B,T,C) gradient of a norm's output
    int dq;              // (B,T,NH,DQK)
    int dcq, dcq_norm;   // query LoRA (B,T,Rq)
    int dk, dv;          // latent: (B,T,NH,D+DR), (B,T,NH,DV)
    int dkv;             // latent: (B,T,NH,D+DV)
    int dkv_a;           // latent producer: (B,T,r+DR)
    int dc_raw;          // latent producer: (B,T,r)
    int dk_rope;         // latent consumer's own rope key (B,T,DR)
    int datt_out;        // (B,T,NH,DV)
    int dgate_up, dact;  // (B,T,2I) d(gate | up), (B,T,I) d(act)
    int dlogits;         // (B,T,V)
    int att_delta;       // (B,NH,T) f32 scratch of the attention backward (dO . O per row)
} GradActs;

typedef struct Model {
    ModelConfig cfg;
    const Backend *be;
    int n_slots;             // cache slots: ceil(L / share_factor)
    CacheLayout cache;       // slot map and codecs (training: int_group latent when quantized)

    // parameters
    TensorTable params;
    LayerParams *lp;         // [L]
    int embed, final_norm, lm_head;   // lm_head == embed when tied
    void *w;                 // storage copy used by the ops
    float *master;           // fp32 masters of the elements of master_sh of the flat fp32 layout,
                             // packed as model/shard.h says (== w when the storage is fp32, then
                             // always all of it)
    Shard master_sh;         // all elements unless ZeRO-1 sharded them (model_shard_masters)
    float *grad;             // fp32 gradients, same table
    struct MoeModel *moe;    // mixture-of-experts layers (model/moe.h); NULL for a dense model

    // activations for a fixed (B, T), allocated by model_set_batch
    int B, T;
    TensorTable acts;
    LayerActs *la;           // [L]
    SlotActs *sa;            // [n_slots]
    int res_final, h_final, rstd_final, logits, losses, tmp_c;
    void *act;
    TensorTable gacts;
    GradActs ga;
    SlotActs *gsa;           // [n_slots] gradients of slot payloads
    void *gact;
    int *d_inputs, *d_targets;   // backend copies of the current batch
    int32_t *h_targets;          // host copy (counts, ignore index)
    // inference (model/decode.c, evaluation through the cache)
    int inference;               // 1: no gradient buffers, no MoE capacity (every token keeps its experts)
    int apply_codecs;            // 1: the full forward applies every cache part's codec round trip
    const int *rope_pos;         // non-NULL: one row per sequence, at these positions (backend int32)
    float *h_losses;             // host copy of per-token losses
    // Gradients reported complete during model_backward, so that their sum over ranks can start
    // while the earlier layers compute (train/grad_sync.c): when set, called on the host thread
    // between ops with `from`, the first element of the flat fp32 layout from which every
    // gradient of this backward is written; from only falls, and the last call has from = 0
    // unless the backward returned early. On an asynchronous backend "written" is in stream order.
    void (*grad_final)(void *ctx, size_t from);
    void *grad_final_ctx;
    // Weights still arriving (train/grad_sync.c: ZeRO-1's all-gather of the updated weights
    // overlapping the next forward): when set, the forward calls it on the host thread before it
    // reads the weights of [0, upto) of the flat fp32 layout: the embedding's, each layer's in turn
    // (the layers lie in the layout in order), then all of them; upto only rises.
    void (*param_wait)(void *ctx, size_t upto);
    void *param_wait_ctx;
    int grad_final_by_layer;     // 1: each layer's gradients are complete after its own backward
                                 // (no layer writes a later layer's tensors; model/params.c)
} Model;

#define IGNORE_INDEX (-100)

// Builds the parameter table for cfg and allocates parameters and gradients on be.
// Dies with a clear message when cfg asks for something this build does not implement.
void model_build(Model *m, const ModelConfig *cfg, const Backend *be);
// Only the parameter table (no backend, nothing allocated): for counting and planning.
void model_build_table(Model *m, const ModelConfig *cfg, size_t store_bytes);
// The same tables, plan-only (model/tensor_table.h): sizes and byte totals without entries,
// for clla info and the memory check. model_layout_acts on such a model plans its activations
// the same way. Free with model_free.
void model_plan_table(Model *m, const ModelConfig *cfg, size_t store_bytes);
// Elements of the token embedding and, when untied, the output head (the tensors that
// model_build_table names model.embed_tokens.weight and lm_head.weight).
long long model_embedding_params(const ModelConfig *c);
// Only the activation tables for (B, T) (nothing allocated).
void model_layout_acts(Model *m, int B, int T, size_t store_bytes);
void model_free(Model *m);
// Seeded initialization: norms 1, matrices N(0, initializer_range), residual output
// projections (o_proj, down_proj) N(0, initializer_range / sqrt(2 L)) (GPT-2 scheme).
void model_init_weights(Model *m, unsigned long long seed);
// Loads every parameter from a safetensors file, an HF sharded set (its index .json) or a
// model directory holding either (model/safetensors.h: st_set_open), validating names,
// shapes and dtypes.
void model_load(Model *m, const char *path);
// Writes the fp32 masters to a safetensors file (atomically). Not on sharded masters (internal
// error): the data-parallel trainer assembles them and calls model_save_masters.
void model_save(Model *m, const char *path);
// The same from `masters`, a backend buffer holding the whole flat fp32 layout.
void model_save_masters(Model *m, const float *masters, const char *path);
// The same into directory dir: dir/model.safetensors, or HF shards of at most shard_bytes
// each with model.safetensors.index.json (shard_bytes 0: one file). See st_save_dir.
void model_save_dir(Model *m, const float *masters, const char *dir, unsigned long long shard_bytes);
// The same from `host`, the whole flat fp32 layout in host memory, as st_dtype (ST_F32, or
// ST_BF16 rounded to nearest even: inference packages). 0, or -1 with one line in err
// (nothing left behind).
int model_save_host(const Model *m, const float *host, const char *path, int st_dtype, char *err, size_t errlen);
// A backend buffer of the whole flat fp32 layout (the masters, a moment), readable on the host:
// the buffer itself on a backend whose memory is the host's (Backend.host_memory), else a copy
// downloaded into *copy, which the caller frees (NULL when none was made). A copy is a whole
// table that the training memory plan does not count.
const float *model_table_on_host(const Model *m, const float *buf, float **copy);
// model_save_masters and model_save_dir, returning -1 with one line in err instead of dying
// (the trainer names its last good checkpoint in the message).
int model_save_masters_checked(Model *m, const float *masters, const char *path, char *err, size_t errlen);
int model_save_dir_checked(Model *m, const float *masters, const char *dir, unsigned long long shard_bytes, char *err,
                           size_t errlen);
// After changing master weights on the host side: refresh the storage copy. On a backend
// with separate masters each tensor i is stored with store_weights(..., model_weight_seed(seed, i)).
// Not on sharded masters (internal error): see model_sync_weights_from.
void model_sync_weights(Model *m, unsigned long long seed);
// The same from `masters`, a backend buffer holding the whole flat fp32 layout.
void model_sync_weights_from(Model *m, const float *masters, unsigned long long seed);
// Sets the masters from `host`, the whole flat fp32 layout in host memory, and refreshes the
// storage copy with seed. Sharded masters keep their elements; the storage is rounded from the
// whole host copy staged in m->grad, which is zero afterwards.
void model_set_masters(Model *m, const float *host, unsigned long long seed);
// ZeRO-1 with separate masters (bf16 storage, its CPU emulation): keep only the elements of
// `own` (a contiguous piece or stripes, model/shard.h; from masters that are still whole),
// packed, the rest of the model's fp32 memory for masters freed. No-op where the masters are the
// storage (fp32 CPU): every rank needs the whole storage to run the model.
void model_shard_masters(Model *m, const Shard *own);
// The elements [a, b) of the flat layout (within one round of master_sh) in the masters.
float *model_master_at(const Model *m, size_t a, size_t b);
// Data parallel over NCCL: the gradient buffer reallocated to hold `floats` >= the flat
// layout's element count, the tail zero, so the in-place collectives of kernels/nccl_comm.h
// can cut it into world equal pieces. The contents are dropped (call before training).
void model_pad_grad(Model *m, size_t floats);
static inline int model_masters_sharded(const Model *m) { return !shard_is_all(&m->master_sh); }
// The rounding stream of tensor i for a store seed: the seed with the tensor index mixed in
// (sr_hash32 mixes the seed again, so the tensors' streams are unrelated).
static inline unsigned long long model_weight_seed(unsigned long long seed, int tensor) {
    return seed ^ (0x9E3779B97F4A7C15ull * (unsigned long long)(tensor + 1));
}

// Allocates activations for micro-batches of B sequences of T tokens.
void model_set_batch(Model *m, int B, int T);
// Forward on inputs (B*T host ints). With targets (B*T, IGNORE_INDEX allowed) it computes
// per-token losses and returns the mean over counted targets; without, returns 0.
float model_forward(Model *m, const int32_t *inputs, const int32_t *targets);
// Number of counted targets of the last forward.
int model_last_count(const Model *m);
// Rows first .. first + rows - 1 (row = b * T + t) of the last forward's logits, as fp32 on the
// host (rows x V): the rows a caller reads, never a host copy of all B x T x V beside the
// activations (which the memory checks of model/mem_plan.h would not have counted).
void model_logits_to_host(const Model *m, size_t first, size_t rows, float *dst);
void model_zero_grad(Model *m);
// Backward of (loss_scale * mean loss of the last forward); ACCUMULATES into m->grad.
void model_backward(Model *m, float loss_scale);

// Parameter counts (elements).
long long model_num_params(const Model *m);

#endif
