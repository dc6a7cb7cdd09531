// Every size clla derives from a config, bounded with checked 64-bit arithmetic before
// anything is laid out (issue 12: a 4.6e18-parameter config laid out a 512 MiB table and wrote
// past it; hidden sizes of 2^30 printed negative totals). The bound over-counts a little (every
// layer counted as a producer with both a dense MLP and experts), which only matters for
// configs within a factor of a few of 2^62 bytes, far beyond any machine.
//
// Passing it guarantees: per-tensor element counts, table totals and byte offsets (size_t,
// model/tensor_table.c) do not overflow; the widths the compute code keeps in int (heads x
// head_dim, rows of a micro-batch, experts + 1, ...) fit in int; the tensor tables' int
// indices do not overflow.
#include <limits.h>
#include <stdint.h>

#include "common/num.h"
#include "common/util.h"
#include "model/config.h"

typedef struct Plan {
    const char *origin;
    const char *big;    // label of the largest term so far (for the message)
    int64_t big_v;
} Plan;

static void overflow(const Plan *p, const char *label) {
    if (p->big)
        die("%s: the config's sizes overflow 64-bit arithmetic at %s (the largest term: %s): reduce those keys",
            p->origin, label, p->big);
    die("%s: the config's sizes overflow 64-bit arithmetic at %s: reduce those keys", p->origin, label);
}

static int64_t mul(const Plan *p, const char *label, int64_t a, int64_t b) {
    int64_t r = 0;
    if (ck_mul(a, b, &r)) overflow(p, label);
    return r;
}

static int64_t mul3(const Plan *p, const char *label, int64_t a, int64_t b, int64_t c) {
    return mul(p, label, mul(p, label, a, b), c);
}

// sum += v, remembering the largest term's label (for the message)
static void add(Plan *p, const char *label, int64_t *sum, int64_t v) {
    if (ck_add(*sum, v, sum)) overflow(p, label);
    if (v > p->big_v) { p->big_v = v; p->big = label; }
}

// sum += v for the totals (bytes of everything), which are not terms worth naming
static void total(const Plan *p, const char *label, int64_t *sum, int64_t v) {
    if (ck_add(*sum, v, sum)) overflow(p, label);
}

// A width the compute code holds in an int.
static int64_t width(const Plan *p, const char *label, int64_t v) {
    if (v > INT_MAX)
        die("%s: %s = %lld is more than the %d the kernels index with 32-bit ints: reduce those keys", p->origin, label,
            (long long)v, INT_MAX);
    return v;
}

void config_check_sizes(const Config *cfg, const char *origin) {
    const ModelConfig *m = &cfg->model;
    const TrainConfig *t = &cfg->train;
    Plan pl = {origin, NULL, 0};
    const Plan *p = &pl;
    const int64_t C = m->hidden_size, L = m->num_hidden_layers, NH = m->num_attention_heads, V = m->vocab_size;
    const int64_t NKV = m->num_key_value_heads, D = m->head_dim, DV = m->v_head_dim, I = m->intermediate_size;
    const int latent = config_is_latent(m);
    const int64_t R = latent ? m->kv_lora_rank : 0, DR = latent ? m->qk_rope_head_dim : 0, Rq = latent ? m->q_lora_rank : 0;
    const int64_t E = m->n_routed_experts > 0 ? m->n_routed_experts : 0, K = E ? m->num_experts_per_tok : 0;
    const int64_t MI = E ? m->moe_intermediate_size : 0;
    int64_t SI = 0;
    if (E && m->n_shared_experts > 0)
        SI = m->shared_expert_intermediate_size > 0 ? m->shared_expert_intermediate_size
                                                    : width(p, "n_shared_experts x moe_intermediate_size", (int64_t)m->n_shared_experts * MI);
    const int64_t QW = width(p, "num_attention_heads x (head_dim + qk_rope_head_dim)", NH * (D + DR));
    width(p, "num_attention_heads x (head_dim + v_head_dim)", NH * (D + DV));
    width(p, "num_key_value_heads x (head_dim + v_head_dim)", NKV * (D + DV));
    width(p, "kv_lora_rank + qk_rope_head_dim", R + DR);
    width(p, "n_routed_experts + 1", E + 1);
    const int64_t N = width(p, "train.micro_batch x train.seq_len", (int64_t)t->micro_batch * t->seq_len);
    width(p, "train.micro_batch x train.seq_len x num_experts_per_tok", N * K);
    const int64_t T = t->seq_len, B = t->micro_batch;

    // tensors: the tables index them with int
    int64_t tensors = mul(p, "num_hidden_layers x n_routed_experts (tensors)", L, 3 * E + 40);
    if (tensors > INT_MAX / 4)
        die("%s: num_hidden_layers = %lld with n_routed_experts = %lld makes more tensors than clla's tables hold (%d): reduce them",
            origin, (long long)L, (long long)E, INT_MAX / 4);

    // parameters per layer
    int64_t layer = 0;
    add(&pl, "num_attention_heads x (head_dim + qk_rope_head_dim) x hidden_size (q_proj)", &layer, mul(p, "q_proj", QW, C));
    if (Rq) add(&pl, "q_lora_rank x (hidden_size + heads x head dims) (q_a_proj, q_b_proj)", &layer,
                mul(p, "q_lora_rank x (hidden_size + heads x head dims)", Rq, C + 1 + QW));
    add(&pl, "num_key_value_heads x (head_dim + v_head_dim) x hidden_size (k_proj, v_proj)", &layer,
        mul3(p, "num_key_value_heads x (head_dim + v_head_dim) x hidden_size", NKV, D + DV, C));
    if (latent) {
        add(&pl, "(kv_lora_rank + 2 qk_rope_head_dim) x hidden_size (kv_a_proj)", &layer,
            mul(p, "(kv_lora_rank + qk_rope_head_dim) x hidden_size", R + 2 * DR + 1, C));
        add(&pl, "num_attention_heads x (head_dim + v_head_dim) x kv_lora_rank (kv_b_proj)", &layer,
            mul3(p, "num_attention_heads x (head_dim + v_head_dim) x kv_lora_rank", NH, D + DV, R));
    }
    add(&pl, "hidden_size x num_attention_heads x v_head_dim (o_proj)", &layer, mul3(p, "hidden_size x num_attention_heads x v_head_dim", C, NH, DV));
    add(&pl, "3 x intermediate_size x hidden_size (dense MLP)", &layer, mul3(p, "intermediate_size x hidden_size", 3, I, C));
    if (E) {
        add(&pl, "n_routed_experts x 3 x moe_intermediate_size x hidden_size (experts)", &layer,
            mul(p, "n_routed_experts x moe_intermediate_size x hidden_size", mul3(p, "n_routed_experts x moe_intermediate_size", E, 3, MI), C));
        add(&pl, "3 x shared expert width x hidden_size (shared expert)", &layer, mul3(p, "shared expert width x hidden_size", 3, SI, C));
        add(&pl, "n_routed_experts x hidden_size (router)", &layer, mul(p, "n_routed_experts x hidden_size", E, C));
    }
    add(&pl, "2 x hidden_size (norms)", &layer, 2 * C);
    int64_t params = mul(p, "num_hidden_layers x the parameters per layer", L, layer);
    add(&pl, "vocab_size x hidden_size (embeddings)", &params, mul3(p, "2 x vocab_size x hidden_size", 2, V, C));
    // params, fp32 masters, grads, AdamW m and v: 4 bytes each at most; 256-byte alignment per tensor and copy
    int64_t bytes = mul(p, "the parameter count x 20 bytes (weights, masters, grads, AdamW m and v)", params, 20);
    total(p, "tensor alignment", &bytes, mul(p, "tensor alignment", tensors, 256 * 8));

    // activations and their gradients per layer (elements), plus the model-level buffers
    int64_t act = 0;
    add(&pl, "train.micro_batch x train.seq_len x the layer's widths (activations)", &act,
        mul(p, "train.micro_batch x train.seq_len x the layer's widths",
            N, 8 * C + 4 * QW + 4 * Rq + 4 * (R + DR) + 2 * NH * (D + DV) + 4 * NH * DV + 2 * NKV * (D + DV) + 6 * I + 16));
    add(&pl, "train.micro_batch x num_attention_heads x train.seq_len^2 (attention scores)", &act,
        mul(p, "train.micro_batch x num_attention_heads x train.seq_len^2", mul3(p, "train.micro_batch x num_attention_heads x train.seq_len", B, NH, T), 2 * T));
    if (E) {
        int64_t row = 2 * E + 8 * K + 2 + 6 * SI;   // per token: router, top-k, shared expert
        if (ck_add(row, mul(p, "num_experts_per_tok x (moe_intermediate_size + hidden_size)", K, 6 * MI + 4 * C), &row))
            overflow(p, "num_experts_per_tok x (moe_intermediate_size + hidden_size)");
        add(&pl, "train.micro_batch x train.seq_len x experts (MoE activations)", &act,
            mul(p, "train.micro_batch x train.seq_len x expert widths", N, row));
        add(&pl, "n_routed_experts", &act, 2 * E + 2);
    }
    int64_t acts = mul(p, "num_hidden_layers x the activations per layer", L, act);
    add(&pl, "train.micro_batch x train.seq_len x vocab_size (logits)", &acts, mul3(p, "train.micro_batch x train.seq_len x vocab_size", N, 2, V + 8 * C + 8));
    total(p, "activation bytes", &bytes, mul(p, "activations x 4 bytes", acts, 4));
    if (bytes > INT64_MAX / 2)
        die("%s: the config needs more than 2^62 bytes to train (the largest term: %s): reduce those keys", origin,
            pl.big ? pl.big : "?");
}
