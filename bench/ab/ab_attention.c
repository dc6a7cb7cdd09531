// ab_attention: the CPU attention op of this tree against the same op of an older commit, in one
// process, the two called alternately and the best of each kept. On a shared machine whose rate
// moves by a tenth between runs, two binaries run one after the other cannot resolve a change
// of a few percent; two implementations alternated within one run can. Built and run by
// bench/ab.sh attention, which compiles the older layers/cpu_attention.c with its entry points
// renamed old_*.
//
//   ab_attention B T DQK REPS     (8 heads, DV = 64; FLOPs counted as bench/bench_attention.c does)
#include <omp.h>

#include "bench/ab/ab_common.h"

#define ENTRY_POINTS(P)                                                                                        \
    void P##cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,     \
                                  int B, int T, int NH, int NKV, int DQK, int DV, float scale);               \
    void P##cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,        \
                                   const float *out, const float *lse, const float *q, const float *k,        \
                                   const float *v, int B, int T, int NH, int NKV, int DQK, int DV, float scale);
ENTRY_POINTS()
ENTRY_POINTS(old_)

int main(int argc, char **argv) {
    static const char *const NAMES[4] = {"B", "T", "DQK", "REPS"};
    int64_t a[4];
    ab_args(argc, argv, "ab_attention B T DQK REPS (run through bench/ab.sh attention)", NAMES, 4, a);
    const int B = (int)a[0], T = (int)a[1], DQK = (int)a[2], reps = (int)a[3], NH = 8, NKV = 8, DV = 64;
    const size_t nq = (size_t)B * T * NH * DQK, nv = (size_t)B * T * NH * DV, nl = (size_t)B * NH * T;
    Rng st;
    rng_seed(&st, 1);
    float *q = ab_uniform(nq, &st), *k = ab_uniform(nq, &st), *v = ab_uniform(nv, &st), *dout = ab_uniform(nv, &st);
    float *o = ab_uniform(nv, &st), *lse = ab_uniform(nl, &st), *dq = ab_uniform(nq, &st), *dk = ab_uniform(nq, &st);
    float *dv = ab_uniform(nv, &st), *scratch = ab_uniform(nl, &st);
    double best[2][2] = {{AB_NONE, AB_NONE}, {AB_NONE, AB_NONE}};   // forward, backward
    for (int r = 0; r < reps + 1; r++)   // the first round warms up and is not kept
        for (int slot = 0; slot < 2; slot++) {
            const int w = ab_version(r, slot);
            const double t0 = omp_get_wtime();
            (w ? cpu_attention_forward : old_cpu_attention_forward)(o, lse, q, k, v, B, T, NH, NKV, DQK, DV, 0.125f);
            const double t1 = omp_get_wtime();
            (w ? cpu_attention_backward : old_cpu_attention_backward)(dq, dk, dv, scratch, dout, o, lse, q, k, v, B, T,
                                                                      NH, NKV, DQK, DV, 0.125f);
            const double t2 = omp_get_wtime();
            const double t[2] = {t1 - t0, t2 - t1};
            ab_keep_best(best, 2, r, w, t);
        }
    const double fwd = 2.0 * B * NH * ((double)T * (T + 1) / 2) * (DQK + DV), flops[2] = {fwd, 2 * fwd};
    static const char *const PART[2] = {"forward", "backward"};
    printf("B=%d T=%d 8 x %d/%d:", B, T, DQK, DV);
    ab_print_parts(PART, 2, (const double (*)[2])best, flops);
    return 0;
}
