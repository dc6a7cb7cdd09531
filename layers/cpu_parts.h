// Cutting the M rows of one sgemm into parts (one per thread, or the tiles of the MoE's expert
// products) so that every element gets the bits of the whole product in one single-threaded
// call, whatever the number of parts: the bits of a CPU run do not follow the thread count
// (docs/DESIGN.md section 6). Two rules, each found by a test that failed without it:
//  - every part is over OpenBLAS's small-matrix bound (CPU_SGEMM_SMALL_MNK, cpu_ops.h), or there
//    is one part: the small kernels give a row bits that depend on where the row sits in the
//    product (tests/test_ops.c);
//  - parts start at multiples of CPU_PART_ALIGN rows: the blocked kernels of OpenBLAS's Haswell
//    and Zen sgemm (machines with AVX2 but not AVX-512) give a row the bits of its place within
//    their unroll of 12 rows, and the SkylakeX kernels' bits depend on no place at all
//    (tests/CMakeLists.txt runs test_ops and test_moe on the Haswell kernels as well).
#ifndef CLLA_LAYERS_CPU_PARTS_H
#define CLLA_LAYERS_CPU_PARTS_H

#include "layers/cpu_ops.h"

#define CPU_PART_ALIGN 12

// First row of part i of `parts` over n rows (the last part ends at n).
static inline int cpu_part_start(int n, int parts, int i) {
    const long long units = ((long long)n + CPU_PART_ALIGN - 1) / CPU_PART_ALIGN, u = units * i / parts * CPU_PART_ALIGN;
    return u < n ? (int)u : n;
}

// Parts of n rows, each row costing per_row multiply-adds: want, or fewer where a part would fall
// under the small-matrix bound (1 when any two would).
static inline int cpu_parts(int n, int want, double per_row) {
    int p = want;
    for (; p > 1; p--) {
        int ok = 1;
        for (int i = 0; i < p && ok; i++) ok = (double)(cpu_part_start(n, p, i + 1) - cpu_part_start(n, p, i)) * per_row > CPU_SGEMM_SMALL_MNK;
        if (ok) break;
    }
    return p < 1 ? 1 : p;
}

#endif
