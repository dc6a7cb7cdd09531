// Causal softmax attention with grouped heads (MHA: NKV = NH, GQA, MQA: NKV = 1).
//
// Layouts (row-major): q (B, T, NH, DQK), k (B, T, NKV, DQK), v (B, T, NKV, DV),
// out (B, T, NH, DV), att (B, NH, T, T). Query head h reads kv head h / (NH / NKV).
// A head's rows are strided views (row t of head h of q is at q + (b T + t) NH DQK + h DQK),
// which sgemm takes directly through its leading dimension: no transposed copies.
//
// Work is split into query-row blocks of ATT_BLOCK rows. For rows [r0, r1) only key
// columns [0, r1) can be unmasked, so each block multiplies just that rectangle: about half
// the flops of a full T x T product. Blocks are independent OpenMP tasks, each calling a
// single-threaded sgemm (OpenBLAS's OpenMP build does not thread inside a parallel region),
// so the parallelism is over (b, h, block) and the result does not depend on the schedule.
//
// The *_bf16p variants serve the bf16 emulation backend (layers/backend_cpu_bf16.c): the
// CUDA attention hands P and dS to its GEMMs as bf16 copies (tensor cores take one input
// type) while att keeps fp32 P, so these round P (for P V and dV) and dS (for dQ and dK) to
// bf16 at the same points. One implementation with a flag, so the two cannot drift apart.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "backend/bf16.h"

#define ATT_BLOCK 64

static inline int imin(int a, int b) { return a < b ? a : b; }

// dst (rows, cols), row stride ld_dst = bf16 round-to-nearest-even of src (row stride ld_src).
static void round_block_bf16(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            dst[(size_t)i * ld_dst + j] = sr_bf16_to_f32(sr_f32_to_bf16_rne(src[(size_t)i * ld_src + j]));
}

// out, att: written (not accumulated). scores = scale * q.k; s > t masked.
// bf16p: P V multiplies the bf16-rounded P (att itself stays fp32).
static void attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                              int B, int T, int NH, int NKV, int DQK, int DV, float scale, int bf16p) {
    assert(NKV > 0 && NH % NKV == 0 && DQK > 0 && DV > 0);
    const int group = NH / NKV;
    const int nblk = (T + ATT_BLOCK - 1) / ATT_BLOCK;
    const int ldq = NH * DQK, ldk = NKV * DQK, ldv = NKV * DV, ldo = NH * DV;
    // dynamic: later blocks have more columns, so static chunks would be unbalanced.
    #pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int blk = 0; blk < nblk; blk++) {
                const int kvh = h / group;
                const int r0 = blk * ATT_BLOCK, r1 = imin(T, r0 + ATT_BLOCK), rows = r1 - r0;
                const float *qh = q + (size_t)b * T * ldq + (size_t)h * DQK;
                const float *kh = k + (size_t)b * T * ldk + (size_t)kvh * DQK;
                const float *vh = v + (size_t)b * T * ldv + (size_t)kvh * DV;
                float *oh = out + (size_t)b * T * ldo + (size_t)h * DV;
                float *a = att + ((size_t)b * NH + h) * T * T;
                // scores[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, DQK,
                            scale, qh + (size_t)r0 * ldq, ldq, kh, ldk,
                            0.0f, a + (size_t)r0 * T, T);
                // softmax over s <= t; everything above the diagonal (also s >= r1, which the
                // sgemm did not touch) is set to 0, both as the contract's att and so that the
                // PV product below can run over the whole [0, r1) rectangle.
                for (int t = r0; t < r1; t++) {
                    float *row = a + (size_t)t * T;
                    float m = -INFINITY;
                    for (int s = 0; s <= t; s++) m = row[s] > m ? row[s] : m;
                    double sum = 0.0;
                    for (int s = 0; s <= t; s++) {
                        row[s] = expf(row[s] - m);
                        sum += row[s];
                    }
                    const float inv = (float)(1.0 / sum);
                    for (int s = 0; s <= t; s++) row[s] *= inv;
                    if (t + 1 < T) memset(row + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
                }
                // out[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
                float *pb = NULL;
                if (bf16p) {
                    pb = xmalloc((size_t)rows * r1 * sizeof(float));
                    round_block_bf16(pb, r1, a + (size_t)r0 * T, T, rows, r1);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, DV, r1,
                            1.0f, pb ? pb : a + (size_t)r0 * T, pb ? r1 : T, vh, ldv,
                            0.0f, oh + (size_t)r0 * ldo, ldo);
                free(pb);
            }
        }
    }
}

void cpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                           int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    attention_forward(out, att, q, k, v, B, T, NH, NKV, DQK, DV, scale, 0);
}

void cpu_attention_forward_bf16p(float *out, float *att, const float *q, const float *k, const float *v,
                                 int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    attention_forward(out, att, q, k, v, B, T, NH, NKV, DQK, DV, scale, 1);
}

// With P = softmax(S), S = scale Q K^T (causal), O = P V and dO given:
//   dV = P^T dO ; dP = dO V^T ; dS = P * (dP - rowsum(P * dP)) ; dQ = scale dS K ; dK = scale dS^T Q
// dq, dk, dv accumulate. scratch (B, NH, T, T) holds dS.
//
// Phase 1, tasks (b, h, query block): dS rows and dQ rows; each task owns its rows.
// Phase 2, tasks (b, kv head, key block): dK and dV rows of that key block, summing the
// group's query heads in a fixed order. A kv head is shared by NH/NKV query heads, so
// splitting phase 2 by query head would make several tasks add into the same dK rows; owning
// the kv rows instead keeps it race-free without atomics and deterministic.
// bf16p: dS is rounded to bf16 in scratch before the dQ and dK products, and dV multiplies
// the bf16-rounded P.
static void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *att, const float *q, const float *k, const float *v,
                               int B, int T, int NH, int NKV, int DQK, int DV, float scale, int bf16p) {
    assert(NKV > 0 && NH % NKV == 0 && DQK > 0 && DV > 0);
    const int group = NH / NKV;
    const int nblk = (T + ATT_BLOCK - 1) / ATT_BLOCK;
    const int ldq = NH * DQK, ldk = NKV * DQK, ldv = NKV * DV, ldo = NH * DV;

    #pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int blk = 0; blk < nblk; blk++) {
                const int kvh = h / group;
                const int r0 = blk * ATT_BLOCK, r1 = imin(T, r0 + ATT_BLOCK), rows = r1 - r0;
                const float *kh = k + (size_t)b * T * ldk + (size_t)kvh * DQK;
                const float *vh = v + (size_t)b * T * ldv + (size_t)kvh * DV;
                const float *doh = dout + (size_t)b * T * ldo + (size_t)h * DV;
                float *dqh = dq + (size_t)b * T * ldq + (size_t)h * DQK;
                const float *a = att + ((size_t)b * NH + h) * T * T;
                float *ds = scratch + ((size_t)b * NH + h) * T * T;
                // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, DV,
                            1.0f, doh + (size_t)r0 * ldo, ldo, vh, ldv,
                            0.0f, ds + (size_t)r0 * T, T);
                // softmax backward, row by row; zero above the diagonal so that phase 2 and
                // the dQ product can multiply whole rectangles.
                for (int t = r0; t < r1; t++) {
                    const float *p = a + (size_t)t * T;
                    float *d = ds + (size_t)t * T;
                    double dot = 0.0;
                    for (int s = 0; s <= t; s++) dot += (double)p[s] * d[s];
                    const float fdot = (float)dot;
                    for (int s = 0; s <= t; s++) d[s] = p[s] * (d[s] - fdot);
                    if (bf16p) round_block_bf16(d, T, d, T, 1, t + 1);
                    if (t + 1 < T) memset(d + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
                }
                // dQ[r0:r1] += scale * dS[r0:r1, 0:r1] K[0:r1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, DQK, r1,
                            scale, ds + (size_t)r0 * T, T, kh, ldk,
                            1.0f, dqh + (size_t)r0 * ldq, ldq);
            }
        }
    }

    #pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            for (int blk = 0; blk < nblk; blk++) {
                // key rows [s0, s1) receive gradient only from query rows t >= s0.
                const int s0 = blk * ATT_BLOCK, s1 = imin(T, s0 + ATT_BLOCK), keys = s1 - s0;
                float *dkh = dk + (size_t)b * T * ldk + (size_t)kvh * DQK;
                float *dvh = dv + (size_t)b * T * ldv + (size_t)kvh * DV;
                float *pb = bf16p ? xmalloc((size_t)(T - s0) * keys * sizeof(float)) : NULL;
                for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                    const float *qh = q + (size_t)b * T * ldq + (size_t)h * DQK;
                    const float *doh = dout + (size_t)b * T * ldo + (size_t)h * DV;
                    const float *a = att + ((size_t)b * NH + h) * T * T;
                    const float *ds = scratch + ((size_t)b * NH + h) * T * T;
                    // dK[s0:s1] += scale * dS[s0:T, s0:s1]^T Q[s0:T]
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, DQK, T - s0,
                                scale, ds + (size_t)s0 * T + s0, T, qh + (size_t)s0 * ldq, ldq,
                                1.0f, dkh + (size_t)s0 * ldk, ldk);
                    // dV[s0:s1] += P[s0:T, s0:s1]^T dO[s0:T]
                    if (pb) round_block_bf16(pb, keys, a + (size_t)s0 * T + s0, T, T - s0, keys);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, DV, T - s0,
                                1.0f, pb ? pb : a + (size_t)s0 * T + s0, pb ? keys : T, doh + (size_t)s0 * ldo, ldo,
                                1.0f, dvh + (size_t)s0 * ldv, ldv);
                }
                free(pb);
            }
        }
    }
}

void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *att, const float *q, const float *k, const float *v,
                            int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, T, NH, NKV, DQK, DV, scale, 0);
}

void cpu_attention_backward_bf16p(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                  const float *att, const float *q, const float *k, const float *v,
                                  int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, T, NH, NKV, DQK, DV, scale, 1);
}
