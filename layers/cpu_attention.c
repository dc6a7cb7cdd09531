// Causal softmax attention with grouped heads (MHA: NKV = NH, GQA, MQA: NKV = 1), without the
// T x T matrix: the forward keeps the output and each row's log-sum-exp, the backward
// recomputes the probabilities tile by tile from them (FlashAttention-2's contract,
// backend/backend.h).
//
// Layouts (row-major): q (B, T, NH, DQK), k (B, T, NKV, DQK), v (B, T, NKV, DV),
// out (B, T, NH, DV), lse (B, NH, T). Query head h reads kv head h / (NH / NKV). A head's rows
// are strided views (row t of head h of q is at q + (b T + t) NH DQK + h DQK), which the forward's
// sgemm takes directly through its leading dimension. Keys (and values, in the backward) are
// transposed into per-thread blocks, so that the scores and dP are products A B, which OpenBLAS
// multiplies unpacked in pieces (sgemm_small). The backward, whose five products read each
// operand several times, first packs a head's rows into contiguous per-thread copies
// (TileArgs, below).
//
// Tiles: ATT_BQ query rows by ATT_BK keys. Scores, probabilities and their gradients exist only
// as one tile per thread (64 KiB each; a tile's working set, its Q, K and V rows included, about
// 0.3 MiB at head width 64, stays in a core's L2); the tile products go through single-threaded
// sgemm (OpenBLAS's OpenMP build does not thread inside a parallel region). 128 x 128 was chosen
// by build/bench/bench_attention: against 64 x 64 the backward went from 0.30 to 0.35-0.39 of
// sgemm at T = 2048 and 8192, the forward stayed at about 0.5. Causal: key tiles right of a query tile's
// last row are skipped, not computed and masked, so the work is half the square; a block that
// reaches the diagonal is cut in two (Block, below), so a diagonal tile costs 3/4 of itself, and
// the softmax's exponentials stop at each row's last key.
//
// Forward, one task per (b, h, query tile), online softmax over its keys ATT_SPAN at a time (a
// span's scores, then its P V; up to T = ATT_SPAN no rescaling at all):
//   m' = max(m, rowmax S), P = exp(S - m'), l = l e^(m - m') + rowsum P, O = O e^(m - m') + P V,
// then out = O / l and lse = m + log l.
// Backward, with P = exp(S - lse) recomputed and Delta_t = dO_t . O_t:
//   dP = dO V^T, dS = P (dP - Delta), dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO.
// When there are enough (b, kv head) pairs to keep every thread busy, one pass: a task per
// (b, kv head) owns dK and dV of its kv head and dQ of its group's query heads, and walks its
// key tiles in order, each against the query tiles at and below it: 5 tile products per tile,
// FlashAttention-2's count. Otherwise two phases: tasks (b, h, query tile) own their dQ rows,
// then tasks (b, kv head, key tile) own their dK and dV rows, at the price of computing S and
// dP twice (7 products). Either way nothing is added by two threads (no atomics), and both sum
// every term in the same order into a zeroed accumulator that is added to dq, dk or dv once (dQ
// rows over key tiles ascending; dK and dV rows over the group's heads, then query tiles
// ascending), so the two give the same bits and the result depends neither on the thread count
// nor on the path (tests/test_ops.c checks it).
//
// The *_bf16p variants serve the bf16 emulation backend (layers/backend_cpu_bf16.c): the CUDA
// kernel hands P (for P V and dV) and dS (for dQ and dK) to its tensor-core products as bf16,
// so these round at the same points. One implementation with a flag, so the two cannot drift.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "backend/bf16.h"
#include "common/vec.h"

#define ATT_BQ 128  // query rows per tile
#define ATT_BK 128  // keys per tile
#define ATT_SPAN 512  // keys per step of the forward (a multiple of ATT_BK)

static inline int imin(int a, int b) { return a < b ? a : b; }

static inline float round_bf16(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)); }

// dst[d] = a src[d] for d < n (dst may be src), 8 lanes at a time (GCC -O2 leaves this loop scalar)
static void scale_row(float *dst, const float *src, int n, float a) {
    const vecf va = vec_splat(a);
    int d = 0;
    for (; d + VEC_LANES <= n; d += VEC_LANES) vec_store(dst + d, vec_load(src + d) * va);
    for (; d < n; d++) dst[d] = src[d] * a;
}

// The strided views of one (b, head) of the four layouts.
typedef struct Heads {
    int T, NH, NKV, DQK, DV, group;
    int ldq, ldk, ldv, ldo;
} Heads;

static Heads heads(int T, int NH, int NKV, int DQK, int DV) {
    assert(NKV > 0 && NH % NKV == 0 && DQK > 0 && DV > 0);
    return (Heads){T, NH, NKV, DQK, DV, NH / NKV, NH * DQK, NKV * DQK, NKV * DV, NH * DV};
}

// Where query head h of batch row b and its kv head start in q, k, v and (offset `o`, in
// elements) in out and dout.
typedef struct HeadRows {
    const float *q, *k, *v;
    size_t o;
} HeadRows;

static HeadRows head_rows(const Heads *hd, const float *q, const float *k, const float *v, int b, int h) {
    const int kvh = h / hd->group;
    return (HeadRows){q + (size_t)b * hd->T * hd->ldq + (size_t)h * hd->DQK,
                      k + (size_t)b * hd->T * hd->ldk + (size_t)kvh * hd->DQK,
                      v + (size_t)b * hd->T * hd->ldv + (size_t)kvh * hd->DV,
                      (size_t)b * hd->T * hd->ldo + (size_t)h * hd->DV};
}

// A block of the score matrix: query rows [r0, r0 + rows) against keys [c0, c0 + cols), c0 <= r0.
// Where it reaches the diagonal (and has more than DIAG_SPLIT rows) its first DIAG_SPLIT rows see
// only its first `cut` keys, and every product over it is cut in two there, so the part above the
// diagonal is not multiplied: a diagonal 128 x 128 tile costs 3/4 of itself (at T = 512, 9 tiles'
// work for the 8 the causal count credits, instead of 10). cut = -1: not cut.
#define DIAG_SPLIT 64

typedef struct Block {
    int r0, rows, c0, cols, cut;
} Block;

// The keys row i of a block sees: min(cols, r0 + i - c0 + 1).
static inline int keys_seen(int r0, int i, int c0, int cols) {
    const int n = r0 + i - c0 + 1;
    return n < 0 ? 0 : n < cols ? n : cols;
}

static Block block(int r0, int rows, int c0, int cols) {
    const int diag = c0 + cols - 1 > r0 && rows > DIAG_SPLIT;
    return (Block){r0, rows, c0, cols, diag ? keys_seen(r0, DIAG_SPLIT - 1, c0, cols) : -1};
}

// C (M, N; ldc) = alpha op(A) B + beta C, op(A) (M, K): A (M, K; lda) as it lies
// (ta = CblasNoTrans) or A^T of A (K, M; lda), B (K, N; ldb), in pieces that each stay within
// OpenBLAS's small-matrix bound (CPU_SGEMM_SMALL_MNK, layers/cpu_ops.h), which OpenBLAS multiplies
// with its small-matrix kernels, reading the operands where they lie instead of packing them. Every
// tile product here is just over the bound (128 x 128 x 64; the forward's P V 128 x 64 x 512), so
// one call would pack both operands every time. Two ways to cut, each where it measured faster
// (bench/ab.sh attention; docs/ATTENTION.md): CUT_ROWS, at most 128 columns and 128 of the inner
// dimension, then rows halved (ta = CblasNoTrans): the scores and dP (rows_by_keys_t) and the
// forward's P V; CUT_INNER, the inner dimension halved: the backward's dQ += dS K,
// dK += dS^T Q and dV += P^T dO. Where the bound does not apply (another OpenBLAS), the pieces
// are ordinary smaller sgemms. Each C element's pieces are added in a fixed order, so the
// result depends neither on threads nor on the backward's path.
enum { CUT_ROWS, CUT_INNER };

static void sgemm_small(CBLAS_TRANSPOSE ta, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                        float beta, float *C, int ldc, int cut) {
    int mb = M, nb = N, kb = K;
    if (cut == CUT_ROWS) {
        assert(ta == CblasNoTrans);
        nb = imin(N, ATT_BK), kb = imin(K, ATT_BK);
        while ((double)mb * nb * kb > CPU_SGEMM_SMALL_MNK && mb > 16) mb = (mb + 1) / 2;
    } else {
        while ((double)mb * nb * kb > CPU_SGEMM_SMALL_MNK && kb > 16) kb = (kb + 1) / 2;
    }
    for (int m0 = 0; m0 < M; m0 += mb)
        for (int n0 = 0; n0 < N; n0 += nb)
            for (int k0 = 0; k0 < K; k0 += kb) {
                const float *a = ta == CblasNoTrans ? A + (size_t)m0 * lda + k0 : A + (size_t)k0 * lda + m0;
                cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, imin(mb, M - m0), imin(nb, N - n0), imin(kb, K - k0), alpha, a, lda,
                            B + (size_t)k0 * ldb + n0, ldb, k0 ? 1.0f : beta, C + (size_t)m0 * ldc + n0, ldc);
            }
}

// dst[d][j] = src[j][d] for j < n, d < D (row strides ldd and lds): 8 x 8 blocks in registers
static void transpose_rows(float *dst, int ldd, const float *src, int lds, int n, int D) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        int d = 0;
        for (; d + 8 <= D; d += 8) {
            const float *s0 = src + (size_t)j * lds + d;
#define R(i) vec_load(s0 + (size_t)(i) * lds)
            vecf r0 = R(0), r1 = R(1), r2 = R(2), r3 = R(3), r4 = R(4), r5 = R(5), r6 = R(6), r7 = R(7);
#undef R
#define LO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13)
#define HI(a, b) __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15)
#define L2(a, b) __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13)
#define H2(a, b) __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15)
#define L4(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11)
#define H4(a, b) __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15)
            vecf t0 = LO(r0, r1), t1 = HI(r0, r1), t2 = LO(r2, r3), t3 = HI(r2, r3);
            vecf t4 = LO(r4, r5), t5 = HI(r4, r5), t6 = LO(r6, r7), t7 = HI(r6, r7);
            vecf u0 = L2(t0, t2), u1 = H2(t0, t2), u2 = L2(t1, t3), u3 = H2(t1, t3);
            vecf u4 = L2(t4, t6), u5 = H2(t4, t6), u6 = L2(t5, t7), u7 = H2(t5, t7);
            float *d0 = dst + (size_t)d * ldd + j;
            vec_store(d0, L4(u0, u4));
            vec_store(d0 + (size_t)1 * ldd, L4(u1, u5));
            vec_store(d0 + (size_t)2 * ldd, L4(u2, u6));
            vec_store(d0 + (size_t)3 * ldd, L4(u3, u7));
            vec_store(d0 + (size_t)4 * ldd, H4(u0, u4));
            vec_store(d0 + (size_t)5 * ldd, H4(u1, u5));
            vec_store(d0 + (size_t)6 * ldd, H4(u2, u6));
            vec_store(d0 + (size_t)7 * ldd, H4(u3, u7));
#undef LO
#undef HI
#undef L2
#undef H2
#undef L4
#undef H4
        }
        for (; d < D; d++)
            for (int i = 0; i < 8; i++) dst[(size_t)d * ldd + j + i] = src[(size_t)(j + i) * lds + d];
    }
    for (; j < n; j++)
        for (int d = 0; d < D; d++) dst[(size_t)d * ldd + j] = src[(size_t)j * lds + d];
}

// C (rows, cols; ldc) = alpha A Bt, A (rows, K; lda) the block's query rows (from its first) and
// Bt (K, cols; ldbt) its keys transposed (transpose_rows): the scores S = scale Q K^T and
// dP = dO V^T, as products A B that OpenBLAS takes unpacked in pieces (sgemm_small; its small
// kernel for A B^T, which would need no transpose, was slower than its packed one). Entries above
// a cut's keys are left unwritten: every reader stops at keys_seen and zeroes the rest of the row.
static void rows_by_keys_t(float *C, int ldc, const float *a, int lda, const float *Bt, int ldbt, int K, float alpha,
                           const Block *bk) {
    int i0 = 0;
    if (bk->cut >= 0) {
        sgemm_small(CblasNoTrans, DIAG_SPLIT, bk->cut, K, alpha, a, lda, Bt, ldbt, 0.0f, C, ldc, CUT_ROWS);
        i0 = DIAG_SPLIT;
    }
    sgemm_small(CblasNoTrans, bk->rows - i0, bk->cols, K, alpha, a + (size_t)i0 * lda, lda, Bt, ldbt, 0.0f, C + (size_t)i0 * ldc, ldc,
                CUT_ROWS);
}

// c (rows, N; ldc; from the block's first query row) += alpha P x, P (rows, cols; ldp) over the
// keys, x (cols, N; ldx) the block's key rows: O += P V and dQ += scale dS K. P must be 0 above the
// diagonal (it is not read past a cut).
static void rows_from_keys(float *c, int ldc, const float *P, int ldp, const float *x, int ldx, int N, float alpha,
                           const Block *bk, int cut) {
    int i0 = 0;
    if (bk->cut >= 0) {
        sgemm_small(CblasNoTrans, DIAG_SPLIT, N, bk->cut, alpha, P, ldp, x, ldx, 1.0f, c, ldc, cut);
        i0 = DIAG_SPLIT;
    }
    sgemm_small(CblasNoTrans, bk->rows - i0, N, bk->cols, alpha, P + (size_t)i0 * ldp, ldp, x, ldx, 1.0f, c + (size_t)i0 * ldc, ldc, cut);
}

// c (cols, N; ldc; from the block's first key) += alpha P^T x, x (rows, N; ldx) the block's query
// rows: dV += P^T dO and dK += scale dS^T Q. Keys past a cut are seen by no row before DIAG_SPLIT.
static void keys_from_rows(float *c, int ldc, const float *P, int ldp, const float *x, int ldx, int N, float alpha,
                           const Block *bk) {
    const int j0 = bk->cut >= 0 ? bk->cut : bk->cols;
    sgemm_small(CblasTrans, j0, N, bk->rows, alpha, P, ldp, x, ldx, 1.0f, c, ldc, CUT_INNER);
    if (j0 < bk->cols)
        sgemm_small(CblasTrans, bk->cols - j0, N, bk->rows - DIAG_SPLIT, alpha, P + (size_t)DIAG_SPLIT * ldp + j0, ldp,
                    x + (size_t)DIAG_SPLIT * ldx, ldx, 1.0f, c + (size_t)j0 * ldc, ldc, CUT_INNER);
}

// ---------------------------------------------------------------- forward

// The CUDA kernels' P in the forward (kernels/cuda_attention_tc.cu, kernels/cuda_attention.cu): a
// row's running maximum moves at each tile of BF16P_TILE keys (from key 0), P is rounded to bf16
// against the maximum so far, and what is already summed is rescaled in fp32 when it moves. For
// one span's row of scores x (n keys, the span starting at a multiple of BF16P_TILE; m0 the
// maximum before the span, mx after it): x[j] = bf16(exp(x[j] - m_tile)) exp(m_tile - mx), which
// the span's P V then sums as the kernels do (bf16(p) alpha V = alpha (bf16(p) V), up to fp32
// order). Rounding exp(x - mx) instead, against the span's maximum, rounded a third of P
// differently at T = 512 once the maximum rose after the first tile. Returns the sum of the
// unrounded exp(x[j] - mx), as the kernels sum l.
#define BF16P_TILE 64
_Static_assert(ATT_SPAN % BF16P_TILE == 0, "spans start on a kernel tile");
static float exp_rounded_as_cuda(float *x, int n, float m0, float mx) {
    float sum = 0.0f, mt = m0;
    for (int g = 0; g < n; g += BF16P_TILE) {
        const int gn = imin(n - g, BF16P_TILE);
        mt = vec_max_of(x + g, gn, mt);
        const float back = expf(mt - mx);
        sum += vec_exp_shifted(x + g, gn, mt) * back;
        for (int j = g; j < g + gn; j++) x[j] = round_bf16(x[j]) * back;
    }
    return sum;
}

// out, lse: written (not accumulated). A query tile meets its keys ATT_SPAN at a time (the span's
// scores, then its P V, each in pieces under OpenBLAS's small-matrix bound): up to T = ATT_SPAN a
// row's softmax is computed in one step, with no rescaling, and a span's online-softmax
// bookkeeping is paid once per 512 keys instead of per 128. The keys are transposed once per kv
// head before the tiles start (kt: (B, NKV, DQK, ldt), ldt a little over T so that its rows do not
// fall on the same cache sets), not once per span and query tile: at T = 2048 that was 8.5 times
// the keys, each query tile transposing every span it meets.
static void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                              int NH, int NKV, int DQK, int DV, float scale, int bf16p) {
    const Heads hd = heads(T, NH, NKV, DQK, DV);
    const int nq = (T + ATT_BQ - 1) / ATT_BQ, nk = (T + ATT_BK - 1) / ATT_BK;
    const int ldt = (T + 15) / 16 * 16 + 16;
    float *kt = xmalloc((size_t)B * NKV * DQK * ldt * sizeof(float));
    #pragma omp parallel
    {
        #pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < NKV; kvh++)
                for (int c = 0; c < nk; c++) {
                    const int c0 = c * ATT_BK;
                    transpose_rows(kt + ((size_t)b * NKV + kvh) * DQK * ldt + c0, ldt,
                                   k + (size_t)b * T * hd.ldk + (size_t)c0 * hd.ldk + (size_t)kvh * DQK, hd.ldk,
                                   imin(T - c0, ATT_BK), DQK);
                }
        float *S = xmalloc((size_t)ATT_BQ * ATT_SPAN * sizeof(float));
        float *O = xmalloc((size_t)ATT_BQ * DV * sizeof(float));
        float m[ATT_BQ], l[ATT_BQ];
        // dynamic: later query tiles have more key tiles, so static chunks would be unbalanced
        #pragma omp for collapse(3) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int qt = 0; qt < nq; qt++) {
                    const int r0 = qt * ATT_BQ, rows = imin(T - r0, ATT_BQ);
                    const HeadRows hr = head_rows(&hd, q, k, v, b, h);
                    const float *kth = kt + ((size_t)b * NKV + h / hd.group) * DQK * ldt;
                    for (int i = 0; i < rows; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
                    memset(O, 0, (size_t)rows * DV * sizeof(float));
                    for (int c0 = 0; c0 < r0 + rows; c0 += ATT_SPAN) {
                        const int cols = imin(r0 + rows - c0, ATT_SPAN);
                        const Block bk = block(r0, rows, c0, cols);
                        rows_by_keys_t(S, ATT_SPAN, hr.q + (size_t)r0 * hd.ldq, hd.ldq, kth + c0, ldt, DQK, scale, &bk);
                        for (int i = 0; i < rows; i++) {
                            // the keys the row sees; beyond them (the diagonal block) P is 0
                            float *row = S + (size_t)i * ATT_SPAN;
                            const int n = keys_seen(r0, i, c0, cols);
                            const float mx = vec_max_of(row, n, m[i]);
                            // every row sees its own key in its first span, so mx is finite
                            const float alpha = expf(m[i] - mx);
                            l[i] = l[i] * alpha + (bf16p ? exp_rounded_as_cuda(row, n, m[i], mx) : vec_exp_shifted(row, n, mx));
                            m[i] = mx;
                            memset(row + n, 0, (size_t)(cols - n) * sizeof(float));
                            if (alpha != 1.0f) scale_row(O + (size_t)i * DV, O + (size_t)i * DV, DV, alpha);
                        }
                        rows_from_keys(O, DV, S, ATT_SPAN, hr.v + (size_t)c0 * hd.ldv, hd.ldv, DV, 1.0f, &bk, CUT_ROWS);
                    }
                    float *oh = out + hr.o + (size_t)r0 * hd.ldo;
                    float *lh = lse + ((size_t)b * NH + h) * T + r0;
                    for (int i = 0; i < rows; i++) {
                        scale_row(oh + (size_t)i * hd.ldo, O + (size_t)i * DV, DV, 1.0f / l[i]);
                        lh[i] = m[i] + logf(l[i]);
                    }
                }
        free(S);
        free(O);
    }
    free(kt);
}

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                           int NKV, int DQK, int DV, float scale) {
    attention_forward(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale, 0);
}

void cpu_attention_forward_bf16p(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                 int NH, int NKV, int DQK, int DV, float scale) {
    attention_forward(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale, 1);
}

// ---------------------------------------------------------------- backward

// One block's operands, each at the block's first row (queries from r0, keys from c0), in
// contiguous rows: the backward packs the strided head views (q + h DQK, rows NH DQK apart) into
// per-thread copies before it multiplies, because OpenBLAS's small kernels read their operands
// where they lie, and 128 rows 2 KiB apart ran about a fifth slower than the same rows packed
// (docs/ATTENTION.md).
typedef struct TileArgs {
    const float *q, *dout;     // (rows, DQK), (rows, DV)
    const float *lse, *delta;  // (rows)
    const float *kt, *vt;      // (DQK, ATT_BK), (DV, ATT_BK): the key tile transposed
    const float *k;            // (cols, DQK): the key rows, for dQ (NULL when dq is)
    float *dq, *dk, *dv;       // accumulators: (rows, DQK); (cols, DQK), (cols, DV); each skipped when NULL
} TileArgs;

// FIRST_QUERY: the first query sees one key, so its softmax is the constant 1 and its dS is exactly
// 0; P (dP - Delta) would leave there the rounding difference of two dot products (dO . v_0 and
// dO . O, about 1e-7 of them), which AdamW turns into steps of lr size wherever the true gradient
// is 0 (all of dQ and dK at T = 1). PyTorch's softmax backward gives the 0 exactly; every backend
// sets it (kernels/cuda_attention.cu, kernels/cuda_attention_tc.cu).
//
// One block of the backward: P = exp(S - lse) and dS = P (dP - Delta) recomputed (S = scale Q K^T,
// dP = dO V^T; 0 above the diagonal; bf16p: P and dS rounded), then
//   dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K.
static void block_backward(float *S, float *dP, const TileArgs *t, int DQK, int DV, const Block *bk, float scale, int bf16p) {
    rows_by_keys_t(S, ATT_BK, t->q, DQK, t->kt, ATT_BK, DQK, scale, bk);
    rows_by_keys_t(dP, ATT_BK, t->dout, DV, t->vt, ATT_BK, DV, 1.0f, bk);
    for (int i = 0; i < bk->rows; i++) {
        float *p = S + (size_t)i * ATT_BK, *d = dP + (size_t)i * ATT_BK;
        const int n = keys_seen(bk->r0, i, bk->c0, bk->cols);   // beyond them (above the diagonal) P and dS are 0
        vec_exp_shifted(p, n, t->lse[i]);
        const vecf di = vec_splat(t->delta[i]);
        int j = 0;
        for (; j + VEC_LANES <= n; j += VEC_LANES) vec_store(d + j, vec_load(p + j) * (vec_load(d + j) - di));
        for (; j < n; j++) d[j] = p[j] * (d[j] - di[0]);
        if (bk->r0 + i == 0) d[0] = 0.0f;   // the first query: see FIRST_QUERY above
        memset(p + n, 0, (size_t)(bk->cols - n) * sizeof(float));
        memset(d + n, 0, (size_t)(bk->cols - n) * sizeof(float));
        if (bf16p)
            for (int c = 0; c < n; c++) { p[c] = round_bf16(p[c]); d[c] = round_bf16(d[c]); }
    }
    if (t->dv) keys_from_rows(t->dv, DV, S, ATT_BK, t->dout, DV, DV, 1.0f, bk);
    if (t->dk) keys_from_rows(t->dk, DQK, dP, ATT_BK, t->q, DQK, DQK, scale, bk);
    if (t->dq) rows_from_keys(t->dq, DQK, dP, ATT_BK, t->k, DQK, DQK, scale, bk, CUT_INNER);
}

// With P = softmax(S), S = scale Q K^T (causal), O = P V and dO given (see the top):
// dq, dk, dv accumulate. scratch: fp32 (B, NH, T), receives Delta.
//
// Every gradient is summed in a zeroed per-thread accumulator and added to dq, dk or dv once at the
// end (a query tile's dQ over its key tiles ascending; a key tile's dK and dV over the group's
// heads, then the query tiles ascending), in both paths, so the two give the same bits.
static void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                               int NKV, int DQK, int DV, float scale, int bf16p) {
    const Heads hd = heads(T, NH, NKV, DQK, DV);
    const int nq = (T + ATT_BQ - 1) / ATT_BQ, nk = (T + ATT_BK - 1) / ATT_BK;
    // Delta (b, h, t) = dO . O, in double (a sum of DV products that cancel)
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *o = out + ((size_t)b * T + t) * hd.ldo + (size_t)h * DV;
                const float *g = dout + ((size_t)b * T + t) * hd.ldo + (size_t)h * DV;
                double s = 0.0;
                for (int d = 0; d < DV; d++) s += (double)o[d] * g[d];
                scratch[((size_t)b * NH + h) * T + t] = (float)s;
            }
    // one pass when the tasks are at least 4 per thread or split evenly over the threads
    const int tasks = B * NKV, threads = omp_get_max_threads();
    const int one_pass = tasks >= 4 * threads || tasks % threads == 0;
    _Static_assert(ATT_BQ == ATT_BK, "the query tiles at and below a key tile start at its own index");
    // per-thread rows: a whole head's (one pass) or one tile's (two phases); pages are touched only
    // by the threads that take a task, so at most min(threads, B NKV) heads' rows are resident
    const size_t rows = one_pass ? (size_t)nk * ATT_BK : ATT_BK;
    #pragma omp parallel
    {
        float *S = xmalloc((size_t)ATT_BQ * ATT_BK * sizeof(float));
        float *dP = xmalloc((size_t)ATT_BQ * ATT_BK * sizeof(float));
        // key tiles transposed (one pass: all of the kv head's, tile after tile), key rows, query
        // rows, dO rows, and the accumulators of dQ, dK, dV
        float *kt = xmalloc(rows * DQK * sizeof(float)), *vt = xmalloc(rows * DV * sizeof(float));
        float *kc = xmalloc(rows * DQK * sizeof(float)), *qc = xmalloc(rows * DQK * sizeof(float));
        float *doc = xmalloc(rows * DV * sizeof(float)), *dqc = xmalloc(rows * DQK * sizeof(float));
        float *dkc = xmalloc(rows * DQK * sizeof(float)), *dvc = xmalloc(rows * DV * sizeof(float));
        if (one_pass) {
            #pragma omp for collapse(2) schedule(dynamic, 1)
            for (int b = 0; b < B; b++)
                for (int kvh = 0; kvh < NKV; kvh++) {
                    const float *kh = k + (size_t)b * T * hd.ldk + (size_t)kvh * DQK;
                    const float *vh = v + (size_t)b * T * hd.ldv + (size_t)kvh * DV;
                    cpu_copy_cols(kc, DQK, 0, kh, hd.ldk, 0, T, DQK, 0);
                    for (int i = 0; i < nk; i++) {
                        const int c0 = i * ATT_BK, cols = imin(T - c0, ATT_BK);
                        transpose_rows(kt + (size_t)c0 * DQK, ATT_BK, kc + (size_t)c0 * DQK, DQK, cols, DQK);
                        transpose_rows(vt + (size_t)c0 * DV, ATT_BK, vh + (size_t)c0 * hd.ldv, hd.ldv, cols, DV);
                    }
                    memset(dkc, 0, (size_t)T * DQK * sizeof(float));
                    memset(dvc, 0, (size_t)T * DV * sizeof(float));
                    for (int h = kvh * hd.group; h < (kvh + 1) * hd.group; h++) {
                        const size_t qo = (size_t)b * T * hd.ldq + (size_t)h * DQK, oo = (size_t)b * T * hd.ldo + (size_t)h * DV;
                        const float *lh = lse + ((size_t)b * NH + h) * T, *delta = scratch + ((size_t)b * NH + h) * T;
                        cpu_copy_cols(qc, DQK, 0, q + qo, hd.ldq, 0, T, DQK, 0);
                        cpu_copy_cols(doc, DV, 0, dout + oo, hd.ldo, 0, T, DV, 0);
                        memset(dqc, 0, (size_t)T * DQK * sizeof(float));
                        for (int i = 0; i < nk; i++) {
                            const int c0 = i * ATT_BK, cols = imin(T - c0, ATT_BK);
                            for (int r0 = c0; r0 < T; r0 += ATT_BQ) {
                                const Block bk = block(r0, imin(T - r0, ATT_BQ), c0, cols);
                                const TileArgs ta = {qc + (size_t)r0 * DQK, doc + (size_t)r0 * DV, lh + r0, delta + r0,
                                                     kt + (size_t)c0 * DQK, vt + (size_t)c0 * DV, kc + (size_t)c0 * DQK,
                                                     dqc + (size_t)r0 * DQK, dkc + (size_t)c0 * DQK, dvc + (size_t)c0 * DV};
                                block_backward(S, dP, &ta, DQK, DV, &bk, scale, bf16p);
                            }
                        }
                        cpu_copy_cols(dq + qo, hd.ldq, 0, dqc, DQK, 0, T, DQK, 1);
                    }
                    cpu_copy_cols(dk + (size_t)b * T * hd.ldk + (size_t)kvh * DQK, hd.ldk, 0, dkc, DQK, 0, T, DQK,
                                  1);
                    cpu_copy_cols(dv + (size_t)b * T * hd.ldv + (size_t)kvh * DV, hd.ldv, 0, dvc, DV, 0, T, DV, 1);
                }
        } else {
            // phase 1: dQ rows of a query tile
            #pragma omp for collapse(3) schedule(dynamic, 1)
            for (int b = 0; b < B; b++)
                for (int h = 0; h < NH; h++)
                    for (int qt = 0; qt < nq; qt++) {
                        const int r0 = qt * ATT_BQ, nr = imin(T - r0, ATT_BQ);
                        const HeadRows hr = head_rows(&hd, q, k, v, b, h);
                        const float *lh = lse + ((size_t)b * NH + h) * T, *delta = scratch + ((size_t)b * NH + h) * T;
                        cpu_copy_cols(qc, DQK, 0, hr.q + (size_t)r0 * hd.ldq, hd.ldq, 0, nr, DQK, 0);
                        cpu_copy_cols(doc, DV, 0, dout + hr.o + (size_t)r0 * hd.ldo, hd.ldo, 0, nr, DV, 0);
                        memset(dqc, 0, (size_t)nr * DQK * sizeof(float));
                        for (int c0 = 0; c0 < r0 + nr; c0 += ATT_BK) {
                            const int cols = imin(r0 + nr - c0, ATT_BK);
                            const Block bk = block(r0, nr, c0, cols);
                            cpu_copy_cols(kc, DQK, 0, hr.k + (size_t)c0 * hd.ldk, hd.ldk, 0, cols, DQK, 0);
                            transpose_rows(kt, ATT_BK, kc, DQK, cols, DQK);
                            transpose_rows(vt, ATT_BK, hr.v + (size_t)c0 * hd.ldv, hd.ldv, cols, DV);
                            const TileArgs ta = {qc, doc, lh + r0, delta + r0, kt, vt, kc, dqc, NULL, NULL};
                            block_backward(S, dP, &ta, DQK, DV, &bk, scale, bf16p);
                        }
                        cpu_copy_cols(dq + (size_t)b * T * hd.ldq + (size_t)h * DQK + (size_t)r0 * hd.ldq, hd.ldq, 0, dqc, DQK, 0,
                                      nr, DQK, 1);
                    }
            // phase 2: dK and dV rows of a key tile, from the query tiles at and below it
            #pragma omp for collapse(3) schedule(dynamic, 1)
            for (int b = 0; b < B; b++)
                for (int kvh = 0; kvh < NKV; kvh++)
                    for (int i = 0; i < nk; i++) {
                        const int c0 = i * ATT_BK, cols = imin(T - c0, ATT_BK);
                        const size_t ko = (size_t)b * T * hd.ldk + (size_t)kvh * DQK + (size_t)c0 * hd.ldk;
                        const size_t vo = (size_t)b * T * hd.ldv + (size_t)kvh * DV + (size_t)c0 * hd.ldv;
                        transpose_rows(kt, ATT_BK, k + ko, hd.ldk, cols, DQK);   // no dQ here: K rows not needed
                        transpose_rows(vt, ATT_BK, v + vo, hd.ldv, cols, DV);
                        memset(dkc, 0, (size_t)cols * DQK * sizeof(float));
                        memset(dvc, 0, (size_t)cols * DV * sizeof(float));
                        for (int h = kvh * hd.group; h < (kvh + 1) * hd.group; h++) {
                            const float *qh = q + (size_t)b * T * hd.ldq + (size_t)h * DQK;
                            const float *doh = dout + (size_t)b * T * hd.ldo + (size_t)h * DV;
                            const float *lh = lse + ((size_t)b * NH + h) * T, *delta = scratch + ((size_t)b * NH + h) * T;
                            for (int r0 = c0; r0 < T; r0 += ATT_BQ) {
                                const int nr = imin(T - r0, ATT_BQ);
                                const Block bk = block(r0, nr, c0, cols);
                                cpu_copy_cols(qc, DQK, 0, qh + (size_t)r0 * hd.ldq, hd.ldq, 0, nr, DQK, 0);
                                cpu_copy_cols(doc, DV, 0, doh + (size_t)r0 * hd.ldo, hd.ldo, 0, nr, DV, 0);
                                const TileArgs ta = {qc, doc, lh + r0, delta + r0, kt, vt, NULL, NULL, dkc, dvc};
                                block_backward(S, dP, &ta, DQK, DV, &bk, scale, bf16p);
                            }
                        }
                        cpu_copy_cols(dk + ko, hd.ldk, 0, dkc, DQK, 0, cols, DQK, 1);
                        cpu_copy_cols(dv + vo, hd.ldv, 0, dvc, DV, 0, cols, DV, 1);
                    }
        }
        free(S);
        free(dP);
        free(kt);
        free(vt);
        free(kc);
        free(qc);
        free(doc);
        free(dqc);
        free(dkc);
        free(dvc);
    }
}

void cpu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                            int NKV, int DQK, int DV, float scale) {
    attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale, 0);
}

void cpu_attention_backward_bf16p(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int DQK, int DV, float scale) {
    attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale, 1);
}
