// AdamW over the parameter table (decay mask from the table), global-norm clipping
// and the learning-rate schedule (linear warmup, cosine decay to min_lr).
#ifndef CLLA_TRAIN_OPTIMIZER_H
#define CLLA_TRAIN_OPTIMIZER_H

#include "model/config.h"
#include "model/model.h"
#include "model/shard.h"

typedef struct AdamW {
    float *m, *v;      // fp32 moments of the elements of sh, packed as model/shard.h says (backend memory)
    int t;             // completed updates
    Shard sh;          // the part of the flat fp32 buffer (params.bytes_f32 / 4 elements) this
                       // process updates: all of it, or its ZeRO-1 shard (train/grad_sync.h)
} AdamW;

// Moments for the whole model.
void adamw_init(AdamW *opt, const Model *model);
// Moments for the elements of sh only (ZeRO-1: a rank's shard, which may be empty).
void adamw_init_shard(AdamW *opt, const Model *model, const Shard *sh);
void adamw_free(AdamW *opt, const Model *model);
// Global L2 norm of the accumulated gradients (deterministic).
double grad_global_norm(const Model *model);
// One update with learning rate lr; gradients are multiplied by grad_scale first
// (clipping). Weight decay only on tensors whose table entry says decay.
void adamw_step(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale);
// The update of adamw_step on the masters of opt->sh only, without refreshing the
// storage copy: ZeRO-1 all-gathers the masters first, then calls model_sync_weights.
void adamw_update_range(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale);
// adamw_step in one pass over the masters, where it can be: the backend fuses the update with the
// storage refresh (adamw_update_store), the storage is a copy of separate masters, and this
// process updates every master (no ZeRO-1 shard). Returns 1 having done the step (the same bits
// as adamw_step's two passes), else 0 having done nothing.
int adamw_step_fused(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale);
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
