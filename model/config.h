// Model and run configuration: a JSON file with HF-style model keys at the top level
// and run settings under "train" (docs/DESIGN.md section 4). A config names an attention
// preset ("attention": "gqa", ...) and may override any knob of it.
#ifndef CLLA_MODEL_CONFIG_H
#define CLLA_MODEL_CONFIG_H

#include <cjson/cJSON.h>

enum { SHARE_KV = 0, SHARE_LATENT, SHARE_LATENT_KROPE, SHARE_LATENT_KVPROJ };

typedef struct ModelConfig {
    char attention[32];        // preset name, for logs and info
    int vocab_size;
    int hidden_size;           // C
    int num_hidden_layers;     // L
    int num_attention_heads;   // NH
    int num_key_value_heads;   // NKV (no latent)
    int head_dim;              // per-head q/k dim (the non-RoPE part for latent models)
    int v_head_dim;            // per-head v dim
    int intermediate_size;     // dense SwiGLU hidden size
    int q_lora_rank;           // 0: full q projection
    int kv_lora_rank;          // 0: plain K/V projections; >0: latent width (MLA)
    int qk_rope_head_dim;      // latent models: decoupled RoPE width
    int share_factor;          // F: layer l produces when l % F == 0
    int share;                 // SHARE_*: what consumers take from their producer
    int latent_quant_bits;     // 0 = off
    int latent_quant_group;
    // mixture of experts (0 routed experts = dense MLP everywhere)
    int n_routed_experts;
    int n_shared_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size;   // 0: n_shared_experts * moe_intermediate_size
    int first_k_dense_layers;
    float moe_aux_loss_coef;
    float moe_z_loss_coef;
    double moe_capacity_factor;   // double: ceil(N K / E * cf) of a cf like 1.2 must not see its float rounding (model/moe.c)
    int norm_topk_prob;
    // numerics
    float rms_norm_eps;
    float rope_theta;
    int max_position_embeddings;
    int tie_word_embeddings;
    float initializer_range;
} ModelConfig;

typedef struct TrainConfig {
    char data[1024];           // training tokens (uint32 file)
    char val_data[1024];       // optional validation tokens
    char tokenizer[1024];      // optional tokenizer file: shards made with another tokenizer are refused
    char tokenizer_hash[24];   // the training data's tokenizer hash, 16 hex digits ("" = unknown);
                               // recorded by clla train, checked by eval and init_from
    char out_dir[1024];        // where config.json, model.safetensors and metrics go
    char init_from[1024];      // optional safetensors to start from instead of random init
    char metrics[1024];        // metrics JSONL path ("" = <out_dir>/metrics.jsonl)
    int seq_len;               // T
    int micro_batch;           // B (sequences per micro-step)
    long long global_batch_tokens;  // tokens per optimizer step (multiple of B*T)
    int max_steps;
    int warmup_steps;
    float lr, min_lr;
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip;           // 0 = off
    unsigned long long seed;
    int log_every;
    int val_every;             // 0 = only at the end
    int val_batches;
    int threads;               // 0 = OpenMP default
    int save_every;            // checkpoint every N steps (0 = only on a stop request; docs/CHECKPOINTS.md)
    int keep_checkpoints;      // keep the newest K checkpoints (0 = all)
    int max_consecutive_skips; // stop after this many non-finite steps in a row
    int zero_stage;            // data parallel: 0 = every rank holds all AdamW state, 1 = sharded (ZeRO-1)
    float dist_timeout_s;      // data parallel: a collective waiting longer ends the job (0 = never)
    int overlap_grad_reduce;   // data parallel: the gradient sum over ranks starts during the backward
                               // (1), after it (0), or during it when the ranks span hosts (-1, "auto")
    long long grad_bucket_elements;  // data parallel: gradient elements per message of that overlap
} TrainConfig;

typedef struct Config {
    ModelConfig model;
    TrainConfig train;
} Config;

// Loads path, applies "--set key=value" overrides (dotted keys reach "train.*"),
// validates. Any problem: one line naming the key and the rule, exit 1.
void config_load(Config *cfg, const char *path, int n_sets, char **sets);
// --out DIR of train and init: train.out_dir, absolute as every path of the config.json a run
// writes (a relative one would resume elsewhere when read from another directory).
void config_set_out_dir(Config *cfg, const char *out);
// Same, from JSON text (tests). `origin` names the source in error messages.
void config_from_json(Config *cfg, const char *json, const char *origin, int n_sets, char **sets);
// A config's text parsed strictly (common/json_strict.h: text after the value, a key twice, a
// number cJSON reads loosely); dies with origin and the line and column, or when the top level
// is not an object. The caller frees the tree.
cJSON *config_parse(const char *text, size_t len, const char *origin);
// Same, from a tree json_parse_strict gave (common/json_strict.h; a package's config.json with its
// own sections taken out), which the overrides change. Not from a lenient cJSON parse: printing
// one back lost what the strict parse refuses (1e999 came back as null, the key's default).
void config_from_object(Config *cfg, cJSON *root, const char *origin, int n_sets, char **sets);
// Warns (one line each) when train.warmup_steps is longer than train.max_steps (the learning rate
// never reaches train.lr) and when top-1 routing with norm_topk_prob leaves the router no gradient
// from the loss. The trainer calls it; reading a config for info or eval does not.
void config_warn_training(const Config *cfg, const char *origin);
// Applies a preset's knobs (mha, gqa, mqa, ...). Returns 0 for an unknown name.
int config_apply_preset(ModelConfig *m, const char *preset);
// Checks every shape rule; dies with a message naming the key on failure.
void config_validate(const Config *cfg, const char *origin);
// Bounds every size derived from the config (parameters, activations, their bytes, the widths
// the kernels keep in int) with checked 64-bit arithmetic; dies naming the keys whose product
// overflows (model/config_sizes.c). config_validate calls it.
void config_check_sizes(const Config *cfg, const char *origin);
// The model config as a JSON object with HF keys (what config.json holds); the caller frees.
cJSON *config_model_to_json(const ModelConfig *m);
// The whole config (model keys + "train").
cJSON *config_to_json(const Config *cfg);

// Derived sizes.
static inline int config_is_latent(const ModelConfig *m) { return m->kv_lora_rank > 0; }
static inline int config_is_moe_layer(const ModelConfig *m, int l) {
    return m->n_routed_experts > 0 && l >= m->first_k_dense_layers;
}

#endif
