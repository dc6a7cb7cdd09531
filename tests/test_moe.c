// MoE op tests for the CPU backend (layers/cpu_moe.c), through the Backend table.
//
// Forwards against naive double-precision loops written here from the contract in
// backend/backend.h; backwards against central finite differences of those double forwards
// (the routing, a discrete choice, held fixed); every backward run twice must give 2x
// (the ops accumulate). Routing edge cases: all tokens to one expert, experts that receive
// nothing, exact ties in top-k (lower expert index wins) and in capacity (earlier token wins),
// capacity 0 (no dropping) and a capacity that drops almost everything.
//
// Output: one line per check, then "N passed, M failed"; exit status 1 if anything failed.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static const Backend *be;
static int n_passed, n_failed;

#define TOL_FWD 1e-5
#define TOL_BWD 1e-4
#define TOL_ACC 1e-5

static void check(const char *name, double err, double tol) {
    int ok = err <= tol;
    if (ok) n_passed++;
    else n_failed++;
    printf("%s %-60s err=%.1e%s\n", ok ? "ok  " : "FAIL", name, err, ok ? "" : " (too large)");
}

static void check_true(const char *name, int ok) {
    if (ok) n_passed++;
    else n_failed++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", name);
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(double lo, double hi) { return lo + (hi - lo) * ((double)(rng_next() >> 11) / 9007199254740992.0); }

static void *xalloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "test_moe: out of memory\n"); exit(1); }
    return p;
}
static float *frand(size_t n, double lo, double hi) {
    float *a = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = (float)urand(lo, hi);
    return a;
}

// max |a - b| / max(max |b|, tiny)
static double rel(const float *a, const double *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    return d / (s > 1e-30 ? s : 1.0);
}

// ---------------------------------------------------------------- double references

static void softmax_d(double *p, double *lse, const float *x, int E) {
    double mx = x[0];
    for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++) s += exp((double)x[e] - mx);
    for (int e = 0; e < E; e++) p[e] = exp((double)x[e] - mx) / s;
    *lse = mx + log(s);
}

// The scalar the router backward differentiates, at logits x (double), routing idx fixed:
//   sum_{t,k} g[t,k] w[t,k] + a E sum_e f_e mean_t p[t,e] + zc mean_t lse_t^2
static double router_objective(const double *x, const int *idx, const int *counts, const float *g, int N, int E,
                               int K, int norm, double a, double zc) {
    double *p = xalloc((size_t)E * sizeof(double));
    double obj = 0, zs = 0;
    double *P = xalloc((size_t)E * sizeof(double));
    for (int t = 0; t < N; t++) {
        // softmax in double straight from the double logits (no float rounding: FD needs smoothness)
        double mx = x[(size_t)t * E], s = 0, lse;
        for (int e = 1; e < E; e++) mx = x[(size_t)t * E + e] > mx ? x[(size_t)t * E + e] : mx;
        for (int e = 0; e < E; e++) s += exp(x[(size_t)t * E + e] - mx);
        for (int e = 0; e < E; e++) p[e] = exp(x[(size_t)t * E + e] - mx) / s;
        lse = mx + log(s);
        zs += lse * lse;
        double S = 0;
        for (int k = 0; k < K; k++) S += p[idx[t * K + k]];
        for (int k = 0; k < K; k++) obj += g[t * K + k] * (norm ? p[idx[t * K + k]] / S : p[idx[t * K + k]]);
        for (int e = 0; e < E; e++) P[e] += p[e] / N;
    }
    for (int e = 0; e < E; e++) obj += a * E * ((double)counts[e] / ((double)N * K)) * P[e];
    obj += zc * zs / N;
    free(p); free(P);
    return obj;
}

// ---------------------------------------------------------------- tests

static void test_topk(int N, int E, int K, int norm) {
    char name[128];
    float *x = frand((size_t)N * E, -3, 3);
    // row 0: every logit equal (all tied); row 1: a tie for second place
    for (int e = 0; e < E; e++) x[e] = 0.5f;
    if (N > 1 && E >= 4) { x[E + 0] = 1.0f; x[E + 1] = 3.0f; x[E + 2] = 2.0f; x[E + 3] = 2.0f; for (int e = 4; e < E; e++) x[E + e] = -1.0f; }
    float *p = xalloc((size_t)N * E * 4), *lse = xalloc((size_t)N * 4), *w = xalloc((size_t)N * K * 4);
    int *idx = xalloc((size_t)N * K * sizeof(int));
    be->moe_topk_forward(p, lse, idx, w, x, N, E, K, norm);
    double *pd = xalloc((size_t)N * E * 8), *lsed = xalloc((size_t)N * 8), *wd = xalloc((size_t)N * K * 8);
    int idx_ok = 1;
    for (int t = 0; t < N; t++) {
        softmax_d(pd + (size_t)t * E, lsed + t, x + (size_t)t * E, E);
        // naive top-K on the double probabilities: the lower index wins an exact tie
        int chosen[64];
        double S = 0;
        for (int k = 0; k < K; k++) {
            int b = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                if (!taken && (b < 0 || pd[(size_t)t * E + e] > pd[(size_t)t * E + b])) b = e;
            }
            chosen[k] = b;
            S += pd[(size_t)t * E + b];
            idx_ok &= idx[t * K + k] == b;
        }
        for (int k = 0; k < K; k++) wd[t * K + k] = pd[(size_t)t * E + chosen[k]] / (norm ? S : 1.0);
    }
    snprintf(name, sizeof(name), "topk_forward probs N=%d E=%d K=%d norm=%d", N, E, K, norm);
    check(name, rel(p, pd, (size_t)N * E), TOL_FWD);
    snprintf(name, sizeof(name), "topk_forward lse N=%d E=%d K=%d", N, E, K);
    check(name, rel(lse, lsed, (size_t)N), TOL_FWD);
    snprintf(name, sizeof(name), "topk_forward weights N=%d E=%d K=%d norm=%d", N, E, K, norm);
    check(name, rel(w, wd, (size_t)N * K), TOL_FWD);
    snprintf(name, sizeof(name), "topk_forward indices (incl. tied rows) N=%d E=%d K=%d", N, E, K);
    check_true(name, idx_ok);
    int tie_ok = 1;
    for (int k = 0; k < K; k++) tie_ok &= idx[k] == k;   // all tied: experts 0..K-1 in order
    if (N > 1 && E >= 4 && K >= 2) tie_ok &= idx[K] == 1 && idx[K + 1] == 2;   // 2 and 3 tie: 2 wins
    snprintf(name, sizeof(name), "topk_forward ties go to the lower expert index K=%d", K);
    check_true(name, tie_ok);
    free(x); free(p); free(lse); free(w); free(idx); free(pd); free(lsed); free(wd);
}

// naive dispatch: returns 1 when the op's plan matches
static int dispatch_matches(const int *counts, const int *off, const int *row_token, const int *arow, const float *p,
                            const int *idx, int N, int E, int K, int cap) {
    int ok = 1, row = 0;
    for (int e = 0; e < E; e++) {
        int c = 0;
        for (int a = 0; a < N * K; a++) c += idx[a] == e;
        ok &= counts[e] == c;
        ok &= off[e] == row;
        for (int t = 0; t < N; t++) {
            for (int k = 0; k < K; k++) {
                int a = t * K + k;
                if (idx[a] != e) continue;
                // kept iff fewer than cap assignments of e rank above it (higher prob, or equal and earlier)
                int above = 0;
                for (int t2 = 0; t2 < N; t2++)
                    for (int k2 = 0; k2 < K; k2++) {
                        if (idx[t2 * K + k2] != e || t2 == t) continue;
                        float q = p[(size_t)t2 * E + e], me = p[(size_t)t * E + e];
                        above += q > me || (q == me && t2 < t);
                    }
                int kept = cap <= 0 || above < cap;
                if (kept) {
                    ok &= arow[a] == row && row_token[row] == t;
                    row++;
                } else {
                    ok &= arow[a] == -1;
                }
            }
        }
    }
    ok &= off[E] == row;
    for (int r = row; r < N * K; r++) ok &= row_token[r] == -1;
    return ok;
}

static void run_dispatch(const char *what, const float *p, const int *idx, int N, int E, int K, int cap,
                         int *counts, int *off, int *row_token, int *arow) {
    char name[160];
    be->moe_dispatch(counts, off, row_token, arow, p, idx, N, E, K, cap);
    snprintf(name, sizeof(name), "dispatch %s N=%d E=%d K=%d cap=%d", what, N, E, K, cap);
    check_true(name, dispatch_matches(counts, off, row_token, arow, p, idx, N, E, K, cap));
}

static void test_dispatch(void) {
    int N = 41, E = 6, K = 2;
    float *x = frand((size_t)N * E, -2, 2), *p = xalloc((size_t)N * E * 4), *lse = xalloc((size_t)N * 4), *w = xalloc((size_t)N * K * 4);
    int *idx = xalloc((size_t)N * K * 4), *counts = xalloc((size_t)E * 4), *off = xalloc((size_t)(E + 1) * 4);
    int *row_token = xalloc((size_t)N * K * 4), *arow = xalloc((size_t)N * K * 4);
    be->moe_topk_forward(p, lse, idx, w, x, N, E, K, 0);
    run_dispatch("random, no capacity", p, idx, N, E, K, 0, counts, off, row_token, arow);
    run_dispatch("random, capacity 14", p, idx, N, E, K, 14, counts, off, row_token, arow);
    run_dispatch("random, capacity 1", p, idx, N, E, K, 1, counts, off, row_token, arow);
    // all tokens to expert 0 (top-1), experts 1..E-1 receive nothing; every probability tied,
    // so the capacity keeps the earliest tokens
    int K1 = 1;
    for (int t = 0; t < N; t++) {
        idx[t] = 0;
        for (int e = 0; e < E; e++) p[(size_t)t * E + e] = 1.0f / (float)E;
    }
    run_dispatch("all to expert 0, no capacity", p, idx, N, E, K1, 0, counts, off, row_token, arow);
    int empty_ok = counts[0] == N && off[E] == N;
    for (int e = 1; e < E; e++) empty_ok &= counts[e] == 0 && off[e] == N;
    check_true("dispatch: all to one expert, the others have empty row ranges", empty_ok);
    run_dispatch("all to expert 0, ties, capacity 10", p, idx, N, E, K1, 10, counts, off, row_token, arow);
    int early_ok = off[1] == 10;
    for (int t = 0; t < N; t++) early_ok &= (t < 10) ? arow[t] == t : arow[t] == -1;
    check_true("dispatch: capacity ties keep the earlier tokens", early_ok);
    free(x); free(p); free(lse); free(w); free(idx); free(counts); free(off); free(row_token); free(arow);

    // large enough for the op's threaded capacity path (N*K >= 2^14)
    N = 4201, E = 8, K = 4;
    x = frand((size_t)N * E, -2, 2);
    p = xalloc((size_t)N * E * 4); lse = xalloc((size_t)N * 4); w = xalloc((size_t)N * K * 4);
    idx = xalloc((size_t)N * K * 4); counts = xalloc((size_t)E * 4); off = xalloc((size_t)(E + 1) * 4);
    row_token = xalloc((size_t)N * K * 4); arow = xalloc((size_t)N * K * 4);
    be->moe_topk_forward(p, lse, idx, w, x, N, E, K, 0);
    run_dispatch("large, capacity", p, idx, N, E, K, 2000, counts, off, row_token, arow);
    free(x); free(p); free(lse); free(w); free(idx); free(counts); free(off); free(row_token); free(arow);
}

static void test_aux_and_router_backward(int N, int E, int K, int norm, int cap) {
    char name[160];
    float *x = frand((size_t)N * E, -2, 2), *p = xalloc((size_t)N * E * 4), *lse = xalloc((size_t)N * 4), *w = xalloc((size_t)N * K * 4);
    int *idx = xalloc((size_t)N * K * 4), *counts = xalloc((size_t)E * 4), *off = xalloc((size_t)(E + 1) * 4);
    int *row_token = xalloc((size_t)N * K * 4), *arow = xalloc((size_t)N * K * 4);
    be->moe_topk_forward(p, lse, idx, w, x, N, E, K, norm);
    be->moe_dispatch(counts, off, row_token, arow, p, idx, N, E, K, cap);
    const double a = 0.37, zc = 0.11;
    float out[2];
    be->moe_aux_forward(out, p, lse, counts, N, E, K, (float)a, (float)zc);
    double P_e, fp = 0, zs = 0;
    for (int e = 0; e < E; e++) {
        P_e = 0;
        for (int t = 0; t < N; t++) {
            double pd[64], l;
            softmax_d(pd, &l, x + (size_t)t * E, E);
            P_e += pd[e] / N;
            if (e == 0) zs += l * l / N;
        }
        fp += (double)counts[e] / ((double)N * K) * P_e;
    }
    double ref[2] = {a * E * fp, zc * zs};
    snprintf(name, sizeof(name), "aux_forward (aux, z) N=%d E=%d K=%d cap=%d", N, E, K, cap);
    check(name, rel(out, ref, 2), TOL_FWD);

    // backward: dtopk_w = g (0 where dropped, as the combine backward leaves it)
    float *g = frand((size_t)N * K, -1, 1);
    for (int i = 0; i < N * K; i++) if (arow[i] < 0) g[i] = 0.0f;
    float *dl = xalloc((size_t)N * E * 4);
    be->moe_router_softmax_backward(dl, g, p, lse, idx, w, counts, N, E, K, norm, (float)a, (float)zc);
    double *xd = xalloc((size_t)N * E * 8), *fd = xalloc((size_t)N * E * 8);
    for (size_t i = 0; i < (size_t)N * E; i++) xd[i] = x[i];
    const double h = 1e-5;
    for (size_t i = 0; i < (size_t)N * E; i++) {
        double s = xd[i];
        xd[i] = s + h;
        double up = router_objective(xd, idx, counts, g, N, E, K, norm, a, zc);
        xd[i] = s - h;
        double dn = router_objective(xd, idx, counts, g, N, E, K, norm, a, zc);
        xd[i] = s;
        fd[i] = (up - dn) / (2 * h);
    }
    snprintf(name, sizeof(name), "router_softmax_backward vs FD N=%d E=%d K=%d norm=%d cap=%d", N, E, K, norm, cap);
    check(name, rel(dl, fd, (size_t)N * E), TOL_BWD);
    float *dl2 = xalloc((size_t)N * E * 4);
    memcpy(dl2, dl, (size_t)N * E * 4);
    be->moe_router_softmax_backward(dl2, g, p, lse, idx, w, counts, N, E, K, norm, (float)a, (float)zc);
    for (size_t i = 0; i < (size_t)N * E; i++) fd[i] = 2.0 * dl[i];
    snprintf(name, sizeof(name), "router_softmax_backward accumulates N=%d E=%d K=%d", N, E, K);
    check(name, rel(dl2, fd, (size_t)N * E), TOL_ACC);
    free(x); free(p); free(lse); free(w); free(idx); free(counts); free(off); free(row_token); free(arow);
    free(g); free(dl); free(dl2); free(xd); free(fd);
}

// gather / combine forward and backward against naive loops and finite differences
static void test_gather_combine(int N, int E, int K, int C, int cap) {
    char name[160];
    float *x = frand((size_t)N * E, -2, 2), *p = xalloc((size_t)N * E * 4), *lse = xalloc((size_t)N * 4), *w = xalloc((size_t)N * K * 4);
    int *idx = xalloc((size_t)N * K * 4), *counts = xalloc((size_t)E * 4), *off = xalloc((size_t)(E + 1) * 4);
    int *row_token = xalloc((size_t)N * K * 4), *arow = xalloc((size_t)N * K * 4);
    be->moe_topk_forward(p, lse, idx, w, x, N, E, K, 0);
    be->moe_dispatch(counts, off, row_token, arow, p, idx, N, E, K, cap);
    int R = off[E];
    // all N*K rows, as model/moe.c gathers: the rows past R (row_token -1) come out zero
    float *inp = frand((size_t)N * C, -1, 1), *xs = frand((size_t)N * K * C, -1, 1);
    be->moe_gather_forward(xs, inp, row_token, N * K, C);
    double *ref = xalloc((size_t)N * K * C * 8);
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) ref[(size_t)r * C + c] = inp[(size_t)row_token[r] * C + c];
    snprintf(name, sizeof(name), "gather_forward N=%d K=%d C=%d R=%d (zeros past R)", N, K, C, R);
    check(name, rel(xs, ref, (size_t)N * K * C), 0.0);
    // gather backward: d/dinp of sum(gw * xs) = sum over rows of the token
    float *gw = frand((size_t)N * K * C, -1, 1), *dinp = xalloc((size_t)N * C * 4);
    be->moe_gather_backward(dinp, gw, arow, N, K, C);
    double *dref = xalloc((size_t)N * C * 8);
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) dref[(size_t)row_token[r] * C + c] += gw[(size_t)r * C + c];
    snprintf(name, sizeof(name), "gather_backward N=%d K=%d C=%d", N, K, C);
    check(name, rel(dinp, dref, (size_t)N * C), TOL_FWD);
    be->moe_gather_backward(dinp, gw, arow, N, K, C);
    for (size_t i = 0; i < (size_t)N * C; i++) dref[i] *= 2;
    snprintf(name, sizeof(name), "gather_backward accumulates N=%d K=%d C=%d", N, K, C);
    check(name, rel(dinp, dref, (size_t)N * C), TOL_ACC);

    // combine forward: out += sum_k w * eo[row]
    float *eo = frand((size_t)N * K * C, -1, 1), *out = frand((size_t)N * C, -1, 1);
    double *oref = xalloc((size_t)N * C * 8);
    for (size_t i = 0; i < (size_t)N * C; i++) oref[i] = out[i];
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            int r = arow[t * K + k];
            if (r < 0) continue;
            for (int c = 0; c < C; c++) oref[(size_t)t * C + c] += (double)w[t * K + k] * eo[(size_t)r * C + c];
        }
    be->moe_combine_forward(out, eo, w, arow, N, K, C);
    snprintf(name, sizeof(name), "combine_forward (accumulating) N=%d K=%d C=%d cap=%d", N, K, C, cap);
    check(name, rel(out, oref, (size_t)N * C), TOL_FWD);
    // combine backward vs finite differences of L = sum(g * combine(eo, w)) in double
    float *g = frand((size_t)N * C, -1, 1), *deo = xalloc((size_t)N * K * C * 4), *dw = xalloc((size_t)N * K * 4);
    be->moe_combine_backward(deo, dw, g, eo, w, arow, N, K, C);
    double *fd_eo = xalloc((size_t)N * K * C * 8), *fd_w = xalloc((size_t)N * K * 8);
    // L is bilinear: dL/d eo[r, c] = w[t,k] g[t,c] ; dL/d w[t,k] = sum_c g[t,c] eo[r,c]; FD in double
    const double h = 1e-3;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            int r = arow[t * K + k];
            if (r < 0) continue;
            double up = 0, dn = 0;
            for (int c = 0; c < C; c++) {
                up += g[(size_t)t * C + c] * ((double)w[t * K + k] + h) * eo[(size_t)r * C + c];
                dn += g[(size_t)t * C + c] * ((double)w[t * K + k] - h) * eo[(size_t)r * C + c];
            }
            fd_w[t * K + k] = (up - dn) / (2 * h);
            for (int c = 0; c < C; c++) {
                double e0 = eo[(size_t)r * C + c];
                fd_eo[(size_t)r * C + c] = (g[(size_t)t * C + c] * w[t * K + k] * (e0 + h) -
                                            g[(size_t)t * C + c] * w[t * K + k] * (e0 - h)) / (2 * h);
            }
        }
    snprintf(name, sizeof(name), "combine_backward d(expert_out) vs FD N=%d K=%d C=%d", N, K, C);
    check(name, rel(deo, fd_eo, (size_t)N * K * C), TOL_BWD);
    snprintf(name, sizeof(name), "combine_backward d(weights) vs FD, 0 when dropped N=%d K=%d", N, K);
    check(name, rel(dw, fd_w, (size_t)N * K), TOL_BWD);
    be->moe_combine_backward(deo, dw, g, eo, w, arow, N, K, C);
    for (size_t i = 0; i < (size_t)N * K; i++) fd_w[i] *= 2;
    snprintf(name, sizeof(name), "combine_backward accumulates N=%d K=%d", N, K);
    check(name, rel(dw, fd_w, (size_t)N * K), TOL_ACC);
    free(x); free(p); free(lse); free(w); free(idx); free(counts); free(off); free(row_token); free(arow);
    free(inp); free(xs); free(ref); free(gw); free(dinp); free(dref); free(eo); free(out); free(oref);
    free(g); free(deo); free(dw); free(fd_eo); free(fd_w);
}

static void test_router_matmul(int N, int C, int E) {
    float *x = frand((size_t)N * C, -1, 1), *wt = frand((size_t)E * C, -1, 1), *lg = xalloc((size_t)N * E * 4);
    be->moe_router_forward(lg, x, wt, N, C, E);
    double *ref = xalloc((size_t)N * E * 8);
    for (int t = 0; t < N; t++) for (int e = 0; e < E; e++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)x[(size_t)t * C + c] * wt[(size_t)e * C + c];
        ref[(size_t)t * E + e] = s;
    }
    check("router_forward (fp32 logits)", rel(lg, ref, (size_t)N * E), TOL_FWD);
    float *dl = frand((size_t)N * E, -1, 1), *dx = xalloc((size_t)N * C * 4), *dw = xalloc((size_t)E * C * 4);
    be->moe_router_backward(dx, dw, dl, x, wt, N, C, E);
    double *rdx = xalloc((size_t)N * C * 8), *rdw = xalloc((size_t)E * C * 8);
    for (int t = 0; t < N; t++) for (int e = 0; e < E; e++) for (int c = 0; c < C; c++) {
        rdx[(size_t)t * C + c] += (double)dl[(size_t)t * E + e] * wt[(size_t)e * C + c];
        rdw[(size_t)e * C + c] += (double)dl[(size_t)t * E + e] * x[(size_t)t * C + c];
    }
    check("router_backward dinp", rel(dx, rdx, (size_t)N * C), TOL_FWD);
    check("router_backward dweight", rel(dw, rdw, (size_t)E * C), TOL_FWD);
    free(x); free(wt); free(lg); free(ref); free(dl); free(dx); free(dw); free(rdx); free(rdw);
}

// grouped expert matmul against per-expert double loops; expert row counts include 0 and one
// expert far above the row block (several tiles), C and OC not multiples of the channel block;
// the row buffers TAIL rows longer than the kept rows (dropped assignments): the forward zeroes
// them, the backward leaves dinp's alone
static void test_expert_matmul(void) {
    enum { E = 5, C = 23, OC = 131, TAIL = 7 };
    const int n_e[E] = {3, 0, 300, 1, 70};
    int off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + n_e[e];
    int R = off[E], RB = R + TAIL;
    float *inp = frand((size_t)RB * C, -1, 1), *out = frand((size_t)RB * OC, -1, 1), *w[E], *dw[E];
    for (int e = 0; e < E; e++) { w[e] = frand((size_t)OC * C, -1, 1); dw[e] = xalloc((size_t)OC * C * 4); }
    be->moe_expert_matmul_forward(out, inp, (const float *const *)w, off, E, RB, C, OC);
    int tail_zero = 1;
    for (size_t i = (size_t)R * OC; i < (size_t)RB * OC; i++) tail_zero &= out[i] == 0.0f;
    check("expert_matmul_forward zeroes the rows past the kept ones", tail_zero ? 0.0 : 1.0, 0.0);
    double *ref = xalloc((size_t)R * OC * 8);
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int o = 0; o < OC; o++) {
                double s = 0;
                for (int c = 0; c < C; c++) s += (double)inp[(size_t)r * C + c] * w[e][(size_t)o * C + c];
                ref[(size_t)r * OC + o] = s;
            }
    check("expert_matmul_forward (empty expert, multi-tile expert)", rel(out, ref, (size_t)R * OC), TOL_FWD);
    float *dout = frand((size_t)RB * OC, -1, 1), *dinp = xalloc((size_t)RB * C * 4);
    for (size_t i = (size_t)R * C; i < (size_t)RB * C; i++) dinp[i] = 5.0f;
    be->moe_expert_matmul_backward(dinp, dw, dout, inp, (const float *const *)w, off, E, RB, C, OC);
    int tail_kept = 1;
    for (size_t i = (size_t)R * C; i < (size_t)RB * C; i++) tail_kept &= dinp[i] == 5.0f;
    check("expert_matmul_backward leaves dinp's rows past the kept ones", tail_kept ? 0.0 : 1.0, 0.0);
    double *rdi = xalloc((size_t)R * C * 8);
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int o = 0; o < OC; o++) s += (double)dout[(size_t)r * OC + o] * w[e][(size_t)o * C + c];
                rdi[(size_t)r * C + c] = s;
            }
    check("expert_matmul_backward dinp", rel(dinp, rdi, (size_t)R * C), TOL_FWD);
    double worst = 0;
    for (int e = 0; e < E; e++) {
        double *rdw = xalloc((size_t)OC * C * 8);
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int o = 0; o < OC; o++)
                for (int c = 0; c < C; c++) rdw[(size_t)o * C + c] += (double)dout[(size_t)r * OC + o] * inp[(size_t)r * C + c];
        double er = rel(dw[e], rdw, (size_t)OC * C);
        worst = er > worst ? er : worst;
        free(rdw);
    }
    check("expert_matmul_backward dweight (0 for the empty expert)", worst, TOL_FWD);
    be->moe_expert_matmul_backward(dinp, dw, dout, inp, (const float *const *)w, off, E, RB, C, OC);
    for (size_t i = 0; i < (size_t)R * C; i++) rdi[i] *= 2;
    check("expert_matmul_backward accumulates", rel(dinp, rdi, (size_t)R * C), TOL_ACC);
    for (int e = 0; e < E; e++) { free(w[e]); free(dw[e]); }
    free(inp); free(out); free(ref); free(dout); free(dinp); free(rdi);
}

// The grouped expert matmuls cut their rows and channels into tiles by the thread count
// (layers/cpu_moe.c): the bits must be those of one thread. Expert row counts leave short last
// tiles at every thread count (1030 rows cut in 64s leaves 6), one expert whole under OpenBLAS's
// small-matrix bound (7 rows), and an empty one.
static void test_expert_matmul_threads(void) {
    enum { E = 6, C = 256, OC = 512 };
    const int n_e[E] = {260, 7, 515, 1030, 0, 33};
    int off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + n_e[e];
    const int R = off[E];
    float *inp = frand((size_t)R * C, -1, 1), *dout = frand((size_t)R * OC, -1, 1), *w[E];
    for (int e = 0; e < E; e++) w[e] = frand((size_t)OC * C, -1, 1);
    const int threads[] = {1, 2, 3, 5};
    float *out[4], *dinp[4], *dw[4][E];
    const int nt = omp_get_max_threads();
    int same = 1;
    for (int i = 0; i < 4; i++) {
        omp_set_num_threads(threads[i]);
        out[i] = xalloc((size_t)R * OC * 4);
        dinp[i] = xalloc((size_t)R * C * 4);
        memset(dinp[i], 0, (size_t)R * C * 4);
        for (int e = 0; e < E; e++) { dw[i][e] = xalloc((size_t)OC * C * 4); memset(dw[i][e], 0, (size_t)OC * C * 4); }
        be->moe_expert_matmul_forward(out[i], inp, (const float *const *)w, off, E, R, C, OC);
        be->moe_expert_matmul_backward(dinp[i], dw[i], dout, inp, (const float *const *)w, off, E, R, C, OC);
        if (i == 0) continue;
        same &= memcmp(out[i], out[0], (size_t)R * OC * 4) == 0 && memcmp(dinp[i], dinp[0], (size_t)R * C * 4) == 0;
        for (int e = 0; e < E; e++) same &= memcmp(dw[i][e], dw[0][e], (size_t)OC * C * 4) == 0;
    }
    omp_set_num_threads(nt);
    check_true("expert_matmul out, dinp, dweight bitwise equal at 1, 2, 3 and 5 threads", same);
    for (int i = 0; i < 4; i++) {
        free(out[i]); free(dinp[i]);
        for (int e = 0; e < E; e++) free(dw[i][e]);
    }
    for (int e = 0; e < E; e++) free(w[e]);
    free(inp); free(dout);
}

int main(void) {
    be = backend_cpu();
    if (!be->moe_topk_forward || !be->moe_dispatch || !be->moe_combine_forward) {
        printf("FAIL: the CPU backend lacks the MoE ops\n");
        return 1;
    }
    test_topk(29, 7, 1, 0);
    test_topk(29, 7, 2, 0);
    test_topk(29, 7, 2, 1);
    test_topk(13, 16, 3, 1);
    test_dispatch();
    test_aux_and_router_backward(23, 5, 1, 0, 0);
    test_aux_and_router_backward(23, 5, 1, 0, 4);
    test_aux_and_router_backward(23, 5, 2, 1, 7);
    test_aux_and_router_backward(23, 5, 2, 0, 0);
    test_gather_combine(37, 5, 1, 19, 0);
    test_gather_combine(37, 5, 2, 19, 9);
    test_gather_combine(37, 5, 2, 19, 1);
    test_router_matmul(21, 17, 6);
    test_expert_matmul();
    test_expert_matmul_threads();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
