// Row tiles of the grouped expert matmuls of the CUDA kernel (kernels/cuda_moe_grouped.cu): one
// thread block per tile (the CPU op cuts its own, even parts that stay over OpenBLAS's
// small-matrix bound, layers/cpu_moe.c). The expert row offsets live in backend memory
// (moe_dispatch wrote them), so a device launch cannot know how many tiles there are: it launches
// moe_row_tiles_bound blocks and each finds its (expert, first row) with moe_row_tile, or learns
// that it has none.
//
// Tile t of `rows` rows: the experts' rows are cut into ceil(n_e / rows) tiles each, in expert
// order, the last tile of an expert possibly short; tiles never straddle two experts, so each is
// one dense product against one weight. Over all experts there are at most
// ceil(R / rows) + E tiles (each expert adds at most one short tile).
#ifndef CLLA_BACKEND_MOE_TILES_H
#define CLLA_BACKEND_MOE_TILES_H

#include <stddef.h>

#ifdef __CUDACC__
#define MOE_TILES_HD __host__ __device__
#else
#define MOE_TILES_HD
#endif

// Blocks a launch over the row tiles of R rows, E experts, needs at most (R, E >= 0, rows > 0).
static inline MOE_TILES_HD long long moe_row_tiles_bound(int R, int E, int rows) {
    return ((long long)R + rows - 1) / rows + E;
}

// Tile t of off (E+1 row offsets, nondecreasing, off[0] = 0): 1 and its expert, first row and
// row count (1..rows), or 0 when t is past the last tile. A scan over the experts: E is at most a
// few hundred, against the thousands of multiply-adds per row of the tile's product.
static inline MOE_TILES_HD int moe_row_tile(const int *off, int E, int rows, long long t, int *expert, int *row0,
                                            int *n) {
    if (t < 0) return 0;
    for (int e = 0; e < E; e++) {
        const int ne = off[e + 1] - off[e];
        const long long tiles = ((long long)ne + rows - 1) / rows;
        if (t < tiles) {
            *expert = e;
            *row0 = off[e] + (int)(t * rows);
            const int left = off[e + 1] - *row0;
            *n = left < rows ? left : rows;
            return 1;
        }
        t -= tiles;
    }
    return 0;
}

#endif
