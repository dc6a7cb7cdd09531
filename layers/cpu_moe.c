// Mixture-of-experts ops of the CPU reference backend: the fp32 router (logits, softmax,
// top-k, capacity dropping, load-balancing and z losses) and the row gather/scatter that
// moves tokens to the experts and back. layers/backend.h defines the semantics.
//
// Determinism (DESIGN section 6): every reduction runs in a fixed order, each output row is
// written by exactly one thread, and the routing decisions are pure functions of the fp32
// probabilities: top-k ties go to the lower expert index, capacity drops take the lowest
// probability first and, among equal probabilities, the later token.
#include "layers/cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Row loops are parallel only when there is enough work to pay for the threads.
#define MOE_PAR_MIN ((size_t)1 << 14)

void cpu_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E) {
    // fp32 storage: the router matmul is an ordinary fp32 matmul here
    cpu_matmul_forward(logits, inp, weight, N, C, E);
}

void cpu_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                             const float *weight, int N, int C, int E) {
    cpu_matmul_backward(dinp, dweight, dlogits, inp, weight, N, C, E);
}

void cpu_moe_topk_forward(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
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

void cpu_moe_dispatch(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
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

void cpu_moe_aux_forward(float *out, const float *probs, const float *lse, const int *counts, int N, int E,
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

void cpu_moe_router_softmax_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
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

void cpu_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C) {
    #pragma omp parallel for schedule(static) if ((size_t)R * C >= MOE_PAR_MIN)
    for (int r = 0; r < R; r++)
        memcpy(out + (size_t)r * C, inp + (size_t)row_token[r] * C, (size_t)C * sizeof(float));
}

void cpu_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C) {
    // one thread per token row; its assignments are added in k order
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *d = dinp + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;
            const float *s = dout + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += s[c];
        }
    }
}

void cpu_moe_combine_forward(float *out, const float *expert_out, const float *topk_w, const int *assign_row,
                             int N, int K, int C) {
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;   // dropped: the token keeps its residual (and the shared expert)
            const float w = topk_w[(size_t)t * K + k];
            const float *s = expert_out + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += w * s[c];
        }
    }
}

void cpu_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                              const float *topk_w, const int *assign_row, int N, int K, int C) {
    // every row r belongs to exactly one (t, k), so the per-token loop writes disjoint rows
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        const float *g = dout + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;
            const float w = topk_w[(size_t)t * K + k];
            const float *y = expert_out + (size_t)r * C;
            float *dy = dexpert_out + (size_t)r * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dy[c] += w * g[c];
                dot += (double)g[c] * y[c];
            }
            dtopk_w[(size_t)t * K + k] += (float)dot;
        }
    }
}

// ---- grouped expert matmuls ----
//
// Many small sgemm calls (one per expert, each threaded by OpenBLAS) cost thread start-up and
// barriers per call, so E experts would cost far more than the same rows in a few experts.
// Instead the experts' work is cut into tiles that OpenMP threads take dynamically, each tile
// one single-threaded sgemm (OpenBLAS runs single-threaded inside an OpenMP region: one level
// of threads at a time, DESIGN section 3). Tiles: blocks of rows for out and dinp (rows are
// independent), blocks of output channels for dweight (each block sums over all of the expert's
// rows in one sgemm, so the reduction order is fixed and no two threads write the same element).
// The tiling depends only on the sizes and the thread count: bitwise reproducible.

typedef struct Tile { int e, a0, a1; } Tile;   // expert e, range [a0, a1) of rows or channels

// Row-block size: about 4 tiles per thread over all rows, at least 64 rows (the weight is packed
// once per tile, so smaller tiles would spend their time packing), at most 1024.
static int row_block(int R) {
    int nt = omp_get_max_threads();
    int rb = (R + 4 * nt - 1) / (4 * nt);
    return rb < 64 ? 64 : rb > 1024 ? 1024 : rb;
}

static Tile *row_tiles(const int *off, int E, int *n_tiles) {
    int R = off[E], rb = row_block(R), n = 0;
    for (int e = 0; e < E; e++) n += (off[e + 1] - off[e] + rb - 1) / rb;
    Tile *t = malloc((size_t)(n > 0 ? n : 1) * sizeof(Tile));
    if (!t) { fprintf(stderr, "moe_expert_matmul: out of memory\n"); abort(); }
    n = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r += rb) t[n++] = (Tile){e, r, r + rb < off[e + 1] ? r + rb : off[e + 1]};
    *n_tiles = n;
    return t;
}

void cpu_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights, const int *expert_off,
                                   int E, int C, int OC) {
    int n;
    Tile *t = row_tiles(expert_off, E, &n);
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        int rows = t[i].a1 - t[i].a0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, OC, C, 1.0f, inp + (size_t)t[i].a0 * C, C,
                    weights[t[i].e], C, 0.0f, out + (size_t)t[i].a0 * OC, OC);
    }
    free(t);
}

void cpu_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                    const float *const *weights, const int *expert_off, int E, int C, int OC) {
    if (C <= 0 || OC <= 0) return;
    int n;
    Tile *t = row_tiles(expert_off, E, &n);
    if (dinp) {
        #pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            int rows = t[i].a1 - t[i].a0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, OC, 1.0f, dout + (size_t)t[i].a0 * OC, OC,
                        weights[t[i].e], C, 1.0f, dinp + (size_t)t[i].a0 * C, C);
        }
    }
    free(t);
    if (!dweights) return;
    // channel blocks of dweight[e]: (ob, C) += dout[:, o0:o1]^T (ob, n_e) @ inp rows (n_e, C)
    int ob = 64, per = (OC + ob - 1) / ob, m = 0;
    for (int e = 0; e < E; e++) m += expert_off[e + 1] > expert_off[e] ? per : 0;
    Tile *w = malloc((size_t)(m > 0 ? m : 1) * sizeof(Tile));
    if (!w) { fprintf(stderr, "moe_expert_matmul: out of memory\n"); abort(); }
    m = 0;
    for (int e = 0; e < E; e++)
        if (expert_off[e + 1] > expert_off[e])
            for (int o = 0; o < OC; o += ob) w[m++] = (Tile){e, o, o + ob < OC ? o + ob : OC};
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m; i++) {
        int e = w[i].e, r0 = expert_off[e], rows = expert_off[e + 1] - r0, oc = w[i].a1 - w[i].a0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, C, rows, 1.0f, dout + (size_t)r0 * OC + w[i].a0, OC,
                    inp + (size_t)r0 * C, C, 1.0f, dweights[e] + (size_t)w[i].a0 * C, C);
    }
    free(w);
}
