// Warp-level bf16 matrix products on tensor cores through PTX (sm_80 and later): ldmatrix to
// load 16 x 16 operand tiles from shared memory, mma.sync m16n8k16 to multiply, with the
// fragment layouts the PTX ISA documents ("Matrix Fragments for mma.m16n8k16"), so that kernels
// can work on accumulator elements in registers (softmax rows, P -> bf16 A operand) without a
// trip through shared memory. Used by kernels/cuda_attention_tc.cu.
//
// Lane l of a warp, g = l / 4 ("group"), c = l % 4:
//   A (16 x 16, 4 registers of two bf16): a[0] = row g, cols 2c, 2c+1; a[1] = row g+8, same cols;
//       a[2] = row g, cols 2c+8, 2c+9; a[3] = row g+8, cols 2c+8, 2c+9 (lower column in the low half)
//   B (16 x 8, 2 registers): b[0] = rows (k) 2c, 2c+1 of col (n) g; b[1] = rows 2c+8, 2c+9
//   C, D (16 x 8 fp32, 4 floats): d[0], d[1] = row g, cols 2c, 2c+1; d[2], d[3] = row g+8, same
// so the C of two adjacent n-tiles (16 columns) is, packed to bf16, the A of a product whose k runs
// over those 16 columns (mma_pack_tile).
#ifndef CLLA_KERNELS_CUDA_MMA_CUH
#define CLLA_KERNELS_CUDA_MMA_CUH

#include "kernels/cuda_common.cuh"

#include <stdint.h>

// d (16 x 8) += a (16 x 16) b (16 x 8), fp32 accumulate.
static __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices from shared memory, lanes 8i..8i+7 giving the row addresses of matrix i
// (16-byte aligned rows); r[i] = matrix i's row l / 4, columns 2(l % 4), +1. With trans, matrix i
// transposed: r[i] = its rows 2(l % 4), +1 of column l / 4.
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// The lane's row address for ldsm_x4 of the 16 x 16 tile at (row0, col0) of a row-major bf16
// matrix (ld elements a row), loaded as an A operand (rows of A = rows of the matrix), or with
// ldsm_x4_trans as the B operands of two adjacent n-tiles when the matrix is k x n (rows = k):
// r[0], r[1] = b[0], b[1] of columns col0..col0+7, r[2], r[3] of col0+8..col0+15.
static __device__ __forceinline__ const bf16 *mma_addr_a(const bf16 *m, int ld, int row0, int col0, int lane) {
    return m + (size_t)(row0 + (lane & 15)) * ld + col0 + ((lane >> 4) << 3);
}

// The lane's row address for ldsm_x4 (no trans) of B operands from an n x k row-major matrix
// (B[k][n] = m[n][k], as K is for S = Q K^T): 16 rows (two n-tiles) from row0, k from col0..+15;
// r[0], r[1] = b[0], b[1] of n-tile rows row0..row0+7, r[2], r[3] of row0+8..row0+15.
static __device__ __forceinline__ const bf16 *mma_addr_bt(const bf16 *m, int ld, int row0, int col0, int lane) {
    return m + (size_t)(row0 + (lane & 7) + ((lane >> 4) << 3)) * ld + col0 + (((lane >> 3) & 1) << 3);
}

// Two floats as one register of two bf16 (round to nearest even), lo in the low half.
static __device__ __forceinline__ uint32_t mma_pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

// Values x laid out as n-tile j's accumulator (x[0], x[1] row g, x[2], x[3] row g + 8), rounded
// to bf16 into the A operands a of a product whose k runs over the tiles' columns: tile 2i fills
// columns 0..7 of a[i] (a[i][0], a[i][1]), tile 2i + 1 columns 8..15 (a[i][2], a[i][3]).
template <int N>
static __device__ __forceinline__ void mma_pack_tile(uint32_t (&a)[N][4], int j, const float (&x)[4]) {
    a[j >> 1][(j & 1) * 2] = mma_pack_bf16(x[0], x[1]);
    a[j >> 1][(j & 1) * 2 + 1] = mma_pack_bf16(x[2], x[3]);
}

#endif
