// model/shard.h, the description of the elements a rank's optimizer holds: for the three layouts
// train/grad_sync.c makes (every element; contiguous ZeRO-1 pieces; stripes of every bucket) and
// sizes that do and do not divide, the ranks' ranges cover [0, n) exactly once, each element's
// packed offset lies inside the rank's buffer and no two elements of a rank share one, every
// rank's buffer has the same size, and shard_unpack puts each packed element back at its place
// (the ranks' buffers unpacked together rebuild the layout). Exit 1 on the first failure, printed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/shard.h"

static int fail(const char *what, size_t n, int world, size_t stripe, size_t period) {
    printf("FAIL %s (n %zu, world %d, stripe %zu, period %zu)\n", what, n, world, stripe, period);
    return 1;
}

// The shards of `world` ranks, rank r's made by make(r): a partition of [0, n), packed without
// collisions into buffers of one size.
static int check(size_t n, int world, Shard (*make)(size_t n, int world, int r, size_t arg), size_t arg) {
    unsigned char *seen = calloc(n ? n : 1, 1);
    float *whole = malloc((n ? n : 1) * sizeof(float));   // the layout rebuilt by shard_unpack
    for (size_t x = 0; x < n; x++) whole[x] = -1.0f;
    size_t count0 = 0;
    for (int r = 0; r < world; r++) {
        const Shard s = make(n, world, r, arg);
        const size_t count = shard_count(&s);
        if (r == 0) count0 = count;
        if (count != count0) return fail("the ranks' buffers differ in size", n, world, s.stripe, s.period);
        unsigned char *slot = calloc(count ? count : 1, 1);
        float *packed = calloc(count ? count : 1, sizeof(float));
        size_t prev_end = 0;
        for (size_t k = 0; k < shard_rounds(&s); k++) {
            size_t a, b, off;
            shard_range(&s, k, &a, &b, &off);
            if (a > b || b > n) return fail("a range outside [0, n)", n, world, s.stripe, s.period);
            if (b > a && a < prev_end) return fail("ranges not rising", n, world, s.stripe, s.period);
            for (size_t x = a; x < b; x++) {
                const size_t p = off + (x - a);
                if (p >= count) return fail("a packed offset past the buffer", n, world, s.stripe, s.period);
                if (slot[p]++) return fail("two elements at one packed offset", n, world, s.stripe, s.period);
                if (seen[x]++) return fail("an element held by two ranks", n, world, s.stripe, s.period);
                packed[p] = (float)x;   // n < 2^24: exact
            }
            if (b > a) prev_end = b;
        }
        if (shard_is_contiguous(&s) != (shard_rounds(&s) == 1)) return fail("shard_is_contiguous", n, world, s.stripe, s.period);
        shard_unpack(&s, whole, packed);
        free(slot);
        free(packed);
    }
    for (size_t x = 0; x < n; x++) {
        if (!seen[x]) return fail("an element held by no rank", n, world, 0, 0);
        if (whole[x] != (float)x) return fail("shard_unpack put an element elsewhere", n, world, 0, 0);
    }
    free(seen);
    free(whole);
    return 0;
}

static Shard all(size_t n, int world, int r, size_t arg) {
    (void)world; (void)r; (void)arg;
    return (Shard){0, n, n, n};
}
// ZeRO-1's pieces: ceil(n / world) rounded up to `arg`, as dist_shard_size makes them
static Shard piece(size_t n, int world, int r, size_t arg) {
    size_t shard = (n + (size_t)world - 1) / (size_t)world;
    shard = (shard + arg - 1) / arg * arg;
    if (shard == 0) shard = arg;
    return (Shard){(size_t)r * shard, shard, shard * (size_t)world, n};
}
static Shard stripes(size_t n, int world, int r, size_t arg) { return (Shard){(size_t)r * arg, arg, arg * (size_t)world, n}; }

int main(void) {
    static const size_t N[] = {0, 1, 7, 4096, 4097, 12293, 50000};
    static const int WORLD[] = {1, 2, 3, 4, 7};
    static const size_t STRIPE[] = {1, 3, 64, 4096};
    int cases = 0;
    for (size_t a = 0; a < sizeof(N) / sizeof(N[0]); a++)
        for (size_t w = 0; w < sizeof(WORLD) / sizeof(WORLD[0]); w++) {
            const size_t n = N[a];
            const int world = WORLD[w];
            if (world == 1 && check(n, 1, all, 0)) return 1;
            const Shard one = all(n, 1, 0, 0);
            if (n && !shard_is_all(&one)) return fail("every element: shard_is_all", n, 1, n, n);
            for (size_t s = 0; s < sizeof(STRIPE) / sizeof(STRIPE[0]); s++) {
                if (check(n, world, piece, STRIPE[s]) || check(n, world, stripes, STRIPE[s])) return 1;
                const Shard p = piece(n, world, world - 1, STRIPE[s]);
                if (!shard_is_contiguous(&p)) return fail("a ZeRO-1 piece: one round", n, world, p.stripe, p.period);
                cases += 2;
            }
        }
    // a contiguous piece's first range is [r shard, (r + 1) shard) clipped, as grad_sync's lo/hi
    const Shard p = piece(10000, 3, 1, 4096);
    size_t a, b, off;
    shard_range(&p, 0, &a, &b, &off);
    if (a != 4096 || b != 8192 || off != 0) return fail("rank 1's piece of 10000 over 3 in blocks of 4096", 10000, 3, p.stripe, p.period);
    const Shard q = piece(10000, 3, 2, 4096);
    shard_range(&q, 0, &a, &b, &off);
    if (a != 8192 || b != 10000 || shard_count(&q) != 4096) return fail("the last piece clipped, its buffer whole", 10000, 3, q.stripe, q.period);
    printf("%d layouts: every element held once, packed without collisions, buffers of one size\n", cases);
    return 0;
}
