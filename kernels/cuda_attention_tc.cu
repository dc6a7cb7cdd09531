// Causal attention on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), in the manner of
// FlashAttention-2: the contract and layouts of kernels/cuda_attention.cu, which dispatches here
// when the shape allows (cuda_attention_tc_fits) and keeps its one-warp-per-row kernels for the
// rest (head widths not a multiple of 16 or beyond 192 / 128, unaligned buffers).
//
// A block is ATT_TC_WARPS warps; warp w owns 16 consecutive rows of the block's 64-row tile. Tiles
// of K and V (and Q, dO in the backward) come into shared memory by cp.async, the tiles the loop
// walks over double-buffered; operands go from shared memory to registers by ldmatrix. Scores,
// probabilities and the output accumulators (O, dQ, dK, dV) stay in registers, in the fragment
// layouts of kernels/cuda_mma.cuh: each lane holds two rows (g and g + 8) of a warp's 16, so a row's
// maximum and sum take two shuffles, and P and dS become the A operand of the next product
// without leaving registers. Rounding as in the warp kernels and the CPU op: P is rounded to bf16
// for P V and dV, dS for dQ and dK, lse sums the unrounded P; every output row is written by one
// warp and added to the bf16 gradient once, so the result does not depend on the schedule
// (bitwise repeatable). Exponentials are exp2f of scores scaled by log2(e).
//
//   forward   grid (query tiles, B NH): S = Q K^T, online softmax, O = O alpha + P V
//   dQ        grid (query tiles, B NH): S, dP = dO V^T, dS = P (dP - Delta), dQ += dS K
//   dK, dV    grid (key tiles, B NKV):  over the group's heads and the query tiles at or after the
//             key tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
// Query tiles run heaviest first (the causal triangle gives the last tile the most keys). The
// register arrays need sizes known when compiling, so each kernel is instantiated for head widths
// up to 64, 128 or 192 (queries and keys) and 64 or 128 (values), a table of six.
#include "kernels/cuda_attention_tc.cuh"
#include "kernels/backend_cuda.h"
#include "kernels/cuda_mma.cuh"

#include <stdlib.h>
#include <string.h>

#define TILE 64                      // rows of a query or key tile
#define ATT_TC_WARPS (TILE / 16)     // 4 warps, 16 rows each
#define ATT_TC_THREADS (32 * ATT_TC_WARPS)
#define PAD_H 8                      // bf16 row padding: 16-byte rows for ldmatrix, and banks spread
#define TC_MAX_DQK CUDA_ATTENTION_TC_MAX_DQK   // the widest instantiation (tc_forward_kernels...), 192
#define TC_MAX_DV CUDA_ATTENTION_TC_MAX_DV     // 128
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Shared-memory carving: regions 128-byte aligned.
static __host__ __device__ __forceinline__ size_t carve(size_t *off, size_t bytes) {
    const size_t at = *off;
    *off = at + ((bytes + 127) & ~(size_t)127);
    return at;
}

// Shapes of the shared regions, one struct for host sizing and device carving.
struct TcLayout {
    int dqk, dv;
    __host__ __device__ int ldq() const { return dqk + PAD_H; }
    __host__ __device__ int ldv() const { return dv + PAD_H; }
};

enum { TC_FORWARD, TC_DQ, TC_DKV };

// Where each kernel's shared regions start (bytes from the base) and how many bytes they take in
// all: the one definition the kernels carve from and the host sizes the launch with. Regions a
// kernel does not have stay 0. q, k, v, g (dO): bf16 tiles; lse, del (Delta): a query tile's
// row values. The tiles a loop walks over have two buffers, the next tile loading while this
// one is used (tile_buffer): K and V in the forward and dQ, Q, dO, lse and Delta in dK, dV. The
// forward stages its Q rows in K's second buffer before its loop.
struct TcSmem {
    size_t q, k, v, g, lse, del, total;
};

static __host__ __device__ TcSmem tc_smem(int kind, int DQK, int DV) {
    const TcLayout L = {DQK, DV};
    const size_t tq = (size_t)TILE * L.ldq() * 2, tv = (size_t)TILE * L.ldv() * 2, row = (size_t)TILE * 4;
    TcSmem m = {0, 0, 0, 0, 0, 0, 0};
    size_t off = 0;
    if (kind == TC_FORWARD) {
        m.k = carve(&off, 2 * tq); m.v = carve(&off, 2 * tv);
    } else if (kind == TC_DQ) {
        m.q = carve(&off, tq); m.g = carve(&off, tv); m.k = carve(&off, 2 * tq); m.v = carve(&off, 2 * tv);
    } else {
        m.k = carve(&off, tq); m.v = carve(&off, tv); m.q = carve(&off, 2 * tq); m.g = carve(&off, 2 * tv);
        m.lse = carve(&off, 2 * row); m.del = carve(&off, 2 * row);
    }
    m.total = off;
    return m;
}

// Starts copying rows [row0, row0 + TILE) of a (T, stride) bf16 matrix, `width` columns, into dst
// (ld), zeros past T, with cp.async (sm_80 and later): every thread's 16-byte pieces in flight at
// once, no registers in between. width % 8 == 0 and base 16-byte aligned (cuda_attention_tc_fits).
// The copies land after tile_wait and a __syncthreads.
static __device__ __forceinline__ void load_tile(bf16 *dst, int ld, const bf16 *base, size_t stride, int row0, int T,
                                                 int width) {
    const int vecs = width / 8;
    for (int i = threadIdx.x; i < TILE * vecs; i += blockDim.x) {
        const int r = i / vecs, c = (i % vecs) * 8, in = row0 + r < T;
        const bf16 *src = in ? base + (size_t)(row0 + r) * stride + c : base;   // 0 bytes read when out
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + (size_t)r * ld + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(in ? 16 : 0));
    }
}

// The same for TILE fp32 row values src[row0..] (lse, Delta), zeros past T.
static __device__ __forceinline__ void load_row_values(float *dst, const float *src, int row0, int T) {
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
        const int in = row0 + i < T;
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + i);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(in ? src + row0 + i : src),
                     "r"(in ? 4 : 0));
    }
}

// Closes the group of copies started so far (tile_commit) or waits for all of this thread's.
static __device__ __forceinline__ void tile_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void tile_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Buffer i % 2 of a double-buffered region of `size` elements a buffer.
template <typename E>
static __device__ __forceinline__ E *tile_buffer(E *region, size_t size, int i) {
    return region + (size_t)(i & 1) * size;
}

// The forward's and dQ's loop step over key tiles: waits for tile kt of K and V (and whatever
// else this thread started before) and, every thread past the barrier, so no longer reading the
// other buffers, starts loading tile kt + 1 into them unless kt is the last, qt.
static __device__ __forceinline__ void next_kv_tile(bf16 *Ks, bf16 *Vs, const TcLayout &L, const bf16 *kb,
                                                    const bf16 *vb, int NKV, int kt, int qt, int T) {
    tile_wait();
    __syncthreads();
    if (kt < qt) {
        const int s1 = (kt + 1) * TILE;
        load_tile(tile_buffer(Ks, (size_t)TILE * L.ldq(), kt + 1), L.ldq(), kb, (size_t)NKV * L.dqk, s1, T, L.dqk);
        load_tile(tile_buffer(Vs, (size_t)TILE * L.ldv(), kt + 1), L.ldv(), vb, (size_t)NKV * L.dv, s1, T, L.dv);
        tile_commit();
    }
}

// Zeroes fragments of accumulators.
template <int N>
static __device__ __forceinline__ void zero_acc(float (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.0f;
}

// s[j] (16 x 8: the warp's 16 rows of A against rows 8 j.. of B) = A B^T over kn <= K
// chunks of 16 columns, for 2 NP n-tiles: A (16 rows at a, lda), B (row-major, ldb), both bf16 in
// shared memory. S = Q K^T, dP = dO V^T and their transposes.
template <int K, int NP>
static __device__ __forceinline__ void mma_abt(float (&s)[2 * NP][4], int kn, const bf16 *a, int lda, const bf16 *b,
                                               int ldb, int lane) {
    zero_acc(s);
#pragma unroll
    for (int kc = 0; kc < K; kc++) {
        if (kc < kn) {
            uint32_t fa[4];
            ldsm_x4(fa, mma_addr_a(a, lda, 0, kc * 16, lane));
#pragma unroll
            for (int np = 0; np < NP; np++) {
                uint32_t fb[4];
                ldsm_x4(fb, mma_addr_bt(b, ldb, np * 16, kc * 16, lane));
                mma_16816(s[2 * np], fa, fb[0], fb[1]);
                mma_16816(s[2 * np + 1], fa, fb[2], fb[3]);
            }
        }
    }
}

// acc[j] (16 x 8 at columns 8 j) += P (16 x 16 KC, A operands in registers) @ M (16 KC x 16 n
// rows of a row-major bf16 matrix in shared memory from m, ldm), for the n <= N active 16-column
// chunks: P V, dS K, P^T dO, dS^T Q.
template <int KC, int N>
static __device__ __forceinline__ void mma_acc(float (&acc)[2 * N][4], int n, const uint32_t (&p)[KC][4], const bf16 *m,
                                               int ldm, int lane) {
#pragma unroll
    for (int kk = 0; kk < KC; kk++) {
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j < n) {
                uint32_t fb[4];
                ldsm_x4_trans(fb, mma_addr_a(m, ldm, kk * 16, j * 16, lane));
                mma_16816(acc[2 * j], p[kk], fb[0], fb[1]);
                mma_16816(acc[2 * j + 1], p[kk], fb[2], fb[3]);
            }
        }
    }
}

// Rows r0 and r0 + 8 (this lane's) of a bf16 matrix (rows of `stride` elements from dst, column 0
// of this head) += factor * acc, for the 2 n active 8-column tiles; rows at or past T are not
// written. One rounding.
template <int N>
static __device__ __forceinline__ void add_rows(bf16 *dst, size_t stride, int r0, int T, const float (&acc)[2 * N][4],
                                                int n, float factor, int lane) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = r0 + 8 * i;
        if (r >= T) continue;
        bf16 *row = dst + (size_t)r * stride + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 2 * N; j++) {
            if (j < 2 * n) {
                __nv_bfloat162 *p = (__nv_bfloat162 *)(row + 8 * j);
                const float2 old = __bfloat1622float2(*p);
                *p = __floats2bfloat162_rn(old.x + factor * acc[j][2 * i], old.y + factor * acc[j][2 * i + 1]);
            }
        }
    }
}

// ------------------------------------------------------------------ forward
template <int NQ, int NV>
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int NH, int NKV,
                            int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_FORWARD, DQK, DV);
    const int ldq = L.ldq(), ldv = L.ldv(), nq = DQK / 16, nv = DV / 16;
    const size_t kbuf = (size_t)TILE * ldq, vbuf = (size_t)TILE * ldv;
    bf16 *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE, tw = t0 + warp * 16;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * DQK, *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    // the warp's 16 query rows, staged through K's second buffer, held as A operands for the
    // whole kernel; the first K, V tile loads meanwhile
    bf16 *Qstage = tile_buffer(Ks, kbuf, 1);
    load_tile(Qstage, ldq, q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
    load_tile(Ks, ldq, kb, (size_t)NKV * DQK, 0, T, DQK);
    load_tile(Vs, ldv, vb, (size_t)NKV * DV, 0, T, DV);
    tile_commit();
    tile_wait();
    __syncthreads();
    uint32_t qa[NQ][4];
#pragma unroll
    for (int kc = 0; kc < NQ; kc++)
        if (kc < nq) ldsm_x4(qa[kc], mma_addr_a(Qstage, ldq, warp * 16, kc * 16, lane));
    float o[2 * NV][4];
    zero_acc(o);
    const float sl = scale * LOG2E;            // scores in log2 units: p = exp2(s sl - m)
    const int rows[2] = {tw + g, tw + g + 8};  // this lane's query rows
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // l: this lane's part of the row sums
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        next_kv_tile(Ks, Vs, L, kb, vb, NKV, kt, qt, T);   // tile kt here, kt + 1 loading
        const bf16 *Kt = tile_buffer(Ks, kbuf, kt), *Vt = tile_buffer(Vs, vbuf, kt);
        // S = Q K^T for the tile's 64 keys: 8 n-tiles of 8 keys
        float s[TILE / 8][4];
        zero_acc(s);
#pragma unroll
        for (int kc = 0; kc < NQ; kc++) {
            if (kc < nq) {
#pragma unroll
                for (int np = 0; np < TILE / 16; np++) {
                    uint32_t fb[4];
                    ldsm_x4(fb, mma_addr_bt(Kt, ldq, np * 16, kc * 16, lane));
                    mma_16816(s[2 * np], qa[kc], fb[0], fb[1]);
                    mma_16816(s[2 * np + 1], qa[kc], fb[2], fb[3]);
                }
            }
        }
        // online softmax of rows g, g + 8 (the four lanes of a group hold a row between them); key
        // s0 <= row is always in, so mx is finite
        const bool edge = kt == qt || s0 + TILE > T;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = s0 + 8 * j + c2 + (e & 1);
                float x = s[j][e] * sl;
                if (edge && (key > rows[e >> 1] || key >= T)) x = -INFINITY;
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
            const float mn = fmaxf(m[i], mx[i]);
            alpha[i] = exp2f(m[i] - mn);
            m[i] = mn;
        }
        uint32_t pa[TILE / 16][4];             // P as the A operand of P V, rounded to bf16
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = exp2f(s[j][e] - m[e >> 1]);
                sum[e >> 1] += p[e];
            }
            mma_pack_tile(pa, j, p);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) l[i] = l[i] * alpha[i] + sum[i];
        // O = O alpha + P V
#pragma unroll
        for (int j = 0; j < 2 * NV; j++) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
        }
        mma_acc<TILE / 16, NV>(o, nv, pa, Vt, ldv, lane);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
        l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 2);
        if (rows[i] < T) {
            if ((lane & 3) == 0) lse[((size_t)b * NH + h) * T + rows[i]] = m[i] * LN2 + logf(l[i]);
            const float inv = 1.0f / l[i];
            bf16 *orow = out + (((size_t)b * T + rows[i]) * NH + h) * DV + c2;
#pragma unroll
            for (int j = 0; j < 2 * NV; j++)
                if (j < 2 * nv)
                    *(__nv_bfloat162 *)(orow + 8 * j) = __floats2bfloat162_rn(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
        }
    }
}

// ------------------------------------------------------------------ dQ
template <int NQ, int NV>
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_dq_kernel(bf16 *dq, const bf16 *dout, const float *lse, const float *delta, const bf16 *q, const bf16 *k,
                       const bf16 *v, int T, int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_DQ, DQK, DV);
    const int ldq = L.ldq(), ldv = L.ldv(), nq = DQK / 16, nv = DV / 16;
    const size_t kbuf = (size_t)TILE * ldq, vbuf = (size_t)TILE * ldv;
    bf16 *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g), *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE, tw = t0 + warp * 16;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * DQK, *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    load_tile(Qs, ldq, q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
    load_tile(Gs, ldv, dout + ((size_t)b * T * NH + h) * DV, (size_t)NH * DV, t0, T, DV);
    load_tile(Ks, ldq, kb, (size_t)NKV * DQK, 0, T, DQK);
    load_tile(Vs, ldv, vb, (size_t)NKV * DV, 0, T, DV);
    tile_commit();
    const bf16 *Qw = Qs + (size_t)warp * 16 * ldq, *Gw = Gs + (size_t)warp * 16 * ldv;
    const float sl = scale * LOG2E;
    const int rows[2] = {tw + g, tw + g + 8};
    float lt[2], dt[2];                        // lse (log2 units) and Delta of this lane's rows
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lt[i] = rows[i] < T ? lse[((size_t)b * NH + h) * T + rows[i]] * LOG2E : 0.0f;
        dt[i] = rows[i] < T ? delta[((size_t)b * NH + h) * T + rows[i]] : 0.0f;
    }
    float acc[2 * NQ][4];
    zero_acc(acc);
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        next_kv_tile(Ks, Vs, L, kb, vb, NKV, kt, qt, T);   // tile kt here, kt + 1 loading
        const bf16 *Kt = tile_buffer(Ks, kbuf, kt), *Vt = tile_buffer(Vs, vbuf, kt);
        float s[TILE / 8][4], d[TILE / 8][4];
        mma_abt<NQ, TILE / 16>(s, nq, Qw, ldq, Kt, ldq, lane);   // S
        mma_abt<NV, TILE / 16>(d, nv, Gw, ldv, Vt, ldv, lane);   // dP
        uint32_t da[TILE / 16][4];             // dS as the A operand of dS K, rounded to bf16
#pragma unroll
        for (int j = 0; j < TILE / 8; j++) {
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = s0 + 8 * j + c2 + (e & 1), row = rows[e >> 1];
                // row 0: dS is exactly 0 (FIRST_QUERY, layers/cpu_attention.c)
                ds[e] = key <= row && row < T && row > 0 ? exp2f(s[j][e] * sl - lt[e >> 1]) * (d[j][e] - dt[e >> 1]) : 0.0f;
            }
            mma_pack_tile(da, j, ds);
        }
        mma_acc<TILE / 16, NQ>(acc, nq, da, Kt, ldq, lane);      // dQ += dS K
    }
    add_rows<NQ>(dq + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, tw + g, T, acc, nq, scale, lane);
}

// ------------------------------------------------------------------ dK, dV
template <int NQ, int NV>
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta, const bf16 *q,
                        const bf16 *k, const bf16 *v, int T, int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_DKV, DQK, DV);
    const int ldq = L.ldq(), ldv = L.ldv(), nq = DQK / 16, nv = DV / 16;
    const size_t qbuf = (size_t)TILE * ldq, gbuf = (size_t)TILE * ldv;
    bf16 *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v), *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g);
    float *lse_s = (float *)(smem + M.lse), *del_s = (float *)(smem + M.del);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
    const int kt = blockIdx.x, s0 = kt * TILE, sw = s0 + warp * 16, G = NH / NKV;
    const int b = blockIdx.y / NKV, kvh = blockIdx.y % NKV;
    const int nqt = (T + TILE - 1) / TILE - kt, steps = G * nqt;   // (head, query tile) pairs
    // step i: head kvh G + i / nqt, query tile kt + i % nqt; starts loading its Q, dO, lse, Delta
    auto load_step = [&](int i) {
        const int h = kvh * G + i / nqt, t0 = (kt + i % nqt) * TILE;
        load_tile(tile_buffer(Qs, qbuf, i), ldq, q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
        load_tile(tile_buffer(Gs, gbuf, i), ldv, dout + ((size_t)b * T * NH + h) * DV, (size_t)NH * DV, t0, T, DV);
        load_row_values(tile_buffer(lse_s, TILE, i), lse + ((size_t)b * NH + h) * T, t0, T);
        load_row_values(tile_buffer(del_s, TILE, i), delta + ((size_t)b * NH + h) * T, t0, T);
    };
    load_tile(Ks, ldq, k + ((size_t)b * T * NKV + kvh) * DQK, (size_t)NKV * DQK, s0, T, DQK);
    load_tile(Vs, ldv, v + ((size_t)b * T * NKV + kvh) * DV, (size_t)NKV * DV, s0, T, DV);
    load_step(0);
    tile_commit();
    const bf16 *Kw = Ks + (size_t)warp * 16 * ldq, *Vw = Vs + (size_t)warp * 16 * ldv;
    const float sl = scale * LOG2E;
    const int keys[2] = {sw + g, sw + g + 8};  // this lane's key rows
    float dka[2 * NQ][4], dva[2 * NV][4];
    zero_acc(dka);
    zero_acc(dva);
    for (int i = 0; i < steps; i++) {
        const int t0 = (kt + i % nqt) * TILE;
        tile_wait();                           // step i's tiles are here
        __syncthreads();                       // ... for every thread; the other buffers are no longer read
        if (i + 1 < steps) {
            load_step(i + 1);
            tile_commit();
        }
        const bf16 *Qt = tile_buffer(Qs, qbuf, i), *Gt = tile_buffer(Gs, gbuf, i);
        const float *lt = tile_buffer(lse_s, TILE, i), *dt = tile_buffer(del_s, TILE, i);
        // the tile's 64 queries in two halves of 32 (fewer registers live beside dK and dV)
#pragma unroll
        for (int hq = 0; hq < 2; hq++) {
            const int c0 = hq * 32;
            if (t0 + c0 + 31 < sw) continue;   // every query of this half before every key of the warp
            float st[4][4], dpt[4][4];
            mma_abt<NQ, 2>(st, nq, Kw, ldq, Qt + (size_t)c0 * ldq, ldq, lane);    // S^T = K Q^T
            mma_abt<NV, 2>(dpt, nv, Vw, ldv, Gt + (size_t)c0 * ldv, ldv, lane);   // dP^T = V dO^T
            uint32_t pa[2][4], da[2][4];       // P^T, dS^T as A operands, rounded to bf16
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p[4], ds[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = c0 + 8 * j + c2 + (e & 1), tq = t0 + col, key = keys[e >> 1];
                    p[e] = ds[e] = 0.0f;
                    if (tq >= key && tq < T && key < T) {
                        p[e] = exp2f(st[j][e] * sl - lt[col] * LOG2E);
                        if (tq > 0) ds[e] = p[e] * (dpt[j][e] - dt[col]);   // FIRST_QUERY, layers/cpu_attention.c
                    }
                }
                mma_pack_tile(pa, j, p);
                mma_pack_tile(da, j, ds);
            }
            mma_acc<2, NV>(dva, nv, pa, Gt + (size_t)c0 * ldv, ldv, lane);   // dV += P^T dO
            mma_acc<2, NQ>(dka, nq, da, Qt + (size_t)c0 * ldq, ldq, lane);   // dK += dS^T Q
        }
    }
    add_rows<NQ>(dk + ((size_t)b * T * NKV + kvh) * DQK, (size_t)NKV * DQK, sw + g, T, dka, nq, scale, lane);
    add_rows<NV>(dv + ((size_t)b * T * NKV + kvh) * DV, (size_t)NKV * DV, sw + g, T, dva, nv, 1.0f, lane);
}

// The instantiations: head widths up to 64, 128 or 192 (DQK) and 64 or 128 (DV), a table per
// kernel read by the launches below (tc_class_q, tc_class_v).
#define TC_TABLE(KERNEL)                                                                                      \
    {{KERNEL<4, 4>, KERNEL<4, 8>}, {KERNEL<8, 4>, KERNEL<8, 8>}, {KERNEL<12, 4>, KERNEL<12, 8>}}
typedef void (*TcForwardKernel)(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, int, int, int, int, int, float);
typedef void (*TcDqKernel)(bf16 *, const bf16 *, const float *, const float *, const bf16 *, const bf16 *, const bf16 *,
                           int, int, int, int, int, float);
typedef void (*TcDkvKernel)(bf16 *, bf16 *, const bf16 *, const float *, const float *, const bf16 *, const bf16 *,
                            const bf16 *, int, int, int, int, int, float);
static const TcForwardKernel tc_forward_kernels[3][2] = TC_TABLE(attention_tc_forward_kernel);
static const TcDqKernel tc_dq_kernels[3][2] = TC_TABLE(attention_tc_dq_kernel);
static const TcDkvKernel tc_dkv_kernels[3][2] = TC_TABLE(attention_tc_dkv_kernel);

// The table row and column of head widths within TC_MAX_DQK / TC_MAX_DV.
static int tc_class_q(int DQK) { return DQK <= 64 ? 0 : DQK <= 128 ? 1 : 2; }
static int tc_class_v(int DV) { return DV <= 64 ? 0 : 1; }

// ------------------------------------------------------------------ host side
static size_t tc_shared_bytes(int kind, int DQK, int DV) { return tc_smem(kind, DQK, DV).total; }

static int g_tc_mode = -1;   // -1: CLLA_CUDA_ATTENTION not read yet; 1 tensor cores where they fit, 0 never

void cuda_attention_use_tensor_cores(int on) { g_tc_mode = on ? 1 : 0; }

static int tc_enabled(void) {
    if (g_tc_mode < 0) {
        const char *e = getenv("CLLA_CUDA_ATTENTION");
        if (e && *e && strcmp(e, "warp") != 0 && strcmp(e, "tc") != 0)
            die("CLLA_CUDA_ATTENTION='%s': use 'tc' (tensor-core kernels where the shape allows, the default) or 'warp' "
                "(the one-warp-per-row kernels everywhere)", e);
        g_tc_mode = !(e && strcmp(e, "warp") == 0);
    }
    return g_tc_mode;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Whether the tensor-core kernels take this call: widths multiples of 16 within TC_MAX_DQK and
// TC_MAX_DV (the instantiations), 16-byte aligned buffers, B NH within a grid's y dimension
// (heads), every kernel's tiles within the device's shared memory per block (the widest, 192 / 128,
// takes 127 KiB for dK, dV: an A100's 163 KiB and a Hopper's 227 KiB hold it), and not turned off
// (CLLA_CUDA_ATTENTION=warp or cuda_attention_use_tensor_cores(0)).
int cuda_attention_tc_fits(int DQK, int DV, long long heads, const void *const *ptrs, int nptrs) {
    if (!tc_enabled() || DQK % 16 != 0 || DV % 16 != 0 || DQK <= 0 || DV <= 0 || DQK > TC_MAX_DQK || DV > TC_MAX_DV ||
        heads > 65535)
        return 0;
    for (int i = 0; i < nptrs; i++)
        if (ptrs[i] && !aligned16(ptrs[i])) return 0;
    int dev = 0, max_optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return tc_shared_bytes(TC_DKV, DQK, DV) <= (size_t)max_optin && tc_shared_bytes(TC_DQ, DQK, DV) <= (size_t)max_optin &&
           tc_shared_bytes(TC_FORWARD, DQK, DV) <= (size_t)max_optin;
}

static size_t tc_prepare(const void *kernel, int kind, int DQK, int DV) {
    const size_t bytes = tc_shared_bytes(kind, DQK, DV);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return bytes;
}

void cuda_attention_tc_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH,
                               int NKV, int DQK, int DV, float scale) {
    const TcForwardKernel kernel = tc_forward_kernels[tc_class_q(DQK)][tc_class_v(DV)];
    const size_t sb = tc_prepare((const void *)kernel, TC_FORWARD, DQK, DV);
    const dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)(B * NH));
    kernel<<<grid, ATT_TC_THREADS, sb>>>(out, lse, q, k, v, T, NH, NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
}

// delta: Delta = rowsum(dO * O), (B, NH, T), computed by the caller.
void cuda_attention_tc_backward(bf16 *dq, bf16 *dk, bf16 *dv, const float *delta, const bf16 *dout, const float *lse,
                                const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV, int DQK,
                                int DV, float scale) {
    const unsigned tiles = (unsigned)((T + TILE - 1) / TILE);
    const int cq = tc_class_q(DQK), cv = tc_class_v(DV);
    const TcDqKernel dq_kernel = tc_dq_kernels[cq][cv];
    size_t sb = tc_prepare((const void *)dq_kernel, TC_DQ, DQK, DV);
    dq_kernel<<<dim3(tiles, (unsigned)(B * NH)), ATT_TC_THREADS, sb>>>(dq, dout, lse, delta, q, k, v, T, NH, NKV, DQK, DV,
                                                                      scale);
    CUDA_LAUNCHED();
    const TcDkvKernel dkv_kernel = tc_dkv_kernels[cq][cv];
    sb = tc_prepare((const void *)dkv_kernel, TC_DKV, DQK, DV);
    dkv_kernel<<<dim3(tiles, (unsigned)(B * NKV)), ATT_TC_THREADS, sb>>>(dk, dv, dout, lse, delta, q, k, v, T, NH, NKV,
                                                                        DQK, DV, scale);
    CUDA_LAUNCHED();
}
