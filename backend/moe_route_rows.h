// The per-token and per-assignment steps of MoE routing, written once for both backends: the
// CPU routing (backend/moe_routing.c) loops over them, the CUDA kernels (kernels/cuda_moe.cu)
// run one thread per token or assignment over the same functions. So the decisions (top-k and
// its ties, which assignments an over-full expert drops, the row order) are made in this file
// only; the two backends differ where their libm differ (expf, log: an ulp in probs), which can
// flip a decision only at an exact tie of two different experts' logits.
//
// Priority inside an expert (capacity drops): the higher probability first, then the earlier
// assignment a = t * K + k (an earlier token: a token picks an expert at most once). An
// over-full expert keeps its `capacity` assignments of highest priority; capacity <= 0 keeps all.
//
// Dispatch as the device runs it, and as tests/test_moe_dispatch.c replays it on the CPU
// against moe_route_dispatch's counting sort and qsort:
//   1. pos[a]: a's index among its expert's assignments in token order; counts[e]  (scan per expert)
//   2. start[e], expert_off[e]: moe_dispatch_plan                                  (one thread)
//   3. list[start[e] + pos[a]] = a                                                 (per assignment)
//   4. keep[a] = moe_assignment_kept(a, ...)                                       (per assignment)
//   5. rows: expert_off[e] + the kept assignments before a in list order           (scan per expert)
#ifndef CLLA_BACKEND_MOE_ROUTE_ROWS_H
#define CLLA_BACKEND_MOE_ROUTE_ROWS_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif

// Softmax over the E logits of one token (probs p, log-sum-exp lse), then its top-K experts
// (idx) and their combine weights (w), renormalized over the top-K when norm_topk.
static inline MOE_HD void moe_topk_row(float *p, float *lse, int *idx, float *w, const float *x, int E, int K,
                                       int norm_topk) {
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
    *lse = mx + (float)log(sum);
    // top-K by repeated selection (K is small): the strict '>' scanning upwards keeps the lowest
    // index among equal probabilities
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

// 1 when assignment b (probability pb) goes before assignment a (pa) in their expert.
static inline MOE_HD int moe_goes_before(float pb, int b, float pa, int a) {
    return pb > pa || (pb == pa && b < a);
}

// From the per-expert counts (before dropping): start[e] (E + 1 entries), where expert e's
// assignments begin in the token-ordered list, and expert_off[e] (E + 1), where its kept rows
// begin; expert_off[E] is the number of rows R.
static inline MOE_HD void moe_dispatch_plan(int *start, int *expert_off, const int *counts, int E, int capacity) {
    start[0] = 0;
    expert_off[0] = 0;
    for (int e = 0; e < E; e++) {
        int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
        start[e + 1] = start[e] + counts[e];
        expert_off[e + 1] = expert_off[e] + kept;
    }
}

// Whether assignment a survives its expert's capacity: fewer than `capacity` assignments of
// that expert go before it. list holds every expert's assignments (start[] as above).
static inline MOE_HD int moe_assignment_kept(int a, const int *list, const int *start, const int *counts,
                                             const float *probs, const int *topk_idx, int E, int K, int capacity) {
    const int e = topk_idx[a];
    if (capacity <= 0 || counts[e] <= capacity) return 1;
    const float pa = probs[(size_t)(a / K) * E + e];
    int before = 0;
    for (int i = start[e]; i < start[e + 1] && before < capacity; i++) {
        const int b = list[i];
        before += moe_goes_before(probs[(size_t)(b / K) * E + e], b, pa, a);
    }
    return before < capacity;
}

// The two auxiliary losses from psum[e] = sum over tokens of probs[t, e] and zsum = sum over
// tokens of lse^2 (both in double, in token order on every backend): out[0] the load-balancing
// loss aux_coef * E * sum_e f_e P_e (f_e = counts[e] / (N K), P_e = psum[e] / N), out[1] the
// z-loss z_coef * zsum / N.
static inline MOE_HD void moe_aux_combine(float *out, const double *psum, double zsum, const int *counts, int N,
                                          int E, int K, float aux_coef, float z_coef) {
    double fp = 0.0;
    for (int e = 0; e < E; e++) fp += ((double)counts[e] / ((double)N * K)) * (psum[e] / N);
    out[0] = N > 0 ? (float)((double)aux_coef * E * fp) : 0.0f;
    out[1] = N > 0 ? (float)((double)z_coef * zsum / N) : 0.0f;
}

// d(aux loss)/d(probs[t, e]), the same for every token t: aux_scale * E * f_e / N with
// f_e = counts[e] / (N * K).
static inline MOE_HD float moe_daux(int count, int N, int E, int K, float aux_scale) {
    return (float)((double)aux_scale * E * ((double)count / ((double)N * K)) / N);
}

// One token's router softmax backward, accumulated into dl (E logits): the combine weights'
// gradient dw (through the top-K renormalization when norm_topk), the load-balancing loss
// (moe_daux of each expert's count) and the z-loss (z_scale * lse^2 / N).
static inline MOE_HD void moe_softmax_backward_row(float *dl, const float *dw, const float *p, float lse,
                                                   const int *idx, const float *w, const int *counts, int N, int E,
                                                   int K, int norm_topk, float aux_scale, float z_scale) {
    // dprobs of the selected experts. With renormalization w_k = p_k / S, S = sum_j p_j over
    // the top-k: dp_j = (dw_j - sum_k dw_k w_k) / S. Recomputed per use instead of stored:
    // K is small and a device thread has no scratch of size K.
    double S = 0.0, dot = 0.0;
    if (norm_topk)
        for (int k = 0; k < K; k++) { S += p[idx[k]]; dot += (double)dw[k] * w[k]; }
#define MOE_DSEL(k) (norm_topk ? (float)(((double)dw[k] - dot) / S) : dw[k])
    // softmax backward: dl_i += p_i (dp_i - sum_j p_j dp_j), dp = daux + the selected terms
    double pdp = 0.0;
    for (int e = 0; e < E; e++) pdp += (double)p[e] * moe_daux(counts[e], N, E, K, aux_scale);
    for (int k = 0; k < K; k++) pdp += (double)p[idx[k]] * MOE_DSEL(k);
    const float s = (float)pdp, zc = 2.0f * z_scale / (float)N;
    for (int e = 0; e < E; e++) dl[e] += p[e] * (moe_daux(counts[e], N, E, K, aux_scale) - s) + zc * lse * p[e];
    for (int k = 0; k < K; k++) dl[idx[k]] += p[idx[k]] * MOE_DSEL(k);
#undef MOE_DSEL
}

#endif
