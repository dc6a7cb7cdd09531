// The stochastic-rounding hash and bf16 conversions of backend/bf16.h, on the host.
//
// The CUDA backend's store_weights rounds element i with sr_hash32(seed, i); the same
// header compiles here, so these checks are the CPU's prediction of the GPU's bits:
//  - the hash is a fixed function: splitmix64's published first output, pinned values of
//    sr_hash32 (a change would silently break bitwise resume of bf16 runs), and two calls
//    with the same (seed, index) agree;
//  - different seeds give unrelated streams, and the 16 bits used for rounding are uniform;
//  - stochastic rounding returns one of the two bf16 neighbours, is exact on bf16 values,
//    and is unbiased: the mean of 2^20 roundings of x is x to within a few standard errors
//    (each rounding errs by at most one bf16 step u, so the mean's standard error is at most
//    u / (2 * 2^10)); round-to-nearest is checked to be biased on the same inputs;
//  - round-to-nearest-even: ties to even, NaN stays NaN, inf stays inf, overflow to inf.
// Output: one line per check, then "N passed, M failed"; exit 1 on any failure.
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/bf16.h"

static int n_passed, n_failed;

static void check(const char *name, int ok, const char *detail) {
    if (ok) n_passed++;
    else n_failed++;
    printf("%s %-58s %s\n", ok ? "ok  " : "FAIL", name, detail);
}

// The bf16 neighbours of finite x: lo = truncation (toward zero), hi = next away from zero.
static void neighbours(float x, uint16_t *lo, uint16_t *hi) {
    const uint32_t u = sr_f32_bits(x);
    *lo = (uint16_t)(u >> 16);
    *hi = (uint16_t)((u & 0xFFFFu) ? *lo + 1 : *lo);
}

static void test_fixed_function(void) {
    char buf[128];
    // splitmix64 with state 0 produces 0xE220A8397B1DCDAF first (Vigna's reference code):
    // the mixer is that generator's finalizer applied to state + golden gamma.
    const uint64_t first = sr_mix64(0x9E3779B97F4A7C15ull);
    snprintf(buf, sizeof buf, "got 0x%016llX", (unsigned long long)first);
    check("sr_mix64 is the splitmix64 finalizer", first == 0xE220A8397B1DCDAFull, buf);

    // Pinned outputs: any change to sr_hash32 changes every stored bf16 weight.
    static const struct { uint64_t seed, index; uint32_t want; } pins[] = {
        {0, 0, 0xA706DD2Fu}, {0, 1, 0xB382A305u}, {1, 0, 0x5E41AB08u},
        {0xDEADBEEFull, 123456789ull, 0xC4EF481Du}, {~0ull, ~0ull, 0x445018E3u},
    };
    int ok = 1;
    for (size_t k = 0; k < sizeof pins / sizeof pins[0]; k++) {
        const uint32_t got = sr_hash32(pins[k].seed, pins[k].index);
        if (got != pins[k].want) {
            ok = 0;
            printf("     sr_hash32(0x%llX, %llu) = 0x%08X, pinned 0x%08X\n", (unsigned long long)pins[k].seed,
                   (unsigned long long)pins[k].index, got, pins[k].want);
        }
    }
    check("sr_hash32 matches its pinned values", ok, "");

    int same = 1;
    for (uint64_t i = 0; i < 100000; i++)
        if (sr_hash32(42, i) != sr_hash32(42, i)) same = 0;
    check("sr_hash32 is deterministic", same, "");
}

static void test_streams(void) {
    char buf[128];
    // Nearby seeds (consecutive steps or tensors) must not give shifted copies of one stream.
    const uint64_t n = 1 << 16;
    uint64_t equal = 0, equal_shift = 0;
    for (uint64_t i = 0; i + 1 < n; i++) {
        equal += sr_hash32(7, i) == sr_hash32(8, i);
        equal_shift += sr_hash32(7, i + 1) == sr_hash32(8, i);
    }
    snprintf(buf, sizeof buf, "%llu and %llu equal of %llu", (unsigned long long)equal,
             (unsigned long long)equal_shift, (unsigned long long)n);
    check("seeds 7 and 8 give unrelated streams", equal <= 2 && equal_shift <= 2, buf);

    // The low 16 bits (the rounding threshold): mean and a 256-bucket chi-square.
    const uint64_t m = 1 << 22;
    double sum = 0.0;
    static uint64_t bucket[256];
    for (uint64_t i = 0; i < m; i++) {
        const uint32_t r = sr_hash32(12345, i) & 0xFFFFu;
        sum += r;
        bucket[r >> 8]++;
    }
    const double mean = sum / (double)m, want = 65535.0 / 2.0;
    const double se = 65536.0 / sqrt(12.0 * (double)m);
    snprintf(buf, sizeof buf, "mean %.2f, expected %.2f +- %.2f", mean, want, se);
    check("low 16 bits have the uniform mean", fabs(mean - want) < 5.0 * se, buf);
    double chi2 = 0.0;
    const double e = (double)m / 256.0;
    for (int b = 0; b < 256; b++) chi2 += ((double)bucket[b] - e) * ((double)bucket[b] - e) / e;
    // 255 degrees of freedom: mean 255, sd ~22.6; 400 is > 6 sd.
    snprintf(buf, sizeof buf, "chi2 %.1f with 255 dof", chi2);
    check("low 16 bits are uniform over 256 buckets", chi2 < 400.0, buf);
}

static void test_rounding(void) {
    char buf[160];
    // Values with every kind of dropped-bit pattern, both signs, several magnitudes.
    const float xs[] = {1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-10f, 3.14159265f, -2.7182818f, 1e-3f,
                        -7.77e-5f, 123456.7f, 0.1f, -0.3333333f, 1.0f + 0x1p-23f, 1e-39f /* subnormal */};
    const uint64_t M = 1 << 20;
    int all_nbr = 1, all_unbiased = 1, rne_biased = 0;
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        const float x = xs[k];
        uint16_t lo, hi;
        neighbours(x, &lo, &hi);
        const double u = fabs((double)sr_bf16_to_f32(hi) - (double)sr_bf16_to_f32(lo));
        double sum = 0.0;
        for (uint64_t i = 0; i < M; i++) {
            const uint16_t h = sr_round_weight(x, 0xC0FFEEull + k, i);
            if (h != lo && h != hi) all_nbr = 0;
            sum += (double)sr_bf16_to_f32(h);
        }
        const double mean = sum / (double)M;
        const double se = u / (2.0 * sqrt((double)M));   // upper bound of the standard error
        const int ok = u == 0.0 ? mean == (double)x : fabs(mean - (double)x) <= 5.0 * se;
        if (!ok) all_unbiased = 0;
        const double rne_err = fabs((double)sr_bf16_to_f32(sr_f32_to_bf16_rne(x)) - (double)x);
        if (u > 0.0 && rne_err > 50.0 * se) rne_biased++;
        printf("     x=% .9g  mean of SR - x = % .3e (5 se = %.3e)  RNE - x = % .3e\n", x, mean - (double)x,
               5.0 * se, (double)sr_bf16_to_f32(sr_f32_to_bf16_rne(x)) - (double)x);
    }
    check("stochastic rounding returns a bf16 neighbour", all_nbr, "");
    check("stochastic rounding is unbiased (mean of 2^20 within 5 se)", all_unbiased, "");
    snprintf(buf, sizeof buf, "%d inputs with a detectable RNE bias", rne_biased);
    check("round-to-nearest is measurably biased on the same inputs", rne_biased >= 5, buf);

    // Exact on bf16-representable values, whatever the random bits.
    int exact = 1;
    const float reps[] = {0.0f, -0.0f, 1.0f, -1.5f, 0x1p-126f, 3.0e38f, 0.25f};
    for (size_t k = 0; k < sizeof reps / sizeof reps[0]; k++) {
        const float x = sr_bf16_to_f32(sr_f32_to_bf16_rne(reps[k]));
        for (uint64_t i = 0; i < 1000; i++)
            if (sr_bf16_to_f32(sr_round_weight(x, 99, i)) != x) exact = 0;
    }
    check("stochastic rounding is exact on bf16 values", exact, "");

    // Rounding probability: x = 1 + 0.25 u rounds up a quarter of the time.
    const float x = 1.0f + 0.25f * 0x1p-7f;
    uint64_t ups = 0;
    for (uint64_t i = 0; i < M; i++) ups += sr_round_weight(x, 5, i) != sr_f32_to_bf16_rne(1.0f);
    const double frac = (double)ups / (double)M, se = sqrt(0.25 * 0.75 / (double)M);
    snprintf(buf, sizeof buf, "rounded up %.5f of the time, expected 0.25 +- %.5f", frac, se);
    check("1 + u/4 rounds up with probability 1/4", fabs(frac - 0.25) < 5.0 * se, buf);

    // NaN and inf survive; the largest finite floats may become inf (the next step up).
    const float nan_in = sr_bits_f32(0x7F800001u);   // NaN whose payload is in the dropped bits
    int specials = 1;
    for (uint64_t i = 0; i < 1000; i++) {
        const float y = sr_bf16_to_f32(sr_round_weight(nan_in, 3, i));
        if (!isnan(y)) specials = 0;
        if (sr_bf16_to_f32(sr_round_weight(INFINITY, 3, i)) != INFINITY) specials = 0;
        if (sr_bf16_to_f32(sr_round_weight(-INFINITY, 3, i)) != -INFINITY) specials = 0;
    }
    check("stochastic rounding keeps NaN and inf", specials, "");
}

static void test_rne(void) {
    int ok = 1;
    // ties: 1 + u/2 (u = 2^-7) -> 1 (even); 1 + 3u/2 -> 1 + 2u (even)
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(1.0f + 0x1p-8f)) != 1.0f) ok = 0;
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(1.0f + 3 * 0x1p-8f)) != 1.0f + 0x1p-6f) ok = 0;
    // just above a tie rounds up, just below rounds down
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(1.0f + 0x1p-8f + 0x1p-20f)) != 1.0f + 0x1p-7f) ok = 0;
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(1.0f + 0x1p-8f - 0x1p-20f)) != 1.0f) ok = 0;
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(-1.0f - 0x1p-8f - 0x1p-20f)) != -1.0f - 0x1p-7f) ok = 0;
    if (!isnan(sr_bf16_to_f32(sr_f32_to_bf16_rne(sr_bits_f32(0x7F800001u))))) ok = 0;
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(INFINITY)) != INFINITY) ok = 0;
    if (sr_bf16_to_f32(sr_f32_to_bf16_rne(3.4e38f)) != INFINITY) ok = 0;   // above bf16 max + u/2
    // the round trip is the identity on bf16 bit patterns (all finite ones)
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7F80u) == 0x7F80u) continue;
        if (sr_f32_to_bf16_rne(sr_bf16_to_f32((uint16_t)h)) != h) { ok = 0; break; }
    }
    check("round-to-nearest-even: ties, specials, round trip", ok, "");
}

int main(void) {
    test_fixed_function();
    test_streams();
    test_rounding();
    test_rne();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
