// The attention design space (docs/DESIGN.md section 1), forward and backward, for one layer:
//  plain:  q, k, v projections (MHA/GQA/MQA); consumers (CLA) read their producer's K/V slot.
//  latent: query (optionally LoRA), latent C = RMSNorm(H W_DKV) in the cache slot (int_group
//          codec round trip when quantized, straight-through backward), K_nope and V up-projected
//          per layer from C, a decoupled RoPE key shared by the heads (MLA/CLLA variants).
// Producers' slot gradients receive every consumer's contribution before the producer's own
// backward runs, because backward walks the layers from last to first.
#include <math.h>

#include "common/util.h"
#include "model/model_internal.h"

static int qk_rope_dim(const ModelConfig *c) { return config_is_latent(c) ? c->qk_rope_head_dim : 0; }
static float attn_scale(const ModelConfig *c) { return 1.0f / sqrtf((float)(c->head_dim + qk_rope_dim(c))); }

// RoPE on rows of x (N, H, S), dims [off, off + D) of each head: at positions 0..T-1 of each
// sequence (full-sequence forward), or at m->rope_pos (decoding: one row per sequence).
static void rope_apply(Model *m, float *x, int H, int S, int off, int D) {
    const ModelConfig *c = &m->cfg;
    if (m->rope_pos) m->be->rope_rows_forward(x, m->B * m->T, H, S, off, D, m->rope_pos, c->rope_theta);
    else m->be->rope_forward(x, m->B, m->T, H, S, off, D, 0, c->rope_theta);
}

// The cache codec of part p applied where the cache would hold the value: always for the
// trained int_group latent (straight-through in backward), for every part when evaluating
// through the cache (m->apply_codecs).
// Layer l's stream of the part (with its fitted state, if the codec has one). A codec of keys
// before RoPE (cq) gets a rotated key rotated back, and its round trip rotated forward again, as
// the decoder codes it (model/decode.c).
static void cache_roundtrip(Model *m, int l, int part, float *x) {
    const Codec *codec = &m->cache.part[part].codec;
    if (codec_is_exact(codec)) return;
    if (!m->apply_codecs && !(part == PART_LATENT && codec->kind == CODEC_INT_GROUP)) return;
    int s = m->cache.role[l].stream[part == PART_OWN_KROPE ? PART_KROPE : part];
    Codec sc = cache_stream_codec(&m->cache, s);
    const int rotated = codec_traits(codec->kind)->pre_rope && (part == PART_K || part == PART_KROPE || part == PART_OWN_KROPE);
    const int D = m->cache.part[part].head, H = m->cache.part[part].width / D;
    if (rotated) {
        if (m->rope_pos) die("internal error: a pre-RoPE codec's round trip in a decode step");
        m->be->rope_backward(x, m->B, m->T, H, D, 0, D, 0, m->cfg.rope_theta);
    }
    codec_roundtrip_seq(&sc, m->be, x, x, m->B, m->T, m->cache.part[part].width);
    if (rotated) rope_apply(m, x, H, D, 0, D);
}

// ---------------------------------------------------------------- query path (shared by both kinds)

void attention_query_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, NH = c->num_attention_heads;
    int D = c->head_dim, DR = qk_rope_dim(c), DQK = D + DR;
    if (p->q_a_proj >= 0) {
        int Rq = c->q_lora_rank;
        be->matmul_forward(A(x->cq), A(x->h_attn), P(p->q_a_proj), N, C, Rq);
        be->rmsnorm_forward(A(x->cq_norm), A(x->rstd_q), A(x->cq), P(p->q_a_norm), N, Rq, c->rms_norm_eps);
        be->matmul_forward(A(x->q), A(x->cq_norm), P(p->q_b_proj), N, Rq, NH * DQK);
    } else {
        be->matmul_forward(A(x->q), A(x->h_attn), P(p->q_proj), N, C, NH * DQK);
    }
    // plain models rotate the whole head; latent models only its last DR dims
    if (DR) rope_apply(m, A(x->q), NH, DQK, D, DR);
    else rope_apply(m, A(x->q), NH, D, 0, D);
}

// d(q) in ga.dq (RoPE undone here) -> adds d(h_attn) into ga.dh
static void query_backward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const GradActs *ga = &m->ga;
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, NH = c->num_attention_heads;
    int D = c->head_dim, DR = qk_rope_dim(c), DQK = D + DR;
    size_t sb = be->act_bytes;
    if (DR) be->rope_backward(DA(ga->dq), B, T, NH, DQK, D, DR, 0, c->rope_theta);
    else be->rope_backward(DA(ga->dq), B, T, NH, D, 0, D, 0, c->rope_theta);
    if (p->q_a_proj >= 0) {
        int Rq = c->q_lora_rank;
        be->zero(DA(ga->dcq_norm), (size_t)N * Rq * sb);
        be->matmul_backward(DA(ga->dcq_norm), G(p->q_b_proj), DA(ga->dq), A(x->cq_norm), P(p->q_b_proj), N, Rq, NH * DQK);
        be->zero(DA(ga->dcq), (size_t)N * Rq * sb);
        be->rmsnorm_backward(DA(ga->dcq), G(p->q_a_norm), DA(ga->dcq_norm), A(x->cq), P(p->q_a_norm), A(x->rstd_q), N, Rq);
        be->matmul_backward(DA(ga->dh), G(p->q_a_proj), DA(ga->dcq), A(x->h_attn), P(p->q_a_proj), N, C, Rq);
    } else {
        be->matmul_backward(DA(ga->dh), G(p->q_proj), DA(ga->dq), A(x->h_attn), P(p->q_proj), N, C, NH * DQK);
    }
}

// ---------------------------------------------------------------- plain K/V (MHA, GQA, MQA, CLA)

// Producer: the slot's K (after RoPE) and V from h_attn, as the cache stores them (before its codec).
static void plain_kv_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const SlotActs *s = &m->sa[cache_slot_of(&m->cache, l)];
    int N = m->B * m->T, C = c->hidden_size, NKV = c->num_key_value_heads, D = c->head_dim, DV = c->v_head_dim;
    be->matmul_forward(A(s->k), A(x->h_attn), P(p->k_proj), N, C, NKV * D);
    be->matmul_forward(A(s->v), A(x->h_attn), P(p->v_proj), N, C, NKV * DV);
    rope_apply(m, A(s->k), NKV, D, 0, D);
}

static void plain_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerActs *x = &m->la[l];
    const SlotActs *s = &m->sa[cache_slot_of(&m->cache, l)];
    int B = m->B, T = m->T, NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    int D = c->head_dim, DV = c->v_head_dim;
    if (cache_is_producer(&m->cache, l)) {
        cache_roundtrip(m, l, PART_K, A(s->k));
        cache_roundtrip(m, l, PART_V, A(s->v));
    }
    be->attention_forward(A(x->att_out), A(x->lse), A(x->q), A(s->k), A(s->v), B, T, NH, NKV, D, DV, attn_scale(c));
}

static void plain_backward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const GradActs *ga = &m->ga;
    int slot = cache_slot_of(&m->cache, l);
    const SlotActs *s = &m->sa[slot], *gs = &m->gsa[slot];
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    int D = c->head_dim, DV = c->v_head_dim;
    be->attention_backward(DA(ga->dq), DA(gs->k), DA(gs->v), DA(ga->att_delta), DA(ga->datt_out), A(x->att_out), A(x->lse),
                           A(x->q), A(s->k), A(s->v), B, T, NH, NKV, D, DV, attn_scale(c));
    query_backward(m, l);
    if (cache_is_producer(&m->cache, l)) {
        // every consumer of this slot (a later layer) has added its share already
        be->rope_backward(DA(gs->k), B, T, NKV, D, 0, D, 0, c->rope_theta);
        be->matmul_backward(DA(ga->dh), G(p->k_proj), DA(gs->k), A(x->h_attn), P(p->k_proj), N, C, NKV * D);
        be->matmul_backward(DA(ga->dh), G(p->v_proj), DA(gs->v), A(x->h_attn), P(p->v_proj), N, C, NKV * DV);
    }
}

// ---------------------------------------------------------------- latent K/V (MLA, CLLA*)

// Which up-projection layer l uses: its own, or (latent_kvproj consumers) its producer's.
static int kv_b_of(const Model *m, int l) { return m->lp[m->cache.role[l].kv_b_layer].kv_b_proj; }

// The rope key layer l attends with: its own (consumers that project one), else the slot's.
static int krope_act(const Model *m, int l) {
    return m->cache.role[l].own_krope ? m->la[l].k_rope : m->sa[cache_slot_of(&m->cache, l)].k_rope;
}
static int dkrope_act(const Model *m, int l) {
    return m->cache.role[l].own_krope ? m->ga.dk_rope : m->gsa[cache_slot_of(&m->cache, l)].k_rope;
}

// What layer l writes into the cache, before the codec: a producer's normalized latent and
// rotated rope key (slot), a consumer's own rotated rope key.
static void latent_kv_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const SlotActs *s = &m->sa[cache_slot_of(&m->cache, l)];
    int N = m->B * m->T, C = c->hidden_size, R = c->kv_lora_rank, DR = c->qk_rope_head_dim;
    if (cache_is_producer(&m->cache, l)) {
        // kv_a (N, R+DR) = [latent | k_rope]
        be->matmul_forward(A(x->kv_a), A(x->h_attn), P(p->kv_a_proj), N, C, R + DR);
        be->copy_cols(A(x->c_raw), R, 0, A(x->kv_a), R + DR, 0, N, R, 0);
        be->rmsnorm_forward(A(s->c), A(x->rstd_c), A(x->c_raw), P(p->kv_a_norm), N, R, c->rms_norm_eps);
        be->copy_cols(A(s->k_rope), DR, 0, A(x->kv_a), R + DR, R, N, DR, 0);
        rope_apply(m, A(s->k_rope), 1, DR, 0, DR);
    } else if (m->cache.role[l].own_krope) {
        be->matmul_forward(A(x->k_rope), A(x->h_attn), P(p->k_rope_proj), N, C, DR);
        rope_apply(m, A(x->k_rope), 1, DR, 0, DR);
    }
}

void attention_kv_forward(Model *m, int l) {
    if (config_is_latent(&m->cfg)) latent_kv_forward(m, l);
    else if (cache_is_producer(&m->cache, l)) plain_kv_forward(m, l);
}

static void latent_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerActs *x = &m->la[l];
    const SlotActs *s = &m->sa[cache_slot_of(&m->cache, l)];
    int B = m->B, T = m->T, N = B * T, NH = c->num_attention_heads;
    int D = c->head_dim, DV = c->v_head_dim, R = c->kv_lora_rank, DR = c->qk_rope_head_dim, DQK = D + DR;
    // the slot keeps what the cache would give back: the codec round trip of each part
    if (cache_is_producer(&m->cache, l)) {
        cache_roundtrip(m, l, PART_LATENT, A(s->c));
        cache_roundtrip(m, l, PART_KROPE, A(s->k_rope));
    } else if (m->cache.role[l].own_krope) {
        cache_roundtrip(m, l, PART_OWN_KROPE, A(x->k_rope));
    }
    // per-head keys [k_nope | k_rope] and values from kv (N, NH, D+DV) = C W_UKV^T
    be->matmul_forward(A(x->kv), A(s->c), P(kv_b_of(m, l)), N, R, NH * (D + DV));
    float *kr = A(krope_act(m, l));
    for (int h = 0; h < NH; h++) {
        be->copy_cols(A(x->k), NH * DQK, h * DQK, A(x->kv), NH * (D + DV), h * (D + DV), N, D, 0);
        be->copy_cols(A(x->k), NH * DQK, h * DQK + D, kr, DR, 0, N, DR, 0);
        be->copy_cols(A(x->v), NH * DV, h * DV, A(x->kv), NH * (D + DV), h * (D + DV) + D, N, DV, 0);
    }
    be->attention_forward(A(x->att_out), A(x->lse), A(x->q), A(x->k), A(x->v), B, T, NH, NH, DQK, DV, attn_scale(c));
}

static void latent_backward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const GradActs *ga = &m->ga;
    int slot = cache_slot_of(&m->cache, l);
    const SlotActs *s = &m->sa[slot], *gs = &m->gsa[slot];
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, NH = c->num_attention_heads;
    int D = c->head_dim, DV = c->v_head_dim, R = c->kv_lora_rank, DR = c->qk_rope_head_dim, DQK = D + DR;
    size_t sb = be->act_bytes;
    be->zero(DA(ga->dk), (size_t)N * NH * DQK * sb);
    be->zero(DA(ga->dv), (size_t)N * NH * DV * sb);
    be->attention_backward(DA(ga->dq), DA(ga->dk), DA(ga->dv), DA(ga->att_delta), DA(ga->datt_out), A(x->att_out), A(x->lse),
                           A(x->q), A(x->k), A(x->v), B, T, NH, NH, DQK, DV, attn_scale(c));
    query_backward(m, l);
    // keys and values back into kv and the rope key (summed over heads, fixed order)
    int own_rope = m->cache.role[l].own_krope;
    if (own_rope) be->zero(DA(ga->dk_rope), (size_t)N * DR * sb);
    float *dkr = DA(dkrope_act(m, l));
    be->zero(DA(ga->dkv), (size_t)N * NH * (D + DV) * sb);
    for (int h = 0; h < NH; h++) {
        be->copy_cols(DA(ga->dkv), NH * (D + DV), h * (D + DV), DA(ga->dk), NH * DQK, h * DQK, N, D, 1);
        be->copy_cols(dkr, DR, 0, DA(ga->dk), NH * DQK, h * DQK + D, N, DR, 1);
        be->copy_cols(DA(ga->dkv), NH * (D + DV), h * (D + DV) + D, DA(ga->dv), NH * DV, h * DV, N, DV, 1);
    }
    int kvb = kv_b_of(m, l);
    be->matmul_backward(DA(gs->c), G(kvb), DA(ga->dkv), A(s->c), P(kvb), N, R, NH * (D + DV));
    if (own_rope) {
        be->rope_backward(DA(ga->dk_rope), B, T, 1, DR, 0, DR, 0, c->rope_theta);
        be->matmul_backward(DA(ga->dh), G(p->k_rope_proj), DA(ga->dk_rope), A(x->h_attn), P(p->k_rope_proj), N, C, DR);
    }
    if (cache_is_producer(&m->cache, l)) {
        // the slot's gradients are complete: every consumer (a later layer) has added its share
        be->rope_backward(DA(gs->k_rope), B, T, 1, DR, 0, DR, 0, c->rope_theta);
        be->copy_cols(DA(ga->dkv_a), R + DR, R, DA(gs->k_rope), DR, 0, N, DR, 0);
        // straight-through estimator: the codec round trip passes the gradient unchanged
        be->zero(DA(ga->dc_raw), (size_t)N * R * sb);
        be->rmsnorm_backward(DA(ga->dc_raw), G(p->kv_a_norm), DA(gs->c), A(x->c_raw), P(p->kv_a_norm), A(x->rstd_c), N, R);
        be->copy_cols(DA(ga->dkv_a), R + DR, 0, DA(ga->dc_raw), R, 0, N, R, 0);
        be->matmul_backward(DA(ga->dh), G(p->kv_a_proj), DA(ga->dkv_a), A(x->h_attn), P(p->kv_a_proj), N, C, R + DR);
    }
}

// ---------------------------------------------------------------- entry points

void attention_cached_forward(Model *m, int l) {
    if (config_is_latent(&m->cfg)) latent_forward(m, l);
    else plain_forward(m, l);
}

void attention_block_forward(Model *m, int l) {
    attention_query_forward(m, l);
    attention_kv_forward(m, l);
    attention_cached_forward(m, l);
}

void attention_block_backward(Model *m, int l) {
    const GradActs *ga = &m->ga;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, DQK = c->head_dim + qk_rope_dim(c);
    m->be->zero(DA(ga->dq), (size_t)N * c->num_attention_heads * DQK * m->be->act_bytes);
    if (config_is_latent(c)) latent_backward(m, l);
    else plain_backward(m, l);
}
