// Parameter table (names follow HF Llama / DeepSeek-V2), allocation, initialization,
// and safetensors load/save of the fp32 masters.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/safetensors.h"

static int add_matrix(TensorTable *tt, int layer, int64_t out, int64_t in, const char *fmt, int l) {
    int64_t shape[2] = {out, in};
    return table_addf(tt, layer, 1, DT_STORE, 2, shape, fmt, l);
}

static int add_norm(TensorTable *tt, int layer, int64_t c, const char *fmt, int l) {
    int64_t shape[1] = {c};
    return table_addf(tt, layer, 0, DT_STORE, 1, shape, fmt, l);
}

static void check_supported(const ModelConfig *c) { (void)c; }

static void layer_params_none(LayerParams *p) {
    memset(p, 0xff, sizeof(*p));   // every index -1
}

// Attention tensors of layer l (docs/DESIGN.md section 1): plain (MHA/GQA/MQA/CLA) or latent (MLA/CLLA);
// producers own what they share, consumers only what they keep.
static void add_attention_params(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    TensorTable *tt = &m->params;
    LayerParams *p = &m->lp[l];
    int C = c->hidden_size, NH = c->num_attention_heads, D = c->head_dim, DV = c->v_head_dim;
    const LayerRole *role = &m->cache.role[l];
    int producer = role->producer;
    if (!config_is_latent(c)) {
        p->q_proj = add_matrix(tt, l, (int64_t)NH * D, C, "model.layers.%d.self_attn.q_proj.weight", l);
        if (producer) {
            p->k_proj = add_matrix(tt, l, (int64_t)c->num_key_value_heads * D, C, "model.layers.%d.self_attn.k_proj.weight", l);
            p->v_proj = add_matrix(tt, l, (int64_t)c->num_key_value_heads * DV, C, "model.layers.%d.self_attn.v_proj.weight", l);
        }
    } else {
        int R = c->kv_lora_rank, DR = c->qk_rope_head_dim, Rq = c->q_lora_rank;
        int64_t qw = (int64_t)NH * (D + DR);
        if (Rq > 0) {
            p->q_a_proj = add_matrix(tt, l, Rq, C, "model.layers.%d.self_attn.q_a_proj.weight", l);
            p->q_a_norm = add_norm(tt, l, Rq, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
            p->q_b_proj = add_matrix(tt, l, qw, Rq, "model.layers.%d.self_attn.q_b_proj.weight", l);
        } else {
            p->q_proj = add_matrix(tt, l, qw, C, "model.layers.%d.self_attn.q_proj.weight", l);
        }
        if (producer) {
            p->kv_a_proj = add_matrix(tt, l, (int64_t)R + DR, C, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
            p->kv_a_norm = add_norm(tt, l, R, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
        } else if (role->own_krope) {
            p->k_rope_proj = add_matrix(tt, l, DR, C, "model.layers.%d.self_attn.k_rope_proj.weight", l);
        }
        if (role->kv_b_layer == l)
            p->kv_b_proj = add_matrix(tt, l, (int64_t)NH * (D + DV), R, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    }
    p->o_proj = add_matrix(tt, l, C, (int64_t)NH * DV, "model.layers.%d.self_attn.o_proj.weight", l);
}

// 1 when the backward, walking the layers from the last, finishes each layer's gradients with
// that layer: the layers' tensors lie in layer order (build_table), each layer writes its own and
// those of the layers it reads from the cache role table (the slot's producer, the kv_b_proj
// source), so it suffices that those come before it. CLA and CLLA share forward (a producer is
// the first layer of its group); a layout that broke this would only lose the per-layer reports
// (model/forward.c), not correctness.
static int layers_write_backward(const CacheLayout *cl) {
    for (int l = 0; l < cl->n_layers; l++) {
        const LayerRole *r = &cl->role[l];
        if (r->kv_b_layer > l) return 0;
        for (int p = 0; p < N_PARTS; p++)
            if (r->stream[p] >= 0 && cl->streams[r->stream[p]].layer > l) return 0;
    }
    return 1;
}

static void build_table(Model *m, const ModelConfig *cfg, size_t store_bytes, int plan_only) {
    check_supported(cfg);
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    const ModelConfig *c = &m->cfg;
    int L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size;
    m->n_slots = (L - 1) / c->share_factor + 1;   // ceil(L / F) without overflowing at F = INT_MAX
    cache_layout(&m->cache, c);
    TensorTable *tt = &m->params;
    if (plan_only) tt->plan_store_bytes = store_bytes;
    m->embed = add_matrix(tt, -1, c->vocab_size, C, "model.embed_tokens.weight", 0);
    m->lp = xcalloc((size_t)L, sizeof(LayerParams));
    for (int l = 0; l < L; l++) {
        LayerParams *p = &m->lp[l];
        layer_params_none(p);
        p->input_norm = add_norm(tt, l, C, "model.layers.%d.input_layernorm.weight", l);
        add_attention_params(m, l);
        p->post_norm = add_norm(tt, l, C, "model.layers.%d.post_attention_layernorm.weight", l);
        if (config_is_moe_layer(c, l)) {
            moe_add_layer_params(m, l);
        } else {
            // up_proj joined to gate_proj: one (2I, C) matrix, one product for both (model/forward.c)
            p->gate_proj = add_matrix(tt, l, I, C, "model.layers.%d.mlp.gate_proj.weight", l);
            table_join_next(tt);
            p->up_proj = add_matrix(tt, l, I, C, "model.layers.%d.mlp.up_proj.weight", l);
            p->down_proj = add_matrix(tt, l, C, I, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    m->final_norm = add_norm(tt, -1, C, "model.norm.weight", 0);
    m->lm_head = c->tie_word_embeddings ? m->embed : add_matrix(tt, -1, c->vocab_size, C, "lm_head.weight", 0);
    table_layout(tt, store_bytes);
    m->grad_final_by_layer = layers_write_backward(&m->cache);
}

void model_build_table(Model *m, const ModelConfig *cfg, size_t store_bytes) { build_table(m, cfg, store_bytes, 0); }
void model_plan_table(Model *m, const ModelConfig *cfg, size_t store_bytes) { build_table(m, cfg, store_bytes, 1); }

long long model_embedding_params(const ModelConfig *c) {
    return (long long)c->vocab_size * c->hidden_size * (c->tie_word_embeddings ? 1 : 2);   // embed (+ lm_head)
}

void model_build(Model *m, const ModelConfig *cfg, const Backend *be) {
    const char *missing = backend_missing_op(be, BACKEND_OPS_CORE | (cfg->n_routed_experts > 0 ? BACKEND_OPS_MOE : 0));
    if (missing) die("backend '%s' lacks the op '%s' this model needs: use --device cpu", be->name, missing);
    const int dqk = cfg->head_dim + (config_is_latent(cfg) ? cfg->qk_rope_head_dim : 0);
    if (be->max_head_width > 0 && (dqk > be->max_head_width || cfg->v_head_dim > be->max_head_width))
        die("backend '%s' takes attention heads up to %d wide, and this model's are %d (query/key) and %d (value): use "
            "narrower heads, or --device cpu",
            be->name, be->max_head_width, dqk, cfg->v_head_dim);
    model_build_table(m, cfg, be->act_bytes);
    m->be = be;
    const TensorTable *tt = &m->params;
    m->w = be->alloc(tt->bytes_store);
    // Masters alias fp32 storage unless the backend rounds its weights (bf16, or emulated bf16).
    int separate = be->act_bytes != 4 || be->separate_master;
    m->master = separate ? be->alloc(tt->bytes_f32) : (float *)m->w;
    const size_t n = tt->bytes_f32 / 4;
    m->master_sh = (Shard){0, n, n, n};
    m->grad = be->alloc(tt->bytes_f32);
}

void model_shard_masters(Model *m, const Shard *own) {
    if ((void *)m->master == m->w) return;
    if (model_masters_sharded(m) || own->end != m->master_sh.end || own->stripe == 0 || own->stripe > own->period ||
        own->lo > own->period - own->stripe)
        die("model_shard_masters: stripes of %zu from %zu every %zu over %zu elements, from masters already sharded or of "
            "another layout (internal error)", own->stripe, own->lo, own->period, own->end);
    const size_t count = shard_count(own);
    float *packed = m->be->alloc((count ? count : 1) * sizeof(float));   // zero (backend/backend.h): the padding past end
    shard_copy(own, m->be->copy, packed, m->master, 1);
    m->be->release(m->master);
    m->master = packed;
    m->master_sh = *own;
}

float *model_master_at(const Model *m, size_t a, size_t b) {
    const Shard *s = &m->master_sh;
    const size_t k = s->period ? a / s->period : 0;
    size_t lo, hi, off;
    shard_range(s, k, &lo, &hi, &off);
    if (a < lo || b > hi || a > b)
        die("model_master_at: elements [%zu, %zu) are not within one round of this rank's masters (internal error)", a, b);
    return m->master + off + (a - lo);
}

void model_pad_grad(Model *m, size_t floats) {
    const size_t n = m->params.bytes_f32 / 4;
    if (floats < n) die("model_pad_grad: %zu floats is less than the %zu of the gradients (internal error)", floats, n);
    if (floats > SIZE_MAX / sizeof(float)) die("model_pad_grad: %zu floats overflow a size (internal error)", floats);
    // released first: the old contents are not needed, and two full buffers at once is the
    // memory this padding exists to save
    m->be->release(m->grad);
    m->grad = m->be->alloc(floats * sizeof(float));   // zero-initialized (backend/backend.h)
}

void model_free(Model *m) {
    const Backend *be = m->be;
    if (!be) {   // table only (model_build_table)
        free(m->lp); free(m->la); free(m->sa); free(m->gsa);
        cache_layout_free(&m->cache);
        moe_free(m);
        table_free(&m->params); table_free(&m->acts); table_free(&m->gacts);
        memset(m, 0, sizeof(*m));
        return;
    }
    if (m->master && (void *)m->master != m->w) be->release(m->master);
    be->release(m->w);
    be->release(m->grad);
    if (m->act) be->release(m->act);
    if (m->gact) be->release(m->gact);
    if (m->d_inputs) be->release(m->d_inputs);
    if (m->d_targets) be->release(m->d_targets);
    free(m->h_targets);
    free(m->h_losses);
    free(m->lp);
    free(m->la);
    free(m->sa);
    cache_layout_free(&m->cache);
    free(m->gsa);
    moe_free(m);
    table_free(&m->params);
    table_free(&m->acts);
    table_free(&m->gacts);
    memset(m, 0, sizeof(*m));
}

long long model_num_params(const Model *m) { return (long long)m->params.numel; }

static int is_residual_output(const char *name) {
    return strstr(name, ".o_proj.") || strstr(name, ".down_proj.");
}

// One store per tensor: with 2-byte storage the two layouts pad differently (every tensor is
// 256-byte aligned in each), so element k of the flat fp32 buffer is not element k of the
// storage buffer unless every tensor's size is a multiple of 128; one flat call would write a
// tensor where the ops do not read it (a norm of 40 or 64 values shifts everything after it).
void model_sync_weights_from(Model *m, const float *masters, unsigned long long seed) {
    if ((void *)m->master == m->w) return;
    const TensorTable *tt = &m->params;
    for (int i = 0; i < tt->n; i++)
        m->be->store_weights(table_ptr_store(tt, m->w, i), table_ptr_f32(tt, (float *)masters, i), tt->t[i].numel,
                             model_weight_seed(seed, i));
}

void model_sync_weights(Model *m, unsigned long long seed) {
    if (model_masters_sharded(m)) die("model_sync_weights on sharded masters (internal error: use model_sync_weights_from)");
    model_sync_weights_from(m, m->master, seed);
}

void model_set_masters(Model *m, const float *host, unsigned long long seed) {
    const size_t bytes = m->params.bytes_f32;
    if (!model_masters_sharded(m)) {
        m->be->upload(m->master, host, bytes);
        model_sync_weights(m, seed);
        return;
    }
    shard_copy(&m->master_sh, m->be->upload, m->master, host, 1);
    m->be->upload(m->grad, host, bytes);
    model_sync_weights_from(m, m->grad, seed);
    m->be->zero(m->grad, bytes);
}

// Every matrix std x normals of the seed's stream, in table order, by rng_fill_normal
// (common/rng.h): the draws are taken a chunk at a time on one thread (a nanosecond each), the
// transforms (log, cos, sqrt: tens of nanoseconds) run on every thread, and the values are those
// of the sequential loop for any thread count.
void model_init_weights(Model *m, unsigned long long seed) {
    const TensorTable *tt = &m->params;
    float *host = xcalloc(tt->bytes_f32 / 4, sizeof(float));
    Rng rng;
    rng_seed(&rng, seed);
    double std0 = m->cfg.initializer_range;
    double std_res = std0 / sqrt(2.0 * m->cfg.num_hidden_layers);
    uint64_t *draws = xmalloc(2 * RNG_FILL_CHUNK * sizeof(uint64_t));
    for (int i = 0; i < tt->n; i++) {
        const TensorInfo *ti = &tt->t[i];
        float *p = (float *)((char *)host + ti->off_f32);
        if (ti->ndim == 1) {
            for (size_t k = 0; k < ti->numel; k++) p[k] = 1.0f;
        } else {
            double std = is_residual_output(ti->name) ? std_res : std0;
            rng_fill_normal(p, ti->numel, std, &rng, draws);
        }
    }
    free(draws);
    model_set_masters(m, host, seed);
    free(host);
}

void model_load(Model *m, const char *path) {
    const TensorTable *tt = &m->params;
    StSet ss;
    char err[1024];
    if (st_set_open(&ss, path, err, sizeof(err)) != 0) die("cannot load weights: %s", err);
    for (int r = 0; r < ss.n; r++) {
        const char *name = ss.refs[r].name;
        if (table_find(tt, name) >= 0) continue;
        // RoPE's inverse frequencies, which older HF checkpoints save and HF itself recomputes
        // (clla computes them from rope_theta): not a weight
        const size_t n = strlen(name), k = strlen(".rotary_emb.inv_freq");
        if (n > k && !strcmp(name + n - k, ".rotary_emb.inv_freq")) continue;
        if (!strcmp(name, "lm_head.weight") && m->cfg.tie_word_embeddings)
            die("weights '%s' hold lm_head.weight, and the config ties the output head to the embedding (tie_word_embeddings true): "
                "set tie_word_embeddings false to use that head, or remove the tensor", path);
        die("weights '%s': tensor '%s' does not belong to this config (attention '%s', tie_word_embeddings %d): use the config.json saved with the weights",
            path, name, m->cfg.attention, m->cfg.tie_word_embeddings);
    }
    float *host = xcalloc(tt->bytes_f32 / 4, sizeof(float));
    for (int i = 0; i < tt->n; i++) {
        const TensorInfo *ti = &tt->t[i];
        int r = st_set_find(&ss, ti->name);
        if (r < 0) die("weights '%s': tensor '%s' is missing: use the config.json saved with the weights", path, ti->name);
        const StEntry *e = st_set_entry(&ss, r);
        int same = e->ndim == ti->ndim;
        for (int d = 0; same && d < ti->ndim; d++) same = e->shape[d] == ti->shape[d];
        if (!same) {
            char want[64] = "", got[64] = "";
            for (int d = 0; d < ti->ndim; d++) snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", d ? "," : "", (long long)ti->shape[d]);
            for (int d = 0; d < e->ndim; d++) snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", d ? "," : "", (long long)e->shape[d]);
            die("weights '%s': tensor '%s' has shape [%s], the config needs [%s]: use the config.json saved with the weights", path, ti->name, got, want);
        }
        float *w = (float *)((char *)host + ti->off_f32);
        if (st_set_read_f32(&ss, r, w, err, sizeof(err)) != 0) die("weights '%s': %s", path, err);
        // a NaN or an infinity would surface steps later as a non-finite loss blamed on the
        // learning rate: named here instead
        for (size_t k = 0; k < ti->numel; k++)
            if (!isfinite(w[k]))
                die("weights '%s': tensor '%s' holds %s at element %zu: the file is damaged, or the run that wrote it diverged; use other weights",
                    path, ti->name, isnan(w[k]) ? "NaN" : "an infinity", k);
    }
    st_set_close(&ss);
    model_set_masters(m, host, 0);
    free(host);
}

void model_save(Model *m, const char *path) {
    if (model_masters_sharded(m)) die("model_save on sharded masters (internal error: use model_save_masters)");
    model_save_masters(m, m->master, path);
}

static const char *const SAVE_METADATA = "{\"format\":\"pt\",\"producer\":\"clla\"}";

// The table's tensors over `host`, the whole flat fp32 layout in host memory (the caller frees
// the array, not the data).
static StTensor *host_tensors(const Model *m, const float *host) {
    const TensorTable *tt = &m->params;
    StTensor *st = xcalloc((size_t)tt->n, sizeof(StTensor));
    for (int i = 0; i < tt->n; i++) {
        st[i].name = tt->t[i].name;
        st[i].ndim = tt->t[i].ndim;
        for (int d = 0; d < tt->t[i].ndim; d++) st[i].shape[d] = tt->t[i].shape[d];
        st[i].data = (const float *)((const char *)host + tt->t[i].off_f32);
    }
    return st;
}

int model_save_host(const Model *m, const float *host, const char *path, int st_dtype, char *err, size_t errlen) {
    StTensor *st = host_tensors(m, host);
    int rc = st_save(path, OUT_REPLACE, st, m->params.n, st_dtype, SAVE_METADATA, err, errlen);
    free(st);
    return rc;
}

const float *model_table_on_host(const Model *m, const float *buf, float **copy) {
    *copy = NULL;
    if (m->be->host_memory) return buf;
    *copy = xmalloc(m->params.bytes_f32);
    m->be->download(*copy, buf, m->params.bytes_f32);
    return *copy;
}

int model_save_masters_checked(Model *m, const float *masters, const char *path, char *err, size_t errlen) {
    float *copy;
    int rc = model_save_host(m, model_table_on_host(m, masters, &copy), path, ST_F32, err, errlen);
    free(copy);
    return rc;
}

void model_save_masters(Model *m, const float *masters, const char *path) {
    char err[512];
    if (model_save_masters_checked(m, masters, path, err, sizeof(err)) != 0) die("%s", err);
}

int model_save_dir_checked(Model *m, const float *masters, const char *dir, unsigned long long shard_bytes, char *err,
                           size_t errlen) {
    float *copy;
    StTensor *st = host_tensors(m, model_table_on_host(m, masters, &copy));
    int rc = st_save_dir(dir, st, m->params.n, ST_F32, SAVE_METADATA, shard_bytes, err, errlen);
    free(st);
    free(copy);
    return rc;
}

void model_save_dir(Model *m, const float *masters, const char *dir, unsigned long long shard_bytes) {
    char err[1024];
    if (model_save_dir_checked(m, masters, dir, shard_bytes, err, sizeof(err)) != 0) die("%s", err);
}
