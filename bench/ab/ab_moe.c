// ab_moe: the grouped expert matmuls of this tree (layers/cpu_moe.c) against those of an older
// commit, alternated in one process, the best of each kept (bench/ab/ab_attention.c says why).
// Built and run by bench/ab.sh moe, which compiles the older file with its entry points renamed
// old_*. The older commit must have the entry points' row-count argument R (since the MoE
// layer stopped downloading its row offsets: docs/MOE.md).
//
//   ab_moe TOKENS EXPERTS TOPK D_MODEL WIDTH REPS
//
// Each token picks TOPK distinct experts uniformly (seeded), as a router does at initialization,
// so the experts' row counts differ by chance as in bench_train's first steps. One round times a
// SwiGLU expert's three products the way model/moe.c calls them: forward gate (D_MODEL -> WIDTH)
// and down (WIDTH -> D_MODEL), backward of both with the input gradient and, separately, the
// weight gradients (the part whose tiling differs most between versions).
#include <omp.h>

#include "bench/ab/ab_common.h"
#include "bench/random_routing.h"

#define ENTRY_POINTS(P)                                                                                          \
    void P##cpu_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights,            \
                                          const int *expert_off, int E, int R, int C, int OC);                  \
    void P##cpu_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout,              \
                                           const float *inp, const float *const *weights, const int *expert_off, \
                                           int E, int R, int C, int OC);
ENTRY_POINTS()
ENTRY_POINTS(old_)

typedef void (*ForwardFn)(float *, const float *, const float *const *, const int *, int, int, int, int);
typedef void (*BackwardFn)(float *, float *const *, const float *, const float *, const float *const *, const int *,
                           int, int, int, int);

int main(int argc, char **argv) {
    static const char *const NAMES[6] = {"TOKENS", "EXPERTS", "TOPK", "D_MODEL", "WIDTH", "REPS"};
    int64_t a[6];
    ab_args(argc, argv, "ab_moe TOKENS EXPERTS TOPK D_MODEL WIDTH REPS (run through bench/ab.sh moe)", NAMES, 6, a);
    const int N = (int)a[0], E = (int)a[1], K = (int)a[2], C = (int)a[3], I = (int)a[4], reps = (int)a[5];
    if (K > E) die("ab_moe: TOPK %d is more than EXPERTS %d", K, E);
    Rng st;
    rng_seed(&st, 1);
    // row counts of a random top-K routing: each token's K experts distinct
    int *off = xmalloc((size_t)(E + 1) * sizeof(int)), lo, hi;
    random_routing_offsets(off, N, E, K, &st, &lo, &hi);
    const size_t R = (size_t)off[E], nw = (size_t)I * C;
    float *xs = ab_uniform(R * C, &st), *gate = ab_uniform(R * I, &st), *dgate = ab_uniform(R * I, &st);
    float *out = ab_uniform(R * C, &st), *dout = ab_uniform(R * C, &st), *dxs = ab_uniform(R * C, &st), *dact = ab_uniform(R * I, &st);
    float **wg = xmalloc((size_t)E * sizeof(float *)), **wd = xmalloc((size_t)E * sizeof(float *));
    float **dwg = xmalloc((size_t)E * sizeof(float *)), **dwd = xmalloc((size_t)E * sizeof(float *));
    for (int e = 0; e < E; e++) {
        wg[e] = ab_uniform(nw, &st); wd[e] = ab_uniform(nw, &st);
        dwg[e] = ab_uniform(nw, &st); dwd[e] = ab_uniform(nw, &st);
    }
    const ForwardFn fwd[2] = {old_cpu_moe_expert_matmul_forward, cpu_moe_expert_matmul_forward};
    const BackwardFn bwd[2] = {old_cpu_moe_expert_matmul_backward, cpu_moe_expert_matmul_backward};
    double best[3][2] = {{AB_NONE, AB_NONE}, {AB_NONE, AB_NONE}, {AB_NONE, AB_NONE}};   // forward, dinp, dweights
    for (int r = 0; r < reps + 1; r++)   // the first round warms up and is not kept
        for (int slot = 0; slot < 2; slot++) {
            const int w = ab_version(r, slot);
            const double t0 = omp_get_wtime();
            fwd[w](gate, xs, (const float *const *)wg, off, E, (int)R, C, I);
            fwd[w](out, gate, (const float *const *)wd, off, E, (int)R, I, C);
            const double t1 = omp_get_wtime();
            bwd[w](dact, NULL, dout, gate, (const float *const *)wd, off, E, (int)R, I, C);
            bwd[w](dxs, NULL, dgate, xs, (const float *const *)wg, off, E, (int)R, C, I);
            const double t2 = omp_get_wtime();
            bwd[w](NULL, dwd, dout, gate, (const float *const *)wd, off, E, (int)R, I, C);
            bwd[w](NULL, dwg, dgate, xs, (const float *const *)wg, off, E, (int)R, C, I);
            const double t3 = omp_get_wtime();
            const double t[3] = {t1 - t0, t2 - t1, t3 - t2};
            ab_keep_best(best, 3, r, w, t);
        }
    const double f = 2.0 * 2.0 * (double)R * C * I, flops[3] = {f, f, f};   // two products of R x C x I
    static const char *const PART[3] = {"forward", "input gradients", "weight gradients"};
    printf("%d tokens top-%d over %d experts (%d to %d rows), %d -> %d:", N, K, E, lo, hi, C, I);
    ab_print_parts(PART, 3, (const double (*)[2])best, flops);
    return 0;
}
