// MoE routing decisions on host memory, shared by both backends so that they route
// identically: softmax over all experts and top-k, the capacity plan, the auxiliary losses and
// the router's softmax backward (semantics: the moe_* entries of backend/backend.h). The CPU
// backend uses them as its ops; the CUDA backend runs them on host copies (kernels/cuda_moe.cu).
//
// Determinism (docs/DESIGN.md section 6): every reduction runs in a fixed order, each output row is
// written by exactly one thread, and the routing decisions are pure functions of the fp32
// probabilities: top-k ties go to the lower expert index, capacity drops take the lowest
// probability first and, among equal probabilities, the later token. The per-token steps and
// the drop rule are backend/moe_route_rows.h, which the CUDA kernels run too.
#include "backend/moe_routing.h"

#include "backend/moe_route_rows.h"

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
    for (int t = 0; t < N; t++)
        moe_topk_row(probs + (size_t)t * E, lse + t, topk_idx + (size_t)t * K, topk_w + (size_t)t * K,
                     logits + (size_t)t * E, E, K, norm_topk);
}

// Capacity ranking of one expert's assignments, in moe_goes_before's order (the device ranks
// each assignment by counting instead: moe_assignment_kept; tests/test_moe_dispatch.c checks
// the two agree).
typedef struct Ranked { float p; int a; } Ranked;

static int cmp_ranked(const void *x, const void *y) {
    const Ranked *u = x, *v = y;
    if (moe_goes_before(u->p, u->a, v->p, v->a)) return -1;
    return moe_goes_before(v->p, v->a, u->p, u->a) ? 1 : 0;
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
    moe_aux_combine(out, psum, zsum, counts, N, E, K, aux_coef, z_coef);
    free(psum);
}

void moe_route_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                                     const int *topk_idx, const float *topk_w, const int *counts, int N, int E,
                                     int K, int norm_topk, float aux_scale, float z_scale) {
    #pragma omp parallel for schedule(static) if ((size_t)N * E >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++)
        moe_softmax_backward_row(dlogits + (size_t)t * E, dtopk_w + (size_t)t * K, probs + (size_t)t * E, lse[t],
                                 topk_idx + (size_t)t * K, topk_w + (size_t)t * K, counts, N, E, K, norm_topk,
                                 aux_scale, z_scale);
}
