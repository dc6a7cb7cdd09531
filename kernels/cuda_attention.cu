// Causal softmax attention with grouped heads, without the T x T matrix (the contract of
// backend/backend.h): the forward keeps out and the row log-sum-exp lse, the backward recomputes
// the probabilities from them. Query head h reads kv head h / (NH / NKV).
//
// Layouts (row-major): q (B, T, NH, DQK), k (B, T, NKV, DQK), v (B, T, NKV, DV), out (B, T, NH,
// DV), all bf16; lse and the backward's scratch Delta (B, NH, T) fp32.
//
// This is the correctness-first version (docs/GPU.md, "Attention"): one warp per query row
// (forward, dQ) or key row (dK, dV), fp32 arithmetic on CUDA cores, the forward's online softmax
// over steps of 64 keys (the tensor-core kernel's tile; the backward's P comes from the final lse
// and takes 32 at a time), the output or gradient row in registers spread over the lanes (lane l
// holds elements l, l + 32, ...; widths up to ATT_MAX_D). Causal work only: a row
// visits the keys (queries) on its side of the diagonal. Like the CPU op, P (for P V and dV) and
// dS (for dQ and dK) are rounded to bf16 where a tensor-core kernel would read them, and lse is
// accumulated from the unrounded P, so the cpu-bf16 backend predicts this one. dK and dV sum a
// group's query heads in fp32 registers and are added to the bf16 gradient once; nothing is
// added by two warps, so the result does not depend on the schedule.
//
// These kernels are the fallback: head widths that are multiples of 16 in 16-byte aligned
// buffers go to the tensor-core kernels of kernels/cuda_attention_tc.cu (same contract, same
// roundings); CLLA_CUDA_ATTENTION=warp keeps every call here.
#include "kernels/cuda_attention_tc.cuh"

#define ATT_MAX_D CUDA_ATT_MAX_D      // widest DQK and DV (8 registers per lane; kernels/cuda_ops.h)
#define ATT_REGS (ATT_MAX_D / 32)
#define ATT_WARPS 4                   // rows per block

static __device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// dot(x (fp32, shared), y (bf16, global)) over n, sequential: one lane's whole dot product.
static __device__ __forceinline__ float dot_row(const float *x, const bf16 *y, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += x[d] * ld(y + d);
    return s;
}

// Copies a bf16 row of n into the warp's shared row (fp32), lanes striding.
static __device__ __forceinline__ void row_to_shared(float *dst, const bf16 *src, int n, int lane) {
    for (int d = lane; d < n; d += 32) dst[d] = ld(src + d);
    __syncwarp();
}

// acc (lane l holds elements l, l + 32, ...) += sum_j w_j row_j over the n <= 32 rows starting at
// rows (row stride `stride`, width `width`), w_j being lane j's w: the weighted sum of a chunk.
static __device__ __forceinline__ void add_weighted_rows(float acc[ATT_REGS], float w, const bf16 *rows, size_t stride,
                                                         int n, int width, int lane) {
    for (int j = 0; j < n; j++) {
        const float wj = __shfl_sync(0xFFFFFFFFu, w, j);
        const bf16 *r = rows + (size_t)j * stride;
#pragma unroll
        for (int i = 0; i < ATT_REGS; i++) {
            const int d = lane + 32 * i;
            if (d < width) acc[i] += wj * ld(r + d);
        }
    }
}

// One warp per query row r = (b, h, t), r in [0, B NH T).
__global__ void attention_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T,
                                         int NH, int NKV, int DQK, int DV, float scale) {
    extern __shared__ float sh[];   // ATT_WARPS rows of DQK: the warp's query
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * ATT_WARPS + warp;
    if (r >= (size_t)B * NH * T) return;
    const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / ((size_t)T * NH)), kvh = h / (NH / NKV);
    float *qs = sh + (size_t)warp * DQK;
    row_to_shared(qs, q + (((size_t)b * T + t) * NH + h) * DQK, DQK, lane);
    const bf16 *kb = k + (size_t)b * T * NKV * DQK + (size_t)kvh * DQK;
    const bf16 *vb = v + (size_t)b * T * NKV * DV + (size_t)kvh * DV;
    float o[ATT_REGS];
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    // 64 keys per step (lane j scores keys s0 + j and s0 + 32 + j): the running maximum, against
    // which P is rounded, moves where the tensor-core kernel's does (its 64-key tiles) and where
    // cpu-bf16 moves it (layers/cpu_attention.c, exp_rounded_as_cuda)
    for (int s0 = 0; s0 <= t; s0 += 64) {
        const int sa = s0 + lane, sb = s0 + 32 + lane;
        const float sca = sa <= t ? scale * dot_row(qs, kb + (size_t)sa * NKV * DQK, DQK) : -INFINITY;
        const float scb = sb <= t ? scale * dot_row(qs, kb + (size_t)sb * NKV * DQK, DQK) : -INFINITY;
        const float mx = fmaxf(m, warp_max(fmaxf(sca, scb)));   // key s0 <= t is always in: mx finite
        const float alpha = expf(m - mx);
        const float pa = sa <= t ? expf(sca - mx) : 0.0f, pb = sb <= t ? expf(scb - mx) : 0.0f;
        l = l * alpha + warp_sum(pa + pb);
        m = mx;
#pragma unroll
        for (int i = 0; i < ATT_REGS; i++) o[i] *= alpha;
        const int na = t - s0 + 1 < 32 ? t - s0 + 1 : 32;
        add_weighted_rows(o, bf16_round(pa), vb + (size_t)s0 * NKV * DV, (size_t)NKV * DV, na, DV, lane);
        if (s0 + 32 <= t) {
            const int nb = t - s0 - 31 < 32 ? t - s0 - 31 : 32;
            add_weighted_rows(o, bf16_round(pb), vb + (size_t)(s0 + 32) * NKV * DV, (size_t)NKV * DV, nb, DV, lane);
        }
    }
    bf16 *orow = out + (((size_t)b * T + t) * NH + h) * DV;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) {
        const int d = lane + 32 * i;
        if (d < DV) orow[d] = to_bf16(o[i] * inv);
    }
    if (lane == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(l);
}

// Delta (b, h, t) = dO . O, one warp per row.
__global__ void attention_delta_kernel(float *delta, const bf16 *dout, const bf16 *out, int B, int T, int NH, int DV) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * ATT_WARPS + warp;
    if (r >= (size_t)B * NH * T) return;
    const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / ((size_t)T * NH));
    const size_t off = (((size_t)b * T + t) * NH + h) * DV;
    float s = 0.0f;
    for (int d = lane; d < DV; d += 32) s += ld(dout + off + d) * ld(out + off + d);
    s = warp_sum(s);
    if (lane == 0) delta[((size_t)b * NH + h) * T + t] = s;
}

// dQ row (b, h, t) += scale sum_s dS_ts k_s, dS = P (dP - Delta), P = exp(S - lse), dP = dO v^T.
__global__ void attention_dq_kernel(bf16 *dq, const bf16 *dout, const float *lse, const float *delta, const bf16 *q,
                                    const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV, int DQK, int DV,
                                    float scale) {
    extern __shared__ float sh[];   // ATT_WARPS x (DQK + DV): the warp's query and dO rows
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * ATT_WARPS + warp;
    if (r >= (size_t)B * NH * T) return;
    const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / ((size_t)T * NH)), kvh = h / (NH / NKV);
    float *qs = sh + (size_t)warp * (DQK + DV), *gs = qs + DQK;
    const size_t qrow = ((size_t)b * T + t) * NH + h;
    row_to_shared(qs, q + qrow * DQK, DQK, lane);
    row_to_shared(gs, dout + qrow * DV, DV, lane);
    const bf16 *kb = k + (size_t)b * T * NKV * DQK + (size_t)kvh * DQK;
    const bf16 *vb = v + (size_t)b * T * NKV * DV + (size_t)kvh * DV;
    const float lt = lse[((size_t)b * NH + h) * T + t], dt = delta[((size_t)b * NH + h) * T + t];
    float acc[ATT_REGS];
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) acc[i] = 0.0f;
    for (int s0 = 0; s0 <= t; s0 += 32) {
        const int s = s0 + lane;
        float ds = 0.0f;
        if (s <= t && t > 0) {   // t = 0: dS is exactly 0 (FIRST_QUERY, layers/cpu_attention.c)
            const float p = expf(scale * dot_row(qs, kb + (size_t)s * NKV * DQK, DQK) - lt);
            ds = bf16_round(p * (dot_row(gs, vb + (size_t)s * NKV * DV, DV) - dt));
        }
        const int n = t - s0 + 1 < 32 ? t - s0 + 1 : 32;
        add_weighted_rows(acc, ds, kb + (size_t)s0 * NKV * DQK, (size_t)NKV * DQK, n, DQK, lane);
    }
    bf16 *g = dq + qrow * DQK;
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) {
        const int d = lane + 32 * i;
        if (d < DQK) g[d] = to_bf16(ld(g + d) + scale * acc[i]);
    }
}

// dK, dV row (b, kvh, s) += over the group's heads and queries t >= s: scale dS_ts q_t, P_ts dO_t.
__global__ void attention_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta,
                                     const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int NKV,
                                     int DQK, int DV, float scale) {
    extern __shared__ float sh[];   // ATT_WARPS x (DQK + DV): the warp's key and value rows
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * ATT_WARPS + warp;
    if (r >= (size_t)B * NKV * T) return;
    const int s = (int)(r % T), kvh = (int)(r / T % NKV), b = (int)(r / ((size_t)T * NKV)), G = NH / NKV;
    float *ks = sh + (size_t)warp * (DQK + DV), *vs = ks + DQK;
    const size_t krow = ((size_t)b * T + s) * NKV + kvh;
    row_to_shared(ks, k + krow * DQK, DQK, lane);
    row_to_shared(vs, v + krow * DV, DV, lane);
    float gk[ATT_REGS], gv[ATT_REGS];
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) gk[i] = gv[i] = 0.0f;
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        const bf16 *qb = q + (size_t)b * T * NH * DQK + (size_t)h * DQK;
        const bf16 *gb = dout + (size_t)b * T * NH * DV + (size_t)h * DV;
        const float *lh = lse + ((size_t)b * NH + h) * T, *dh = delta + ((size_t)b * NH + h) * T;
        for (int t0 = s; t0 < T; t0 += 32) {
            const int t = t0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (t < T) {
                const float pf = expf(scale * dot_row(ks, qb + (size_t)t * NH * DQK, DQK) - lh[t]);
                if (t > 0) ds = bf16_round(pf * (dot_row(vs, gb + (size_t)t * NH * DV, DV) - dh[t]));   // FIRST_QUERY
                p = bf16_round(pf);
            }
            const int n = T - t0 < 32 ? T - t0 : 32;
            add_weighted_rows(gk, ds, qb + (size_t)t0 * NH * DQK, (size_t)NH * DQK, n, DQK, lane);
            add_weighted_rows(gv, p, gb + (size_t)t0 * NH * DV, (size_t)NH * DV, n, DV, lane);
        }
    }
    bf16 *gkr = dk + krow * DQK, *gvr = dv + krow * DV;
#pragma unroll
    for (int i = 0; i < ATT_REGS; i++) {
        const int d = lane + 32 * i;
        if (d < DQK) gkr[d] = to_bf16(ld(gkr + d) + scale * gk[i]);
        if (d < DV) gvr[d] = to_bf16(ld(gvr + d) + gv[i]);
    }
}

static void check_shape(int NH, int NKV, int DQK, int DV) {
    if (NKV <= 0 || NH % NKV != 0)
        die("attention: %d query heads cannot be grouped over %d kv heads: num_key_value_heads must divide num_attention_heads", NH, NKV);
    if (DQK > ATT_MAX_D || DV > ATT_MAX_D)
        die("attention: head widths %d (query/key) and %d (value) exceed the CUDA kernel's %d: use narrower heads or "
            "raise ATT_MAX_D in kernels/cuda_attention.cu", DQK, DV, ATT_MAX_D);
}

static unsigned row_blocks(size_t rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

// Dynamic shared memory of a kernel; above the 48 KiB default it must be opted into.
static size_t shared_bytes(const void *kernel, int per_warp_floats) {
    const size_t bytes = (size_t)ATT_WARPS * per_warp_floats * sizeof(float);
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return bytes;
}

extern "C" void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                       int T, int NH, int NKV, int DQK, int DV, float scale) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_shape(NH, NKV, DQK, DV);
    const void *ptrs[] = {out, q, k, v};
    if (cuda_attention_tc_fits(DQK, DV, (long long)B * NH, ptrs, 4)) {
        cuda_attention_tc_forward((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, NH, NKV, DQK,
                                  DV, scale);
        return;
    }
    const size_t rows = (size_t)B * NH * T;
    const size_t sb = shared_bytes((const void *)attention_forward_kernel, DQK);
    attention_forward_kernel<<<row_blocks(rows), 32 * ATT_WARPS, sb>>>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                                     (const bf16 *)v, B, T, NH, NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
}

extern "C" void cuda_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                        const float *out, const float *lse, const float *q, const float *k,
                                        const float *v, int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_shape(NH, NKV, DQK, DV);
    const size_t rows = (size_t)B * NH * T, kv_rows = (size_t)B * NKV * T;
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v, *dO = (const bf16 *)dout;
    attention_delta_kernel<<<row_blocks(rows), 32 * ATT_WARPS>>>(scratch, dO, (const bf16 *)out, B, T, NH, DV);
    CUDA_LAUNCHED();
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v};
    if (cuda_attention_tc_fits(DQK, DV, (long long)B * NH, ptrs, 7)) {
        cuda_attention_tc_backward((bf16 *)dq, (bf16 *)dk, (bf16 *)dv, scratch, dO, lse, Q, K, V, B, T, NH, NKV, DQK, DV,
                                   scale);
        return;
    }
    size_t sb = shared_bytes((const void *)attention_dq_kernel, DQK + DV);
    attention_dq_kernel<<<row_blocks(rows), 32 * ATT_WARPS, sb>>>((bf16 *)dq, dO, lse, scratch, Q, K, V, B, T, NH, NKV,
                                                                DQK, DV, scale);
    CUDA_LAUNCHED();
    sb = shared_bytes((const void *)attention_dkv_kernel, DQK + DV);
    attention_dkv_kernel<<<row_blocks(kv_rows), 32 * ATT_WARPS, sb>>>((bf16 *)dk, (bf16 *)dv, dO, lse, scratch, Q, K,
                                                                    V, B, T, NH, NKV, DQK, DV, scale);
    CUDA_LAUNCHED();
}
