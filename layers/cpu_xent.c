// Softmax cross-entropy over V classes, one row per token.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "common/util.h"

// Row max and log of sum(exp(logit - max)): the max subtraction keeps exp <= 1, so
// logits of any magnitude neither overflow nor lose the target's probability to 0/0.
static void row_logsumexp(const float *l, int V, float *maxv, double *lse_shifted) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
    // expf, not exp: with V ~ 50k this loop runs V times per token in both passes, and the
    // double libm exp costs several times more; the sum itself is kept in double.
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += (double)expf(l[i] - m);
    *maxv = m;
    *lse_shifted = log(sum);
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
            float m = -INFINITY;
            for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
            double sum = 0.0;
            for (int i = 0; i < V; i++) {
                e[i] = expf(l[i] - m);
                sum += (double)e[i];
            }
            const float scale = (float)((double)dloss / sum);
            for (int i = 0; i < V; i++) dl[i] += e[i] * scale;
            dl[tgt] -= dloss;
        }
        free(e);
    }
}
