// AdamW over the parameter table (decay mask from the table), global-norm clipping
// and the learning-rate schedule (linear warmup, cosine decay to min_lr).
#ifndef CLLA_TRAIN_OPTIMIZER_H
#define CLLA_TRAIN_OPTIMIZER_H

#include "model/config.h"
#include "model/model.h"

typedef struct AdamW {
    float *m, *v;      // fp32 moments, laid out like the gradients (backend memory)
    int t;             // completed updates
} AdamW;

void adamw_init(AdamW *opt, const Model *model);
void adamw_free(AdamW *opt, const Model *model);
// Global L2 norm of the accumulated gradients (deterministic).
double grad_global_norm(const Model *model);
// One update with learning rate lr; gradients are multiplied by grad_scale first
// (clipping). Weight decay only on tensors whose table entry says decay.
void adamw_step(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale);
// Seed of the bf16 weight rounding after update t (stored in checkpoints' state.json so a
// resumed run re-rounds the weights exactly as the uninterrupted one did).
static inline unsigned long long adamw_store_seed(unsigned long long seed, int t) {
    return seed * 1000003ull + (unsigned long long)t;
}
// Clip factor as torch.nn.utils.clip_grad_norm_: min(1, clip / (norm + 1e-6)); 1 when clip is 0.
float clip_scale(double norm, float clip);
// Learning rate for the 0-based update index step.
float lr_at(const TrainConfig *tc, int step);

#endif
