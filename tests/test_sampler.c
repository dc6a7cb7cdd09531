// The sampler of `clla generate` (model/sampler.c): greedy is the argmax with ties to the
// lower id; top-k 1 is greedy; top-p keeps the smallest prefix with mass >= p; the empirical
// distribution of many draws matches softmax(logits / T) (chi-square bound), also restricted
// to the top k and to the top-p prefix; a seed repeats its tokens; out-of-range settings are
// refused.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "model/sampler.h"

static int passed, failed;
static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

// Chi-square of observed counts against probabilities p over the ids with p > 0; ids with
// p == 0 must never be drawn (returns INFINITY when one was).
static double chi_square(const long *obs, const double *p, int V, long n, int *df) {
    double x = 0;
    *df = -1;
    for (int i = 0; i < V; i++) *df += p[i] > 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            if (obs[i]) return INFINITY;
            continue;
        }
        double e = p[i] * (double)n;
        x += (obs[i] - e) * (obs[i] - e) / e;
    }
    return x;
}

// softmax(l / T) restricted to `keep` (NULL: all ids).
static void softmax_t(const float *l, int V, float T, const int *keep, double *p) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) if ((!keep || keep[i]) && l[i] > mx) mx = l[i];
    for (int i = 0; i < V; i++) s += (p[i] = (!keep || keep[i]) ? exp(((double)l[i] - mx) / T) : 0);
    for (int i = 0; i < V; i++) p[i] /= s;
}

// Draws n tokens and compares with p. The bound is the chi-square quantile at about 1e-6 for
// up to 15 degrees of freedom (a correct sampler gives about df; the seed is fixed, so the
// test is deterministic).
static void check_distribution(const char *what, const SamplerParams *sp, const float *l, int V, const double *p,
                               long n, uint64_t seed) {
    Sampler s;
    sampler_init(&s, sp, V);
    Rng r;
    rng_seed(&r, seed);
    long *obs = calloc((size_t)V, sizeof(long));
    for (long i = 0; i < n; i++) obs[sampler_next(&s, l, &r)]++;
    int df;
    double x = chi_square(obs, p, V, n, &df);
    double bound = 24.0 + 3.2 * df;   // >= the 1e-6 quantile for df in [1, 15]
    char msg[256];
    snprintf(msg, sizeof(msg), "%s: chi-square %.2f over %d degrees of freedom < %.1f (%ld draws)", what, x, df, bound, n);
    check(df >= 1 && x < bound, msg);
    free(obs);
    sampler_free(&s);
}

int main(void) {
    char err[256];
    // ---- greedy
    {
        float l[6] = {1.0f, 3.0f, NAN, 3.0f, -INFINITY, 2.5f};
        check(sampler_argmax(l, 6) == 1, "argmax: ties go to the lower id, NaN skipped");
        SamplerParams g = {0.0f, 0, 1.0f};
        Sampler s;
        sampler_init(&s, &g, 6);
        Rng r;
        rng_seed(&r, 1);
        int all = 1;
        for (int i = 0; i < 100; i++) all &= sampler_next(&s, l, &r) == 1;
        check(all, "temperature 0 is the argmax, every time");
        sampler_free(&s);
        float inf[3] = {NAN, INFINITY, -INFINITY};
        check(sampler_argmax(inf, 3) == -1, "no finite logit: -1 (the caller reports it)");
        SamplerParams t1 = {1.0f, 0, 1.0f};
        Sampler st;
        sampler_init(&st, &t1, 3);
        check(sampler_next(&st, inf, &r) == -1, "sampling with no finite logit: -1");
        sampler_free(&st);
    }
    // ---- top-k 1 == greedy on random rows (with ties)
    {
        SamplerParams k1 = {1.5f, 1, 1.0f};
        Sampler s;
        sampler_init(&s, &k1, 50);
        Rng r, d;
        rng_seed(&r, 2);
        rng_seed(&d, 3);
        float l[50];
        int same = 1;
        for (int t = 0; t < 200; t++) {
            for (int i = 0; i < 50; i++) l[i] = (float)floor(rng_normal(&d) * 3);   // integer logits: many ties
            same &= sampler_next(&s, l, &r) == sampler_argmax(l, 50);
        }
        check(same, "top-k 1 picks the argmax (ties to the lower id) on 200 random rows");
        sampler_free(&s);
    }
    // ---- full distribution: softmax(l / T)
    const int V = 12;
    float l[12];
    {
        Rng d;
        rng_seed(&d, 4);
        for (int i = 0; i < V; i++) l[i] = (float)(rng_normal(&d) * 1.5);
    }
    double p[12];
    for (int ti = 0; ti < 3; ti++) {
        float T = ti == 0 ? 1.0f : ti == 1 ? 0.6f : 2.0f;
        SamplerParams sp = {T, 0, 1.0f};
        softmax_t(l, V, T, NULL, p);
        char what[64];
        snprintf(what, sizeof(what), "T=%.1f matches softmax(logits/T)", T);
        check_distribution(what, &sp, l, V, p, 300000, 10 + ti);
    }
    // ---- top-k: softmax over the k largest
    {
        int keep[12] = {0}, order[12];
        for (int i = 0; i < V; i++) order[i] = i;
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++)
                if (l[order[j]] > l[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
        for (int i = 0; i < 4; i++) keep[order[i]] = 1;
        SamplerParams sp = {0.8f, 4, 1.0f};
        softmax_t(l, V, 0.8f, keep, p);
        check_distribution("top-k 4, T=0.8: softmax over the 4 largest logits only", &sp, l, V, p, 300000, 20);
    }
    // ---- top-k cut inside a run of equal logits: the lower ids are kept
    {
        float q[5] = {0.0f, 1.0f, 1.0f, 2.0f, 1.0f};
        int keep[5] = {0, 1, 1, 1, 0};
        SamplerParams sp = {1.0f, 3, 1.0f};
        double pp[5];
        softmax_t(q, 5, 1.0f, keep, pp);
        check_distribution("top-k 3 over logits 0 1 1 2 1: keeps ids 3, 1, 2 (ties to the lower id)", &sp, q, 5, pp, 100000, 25);
    }
    // ---- top-p: probabilities 0.1 0.4 0.2 0.3 (ids 0..3) sorted 0.4 0.3 0.2 0.1
    {
        float q[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
        struct { float top_p; int keep[4]; const char *what; } cases[] = {
            {0.35f, {0, 1, 0, 0}, "top-p 0.35 keeps only the most likely id (0.4 >= 0.35)"},
            {0.65f, {0, 1, 0, 1}, "top-p 0.65 keeps the two most likely (0.4 < 0.65 <= 0.7)"},
            {0.75f, {0, 1, 1, 1}, "top-p 0.75 keeps three (0.7 < 0.75 <= 0.9)"},
            {1.0f, {1, 1, 1, 1}, "top-p 1 keeps every id"},
        };
        for (int c = 0; c < 4; c++) {
            SamplerParams sp = {1.0f, 0, cases[c].top_p};
            double pp[4];
            softmax_t(q, 4, 1.0f, cases[c].keep, pp);
            if (c == 0) {
                Sampler s;
                sampler_init(&s, &sp, 4);
                Rng r;
                rng_seed(&r, 30);
                int only = 1;
                for (int i = 0; i < 10000; i++) only &= sampler_next(&s, q, &r) == 1;
                check(only, cases[c].what);
                sampler_free(&s);
            } else {
                check_distribution(cases[c].what, &sp, q, 4, pp, 200000, 31 + c);
            }
        }
        // equal probabilities: top-p 0.2 and 0.6 of 10 keep exactly 2 and 6 (as a float, 0.2 was
        // 0.200000003 and kept 3), and 0.07 of 100 keeps 7 (in double 0.07 x 100 is
        // 7.000000000000001, which the mass of 7 does not reach without the 1e-9 margin)
        {
            static float e[100];
            const struct { double p; int V; } cs[3] = {{0.2, 10}, {0.6, 10}, {0.07, 100}};
            for (int c = 0; c < 3; c++) {
                SamplerParams se = {1.0f, 0, cs[c].p};
                int keep[100] = {0};
                const int k = (int)(cs[c].p * cs[c].V + 0.5);
                for (int i = 0; i < k; i++) keep[i] = 1;
                double pe[100];
                softmax_t(e, cs[c].V, 1.0f, keep, pe);
                char what[128];
                snprintf(what, sizeof(what), "top-p %g of %d equal probabilities keeps exactly %d (ties to the lower id)", cs[c].p,
                         cs[c].V, k);
                check_distribution(what, &se, e, cs[c].V, pe, 100000, 50 + c);
            }
        }
        // top-k then top-p: top-k 3 leaves 0.4 0.3 0.2 (renormalized 4/9 3/9 2/9); p 0.5 keeps two
        SamplerParams sp = {1.0f, 3, 0.5f};
        double pp[4];
        int keep[4] = {0, 1, 0, 1};
        softmax_t(q, 4, 1.0f, keep, pp);
        check_distribution("top-k 3 then top-p 0.5 over the renormalized top 3", &sp, q, 4, pp, 200000, 40);
    }
    // ---- seeds
    {
        SamplerParams sp = {0.9f, 8, 0.95f};
        Sampler s;
        sampler_init(&s, &sp, V);
        int a[500], b[500], c[500];
        Rng r;
        rng_seed(&r, 77);
        for (int i = 0; i < 500; i++) a[i] = sampler_next(&s, l, &r);
        rng_seed(&r, 77);
        for (int i = 0; i < 500; i++) b[i] = sampler_next(&s, l, &r);
        rng_seed(&r, 78);
        for (int i = 0; i < 500; i++) c[i] = sampler_next(&s, l, &r);
        check(!memcmp(a, b, sizeof(a)), "the same seed draws the same 500 tokens");
        check(memcmp(a, c, sizeof(a)) != 0, "another seed draws other tokens");
        sampler_free(&s);
    }
    // ---- settings out of range
    {
        SamplerParams bad[] = {{-0.1f, 0, 1.0f}, {NAN, 0, 1.0f}, {INFINITY, 0, 1.0f}, {1.0f, -1, 1.0f},
                               {1.0f, 0, 0.0f}, {1.0f, 0, 1.01f}, {1.0f, 0, NAN}};
        int refused = 0;
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) refused += sampler_check(&bad[i], err, sizeof(err)) != 0;
        check(refused == (int)(sizeof(bad) / sizeof(bad[0])), "temperature < 0 or not finite, top-k < 0, top-p outside (0, 1] refused");
        SamplerParams good[] = {{0.0f, 0, 1.0f}, {0.7f, 40, 0.9f}, {1.0f, 1, 0.001f}};
        int accepted = 0;
        for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) accepted += sampler_check(&good[i], err, sizeof(err)) == 0;
        check(accepted == 3, "in-range settings accepted");
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
