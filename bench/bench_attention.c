// bench_attention: the attention op alone (backend/backend.h, layers/cpu_attention.c) against
// the machine's sgemm rate measured in the same run: forward and backward at T = 512, 2048 and
// 8192 for the head shapes of bench_train's d512 models (8 heads of 64; the latent form's 96 /
// 64), so the tile sizes can be tuned without a whole training step's noise.
//
//   build/bench/bench_attention [--threads N] [--reps N] [--json]
//
// FLOPs counted as bench_train counts them: forward 2 NH (Dqk + Dv) per causal (query, key)
// pair, backward twice that, (T + 1) / 2 keys per query on average. The recomputation of the
// probabilities in the backward is work the rate has to absorb. The sgemm rate is the best of a
// measurement before the first shape and one after each (as bench_train and bench_decode take
// theirs; one measurement before, on a busy machine, once put the op above 1.0 of it), so the
// table is printed at the end and progress goes to stderr.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "common/args.h"
#include "common/num.h"
#include "common/rng.h"
#include "common/util.h"

static const ArgSpec SPECS[] = {
    {"threads", 1, "OpenMP/OpenBLAS threads (default: OMP_NUM_THREADS or all cores)", "N"},
    {"reps", 1, "timed runs of each shape after a warm-up (default 3; the best is kept)", "N"},
    {"json", 0, "one JSON object per shape", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

static float *random_floats(size_t n, Rng *r) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(r) * 0.5f;
    return x;
}

// sgemm as large as the model's projections (2048 x 1408 x 512)
static double sgemm_rate(int reps) { return bench_sgemm_rate(2048, 1408, 512, reps); }

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: bench_attention [--threads N] [--reps N] [--json]\n"
               "Times the CPU attention op (forward, backward) against the machine's sgemm rate.",
               NULL, NULL, 0);
    const char *thr_s = args_get(&a, SPECS, N_SPECS, "threads"), *reps_s = args_get(&a, SPECS, N_SPECS, "reps");
    if (thr_s) {
        int th = (int)opt_i64("--threads", thr_s, 1, CLLA_MAX_THREADS);
        omp_set_num_threads(th);
        openblas_set_num_threads(th);
    }
    int reps = reps_s ? (int)opt_i64("--reps", reps_s, 1, 1000) : 3, json = args_get(&a, SPECS, N_SPECS, "json") != NULL;
    const Backend *be = backend_cpu();
    double sgemm = sgemm_rate(reps);
    static const struct { const char *what; int NH, NKV, DQK, DV; } HEADS[] = {
        {"mha 8 x 64", 8, 8, 64, 64},
        {"latent 8 x (64+32) / 64", 8, 8, 96, 64},
    };
    static const int LENS[] = {512, 2048, 8192};
    enum { N_HEADS = sizeof(HEADS) / sizeof(HEADS[0]), N_LENS = sizeof(LENS) / sizeof(LENS[0]) };
    struct { double fwd, bwd, flops_fwd, flops_bwd; int B; } res[N_HEADS][N_LENS];
    for (size_t h = 0; h < N_HEADS; h++)
        for (size_t li = 0; li < N_LENS; li++) {
            int T = LENS[li], B = T >= 2048 ? 1 : 2048 / T, NH = HEADS[h].NH, NKV = HEADS[h].NKV;
            int DQK = HEADS[h].DQK, DV = HEADS[h].DV;
            size_t nq = (size_t)B * T * NH * DQK, nk = (size_t)B * T * NKV * DQK, nv = (size_t)B * T * NKV * DV;
            size_t no = (size_t)B * T * NH * DV, nl = (size_t)B * NH * T;
            Rng r;
            rng_seed(&r, 7);
            float *q = random_floats(nq, &r), *k = random_floats(nk, &r), *v = random_floats(nv, &r);
            float *dout = random_floats(no, &r), *out = xmalloc(no * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
            float *dq = xcalloc(nq, sizeof(float)), *dk = xcalloc(nk, sizeof(float)), *dv = xcalloc(nv, sizeof(float));
            float *scratch = xmalloc(nl * sizeof(float));
            float scale = 1.0f / sqrtf((float)DQK);
            double fwd = INFINITY, bwd = INFINITY;
            for (int i = 0; i <= reps; i++) {
                double t0 = now_seconds();
                be->attention_forward(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
                double t1 = now_seconds();
                be->attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
                double t2 = now_seconds();
                if (i) { fwd = fmin(fwd, t1 - t0); bwd = fmin(bwd, t2 - t1); }
            }
            double pairs = (double)B * T * (T + 1) / 2.0, per_pair = 2.0 * NH * (DQK + DV);
            res[h][li].fwd = fwd, res[h][li].bwd = bwd, res[h][li].B = B;
            res[h][li].flops_fwd = pairs * per_pair, res[h][li].flops_bwd = 2 * pairs * per_pair;
            free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv); free(scratch);
            const double again = sgemm_rate(reps);
            sgemm = again > sgemm ? again : sgemm;
            fprintf(stderr, "bench_attention: %s T=%d done\n", HEADS[h].what, T);
        }
    printf("bench_attention: %d threads | sgemm %.1f GFLOP/s (2048 x 1408 x 512; the best of the measurements before the "
           "first shape and after each)\n", omp_get_max_threads(), sgemm / 1e9);
    for (size_t h = 0; h < N_HEADS; h++)
        for (size_t li = 0; li < N_LENS; li++) {
            const double fwd = res[h][li].fwd, bwd = res[h][li].bwd, rf = res[h][li].flops_fwd / fwd, rb = res[h][li].flops_bwd / bwd;
            const int T = LENS[li], B = res[h][li].B;
            printf("%-24s T=%5d B=%d: forward %8.2f ms %6.1f GFLOP/s (%.2f of sgemm) | backward %8.2f ms %6.1f GFLOP/s (%.2f)\n",
                   HEADS[h].what, T, B, fwd * 1e3, rf / 1e9, rf / sgemm, bwd * 1e3, rb / 1e9, rb / sgemm);
            if (json)
                printf("{\"heads\":\"%s\",\"T\":%d,\"B\":%d,\"forward_s\":%.6f,\"backward_s\":%.6f,\"forward_ratio\":%.4f,"
                       "\"backward_ratio\":%.4f,\"sgemm_flops\":%.6g}\n", HEADS[h].what, T, B, fwd, bwd, rf / sgemm, rb / sgemm, sgemm);
        }
    return 0;
}
