// The arithmetic of the gradient norm's sum of squares, in one place: the CPU backends' sumsq
// (layers/cpu_adamw.c) and ZeRO-1's norm from the blocks of each rank's shard
// (train/grad_sync.c) must give the same bits, so both sum with these.
//
// Fixed blocks of SUMSQ_BLOCK elements: the result depends on them, never on the thread count or
// the sharding (each block summed by sumsq_block, then the block sums added in index order).
#ifndef CLLA_COMMON_SUMSQ_H
#define CLLA_COMMON_SUMSQ_H

#include <stddef.h>

#define SUMSQ_BLOCK ((size_t)4096)

// Eight running sums (element i into sum i mod 8) added pairwise, in this order. One dependent
// chain of double adds was latency-bound, a few cycles per element; layers/cpu_rmsnorm.c sums
// its rows the same way.
static inline double sum8_pairwise(const double s[8]) {
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// sum of g[i]^2 in double, in eight running sums (sum8_pairwise)
static inline double sumsq_block(const float *g, size_t n) {
    double s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += (double)g[i + j] * g[i + j];
    for (int j = 0; i < n; i++, j++) s[j] += (double)g[i] * g[i];
    return sum8_pairwise(s);
}

#endif
