// ab_matmul: the dense matmul of this tree (layers/cpu_matmul.c) against that of an older commit,
// alternated in one process, the best of each kept (bench/ab/ab_attention.c says why). Built and
// run by bench/ab.sh matmul and matmul_rows, which compile the older file with its entry points
// renamed old_*.
//
//   ab_matmul N C OC REPS     (out (N, OC) = inp (N, C) @ weight (OC, C)^T, and its backward)
//
// At decoding's few rows (N <= FEW_ROWS) the forward streams its weight from memory, a decode
// step's 8 layers of weights being several times the L3: the forward then runs over enough
// distinct copies of the weight to pass WEIGHT_SPAN bytes, one after the other, and its time is
// theirs together (one copy would be timed from the L3).
#include <omp.h>

#include "bench/ab/ab_common.h"

#define ENTRY_POINTS(P)                                                                                      \
    void P##cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC);     \
    void P##cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,            \
                                const float *weight, int N, int C, int OC);
ENTRY_POINTS()
ENTRY_POINTS(old_)

#define FEW_ROWS 8
#define WEIGHT_SPAN ((size_t)96 << 20)

typedef void (*ForwardFn)(float *, const float *, const float *, int, int, int);
typedef void (*BackwardFn)(float *, float *, const float *, const float *, const float *, int, int, int);

int main(int argc, char **argv) {
    static const char *const NAMES[4] = {"N", "C", "OC", "REPS"};
    int64_t a[4];
    ab_args(argc, argv, "ab_matmul N C OC REPS (run through bench/ab.sh matmul)", NAMES, 4, a);
    const int N = (int)a[0], C = (int)a[1], OC = (int)a[2], reps = (int)a[3];
    Rng st;
    rng_seed(&st, 1);
    const size_t wn = (size_t)OC * C, copies = N <= FEW_ROWS ? WEIGHT_SPAN / (wn * sizeof(float)) + 1 : 1;
    float *inp = ab_uniform((size_t)N * C, &st), *w = ab_uniform(wn * copies, &st), *out = ab_uniform((size_t)N * OC, &st);
    float *dout = ab_uniform((size_t)N * OC, &st), *dinp = ab_uniform((size_t)N * C, &st), *dw = ab_uniform((size_t)OC * C, &st);
    const ForwardFn fwd[2] = {old_cpu_matmul_forward, cpu_matmul_forward};
    const BackwardFn bwd[2] = {old_cpu_matmul_backward, cpu_matmul_backward};
    double best[3][2] = {{AB_NONE, AB_NONE}, {AB_NONE, AB_NONE}, {AB_NONE, AB_NONE}};   // forward, dinp, dweight
    for (int r = 0; r < reps + 1; r++)   // the first round warms up and is not kept
        for (int slot = 0; slot < 2; slot++) {
            const int v = ab_version(r, slot);
            const double t0 = omp_get_wtime();
            for (size_t c = 0; c < copies; c++) fwd[v](out, inp, w + c * wn, N, C, OC);
            const double t1 = omp_get_wtime();
            bwd[v](dinp, NULL, dout, inp, w, N, C, OC);
            const double t2 = omp_get_wtime();
            bwd[v](NULL, dw, dout, inp, w, N, C, OC);
            const double t3 = omp_get_wtime();
            const double t[3] = {t1 - t0, t2 - t1, t3 - t2};
            ab_keep_best(best, 3, r, v, t);
        }
    const double f = 2.0 * N * C * OC, flops[3] = {f * (double)copies, f, f};
    static const char *const PART[3] = {"forward", "input gradient", "weight gradient"};
    if (copies > 1) printf("N=%d C=%d OC=%d (forward over %zu copies of the weight, %.0f MB):", N, C, OC, copies, copies * wn * 4e-6);
    else printf("N=%d C=%d OC=%d:", N, C, OC);
    ab_print_parts(PART, 3, (const double (*)[2])best, flops);
    return 0;
}
