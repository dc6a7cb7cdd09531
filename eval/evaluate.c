// evaluate(): eval/evaluate.h.
#include "eval/evaluate.h"

#include <stdlib.h>

#include "common/util.h"

DataLoader *eval_open(const char *path, int T, unsigned long long seed, int vocab_size, unsigned long long tokenizer_hash) {
    // B = 1: the loader's window order does not depend on B (data/loader_shards.c), and with
    // one window per step its epoch holds every window instead of whole batches only.
    LoaderOptions lo = {.B = 1, .T = T, .seed = seed, .rank = 0, .world = 1, .vocab_size = vocab_size,
                        .tokenizer_hash = tokenizer_hash};
    return loader_open(path, &lo);
}

long long eval_num_windows(const DataLoader *dl) { return loader_num_batches(dl); }

int eval_for_each_batch(DataLoader *dl, int B, int T, long long max_windows, EvalBatchFn fn, void *fctx,
                        EvalProgress progress, void *pctx, EvalResult *r) {
    long long n = eval_num_windows(dl);
    if (max_windows > 0 && max_windows < n) n = max_windows;
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    loader_reset(dl);
    for (long long done = 0; done < n && !r->failed;) {
        int rows = n - done < B ? (int)(n - done) : B;
        for (int b = 0; b < rows && !r->failed; b++)
            r->failed = loader_next_checked(dl, in + (size_t)b * T, tg + (size_t)b * T, r->err, sizeof(r->err)) != 0;
        if (r->failed) break;
        fn(in, tg, rows, fctx);
        r->batches++;
        done += rows;
        if (progress) progress(done, n, pctx);
    }
    if (!r->failed) r->windows = n;
    free(in);
    free(tg);
    return r->failed ? -1 : 0;
}

typedef struct ForwardSum {
    Model *model;
    int T;
    double sum;
    long long tokens;
} ForwardSum;

static void score_forward(const int32_t *in, const int32_t *tg, int rows, void *ctx) {
    ForwardSum *fs = ctx;
    // a partial batch runs as a smaller batch (not padded: padding rows would take MoE capacity)
    model_set_batch(fs->model, rows, fs->T);
    float loss = model_forward(fs->model, in, tg);
    long long count = model_last_count(fs->model);
    fs->sum += (double)loss * (double)count;
    fs->tokens += count;
}

EvalResult evaluate(Model *model, DataLoader *dl, int B, int T, long long max_windows, EvalProgress progress, void *ctx) {
    EvalResult r = {0};
    const int B0 = model->B, T0 = model->T;
    ForwardSum fs = {model, T, 0.0, 0};
    eval_for_each_batch(dl, B, T, max_windows, score_forward, &fs, progress, ctx, &r);
    r.tokens = fs.tokens;
    r.loss = r.tokens ? fs.sum / (double)r.tokens : 0.0;
    if (B0 > 0 && T0 > 0) model_set_batch(model, B0, T0);
    return r;
}
