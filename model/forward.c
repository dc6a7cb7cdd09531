// Forward and backward of the whole model, as a sequence of backend ops.
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "model/model_internal.h"
#include "model/moe.h"


// Dense SwiGLU MLP of layer l added to the residual stream: out (N, C) = residual +
// down(silu(gate(h_mlp)) * up(h_mlp)), the down projection taking the residual as its
// accumulate input (backend/backend.h, matmul_residual_forward).
static void mlp_forward(Model *m, int l, float *out, const float *residual) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size, I = c->intermediate_size;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    // gate and up as one product: up_proj is joined to gate_proj, one (2I, C) weight
    be->matmul_forward(A(x->gate_up), A(x->h_mlp), P(p->gate_proj), N, C, 2 * I);
    swiglu_halves_forward(be, A(x->act), A(x->gate_up), N, I);
    be->matmul_residual_forward(out, residual, A(x->act), P(p->down_proj), N, I, C);
}

// Backward of mlp_forward given d(out) in dres (the residual passes it through unchanged); adds
// d(h_mlp) into dh.
static void mlp_backward(Model *m, int l) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size, I = c->intermediate_size;
    const LayerParams *p = &m->lp[l];
    const LayerActs *x = &m->la[l];
    const GradActs *ga = &m->ga;
    size_t sb = be->act_bytes;
    be->zero(DA(ga->dact), (size_t)N * I * sb);
    be->matmul_backward(DA(ga->dact), G(p->down_proj), DA(ga->dres), A(x->act), P(p->down_proj), N, I, C);
    swiglu_halves_backward(be, DA(ga->dgate_up), DA(ga->dact), A(x->gate_up), N, I);
    be->matmul_backward(DA(ga->dh), G(p->gate_proj), DA(ga->dgate_up), A(x->h_mlp), P(p->gate_proj), N, C, 2 * I);
}

// out = residual + the FFN of layer l: the dense MLP, or (MoE layers) the mixture of experts
// (model/moe.c, into tmp_c, then added), whose auxiliary losses take loss_scale like the LM loss.
static void ffn_forward(Model *m, int l, float *out, const float *residual) {
    if (config_is_moe_layer(&m->cfg, l)) {
        moe_forward(m, l);
        m->be->add_forward(out, residual, A(m->tmp_c), (size_t)m->B * m->T * m->cfg.hidden_size);
    } else {
        mlp_forward(m, l, out, residual);
    }
}
static void ffn_backward(Model *m, int l, float loss_scale) {
    if (config_is_moe_layer(&m->cfg, l)) moe_backward(m, l, loss_scale);
    else mlp_backward(m, l);
}

static int count_targets(const int32_t *targets, int n) {
    int cnt = 0;
    for (int i = 0; i < n; i++) cnt += targets[i] != IGNORE_INDEX;
    return cnt;
}

int model_last_count(const Model *m) { return count_targets(m->h_targets, m->B * m->T); }

void model_logits_to_host(const Model *m, size_t first, size_t rows, float *dst) {
    const size_t V = (size_t)m->cfg.vocab_size;
    if (first + rows > (size_t)m->B * m->T) die("internal error: logits rows %zu..%zu of %d", first, first + rows, m->B * m->T);
    // the storage is act_bytes per element: fp32 on the host, bf16 on CUDA
    const char *base = (const char *)table_ptr_store(&m->acts, m->act, m->logits);
    m->be->act_to_host(dst, (const float *)(base + first * V * m->be->act_bytes), rows * V);
}

float model_forward(Model *m, const int32_t *inputs, const int32_t *targets) {
    return model_forward_with(m, inputs, targets, NULL, NULL);
}

// The weights below tensor i's first element (i < 0: all of them) are in place (Model.param_wait).
static void weights_until(Model *m, int i) {
    if (m->param_wait) m->param_wait(m->param_wait_ctx, i < 0 ? m->params.bytes_f32 / 4 : m->params.t[i].off_f32 / sizeof(float));
}

float model_forward_with(Model *m, const int32_t *inputs, const int32_t *targets, AttendFn attend, void *ctx) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, L = c->num_hidden_layers, C = c->hidden_size;
    int NH = c->num_attention_heads, DV = c->v_head_dim;
    int V = c->vocab_size;

    be->upload(m->d_inputs, inputs, (size_t)N * sizeof(int));
    weights_until(m, m->lp[0].input_norm);   // the embedding: the first tensor
    be->embedding_forward(A(m->la[0].res_in), m->d_inputs, P(m->embed), N, C);
    for (int l = 0; l < L; l++) {
        const LayerParams *p = &m->lp[l];
        const LayerActs *x = &m->la[l];
        weights_until(m, l + 1 < L ? m->lp[l + 1].input_norm : m->final_norm);   // layer l's tensors
        // attention block
        be->rmsnorm_forward(A(x->h_attn), A(x->rstd_attn), A(x->res_in), P(p->input_norm), N, C, c->rms_norm_eps);
        if (attend) attend(m, l, ctx);
        else attention_block_forward(m, l);
        // the output projection added to the residual stream in one op
        be->matmul_residual_forward(A(x->res_mid), A(x->res_in), A(x->att_out), P(p->o_proj), N, NH * DV, C);
        // FFN block: res_out = res_mid + FFN(RMSNorm(res_mid))
        be->rmsnorm_forward(A(x->h_mlp), A(x->rstd_mlp), A(x->res_mid), P(p->post_norm), N, C, c->rms_norm_eps);
        ffn_forward(m, l, l + 1 < L ? A(m->la[l + 1].res_in) : A(m->res_final), A(x->res_mid));
    }
    weights_until(m, -1);   // the final norm and the head
    be->rmsnorm_forward(A(m->h_final), A(m->rstd_final), A(m->res_final), P(m->final_norm), N, C, c->rms_norm_eps);
    be->matmul_forward(A(m->logits), A(m->h_final), P(m->lm_head), N, C, V);
    if (!targets) return 0.0f;

    memcpy(m->h_targets, targets, (size_t)N * sizeof(int32_t));
    be->upload(m->d_targets, targets, (size_t)N * sizeof(int));
    be->xent_forward(A(m->losses), A(m->logits), m->d_targets, N, V, IGNORE_INDEX);
    be->download(m->h_losses, A(m->losses), (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->h_losses[i];
    int cnt = count_targets(targets, N);
    return cnt ? (float)(sum / cnt) : 0.0f;
}

void model_zero_grad(Model *m) { m->be->zero(m->grad, m->params.bytes_f32); }

// Every gradient from tensor i's first element on is complete (Model.grad_final).
static void grads_final_from(Model *m, int i) {
    if (m->grad_final) m->grad_final(m->grad_final_ctx, m->params.t[i].off_f32 / sizeof(float));
}

void model_backward(Model *m, float loss_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, L = c->num_hidden_layers, C = c->hidden_size;
    int NH = c->num_attention_heads, DV = c->v_head_dim;
    int V = c->vocab_size;
    const GradActs *ga = &m->ga;
    size_t sb = be->act_bytes;
    int cnt = count_targets(m->h_targets, N);
    // nothing counted: the LM loss is constant 0, but MoE auxiliary losses still have gradients
    if (cnt == 0 && c->n_routed_experts == 0) return;

    be->zero(m->gact, m->gacts.bytes_store);   // every activation gradient starts at 0
    be->xent_backward(DA(ga->dlogits), A(m->logits), m->d_targets, N, V, IGNORE_INDEX, cnt ? loss_scale / (float)cnt : 0.0f);
    be->matmul_backward(DA(ga->dh), G(m->lm_head), DA(ga->dlogits), A(m->h_final), P(m->lm_head), N, C, V);
    be->rmsnorm_backward(DA(ga->dres), G(m->final_norm), DA(ga->dh), A(m->res_final), P(m->final_norm), A(m->rstd_final), N, C);
    grads_final_from(m, m->final_norm);   // and lm_head's after it (a tied one is the embedding)
    for (int l = L - 1; l >= 0; l--) {
        const LayerParams *p = &m->lp[l];
        const LayerActs *x = &m->la[l];
        // FFN block: dres holds d(res_out); the residual path passes it through unchanged
        be->zero(DA(ga->dh), (size_t)N * C * sb);
        ffn_backward(m, l, loss_scale);   // dh += d(h_mlp)
        be->rmsnorm_backward(DA(ga->dres), G(p->post_norm), DA(ga->dh), A(x->res_mid), P(p->post_norm), A(x->rstd_mlp), N, C);
        // attention block: dres now holds d(res_mid)
        be->zero(DA(ga->datt_out), (size_t)N * NH * DV * sb);
        be->matmul_backward(DA(ga->datt_out), G(p->o_proj), DA(ga->dres), A(x->att_out), P(p->o_proj), N, NH * DV, C);
        be->zero(DA(ga->dh), (size_t)N * C * sb);
        attention_block_backward(m, l);   // dh += d(h_attn)
        be->rmsnorm_backward(DA(ga->dres), G(p->input_norm), DA(ga->dh), A(x->res_in), P(p->input_norm), A(x->rstd_attn), N, C);
        if (m->grad_final_by_layer) grads_final_from(m, p->input_norm);   // the layer's first tensor
    }
    be->embedding_backward(G(m->embed), DA(ga->dres), m->d_inputs, N, C);
    grads_final_from(m, m->embed);   // the first tensor: all of them
}
