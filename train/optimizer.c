#include "train/optimizer.h"

#include <math.h>

#include "common/util.h"

void adamw_init_shard(AdamW *opt, const Model *model, const Shard *sh) {
    const size_t count = shard_count(sh);
    size_t bytes = (count ? count : 1) * sizeof(float);   // never a zero-byte allocation
    opt->m = model->be->alloc(bytes);
    opt->v = model->be->alloc(bytes);
    opt->t = 0;
    opt->sh = *sh;
}

void adamw_init(AdamW *opt, const Model *model) {
    const size_t n = model->params.bytes_f32 / 4;
    const Shard all = {0, n, n, n};
    adamw_init_shard(opt, model, &all);
}

void adamw_free(AdamW *opt, const Model *model) {
    model->be->release(opt->m);
    model->be->release(opt->v);
    opt->m = opt->v = 0;
}

double grad_global_norm(const Model *model) {
    // padding between tensors is never written and stays 0, so one pass over the buffer is exact
    return sqrt(model->be->sumsq(model->grad, model->params.bytes_f32 / 4));
}

float clip_scale(double norm, float clip) {
    if (clip <= 0) return 1.0f;
    double s = clip / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

void adamw_update_range(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale) {
    const TensorTable *tt = &model->params;
    opt->t++;
    // The update is elementwise, so updating a tensor in pieces (a ZeRO shard boundary or a
    // stripe may cut it) gives the same bits as updating it whole.
    const size_t rounds = shard_rounds(&opt->sh);
    for (size_t k = 0; k < rounds; k++) {
        size_t lo, hi, off;
        shard_range(&opt->sh, k, &lo, &hi, &off);
        for (int i = 0; lo < hi && i < tt->n; i++) {
            const TensorInfo *ti = &tt->t[i];
            size_t a = ti->off_f32 / 4, b = a + ti->numel;
            if (a < lo) a = lo;
            if (b > hi) b = hi;
            if (a >= b) continue;
            float wd = ti->decay ? tc->weight_decay : 0.0f;
            model->be->adamw_update(model_master_at(model, a, b), opt->m + off + (a - lo), opt->v + off + (a - lo),
                                    model->grad + a, b - a, lr, tc->beta1, tc->beta2, tc->eps, wd, grad_scale, opt->t);
        }
    }
}

int adamw_step_fused(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale) {
    const TensorTable *tt = &model->params;
    if (!model->be->adamw_update_store || (void *)model->master == model->w || model_masters_sharded(model) ||
        !shard_is_all(&opt->sh))
        return 0;
    opt->t++;
    const unsigned long long seed = adamw_store_seed(tc->seed, opt->t);
    for (int i = 0; i < tt->n; i++) {   // whole tensors, as model_sync_weights stores them
        const TensorInfo *ti = &tt->t[i];
        const size_t a = ti->off_f32 / 4;
        model->be->adamw_update_store(model->master + a, opt->m + a, opt->v + a, model->grad + a, ti->numel, lr,
                                      tc->beta1, tc->beta2, tc->eps, ti->decay ? tc->weight_decay : 0.0f, grad_scale,
                                      opt->t, (float *)table_ptr_store(tt, model->w, i), model_weight_seed(seed, i));
    }
    return 1;
}

void adamw_step(AdamW *opt, Model *model, const TrainConfig *tc, float lr, float grad_scale) {
    if (adamw_step_fused(opt, model, tc, lr, grad_scale)) return;
    adamw_update_range(opt, model, tc, lr, grad_scale);
    // bf16 storage backends re-round the weights from the masters; the seed makes it repeatable
    model_sync_weights(model, adamw_store_seed(tc->seed, opt->t));
}

float lr_at(const TrainConfig *tc, int step) {
    if (tc->warmup_steps > 0 && step < tc->warmup_steps) return tc->lr * (float)(step + 1) / (float)tc->warmup_steps;
    int decay = tc->max_steps - tc->warmup_steps;
    double progress = (double)(step - tc->warmup_steps) / (double)(decay > 1 ? decay : 1);
    if (progress > 1.0) progress = 1.0;
    return (float)(tc->min_lr + 0.5 * (tc->lr - tc->min_lr) * (1.0 + cos(M_PI * progress)));
}
