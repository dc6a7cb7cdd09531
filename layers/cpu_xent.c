// Softmax cross-entropy over V classes, one row per token.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "common/util.h"
#include "common/vec.h"

// e[i] = exp(l[i] - m) for i < V (e may be NULL: only the sum), 8 lanes at a time (vec_exp,
// within 2 ulp of expf: a training step of bench_train's d512 model takes 2 x 2048 x 8192
// exponentials here; perf showed glibc's scalar expf at 1.8% of the step, this and SwiGLU);
// returns their sum, each group of 8 summed in float and the groups in double, in a fixed order.
static double exp_row(float *e, const float *l, int V, float m) {
    const vecf mv = vec_splat(m);
    double sum = 0.0;
    int i = 0;
    for (; i + VEC_LANES <= V; i += VEC_LANES) {
        vecf x = vec_exp(vec_load(l + i) - mv);
        if (e) vec_store(e + i, x);
        sum += (double)vec_sum(x);
    }
    for (; i < V; i++) {
        float x = expf(l[i] - m);
        if (e) e[i] = x;
        sum += (double)x;
    }
    return sum;
}

// Row max and log of sum(exp(logit - max)): the max subtraction keeps exp <= 1, so
// logits of any magnitude neither overflow nor lose the target's probability to 0/0.
static void row_logsumexp(const float *l, int V, float *maxv, double *lse_shifted) {
    float m = vec_max_of(l, V, -INFINITY);
    *maxv = m;
    *lse_shifted = log(exp_row(NULL, l, V, m));
}

// losses (N) = -log softmax(logits (N, V))[target], 0 where target == ignore_index.
void cpu_xent_forward(float *losses, const float *logits, const int *targets, int N, int V,
                      int ignore_index) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const int tgt = targets[n];
        if (tgt == ignore_index) { losses[n] = 0.0f; continue; }
        assert(tgt >= 0 && tgt < V);
        const float *l = logits + (size_t)n * V;
        float m;
        double lse;
        row_logsumexp(l, V, &m, &lse);
        losses[n] = (float)(lse - (double)(l[tgt] - m));
    }
}

// dlogits (N, V) += dloss * (softmax(logits) - onehot(target)); ignored rows get nothing
// (+= 0). The softmax is recomputed instead of stored: one more pass over logits is far
// cheaper than keeping an (N, V) probability buffer alive between forward and backward.
// The exponentials go to a per-thread row buffer so that each is computed once (V expf
// per row instead of 2V); with a large vocabulary this loop rivals the lm_head matmul.
void cpu_xent_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                       int ignore_index, float dloss) {
    #pragma omp parallel
    {
        float *e = xmalloc((size_t)V * sizeof(float));
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const int tgt = targets[n];
            if (tgt == ignore_index) continue;
            assert(tgt >= 0 && tgt < V);
            const float *l = logits + (size_t)n * V;
            float *dl = dlogits + (size_t)n * V;
            const double sum = exp_row(e, l, V, vec_max_of(l, V, -INFINITY));
            const float scale = (float)((double)dloss / sum);
            for (int i = 0; i < V; i++) dl[i] += e[i] * scale;
            dl[tgt] -= dloss;
        }
        free(e);
    }
}
