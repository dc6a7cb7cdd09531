// The row offsets of a random top-K routing, as a router makes at initialization: each of T
// tokens picks K distinct experts of E uniformly, so the experts' row counts differ by chance
// (bench/ab/ab_moe.c, bench/bench_gpu.c --only experts). K <= E.
#ifndef CLLA_BENCH_RANDOM_ROUTING_H
#define CLLA_BENCH_RANDOM_ROUTING_H

#include <stdint.h>
#include <stdlib.h>

#include "common/rng.h"
#include "common/util.h"

// off (E + 1): expert e's rows are [off[e], off[e + 1]); *fewest, *most: the smallest and largest count.
static inline void random_routing_offsets(int *off, int T, int E, int K, Rng *rng, int *fewest, int *most) {
    char *taken = xcalloc((size_t)E, 1);
    int *count = xcalloc((size_t)E, sizeof(int));
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) taken[e] = 0;
        for (int k = 0; k < K; k++) {
            int e;
            do e = (int)(rng_next(rng) % (uint64_t)E); while (taken[e]);
            taken[e] = 1;
            count[e]++;
        }
    }
    off[0] = 0;
    *fewest = T;
    *most = 0;
    for (int e = 0; e < E; e++) {
        off[e + 1] = off[e] + count[e];
        *fewest = count[e] < *fewest ? count[e] : *fewest;
        *most = count[e] > *most ? count[e] : *most;
    }
    free(taken);
    free(count);
}

#endif
