// Deterministic host random numbers (splitmix64 seeding a xoshiro256** stream):
// weight initialization and anything else that must repeat exactly from a seed.
#ifndef CLLA_COMMON_RNG_H
#define CLLA_COMMON_RNG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Rng { uint64_t s[4]; } Rng;

static inline uint64_t rng_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&seed);
}

static inline uint64_t rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
}

// Uniform in (0, 1) from one draw, never 0 (safe for log).
static inline double rng_uniform_of(uint64_t x) { return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static inline double rng_uniform(Rng *r) { return rng_uniform_of(rng_next(r)); }

// Standard normal from two consecutive draws (Box-Muller). rng_normal takes them from the
// stream; rng_fill_normal draws a chunk first and transforms it in parallel, with the same
// values.
static inline double rng_normal_of(uint64_t a, uint64_t b) {
    return sqrt(-2.0 * log(rng_uniform_of(a))) * cos(6.283185307179586 * rng_uniform_of(b));
}

// Standard normal (one value per call, two draws, so the stream position is simple).
static inline double rng_normal(Rng *r) {
    const uint64_t a = rng_next(r), b = rng_next(r);
    return rng_normal_of(a, b);
}

// p[0..n) = std x the standard normals rng_normal would give one after another, the same
// values: the draws are taken from the stream RNG_FILL_CHUNK values at a time (the stream is
// sequential), then transformed by all threads (the log and cos are the cost). draws: room for
// 2 x RNG_FILL_CHUNK, the caller's (1 MiB: L2-resident).
#define RNG_FILL_CHUNK ((size_t)1 << 16)
static inline void rng_fill_normal(float *p, size_t n, double std, Rng *r, uint64_t *draws) {
    for (size_t c0 = 0; c0 < n; c0 += RNG_FILL_CHUNK) {
        const size_t cn = n - c0 < RNG_FILL_CHUNK ? n - c0 : RNG_FILL_CHUNK;
        for (size_t k = 0; k < 2 * cn; k++) draws[k] = rng_next(r);
        float *out = p + c0;
        #pragma omp parallel for schedule(static) if (cn >= 8192)
        for (size_t k = 0; k < cn; k++) out[k] = (float)(std * rng_normal_of(draws[2 * k], draws[2 * k + 1]));
    }
}

#endif
