// model_init_weights (model/params.c) draws its stream a chunk at a time and transforms it on
// every thread. Checked here:
//  - the masters equal the sequential definition, tensor by tensor in table order: norms 1,
//    every other tensor (float)(std * rng_normal(&rng)) from one stream seeded with the seed,
//    std the config's initializer_range or its residual-output scaling (one of the two for the
//    whole tensor); the model has tensors below the parallel threshold (8192 values), between
//    it and the draw chunk (65536) and above the chunk, so chunk boundaries inside a tensor and
//    between tensors are crossed;
//  - 1 and 2 threads give the same bits.
// Output: one line per check, then "N passed, M failed"; exit 1 on any failure.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/rng.h"
#include "common/util.h"
#include "model/config.h"
#include "model/model.h"

static int n_passed, n_failed;

static void check(const char *name, int ok, const char *detail) {
    ok ? n_passed++ : n_failed++;
    printf("%s %-52s %s\n", ok ? "ok  " : "FAIL", name, detail);
}

static float *init_masters(const Config *cfg, unsigned long long seed, int threads, Model *m) {
    omp_set_num_threads(threads);
    model_build(m, &cfg->model, backend_cpu());
    model_init_weights(m, seed);
    float *h = xmalloc(m->params.bytes_f32);
    m->be->download(h, m->master, m->params.bytes_f32);
    return h;
}

int main(void) {
    // vocab 1100 x hidden 64 = 70,400 values (above the 65,536-value chunk); the MLP's 64 x 160 =
    // 10,240 (parallel, one chunk); the attention's 64 x 64 = 4,096 (below the threshold)
    const char *json = "{\"attention\":\"gqa\",\"vocab_size\":1100,\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":2,\"head_dim\":16,\"intermediate_size\":160,\"num_hidden_layers\":3,"
                       "\"initializer_range\":0.05,\"tie_word_embeddings\":false}";
    Config cfg;
    config_from_json(&cfg, json, "test_init_weights", 0, NULL);
    const unsigned long long seed = 1234;
    Model m1, m2;
    float *h1 = init_masters(&cfg, seed, 1, &m1), *h2 = init_masters(&cfg, seed, 2, &m2);

    const double std0 = cfg.model.initializer_range, std_res = std0 / sqrt(2.0 * cfg.model.num_hidden_layers);
    Rng rng;
    rng_seed(&rng, seed);
    size_t values = 0, wrong = 0, big = 0;
    int tensors_wrong = 0;
    char d[200];
    for (int i = 0; i < m1.params.n; i++) {
        const TensorInfo *ti = &m1.params.t[i];
        const float *p = table_ptr_f32(&m1.params, h1, i);
        values += ti->numel;
        if (ti->numel > 65536) big++;
        if (ti->ndim == 1) {
            size_t bad = 0;
            for (size_t k = 0; k < ti->numel; k++) bad += p[k] != 1.0f;
            wrong += bad;
            tensors_wrong += bad != 0;
            continue;
        }
        // the same draws for both candidate scales: the stream advances once per tensor
        double *z = xmalloc(ti->numel * sizeof(double));
        for (size_t k = 0; k < ti->numel; k++) z[k] = rng_normal(&rng);
        size_t bad0 = 0, bad1 = 0;
        for (size_t k = 0; k < ti->numel; k++) {
            const float a = (float)(std0 * z[k]), b = (float)(std_res * z[k]);
            bad0 += memcmp(&a, &p[k], sizeof a) != 0;
            bad1 += memcmp(&b, &p[k], sizeof b) != 0;
        }
        const size_t bad = bad0 < bad1 ? bad0 : bad1;
        wrong += bad;
        tensors_wrong += bad != 0;
        free(z);
    }
    snprintf(d, sizeof d, "%zu values in %d tensors (%zu above one draw chunk), %zu differ in %d tensors", values,
             m1.params.n, big, wrong, tensors_wrong);
    check("masters = the sequential rng_normal stream", wrong == 0 && big > 0, d);

    size_t diff = 0;
    for (int i = 0; i < m1.params.n; i++) {
        const float *a = table_ptr_f32(&m1.params, h1, i), *b = table_ptr_f32(&m2.params, h2, i);
        diff += memcmp(a, b, m1.params.t[i].numel * sizeof(float)) != 0;
    }
    snprintf(d, sizeof d, "%zu of %d tensors differ", diff, m1.params.n);
    check("1 and 2 threads: the same bits", diff == 0, d);

    free(h1);
    free(h2);
    model_free(&m1);
    model_free(&m2);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
