// (Weighted) Lloyd k-means with k-means++ or random-point seeding: see quant/kmeans.h.
#include "quant/kmeans.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"

int kmeans_nearest(const float *centroids, int k, int dim, const float *x, double *dist2) {
    int best = 0;
    double bd = INFINITY;
    for (int e = 0; e < k; e++) {
        const float *c = centroids + (int64_t)e * dim;
        double d = 0;
        for (int j = 0; j < dim; j++) {
            double t = (double)x[j] - (double)c[j];
            d += t * t;
        }
        if (d < bd) { bd = d; best = e; }
    }
    if (dist2) *dist2 = bd;
    return best;
}

// Nearest centroid of every point (parallel: one independent result per point) and the
// objective summed in point order.
static double assign_all(const float *x, int64_t n, int dim, int64_t stride, const float *w,
                         const float *c, int k, int32_t *assign, double *d2) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) assign[i] = kmeans_nearest(c, k, dim, x + i * stride, &d2[i]);
    double obj = 0;
    for (int64_t i = 0; i < n; i++) obj += (w ? w[i] : 1.0) * d2[i];
    return obj;
}

// A draw of an index with probability p[i] / sum(p) (sum > 0), by a cumulative scan.
static int64_t draw(Rng *r, const double *p, int64_t n, double sum) {
    double u = rng_uniform(r) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc && p[i] > 0) return i;
    }
    for (int64_t i = n - 1; i >= 0; i--)      // u rounded past the last bucket: the last positive one
        if (p[i] > 0) return i;
    return 0;
}

static void seed_plusplus(const float *x, int64_t n, int dim, int64_t stride, const float *w,
                          int k, Rng *r, float *c, double *p, double *d2) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { p[i] = w ? w[i] : 1.0; sum += p[i]; }
    int64_t first = sum > 0 ? draw(r, p, n, sum) : (int64_t)(rng_next(r) % (uint64_t)n);
    memcpy(c, x + first * stride, sizeof(float) * dim);
    for (int64_t i = 0; i < n; i++) d2[i] = INFINITY;
    for (int e = 1; e < k; e++) {
        const float *prev = c + (int64_t)(e - 1) * dim;
        sum = 0;
        for (int64_t i = 0; i < n; i++) {
            double d;
            kmeans_nearest(prev, 1, dim, x + i * stride, &d);
            if (d < d2[i]) d2[i] = d;
            p[i] = (w ? w[i] : 1.0) * d2[i];
            sum += p[i];
        }
        // Every point already sits on a seed (fewer distinct weighted points than k): any
        // point will do; the duplicate seed empties and is re-seeded by Lloyd.
        int64_t pick = sum > 0 ? draw(r, p, n, sum) : (int64_t)(rng_next(r) % (uint64_t)n);
        memcpy(c + (int64_t)e * dim, x + pick * stride, sizeof(float) * dim);
    }
}

static void seed_points(const float *x, int64_t n, int dim, int64_t stride, int k, Rng *r, float *c) {
    int64_t *idx = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int e = 0; e < k; e++) {                       // partial Fisher-Yates: k distinct points
        int64_t j = e + (int64_t)(rng_next(r) % (uint64_t)(n - e)), t = idx[e];
        idx[e] = idx[j];
        idx[j] = t;
        memcpy(c + (int64_t)e * dim, x + idx[e] * stride, sizeof(float) * dim);
    }
    free(idx);
}

double kmeans_fit(const float *x, int64_t n, int dim, int64_t stride, const float *w, int k,
                  int iters, int init, uint64_t seed, float *centroids, int32_t *assign_out,
                  double *trace) {
    if (k < 1 || n < k || dim < 1 || stride < dim || iters < 0) return -1;
    Rng r;
    rng_seed(&r, seed);
    int32_t *assign = xmalloc(sizeof(int32_t) * (size_t)n), *prev = xmalloc(sizeof(int32_t) * (size_t)n);
    double *d2 = xmalloc(sizeof(double) * (size_t)n), *p = xmalloc(sizeof(double) * (size_t)n);
    double *sum = xmalloc(sizeof(double) * (size_t)k * dim), *wsum = xmalloc(sizeof(double) * (size_t)k);
    int64_t *count = xmalloc(sizeof(int64_t) * (size_t)k);
    if (init == KMEANS_INIT_PLUSPLUS) seed_plusplus(x, n, dim, stride, w, k, &r, centroids, p, d2);
    else if (init == KMEANS_INIT_POINTS) seed_points(x, n, dim, stride, k, &r, centroids);

    double obj = assign_all(x, n, dim, stride, w, centroids, k, assign, d2);
    if (trace) trace[0] = obj;
    int it = 0;
    for (; it < iters; it++) {
        // Update: the weighted mean of each cluster, summed in point order.
        memset(sum, 0, sizeof(double) * (size_t)k * dim);
        memset(wsum, 0, sizeof(double) * (size_t)k);
        memset(count, 0, sizeof(int64_t) * (size_t)k);
        for (int64_t i = 0; i < n; i++) {
            int e = assign[i];
            double wi = w ? w[i] : 1.0;
            const float *xi = x + i * stride;
            for (int j = 0; j < dim; j++) sum[(int64_t)e * dim + j] += wi * xi[j];
            wsum[e] += wi;
            count[e]++;
        }
        for (int e = 0; e < k; e++) {
            if (count[e] == 0) {
                // Empty: re-seed at the point farthest (weighted) from its centroid, and make
                // that point count as served so a second empty cluster takes the next one.
                int64_t far = 0;
                double fd = -1;
                for (int64_t i = 0; i < n; i++) {
                    double v = (w ? w[i] : 1.0) * d2[i];
                    if (v > fd) { fd = v; far = i; }
                }
                memcpy(centroids + (int64_t)e * dim, x + far * stride, sizeof(float) * dim);
                d2[far] = 0;
            } else if (wsum[e] > 0) {
                for (int j = 0; j < dim; j++)
                    centroids[(int64_t)e * dim + j] = (float)(sum[(int64_t)e * dim + j] / wsum[e]);
            }
        }
        memcpy(prev, assign, sizeof(int32_t) * (size_t)n);
        obj = assign_all(x, n, dim, stride, w, centroids, k, assign, d2);
        if (trace) trace[it + 1] = obj;
        if (memcmp(prev, assign, sizeof(int32_t) * (size_t)n) == 0) { it++; break; }
    }
    if (trace)
        for (int j = it + 1; j <= iters; j++) trace[j] = obj;
    // The assignment the last update used (prev), or the seeds' one when no update ran.
    if (assign_out) memcpy(assign_out, it == 0 ? assign : prev, sizeof(int32_t) * (size_t)n);
    free(assign); free(prev); free(d2); free(p); free(sum); free(wsum); free(count);
    return obj;
}
