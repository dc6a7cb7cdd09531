// Causal attention on tensor cores (WMMA, bf16 in, fp32 accumulate), tiled in the manner of
// FlashAttention-2: the contract and layouts of kernels/cuda_attention.cu, which dispatches here
// when the shape allows (cuda_attention_tc_fits) and keeps its one-warp-per-row kernels for the
// rest (head widths not a multiple of 16, unaligned buffers, tiles beyond shared memory).
//
// A block is ATT_TC_WARPS warps; warp w owns 16 consecutive rows of the block's 64-row tile.
// Every product is a 16 x 16 x 16 WMMA step from shared memory; the softmax and the gradient
// elementwise work run on the fp32 tiles the products leave in shared memory, two lanes per row
// (each lane 32 of the 64 columns). Rounding as in the warp kernels and the CPU op: P is rounded
// to bf16 for P V and dV, dS for dQ and dK, lse sums the unrounded P; every output row is
// written by one warp and added to the bf16 gradient once, so the result does not depend on the
// schedule (bitwise repeatable).
//
//   forward   grid (query tiles, B NH): S = Q K^T, online softmax, O = O alpha + P V
//   dQ        grid (query tiles, B NH): S, dP = dO V^T, dS = P (dP - Delta), dQ += dS K
//   dK, dV    grid (key tiles, B NKV):  over the group's heads and the query tiles at or after the
//             key tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
// Query tiles run heaviest first (the causal triangle gives the last tile the most keys).
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

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBCol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

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
    __host__ __device__ int ldaq() const { return dqk + PAD_F; }
    __host__ __device__ int ldav() const { return dv + PAD_F; }
};

enum { TC_FORWARD, TC_DQ, TC_DKV };

// Where each kernel's shared regions start (bytes from the base) and how many bytes they take in
// all: the one definition the kernels carve from and the host sizes the launch with. Regions a
// kernel does not have stay 0. q, k, v, g (dO): bf16 tiles; s, d (dP): fp32 score tiles; p, e
// (dS): bf16 probability tiles; acc_q (dQ or dK), acc_v (O or dV): fp32 accumulators; lse, del
// (Delta): a query tile's row values.
struct TcSmem {
    size_t q, k, v, g, s, d, p, e, acc_q, acc_v, lse, del, total;
};

static __host__ __device__ TcSmem tc_smem(int kind, int DQK, int DV) {
    const TcLayout L = {DQK, DV};
    const size_t tq = (size_t)TILE * L.ldq() * 2, tv = (size_t)TILE * L.ldv() * 2, ts = (size_t)TILE * LD_T * 4,
                 tp = (size_t)TILE * LD_TH * 2, aq = (size_t)TILE * L.ldaq() * 4, av = (size_t)TILE * L.ldav() * 4,
                 row = (size_t)TILE * 4;
    TcSmem m = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t off = 0;
    if (kind == TC_FORWARD) {
        m.q = carve(&off, tq); m.k = carve(&off, tq); m.v = carve(&off, tv);
        m.s = carve(&off, ts); m.p = carve(&off, tp); m.acc_v = carve(&off, av);
    } else if (kind == TC_DQ) {
        m.q = carve(&off, tq); m.g = carve(&off, tv); m.k = carve(&off, tq); m.v = carve(&off, tv);
        m.s = carve(&off, ts); m.d = carve(&off, ts); m.e = carve(&off, tp); m.acc_q = carve(&off, aq);
    } else {
        m.k = carve(&off, tq); m.v = carve(&off, tv); m.q = carve(&off, tq); m.g = carve(&off, tv);
        m.s = carve(&off, ts); m.d = carve(&off, ts); m.p = carve(&off, tp); m.e = carve(&off, tp);
        m.acc_q = carve(&off, aq); m.acc_v = carve(&off, av); m.lse = carve(&off, row); m.del = carve(&off, row);
    }
    m.total = off;
    return m;
}

// Loads rows [row0, row0 + TILE) of a (T, stride) bf16 matrix, `width` columns, into dst (ld),
// zeros past T. 16-byte vectors: width % 8 == 0 and base 16-byte aligned (cuda_attention_tc_fits).
static __device__ __forceinline__ void load_tile(bf16 *dst, int ld, const bf16 *base, size_t stride, int row0, int T,
                                                 int width) {
    const int vecs = width / 8;
    for (int i = threadIdx.x; i < TILE * vecs; i += blockDim.x) {
        const int r = i / vecs, c = (i % vecs) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row0 + r < T) val = *(const uint4 *)(base + (size_t)(row0 + r) * stride + c);
        *(uint4 *)(dst + (size_t)r * ld + c) = val;
    }
}

// C (16 x 16 at c, ld ldc, fp32) = A (16 x K at a, row-major, lda) @ B, B (K x 16) read as
// B[k][n] = b[n * ldb + k] (col-major: the rows of a row-major K or V tile, i.e. a product with
// its transpose).
static __device__ __forceinline__ void mma_abt(float *c, int ldc, const bf16 *a, int lda, const bf16 *b, int ldb, int K) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        FragA fa;
        FragBCol fb;
        wmma::load_matrix_sync(fa, a + k, lda);
        wmma::load_matrix_sync(fb, b + k, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
}

// c (16 x TILE at c, fp32, row-major LD_T) = A (16 x K, the warp's rows at a, lda) @ B^T for the
// TILE rows of B at b (ldb): a warp's scores against a whole tile, S = Q K^T or dP = dO V^T and
// their transposes.
static __device__ __forceinline__ void mma_abt_tile(float *c, const bf16 *a, int lda, const bf16 *b, int ldb, int K) {
    for (int n = 0; n < TILE; n += 16) mma_abt(c + n, LD_T, a, lda, b + (size_t)n * ldb, ldb, K);
}

// acc (16 x N at c, fp32, ldc) += P (16 x TILE at p, bf16, ldp) @ M (TILE x N at m, row-major,
// ldm), N a multiple of 16.
static __device__ __forceinline__ void mma_acc_pm(float *c, int ldc, const bf16 *p, int ldp, const bf16 *m, int ldm, int N) {
    for (int n = 0; n < N; n += 16) {
        FragC acc;
        wmma::load_matrix_sync(acc, c + n, ldc, wmma::mem_row_major);
#pragma unroll
        for (int k = 0; k < TILE; k += 16) {
            FragA fa;
            FragBRow fb;
            wmma::load_matrix_sync(fa, p + k, ldp);
            wmma::load_matrix_sync(fb, m + (size_t)k * ldm + n, ldm);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n, acc, ldc, wmma::mem_row_major);
    }
}

// Zeroes a warp's 16 x n fp32 tile (ld), lanes striding.
static __device__ __forceinline__ void warp_zero(float *a, int ld, int n, int lane) {
    for (int i = lane; i < 16 * n; i += 32) a[(i / n) * ld + i % n] = 0.0f;
}

// ------------------------------------------------------------------ forward
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int NH, int NKV,
                            int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_FORWARD, DQK, DV);
    bf16 *Qs = (bf16 *)(smem + M.q), *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v), *Ps = (bf16 *)(smem + M.p);
    float *Ss = (float *)(smem + M.s), *Os = (float *)(smem + M.acc_v);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    const bf16 *qb = q + ((size_t)b * T * NH + h) * DQK, *kb = k + ((size_t)b * T * NKV + kvh) * DQK;
    const bf16 *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    load_tile(Qs, L.ldq(), qb, (size_t)NH * DQK, t0, T, DQK);
    float *Sw = Ss + (size_t)warp * 16 * LD_T, *Ow = Os + (size_t)warp * 16 * L.ldav();
    bf16 *Pw = Ps + (size_t)warp * 16 * LD_TH;
    warp_zero(Ow, L.ldav(), DV, lane);
    const int t = t0 + warp * 16 + r;          // this lane pair's query row
    float m = -INFINITY, l = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        __syncthreads();                       // the previous tile's K and V are no longer read
        load_tile(Ks, L.ldq(), kb, (size_t)NKV * DQK, s0, T, DQK);
        load_tile(Vs, L.ldv(), vb, (size_t)NKV * DV, s0, T, DV);
        __syncthreads();
        mma_abt_tile(Sw, Qs + (size_t)warp * 16 * L.ldq(), L.ldq(), Ks, L.ldq(), DQK);
        __syncwarp();
        // online softmax of row t over this tile's keys; key s0 <= t is always in, so mx is finite
        float x[32], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int c = half * 32 + j, s = s0 + c;
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
            Pw[r * LD_TH + half * 32 + j] = to_bf16(p);
        }
        sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
        l = l * alpha + sum;
        m = mn;
        // O row *= alpha (each lane of the pair half the columns), then O += P V
        for (int d = half; d < DV; d += 2) Ow[r * L.ldav() + d] *= alpha;
        __syncwarp();
        mma_acc_pm(Ow, L.ldav(), Pw, LD_TH, Vs, L.ldv(), DV);
        __syncwarp();
    }
    if (t < T) {
        bf16 *orow = out + (((size_t)b * T + t) * NH + h) * DV;
        const float inv = 1.0f / l;
        for (int d = half; d < DV; d += 2) orow[d] = to_bf16(Ow[r * L.ldav() + d] * inv);
        if (half == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    }
}

// ------------------------------------------------------------------ dQ
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_dq_kernel(bf16 *dq, const bf16 *dout, const float *lse, const float *delta, const bf16 *q, const bf16 *k,
                       const bf16 *v, int T, int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_DQ, DQK, DV);
    bf16 *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g), *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v);
    bf16 *Es = (bf16 *)(smem + M.e);                                                     // dS
    float *Ss = (float *)(smem + M.s), *Ds = (float *)(smem + M.d), *As = (float *)(smem + M.acc_q);   // S, dP, dQ

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    const int qt = gridDim.x - 1 - blockIdx.x, t0 = qt * TILE;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
    load_tile(Qs, L.ldq(), q + ((size_t)b * T * NH + h) * DQK, (size_t)NH * DQK, t0, T, DQK);
    load_tile(Gs, L.ldv(), dout + ((size_t)b * T * NH + h) * DV, (size_t)NH * DV, t0, T, DV);
    const bf16 *kb = k + ((size_t)b * T * NKV + kvh) * DQK, *vb = v + ((size_t)b * T * NKV + kvh) * DV;
    float *Sw = Ss + (size_t)warp * 16 * LD_T, *Dw = Ds + (size_t)warp * 16 * LD_T, *Aw = As + (size_t)warp * 16 * L.ldaq();
    bf16 *Ew = Es + (size_t)warp * 16 * LD_TH;
    warp_zero(Aw, L.ldaq(), DQK, lane);
    const int t = t0 + warp * 16 + r;
    const float lt = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    const float dt = t < T ? delta[((size_t)b * NH + h) * T + t] : 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int s0 = kt * TILE;
        __syncthreads();
        load_tile(Ks, L.ldq(), kb, (size_t)NKV * DQK, s0, T, DQK);
        load_tile(Vs, L.ldv(), vb, (size_t)NKV * DV, s0, T, DV);
        __syncthreads();
        mma_abt_tile(Sw, Qs + (size_t)warp * 16 * L.ldq(), L.ldq(), Ks, L.ldq(), DQK);   // S
        mma_abt_tile(Dw, Gs + (size_t)warp * 16 * L.ldv(), L.ldv(), Vs, L.ldv(), DV);    // dP
        __syncwarp();
#pragma unroll 4
        for (int j = 0; j < 32; j++) {
            const int c = half * 32 + j, s = s0 + c;
            float ds = 0.0f;
            if (s <= t && t < T) {
                const float p = expf(scale * Sw[r * LD_T + c] - lt);
                ds = p * (Dw[r * LD_T + c] - dt);
            }
            Ew[r * LD_TH + c] = to_bf16(ds);
        }
        __syncwarp();
        mma_acc_pm(Aw, L.ldaq(), Ew, LD_TH, Ks, L.ldq(), DQK);
        __syncwarp();
    }
    if (t < T) {
        bf16 *g = dq + (((size_t)b * T + t) * NH + h) * DQK;
        for (int d = half; d < DQK; d += 2) g[d] = to_bf16(ld(g + d) + scale * Aw[r * L.ldaq() + d]);
    }
}

// ------------------------------------------------------------------ dK, dV
__global__ void __launch_bounds__(ATT_TC_THREADS)
attention_tc_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta, const bf16 *q,
                        const bf16 *k, const bf16 *v, int T, int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const TcLayout L = {DQK, DV};
    const TcSmem M = tc_smem(TC_DKV, DQK, DV);
    bf16 *Ks = (bf16 *)(smem + M.k), *Vs = (bf16 *)(smem + M.v), *Qs = (bf16 *)(smem + M.q), *Gs = (bf16 *)(smem + M.g);
    bf16 *Ps = (bf16 *)(smem + M.p), *Es = (bf16 *)(smem + M.e);                      // P^T, dS^T
    float *Ss = (float *)(smem + M.s), *Ds = (float *)(smem + M.d);                   // S^T (keys x queries), dP^T
    float *Ak = (float *)(smem + M.acc_q), *Av = (float *)(smem + M.acc_v);           // dK, dV accumulators
    float *lse_s = (float *)(smem + M.lse), *del_s = (float *)(smem + M.del);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    const int kt = blockIdx.x, s0 = kt * TILE, G = NH / NKV;
    const int b = blockIdx.y / NKV, kvh = blockIdx.y % NKV;
    load_tile(Ks, L.ldq(), k + ((size_t)b * T * NKV + kvh) * DQK, (size_t)NKV * DQK, s0, T, DQK);
    load_tile(Vs, L.ldv(), v + ((size_t)b * T * NKV + kvh) * DV, (size_t)NKV * DV, s0, T, DV);
    float *Sw = Ss + (size_t)warp * 16 * LD_T, *Dw = Ds + (size_t)warp * 16 * LD_T;
    bf16 *Pw = Ps + (size_t)warp * 16 * LD_TH, *Ew = Es + (size_t)warp * 16 * LD_TH;
    float *Akw = Ak + (size_t)warp * 16 * L.ldaq(), *Avw = Av + (size_t)warp * 16 * L.ldav();
    warp_zero(Akw, L.ldaq(), DQK, lane);
    warp_zero(Avw, L.ldav(), DV, lane);
    const int s = s0 + warp * 16 + r;          // this lane pair's key row
    const int ntiles = (T + TILE - 1) / TILE;
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        const bf16 *qb = q + ((size_t)b * T * NH + h) * DQK, *gb = dout + ((size_t)b * T * NH + h) * DV;
        const float *lh = lse + ((size_t)b * NH + h) * T, *dh = delta + ((size_t)b * NH + h) * T;
        for (int qt = kt; qt < ntiles; qt++) {
            const int t0 = qt * TILE;
            __syncthreads();
            load_tile(Qs, L.ldq(), qb, (size_t)NH * DQK, t0, T, DQK);
            load_tile(Gs, L.ldv(), gb, (size_t)NH * DV, t0, T, DV);
            for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
                lse_s[i] = t0 + i < T ? lh[t0 + i] : 0.0f;
                del_s[i] = t0 + i < T ? dh[t0 + i] : 0.0f;
            }
            __syncthreads();
            mma_abt_tile(Sw, Ks + (size_t)warp * 16 * L.ldq(), L.ldq(), Qs, L.ldq(), DQK);   // S^T
            mma_abt_tile(Dw, Vs + (size_t)warp * 16 * L.ldv(), L.ldv(), Gs, L.ldv(), DV);    // dP^T
            __syncwarp();
#pragma unroll 4
            for (int j = 0; j < 32; j++) {
                const int c = half * 32 + j, tq = t0 + c;
                float p = 0.0f, ds = 0.0f;
                if (tq >= s && tq < T && s < T) {
                    p = expf(scale * Sw[r * LD_T + c] - lse_s[c]);
                    ds = p * (Dw[r * LD_T + c] - del_s[c]);
                }
                Pw[r * LD_TH + c] = to_bf16(p);
                Ew[r * LD_TH + c] = to_bf16(ds);
            }
            __syncwarp();
            mma_acc_pm(Avw, L.ldav(), Pw, LD_TH, Gs, L.ldv(), DV);
            mma_acc_pm(Akw, L.ldaq(), Ew, LD_TH, Qs, L.ldq(), DQK);
            __syncwarp();
        }
    }
    if (s < T) {
        bf16 *gk = dk + (((size_t)b * T + s) * NKV + kvh) * DQK, *gv = dv + (((size_t)b * T + s) * NKV + kvh) * DV;
        for (int d = half; d < DQK; d += 2) gk[d] = to_bf16(ld(gk + d) + scale * Akw[r * L.ldaq() + d]);
        for (int d = half; d < DV; d += 2) gv[d] = to_bf16(ld(gv + d) + Avw[r * L.ldav() + d]);
    }
}

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

// Whether the tensor-core kernels take this call: widths multiples of 16, 16-byte aligned
// buffers, B NH within a grid's y dimension (heads), every kernel's tiles within the device's
// shared memory per block (an A100's 163 KiB takes the forward and dQ of 128-wide heads but not
// dK, dV: then the warp kernels take the whole op), and not turned off
// (CLLA_CUDA_ATTENTION=warp or cuda_attention_use_tensor_cores(0)).
int cuda_attention_tc_fits(int DQK, int DV, long long heads, const void *const *ptrs, int nptrs) {
    if (!tc_enabled() || DQK % 16 != 0 || DV % 16 != 0 || DQK <= 0 || DV <= 0 || heads > 65535) return 0;
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
    const size_t sb = tc_prepare((const void *)attention_tc_forward_kernel, TC_FORWARD, DQK, DV);
    const dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)(B * NH));
    attention_tc_forward_kernel<<<grid, ATT_TC_THREADS, sb>>>(out, lse, q, k, v, T, NH, NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
}

// delta: Delta = rowsum(dO * O), (B, NH, T), computed by the caller.
void cuda_attention_tc_backward(bf16 *dq, bf16 *dk, bf16 *dv, const float *delta, const bf16 *dout, const float *lse,
                                const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV, int DQK,
                                int DV, float scale) {
    const unsigned tiles = (unsigned)((T + TILE - 1) / TILE);
    size_t sb = tc_prepare((const void *)attention_tc_dq_kernel, TC_DQ, DQK, DV);
    attention_tc_dq_kernel<<<dim3(tiles, (unsigned)(B * NH)), ATT_TC_THREADS, sb>>>(dq, dout, lse, delta, q, k, v, T, NH,
                                                                                   NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
    sb = tc_prepare((const void *)attention_tc_dkv_kernel, TC_DKV, DQK, DV);
    attention_tc_dkv_kernel<<<dim3(tiles, (unsigned)(B * NKV)), ATT_TC_THREADS, sb>>>(dk, dv, dout, lse, delta, q, k, v, T,
                                                                                     NH, NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
}
