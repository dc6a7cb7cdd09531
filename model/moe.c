// The mixture-of-experts FFN of one layer, forward and backward, as a sequence of backend
// ops (model/moe.h describes the layer, backend/backend.h the ops).
//
// Data flow of a MoE layer (N tokens, C channels, E experts, top-K, R <= N*K kept rows):
//   h (N, C) --router matmul (fp32)--> logits (N, E) --softmax, top-K--> probs, topk_idx, topk_w
//   dispatch: counts (before dropping), capacity drops, rows grouped by expert in token order
//   xs (R, C) = h[row_token]                    gather
//   per expert e, on its rows only:  gate, up = xs_e Wg_e^T, xs_e Wu_e^T ; act = silu(gate) up ;
//                                     expert_out_e = act_e Wd_e^T
//   out (N, C) = shared(h) + sum_k topk_w[t, k] expert_out[assign_row[t, k]]    weighted scatter
// Nothing comes back to the host during the layer: the row ops run over all N*K rows (the rows
// past the kept ones, expert_off[E], are zeros: moe_gather_forward, moe_expert_matmul_forward),
// and the grouped expert matmuls read the row offsets where moe_dispatch wrote them, so a device
// backend queues the whole layer without waiting for it. The counts, offsets and the two loss
// values stay per layer in backend memory until moe_last_stats asks for them.
#include "model/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/model_internal.h"

// P, G, A, DA as in every orchestration file (model_internal.h); AI: an int32 buffer, stored in
// a 4-byte DT_F32 slot of the activation table.
#define AI(i) ((int *)table_ptr_store(&m->acts, m->act, (i)))

// The E experts' weights (storage) and gradients (fp32) of one projection, as the host pointer
// arrays the grouped expert matmuls take (filled per call: the table decides the addresses).
static const float *const *weights(Model *m, const int *idx) {
    for (int e = 0; e < m->moe->E; e++) m->moe->h_w[e] = P(idx[e]);
    return m->moe->h_w;
}
static float *const *grads(Model *m, const int *idx) {
    for (int e = 0; e < m->moe->E; e++) m->moe->h_dw[e] = G(idx[e]);
    return m->moe->h_dw;
}

static int shared_size(const ModelConfig *c) {
    if (c->n_shared_experts <= 0) return 0;
    return c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size
                                                   : c->n_shared_experts * c->moe_intermediate_size;
}

static MoeModel *moe_state(Model *m) {
    if (!m->moe) {
        const ModelConfig *c = &m->cfg;
        int L = c->num_hidden_layers, E = c->n_routed_experts;
        MoeModel *s = xcalloc(1, sizeof(MoeModel));
        s->E = E;
        s->K = c->num_experts_per_tok;
        s->Ie = c->moe_intermediate_size;
        s->Is = shared_size(c);
        s->lp = xcalloc((size_t)L, sizeof(MoeLayerParams));
        for (int l = 0; l < L; l++) memset(&s->lp[l], 0xff, sizeof(MoeLayerParams));
        for (int l = 0; l < L; l++) s->lp[l].gate_proj = s->lp[l].up_proj = s->lp[l].down_proj = NULL;
        s->h_w = xcalloc((size_t)E, sizeof(*s->h_w));
        s->h_dw = xcalloc((size_t)E, sizeof(*s->h_dw));
        m->moe = s;
    }
    return m->moe;
}

void moe_add_layer_params(Model *m, int l) {
    MoeModel *s = moe_state(m);
    TensorTable *tt = &m->params;
    int C = m->cfg.hidden_size, E = s->E, Ie = s->Ie, Is = s->Is;
    MoeLayerParams *p = &s->lp[l];
    // weight matrices [out, in] of layer l (decayed, storage dtype), HF DeepSeek-V2 names; the
    // shared expert comes first in the table (it is what every token passes through), then
    // the router, then the routed experts
    int64_t sh[2];
#define MATRIX(out, in, ...) (sh[0] = (out), sh[1] = (in), table_addf(tt, l, 1, DT_STORE, 2, sh, __VA_ARGS__))
    if (Is > 0) {
        // each up_proj joined to its gate_proj: one (2 width, C) matrix, one product for both
        p->shared_gate = MATRIX(Is, C, "model.layers.%d.mlp.shared_experts.gate_proj.weight", l);
        table_join_next(tt);
        p->shared_up = MATRIX(Is, C, "model.layers.%d.mlp.shared_experts.up_proj.weight", l);
        p->shared_down = MATRIX(C, Is, "model.layers.%d.mlp.shared_experts.down_proj.weight", l);
    }
    p->router = MATRIX(E, C, "model.layers.%d.mlp.gate.weight", l);
    p->gate_proj = xcalloc((size_t)E, sizeof(int));
    p->up_proj = xcalloc((size_t)E, sizeof(int));
    p->down_proj = xcalloc((size_t)E, sizeof(int));
    for (int e = 0; e < E; e++) {
        p->gate_proj[e] = MATRIX(Ie, C, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
        table_join_next(tt);
        p->up_proj[e] = MATRIX(Ie, C, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
        p->down_proj[e] = MATRIX(C, Ie, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
    }
#undef MATRIX
}

static int act(TensorTable *tt, int dtype, int64_t a, int64_t b, const char *fmt, int l) {
    int64_t shape[2] = {a, b};
    return table_addf(tt, -1, 0, dtype, 2, shape, fmt, l);
}

void moe_layout_acts(Model *m, TensorTable *a, TensorTable *g) {
    if (!m->moe) return;
    MoeModel *s = m->moe;
    const ModelConfig *c = &m->cfg;
    int L = c->num_hidden_layers, C = c->hidden_size, E = s->E, K = s->K, Ie = s->Ie, Is = s->Is;
    int64_t N = (int64_t)m->B * m->T, R = N * K;
    free(s->la);
    s->la = xcalloc((size_t)L, sizeof(MoeLayerActs));
    for (int l = 0; l < L; l++) {
        MoeLayerActs *x = &s->la[l];
        memset(x, 0xff, sizeof(*x));
        if (!config_is_moe_layer(c, l)) continue;
        // int32 buffers take DT_F32 slots: 4 bytes on every backend
        x->probs = act(a, DT_F32, N, E, "layers.%d.moe.probs", l);
        x->lse = act(a, DT_F32, N, 1, "layers.%d.moe.lse", l);
        x->topk_idx = act(a, DT_F32, N, K, "layers.%d.moe.topk_idx", l);
        x->topk_w = act(a, DT_F32, N, K, "layers.%d.moe.topk_w", l);
        x->counts = act(a, DT_F32, E, 1, "layers.%d.moe.counts", l);
        x->expert_off = act(a, DT_F32, E + 1, 1, "layers.%d.moe.expert_off", l);
        x->row_token = act(a, DT_F32, R, 1, "layers.%d.moe.row_token", l);
        x->assign_row = act(a, DT_F32, N, K, "layers.%d.moe.assign_row", l);
        x->aux = act(a, DT_F32, 2, 1, "layers.%d.moe.aux", l);
        x->gate_up = act(a, DT_STORE, R, 2 * (int64_t)Ie, "layers.%d.moe.gate_up", l);
        x->act = act(a, DT_STORE, R, Ie, "layers.%d.moe.act", l);
        x->expert_out = act(a, DT_STORE, R, C, "layers.%d.moe.expert_out", l);
        if (Is > 0) {
            x->s_gate_up = act(a, DT_STORE, N, 2 * (int64_t)Is, "layers.%d.moe.shared_gate_up", l);
            x->s_act = act(a, DT_STORE, N, Is, "layers.%d.moe.shared_act", l);
        }
    }
    s->logits = act(a, DT_F32, N, E, "moe.logits", 0);
    s->xs = act(a, DT_STORE, R, C, "moe.xs", 0);

    s->dxs = act(g, DT_STORE, R, C, "moe.dxs", 0);
    s->dexpert_out = act(g, DT_STORE, R, C, "moe.dexpert_out", 0);
    s->dgate_up = act(g, DT_STORE, R, 2 * (int64_t)Ie, "moe.dgate_up", 0);
    s->dact = act(g, DT_STORE, R, Ie, "moe.dact", 0);
    s->ds_gate_up = s->ds_act = -1;
    if (Is > 0) {
        s->ds_gate_up = act(g, DT_STORE, N, 2 * (int64_t)Is, "moe.dshared_gate_up", 0);
        s->ds_act = act(g, DT_STORE, N, Is, "moe.dshared_act", 0);
    }
    s->dtopk_w = act(g, DT_F32, N, K, "moe.dtopk_w", 0);
    s->dlogits = act(g, DT_F32, N, E, "moe.dlogits", 0);
}

void moe_free(Model *m) {
    MoeModel *s = m->moe;
    if (!s) return;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        free(s->lp[l].gate_proj);
        free(s->lp[l].up_proj);
        free(s->lp[l].down_proj);
    }
    free(s->lp);
    free(s->la);
    free(s->h_w);
    free(s->h_dw);
    free(s);
    m->moe = NULL;
}

int moe_capacity(const ModelConfig *c, int N) {
    if (c->n_routed_experts <= 0 || c->moe_capacity_factor <= 0.0) return 0;
    // in double, as Megatron's get_capacity (and the PyTorch twin) compute it
    double cap = ceil((double)N * c->num_experts_per_tok / c->n_routed_experts * c->moe_capacity_factor);
    // an expert receives each token at most once: a capacity of N drops nothing, as any larger
    // one would (and a factor of 1e30 does not overflow the int)
    return cap < 1.0 ? 1 : cap >= (double)N ? N : (int)cap;
}

long long moe_inactive_params(const Model *m) {
    const ModelConfig *c = &m->cfg;
    if (c->n_routed_experts <= 0) return 0;
    long long per_expert = 3LL * c->hidden_size * c->moe_intermediate_size;
    long long n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (config_is_moe_layer(c, l)) n += (long long)(c->n_routed_experts - c->num_experts_per_tok) * per_expert;
    return n;
}

// SwiGLU shared expert: out (N, C) = down(silu(gate(h)) * up(h)), overwriting out.
static void shared_forward(Model *m, int l, float *out, const float *h) {
    const Backend *be = m->be;
    MoeModel *s = m->moe;
    const MoeLayerParams *p = &s->lp[l];
    const MoeLayerActs *x = &s->la[l];
    int N = m->B * m->T, C = m->cfg.hidden_size, Is = s->Is;
    be->matmul_forward(A(x->s_gate_up), h, P(p->shared_gate), N, C, 2 * Is);   // gate | up: one product
    swiglu_halves_forward(be, A(x->s_act), A(x->s_gate_up), N, Is);
    be->matmul_forward(out, A(x->s_act), P(p->shared_down), N, Is, C);
}

void moe_forward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    MoeModel *s = m->moe;
    const MoeLayerParams *p = &s->lp[l];
    const MoeLayerActs *x = &s->la[l];
    int N = m->B * m->T, C = c->hidden_size, E = s->E, K = s->K, Ie = s->Ie, R = N * K;
    const float *h = A(m->la[l].h_mlp);
    float *out = A(m->tmp_c);
    const int *off = AI(x->expert_off);
    if (!be->moe_dispatch || !be->moe_expert_matmul_forward || !be->moe_expert_matmul_backward)
        die("the %s backend does not implement the mixture-of-experts ops yet: train MoE configs with --device cpu", be->name);

    // shared expert (or zeros): the routed experts add onto it
    if (s->Is > 0) shared_forward(m, l, out, h);
    else be->zero(out, (size_t)N * C * be->act_bytes);

    // router, in fp32 from logits to the dispatch plan
    be->moe_router_forward(A(s->logits), h, P(p->router), N, C, E);
    be->moe_topk_forward(A(x->probs), A(x->lse), AI(x->topk_idx), A(x->topk_w), A(s->logits), N, E, K, c->norm_topk_prob);
    be->moe_dispatch(AI(x->counts), AI(x->expert_off), AI(x->row_token), AI(x->assign_row), A(x->probs),
                     AI(x->topk_idx), N, E, K, m->inference ? 0 : moe_capacity(c, N));
    be->moe_aux_forward(A(x->aux), A(x->probs), A(x->lse), AI(x->counts), N, E, K, c->moe_aux_loss_coef, c->moe_z_loss_coef);

    // routed experts, each on its own rows (grouped matmuls: one op call for all experts); the
    // rows past the kept ones are zeros from the gather on, and the combine never reads them
    be->moe_gather_forward(A(s->xs), h, AI(x->row_token), R, C);
    // each expert's gate and up as one product (up_proj joined to gate_proj): (R, 2 Ie) rows
    be->moe_expert_matmul_forward(A(x->gate_up), A(s->xs), weights(m, p->gate_proj), off, E, R, C, 2 * Ie);
    swiglu_halves_forward(be, A(x->act), A(x->gate_up), R, Ie);
    be->moe_expert_matmul_forward(A(x->expert_out), A(x->act), weights(m, p->down_proj), off, E, R, Ie, C);
    be->moe_combine_forward(out, A(x->expert_out), A(x->topk_w), AI(x->assign_row), N, K, C);
}

void moe_backward(Model *m, int l, float loss_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    MoeModel *s = m->moe;
    const MoeLayerParams *p = &s->lp[l];
    const MoeLayerActs *x = &s->la[l];
    const GradActs *ga = &m->ga;
    int N = m->B * m->T, C = c->hidden_size, E = s->E, K = s->K, Ie = s->Ie, Is = s->Is;
    size_t sb = be->act_bytes;
    const float *h = A(m->la[l].h_mlp);
    const float *dout = DA(ga->dres);
    float *dh = DA(ga->dh);
    const int *off = AI(x->expert_off);
    int R = N * K;   // the row buffers' rows: those past expert_off[E] are zeros (moe_forward)

    // shared expert
    if (Is > 0) {
        be->zero(DA(s->ds_act), (size_t)N * Is * sb);
        be->matmul_backward(DA(s->ds_act), G(p->shared_down), dout, A(x->s_act), P(p->shared_down), N, Is, C);
        swiglu_halves_backward(be, DA(s->ds_gate_up), DA(s->ds_act), A(x->s_gate_up), N, Is);
        be->matmul_backward(dh, G(p->shared_gate), DA(s->ds_gate_up), h, P(p->shared_gate), N, C, 2 * Is);
    }

    // weighted scatter: gradients of the expert outputs and of the combine weights
    be->zero(DA(s->dtopk_w), (size_t)N * K * sizeof(float));
    be->zero(DA(s->dexpert_out), (size_t)R * C * sb);
    be->moe_combine_backward(DA(s->dexpert_out), DA(s->dtopk_w), dout, A(x->expert_out), A(x->topk_w),
                             AI(x->assign_row), N, K, C);
    // experts, each on its own rows
    be->zero(DA(s->dact), (size_t)R * Ie * sb);
    be->moe_expert_matmul_backward(DA(s->dact), grads(m, p->down_proj), DA(s->dexpert_out), A(x->act),
                                   weights(m, p->down_proj), off, E, R, Ie, C);
    swiglu_halves_backward(be, DA(s->dgate_up), DA(s->dact), A(x->gate_up), R, Ie);
    // the gathered input is not kept per layer: gather it again (cheap next to the matmuls)
    be->moe_gather_forward(A(s->xs), h, AI(x->row_token), R, C);
    be->zero(DA(s->dxs), (size_t)R * C * sb);
    be->moe_expert_matmul_backward(DA(s->dxs), grads(m, p->gate_proj), DA(s->dgate_up), A(s->xs),
                                   weights(m, p->gate_proj), off, E, R, C, 2 * Ie);
    be->moe_gather_backward(dh, DA(s->dxs), AI(x->assign_row), N, K, C);

    // router: combine weights, load-balancing and z losses, all through the softmax
    be->zero(DA(s->dlogits), (size_t)N * E * sizeof(float));
    be->moe_router_softmax_backward(DA(s->dlogits), DA(s->dtopk_w), A(x->probs), A(x->lse), AI(x->topk_idx),
                                    A(x->topk_w), AI(x->counts), N, E, K, c->norm_topk_prob,
                                    loss_scale * c->moe_aux_loss_coef, loss_scale * c->moe_z_loss_coef);
    be->moe_router_backward(dh, G(p->router), DA(s->dlogits), h, P(p->router), N, C, E);
}

double moe_aux_total(const Model *m) {
    MoeStats st;
    moe_last_stats(m, &st);
    return st.aux_loss + st.z_loss;
}

// The layers' counts, row offsets and losses come back from backend memory here, once per call
// (a logging step), not during the layer.
void moe_last_stats(const Model *m, MoeStats *st) {
    memset(st, 0, sizeof(*st));
    const MoeModel *s = m->moe;
    if (!s || !m->B) return;
    const ModelConfig *c = &m->cfg;
    const Backend *be = m->be;
    int N = m->B * m->T, E = s->E;
    long long NK = (long long)N * s->K;
    int *cnt = xcalloc((size_t)E, sizeof(int));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!config_is_moe_layer(c, l)) continue;
        const MoeLayerActs *x = &s->la[l];
        float aux[2];
        int kept;
        be->download(cnt, AI(x->counts), (size_t)E * sizeof(int));
        be->download(&kept, AI(x->expert_off) + E, sizeof(int));
        be->download(aux, A(x->aux), sizeof aux);
        int mx = cnt[0], mn = cnt[0];
        for (int e = 1; e < E; e++) {
            mx = cnt[e] > mx ? cnt[e] : mx;
            mn = cnt[e] < mn ? cnt[e] : mn;
        }
        st->layers++;
        st->aux_loss += aux[0];
        st->z_loss += aux[1];
        st->max_share += (double)mx / (double)NK;
        st->min_share += (double)mn / (double)NK;
        st->assignments += NK;
        st->dropped += NK - kept;
    }
    free(cnt);
    if (st->layers) {
        st->max_share /= st->layers;
        st->min_share /= st->layers;
    }
}
