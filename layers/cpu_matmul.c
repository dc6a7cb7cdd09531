// Linear layer without bias, PyTorch weight layout: out = inp @ weight^T.
// Each of the three products is cut into one part per OpenMP thread, each part one
// single-threaded sgemm (OpenBLAS runs single-threaded inside an OpenMP region): rows of out and
// dinp, output channels of dweight. OpenBLAS threading one call itself shares packed blocks of
// an operand between its threads, which wait for each other at every block, and on a shared
// machine a thread that loses its core for a moment stalls the other there; the parts
// synchronize once, at the end (docs/COMMANDS.md, bench_train; bench/ab.sh matmul). Per element
// the sum runs over the same blocks of the inner dimension as in one call, so the bits do not
// depend on the thread count (tests/test_ops.c), as long as the parts follow layers/cpu_parts.h
// (over OpenBLAS's small-matrix bound, starting at multiples of its kernels' row unroll); a
// product too small for that runs as one call on one thread (sgemm_parts). Called inside an OpenMP region, the parts run one after the other on the calling
// thread, with the same bits.
#include "layers/cpu_ops.h"
#include "layers/cpu_parts.h"

#include <cblas.h>
#include <omp.h>
#include <stddef.h>

#include "common/vec.h"

// A few rows (decoding: one token per sequence): OpenBLAS's sgemm packs the whole weight for
// them and ran 2-10x slower than reading it once (bench/bench_decode.c, OpenBLAS 0.3.21). Here
// the weight is read once, in blocks of 4 rows split over the threads, and dotted with every
// input row in register tiles: 2 weight rows x 8 input rows (16 accumulators: 10 loads per 16
// multiply-adds), 2 x 4 for 4 to 7 rows, and 4 weight rows x 1 input row for the rest (the
// batch-1 case: 4 independent add chains). Every tile asks for the weight rows WEIGHT_AHEAD rows
// on into L2 as it goes: the hardware prefetcher alone left the weight stream at 9-25 GB/s, the
// core waiting on each new row (bench/ab.sh matmul_rows). Every dot sums in the same order
// whatever tile computes it (8 lanes over k, then vec_sum and the tail), so a sequence's output
// does not depend on what else is in the batch or on the thread count. Vectors and fused
// multiply-adds: common/vec.h.
#define SMALL_N 8
#define WEIGHT_AHEAD 8

// vec_sum of the lanes, then the C % 8 tail in order
static inline float dot_finish(vecf acc, const float *a, const float *b, int k0, int n) {
    float s = vec_sum(acc);
    for (int k = k0; k < n; k++) s += a[k] * b[k];
    return s;
}

#define VEC_END(C) ((C) / VEC_LANES * VEC_LANES)

// The first of `rows` weight rows WEIGHT_AHEAD rows after row o, or row o itself near the end
// (rows within the weight: asked for again, they cost nothing)
static inline const float *ahead_rows(const float *weight, int C, int OC, int o, int rows) {
    const int a = o + WEIGHT_AHEAD + rows <= OC ? o + WEIGHT_AHEAD : o;
    return weight + (size_t)a * C;
}

// the 64-byte line at column k of `rows` rows from p into L2, once per line (k steps by 8 floats).
// Always inlined: GCC 12 at -O2 finds a function of prefetches alone free of side effects
// (ipa-pure-const) and deletes the calls to it, so a plain static one asked for nothing
// (tests/test_prefetch_kept.sh counts the prefetch instructions of this file's object).
static inline __attribute__((always_inline)) void prefetch_weight(const float *p, int C, int rows, int k) {
    if (k & 15) return;
    for (int j = 0; j < rows; j++) __builtin_prefetch(p + (size_t)j * C + k, 0, 2);
}

// out[(n0 + j) * OC + o + i] for weight rows o, o + 1 (i) and input rows n0 .. n0 + R - 1 (j),
// R = 4 or 8: 2R accumulators, each weight row piece loaded once for the R inputs. Inlined with R
// a constant (tile_2x8, tile_2x4), so that the loops over j unroll and the accumulators stay in
// registers.
static inline __attribute__((always_inline)) void tile_2xr(const int R, float *out, const float *inp, const float *weight, int C,
                                                           int OC, int o, int n0) {
    const float *w0 = weight + (size_t)o * C, *w1 = w0 + C, *p = ahead_rows(weight, C, OC, o, 2);
    const float *x[8];
    vecf a0[8], a1[8];
#pragma GCC unroll 8
    for (int j = 0; j < R; j++) x[j] = inp + (size_t)(n0 + j) * C, a0[j] = a1[j] = (vecf){0};
    const int end = VEC_END(C);
    for (int k = 0; k < end; k += VEC_LANES) {
        prefetch_weight(p, C, 2, k);
        const vecf u = vec_load(w0 + k), v = vec_load(w1 + k);
#pragma GCC unroll 8
        for (int j = 0; j < R; j++) {
            const vecf y = vec_load(x[j] + k);
            a0[j] += u * y;
            a1[j] += v * y;
        }
    }
    float *r = out + (size_t)n0 * OC + o;
#pragma GCC unroll 8
    for (int j = 0; j < R; j++) {
        r[(size_t)j * OC] = dot_finish(a0[j], w0, x[j], end, C);
        r[(size_t)j * OC + 1] = dot_finish(a1[j], w1, x[j], end, C);
    }
}

static void tile_2x8(float *out, const float *inp, const float *weight, int C, int OC, int o, int n0) {
    tile_2xr(8, out, inp, weight, C, OC, o, n0);
}

static void tile_2x4(float *out, const float *inp, const float *weight, int C, int OC, int o, int n0) {
    tile_2xr(4, out, inp, weight, C, OC, o, n0);
}

// out[n * OC + o .. o + 3] for weight rows o .. o + 3 and input row n
static void tile_4x1(float *out, const float *inp, const float *weight, int C, int OC, int o, int n) {
    const float *w0 = weight + (size_t)o * C, *w1 = w0 + C, *w2 = w1 + C, *w3 = w2 + C, *x0 = inp + (size_t)n * C;
    const float *p = ahead_rows(weight, C, OC, o, 4);
    vecf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int end = VEC_END(C);
    for (int k = 0; k < end; k += VEC_LANES) {
        prefetch_weight(p, C, 4, k);
        vecf x = vec_load(x0 + k);
        a0 += vec_load(w0 + k) * x; a1 += vec_load(w1 + k) * x; a2 += vec_load(w2 + k) * x; a3 += vec_load(w3 + k) * x;
    }
    float *r = out + (size_t)n * OC + o;
    r[0] = dot_finish(a0, w0, x0, end, C); r[1] = dot_finish(a1, w1, x0, end, C);
    r[2] = dot_finish(a2, w2, x0, end, C); r[3] = dot_finish(a3, w3, x0, end, C);
}

static float dot_1x1(const float *w0, const float *x0, int C) {
    vecf a = {0};
    int end = VEC_END(C);
    for (int k = 0; k < end; k += VEC_LANES) a += vec_load(w0 + k) * vec_load(x0 + k);
    return dot_finish(a, w0, x0, end, C);
}

static void matmul_few_rows(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    int blocks = OC / 4;
    #pragma omp parallel for schedule(static) if ((size_t)OC * C >= ((size_t)1 << 15))
    for (int b = 0; b < blocks; b++) {
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            tile_2x8(out, inp, weight, C, OC, 4 * b, n);
            tile_2x8(out, inp, weight, C, OC, 4 * b + 2, n);
        }
        for (; n + 4 <= N; n += 4) {
            tile_2x4(out, inp, weight, C, OC, 4 * b, n);
            tile_2x4(out, inp, weight, C, OC, 4 * b + 2, n);
        }
        for (; n < N; n++) tile_4x1(out, inp, weight, C, OC, 4 * b, n);
    }
    for (int o = 4 * blocks; o < OC; o++)
        for (int n = 0; n < N; n++) out[(size_t)n * OC + o] = dot_1x1(weight + (size_t)o * C, inp + (size_t)n * C, C);
}

// Parts of a product whose M rows are cut (the other two sizes N and K): one per thread where
// layers/cpu_parts.h's rules allow, else one (a call OpenBLAS threads itself, or runs on its
// small kernels).
static int parts_for(int M, int N, int K) {
    const int nt = omp_get_max_threads();
    return nt <= 1 ? 1 : cpu_parts(M, nt, (double)N * K);
}

// C (M, N; ldc) = op(A) B' + beta C, op(A) (M, K) from A (M, K; lda) as it lies or (ta = CblasTrans)
// A^T of A (K, M; lda), B' = op_b(B) (K, N), its M rows cut into parts_for's parts
static void sgemm_parts(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
    const int parts = parts_for(M, N, K);
    if (parts == 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
        // One call on one thread: OpenBLAS would thread it itself, and a threaded call cuts the
        // inner dimension into other blocks than a single-threaded one (OpenBLAS 0.3.21's
        // level3_thread.c against level3.c, past its 384-wide blocks), so its bits followed the
        // thread count (tests/test_ops.c, K = 500 and 900). Such a product is small (its parts
        // would be under the small-matrix bound). The thread count is this thread's setting,
        // which the OpenMP build of OpenBLAS reads at each call.
        const int nt = omp_get_max_threads();
        omp_set_num_threads(1);
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
        omp_set_num_threads(nt);
        return;
    }
    #pragma omp parallel for schedule(static) if (parts > 1)
    for (int p = 0; p < parts; p++) {
        const int r0 = cpu_part_start(M, parts, p), rows = cpu_part_start(M, parts, p + 1) - r0;
        cblas_sgemm(CblasRowMajor, ta, tb, rows, N, K, 1.0f, ta == CblasNoTrans ? A + (size_t)r0 * lda : A + r0, lda, B, ldb,
                    beta, C + (size_t)r0 * ldc, ldc);
    }
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
void cpu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {   // empty reduction: sgemm would reject lda = 0; the product is zero
        for (size_t i = 0; i < (size_t)N * OC; i++) out[i] = 0.0f;
        return;
    }
    if (N <= SMALL_N) {
        matmul_few_rows(out, inp, weight, N, C, OC);
        return;
    }
    sgemm_parts(CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, 0.0f, out, OC);
}

// dinp (N, C) += dout (N, OC) @ weight (OC, C) for a few rows: each weight row, scaled, added
// into every input-gradient row, the weight read once; columns in blocks over the threads when
// the weight is large. Every element sums over o in order whatever the threads, so the bits do
// not depend on the thread count. OpenBLAS's sgemv woke its own thread team at every call, and
// a latent preset's decode step makes eight such calls a layer (the absorbed query, model/decode.c).
#define DINP_CBLOCK 256
static void dinp_few_rows(float *dinp, const float *dout, const float *weight, int N, int C, int OC) {
    const int blocks = (C + DINP_CBLOCK - 1) / DINP_CBLOCK;
    #pragma omp parallel for schedule(static) if ((size_t)OC * C >= ((size_t)1 << 17))
    for (int b = 0; b < blocks; b++) {
        const int c0 = b * DINP_CBLOCK, c1 = c0 + DINP_CBLOCK < C ? c0 + DINP_CBLOCK : C;
        const int vend = c0 + (c1 - c0) / VEC_LANES * VEC_LANES;
        for (int n = 0; n < N; n++) {
            float *d = dinp + (size_t)n * C;
            const float *g = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++) {
                const float *w = weight + (size_t)o * C;
                const vecf s = vec_splat(g[o]);
                for (int c = c0; c < vend; c += VEC_LANES) vec_store(d + c, vec_fma(s, vec_load(w + c), vec_load(d + c)));
                for (int c = vend; c < c1; c++) d[c] += g[o] * w[c];
            }
        }
    }
}

// dinp (N, C) += dout (N, OC) @ weight (OC, C)
// dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
// beta = 1 gives the accumulate semantics for free. Either output may be NULL: the
// first layer's input (embedding output) still needs dinp, but e.g. a frozen or input-side
// consumer may skip it.
void cpu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;   // every product is empty: += 0
    if (dinp && N <= 4)   // a few rows: the weight read once, as in the forward
        dinp_few_rows(dinp, dout, weight, N, C, OC);
    else if (dinp)
        sgemm_parts(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight)   // parts of the output channels
        sgemm_parts(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
}
