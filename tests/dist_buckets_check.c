// Run by tests/test_dist.sh under mpirun (2, 3 and 4 ranks): the bucketed sums over ranks
// (train/dist_buckets.c) against dist_reduce_scatter_f32 (round by round over the stripes of the
// reduce-scatter), dist_allgather_f32 (the same for the all-gather, whose waits must not return
// before their elements are there) and dist_allreduce_sum_f32 on the same buffers, bit for bit, for sizes that do
// and do not divide into ranks and buckets, stripes and buckets larger than the buffer and smaller,
// with and without the progress thread, and the progress reported in random falling steps (as the
// backward reports its layers), all at once, or not at all before finish. Each rank prints its
// failures; rank 0 prints the count. Exit 0 when every rank passed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "train/dist.h"

// Reports in one of three ways: random falling steps (with rising ones between, which change
// nothing), everything at once, nothing before finish.
static void report(DistBuckets *bk, size_t n, int mode, unsigned long long seed) {
    Rng steps;
    rng_seed(&steps, seed);
    if (mode == 0) {
        for (size_t from = n; from > 0;) {
            const size_t step = (size_t)(rng_next(&steps) % (n / 5 + 2));
            from = step > from ? 0 : from - step;
            dist_buckets_ready(bk, from);
            if (rng_next(&steps) % 3 == 0) dist_buckets_ready(bk, from + 1);
        }
    } else if (mode == 1) {
        dist_buckets_ready(bk, 0);
    }
    dist_buckets_finish(bk);
}

// 1 when got and want (count floats) are the same bits; else prints the first difference.
static int same(const Dist *d, const float *got, const float *want, size_t count, const char *what) {
    if (!memcmp(got, want, count * sizeof(float))) return 1;
    size_t e = 0;
    while (!memcmp(&want[e], &got[e], sizeof(float))) e++;
    printf("FAIL rank %d: %s: element %zu is %.9g, the plain collective gives %.9g\n", d->rank, what, e, (double)got[e], (double)want[e]);
    return 0;
}

int main(void) {
    Dist d;
    dist_init(&d, 60.0);
    if (d.world < 2) {
        fprintf(stderr, "dist_buckets_check: run it under mpirun with 2 or more ranks\n");
        dist_finalize(&d);
        return 2;
    }
    static const size_t N[] = {1, 7, 1000, 4096 * 3 + 5, 50000, 300007};
    static const size_t BUCKET[] = {1, 3, 64, 1000, 1 << 20, 2147483647};
    static const size_t STRIPE[] = {1, 3, 64, 1000, 4096, 1 << 20};   // reduce-scatter: bucket = world x stripe
    int passed = 0, failed = 0;
    const int serialized = d.mpi_serialized;
    for (int threaded = 0; threaded <= serialized; threaded++) {
        d.mpi_serialized = threaded;   // with the progress thread (MPI_THREAD_SERIALIZED) and without
        for (size_t a = 0; a < sizeof(N) / sizeof(N[0]); a++)
            for (size_t b = 0; b < sizeof(BUCKET) / sizeof(BUCKET[0]); b++)
                for (int mode = 0; mode < 3; mode++) {
                    const size_t n = N[a], bucket = BUCKET[b];
                    if (n / bucket > 400) continue;   // thousands of messages per rank: slow, adds nothing
                    char what[160];
                    float *buf = xmalloc(n * sizeof(float)), *want = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
                    Rng r;
                    rng_seed(&r, 1000 + (unsigned long long)d.rank * 31 + a * 7 + b);
                    for (size_t i = 0; i < n; i++) buf[i] = (float)(rng_uniform(&r) * 2.0 - 1.0) * 1e3f;
                    const unsigned long long seed = 77 + (unsigned long long)d.rank + a + b;   // reports differ by rank
                    const size_t S = STRIPE[b], P = S * (size_t)d.world, rounds = n ? (n + P - 1) / P : 1;   // reduce-scatter
                    if (rounds <= 400) {
                        float *pw = xmalloc(rounds * S * sizeof(float)), *pg = xmalloc(rounds * S * sizeof(float));
                        for (size_t k = 0; k < rounds; k++)   // a round of world stripes is a contiguous layout
                            dist_reduce_scatter_f32(&d, buf + k * P, n - k * P < P ? n - k * P : P, S, pw + k * S);
                        memset(pg, 0xff, rounds * S * sizeof(float));   // NaNs where nothing was written
                        report(dist_buckets_begin(&d, buf, n, S, pg), n, mode, seed);
                        snprintf(what, sizeof(what), "reduce-scatter, %s, n %zu, stripe %zu, reports %d", threaded ? "thread" : "no thread",
                                 n, S, mode);
                        if (same(&d, pg, pw, rounds * S, what)) passed++;
                        else failed++;
                        free(pw);
                        free(pg);
                    }
                    if (rounds <= 400) {   // all-gather over the same stripes, waited for in rising steps
                        memcpy(want, buf, n * sizeof(float));
                        for (size_t k = 0; k < rounds; k++) dist_allgather_f32(&d, want + k * P, n - k * P < P ? n - k * P : P, S);
                        for (size_t i = 0; i < n; i++)   // NaN where another rank's stripe goes
                            got[i] = (i % P) / S == (size_t)d.rank ? buf[i] : NAN;
                        DistBuckets *g = dist_buckets_begin_gather(&d, got, n, S);
                        Rng steps;
                        rng_seed(&steps, seed);
                        int early = 0;
                        for (size_t upto = 0; mode < 2 && upto < n;) {   // mode 2: finish only
                            upto += 1 + (size_t)(rng_next(&steps) % (n / 4 + 1));
                            if (upto > n) upto = n;
                            dist_buckets_wait(g, upto);
                            for (size_t i = 0; i < upto; i++) early |= isnan(got[i]);
                        }
                        dist_buckets_finish(g);
                        snprintf(what, sizeof(what), "all-gather, %s, n %zu, stripe %zu, waits %d%s", threaded ? "thread" : "no thread", n, S,
                                 mode, early ? " (a wait returned before its elements arrived)" : "");
                        if (!early && same(&d, got, want, n, what)) passed++;
                        else {
                            if (early) printf("FAIL rank %d: %s\n", d.rank, what);
                            failed++;
                        }
                    }
                    memcpy(want, buf, n * sizeof(float));   // all-reduce in place
                    memcpy(got, buf, n * sizeof(float));
                    dist_allreduce_sum_f32(&d, want, n);
                    report(dist_buckets_begin_allreduce(&d, got, n, bucket), n, mode, seed);
                    snprintf(what, sizeof(what), "all-reduce, %s, n %zu, bucket %zu, reports %d", threaded ? "thread" : "no thread", n,
                             bucket, mode);
                    if (same(&d, got, want, n, what)) passed++;
                    else failed++;
                    free(buf);
                    free(want);
                    free(got);
                }
    }
    int worst = dist_max_int(&d, failed);
    if (d.rank == 0)
        printf("%d ranks: %d cases on rank 0 bit for bit as dist_reduce_scatter_f32, dist_allgather_f32 and dist_allreduce_sum_f32 (%s), %d failed (most on one rank: %d)\n",
               d.world, passed, serialized ? "with and without the progress thread" : "MPI without MPI_THREAD_SERIALIZED: no progress thread", failed,
               worst);
    dist_finalize(&d);
    return worst ? 1 : 0;
}
