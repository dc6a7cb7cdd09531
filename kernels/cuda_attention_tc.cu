// Causal attention on tensor cores (WMMA, bf16 in, fp32 accumulate), tiled in the manner of
// FlashAttention-2: the contract and layouts of kernels/cuda_attention.cu, which dispatches here
// when the shape allows (cuda_attention_tc_fits) and keeps its one-warp-per-row kernels for the
// rest (head widths not a multiple of 16 or beyond 192 / 128, unaligned buffers).
//
// A block is ATT_TC_WARPS warps; warp w owns 16 consecutive rows of the block's 64-row tile.
// The output accumulators (O, dQ, dK, dV) stay in registers as WMMA fragments for the whole
// kernel, and so do the forward's Q rows; K and V tiles (and Q, dO in the backward) are read from
// shared memory. WMMA leaves the place of each accumulator element to the architecture, so each
// warp reads it back once (frag_coords), and the row-wise work on fragments (the forward's
// rescale by alpha, the backward's P and dS) uses it. Rounding as in the warp kernels and the
// CPU op: P is rounded to bf16 for P V and dV, dS for dQ and dK, lse sums the unrounded P; every
// output row is written by one warp and added to the bf16 gradient once, so the result does not
// depend on the schedule (bitwise repeatable).
//
//   forward   grid (query tiles, B NH): S = Q K^T (through shared memory, for the row maximum),
//             online softmax, O = O alpha + P V
//   dQ        grid (query tiles, B NH): S, dP = dO V^T, dS = P (dP - Delta), dQ += dS K
//   dK, dV    grid (key tiles, B NKV):  over the group's heads and the query tiles at or after the
//             key tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
// Query tiles run heaviest first (the causal triangle gives the last tile the most keys). The
// register arrays need sizes known when compiling, so each kernel is instantiated for head widths
// up to 64, 128 or 192 (queries and keys) and 64 or 128 (values), a table of six.
#include "kernels/cuda_attention_tc.cuh"
#include "kernels/backend_cuda.h"

#include <mma.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;

#define TILE 64                      // rows of a query or key tile
#define ATT_TC_WARPS (TILE / 16)     // 4 warps, 16 rows each
#define ATT_TC_THREADS (32 * ATT_TC_WARPS)
#define PAD_H 8                      // bf16 row padding (16 bytes: WMMA needs ld % 8, and it spreads banks)
#define PAD_F 4                      // fp32 row padding
#define LD_T (TILE + PAD_F)          // fp32 16 x 64 score tiles
#define LD_TH (TILE + PAD_H)         // bf16 16 x 64 probability tiles
#define TC_MAX_DQK CUDA_ATTENTION_TC_MAX_DQK   // the widest instantiation (tc_forward_kernels...), 192
#define TC_MAX_DV CUDA_ATTENTION_TC_MAX_DV     // 128

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBCol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
#define NE FragC::num_elements       // accumulator elements a lane holds (8)

// Shared-memory carving: regions 128-byte aligned (WMMA wants 32).
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
// kernel does not have stay 0. q, k, v, g (dO): bf16 tiles; the tiles the loop walks over (K and
// V in the forward and dQ) have two buffers, the next tile loading while this one is used
// (tile_buffer), and the forward stages its Q rows in K's second buffer before the loop. s: the
// forward's fp32 score tiles, 16 rows a warp; p, e (dS): bf16 probability tiles, 16 rows a warp;
// row: the forward's per-row factor, 16 a warp; lse, del (Delta): a query tile's row values. Each
// warp's p (else e, else s) region also serves once as frag_coords' scratch.
struct TcSmem {
    size_t q, k, v, g, s, p, e, row, lse, del, total;
};

static __host__ __device__ TcSmem tc_smem(int kind, int DQK, int DV) {
    const TcLayout L = {DQK, DV};
    const size_t tq = (size_t)TILE * L.ldq() * 2, tv = (size_t)TILE * L.ldv() * 2, ts = (size_t)TILE * LD_T * 4,
                 tp = (size_t)TILE * LD_TH * 2, row = (size_t)TILE * 4;
    TcSmem m = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t off = 0;
    if (kind == TC_FORWARD) {
        m.k = carve(&off, 2 * tq); m.v = carve(&off, 2 * tv); m.s = carve(&off, ts); m.p = carve(&off, tp);
        m.row = carve(&off, row);
    } else if (kind == TC_DQ) {
        m.q = carve(&off, tq); m.g = carve(&off, tv); m.k = carve(&off, 2 * tq); m.v = carve(&off, 2 * tv);
        m.e = carve(&off, tp);
    } else {
        m.k = carve(&off, tq); m.v = carve(&off, tv); m.q = carve(&off, tq); m.g = carve(&off, tv);
        m.p = carve(&off, tp); m.e = carve(&off, tp); m.lse = carve(&off, row); m.del = carve(&off, row);
    }
    m.total = off;
    return m;
}

// Starts copying rows [row0, row0 + TILE) of a (T, stride) bf16 matrix, `width` columns, into dst
// (ld), zeros past T, with cp.async (sm_80 and later): every thread's 16-byte pieces in flight at
// once, no registers in between. width % 8 == 0 and base 16-byte aligned (cuda_attention_tc_fits).
// The copies land after tile_commit_wait and a __syncthreads.
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

// Closes the group of copies started so far (tile_commit) or waits for all of this thread's.
static __device__ __forceinline__ void tile_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void tile_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Buffer i % 2 of a double-buffered tile region (TILE rows of ld).
static __device__ __forceinline__ bf16 *tile_buffer(bf16 *region, int ld, int i) {
    return region + (size_t)(i & 1) * TILE * ld;
}

// pos[i] = row * 16 + col of this lane's accumulator element i: a 16 x 16 tile holding
// row * 16 + col, loaded as an accumulator. store_matrix_sync puts element i at the same place,
// and mma_sync's result is laid out as its accumulator input. scratch: 256 floats of the warp's
// own shared memory, 32-byte aligned.
static __device__ __forceinline__ void frag_coords(int (&pos)[NE], float *scratch, int lane) {
    for (int i = lane; i < 256; i += 32) scratch[i] = (float)i;
    __syncwarp();
    FragC f;
    wmma::load_matrix_sync(f, scratch, 16, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < NE; i++) pos[i] = (int)f.x[i];
    __syncwarp();
}

// acc[j] (16 x 16 at columns 16 j) += A (16 x TILE, bf16 at a, lda) @ M (TILE x 16 n, rows of
// 16 n-wide chunks at m, ldm), for the n = active chunks of at most N: a warp's P V, dS K, P^T dO
// or dS^T Q. Each 16-row slice of A is loaded once.
template <int N>
static __device__ __forceinline__ void mma_acc_tile(FragC (&acc)[N], int n, const bf16 *a, int lda, const bf16 *m,
                                                    int ldm) {
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
        FragA fa;
        wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j < n) {
                FragBRow fb;
                wmma::load_matrix_sync(fb, m + (size_t)kk * 16 * ldm + j * 16, ldm);
                wmma::mma_sync(acc[j], fa, fb, acc[j]);
            }
        }
    }
}

// s[c] (16 x 16, the warp's rows against rows 16 c.. of B) = A (16 x 16 kn, bf16 at a, lda) @
// B^T (B: TILE x 16 kn at b, ldb), kn <= K chunks of 16: S = Q K^T, dP = dO V^T and their
// transposes for a whole tile, each slice of A loaded once.
template <int K>
static __device__ __forceinline__ void mma_abt_tile(FragC (&s)[TILE / 16], int kn, const bf16 *a, int lda, const bf16 *b,
                                                    int ldb) {
#pragma unroll
    for (int c = 0; c < TILE / 16; c++) wmma::fill_fragment(s[c], 0.0f);
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (k < kn) {
            FragA fa;
            wmma::load_matrix_sync(fa, a + k * 16, lda);
#pragma unroll
            for (int c = 0; c < TILE / 16; c++) {
                FragBCol fb;
                wmma::load_matrix_sync(fb, b + (size_t)c * 16 * ldb + k * 16, ldb);
                wmma::mma_sync(s[c], fa, fb, s[c]);
            }
        }
    }
}

// dst row (row0 + r) += factor * acc, for the accumulator chunks of a warp's 16 rows: rows at or
// past T are not written. dst is (rows, stride) bf16 at column 0 of this head; one rounding.
template <int N>
static __device__ __forceinline__ void add_rows(bf16 *dst, size_t stride, int row0, int T, const FragC (&acc)[N], int n,
                                                const int (&pos)[NE], float factor) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (j < n) {
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int t = row0 + (pos[i] >> 4);
                if (t < T) {
                    bf16 *g = dst + (size_t)t * stride + j * 16 + (pos[i] & 15);
                    *g = to_bf16(ld(g) + factor * acc[j].x[i]);
                }
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
    bf16 *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v), *Ps = (bf16 *)(smem + M.p);
    float *Ss = (float *)(smem + M.s), *Rs = (float *)(smem + M.row);
    const int nq = DQK / 16, nv = DV / 16;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * DQK, *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    float *Sw = Ss + (size_t)warp * 16 * LD_T, *Rw = Rs + warp * 16;
    bf16 *Pw = Ps + (size_t)warp * 16 * LD_TH;
    int pos[NE];
    frag_coords(pos, Sw, lane);
    // the warp's 16 query rows, staged through K's second buffer, held as A fragments for the
    // whole kernel; the first K, V tile loads meanwhile
    bf16 *Qstage = tile_buffer(Ks, L.ldq(), 1);
    load_tile(Qstage, L.ldq(), q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
    load_tile(Ks, L.ldq(), kb, (size_t)NKV * DQK, 0, T, DQK);
    load_tile(Vs, L.ldv(), vb, (size_t)NKV * DV, 0, T, DV);
    tile_commit();
    tile_wait();
    __syncthreads();
    FragA qf[NQ];
#pragma unroll
    for (int j = 0; j < NQ; j++)
        if (j < nq) wmma::load_matrix_sync(qf[j], Qstage + (size_t)warp * 16 * L.ldq() + j * 16, L.ldq());
    FragC o[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) wmma::fill_fragment(o[j], 0.0f);
    const int t = t0 + warp * 16 + r;          // this lane pair's query row
    float m = -INFINITY, l = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        tile_wait();                           // tile kt's K and V are here
        __syncthreads();                       // ... for every thread; the other buffer is no longer read
        if (kt < qt) {
            load_tile(tile_buffer(Ks, L.ldq(), kt + 1), L.ldq(), kb, (size_t)NKV * DQK, s0 + TILE, T, DQK);
            load_tile(tile_buffer(Vs, L.ldv(), kt + 1), L.ldv(), vb, (size_t)NKV * DV, s0 + TILE, T, DV);
            tile_commit();
        }
        const bf16 *Kt = tile_buffer(Ks, L.ldq(), kt), *Vt = tile_buffer(Vs, L.ldv(), kt);
#pragma unroll
        for (int c = 0; c < TILE / 16; c++) {  // S = Q K^T, 16 keys at a time, into Sw
            FragC s;
            wmma::fill_fragment(s, 0.0f);
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                if (j < nq) {
                    FragBCol fb;
                    wmma::load_matrix_sync(fb, Kt + (size_t)c * 16 * L.ldq() + j * 16, L.ldq());
                    wmma::mma_sync(s, qf[j], fb, s);
                }
            }
            wmma::store_matrix_sync(Sw + c * 16, s, LD_T, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax of row t over this tile's keys (the pair's lanes take alternate
        // columns); key s0 <= t is always in, so mx is finite
        float x[32], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int c = 2 * j + half, s = s0 + c;
            x[j] = s <= t && s < T ? scale * Sw[r * LD_T + c] : -INFINITY;
            mx = fmaxf(mx, x[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        const float mn = fmaxf(m, mx), alpha = expf(m - mn);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const float p = x[j] == -INFINITY ? 0.0f : expf(x[j] - mn);
            sum += p;
            Pw[r * LD_TH + 2 * j + half] = to_bf16(p);
        }
        sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
        l = l * alpha + sum;
        m = mn;
        if (half == 0) Rw[r] = alpha;
        __syncwarp();
        // O = O alpha + P V
        float a[NE];
#pragma unroll
        for (int i = 0; i < NE; i++) a[i] = Rw[pos[i] >> 4];
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int i = 0; i < NE; i++) o[j].x[i] *= a[i];
        mma_acc_tile<NV>(o, nv, Pw, LD_TH, Vt, L.ldv());
        __syncwarp();                          // Rw is written again below
    }
    if (half == 0) Rw[r] = 1.0f / l;
    if (t < T && half == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < NV; j++) {
        if (j < nv) {
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int row = pos[i] >> 4, tr = t0 + warp * 16 + row;
                if (tr < T) out[(((size_t)b * T + tr) * NH + h) * DV + j * 16 + (pos[i] & 15)] = to_bf16(o[j].x[i] * Rw[row]);
            }
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
    bf16 *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g), *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v);
    bf16 *Es = (bf16 *)(smem + M.e);                                                     // dS
    const int nq = DQK / 16, nv = DV / 16;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE, tw = t0 + warp * 16;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * DQK, *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    load_tile(Qs, L.ldq(), q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
    load_tile(Gs, L.ldv(), dout + ((size_t)b * T * NH + h) * DV, (size_t)NH * DV, t0, T, DV);
    load_tile(Ks, L.ldq(), kb, (size_t)NKV * DQK, 0, T, DQK);
    load_tile(Vs, L.ldv(), vb, (size_t)NKV * DV, 0, T, DV);
    tile_commit();
    bf16 *Ew = Es + (size_t)warp * 16 * LD_TH;
    const bf16 *Qw = Qs + (size_t)warp * 16 * L.ldq(), *Gw = Gs + (size_t)warp * 16 * L.ldv();
    int pos[NE];
    frag_coords(pos, (float *)Ew, lane);
    float lt[NE], dt[NE];                      // lse and Delta of each element's query row
#pragma unroll
    for (int i = 0; i < NE; i++) {
        const int t = tw + (pos[i] >> 4);
        lt[i] = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
        dt[i] = t < T ? delta[((size_t)b * NH + h) * T + t] : 0.0f;
    }
    FragC acc[NQ];
#pragma unroll
    for (int j = 0; j < NQ; j++) wmma::fill_fragment(acc[j], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        tile_wait();                           // tile kt's K and V (and at first Q, dO) are here
        __syncthreads();                       // ... for every thread; the other buffer is no longer read
        if (kt < qt) {
            load_tile(tile_buffer(Ks, L.ldq(), kt + 1), L.ldq(), kb, (size_t)NKV * DQK, s0 + TILE, T, DQK);
            load_tile(tile_buffer(Vs, L.ldv(), kt + 1), L.ldv(), vb, (size_t)NKV * DV, s0 + TILE, T, DV);
            tile_commit();
        }
        const bf16 *Kt = tile_buffer(Ks, L.ldq(), kt), *Vt = tile_buffer(Vs, L.ldv(), kt);
        FragC s[TILE / 16], d[TILE / 16];
        mma_abt_tile<NQ>(s, nq, Qw, L.ldq(), Kt, L.ldq());    // S
        mma_abt_tile<NV>(d, nv, Gw, L.ldv(), Vt, L.ldv());    // dP
#pragma unroll
        for (int c = 0; c < TILE / 16; c++) {
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int row = pos[i] >> 4, col = c * 16 + (pos[i] & 15), t = tw + row;
                float ds = 0.0f;
                if (s0 + col <= t && t < T) ds = expf(scale * s[c].x[i] - lt[i]) * (d[c].x[i] - dt[i]);
                Ew[row * LD_TH + col] = to_bf16(ds);
            }
        }
        __syncwarp();
        mma_acc_tile<NQ>(acc, nq, Ew, LD_TH, Kt, L.ldq());   // dQ += dS K
    }
    add_rows<NQ>(dq + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, tw, T, acc, nq, pos, scale);
}

// ------------------------------------------------------------------ dK, dV
template <int NQ, int NV>
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta, const bf16 *q,
                        const bf16 *k, const bf16 *v, int T, int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_DKV, DQK, DV);
    bf16 *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v), *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g);
    bf16 *Ps = (bf16 *)(smem + M.p), *Es = (bf16 *)(smem + M.e);                      // P^T, dS^T
    float *lse_s = (float *)(smem + M.lse), *del_s = (float *)(smem + M.del);
    const int nq = DQK / 16, nv = DV / 16;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kt = blockIdx.x, s0 = kt * TILE, sw = s0 + warp * 16, G = NH / NKV;
    const int b = blockIdx.y / NKV, kvh = blockIdx.y % NKV;
    load_tile(Ks, L.ldq(), k + ((size_t)b * T * NKV + kvh) * DQK, (size_t)NKV * DQK, s0, T, DQK);
    load_tile(Vs, L.ldv(), v + ((size_t)b * T * NKV + kvh) * DV, (size_t)NKV * DV, s0, T, DV);
    tile_commit();   // waited for with the first query tile's
    bf16 *Pw = Ps + (size_t)warp * 16 * LD_TH, *Ew = Es + (size_t)warp * 16 * LD_TH;
    const bf16 *Kw = Ks + (size_t)warp * 16 * L.ldq(), *Vw = Vs + (size_t)warp * 16 * L.ldv();
    int pos[NE];
    frag_coords(pos, (float *)Pw, lane);
    FragC dka[NQ], dva[NV];
#pragma unroll
    for (int j = 0; j < NQ; j++) wmma::fill_fragment(dka[j], 0.0f);
#pragma unroll
    for (int j = 0; j < NV; j++) wmma::fill_fragment(dva[j], 0.0f);
    const int ntiles = (T + TILE - 1) / TILE;
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        const bf16 *qb = q + ((size_t)b * T * NH + h) * DQK, *gb = dout + ((size_t)b * T * NH + h) * DV;
        const float *lh = lse + ((size_t)b * NH + h) * T, *dh = delta + ((size_t)b * NH + h) * T;
        for (int qt = kt; qt < ntiles; qt++) {
            const int t0 = qt * TILE;
            __syncthreads();                   // the previous query tile is no longer read
            load_tile(Qs, L.ldq(), qb, (size_t)NH * DQK, t0, T, DQK);
            load_tile(Gs, L.ldv(), gb, (size_t)NH * DV, t0, T, DV);
            tile_commit();
            for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
                lse_s[i] = t0 + i < T ? lh[t0 + i] : 0.0f;
                del_s[i] = t0 + i < T ? dh[t0 + i] : 0.0f;
            }
            tile_wait();
            __syncthreads();
            FragC dpt[TILE / 16];
            mma_abt_tile<NV>(dpt, nv, Vw, L.ldv(), Gs, L.ldv());   // dP^T = V dO^T
#pragma unroll
            for (int c = 0; c < TILE / 16; c++) {
                // S^T for 16 queries at a time (one accumulator live: the dK, dV ones take the registers)
                FragC st;
                wmma::fill_fragment(st, 0.0f);
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    if (j < nq) {
                        FragA fa;
                        FragBCol fb;
                        wmma::load_matrix_sync(fa, Kw + j * 16, L.ldq());
                        wmma::load_matrix_sync(fb, Qs + (size_t)c * 16 * L.ldq() + j * 16, L.ldq());
                        wmma::mma_sync(st, fa, fb, st);
                    }
                }
#pragma unroll
                for (int i = 0; i < NE; i++) {
                    const int row = pos[i] >> 4, col = c * 16 + (pos[i] & 15), s = sw + row, tq = t0 + col;
                    float p = 0.0f, ds = 0.0f;
                    if (tq >= s && tq < T && s < T) {
                        p = expf(scale * st.x[i] - lse_s[col]);
                        ds = p * (dpt[c].x[i] - del_s[col]);
                    }
                    Pw[row * LD_TH + col] = to_bf16(p);
                    Ew[row * LD_TH + col] = to_bf16(ds);
                }
            }
            __syncwarp();
            mma_acc_tile<NV>(dva, nv, Pw, LD_TH, Gs, L.ldv());   // dV += P^T dO
            mma_acc_tile<NQ>(dka, nq, Ew, LD_TH, Qs, L.ldq());   // dK += dS^T Q
        }
    }
    add_rows<NQ>(dk + ((size_t)b * T * NKV + kvh) * DQK, (size_t)NKV * DQK, sw, T, dka, nq, pos, scale);
    add_rows<NV>(dv + ((size_t)b * T * NKV + kvh) * DV, (size_t)NKV * DV, sw, T, dva, nv, pos, 1.0f);
}

// The instantiations: head widths up to 64, 128 or 192 (DQK) and 64 or 128 (DV), a table per
// kernel read by the launches below (tc_width_class).
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
// takes 107 KiB for dK, dV: an A100's 163 KiB and a Hopper's 227 KiB hold it), and not turned off
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
