// Grouped expert matmuls on tensor cores with the row offsets in device memory (the contract of
// moe_expert_matmul_* in backend/backend.h): one launch per product for all experts, sized by a
// bound the host knows (backend/moe_tiles.h), so the MoE layer queues without waiting for the
// dispatch to come back (model/moe.c). bf16 operands, fp32 accumulators, the rounding of the
// cuBLASLt products they replace (kernels/cuda_matmul.cu): out rounded once, dinp += the fp32
// product rounded once, dW += in fp32.
//
//   forward  out (rows of e, OC) = inp rows (.., C) W_e^T    grid (row tiles bound, OC / 128)
//   dinp     dinp rows (.., C) += dout rows (.., OC) W_e     grid (row tiles bound, C / 128)
//   dW       dW_e (OC, C) += dout rows^T inp rows            grid (E x OC / 128, C / 128)
//
// A block computes a 128 x 128 tile of its product with 8 warps (4 along M, 2 along N: 32 x 64
// each, two m16 tiles by eight n8 tiles of mma.sync m16n8k16), walking K in slabs of 32 that
// come into shared memory by cp.async, double-buffered: the next slab loads while this one
// multiplies. The operand fragments come from shared memory by ldmatrix in the layouts of
// kernels/cuda_mma.cuh; the dW product's A operand (dout^T) is stored k-major and loaded
// transposed. Row tiles of the first two products never straddle experts (moe_row_tile finds a
// block's expert and rows from the offsets, or that it has none); every output element is
// written by one thread, once, in a fixed order of K: bitwise repeatable.
//
// The kernels need C and OC multiples of 8 and 16-byte aligned buffers (a 16-byte copy is whole
// inside a row or whole outside it), and at most GROUPED_MAX_E experts (the weight pointers
// travel as a kernel parameter); cuda_moe_grouped_fits says whether a call qualifies.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_mma.cuh"
#include "kernels/cuda_moe_grouped.cuh"

#include "backend/moe_tiles.h"

#define GM 128            // block tile rows (M)
#define GN 128            // block tile columns (N)
#define GK 32             // K slab
#define GPAD 8            // bf16 row padding: 16-byte rows for ldmatrix, banks spread
#define G_WARPS 8
#define G_THREADS (32 * G_WARPS)
// bf16 elements of one buffer of an operand tile, the larger of its two layouts: m-major
// (GM rows of GK + GPAD) and k-major (GK rows of GM + GPAD)
#define G_TILE_ELEMS (GM * (GK + GPAD) > GK * (GM + GPAD) ? GM * (GK + GPAD) : GK * (GM + GPAD))

// The experts' weight (or weight-gradient) pointers, by value: no copy to the device per call.
struct ExpertPtrs {
    const void *p[GROUPED_MAX_E];
};

enum { G_FORWARD, G_DINP, G_DW };

// Starts copying a rows x cols block of a row-major bf16 matrix (src at its first element, ld
// elements a row) into dst (dst_ld), zeros outside rows_valid x cols_valid. cols % 8 == 0.
template <int ROWS, int COLS>
static __device__ __forceinline__ void load_block(bf16 *dst, int dst_ld, const bf16 *src, size_t ld, int rows_valid,
                                                  int cols_valid) {
    constexpr int VECS = COLS / 8;
    for (int i = threadIdx.x; i < ROWS * VECS; i += G_THREADS) {
        const int r = i / VECS, c = (i % VECS) * 8;
        const int in = r < rows_valid && c < cols_valid;
        const bf16 *s = in ? src + (size_t)r * ld + c : src;   // 0 bytes read when out
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + r * dst_ld + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(in ? 16 : 0));
    }
}

static __device__ __forceinline__ void slab_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void slab_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// What one block multiplies: the A and B operands at the block's corner, the extents, and where
// the K walk starts. A is m-major (rows = M, K contiguous) or k-major (rows = K, M contiguous);
// B is n-major (rows = N, K contiguous) or k-major (rows = K, N contiguous).
struct GroupedTile {
    const bf16 *a, *b;
    size_t lda, ldb;
    int m, n, k;   // valid rows of A's M, columns of N, and K from the corner
};

// Loads K slab kt of a tile into buffer `buf` of As, Bs.
template <int MODE>
static __device__ __forceinline__ void load_slab(bf16 *As, bf16 *Bs, const GroupedTile &t, int kt) {
    const int k0 = kt * GK, kv = t.k - k0;
    if (MODE == G_DW)   // A = dout rows: k-major, GK rows of GM
        load_block<GK, GM>(As, GM + GPAD, t.a + (size_t)k0 * t.lda, t.lda, kv, t.m);
    else                // A = inp or dout rows: m-major, GM rows of GK
        load_block<GM, GK>(As, GK + GPAD, t.a + k0, t.lda, t.m, kv);
    if (MODE == G_FORWARD)   // B = W_e (OC, C): n-major
        load_block<GN, GK>(Bs, GK + GPAD, t.b + k0, t.ldb, t.n, kv);
    else                     // B = W_e (OC, C) as K x N, or inp rows: k-major
        load_block<GK, GN>(Bs, GN + GPAD, t.b + (size_t)k0 * t.ldb, t.ldb, kv, t.n);
}

// acc += the warp's 32 x 64 piece of A B over one K slab in shared memory.
template <int MODE>
static __device__ __forceinline__ void mma_slab(float (&acc)[2][8][4], const bf16 *As, const bf16 *Bs, int wm, int wn,
                                                int lane) {
#pragma unroll
    for (int kk = 0; kk < GK / 16; kk++) {
        uint32_t fa[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int m0 = wm * 32 + mi * 16;
            if (MODE == G_DW) ldsm_x4_trans(fa[mi], mma_addr_bt(As, GM + GPAD, kk * 16, m0, lane));
            else ldsm_x4(fa[mi], mma_addr_a(As, GK + GPAD, m0, kk * 16, lane));
        }
#pragma unroll
        for (int nj = 0; nj < 4; nj++) {
            const int n0 = wn * 64 + nj * 16;
            uint32_t fb[4];
            if (MODE == G_FORWARD) ldsm_x4(fb, mma_addr_bt(Bs, GK + GPAD, n0, kk * 16, lane));
            else ldsm_x4_trans(fb, mma_addr_a(Bs, GN + GPAD, kk * 16, n0, lane));
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                mma_16816(acc[mi][2 * nj], fa[mi], fb[0], fb[1]);
                mma_16816(acc[mi][2 * nj + 1], fa[mi], fb[2], fb[3]);
            }
        }
    }
}

// The block's whole K walk: acc = A B for its tile.
template <int MODE>
static __device__ __forceinline__ void grouped_tile_product(float (&acc)[2][8][4], const GroupedTile &t) {
    __shared__ __align__(128) bf16 As[2][G_TILE_ELEMS];
    __shared__ __align__(128) bf16 Bs[2][G_TILE_ELEMS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp & 3, wn = warp >> 2;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.0f;
    const int nk = (t.k + GK - 1) / GK;
    if (nk == 0) return;
    load_slab<MODE>(As[0], Bs[0], t, 0);
    slab_commit();
    for (int kt = 0; kt < nk; kt++) {
        slab_wait();
        __syncthreads();   // slab kt landed for every thread; nobody reads the other buffers any more
        if (kt + 1 < nk) {
            load_slab<MODE>(As[(kt + 1) & 1], Bs[(kt + 1) & 1], t, kt + 1);
            slab_commit();
        }
        mma_slab<MODE>(acc, As[kt & 1], Bs[kt & 1], wm, wn, lane);
    }
}

// This lane's accumulator element (mi, j, h, i): row wm*32 + mi*16 + g + 8h, column wn*64 + 8j +
// 2c + i of the block tile (cuda_mma.cuh's C layout), visited pairwise (i = 0, 1 together).
template <typename F>
static __device__ __forceinline__ void for_each_pair(const float (&acc)[2][8][4], F f) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                f(wm * 32 + mi * 16 + g + 8 * h, wn * 64 + 8 * j + 2 * c, acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
}

// out rows of expert e (bf16, one rounding) = inp rows W_e^T, or dinp rows += dout rows W_e.
template <int MODE>
__global__ void __launch_bounds__(G_THREADS) grouped_rows_kernel(bf16 *out, const bf16 *in, const int *off, int E,
                                                                 int C, int OC, ExpertPtrs w) {
    int e, r0, rows;
    if (!moe_row_tile(off, E, GM, blockIdx.x, &e, &r0, &rows)) return;   // uniform over the block
    const int n0 = blockIdx.y * GN;
    // forward: M = rows, N = OC, K = C; dinp: M = rows, N = C, K = OC
    const int ncols = MODE == G_FORWARD ? OC : C, kdim = MODE == G_FORWARD ? C : OC;
    const bf16 *we = (const bf16 *)w.p[e];
    GroupedTile t;
    t.a = in + (size_t)r0 * kdim;
    t.lda = (size_t)kdim;
    t.b = MODE == G_FORWARD ? we + (size_t)n0 * C : we + n0;
    t.ldb = (size_t)C;
    t.m = rows;
    t.n = ncols - n0;
    t.k = kdim;
    float acc[2][8][4];
    grouped_tile_product<MODE>(acc, t);
    for_each_pair(acc, [&](int r, int col, float x0, float x1) {
        if (r >= rows || n0 + col >= ncols) return;   // ncols % 8 == 0: col + 1 is inside too
        __nv_bfloat162 *p = (__nv_bfloat162 *)(out + (size_t)(r0 + r) * ncols + n0 + col);
        if (MODE == G_FORWARD) {
            *p = __floats2bfloat162_rn(x0, x1);
        } else {
            const float2 old = __bfloat1622float2(*p);
            *p = __floats2bfloat162_rn(old.x + x0, old.y + x1);
        }
    });
}

// dW_e (OC, C) f32 += dout rows^T inp rows, over expert e's rows.
__global__ void __launch_bounds__(G_THREADS) grouped_dw_kernel(const bf16 *dout, const bf16 *inp, const int *off,
                                                               int C, int OC, ExpertPtrs dw) {
    const int mtiles = (OC + GM - 1) / GM;
    const int e = blockIdx.x / mtiles, m0 = (blockIdx.x % mtiles) * GM, n0 = blockIdx.y * GN;
    const int r0 = off[e], rows = off[e + 1] - r0;
    if (rows <= 0) return;   // an expert without rows adds nothing (uniform over the block)
    GroupedTile t;
    t.a = dout + (size_t)r0 * OC + m0;   // k-major: row = one of the expert's rows, M = OC contiguous
    t.lda = (size_t)OC;
    t.b = inp + (size_t)r0 * C + n0;     // k-major: N = C contiguous
    t.ldb = (size_t)C;
    t.m = OC - m0;
    t.n = C - n0;
    t.k = rows;
    float acc[2][8][4];
    grouped_tile_product<G_DW>(acc, t);
    float *d = (float *)dw.p[e];
    for_each_pair(acc, [&](int r, int col, float x0, float x1) {
        if (m0 + r >= OC || n0 + col >= C) return;
        float *p = d + (size_t)(m0 + r) * C + n0 + col;
        p[0] += x0;
        p[1] += x1;
    });
}

// out rows [off[E], R) of a width-wide bf16 row buffer = 0.
__global__ void grouped_zero_tail_kernel(bf16 *out, const int *off, int E, int R, int width) {
    const size_t start = (size_t)off[E] * width, end = (size_t)R * width;
    for (size_t i = start + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < end; i += (size_t)gridDim.x * blockDim.x)
        out[i] = to_bf16(0.0f);
}

// ------------------------------------------------------------------ host side

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int cuda_moe_grouped_fits(int E, int C, int OC, const void *const *bufs, int nbufs, const void *const *weights) {
    if (E <= 0 || E > GROUPED_MAX_E || C <= 0 || OC <= 0 || C % 8 != 0 || OC % 8 != 0) return 0;
    if ((long long)E * ((OC + GM - 1) / GM) > 0x7fffffffLL || (C + GN - 1) / GN > 65535 || (OC + GN - 1) / GN > 65535)
        return 0;
    for (int i = 0; i < nbufs; i++)
        if (bufs[i] && !aligned16(bufs[i])) return 0;
    for (int e = 0; weights && e < E; e++)
        if (!aligned16(weights[e])) return 0;
    return 1;
}

static ExpertPtrs expert_ptrs(const void *const *p, int E) {
    ExpertPtrs w;
    for (int e = 0; e < GROUPED_MAX_E; e++) w.p[e] = e < E ? p[e] : NULL;
    return w;
}

static unsigned row_tile_blocks(int R, int E) {
    const long long n = moe_row_tiles_bound(R, E, GM);
    if (n > 0x7fffffffLL) die("moe grouped matmul: %lld row tiles exceed a grid (R=%d, E=%d)", n, R, E);
    return (unsigned)n;
}

void cuda_moe_grouped_forward(bf16 *out, const bf16 *inp, const bf16 *const *weights, const int *off, int E, int R,
                              int C, int OC) {
    if (R <= 0) return;
    const dim3 grid(row_tile_blocks(R, E), (unsigned)((OC + GN - 1) / GN));
    grouped_rows_kernel<G_FORWARD><<<grid, G_THREADS>>>(out, inp, off, E, C, OC, expert_ptrs((const void *const *)weights, E));
    CUDA_LAUNCHED();
    grouped_zero_tail_kernel<<<ew_blocks((size_t)R * OC, 256), 256>>>(out, off, E, R, OC);
    CUDA_LAUNCHED();
}

void cuda_moe_grouped_backward(bf16 *dinp, float *const *dweights, const bf16 *dout, const bf16 *inp,
                               const bf16 *const *weights, const int *off, int E, int R, int C, int OC) {
    if (R <= 0) return;
    if (dinp) {
        const dim3 grid(row_tile_blocks(R, E), (unsigned)((C + GN - 1) / GN));
        grouped_rows_kernel<G_DINP><<<grid, G_THREADS>>>(dinp, dout, off, E, C, OC,
                                                         expert_ptrs((const void *const *)weights, E));
        CUDA_LAUNCHED();
    }
    if (dweights) {
        const dim3 grid((unsigned)(E * ((OC + GM - 1) / GM)), (unsigned)((C + GN - 1) / GN));
        grouped_dw_kernel<<<grid, G_THREADS>>>(dout, inp, off, C, OC, expert_ptrs((const void *const *)dweights, E));
        CUDA_LAUNCHED();
    }
}
