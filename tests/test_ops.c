// Op tests for the CPU reference backend (layers/), through the Backend table.
//
// Every forward is compared with a naive double-precision loop written here, independently
// of layers/. Every backward is compared with central finite differences of that double
// forward: for a random linear functional L = sum(w * out), dL/dinput is computed
// numerically in double and must match the op's backward run with dout = w. The double
// forwards are evaluated at exactly the fp32 inputs the op saw, so the only differences
// are the op's fp32 rounding (~1e-6) and the finite-difference error (~1e-9).
//
// Sizes are deliberately odd (no multiples of 8 or 32) so that remainder paths run, and
// larger than the ops' internal blocks (attention tiles: 128, dweight channel blocks) where
// that matters. Backward ops must ACCUMULATE: each is run twice and must give 2x.
//
// Output: one line per check, then "N passed, M failed"; exit status 1 if anything failed.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/vec.h"
#include "layers/cpu_ops.h"
#include "backend/bf16.h"

static const Backend *be;
static int n_passed, n_failed;

// Forwards (fp32 op vs double loop): fp32 rounding through short reductions is ~1e-6.
#define TOL_FWD 1e-4
// Backwards vs finite differences: fp32 rounding of the op (~1e-6) plus the FD error of a
// double central difference with h ~ 1e-6 (~1e-9); 1e-3 leaves a wide margin while any
// wrong or missing term is O(1e-2..1) in this norm.
#define TOL_BWD 1e-3
// Second call of a backward vs twice the first: only the fp32 rounding of the add.
#define TOL_ACC 1e-5

static void check(const char *name, double err, double tol) {
    const int ok = err <= tol;   // NaN fails
    if (ok) {
        n_passed++;
        printf("ok   %-52s maxrel=%.1e\n", name, err);
    } else {
        n_failed++;
        printf("FAIL %-52s maxrel=%.1e (tolerance %.0e)\n", name, err, tol);
    }
}

// ---------------------------------------------------------------- helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

// splitmix64: tiny, good enough for test data, and fixed across platforms.
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// uniform in [lo, hi)
static double rng_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(rng_next() >> 11) * (1.0 / 9007199254740992.0));
}

static int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

static void *xalloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) { fprintf(stderr, "test_ops: out of memory\n"); exit(1); }
    return p;
}

static float *falloc(size_t n) { return xalloc(n * sizeof(float)); }
static double *dalloc(size_t n) { return xalloc(n * sizeof(double)); }

static float *frand(size_t n, double lo, double hi) {
    float *a = falloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (float)rng_uniform(lo, hi);
    return a;
}

static double *to_double(const float *a, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i];
    return d;
}

static float *fcopy(const float *a, size_t n) {
    float *c = falloc(n);
    memcpy(c, a, n * sizeof(float));
    return c;
}

// Relative error in max-norm: max|a - ref| / max|ref| (absolute when ref is all zero).
static double maxrel(const float *a, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - ref[i]);
        if (!(e <= num)) num = e;   // also propagates NaN
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    }
    return den > 0.0 ? num / den : num;
}

// The second backward call must have doubled the first call's gradient.
static double maxrel_2x(const float *second, const float *first, size_t n) {
    double *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = 2.0 * first[i];
    const double e = maxrel(second, ref, n);
    free(ref);
    return e;
}

static double maxabs(const float *a, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) if (!(fabs(a[i]) <= m)) m = fabs(a[i]);
    return m;
}

// ---------------------------------------------------------------- finite differences

// A double-precision forward with its inputs in in[], writing nout outputs to out; the loss
// is L = sum(w * out). dims/par/ints carry the op's shape and parameters.
typedef struct FdProblem {
    void (*forward)(struct FdProblem *pb);
    double *in[4];
    double *out;
    const double *w;
    size_t nout;
    const int *ints;
    int dims[10];
    double par[2];
} FdProblem;

static double fd_loss(FdProblem *pb) {
    pb->forward(pb);
    double L = 0.0;
    for (size_t i = 0; i < pb->nout; i++) L += pb->w[i] * pb->out[i];
    return L;
}

// grad[i] = dL/d in[which][i] by central differences, h relative to the input's size.
static double *fd_grad(FdProblem *pb, int which, size_t n) {
    double *grad = dalloc(n);
    double *x = pb->in[which];
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        const double h = 1e-6 * (fabs(x0) > 1.0 ? fabs(x0) : 1.0);
        const double xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        const double lp = fd_loss(pb);
        x[i] = xm;
        const double lm = fd_loss(pb);
        x[i] = x0;
        grad[i] = (lp - lm) / (xp - xm);
    }
    return grad;
}

// ---------------------------------------------------------------- double references

// out (N, OC) = inp (N, C) @ w (OC, C)^T
static void ref_matmul(double *out, const double *inp, const double *w, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s;
        }
}

static void ref_embedding(double *out, const int *tok, const double *wte, int N, int C) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = wte[(size_t)tok[n] * C + c];
}

static void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w, int N, int C,
                        double eps) {
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += inp[(size_t)n * C + c] * inp[(size_t)n * C + c];
        const double r = 1.0 / sqrt(ss / C + eps);
        if (rstd) rstd[n] = r;
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = inp[(size_t)n * C + c] * r * w[c];
    }
}

// in place on x (B, T, H, S), dims [off, off + D) of each head, HF rotate-half.
static void ref_rope(double *x, int B, int T, int H, int S, int off, int D, int pos0, double theta) {
    const int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double *p = x + (((size_t)b * T + t) * H + h) * S + off;
                for (int i = 0; i < half; i++) {
                    const double a = (pos0 + t) * pow(theta, -2.0 * i / D);
                    const double x0 = p[i], x1 = p[i + half];
                    p[i] = x0 * cos(a) - x1 * sin(a);
                    p[i + half] = x1 * cos(a) + x0 * sin(a);
                }
            }
}

// Causal grouped attention; lse (B, NH, T: the log-sum-exp of each score row) may be NULL.
static void ref_attention(double *out, double *lse, const double *q, const double *k, const double *v,
                          int B, int T, int NH, int NKV, int DQK, int DV, double scale) {
    double *sc = dalloc((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            for (int t = 0; t < T; t++) {
                const double *qt = q + (((size_t)b * T + t) * NH + h) * DQK;
                double m = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *ks = k + (((size_t)b * T + s) * NKV + kvh) * DQK;
                    double d = 0.0;
                    for (int i = 0; i < DQK; i++) d += qt[i] * ks[i];
                    sc[s] = scale * d;
                    if (sc[s] > m) m = sc[s];
                }
                double z = 0.0;
                for (int s = 0; s <= t; s++) { sc[s] = exp(sc[s] - m); z += sc[s]; }
                for (int s = 0; s <= t; s++) sc[s] /= z;
                if (lse) lse[((size_t)b * NH + h) * T + t] = m + log(z);
                double *ot = out + (((size_t)b * T + t) * NH + h) * DV;
                for (int i = 0; i < DV; i++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++) acc += sc[s] * v[(((size_t)b * T + s) * NKV + kvh) * DV + i];
                    ot[i] = acc;
                }
            }
        }
    free(sc);
}

static void ref_swiglu(double *out, const double *g, const double *u, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
}

static void ref_xent(double *loss, const double *logits, const int *tgt, int N, int V, int ignore) {
    for (int n = 0; n < N; n++) {
        const double *l = logits + (size_t)n * V;
        if (tgt[n] == ignore) { loss[n] = 0.0; continue; }
        double m = -INFINITY;
        for (int i = 0; i < V; i++) if (l[i] > m) m = l[i];
        double z = 0.0;
        for (int i = 0; i < V; i++) z += exp(l[i] - m);
        loss[n] = log(z) + m - l[tgt[n]];
    }
}

// FdProblem adapters
static void fd_matmul(FdProblem *pb) {
    ref_matmul(pb->out, pb->in[0], pb->in[1], pb->dims[0], pb->dims[1], pb->dims[2]);
}
static void fd_embedding(FdProblem *pb) {
    ref_embedding(pb->out, pb->ints, pb->in[0], pb->dims[0], pb->dims[1]);
}
static void fd_rmsnorm(FdProblem *pb) {
    ref_rmsnorm(pb->out, NULL, pb->in[0], pb->in[1], pb->dims[0], pb->dims[1], pb->par[0]);
}
static void fd_rope(FdProblem *pb) {
    memcpy(pb->out, pb->in[0], pb->nout * sizeof(double));
    const int *d = pb->dims;
    ref_rope(pb->out, d[0], d[1], d[2], d[3], d[4], d[5], d[6], pb->par[0]);
}
static void fd_attention(FdProblem *pb) {
    const int *d = pb->dims;
    ref_attention(pb->out, NULL, pb->in[0], pb->in[1], pb->in[2], d[0], d[1], d[2], d[3], d[4], d[5],
                  pb->par[0]);
}
static void fd_xent(FdProblem *pb) {
    ref_xent(pb->out, pb->in[0], pb->ints, pb->dims[0], pb->dims[1], pb->dims[2]);
}

// ---------------------------------------------------------------- tests

static void test_memory(void) {
    char name[96];
    snprintf(name, sizeof name, "backend name=%s act_bytes=%zu", be->name, be->act_bytes);
    check(name, be->act_bytes == 4 ? 0.0 : 1.0, 0.0);

    const size_t n = 1003;
    float *dev = be->alloc(n * sizeof(float));
    check("alloc zeroed", maxabs(dev, n), 0.0);
    float *host = frand(n, -1, 1), *back = falloc(n);
    double *host_d = to_double(host, n);
    be->upload(dev, host, n * sizeof(float));
    be->download(back, dev, n * sizeof(float));
    check("upload/download roundtrip", maxrel(back, host_d, n), 0.0);
    float *dev2 = be->alloc(n * sizeof(float));
    be->copy(dev2, dev, n * sizeof(float));
    check("copy", maxrel(dev2, host_d, n), 0.0);
    be->release(dev2);
    be->zero(dev, n * sizeof(float));
    check("zero", maxabs(dev, n), 0.0);
    be->store_weights(dev, host, n, 1234);
    be->download(back, dev, n * sizeof(float));
    check("store_weights", maxrel(back, host_d, n), 0.0);
    be->zero(dev, n * sizeof(float));
    be->act_from_host(dev, host, n);
    memset(back, 0, n * sizeof(float));
    be->act_to_host(back, dev, n);
    check("act_from_host/act_to_host roundtrip", maxrel(back, host_d, n), 0.0);
    be->release(dev);
    // an allocation of 2 MiB or more is its own mapping, on a 2 MiB boundary for huge pages
    // (layers/cpu_memory.c): zero, writable to its last byte, released; again after a release,
    // when the same memory may come back
    for (int round = 0; round < 2; round++) {
        const size_t big = ((size_t)2 << 20) + 4093 * sizeof(float), nb = big / sizeof(float);
        float *b = be->alloc(big);
        check("big alloc zeroed", maxabs(b, nb), 0.0);
        check("big alloc on a 2 MiB boundary", (double)((uintptr_t)b % ((uintptr_t)2 << 20)), 0.0);
        for (size_t i = 0; i < nb; i++) b[i] = (float)i;
        check("big alloc written to its end", (double)b[nb - 1] - (double)(nb - 1), 0.0);
        be->release(b);
    }
    free(host); free(back); free(host_d);
}

static void test_elementwise(size_t n) {
    char name[96];
    float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *out = falloc(n);
    double *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + (double)b[i];
    be->add_forward(out, a, b, n);
    snprintf(name, sizeof name, "add_forward n=%zu", n);
    check(name, maxrel(out, ref, n), TOL_FWD);
    // in place, as the residual stream uses it
    float *acopy = fcopy(a, n);
    be->add_forward(acopy, acopy, b, n);
    snprintf(name, sizeof name, "add_forward in place n=%zu", n);
    check(name, maxrel(acopy, ref, n), TOL_FWD);
    be->accumulate(a, b, n);
    snprintf(name, sizeof name, "accumulate n=%zu", n);
    check(name, maxrel(a, ref, n), TOL_FWD);
    free(a); free(b); free(out); free(ref); free(acopy);
}

// vec_exp (common/vec.h, decoding's softmax) against exp in double: relative error within
// 2 ulp over the range it serves, exact 0 below -87.34 (and for -inf), NaN kept.
static void test_vec_exp(void) {
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        vecf y = vec_exp(vec_splat(x));
        double ref = exp((double)x), rel = fabs((double)y[i % VEC_LANES] - ref) / ref;
        worst = rel > worst ? rel : worst;
    }
    check("vec_exp on [-87, 88]: relative error (2 ulp = 1.2e-7)", worst, 1.2e-7);
    vecf z = vec_exp((vecf){-88.0f, -1000.0f, -INFINITY, NAN, 0.0f, 1.0f, -1.0f, 88.0f});
    double bad = (z[0] != 0.0f) + (z[1] != 0.0f) + (z[2] != 0.0f) + !isnan(z[3]) + (z[4] != 1.0f) +
                 (fabs(z[5] - M_E) > 3e-7) + (fabs(z[6] - 1.0 / M_E) > 1e-7) + !isfinite(z[7]);
    check("vec_exp: 0 below -87.34 and at -inf, NaN kept, e^0 = 1, e^88 finite", bad, 0.0);
}

// vec_int4_to_f32 (common/vec.h, the int_group codec's 4-bit decode) against the scalar
// form, every byte value in every position of a 16-code step and in the scalar tail: bitwise.
static void test_vec_int4(void) {
    enum { N = 512 + 6 };   // 32 whole steps, then 6 codes of tail
    uint8_t codes[N / 2];
    float got[N], want[N];
    const float scale = 0.0371337890625f;   // a bf16 value, as the codec's scales are
    double bad = 0;
    for (int rot = 0; rot < 8; rot++) {
        for (int i = 0; i < N / 2; i++) codes[i] = (uint8_t)(i * 37 + rot * 11);
        vec_int4_to_f32(got, codes, N, scale);
        for (int j = 0; j < N; j += 2) {
            want[j] = (float)((int8_t)(uint8_t)(codes[j / 2] << 4) >> 4) * scale;
            want[j + 1] = (float)((int8_t)codes[j / 2] >> 4) * scale;
        }
        bad += memcmp(got, want, sizeof got) != 0;
    }
    check("vec_int4_to_f32: every byte, vector steps and tail, equal to the scalar form bitwise", bad, 0.0);
}

// Decoding batches sequences: a row's output must not depend on the rows beside it (the
// few-row kernels compute a dot the same way in every register tile, layers/cpu_matmul.c).
static void test_matmul_rows_independent(int N, int C, int OC) {
    float *inp = frand((size_t)N * C, -1, 1), *w = frand((size_t)OC * C, -1, 1);
    float *all = falloc((size_t)N * OC), *one = falloc((size_t)OC);
    be->matmul_forward(all, inp, w, N, C, OC);
    double worst = 0;
    for (int n = 0; n < N; n++) {
        be->matmul_forward(one, inp + (size_t)n * C, w, 1, C, OC);
        for (int o = 0; o < OC; o++)
            if (one[o] != all[(size_t)n * OC + o]) worst = fmax(worst, fabs((double)one[o] - all[(size_t)n * OC + o]) + 1e-30);
    }
    char name[128];
    snprintf(name, sizeof name, "matmul_forward N=%d C=%d OC=%d: each row as alone (bitwise)", N, C, OC);
    check(name, worst, 0.0);
    free(inp); free(w); free(all); free(one);
}

// The dense matmuls cut their products into one part per thread (layers/cpu_matmul.c): the
// bits must be those of one thread. N, C, OC are chosen so that the parts are over OpenBLAS's
// small-matrix bound (CPU_SGEMM_SMALL_MNK), or the whole is over it and its parts under, or
// all are under (cutting those products into parts changed bits: its small kernels').
static void test_matmul_threads(int N, int C, int OC) {
    float *inp = frand((size_t)N * C, -1, 1), *w = frand((size_t)OC * C, -1, 1), *dout = frand((size_t)N * OC, -1, 1);
    float *out[2], *dinp[2], *dw[2];
    const int nt = omp_get_max_threads();
    for (int i = 0; i < 2; i++) {
        out[i] = falloc((size_t)N * OC); dinp[i] = falloc((size_t)N * C); dw[i] = falloc((size_t)OC * C);
        omp_set_num_threads(i ? nt : 1);
        be->matmul_forward(out[i], inp, w, N, C, OC);
        be->matmul_backward(dinp[i], dw[i], dout, inp, w, N, C, OC);
    }
    omp_set_num_threads(nt);
    char name[128];
    snprintf(name, sizeof name, "matmul N=%d C=%d OC=%d out, dinp, dweight bitwise equal, 1 vs %d threads", N, C, OC, nt);
    check(name, memcmp(out[0], out[1], (size_t)N * OC * sizeof(float)) == 0 &&
                memcmp(dinp[0], dinp[1], (size_t)N * C * sizeof(float)) == 0 &&
                memcmp(dw[0], dw[1], (size_t)OC * C * sizeof(float)) == 0 ? 0.0 : 1.0, 0.0);
    for (int i = 0; i < 2; i++) { free(out[i]); free(dinp[i]); free(dw[i]); }
    free(inp); free(w); free(dout);
}

static void test_matmul(int N, int C, int OC, int with_backward) {
    char name[128];
    float *inp = frand((size_t)N * C, -1, 1), *w = frand((size_t)OC * C, -1, 1);
    float *out = falloc((size_t)N * OC);
    double *inp_d = to_double(inp, (size_t)N * C), *w_d = to_double(w, (size_t)OC * C);
    double *ref = dalloc((size_t)N * OC);
    be->matmul_forward(out, inp, w, N, C, OC);
    ref_matmul(ref, inp_d, w_d, N, C, OC);
    snprintf(name, sizeof name, "matmul_forward N=%d C=%d OC=%d", N, C, OC);
    check(name, maxrel(out, ref, (size_t)N * OC), TOL_FWD);
    // the projection added to a residual (its backward: matmul_backward, the residual's identity)
    float *res = frand((size_t)N * OC, -1, 1), *out_res = falloc((size_t)N * OC);
    double *ref_res = dalloc((size_t)N * OC);
    for (size_t i = 0; i < (size_t)N * OC; i++) ref_res[i] = ref[i] + (double)res[i];
    be->matmul_residual_forward(out_res, res, inp, w, N, C, OC);
    snprintf(name, sizeof name, "matmul_residual_forward N=%d C=%d OC=%d", N, C, OC);
    check(name, maxrel(out_res, ref_res, (size_t)N * OC), TOL_FWD);
    free(res); free(out_res); free(ref_res);

    if (with_backward) {
        float *dout = frand((size_t)N * OC, -1, 1);
        double *dout_d = to_double(dout, (size_t)N * OC);
        FdProblem pb = {.forward = fd_matmul, .in = {inp_d, w_d}, .out = ref, .w = dout_d,
                        .nout = (size_t)N * OC, .dims = {N, C, OC}};
        double *g_inp = fd_grad(&pb, 0, (size_t)N * C), *g_w = fd_grad(&pb, 1, (size_t)OC * C);
        float *dinp = falloc((size_t)N * C), *dw = falloc((size_t)OC * C);
        be->matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
        snprintf(name, sizeof name, "matmul_backward dinp N=%d C=%d OC=%d", N, C, OC);
        check(name, maxrel(dinp, g_inp, (size_t)N * C), TOL_BWD);
        snprintf(name, sizeof name, "matmul_backward dweight N=%d C=%d OC=%d", N, C, OC);
        check(name, maxrel(dw, g_w, (size_t)OC * C), TOL_BWD);
        float *dinp1 = fcopy(dinp, (size_t)N * C), *dw1 = fcopy(dw, (size_t)OC * C);
        be->matmul_backward(dinp, dw, dout, inp, w, N, C, OC);
        check("matmul_backward dinp accumulates (2 calls = 2x)", maxrel_2x(dinp, dinp1, (size_t)N * C), TOL_ACC);
        check("matmul_backward dweight accumulates (2 calls = 2x)", maxrel_2x(dw, dw1, (size_t)OC * C), TOL_ACC);
        // NULL outputs are skipped; the other one is still right
        memset(dw, 0, (size_t)OC * C * sizeof(float));
        be->matmul_backward(NULL, dw, dout, inp, w, N, C, OC);
        check("matmul_backward dweight with dinp=NULL", maxrel(dw, g_w, (size_t)OC * C), TOL_BWD);
        memset(dinp, 0, (size_t)N * C * sizeof(float));
        be->matmul_backward(dinp, NULL, dout, inp, w, N, C, OC);
        check("matmul_backward dinp with dweight=NULL", maxrel(dinp, g_inp, (size_t)N * C), TOL_BWD);
        free(dout); free(dout_d); free(g_inp); free(g_w); free(dinp); free(dw); free(dinp1); free(dw1);
    }
    free(inp); free(w); free(out); free(inp_d); free(w_d); free(ref);
}

// copy_cols against the element loop of its contract (backend/backend.h): offsets inside wider
// rows, a width with a vector tail, both modes, the columns around the piece untouched
static void test_copy_cols(void) {
    enum { N = 70, DLD = 101, SLD = 83, DOFF = 9, SOFF = 30, W = 37 };
    float *src = frand((size_t)N * SLD, -1, 1), *dst = frand((size_t)N * DLD, -1, 1);
    for (int acc = 0; acc < 2; acc++) {
        float *want = fcopy(dst, (size_t)N * DLD), *got = fcopy(dst, (size_t)N * DLD);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < W; j++) {
                float *d = want + (size_t)n * DLD + DOFF + j;
                *d = acc ? *d + src[(size_t)n * SLD + SOFF + j] : src[(size_t)n * SLD + SOFF + j];
            }
        be->copy_cols(got, DLD, DOFF, src, SLD, SOFF, N, W, acc);
        check(acc ? "copy_cols accumulate (bitwise)" : "copy_cols (bitwise)",
              memcmp(got, want, (size_t)N * DLD * sizeof(float)) == 0 ? 0.0 : 1.0, 0.0);
        free(want); free(got);
    }
    free(src); free(dst);
}

static void test_embedding(void) {
    const int V = 11, C = 77, N = 19;   // C = 2 full 32-channel blocks + a remainder
    int *tok = xalloc(N * sizeof(int));
    for (int n = 0; n < N; n++) tok[n] = rng_int(V - 1);   // token V-1 unused: its row stays 0
    tok[4] = tok[9] = tok[17] = 3;                         // repeats must add up
    float *wte = frand((size_t)V * C, -1, 1), *out = falloc((size_t)N * C);
    double *wte_d = to_double(wte, (size_t)V * C), *ref = dalloc((size_t)N * C);
    be->embedding_forward(out, tok, wte, N, C);
    ref_embedding(ref, tok, wte_d, N, C);
    check("embedding_forward", maxrel(out, ref, (size_t)N * C), TOL_FWD);

    float *dout = frand((size_t)N * C, -1, 1);
    double *dout_d = to_double(dout, (size_t)N * C);
    FdProblem pb = {.forward = fd_embedding, .in = {wte_d}, .out = ref, .w = dout_d,
                    .nout = (size_t)N * C, .ints = tok, .dims = {N, C}};
    double *g = fd_grad(&pb, 0, (size_t)V * C);
    float *dwte = falloc((size_t)V * C);
    be->embedding_backward(dwte, dout, tok, N, C);
    check("embedding_backward dwte", maxrel(dwte, g, (size_t)V * C), TOL_BWD);
    float *first = fcopy(dwte, (size_t)V * C);
    be->embedding_backward(dwte, dout, tok, N, C);
    check("embedding_backward accumulates (2 calls = 2x)", maxrel_2x(dwte, first, (size_t)V * C), TOL_ACC);

    // same bits with one thread and with all of them
    const int nt = omp_get_max_threads();
    float *d1 = falloc((size_t)V * C), *dn = falloc((size_t)V * C);
    omp_set_num_threads(1);
    be->embedding_backward(d1, dout, tok, N, C);
    omp_set_num_threads(nt);
    be->embedding_backward(dn, dout, tok, N, C);
    check("embedding_backward bitwise equal, 1 vs all threads",
          memcmp(d1, dn, (size_t)V * C * sizeof(float)) == 0 ? 0.0 : 1.0, 0.0);
    free(tok); free(wte); free(out); free(wte_d); free(ref); free(dout); free(dout_d); free(g);
    free(dwte); free(first); free(d1); free(dn);
}

static void test_rmsnorm(int N, int C) {
    char name[128];
    const float eps = 1e-5f;
    float *inp = frand((size_t)N * C, -1, 1), *w = frand((size_t)C, 0.5, 1.5);
    float *out = falloc((size_t)N * C), *rstd = falloc((size_t)N);
    double *inp_d = to_double(inp, (size_t)N * C), *w_d = to_double(w, (size_t)C);
    double *ref = dalloc((size_t)N * C), *ref_rstd = dalloc((size_t)N);
    be->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    ref_rmsnorm(ref, ref_rstd, inp_d, w_d, N, C, (double)eps);
    snprintf(name, sizeof name, "rmsnorm_forward out N=%d C=%d", N, C);
    check(name, maxrel(out, ref, (size_t)N * C), TOL_FWD);
    check("rmsnorm_forward rstd", maxrel(rstd, ref_rstd, (size_t)N), TOL_FWD);

    float *dout = frand((size_t)N * C, -1, 1);
    double *dout_d = to_double(dout, (size_t)N * C);
    FdProblem pb = {.forward = fd_rmsnorm, .in = {inp_d, w_d}, .out = ref, .w = dout_d,
                    .nout = (size_t)N * C, .dims = {N, C}, .par = {(double)eps}};
    double *g_inp = fd_grad(&pb, 0, (size_t)N * C), *g_w = fd_grad(&pb, 1, (size_t)C);
    float *dinp = falloc((size_t)N * C), *dw = falloc((size_t)C);
    be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    snprintf(name, sizeof name, "rmsnorm_backward dinp N=%d C=%d", N, C);
    check(name, maxrel(dinp, g_inp, (size_t)N * C), TOL_BWD);
    snprintf(name, sizeof name, "rmsnorm_backward dweight N=%d C=%d", N, C);
    check(name, maxrel(dw, g_w, (size_t)C), TOL_BWD);
    float *dinp1 = fcopy(dinp, (size_t)N * C), *dw1 = fcopy(dw, (size_t)C);
    be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    check("rmsnorm_backward dinp accumulates (2 calls = 2x)", maxrel_2x(dinp, dinp1, (size_t)N * C), TOL_ACC);
    check("rmsnorm_backward dweight accumulates (2 calls = 2x)", maxrel_2x(dw, dw1, (size_t)C), TOL_ACC);

    const int nt = omp_get_max_threads();
    memset(dinp, 0, (size_t)N * C * sizeof(float)); memset(dw, 0, (size_t)C * sizeof(float));
    memset(dinp1, 0, (size_t)N * C * sizeof(float)); memset(dw1, 0, (size_t)C * sizeof(float));
    omp_set_num_threads(1);
    be->rmsnorm_backward(dinp1, dw1, dout, inp, w, rstd, N, C);
    omp_set_num_threads(nt);
    be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    check("rmsnorm_backward bitwise equal, 1 vs all threads",
          memcmp(dinp, dinp1, (size_t)N * C * sizeof(float)) == 0 &&
          memcmp(dw, dw1, (size_t)C * sizeof(float)) == 0 ? 0.0 : 1.0, 0.0);
    free(inp); free(w); free(out); free(rstd); free(inp_d); free(w_d); free(ref); free(ref_rstd);
    free(dout); free(dout_d); free(g_inp); free(g_w); free(dinp); free(dw); free(dinp1); free(dw1);
}

static void test_rope(int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    char name[160];
    const size_t n = (size_t)B * T * H * S;
    float *x = frand(n, -1, 1);
    double *x_d = to_double(x, n), *ref = dalloc(n);
    memcpy(ref, x_d, n * sizeof(double));
    be->rope_forward(x, B, T, H, S, off, D, pos0, theta);
    ref_rope(ref, B, T, H, S, off, D, pos0, (double)theta);
    snprintf(name, sizeof name, "rope_forward B=%d T=%d H=%d S=%d off=%d D=%d pos0=%d", B, T, H, S, off, D, pos0);
    check(name, maxrel(x, ref, n), TOL_FWD);

    // rope_backward rewrites dx with the transposed rotation: start it from dout = w.
    float *dx = frand(n, -1, 1);
    double *w_d = to_double(dx, n);
    FdProblem pb = {.forward = fd_rope, .in = {x_d}, .out = ref, .w = w_d, .nout = n,
                    .dims = {B, T, H, S, off, D, pos0}, .par = {(double)theta}};
    double *g = fd_grad(&pb, 0, n);
    be->rope_backward(dx, B, T, H, S, off, D, pos0, theta);
    snprintf(name, sizeof name, "rope_backward dx (off=%d S=%d pos0=%d)", off, S, pos0);
    check(name, maxrel(dx, g, n), TOL_BWD);
    free(x); free(x_d); free(ref); free(dx); free(w_d); free(g);
}

// rope_rows_forward: row n of (N, H, S) at position pos[n], against the double loop applied to
// each row as a (B=1, T=1) tensor at pos0 = pos[n] (positions up to 5000: long contexts).
static void test_rope_rows(int N, int H, int S, int off, int D, float theta) {
    char name[160];
    const size_t row = (size_t)H * S, n = (size_t)N * row;
    float *x = frand(n, -1, 1);
    double *ref = to_double(x, n);
    int *pos = malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) pos[i] = (i * 1237) % 5000;
    be->rope_rows_forward(x, N, H, S, off, D, pos, theta);
    for (int i = 0; i < N; i++) ref_rope(ref + (size_t)i * row, 1, 1, H, S, off, D, pos[i], (double)theta);
    snprintf(name, sizeof name, "rope_rows_forward N=%d H=%d S=%d off=%d D=%d", N, H, S, off, D);
    check(name, maxrel(x, ref, n), TOL_FWD);
    free(x); free(ref); free(pos);
}

static void test_attention(int B, int T, int NH, int NKV, int DQK, int DV, int with_backward) {
    char name[160];
    const float scale = (float)(1.0 / sqrt((double)DQK)) * 1.3f;
    const size_t nq = (size_t)B * T * NH * DQK, nk = (size_t)B * T * NKV * DQK;
    const size_t nv = (size_t)B * T * NKV * DV, no = (size_t)B * T * NH * DV;
    const size_t nl = (size_t)B * NH * T;
    float *q = frand(nq, -1.5, 1.5), *k = frand(nk, -1.5, 1.5), *v = frand(nv, -1, 1);
    float *out = frand(no, -1, 1), *lse = frand(nl, -1, 1);   // garbage: the op must overwrite all of it
    double *q_d = to_double(q, nq), *k_d = to_double(k, nk), *v_d = to_double(v, nv);
    double *ref = dalloc(no), *ref_lse = dalloc(nl);
    be->attention_forward(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
    ref_attention(ref, ref_lse, q_d, k_d, v_d, B, T, NH, NKV, DQK, DV, (double)scale);
    snprintf(name, sizeof name, "attention_forward out B=%d T=%d NH=%d NKV=%d DQK=%d DV=%d",
             B, T, NH, NKV, DQK, DV);
    check(name, maxrel(out, ref, no), TOL_FWD);
    check("attention_forward lse (log-sum-exp of each score row)", maxrel(lse, ref_lse, nl), TOL_FWD);

    if (with_backward) {
        float *dout = frand(no, -1, 1);
        double *dout_d = to_double(dout, no);
        FdProblem pb = {.forward = fd_attention, .in = {q_d, k_d, v_d}, .out = ref, .w = dout_d,
                        .nout = no, .dims = {B, T, NH, NKV, DQK, DV}, .par = {(double)scale}};
        double *gq = fd_grad(&pb, 0, nq), *gk = fd_grad(&pb, 1, nk), *gv = fd_grad(&pb, 2, nv);
        float *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nv);
        float *scratch = frand(nl, -1, 1);   // garbage too
        be->attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
        snprintf(name, sizeof name, "attention_backward dq (NH=%d NKV=%d T=%d)", NH, NKV, T);
        check(name, maxrel(dq, gq, nq), TOL_BWD);
        snprintf(name, sizeof name, "attention_backward dk (NH=%d NKV=%d T=%d)", NH, NKV, T);
        check(name, maxrel(dk, gk, nk), TOL_BWD);
        snprintf(name, sizeof name, "attention_backward dv (NH=%d NKV=%d T=%d)", NH, NKV, T);
        check(name, maxrel(dv, gv, nv), TOL_BWD);
        // The first query sees one key: its softmax is the constant 1, so its dQ and its share of
        // dK are exactly 0 (at T = 1 all of dK), as PyTorch's softmax backward gives them; a
        // rounding residue there would move AdamW's weights by lr where the gradient is 0.
        double first = 0.0;
        for (int b = 0; b < B; b++)
            for (size_t i = 0; i < (size_t)NH * DQK; i++) first = fmax(first, fabs(dq[(size_t)b * T * NH * DQK + i]));
        if (T == 1)
            for (size_t i = 0; i < nk; i++) first = fmax(first, fabs(dk[i]));
        snprintf(name, sizeof name, "attention_backward first query's dQ%s exactly 0", T == 1 ? " and dK" : "");
        check(name, first, 0.0);
        float *dq1 = fcopy(dq, nq), *dk1 = fcopy(dk, nk), *dv1 = fcopy(dv, nv);
        be->attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
        const double e2 = fmax(maxrel_2x(dq, dq1, nq), fmax(maxrel_2x(dk, dk1, nk), maxrel_2x(dv, dv1, nv)));
        check("attention_backward dq,dk,dv accumulate (2 calls = 2x)", e2, TOL_ACC);

        const int nt = omp_get_max_threads();
        memset(dq, 0, nq * sizeof(float)); memset(dk, 0, nk * sizeof(float)); memset(dv, 0, nv * sizeof(float));
        memset(dq1, 0, nq * sizeof(float)); memset(dk1, 0, nk * sizeof(float)); memset(dv1, 0, nv * sizeof(float));
        omp_set_num_threads(1);
        be->attention_backward(dq1, dk1, dv1, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
        omp_set_num_threads(nt);
        be->attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
        check("attention_backward bitwise equal, 1 vs all threads",
              memcmp(dq, dq1, nq * sizeof(float)) == 0 && memcmp(dk, dk1, nk * sizeof(float)) == 0 &&
              memcmp(dv, dv1, nv * sizeof(float)) == 0 ? 0.0 : 1.0, 0.0);
        free(dout); free(dout_d); free(gq); free(gk); free(gv); free(dq); free(dk); free(dv);
        free(scratch); free(dq1); free(dk1); free(dv1);
    }
    free(q); free(k); free(v); free(out); free(lse); free(q_d); free(k_d); free(v_d);
    free(ref); free(ref_lse);
}

// One query row of the CUDA kernels' forward (kernels/cuda_attention_tc.cu): over tiles of 64 keys
// from key 0, the running maximum mt moves, P = bf16(e^(s - mt)) (with common/vec.h's exponential,
// as the CPU op takes it), O and l rescaled by e^(m - mt); or (per_tile 0) P rounded against the
// row's final maximum, as cpu-bf16 did before. out (DV) = O / l, in double.
static void ref_att_row_bf16p(double *out, const float *s, int n, const float *v, int ldv, int DV, int per_tile) {
    float fm = -INFINITY;
    for (int j = 0; j < n; j++) fm = fmaxf(fm, s[j]);
    double l = 0.0, m = -INFINITY, *o = dalloc((size_t)DV);
    float p[64];
    for (int g = 0; g < n; g += 64) {
        const int gn = n - g < 64 ? n - g : 64;
        float mt = per_tile ? (float)m : fm;
        for (int j = 0; j < gn; j++) mt = fmaxf(mt, s[g + j]);
        const double alpha = isinf(m) ? 0.0 : exp(m - (double)mt);
        memcpy(p, s + g, (size_t)gn * sizeof(float));
        vec_exp_shifted(p, gn, mt);
        l *= alpha;
        for (int d = 0; d < DV; d++) o[d] *= alpha;
        for (int j = 0; j < gn; j++) {
            l += p[j];
            const double pr = sr_bf16_to_f32(sr_f32_to_bf16_rne(p[j]));
            for (int d = 0; d < DV; d++) o[d] += pr * v[(size_t)(g + j) * ldv + d];
        }
        m = mt;
    }
    for (int d = 0; d < DV; d++) out[d] = o[d] / l;
    free(o);
}

// cpu-bf16's attention forward rounds P where the CUDA kernels do (layers/cpu_attention.c,
// exp_rounded_as_cuda). Scores exact in fp32 (small integers times 1/4), so that the op and the
// reference round the same numbers; the keys' first component rises with the position, so a
// row's maximum moves after its first tile, where the two rounding points differ.
static void test_attention_bf16p_rounding(int T, int NH, int DQK, int DV) {
    const size_t nq = (size_t)T * NH * DQK, nk = (size_t)T * DQK, nv = (size_t)T * DV, no = (size_t)T * NH * DV;
    float *q = falloc(nq), *k = falloc(nk), *v = frand(nv, -1, 1), *out = falloc(no), *lse = falloc((size_t)NH * T);
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < DQK; d++) k[(size_t)t * DQK + d] = d == 0 ? (float)(t / 24) : (float)(rng_next() % 3) - 1.0f;
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < DQK; d++) q[((size_t)t * NH + h) * DQK + d] = d == 0 ? (float)(h + 1) : (float)(rng_next() % 5) - 2.0f;
    }
    const float scale = 0.25f;
    cpu_attention_forward_bf16p(out, lse, q, k, v, 1, T, NH, 1, DQK, DV, scale);
    double *ref = dalloc(no), *old = dalloc(no);
    float *srow = falloc((size_t)T);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            for (int j = 0; j <= t; j++) {
                double dot = 0.0;
                for (int d = 0; d < DQK; d++) dot += (double)q[((size_t)t * NH + h) * DQK + d] * k[(size_t)j * DQK + d];
                srow[j] = (float)(scale * dot);
            }
            ref_att_row_bf16p(ref + ((size_t)t * NH + h) * DV, srow, t + 1, v, DV, DV, 1);
            ref_att_row_bf16p(old + ((size_t)t * NH + h) * DV, srow, t + 1, v, DV, DV, 0);
        }
    float *oldf = falloc(no);
    for (size_t i = 0; i < no; i++) oldf[i] = (float)old[i];
    char name[160];
    snprintf(name, sizeof name, "attention_forward_bf16p P rounded as the CUDA kernels (T=%d)", T);
    check(name, maxrel(out, ref, no), 1e-5);
    // the input tells the two rounding points apart (else the check above proves nothing)
    check("  ... where rounding against the row's final maximum differs", maxrel(oldf, ref, no) > 1e-4 ? 0.0 : 1.0, 0.0);
    free(q); free(k); free(v); free(out); free(lse); free(ref); free(old); free(srow); free(oldf);
}

// gate and up as the halves of one (rows, 2 cols) product, as the model lays them out
// (model/forward.c): gate = gu, up = gu + cols, rows 2 cols apart; dgate and dup the same in dgu
static void test_swiglu(int rows, int cols) {
    char name[96];
    const size_t n = (size_t)rows * cols, ld = 2 * (size_t)cols;
    float *gu = falloc(2 * n), *out = falloc(n);
    for (int r = 0; r < rows; r++) {   // gate values in [-6, 6], up values in [-2, 2]
        float *g = frand((size_t)cols, -6, 6), *u = frand((size_t)cols, -2, 2);
        memcpy(gu + r * ld, g, (size_t)cols * sizeof(float));
        memcpy(gu + r * ld + cols, u, (size_t)cols * sizeof(float));
        free(g); free(u);
    }
    double *g_d = dalloc(n), *u_d = dalloc(n), *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) g_d[i] = gu[i / cols * ld + i % cols], u_d[i] = gu[i / cols * ld + cols + i % cols];
    be->swiglu_forward(out, gu, gu + cols, rows, cols, (int)ld);
    ref_swiglu(ref, g_d, u_d, n);
    snprintf(name, sizeof name, "swiglu_forward %d x %d, gate and up rows %zu apart", rows, cols, ld);
    check(name, maxrel(out, ref, n), TOL_FWD);

    float *dout = frand(n, -1, 1);
    double *dout_d = to_double(dout, n);
    // out[i] depends only on gate[i] and up[i], so the finite differences of L = sum(w * out)
    // are taken one element at a time (the generic fd_grad would cost O(n^2) here).
    double *gg = dalloc(n), *gup = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        double o[2];
        const double h = 1e-6 * (fabs(g_d[i]) > 1.0 ? fabs(g_d[i]) : 1.0);
        double gp = g_d[i] + h, gm = g_d[i] - h;
        ref_swiglu(&o[0], &gp, &u_d[i], 1);
        ref_swiglu(&o[1], &gm, &u_d[i], 1);
        gg[i] = dout_d[i] * (o[0] - o[1]) / (gp - gm);
        double up = u_d[i] + 1e-6, um = u_d[i] - 1e-6;
        ref_swiglu(&o[0], &g_d[i], &up, 1);
        ref_swiglu(&o[1], &g_d[i], &um, 1);
        gup[i] = dout_d[i] * (o[0] - o[1]) / (up - um);
    }
    float *dgu = falloc(2 * n), *dg = falloc(n), *du = falloc(n);
    be->swiglu_backward(dgu, dgu + cols, dout, gu, gu + cols, rows, cols, (int)ld);
    for (size_t i = 0; i < n; i++) dg[i] = dgu[i / cols * ld + i % cols], du[i] = dgu[i / cols * ld + cols + i % cols];
    snprintf(name, sizeof name, "swiglu_backward dgate %d x %d", rows, cols);
    check(name, maxrel(dg, gg, n), TOL_BWD);
    snprintf(name, sizeof name, "swiglu_backward dup %d x %d", rows, cols);
    check(name, maxrel(du, gup, n), TOL_BWD);
    float *dgu1 = fcopy(dgu, 2 * n);
    be->swiglu_backward(dgu, dgu + cols, dout, gu, gu + cols, rows, cols, (int)ld);
    check("swiglu_backward accumulates (2 calls = 2x)", maxrel_2x(dgu, dgu1, 2 * n), TOL_ACC);
    free(gu); free(out); free(g_d); free(u_d); free(ref); free(dout); free(dout_d);
    free(gg); free(gup); free(dgu); free(dg); free(du); free(dgu1);
}

static void test_xent(void) {
    const int N = 7, V = 53, ignore = -100, ign_row = 3;
    int *tgt = xalloc(N * sizeof(int));
    for (int n = 0; n < N; n++) tgt[n] = rng_int(V);
    tgt[ign_row] = ignore;
    float *logits = frand((size_t)N * V, -3, 3), *loss = frand((size_t)N, 5, 6);
    double *logits_d = to_double(logits, (size_t)N * V), *ref = dalloc((size_t)N);
    be->xent_forward(loss, logits, tgt, N, V, ignore);
    ref_xent(ref, logits_d, tgt, N, V, ignore);
    check("xent_forward losses (one ignored target)", maxrel(loss, ref, (size_t)N), TOL_FWD);
    check("xent_forward ignored target gives loss 0", fabs(loss[ign_row]), 0.0);

    // max subtraction: logits around 1e3 overflow a naive exp
    float *big = fcopy(logits, (size_t)N * V);
    for (size_t i = 0; i < (size_t)N * V; i++) big[i] = big[i] * 10.0f + 1000.0f;
    double *big_d = to_double(big, (size_t)N * V);
    be->xent_forward(loss, big, tgt, N, V, ignore);
    ref_xent(ref, big_d, tgt, N, V, ignore);
    check("xent_forward logits ~1e3 (stable)", maxrel(loss, ref, (size_t)N), TOL_FWD);

    const float dloss = 0.7f;
    double *w_d = dalloc((size_t)N);
    for (int n = 0; n < N; n++) w_d[n] = (double)dloss;
    double *loss_d = dalloc((size_t)N);
    FdProblem pb = {.forward = fd_xent, .in = {logits_d}, .out = loss_d, .w = w_d, .nout = (size_t)N,
                    .ints = tgt, .dims = {N, V, ignore}};
    double *g = fd_grad(&pb, 0, (size_t)N * V);
    float *dl = falloc((size_t)N * V);
    be->xent_backward(dl, logits, tgt, N, V, ignore, dloss);
    check("xent_backward dlogits", maxrel(dl, g, (size_t)N * V), TOL_BWD);
    check("xent_backward ignored row is zero", maxabs(dl + (size_t)ign_row * V, (size_t)V), 0.0);
    float *first = fcopy(dl, (size_t)N * V);
    be->xent_backward(dl, logits, tgt, N, V, ignore, dloss);
    check("xent_backward accumulates (2 calls = 2x)", maxrel_2x(dl, first, (size_t)N * V), TOL_ACC);
    free(tgt); free(logits); free(loss); free(logits_d); free(ref); free(big); free(big_d);
    free(w_d); free(loss_d); free(g); free(dl); free(first);
}

static void test_sumsq(size_t n) {
    char name[96];
    float *g = frand(n, -1, 1);
    double ref = 0.0;
    for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    const double got = be->sumsq(g, n);
    snprintf(name, sizeof name, "sumsq n=%zu", n);
    // both sums are in double: only the summation order differs
    check(name, ref > 0 ? fabs(got - ref) / ref : fabs(got), 1e-12);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    const double one = be->sumsq(g, n);
    omp_set_num_threads(nt);
    snprintf(name, sizeof name, "sumsq n=%zu bitwise equal, 1 vs all threads", n);
    check(name, memcmp(&one, &got, sizeof one) == 0 ? 0.0 : 1.0, 0.0);
    free(g);
}

// The sum of squares over stripes (ZeRO-1's shards, model/shard.h) against a double loop over
// the elements each stripe holds: stripes that end inside the buffer, one clipped by its end,
// and a start past the end of the first round's buffer part.
static void test_sumsq_stripes(size_t lo, size_t stripe, size_t period, size_t end) {
    char name[128];
    float *g = frand(end ? end : 1, -1, 1);
    double ref = 0.0;
    for (size_t i = 0; i < end; i++)
        if (i % period >= lo && i % period < lo + stripe) ref += (double)g[i] * g[i];
    const double got = be->sumsq_stripes(g, lo, stripe, period, end);
    snprintf(name, sizeof name, "sumsq_stripes lo=%zu stripe=%zu period=%zu end=%zu", lo, stripe, period, end);
    check(name, ref > 0 ? fabs(got - ref) / ref : fabs(got), 1e-12);
    free(g);
}

// Three AdamW steps against torch.optim.AdamW's formula evaluated in double.
static void test_adamw(size_t n) {
    char name[96];
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *p = frand(n, -1, 1), *m = falloc(n), *v = falloc(n);
    double *p0 = to_double(p, n), *pd = to_double(p, n), *md = dalloc(n), *vd = dalloc(n);
    for (int t = 1; t <= 3; t++) {
        float *grad = frand(n, -2, 2);
        grad[0] = 0.0f;   // eps alone keeps 0/0 away
        be->adamw_update(p, m, v, grad, n, lr, b1, b2, eps, wd, gs, t);
        const double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
        for (size_t i = 0; i < n; i++) {
            const double gi = (double)grad[i] * gs;
            md[i] = b1 * md[i] + (1.0 - b1) * gi;
            vd[i] = b2 * vd[i] + (1.0 - b2) * gi * gi;
            const double mhat = md[i] / bc1;
            const double denom = sqrt(vd[i]) / sqrt(bc2) + eps;   // = sqrt(vhat) + eps
            pd[i] = pd[i] - (double)lr * (double)wd * pd[i] - (double)lr * mhat / denom;
        }
        free(grad);
    }
    // compare the parameter change, not the parameter: a small error in an update of size
    // ~lr would hide behind |p| ~ 1 in a relative max-norm.
    float *dp = falloc(n);
    double *dpd = dalloc(n);
    for (size_t i = 0; i < n; i++) { dp[i] = (float)((double)p[i] - p0[i]); dpd[i] = pd[i] - p0[i]; }
    snprintf(name, sizeof name, "adamw 3 steps n=%zu param change", n);
    check(name, maxrel(dp, dpd, n), TOL_FWD);
    snprintf(name, sizeof name, "adamw 3 steps n=%zu m", n);
    check(name, maxrel(m, md, n), TOL_FWD);
    snprintf(name, sizeof name, "adamw 3 steps n=%zu v", n);
    check(name, maxrel(v, vd, n), TOL_FWD);
    free(p); free(m); free(v); free(p0); free(pd); free(md); free(vd); free(dp); free(dpd);
}

// The matmuls' thread-count checks alone (tests/CMakeLists.txt runs them again on OpenBLAS's
// Haswell kernels, whose row unroll layers/cpu_parts.h aligns the parts to).
static void matmul_threads_cases(void) {
    test_matmul_threads(300, 96, 80);
    test_matmul_threads(301, 257, 133);
    test_matmul_threads(140, 96, 80);   // the whole over the small-matrix bound, its parts under it: one call
    test_matmul_threads(50, 40, 30);    // all under it
    // one call whose inner dimension OpenBLAS 0.3.21 blocks otherwise when it threads the call
    // itself (K past its 384-wide blocks): dweight over 900 token rows, the forward over C = 500
    test_matmul_threads(900, 64, 32);
    test_matmul_threads(40, 500, 64);
}

int main(int argc, char **argv) {
    be = backend_cpu();
    if (argc > 1 && !strcmp(argv[1], "--matmul-threads")) {
        matmul_threads_cases();
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }
    test_memory();
    test_elementwise(37);
    test_elementwise(100003);   // above the parallel threshold

    test_matmul(13, 17, 11, 1);
    test_matmul(37, 71, 19, 1);
    test_matmul(301, 257, 133, 0);   // big enough for OpenBLAS's blocked, threaded path
    test_matmul(300, 96, 80, 1);     // parts of 150 rows and of 40 channels, each over the small-matrix bound
    matmul_threads_cases();
    // a few rows (decoding): the read-the-weight-once path, serial and threaded, and the
    // matrix-vector input gradient
    test_matmul(1, 45, 300, 1);
    test_matmul(3, 600, 70, 1);
    test_matmul(16, 33, 1100, 0);
    test_matmul(8, 512, 31, 1);    // register tiles: one 8-row tile, an odd last weight row
    test_matmul(7, 13, 5, 1);      // a 3-row remainder tile and the k % 8 tail
    test_matmul(5, 4, 2, 1);       // fewer than 8 inputs: no vector step at all
    test_vec_exp();
    test_copy_cols();
    test_vec_int4();
    test_matmul_rows_independent(8, 517, 37);
    test_matmul_rows_independent(7, 64, 1031);

    test_embedding();

    test_rmsnorm(7, 45);
    test_rmsnorm(5, 131);   // dweight: two 64-channel blocks and a remainder

    test_rope(2, 5, 3, 10, 2, 6, 7, 10000.0f);    // off > 0, S > D, pos0 > 0
    test_rope_rows(5, 3, 10, 2, 6, 10000.0f);
    test_rope_rows(4, 1, 32, 0, 32, 500000.0f);
    test_rope(1, 9, 2, 8, 0, 8, 0, 500.0f);       // whole head, pos0 = 0
    test_rope(1, 3, 3, 71, 5, 64, 4093, 10000.0f); // long positions: angles need double

    test_attention(2, 13, 6, 2, 7, 5, 1);     // GQA, DQK != DV
    test_attention(2, 11, 3, 3, 5, 7, 1);     // MHA
    test_attention(1, 11, 4, 1, 6, 9, 1);     // MQA
    test_attention(1, 70, 2, 1, 3, 2, 1);     // one partial tile
    test_attention(1, 1, 4, 2, 5, 3, 1);      // T = 1
    test_attention(1, 67, 8, 1, 4, 3, 1);     // group of 8 query heads
    test_attention(1, 130, 2, 2, 5, 3, 1);    // two tiles (128 + 2)
    test_attention(1, 261, 2, 1, 3, 2, 1);    // three tiles (128 + 128 + 5)
    test_attention(1, 140, 3, 3, 4, 3, 1);    // 3 (b, kv head) tasks: two phases on 2 threads, one pass on 1
    test_attention(2, 133, 4, 2, 17, 9, 0);   // two tiles, forward only
    test_attention(1, 1100, 2, 1, 5, 3, 0);   // three forward key spans (512 + 512 + 76)
    test_attention(1, 300, 2, 1, 24, 16, 0);  // three tiles, forward only
    test_attention_bf16p_rounding(300, 2, 4, 5);
    test_attention_bf16p_rounding(1100, 1, 3, 4);   // spans of 512 keys after the first

    test_swiglu(1, 101);
    test_swiglu(3, 37);
    test_swiglu(97, 413);   // parallel path

    test_xent();

    test_sumsq(0);
    test_sumsq(1000);
    test_sumsq(100003);
    test_sumsq_stripes(0, 100003, 100003, 100003);   // the whole buffer: one round
    test_sumsq_stripes(4096, 4096, 3 * 4096, 43000);   // rank 1 of 3, its last stripe clipped
    test_sumsq_stripes(8192, 4096, 3 * 4096, 45000);   // rank 2 of 3, its last stripe past the end

    test_adamw(37);
    test_adamw(20011);

    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
