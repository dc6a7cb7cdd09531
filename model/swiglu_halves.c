// SwiGLU over the rows of one gate | up product (model/model_internal.h): the dense MLP
// (model/forward.c) and the MoE experts (model/moe.c) both call it, so the layout of the joined
// gate_proj | up_proj output is read in this one place.
#include "model/model_internal.h"

// n elements past p in a buffer of the backend's storage (act_bytes each): where a row's up half
// starts, I past its gate half
static float *store_at(const Backend *be, const float *p, size_t n) { return (float *)((const char *)p + n * be->act_bytes); }

void swiglu_halves_forward(const Backend *be, float *act, const float *gate_up, int rows, int I) {
    be->swiglu_forward(act, gate_up, store_at(be, gate_up, (size_t)I), rows, I, 2 * I);
}

void swiglu_halves_backward(const Backend *be, float *dgate_up, const float *dact, const float *gate_up, int rows, int I) {
    be->zero(dgate_up, (size_t)rows * 2 * I * be->act_bytes);
    be->swiglu_backward(dgate_up, store_at(be, dgate_up, (size_t)I), dact, gate_up, store_at(be, gate_up, (size_t)I), rows, I,
                        2 * I);
}
