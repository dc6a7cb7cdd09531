#include "eval/perplexity.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "eval/through_cache.h"

// Window k: inputs ids[b, e), targets ids[b + 1, e + 1) with b = k * stride, e = min(b + T, n - 1);
// targets at or before the previous window's last one are context only.
long long ppl_num_windows(long long n, int T, int stride) {
    if (n < 2) return 0;
    long long w = 0;
    for (long long b = 0, end = 0; end < n - 1; b += stride, w++) end = b + T < n - 1 ? b + T : n - 1;
    return w;
}

// Calls score(in, tg, rows, len) on batches of up to B full windows (the last, shorter window
// alone), targets already scored masked with IGNORE_INDEX; counts windows and batches in *r.
typedef void (*WindowScore)(const int32_t *in, const int32_t *tg, int rows, int len, void *ctx);
static void for_each_window_batch(const int32_t *ids, long long n, int B, int T, int stride, WindowScore score, void *sctx,
                                  EvalProgress progress, void *ctx, EvalResult *r) {
    if (n < 2 || T < 1 || B < 1 || stride < 1 || stride > T) die("internal error: strided windows(n=%lld, B=%d, T=%d, stride=%d)", n, B, T, stride);
    const long long total = ppl_num_windows(n, T, stride);
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    long long scored_to = 0, b = 0;   // the last target index scored so far; the next window's start
    while (scored_to < n - 1) {
        // up to B windows of full length, or the last (shorter) one alone
        int rows = 0, len = T;
        while (rows < B && scored_to < n - 1) {
            long long e = b + T < n - 1 ? b + T : n - 1;
            if (e - b < T) {
                if (rows) break;   // the short window goes alone
                len = (int)(e - b);
            }
            for (int t = 0; t < len; t++) {
                long long target = b + t + 1;
                in[(size_t)rows * len + t] = ids[b + t];
                tg[(size_t)rows * len + t] = target > scored_to ? ids[target] : IGNORE_INDEX;
            }
            scored_to = e;
            b += stride;
            rows++;
            if (len < T) break;
        }
        score(in, tg, rows, len, sctx);
        r->windows += rows;
        r->batches++;
        if (progress) progress(r->windows, total, ctx);
    }
    free(in);
    free(tg);
}

typedef struct ForwardScore {
    Model *model;
    double sum;
    long long count;
} ForwardScore;

static void forward_score(const int32_t *in, const int32_t *tg, int rows, int len, void *ctx) {
    ForwardScore *f = ctx;
    model_set_batch(f->model, rows, len);
    float loss = model_forward(f->model, in, tg);
    long long count = model_last_count(f->model);
    f->sum += (double)loss * (double)count;
    f->count += count;
}

EvalResult eval_strided(Model *model, const int32_t *ids, long long n, int B, int T, int stride, EvalProgress progress, void *ctx) {
    EvalResult r = {0};
    const int B0 = model->B, T0 = model->T;
    ForwardScore f = {model, 0, 0};
    for_each_window_batch(ids, n, B, T, stride, forward_score, &f, progress, ctx, &r);
    r.tokens = f.count;
    r.loss = f.count ? f.sum / (double)f.count : 0.0;
    if (B0 > 0 && T0 > 0) model_set_batch(model, B0, T0);
    return r;
}

typedef struct CacheScore {
    Model *model;
    const CacheLayout *layout;
    CacheLoss *acc;
} CacheScore;

static void cache_score(const int32_t *in, const int32_t *tg, int rows, int len, void *ctx) {
    CacheScore *c = ctx;
    eval_through_cache(c->model, c->layout, in, tg, rows, len, c->acc);
}

EvalResult eval_strided_cache(Model *model, const CacheLayout *layout, const int32_t *ids, long long n, int B, int T, int stride,
                              EvalProgress progress, void *ctx, CacheLoss *acc) {
    EvalResult r = {0};
    const int B0 = model->B, T0 = model->T;
    CacheScore c = {model, layout, acc};
    for_each_window_batch(ids, n, B, T, stride, cache_score, &c, progress, ctx, &r);
    r.tokens = acc->count;
    r.loss = acc->count ? acc->full_sum / (double)acc->count : 0.0;
    if (B0 > 0 && T0 > 0) model_set_batch(model, B0, T0);
    return r;
}
