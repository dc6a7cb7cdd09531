#include "eval/perplexity.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

// Window k: inputs ids[b, e), targets ids[b + 1, e + 1) with b = k * stride, e = min(b + T, n - 1);
// targets at or before the previous window's last one are context only.
long long ppl_num_windows(long long n, int T, int stride) {
    if (n < 2) return 0;
    long long w = 0;
    for (long long b = 0, end = 0; end < n - 1; b += stride, w++) end = b + T < n - 1 ? b + T : n - 1;
    return w;
}

EvalResult eval_strided(Model *model, const int32_t *ids, long long n, int B, int T, int stride, EvalProgress progress, void *ctx) {
    EvalResult r = {0};
    if (n < 2 || T < 1 || B < 1 || stride < 1 || stride > T) die("internal error: eval_strided(n=%lld, B=%d, T=%d, stride=%d)", n, B, T, stride);
    const int B0 = model->B, T0 = model->T;
    const long long total = ppl_num_windows(n, T, stride);
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    double sum = 0;
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
        model_set_batch(model, rows, len);
        float loss = model_forward(model, in, tg);
        long long count = model_last_count(model);
        sum += (double)loss * (double)count;
        r.tokens += count;
        r.windows += rows;
        r.batches++;
        if (progress) progress(r.windows, total, ctx);
    }
    r.loss = r.tokens ? sum / (double)r.tokens : 0.0;
    free(in);
    free(tg);
    if (B0 > 0 && T0 > 0) model_set_batch(model, B0, T0);
    return r;
}
