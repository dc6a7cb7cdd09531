// A tiny model of a JSON config on the CPU backend with one batch of random tokens, shared by the
// whole-model gradient tests (tests/test_model_grad.c: finite differences; tests/test_grad_final.c:
// the backward's reports of complete gradients). Header-only: the test programs are single files.
#ifndef CLLA_TESTS_TINY_BATCH_H
#define CLLA_TESTS_TINY_BATCH_H

#include <stdint.h>

#include "common/rng.h"
#include "model/model.h"

// Builds m from json (weights from seed), sets its batch to B x T, and fills in and tg (B T
// each) with tokens below vocab drawn from r (which the caller may go on drawing from).
static void tiny_batch(Model *m, Config *cfg, const char *json, const char *name, unsigned long long seed, int B, int T,
                       int vocab, Rng *r, int32_t *in, int32_t *tg) {
    config_from_json(cfg, json, name, 0, NULL);
    model_build(m, &cfg->model, backend_cpu());
    model_init_weights(m, seed);
    model_set_batch(m, B, T);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(rng_next(r) % (uint64_t)vocab);
        tg[i] = (int32_t)(rng_next(r) % (uint64_t)vocab);
    }
}

#endif
