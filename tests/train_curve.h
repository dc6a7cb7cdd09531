// A short training run of a tiny model on learnable synthetic data, shared by the tests that
// compare loss curves across backends (tests/test_bf16_emulation.c: fp32 CPU against the
// CPU bf16 emulation; tests/gpu/test_gpu_train.c: CUDA against the emulation). Header-only
// (static functions): the test programs are single files.
#ifndef CLLA_TESTS_TRAIN_CURVE_H
#define CLLA_TESTS_TRAIN_CURVE_H

#include <stdint.h>

#include "common/rng.h"
#include "common/util.h"
#include "model/model.h"
#include "train/optimizer.h"

// The curve model: GQA, 2 layers, d 48, vocab 64; a fraction of a second per 50 steps on
// 2 CPU cores.
#define TRAIN_CURVE_JSON                                                                                 \
    "{\"vocab_size\":64,\"hidden_size\":48,\"num_attention_heads\":4,\"head_dim\":12,"                  \
    "\"intermediate_size\":96,\"attention\":\"gqa\",\"num_key_value_heads\":2,"                         \
    "\"num_hidden_layers\":2,\"initializer_range\":0.05,\"rope_theta\":1000,"                           \
    "\"train\":{\"seed\":5,\"weight_decay\":0.1}}"

// Sequences that can be learnt: each starts at a random token and steps by a per-sequence
// stride (one of 4), with 10% of the tokens replaced by noise.
static void train_curve_batch(int32_t *in, int32_t *tg, int B, int T, int V, Rng *r) {
    int32_t *seq = xmalloc((size_t)(T + 1) * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        int32_t x = (int32_t)(rng_next(r) % (unsigned)V), stride = 1 + (int32_t)(rng_next(r) % 4u);
        for (int t = 0; t <= T; t++) {
            seq[t] = (rng_next(r) % 10u == 0) ? (int32_t)(rng_next(r) % (unsigned)V) : x;
            x = (x + stride) % V;
        }
        for (int t = 0; t < T; t++) {
            in[b * T + t] = seq[t];
            tg[b * T + t] = seq[t + 1];
        }
    }
    free(seq);
}

// steps updates (warmup 5, cosine to lr / 10, clip 1) of json's model on be, B x T tokens a
// step; loss[s] is the loss of step s before its update. The same seeds on every backend:
// the same fp32 masters, the same batches.
static void train_curve(const Backend *be, const char *json, int steps, int B, int T, float *loss) {
    Config cfg;
    config_from_json(&cfg, json, "train_curve", 0, NULL);
    TrainConfig *tc = &cfg.train;
    tc->max_steps = steps;
    tc->warmup_steps = 5;
    tc->lr = 3e-3f;
    tc->min_lr = 3e-4f;
    tc->grad_clip = 1.0f;
    Model m;
    model_build(&m, &cfg.model, be);
    model_init_weights(&m, tc->seed);
    model_set_batch(&m, B, T);
    AdamW opt;
    adamw_init(&opt, &m);
    Rng r;
    rng_seed(&r, 2024);
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    for (int s = 0; s < steps; s++) {
        train_curve_batch(in, tg, B, T, cfg.model.vocab_size, &r);
        model_zero_grad(&m);
        loss[s] = model_forward(&m, in, tg);
        model_backward(&m, 1.0f);
        adamw_step(&opt, &m, tc, lr_at(tc, s), clip_scale(grad_global_norm(&m), tc->grad_clip));
    }
    free(in);
    free(tg);
    adamw_free(&opt, &m);
    model_free(&m);
}

#endif
