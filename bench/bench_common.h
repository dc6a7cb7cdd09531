// Helpers shared by the benchmark programs of bench/ (header-only: each bench is one program).
#ifndef CLLA_BENCH_COMMON_H
#define CLLA_BENCH_COMMON_H

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "common/vec.h"
#include "model/cache.h"

// The machine's sgemm rate on one shape: best FLOP/s of C (M, N) = A (M, K) @ B (N, K)^T (the
// forward form of the model's matmuls) over reps runs after one that warms caches and thread
// pools. The rate every bench sets its figures against (bench_train on the model's shapes,
// bench_attention and bench_decode on one each).
static inline double bench_sgemm_rate(int M, int N, int K, int reps) {
    float *a = xmalloc((size_t)M * K * sizeof(float)), *b = xmalloc((size_t)N * K * sizeof(float));
    float *c = xmalloc((size_t)M * N * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)N * K; i++) b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    double best = 0;
    for (int r = 0; r < reps + 1; r++) {
        const double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        const double rate = 2.0 * M * N * K / (now_seconds() - t0);
        if (r > 0 && rate > best) best = rate;
    }
    free(a); free(b); free(c);
    return best;
}

// The machine's copy bandwidth: memcpy of 512 MiB, (read + written) bytes per second, best of 3,
// by `threads` threads, each copying its own contiguous share (1: one memcpy of the whole).
// bench_decode measures with the threads its steps use, as its sgemm rate is measured: one
// thread's memcpy left the roofline's memory side below what two threads read (a decode step
// at batch 1 ran at 0.79 of that roofline, `bench_decode` on 2026-11-26).
static inline double bench_copy_bandwidth(int threads) {
    size_t n = (size_t)512 << 20;
    char *a = xmalloc(n), *b = xmalloc(n);
    if (threads < 1) threads = 1;
    const size_t share = (n / (size_t)threads + 4095) & ~(size_t)4095;
    double best = 0;
    for (int r = 0; r < 4; r++) {   // the first pass also faults the pages in, and is not counted
        double t0 = now_seconds();
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int i = 0; i < threads; i++) {
            size_t lo = (size_t)i * share, hi = lo + share < n ? lo + share : n;
            if (lo < hi) {
                if (r == 0) memset(a + lo, 1, hi - lo), memset(b + lo, 2, hi - lo);
                else memcpy(b + lo, a + lo, hi - lo);
            }
        }
        double bw = 2.0 * (double)n / (now_seconds() - t0);
        if (r > 0) best = bw > best ? bw : best;
    }
    free(a);
    free(b);
    return best;
}

// The machine's read bandwidth: 512 MiB of floats summed, bytes read per second, best of 3, by
// `threads` threads, each over its own contiguous share, 8 vector accumulators, the lines asked
// for 1 KiB ahead (the fastest of the simple read loops tried on the development VM). A decode
// step's cache is only read: bench_decode sets this rate beside the roofline's copy bandwidth
// (read + write bytes of memcpy).
static inline double bench_read_bandwidth(int threads) {
    const size_t n = (size_t)128 << 20;   // floats
    float *a = xmalloc(n * sizeof(float));
    if (threads < 1) threads = 1;
    const size_t share = (n / (size_t)threads + 1023) & ~(size_t)1023;
    double best = 0;
    float sink = 0;
    for (int r = 0; r < 4; r++) {   // the first pass writes the pages in, and is not counted
        double t0 = now_seconds();
        #pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : sink)
        for (int i = 0; i < threads; i++) {
            size_t lo = (size_t)i * share, hi = lo + share < n ? lo + share : n;
            if (r == 0) {
                for (size_t j = lo; j < hi; j++) a[j] = 1.0f;
                continue;
            }
            vecf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
            size_t j = lo;
            for (; j + 64 <= hi; j += 64) {
                __builtin_prefetch(a + j + 256, 0, 2);
                __builtin_prefetch(a + j + 256 + 16, 0, 2);
                __builtin_prefetch(a + j + 256 + 32, 0, 2);
                __builtin_prefetch(a + j + 256 + 48, 0, 2);
                s0 += vec_load(a + j), s1 += vec_load(a + j + 8), s2 += vec_load(a + j + 16), s3 += vec_load(a + j + 24);
                s4 += vec_load(a + j + 32), s5 += vec_load(a + j + 40), s6 += vec_load(a + j + 48), s7 += vec_load(a + j + 56);
            }
            float t = vec_sum(((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)));
            for (; j < hi; j++) t += a[j];
            sink += t;
        }
        double bw = (double)n * sizeof(float) / (now_seconds() - t0);
        if (r > 0) best = bw > best ? bw : best;
    }
    free(a);
    volatile float keep = sink;   // the sums are used, so the loads are not dropped
    (void)keep;
    return best;
}

// Standard normal vectors, as the benchmarks cache (decoder_fill_synthetic): n x W from seed.
static inline float *bench_normal(size_t n, int W, uint64_t seed) {
    float *x = xmalloc(n * (size_t)W * sizeof(float));
    uint64_t *draws = xmalloc(2 * RNG_FILL_CHUNK * sizeof(uint64_t));
    Rng r;
    rng_seed(&r, seed);
    rng_fill_normal(x, n * (size_t)W, 1.0, &r, draws);
    free(draws);
    return x;
}

// Gives every stream whose codec has fitted state (cq) a state fitted on standard normal
// vectors, the values the benchmarks cache: timings do not depend on the values.
static inline void bench_fit_synthetic(CacheLayout *cl) {
    for (int s = 0; s < cl->n_streams; s++) {
        const CachePart *part = &cl->part[cl->streams[s].part];
        if (!codec_needs_fit(&part->codec)) continue;
        size_t n = ((size_t)1 << part->codec.bits) * 4;
        if (n < 4096) n = 4096;
        float *x = bench_normal(n, part->width, 11 + (uint64_t)s);
        void *state = NULL;
        char err[512];
        if (codec_traits(part->codec.kind)->fit(&part->codec, part->width, x, (int64_t)n, (int64_t)n, NULL, &state, err, sizeof(err)) != 0)
            die("fitting %s on synthetic data: %s", codec_name(&part->codec), err);
        cache_layout_set_fit(cl, s, state);
        free(x);
    }
}

#endif
