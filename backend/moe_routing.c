// MoE routing decisions on host memory, shared by both backends so that they route
// identically: softmax over all experts and top-k, the capacity plan, the auxiliary losses and
// the router's softmax backward (semantics: the moe_* entries of backend/backend.h). The CPU
// backend uses them as its ops; the CUDA backend runs them on host copies (kernels/cuda_moe.cu).
//
// Determinism (docs/DESIGN.md section 6): every reduction runs in a fixed order, each output row is
// written by exactly one thread, and the routing decisions are pure functions of the fp32
// probabilities: top-k ties go to the lower expert index, capacity drops take the lowest
// probability first and, among equal probabilities, the later token.
#include "backend/moe_routing.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Row loops are parallel only when there is enough work to pay for the threads.
#define MOE_PAR_MIN ((size_t)1 << 14)

void moe_route_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                          int N, int E, int K, int norm_topk) {
    #pragma omp parallel for schedule(static) if ((size_t)N * E >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        const float *x = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = x[0];
        for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        // the sum in double: it is a handful of terms and makes lse accurate for the z-loss
        double sum = 0.0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(x[e] - mx);
            sum += p[e];
        }
        float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++) p[e] *= inv;
        lse[t] = mx + (float)log(sum);
        // top-K by repeated selection (K is 1 or 2 in practice): the strict '>' scanning
        // upwards keeps the lowest index among equal probabilities
        int *idx = topk_idx + (size_t)t * K;
        float *w = topk_w + (size_t)t * K;
        double wsum = 0.0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= idx[j] == e;
                if (taken) continue;
                if (best < 0 || p[e] > p[best]) best = e;
            }
            idx[k] = best;
            w[k] = p[best];
            wsum += p[best];
        }
        if (norm_topk)
            for (int k = 0; k < K; k++) w[k] = (float)(w[k] / wsum);
    }
}

// Capacity ranking of one expert's assignments: higher probability first, then the earlier
// token (a smaller assignment index t*K+k is an earlier token, since a token picks an expert
// at most once).
typedef struct Ranked { float p; int a; } Ranked;

static int cmp_ranked(const void *x, const void *y) {
    const Ranked *u = x, *v = y;
    if (u->p != v->p) return u->p > v->p ? -1 : 1;
    return (u->a > v->a) - (u->a < v->a);
}

void moe_route_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                      const int *topk_idx, int N, int E, int K, int capacity) {
    const int NK = N * K;
    // 1. counting sort of the assignments by expert, token order inside each expert
    int *start = calloc((size_t)E + 1, sizeof(int));
    int *list = malloc((size_t)(NK > 0 ? NK : 1) * sizeof(int));
    int *keep = malloc((size_t)(NK > 0 ? NK : 1) * sizeof(int));
    if (!start || !list || !keep) { fprintf(stderr, "moe_dispatch: out of memory\n"); abort(); }
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (int a = 0; a < NK; a++) counts[topk_idx[a]]++;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + counts[e];
    {
        int *fill = malloc((size_t)E * sizeof(int));
        if (!fill) { fprintf(stderr, "moe_dispatch: out of memory\n"); abort(); }
        memcpy(fill, start, (size_t)E * sizeof(int));
        for (int a = 0; a < NK; a++) list[fill[topk_idx[a]]++] = a;
        free(fill);
    }
    // 2. capacity: an over-full expert keeps its `capacity` most probable assignments
    for (int a = 0; a < NK; a++) keep[a] = 1;
    if (capacity > 0) {
        #pragma omp parallel for schedule(dynamic, 1) if ((size_t)NK >= MOE_PAR_MIN)
        for (int e = 0; e < E; e++) {
            int n = counts[e];
            if (n <= capacity) continue;
            Ranked *r = malloc((size_t)n * sizeof(Ranked));
            if (!r) { fprintf(stderr, "moe_dispatch: out of memory\n"); abort(); }
            for (int i = 0; i < n; i++) {
                int a = list[start[e] + i];
                r[i].p = probs[(size_t)(a / K) * E + e];
                r[i].a = a;
            }
            qsort(r, (size_t)n, sizeof(Ranked), cmp_ranked);   // a total order: qsort is deterministic
            for (int i = capacity; i < n; i++) keep[r[i].a] = 0;
            free(r);
        }
    }
    // 3. rows: the kept assignments, expert after expert, token order inside an expert
    int row = 0;
    for (int e = 0; e < E; e++) {
        expert_off[e] = row;
        for (int i = start[e]; i < start[e + 1]; i++) {
            int a = list[i];
            if (keep[a]) {
                row_token[row] = a / K;
                assign_row[a] = row++;
            } else {
                assign_row[a] = -1;
            }
        }
    }
    expert_off[E] = row;
    for (int r = row; r < NK; r++) row_token[r] = -1;
    free(start); free(list); free(keep);
}

void moe_route_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N, int E,
                         int K, float aux_coef, float z_coef) {
    // P_e = mean_t probs[t, e]: column sums in token order (fixed order, double accumulators)
    double *psum = calloc((size_t)E, sizeof(double));
    if (!psum) { fprintf(stderr, "moe_aux_forward: out of memory\n"); abort(); }
    double zsum = 0.0;
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E;
        for (int e = 0; e < E; e++) psum[e] += p[e];
        zsum += (double)lse[t] * lse[t];
    }
    double fp = 0.0;
    for (int e = 0; e < E; e++) fp += ((double)counts[e] / ((double)N * K)) * (psum[e] / N);
    out[0] = N > 0 ? (float)((double)aux_coef * E * fp) : 0.0f;
    out[1] = N > 0 ? (float)((double)z_coef * zsum / N) : 0.0f;
    free(psum);
}

void moe_route_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                                     const int *topk_idx, const float *topk_w, const int *counts, int N, int E,
                                     int K, int norm_topk, float aux_scale, float z_scale) {
    if (N <= 0) return;
    // d(aux)/d(probs[t, e]) = aux_scale * E * f_e / N, the same for every token
    float *daux = malloc((size_t)E * sizeof(float));
    if (!daux) { fprintf(stderr, "moe_router_softmax_backward: out of memory\n"); abort(); }
    for (int e = 0; e < E; e++)
        daux[e] = (float)((double)aux_scale * E * ((double)counts[e] / ((double)N * K)) / N);
    const float zc = 2.0f * z_scale / (float)N;
    #pragma omp parallel for schedule(static) if ((size_t)N * E >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E;
        const int *idx = topk_idx + (size_t)t * K;
        const float *w = topk_w + (size_t)t * K;
        const float *dw = dtopk_w + (size_t)t * K;
        float *dl = dlogits + (size_t)t * E;
        // dprobs of the selected experts. With renormalization w_k = p_k / S, S = sum_j p_j
        // over the top-k: dp_j = (dw_j - sum_k dw_k w_k) / S.
        float dsel[16];
        float *ds = K <= 16 ? dsel : malloc((size_t)K * sizeof(float));
        if (!ds) { fprintf(stderr, "moe_router_softmax_backward: out of memory\n"); abort(); }
        if (norm_topk) {
            double S = 0.0, dot = 0.0;
            for (int k = 0; k < K; k++) { S += p[idx[k]]; dot += (double)dw[k] * w[k]; }
            for (int k = 0; k < K; k++) ds[k] = (float)(((double)dw[k] - dot) / S);
        } else {
            for (int k = 0; k < K; k++) ds[k] = dw[k];
        }
        // softmax backward: dl_i += p_i (dp_i - sum_j p_j dp_j), dp = daux + the selected terms
        double pdp = 0.0;
        for (int e = 0; e < E; e++) pdp += (double)p[e] * daux[e];
        for (int k = 0; k < K; k++) pdp += (double)p[idx[k]] * ds[k];
        float s = (float)pdp;
        for (int e = 0; e < E; e++) dl[e] += p[e] * (daux[e] - s) + zc * lse[t] * p[e];
        for (int k = 0; k < K; k++) dl[idx[k]] += p[idx[k]] * ds[k];
        if (ds != dsel) free(ds);
    }
    free(daux);
}
