// Mixture-of-experts ops of the CPU reference backend: the fp32 router matmuls and the row
// gather/scatter that moves tokens to the experts and back. The routing decisions (softmax,
// top-k, capacity dropping, auxiliary losses) are backend/moe_routing.c, shared with the CUDA
// backend. backend/backend.h defines the semantics.
//
// Determinism (docs/DESIGN.md section 6): every reduction runs in a fixed order, each output row is
// written by exactly one thread, and the routing decisions are pure functions of the fp32
// probabilities: top-k ties go to the lower expert index, capacity drops take the lowest
// probability first and, among equal probabilities, the later token.
#include "layers/cpu_ops.h"
#include "layers/cpu_parts.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Row loops are parallel only when there is enough work to pay for the threads.
#define MOE_PAR_MIN ((size_t)1 << 14)

void cpu_moe_router_forward(float *logits, const float *inp, const float *weight, int N, int C, int E) {
    // fp32 storage: the router matmul is an ordinary fp32 matmul here
    cpu_matmul_forward(logits, inp, weight, N, C, E);
}

void cpu_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                             const float *weight, int N, int C, int E) {
    cpu_matmul_backward(dinp, dweight, dlogits, inp, weight, N, C, E);
}

void cpu_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C) {
    #pragma omp parallel for schedule(static) if ((size_t)R * C >= MOE_PAR_MIN)
    for (int r = 0; r < R; r++) {
        if (row_token[r] >= 0) memcpy(out + (size_t)r * C, inp + (size_t)row_token[r] * C, (size_t)C * sizeof(float));
        else memset(out + (size_t)r * C, 0, (size_t)C * sizeof(float));   // past the kept rows
    }
}

void cpu_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C) {
    // one thread per token row; its assignments are added in k order
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *d = dinp + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;
            const float *s = dout + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += s[c];
        }
    }
}

void cpu_moe_combine_forward(float *out, const float *expert_out, const float *topk_w, const int *assign_row,
                             int N, int K, int C) {
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;   // dropped: the token keeps its residual (and the shared expert)
            const float w = topk_w[(size_t)t * K + k];
            const float *s = expert_out + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += w * s[c];
        }
    }
}

void cpu_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                              const float *topk_w, const int *assign_row, int N, int K, int C) {
    // every row r belongs to exactly one (t, k), so the per-token loop writes disjoint rows
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= MOE_PAR_MIN)
    for (int t = 0; t < N; t++) {
        const float *g = dout + (size_t)t * C;
        for (int k = 0; k < K; k++) {
            int r = assign_row[(size_t)t * K + k];
            if (r < 0) continue;
            const float w = topk_w[(size_t)t * K + k];
            const float *y = expert_out + (size_t)r * C;
            float *dy = dexpert_out + (size_t)r * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dy[c] += w * g[c];
                dot += (double)g[c] * y[c];
            }
            dtopk_w[(size_t)t * K + k] += (float)dot;
        }
    }
}

// ---- grouped expert matmuls ----
//
// Many small sgemm calls (one per expert, each threaded by OpenBLAS) cost thread start-up and
// barriers per call, so E experts would cost far more than the same rows in a few experts.
// Instead the experts' work is cut into tiles that OpenMP threads take dynamically, each tile
// one single-threaded sgemm (OpenBLAS runs single-threaded inside an OpenMP region: one level
// of threads at a time, docs/DESIGN.md section 3). Tiles: blocks of rows for out and dinp (rows are
// independent), blocks of output channels for dweight (each block sums over all of the expert's
// rows in one sgemm, so the reduction order is fixed and no two threads write the same element).
//
// How many tiles follows the thread count, and the bits must not (a run resumed on a machine
// with other cores goes on bit for bit; tests/test_moe.c): an expert's rows (or channels) are cut
// by layers/cpu_parts.h's rules, each tile over OpenBLAS's small-matrix bound and starting at a
// multiple of its kernels' row unroll from the expert's first row, or the expert left whole. A
// short last tile of fixed-size blocks (1030 rows in 64s leave 6) had run on the small kernels,
// different bits at every thread count.

typedef struct Tile { int e, a0, a1; } Tile;   // expert e, range [a0, a1) of rows or channels

// The tiles of the experts with rows: by_rows, expert e's rows [off[e], off[e+1]) (absolute row
// numbers), else its `channels` output channels (from 0), each cut by layers/cpu_parts.h's rules
// into about ceil(n / block) parts. A row costs `cost` multiply-adds, a channel `cost` times the
// expert's rows. Returns the count; *tiles is malloc'd (aborts on no memory, as the ops' other
// allocations).
static int expert_tiles(Tile **tiles, const int *off, int E, int by_rows, int channels, int block, double cost) {
    int m = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            *tiles = malloc((size_t)(m > 0 ? m : 1) * sizeof(Tile));
            if (!*tiles) { fprintf(stderr, "moe_expert_matmul: out of memory\n"); abort(); }
            m = 0;
        }
        for (int e = 0; e < E; e++) {
            if (off[e + 1] <= off[e]) continue;
            const int rows = off[e + 1] - off[e], n = by_rows ? rows : channels, base = by_rows ? off[e] : 0;
            const int p = cpu_parts(n, (int)(((long long)n + block - 1) / block), by_rows ? cost : cost * rows);
            for (int i = 0; i < p; i++, m++)
                if (pass == 1) (*tiles)[m] = (Tile){e, base + cpu_part_start(n, p, i), base + cpu_part_start(n, p, i + 1)};
        }
    }
    return m;
}

// Rows [off[E], R) of a row buffer: the rows no kept assignment uses, zero (backend/backend.h).
static void zero_tail_rows(float *out, const int *off, int E, int R, int width) {
    if (R > off[E]) memset(out + (size_t)off[E] * width, 0, (size_t)(R - off[E]) * width * sizeof(float));
}

// Over row tiles of the experts: out rows (rows, nout) = a rows (rows, k) @ op(weights[e]) + beta
// out rows, op = the transpose (tw) of the (nout, k) weight or the (k, nout) weight as it lies;
// every weight row holds ldw elements. Tiles of about 4 per thread over all rows, at least 64
// rows (the weight is packed once per tile, so smaller tiles would spend their time packing), at
// most 1024.
static void expert_rows_sgemm(const int *off, int E, CBLAS_TRANSPOSE tw, int nout, int k, const float *a,
                              const float *const *weights, int ldw, float beta, float *out) {
    const int nt = omp_get_max_threads();
    int rb = (off[E] + 4 * nt - 1) / (4 * nt);
    rb = rb < 64 ? 64 : rb > 1024 ? 1024 : rb;
    Tile *w;
    const int m = expert_tiles(&w, off, E, 1, 0, rb, (double)nout * k);
    #pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < m; t++) {
        const int e = w[t].e, r0 = w[t].a0, rows = w[t].a1 - w[t].a0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tw, rows, nout, k, 1.0f, a + (size_t)r0 * k, k, weights[e], ldw, beta,
                    out + (size_t)r0 * nout, nout);
    }
    free(w);
}

void cpu_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights, const int *expert_off,
                                   int E, int R, int C, int OC) {
    expert_rows_sgemm(expert_off, E, CblasTrans, OC, C, inp, weights, C, 0.0f, out);
    zero_tail_rows(out, expert_off, E, R, OC);
}

void cpu_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                    const float *const *weights, const int *expert_off, int E, int R, int C, int OC) {
    (void)R;   // dinp's rows past expert_off[E] are not written
    if (C <= 0 || OC <= 0) return;
    if (dinp) expert_rows_sgemm(expert_off, E, CblasNoTrans, C, OC, dout, weights, C, 1.0f, dinp);
    if (!dweights) return;
    // channel blocks of dweight[e]: (ob, C) += dout[:, o0:o1]^T (ob, n_e) @ inp rows (n_e, C).
    // Every block packs all of the expert's input rows again, so the blocks are as wide as
    // about 4 per thread over the experts with rows allows (at 8 experts on 2 threads, a whole
    // expert each). Against fixed 64-channel blocks this took 0.72-0.90 of the time at
    // bench_train's MoE shapes (docs/MOE.md, bench/ab.sh moe).
    int active = 0;
    for (int e = 0; e < E; e++) active += expert_off[e + 1] > expert_off[e];
    const int per = active > 0 ? (4 * omp_get_max_threads() + active - 1) / active : 1;
    const int ob = (OC + per - 1) / per;
    Tile *w;
    const int m = expert_tiles(&w, expert_off, E, 0, OC, ob, (double)C);
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m; i++) {
        int e = w[i].e, r0 = expert_off[e], rows = expert_off[e + 1] - r0, oc = w[i].a1 - w[i].a0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, C, rows, 1.0f, dout + (size_t)r0 * OC + w[i].a0, OC,
                    inp + (size_t)r0 * C, C, 1.0f, dweights[e] + (size_t)w[i].a0 * C, C);
    }
    free(w);
}
