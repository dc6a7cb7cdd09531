// The device MoE dispatch's logic against the CPU routing, on the CPU.
//
// kernels/cuda_moe.cu dispatches without sorting: (1) each assignment's index among its
// expert's in token order, by a scan per expert; (2) the plan (moe_dispatch_plan); (3) the
// token-ordered list; (4) keep or drop by counting the assignments that go before it
// (moe_assignment_kept); (5) rows by a scan of the kept flags per expert. This file replays
// those five steps serially, with the same functions of backend/moe_route_rows.h the kernels
// call, and requires every output (counts, expert_off, row_token, assign_row) to equal
// moe_route_dispatch's (counting sort, then a qsort per over-full expert) exactly, over random
// routings with many exact probability ties, all capacities from "drop nearly all" to "no
// dropping", K from 1 to 6, one expert taking every token, and zero tokens. The aux losses of
// the device (per-expert column sums, then moe_aux_combine) are replayed the same way.
//
// The grouped expert matmuls' row tiles (backend/moe_tiles.h: the CUDA kernels' blocks, the CPU
// op's loop) are checked on every dispatch's offsets: the blocks of a launch sized by the
// bound cover each kept row exactly once, in tiles inside one expert, and the rest find none.
//
// Prints the failures and "N cases, M failed"; exit 1 on any failure.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/moe_route_rows.h"
#include "backend/moe_routing.h"
#include "backend/moe_tiles.h"
#include "tests/lib/check.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

typedef struct Dispatch { int *counts, *expert_off, *row_token, *assign_row; } Dispatch;

static Dispatch dispatch_alloc(int N, int E, int K) {
    const size_t nk = (size_t)N * K + 1;
    Dispatch d = {calloc((size_t)E, sizeof(int)), calloc((size_t)E + 1, sizeof(int)), calloc(nk, sizeof(int)),
                  calloc(nk, sizeof(int))};
    if (!d.counts || !d.expert_off || !d.row_token || !d.assign_row) { fprintf(stderr, "out of memory\n"); exit(1); }
    return d;
}

static void dispatch_free(Dispatch *d) {
    free(d->counts); free(d->expert_off); free(d->row_token); free(d->assign_row);
}

// The device pipeline of kernels/cuda_moe.cu (cuda_moe_dispatch), one step per kernel, each
// kernel's threads run one after another.
static void device_dispatch_replay(Dispatch *d, const float *probs, const int *topk_idx, int N, int E, int K,
                                   int capacity) {
    const int NK = N * K;
    int *pos = calloc((size_t)NK + 1, sizeof(int)), *list = calloc((size_t)NK + 1, sizeof(int));
    int *keep = calloc((size_t)NK + 1, sizeof(int)), *start = calloc((size_t)E + 1, sizeof(int));
    if (!pos || !list || !keep || !start) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int e = 0; e < E; e++) {   // 1. moe_positions_kernel: block e's scan over the assignments
        int base = 0;
        for (int a = 0; a < NK; a++)
            if (topk_idx[a] == e) pos[a] = base++;
        d->counts[e] = base;
    }
    moe_dispatch_plan(start, d->expert_off, d->counts, E, capacity);   // 2. moe_plan_kernel
    for (int a = 0; a < NK; a++) list[start[topk_idx[a]] + pos[a]] = a;   // 3. moe_list_kernel
    for (int a = 0; a < NK; a++)   // 4. moe_keep_kernel
        keep[a] = moe_assignment_kept(a, list, start, d->counts, probs, topk_idx, E, K, capacity);
    for (int e = 0; e < E; e++) {   // 5. moe_rows_kernel: block e's scan over its list
        int base = d->expert_off[e];
        for (int i = start[e]; i < start[e + 1]; i++) {
            const int a = list[i];
            if (keep[a]) d->row_token[base] = a / K;
            d->assign_row[a] = keep[a] ? base++ : -1;
        }
    }
    for (int r = d->expert_off[E]; r < NK; r++) d->row_token[r] = -1;   // 6. moe_rows_tail_kernel
    free(pos); free(list); free(keep); free(start);
}

// The aux kernel: a column sum per expert (token order, double), lse^2 summed, then combined.
static void device_aux_replay(float *out, const float *probs, const float *lse, const int *counts, int N, int E,
                              int K, float aux_coef, float z_coef) {
    double *psum = calloc((size_t)E, sizeof(double));
    if (!psum) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int e = 0; e < E; e++)
        for (int t = 0; t < N; t++) psum[e] += probs[(size_t)t * E + e];
    double zsum = 0.0;
    for (int t = 0; t < N; t++) zsum += (double)lse[t] * lse[t];
    moe_aux_combine(out, psum, zsum, counts, N, E, K, aux_coef, z_coef);
    free(psum);
}

static int cases, failed_cases;

// Every block t < moe_row_tiles_bound of a launch over off's rows in tiles of `rows`: its tile
// is inside one expert, 1..rows rows, the tiles in order cover [0, off[E]) once, and the blocks
// past the last tile get none (1 when all of that holds).
static int row_tiles_cover(const int *off, int E, int rows) {
    const long long bound = moe_row_tiles_bound(off[E], E, rows);
    int next = 0, done = 0, prev_e = 0;
    for (long long t = 0; t < bound; t++) {
        int e = -1, r0 = -1, n = -1;
        if (!moe_row_tile(off, E, rows, t, &e, &r0, &n)) {
            done = 1;
            continue;
        }
        if (done || e < prev_e || e >= E || n < 1 || n > rows || r0 != next || r0 < off[e] || r0 + n > off[e + 1])
            return 0;
        next = r0 + n;
        prev_e = e;
    }
    int e, r0, n;
    return next == off[E] && !moe_row_tile(off, E, rows, bound, &e, &r0, &n) && !moe_row_tile(off, E, rows, -1, &e, &r0, &n);
}

// One routing: logits drawn from `levels` values (few levels: many exact ties in top-k and in
// the capacity ranking) or all on one expert (skew), then both dispatches at each capacity.
static void run_case(int N, int E, int K, int levels, int skew) {
    const size_t ne = (size_t)N * E + 1, nk = (size_t)N * K + 1;
    float *logits = calloc(ne, sizeof(float)), *probs = calloc(ne, sizeof(float));
    float *lse = calloc((size_t)N + 1, sizeof(float)), *w = calloc(nk, sizeof(float));
    int *idx = calloc(nk, sizeof(int));
    if (!logits || !probs || !lse || !w || !idx) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (size_t i = 0; i < (size_t)N * E; i++) logits[i] = (float)(next_u32() % (uint32_t)levels) * 0.5f;
    if (skew)
        for (int t = 0; t < N; t++) logits[(size_t)t * E + E - 1] = 40.0f;   // every token's first choice
    moe_route_topk_forward(probs, lse, idx, w, logits, N, E, K, 1);
    const int NK = N * K, even = (NK + E - 1) / E;
    const int caps[] = {0, 1, even / 2, even, even + even / 2, NK};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        const int cap = caps[c];
        Dispatch ref = dispatch_alloc(N, E, K), dev = dispatch_alloc(N, E, K);
        moe_route_dispatch(ref.counts, ref.expert_off, ref.row_token, ref.assign_row, probs, idx, N, E, K, cap);
        device_dispatch_replay(&dev, probs, idx, N, E, K, cap);
        const int before = failures;
        CHECK(memcmp(ref.counts, dev.counts, (size_t)E * sizeof(int)) == 0, "N %d E %d K %d cap %d: counts differ", N, E, K, cap);
        CHECK(memcmp(ref.expert_off, dev.expert_off, ((size_t)E + 1) * sizeof(int)) == 0,
              "N %d E %d K %d cap %d: expert_off differs (rows %d against %d)", N, E, K, cap, dev.expert_off[E],
              ref.expert_off[E]);
        CHECK(memcmp(ref.row_token, dev.row_token, (size_t)NK * sizeof(int)) == 0, "N %d E %d K %d cap %d: row_token differs",
              N, E, K, cap);
        CHECK(memcmp(ref.assign_row, dev.assign_row, (size_t)NK * sizeof(int)) == 0,
              "N %d E %d K %d cap %d: assign_row differs", N, E, K, cap);
        for (int rows = 1; rows <= 128; rows *= 4)
            CHECK(row_tiles_cover(ref.expert_off, E, rows), "N %d E %d K %d cap %d: row tiles of %d rows do not cover the rows",
                  N, E, K, cap, rows);
        float aux_ref[2], aux_dev[2];
        moe_route_aux_forward(aux_ref, probs, lse, ref.counts, N, E, K, 0.01f, 0.001f);
        device_aux_replay(aux_dev, probs, lse, dev.counts, N, E, K, 0.01f, 0.001f);
        CHECK(memcmp(aux_ref, aux_dev, sizeof(aux_ref)) == 0, "N %d E %d K %d cap %d: aux losses differ (%g %g against %g %g)",
              N, E, K, cap, aux_dev[0], aux_dev[1], aux_ref[0], aux_ref[1]);
        cases++;
        failed_cases += failures > before;
        dispatch_free(&ref);
        dispatch_free(&dev);
    }
    free(logits); free(probs); free(lse); free(w); free(idx);
}

int main(void) {
    const int Ns[] = {0, 1, 7, 64, 301};
    const int Es[] = {1, 2, 5, 16, 64};
    const int Ks[] = {1, 2, 6};
    for (size_t i = 0; i < sizeof(Ns) / sizeof(Ns[0]); i++)
        for (size_t j = 0; j < sizeof(Es) / sizeof(Es[0]); j++)
            for (size_t k = 0; k < sizeof(Ks) / sizeof(Ks[0]); k++) {
                if (Ks[k] > Es[j]) continue;
                run_case(Ns[i], Es[j], Ks[k], 3, 0);     // three logit levels: ties everywhere
                run_case(Ns[i], Es[j], Ks[k], 1000, 0);  // mostly distinct
                run_case(Ns[i], Es[j], Ks[k], 3, 1);     // one expert wanted by every token
            }
    printf("%d cases (routings x capacities), %d failed\n", cases, failed_cases);
    return failures ? 1 : 0;
}
