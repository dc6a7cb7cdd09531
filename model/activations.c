// Activation and activation-gradient tables for a (B, T) micro-batch: one allocation
// per category, every buffer a named table entry.
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "model/mem_plan.h"
#include "model/model.h"
#include "model/moe.h"

static int act(TensorTable *tt, int dtype, int64_t a, int64_t b, const char *fmt, int l) {
    int64_t shape[2] = {a, b};
    return table_addf(tt, -1, 0, dtype, 2, shape, fmt, l);
}

// The cache slots' payload buffers (N tokens each), widths from the cache layout; prefix ""
// for the values, "d" for their gradients. Absent parts keep index -1.
static void add_slot_acts(TensorTable *tt, SlotActs *sa, const CacheLayout *cl, int64_t N, const char *prefix) {
    static const struct { int part; size_t field; const char *name; } PARTS[] = {
        {PART_K, offsetof(SlotActs, k), "k"},
        {PART_V, offsetof(SlotActs, v), "v"},
        {PART_LATENT, offsetof(SlotActs, c), "c"},
        {PART_KROPE, offsetof(SlotActs, k_rope), "k_rope"},
    };
    for (int s = 0; s < cl->n_slots; s++) {
        memset(&sa[s], 0xff, sizeof(sa[s]));
        for (size_t i = 0; i < sizeof(PARTS) / sizeof(PARTS[0]); i++) {
            const CachePart *part = &cl->part[PARTS[i].part];
            if (!part->present) continue;
            int64_t shape[2] = {N, part->width};
            *(int *)((char *)&sa[s] + PARTS[i].field) =
                table_addf(tt, -1, 0, DT_STORE, 2, shape, "slots.%d.%s%s", s, prefix, PARTS[i].name);
        }
    }
}

void model_layout_acts(Model *m, int B, int T, size_t store_bytes) {
    free(m->la); free(m->sa); free(m->gsa);
    table_free(&m->acts);
    table_free(&m->gacts);
    m->B = B;
    m->T = T;
    const ModelConfig *c = &m->cfg;
    int L = c->num_hidden_layers, C = c->hidden_size, NH = c->num_attention_heads;
    int D = c->head_dim, DV = c->v_head_dim, I = c->intermediate_size, V = c->vocab_size;
    int latent = config_is_latent(c), R = c->kv_lora_rank, DR = latent ? c->qk_rope_head_dim : 0, Rq = c->q_lora_rank;
    // B and T come from the config (bounded by config_check_sizes) or from eval/debug-step
    // options: checked here too, as the kernels index the N rows with int
    int64_t N, head_rows, DQK = (int64_t)D + DR;   // head_rows: B T NH, one per attention score row
    if (B <= 0 || T <= 0 || ck_mul(B, T, &N) || N > INT_MAX || ck_mul(N, NH, &head_rows))
        die("a batch of %d sequences of %d tokens (%d heads) is too large to lay out: use a smaller batch or sequence", B, T, NH);

    TensorTable *a = &m->acts;
    a->unindexed = m->gacts.unindexed = 1;   // addressed by index only (LayerActs, GradActs)
    if (m->params.plan_store_bytes) a->plan_store_bytes = m->gacts.plan_store_bytes = store_bytes;
    m->la = xcalloc((size_t)L, sizeof(LayerActs));
    m->sa = xcalloc((size_t)m->n_slots, sizeof(SlotActs));
    for (int l = 0; l < L; l++) {
        LayerActs *x = &m->la[l];
        memset(x, 0xff, sizeof(*x));   // every index -1 until added
        int producer = m->cache.role[l].producer;
        x->res_in = act(a, DT_STORE, N, C, "layers.%d.res_in", l);
        x->h_attn = act(a, DT_STORE, N, C, "layers.%d.h_attn", l);
        x->rstd_attn = act(a, DT_F32, N, 1, "layers.%d.rstd_attn", l);
        x->q = act(a, DT_STORE, N, NH * DQK, "layers.%d.q", l);
        if (latent) {
            if (Rq > 0) {
                x->cq = act(a, DT_STORE, N, Rq, "layers.%d.cq", l);
                x->cq_norm = act(a, DT_STORE, N, Rq, "layers.%d.cq_norm", l);
                x->rstd_q = act(a, DT_F32, N, 1, "layers.%d.rstd_q", l);
            }
            if (producer) {
                x->kv_a = act(a, DT_STORE, N, R + DR, "layers.%d.kv_a", l);
                x->c_raw = act(a, DT_STORE, N, R, "layers.%d.c_raw", l);
                x->rstd_c = act(a, DT_F32, N, 1, "layers.%d.rstd_c", l);
            } else if (m->cache.role[l].own_krope) {
                x->k_rope = act(a, DT_STORE, N, DR, "layers.%d.k_rope", l);
            }
            x->kv = act(a, DT_STORE, N, (int64_t)NH * (D + DV), "layers.%d.kv", l);
            x->k = act(a, DT_STORE, N, NH * DQK, "layers.%d.k", l);
            x->v = act(a, DT_STORE, N, (int64_t)NH * DV, "layers.%d.v", l);
        }
        x->lse = act(a, DT_F32, head_rows, 1, "layers.%d.lse", l);
        x->att_out = act(a, DT_STORE, N, (int64_t)NH * DV, "layers.%d.att_out", l);
        x->res_mid = act(a, DT_STORE, N, C, "layers.%d.res_mid", l);
        x->h_mlp = act(a, DT_STORE, N, C, "layers.%d.h_mlp", l);
        x->rstd_mlp = act(a, DT_F32, N, 1, "layers.%d.rstd_mlp", l);
        if (!config_is_moe_layer(c, l)) {   // MoE layers: model/moe.c lays out their buffers
            x->gate_up = act(a, DT_STORE, N, 2 * (int64_t)I, "layers.%d.gate_up", l);
            x->act = act(a, DT_STORE, N, I, "layers.%d.act", l);
        }
    }
    add_slot_acts(a, m->sa, &m->cache, N, "");
    m->res_final = act(a, DT_STORE, N, C, "res_final", 0);
    m->h_final = act(a, DT_STORE, N, C, "h_final", 0);
    m->rstd_final = act(a, DT_F32, N, 1, "rstd_final", 0);
    m->logits = act(a, DT_STORE, N, V, "logits", 0);
    m->losses = act(a, DT_F32, N, 1, "losses", 0);
    m->tmp_c = act(a, DT_STORE, N, C, "tmp_c", 0);
    moe_layout_acts(m, a, &m->gacts);
    table_layout(a, store_bytes);

    TensorTable *g = &m->gacts;
    GradActs *ga = &m->ga;
    memset(ga, 0xff, sizeof(*ga));
    ga->dres = act(g, DT_STORE, N, C, "dres", 0);
    ga->dh = act(g, DT_STORE, N, C, "dh", 0);
    ga->dq = act(g, DT_STORE, N, NH * DQK, "dq", 0);
    if (latent) {
        if (Rq > 0) {
            ga->dcq = act(g, DT_STORE, N, Rq, "dcq", 0);
            ga->dcq_norm = act(g, DT_STORE, N, Rq, "dcq_norm", 0);
        }
        ga->dk = act(g, DT_STORE, N, NH * DQK, "dk", 0);
        ga->dv = act(g, DT_STORE, N, (int64_t)NH * DV, "dv", 0);
        ga->dkv = act(g, DT_STORE, N, (int64_t)NH * (D + DV), "dkv", 0);
        ga->dkv_a = act(g, DT_STORE, N, R + DR, "dkv_a", 0);
        ga->dc_raw = act(g, DT_STORE, N, R, "dc_raw", 0);
        ga->dk_rope = act(g, DT_STORE, N, DR, "dk_rope", 0);
    }
    ga->datt_out = act(g, DT_STORE, N, (int64_t)NH * DV, "datt_out", 0);
    if (!config_is_moe_layer(c, 0)) {   // layer 0 is dense exactly when some layer has a dense MLP
        ga->dgate_up = act(g, DT_STORE, N, 2 * (int64_t)I, "dgate_up", 0);
        ga->dact = act(g, DT_STORE, N, I, "dact", 0);
    }
    ga->dlogits = act(g, DT_STORE, N, V, "dlogits", 0);
    ga->att_delta = act(g, DT_F32, head_rows, 1, "att_delta", 0);
    m->gsa = xcalloc((size_t)m->n_slots, sizeof(SlotActs));
    add_slot_acts(g, m->gsa, &m->cache, N, "d");
    table_layout(g, store_bytes);
}

void model_set_batch(Model *m, int B, int T) {
    if (m->B == B && m->T == T) return;
    const Backend *be = m->be;
    if (m->act) { be->release(m->act); if (m->gact) be->release(m->gact); be->release(m->d_inputs); be->release(m->d_targets); }
    free(m->h_targets); free(m->h_losses);
    model_layout_acts(m, B, T, be->act_bytes);
    mem_check_activations(be, (double)m->acts.bytes_store + (m->inference ? 0.0 : (double)m->gacts.bytes_store), B, T);
    int64_t N = (int64_t)B * T;
    m->act = be->alloc(m->acts.bytes_store);
    m->gact = m->inference ? NULL : be->alloc(m->gacts.bytes_store);   // inference keeps no gradients
    m->d_inputs = be->alloc((size_t)N * sizeof(int));
    m->d_targets = be->alloc((size_t)N * sizeof(int));
    m->h_targets = xcalloc((size_t)N, sizeof(int32_t));
    m->h_losses = xcalloc((size_t)N, sizeof(float));
}
