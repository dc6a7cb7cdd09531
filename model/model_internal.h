// Shared by the orchestration files of model/: typed views of table entries and the
// per-block forward/backward functions. Not part of the public model API.
#ifndef CLLA_MODEL_INTERNAL_H
#define CLLA_MODEL_INTERNAL_H

#include "model/model.h"

// P = parameter storage, G = parameter gradient (fp32), A = activation, DA = activation
// gradient. The orchestration only ever addresses buffers through these.
#define P(i) ((float *)table_ptr_store(&m->params, m->w, (i)))
#define G(i) (table_ptr_f32(&m->params, m->grad, (i)))
#define A(i) ((float *)table_ptr_store(&m->acts, m->act, (i)))
#define DA(i) ((float *)table_ptr_store(&m->gacts, m->gact, (i)))

// SwiGLU over the rows of one gate | up product (rows, 2 I): up_proj is joined to gate_proj in the
// table (model/params.c, model/moe.c), so one product gives each row's gate half, then its up half.
// Forward: act (rows, I) = silu(gate) * up. Backward: d(gate | up) zeroed, then from dact.
// (model/swiglu_halves.c)
void swiglu_halves_forward(const Backend *be, float *act, const float *gate_up, int rows, int I);
void swiglu_halves_backward(const Backend *be, float *dgate_up, const float *dact, const float *gate_up, int rows, int I);

// Attention block of layer l: reads la[l].h_attn, writes la[l].att_out (forward); given
// d(att_out) in ga.datt_out, adds d(h_attn) into ga.dh and parameter gradients (backward).
void attention_block_forward(Model *m, int l);
// Its parts, for the decoder (model/decode.c): the query (la[l].q, after RoPE) and what layer l
// writes into the cache (slot K/V, or latent and rope key, or its own rope key), before the codec.
void attention_query_forward(Model *m, int l);
void attention_kv_forward(Model *m, int l);
// The rest of the block after those two: the codec round trip of what the cache holds, then
// the full-sequence attention over it.
void attention_cached_forward(Model *m, int l);

// One forward over the model's batch with `attend` in place of the full-sequence attention
// block (it reads la[l].h_attn and writes la[l].att_out). model_forward is this with NULL.
typedef void (*AttendFn)(Model *m, int l, void *ctx);
float model_forward_with(Model *m, const int32_t *inputs, const int32_t *targets, AttendFn attend, void *ctx);
void attention_block_backward(Model *m, int l);

#endif
