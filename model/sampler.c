// Temperature, top-k and top-p sampling (model/sampler.h).
#include "model/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

int sampler_check(const SamplerParams *p, char *err, size_t errlen) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature)) {
        snprintf(err, errlen, "--temperature %g is out of range: use 0 (greedy) or a positive number", p->temperature);
        return -1;
    }
    if (p->top_k < 0) {
        snprintf(err, errlen, "--top-k %d is out of range: use 0 (off) or a positive count", p->top_k);
        return -1;
    }
    if (!(p->top_p > 0 && p->top_p <= 1)) {
        snprintf(err, errlen, "--top-p %g is out of range: use a value in (0, 1] (1 = off)", p->top_p);
        return -1;
    }
    return 0;
}

void sampler_init(Sampler *s, const SamplerParams *p, int V) {
    s->p = *p;
    s->V = V;
    s->logit = xmalloc((size_t)V * sizeof(float));
    s->id = xmalloc((size_t)V * sizeof(int));
    s->w = xmalloc((size_t)V * sizeof(double));
}

void sampler_free(Sampler *s) {
    free(s->logit);
    free(s->id);
    free(s->w);
}

int sampler_argmax(const float *logits, int V) {
    int best = -1;
    for (int i = 0; i < V; i++)
        if (isfinite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;   // strict: ties keep the lower id
    return best;   // -1: no finite logit
}

// The candidate order: larger logit first, ties to the lower id.
static int before(float la, int ia, float lb, int ib) { return la > lb || (la == lb && ia < ib); }

// Min-heap on `before` (root = the worst kept candidate) of n entries.
static void sift_down(float *l, int *id, int n, int i) {
    for (;;) {
        int c = 2 * i + 1, w = i;
        if (c < n && before(l[w], id[w], l[c], id[c])) w = c;
        if (c + 1 < n && before(l[w], id[w], l[c + 1], id[c + 1])) w = c + 1;
        if (w == i) return;
        float tl = l[i]; l[i] = l[w]; l[w] = tl;
        int ti = id[i]; id[i] = id[w]; id[w] = ti;
        i = w;
    }
}

// Sorts the n candidates into `before` order (heap sort: no comparator context needed).
static void sort_candidates(float *l, int *id, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(l, id, n, i);
    for (int end = n - 1; end > 0; end--) {
        float tl = l[0]; l[0] = l[end]; l[end] = tl;
        int ti = id[0]; id[0] = id[end]; id[end] = ti;
        sift_down(l, id, end, 0);
    }
}

int sampler_next(Sampler *s, const float *logits, Rng *rng) {
    const SamplerParams *p = &s->p;
    if (p->temperature == 0 || p->top_k == 1) return sampler_argmax(logits, s->V);
    float *l = s->logit;
    int *id = s->id, n = 0;
    const int k = p->top_k;
    const int filter_k = k > 0 && k < s->V;
    for (int i = 0; i < s->V; i++) {
        if (!isfinite(logits[i])) continue;
        if (filter_k && n == k) {
            // keep the k best in a min-heap: replace its worst when i is better
            if (before(logits[i], i, l[0], id[0])) { l[0] = logits[i]; id[0] = i; sift_down(l, id, n, 0); }
            continue;
        }
        l[n] = logits[i];
        id[n++] = i;
        if (filter_k && n == k)
            for (int j = n / 2 - 1; j >= 0; j--) sift_down(l, id, n, j);
    }
    if (n == 0) return -1;   // no finite logit
    const int sorted = filter_k || p->top_p < 1;
    if (sorted) sort_candidates(l, id, n);   // descending by probability; unsorted: id order
    float mx = l[0];
    for (int i = 1; i < n; i++) if (l[i] > mx) mx = l[i];
    double total = 0, inv_t = 1.0 / (double)p->temperature;
    for (int i = 0; i < n; i++) total += (s->w[i] = exp(((double)l[i] - mx) * inv_t));
    if (p->top_p < 1) {
        // the smallest prefix with mass >= top_p (at least one candidate); a mass within a relative
        // 1e-9 of it counts as reaching it, so that a decimal top_p meets equal probabilities
        // where the definition does (no real distribution is resolved at 1e-9)
        double need = p->top_p * total * (1.0 - 1e-9), cum = 0;
        int m = 0;
        while (m < n && cum < need) cum += s->w[m++];
        n = m > 0 ? m : 1;
        total = 0;
        for (int i = 0; i < n; i++) total += s->w[i];
    }
    double u = rng_uniform(rng) * total, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->w[i];
        if (u < cum) return id[i];
    }
    return id[n - 1];   // u within rounding of the total
}
