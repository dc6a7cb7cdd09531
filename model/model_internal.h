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

// Attention block of layer l: reads la[l].h_attn, writes la[l].att_out (forward); given
// d(att_out) in ga.datt_out, adds d(h_attn) into ga.dh and parameter gradients (backward).
void attention_block_forward(Model *m, int l);
void attention_block_backward(Model *m, int l);

#endif
