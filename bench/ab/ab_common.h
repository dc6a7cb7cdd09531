// What the ab_* drivers share (bench/ab.sh builds them, one per op): their seeded inputs, their
// arguments, and the line that sets an op's old and new times side by side.
#ifndef CLLA_BENCH_AB_COMMON_H
#define CLLA_BENCH_AB_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/num.h"
#include "common/rng.h"
#include "common/util.h"

// n values uniform in (-0.5, 0.5)
static inline float *ab_uniform(size_t n, Rng *r) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_uniform(r) - 0.5f;
    return x;
}

// the n whole-number arguments named names[] (each lo..65536) into a[], or the usage and exit 2
static inline void ab_args_from(int argc, char **argv, const char *usage, const char *const *names, int n, int64_t *a, int lo) {
    if (argc != n + 1) {
        fprintf(stderr, "usage: %s\n", usage);
        exit(2);
    }
    for (int i = 0; i < n; i++) a[i] = opt_i64(names[i], argv[i + 1], lo, 65536);
}
static inline void ab_args(int argc, char **argv, const char *usage, const char *const *names, int n, int64_t *a) {
    ab_args_from(argc, argv, usage, names, n, a, 1);
}

// The version (0 old, 1 new) that goes i-th (0 or 1) in round `round`: the order flips every
// round, since the second call of a round measured a few percent faster with the same code in
// both slots (bench/ab.sh paged on an unchanged tree, docs/INFERENCE.md).
static inline int ab_version(int round, int i) { return round & 1 ? 1 - i : i; }

// best[j][v]: the shortest of the times t[j] of part j of version v (0 old, 1 new) over the
// rounds; round 0 warms up and is not kept (best starts at AB_NONE)
#define AB_NONE 1e30
static inline void ab_keep_best(double (*best)[2], int n, int round, int v, const double *t) {
    for (int j = 0; round && j < n; j++)
        if (t[j] < best[j][v]) best[j][v] = t[j];
}

// " part old X ms, new Y ms (old -> new GFLOP/s, new/old time r)" for each of n parts, | apart,
// best[j] = {old, new} seconds of part j, flops[j] its floating-point operations
static inline void ab_print_parts(const char *const *part, int n, const double (*best)[2], const double *flops) {
    for (int j = 0; j < n; j++)
        printf("%s %s old %.2f ms, new %.2f ms (%.1f -> %.1f GFLOP/s, new/old time %.3f)", j ? " |" : "", part[j],
               best[j][0] * 1e3, best[j][1] * 1e3, flops[j] / best[j][0] / 1e9, flops[j] / best[j][1] / 1e9,
               best[j][1] / best[j][0]);
    printf("\n");
}

#endif
