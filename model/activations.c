// Activation and activation-gradient tables for a (B, T) micro-batch: one allocation
// per category, every buffer a named table entry.
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/model.h"

static int act(TensorTable *tt, int dtype, int64_t a, int64_t b, const char *fmt, int l) {
    int64_t shape[2] = {a, b};
    return table_addf(tt, -1, 0, dtype, 2, shape, fmt, l);
}

void model_layout_acts(Model *m, int B, int T, size_t store_bytes) {
    free(m->la); free(m->sa); free(m->gsa);
    table_free(&m->acts);
    table_free(&m->gacts);
    m->B = B;
    m->T = T;
    const ModelConfig *c = &m->cfg;
    int L = c->num_hidden_layers, C = c->hidden_size, NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    int D = c->head_dim, DV = c->v_head_dim, I = c->intermediate_size, V = c->vocab_size;
    int64_t N = (int64_t)B * T, att = (int64_t)B * NH * T;

    TensorTable *a = &m->acts;
    m->la = xcalloc((size_t)L, sizeof(LayerActs));
    m->sa = xcalloc((size_t)m->n_slots, sizeof(SlotActs));
    for (int l = 0; l < L; l++) {
        LayerActs *x = &m->la[l];
        x->res_in = act(a, DT_STORE, N, C, "layers.%d.res_in", l);
        x->h_attn = act(a, DT_STORE, N, C, "layers.%d.h_attn", l);
        x->rstd_attn = act(a, DT_F32, N, 1, "layers.%d.rstd_attn", l);
        x->q = act(a, DT_STORE, N, (int64_t)NH * D, "layers.%d.q", l);
        x->att = act(a, DT_F32, att, T, "layers.%d.att", l);
        x->att_out = act(a, DT_STORE, N, (int64_t)NH * DV, "layers.%d.att_out", l);
        x->res_mid = act(a, DT_STORE, N, C, "layers.%d.res_mid", l);
        x->h_mlp = act(a, DT_STORE, N, C, "layers.%d.h_mlp", l);
        x->rstd_mlp = act(a, DT_F32, N, 1, "layers.%d.rstd_mlp", l);
        x->gate = act(a, DT_STORE, N, I, "layers.%d.gate", l);
        x->up = act(a, DT_STORE, N, I, "layers.%d.up", l);
        x->act = act(a, DT_STORE, N, I, "layers.%d.act", l);
    }
    for (int s = 0; s < m->n_slots; s++) {
        m->sa[s].k = act(a, DT_STORE, N, (int64_t)NKV * D, "slots.%d.k", s);
        m->sa[s].v = act(a, DT_STORE, N, (int64_t)NKV * DV, "slots.%d.v", s);
    }
    m->res_final = act(a, DT_STORE, N, C, "res_final", 0);
    m->h_final = act(a, DT_STORE, N, C, "h_final", 0);
    m->rstd_final = act(a, DT_F32, N, 1, "rstd_final", 0);
    m->logits = act(a, DT_STORE, N, V, "logits", 0);
    m->losses = act(a, DT_F32, N, 1, "losses", 0);
    m->tmp_c = act(a, DT_STORE, N, C, "tmp_c", 0);
    table_layout(a, store_bytes);

    TensorTable *g = &m->gacts;
    GradActs *ga = &m->ga;
    ga->dres = act(g, DT_STORE, N, C, "dres", 0);
    ga->dh = act(g, DT_STORE, N, C, "dh", 0);
    ga->dq = act(g, DT_STORE, N, (int64_t)NH * D, "dq", 0);
    ga->datt_out = act(g, DT_STORE, N, (int64_t)NH * DV, "datt_out", 0);
    ga->dgate = act(g, DT_STORE, N, I, "dgate", 0);
    ga->dup = act(g, DT_STORE, N, I, "dup", 0);
    ga->dact = act(g, DT_STORE, N, I, "dact", 0);
    ga->dlogits = act(g, DT_STORE, N, V, "dlogits", 0);
    ga->dscores = act(g, DT_F32, att, T, "dscores", 0);
    m->gsa = xcalloc((size_t)m->n_slots, sizeof(SlotActs));
    for (int s = 0; s < m->n_slots; s++) {
        m->gsa[s].k = act(g, DT_STORE, N, (int64_t)NKV * D, "slots.%d.dk", s);
        m->gsa[s].v = act(g, DT_STORE, N, (int64_t)NKV * DV, "slots.%d.dv", s);
    }
    table_layout(g, store_bytes);
}

void model_set_batch(Model *m, int B, int T) {
    if (m->B == B && m->T == T) return;
    const Backend *be = m->be;
    if (m->act) { be->release(m->act); be->release(m->gact); be->release(m->d_inputs); be->release(m->d_targets); }
    free(m->h_targets); free(m->h_losses);
    model_layout_acts(m, B, T, be->act_bytes);
    int64_t N = (int64_t)B * T;
    m->act = be->alloc(m->acts.bytes_store);
    m->gact = be->alloc(m->gacts.bytes_store);
    m->d_inputs = be->alloc((size_t)N * sizeof(int));
    m->d_targets = be->alloc((size_t)N * sizeof(int));
    m->h_targets = xcalloc((size_t)N, sizeof(int32_t));
    m->h_losses = xcalloc((size_t)N, sizeof(float));
}
