// The tile products of the CPU attention (layers/cpu_attention.c): one thread, operands that
// are strided views of the activations, up to 128 x 128 outputs, inner dimensions from 1 to a
// few hundred. OpenBLAS's sgemm packs both operands on every call, which at these sizes cost
// about a sixth of the attention op (perf of build/bench/bench_attention); this register-blocked
// kernel reads them where they lie:
//
//   C[i][j] (=, +=) alpha * sum_p A(i, p) B[p][j]     for p in [lo(i), hi(i)) of [0, k)
//
// A(i, p) = a[i * a_row + p * a_col] (a row-major matrix, a_col = 1, or the transpose of one,
// a_row = 1), B row-major. Blocks of 6 rows x 16 columns (12 accumulators of 8 lanes, two rows
// of B and one broadcast of A: 15 of the 16 vector registers of AVX2), then 6 x 8, then single
// columns; the rows left over by 6 go through the same blocks with fewer rows. Each output is
// one chain of fused multiply-adds over p ascending (the file is compiled with
// -ffp-contract=fast), the same whatever block it falls in, so results depend only on the
// operands, never on the tile position or the thread.
//
// Causal ranges (the probabilities and score gradients of a diagonal tile are exact zeros past
// the diagonal, so their terms can be left out without changing a bit): kr.mode UPTO limits row
// i to p <= i + kr.diag, FROM to p >= i - kr.diag; a block of rows takes the union of its rows'
// ranges (extra terms are zeros). And blocks of C wholly past the diagonal (j > i + skip_diag for
// every entry) are not computed but filled with skip_value (the scores' -inf).
#include "layers/cpu_ops.h"

#include <limits.h>

#include "layers/cpu_vec.h"

#define MR 6    // rows of a block
// vectors of 8 columns in a wide block: 12 accumulators fit AVX2's 16 vector registers (4, with
// 24 accumulators in AVX-512VL's 32 registers, measured slower: build/bench/bench_attention)
#define NW 2
#define NR (NW * VEC_LANES)

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

// One block: rows [i0, i0 + R) x columns [j0, j0 + 8 NV), p in [p0, p1). The accumulators are
// named per row and vector (not an array), and A's rows are walked by one pointer: with an array
// GCC kept a row of B on the stack and reloaded it for every multiply-add.
static inline __attribute__((always_inline)) void block(float *c, int ldc, const float *a, int a_row, int a_col,
                                                        const float *b, int ldb, int i0, int j0, int p0, int p1,
                                                        float alpha, int accumulate, const int R, const int NV) {
#define ZERO4(r) vecf r##0 = {0}, r##1 = {0}, r##2 = {0}, r##3 = {0};
    ZERO4(c0) ZERO4(c1) ZERO4(c2) ZERO4(c3) ZERO4(c4) ZERO4(c5)
#undef ZERO4
    const float *ar = a + (size_t)i0 * a_row + (size_t)p0 * a_col;
    const size_t sr = (size_t)a_row, sp = (size_t)a_col;
    const float *bp = b + (size_t)p0 * ldb + j0;
    for (int p = p0; p < p1; p++, ar += sp, bp += ldb) {
        const vecf b0 = vec_load(bp), b1 = NV > 1 ? vec_load(bp + VEC_LANES) : b0;
        const vecf b2 = NV > 2 ? vec_load(bp + 2 * VEC_LANES) : b0, b3 = NV > 3 ? vec_load(bp + 3 * VEC_LANES) : b0;
#define ROW(r)                                  \
        if (R > r) {                            \
            const vecf w = vec_splat(ar[r * sr]); \
            c##r##0 += w * b0;                  \
            if (NV > 1) c##r##1 += w * b1;      \
            if (NV > 2) c##r##2 += w * b2;      \
            if (NV > 3) c##r##3 += w * b3;      \
        }
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
    }
    const vecf al = vec_splat(alpha);
    // the same expression as the single columns' below
#define OUT1(r, v) \
    if (NV > v) vec_store(cr + v * VEC_LANES, accumulate ? vec_load(cr + v * VEC_LANES) + al * c##r##v : al * c##r##v);
#define OUT(r)                                                \
    if (R > r) {                                              \
        float *cr = c + (size_t)(i0 + r) * ldc + j0;          \
        OUT1(r, 0) OUT1(r, 1) OUT1(r, 2) OUT1(r, 3)           \
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)
#undef OUT
#undef OUT1
}

// Rows [i0, i0 + R) x the columns from j0 to n: wide blocks, one narrow block, single columns.
static inline __attribute__((always_inline)) void row_block(float *c, int ldc, const float *a, int a_row, int a_col,
                                                            const float *b, int ldb, int n, int i0, int p0, int p1,
                                                            float alpha, int accumulate, int skip_diag, float skip_value,
                                                            const int R) {
    // columns from `last` on are past the diagonal for every row of the block
    const long long last = (long long)i0 + R + skip_diag;
    int j = 0;
    for (; j + NR <= n && j < last; j += NR) block(c, ldc, a, a_row, a_col, b, ldb, i0, j, p0, p1, alpha, accumulate, R, NW);
    for (; j + VEC_LANES <= n && j < last; j += VEC_LANES)
        block(c, ldc, a, a_row, a_col, b, ldb, i0, j, p0, p1, alpha, accumulate, R, 1);
    for (; j < n && j < last; j++)
        for (int r = 0; r < R; r++) {
            const float *ai = a + (size_t)(i0 + r) * a_row;
            float s = 0.0f;
            for (int p = p0; p < p1; p++) s += ai[(size_t)p * a_col] * b[(size_t)p * ldb + j];
            float *y = c + (size_t)(i0 + r) * ldc + j;
            *y = accumulate ? *y + alpha * s : alpha * s;
        }
    for (; j < n; j++)   // past the diagonal
        for (int r = 0; r < R; r++) c[(size_t)(i0 + r) * ldc + j] = skip_value;
}

void cpu_tile_mm(float *c, int ldc, const float *a, int a_row, int a_col, const float *b, int ldb, int m, int n, int k,
                 float alpha, int accumulate, TileRange kr, int skip_diag, float skip_value) {
    for (int i0 = 0; i0 < m; i0 += MR) {
        const int R = imin(MR, m - i0);
        int p0 = 0, p1 = k;
        if (kr.mode == TILE_K_UPTO) p1 = imax(0, imin(k, i0 + R + kr.diag));   // p <= (last row) + diag
        if (kr.mode == TILE_K_FROM) p0 = imin(k, imax(0, i0 - kr.diag));       // p >= (first row) - diag
        if (p1 < p0) p1 = p0;
        switch (R) {
        case 6: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 6); break;
        case 5: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 5); break;
        case 4: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 4); break;
        case 3: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 3); break;
        case 2: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 2); break;
        default: row_block(c, ldc, a, a_row, a_col, b, ldb, n, i0, p0, p1, alpha, accumulate, skip_diag, skip_value, 1); break;
        }
    }
}
