// (Weighted) k-means for the codebook quantizers: CQ's per-group codebooks (k-means++ seeding,
// Fisher weights, docs/QUANTIZERS.md "CQ") and QET's product-quantization stages (random distinct
// points as seeds, scipy kmeans2 minit='points', docs/QUANTIZERS.md "QET"). Deterministic: the
// seeding draws from common/rng.h with an explicit seed, every sum runs in a fixed order, and the
// only parallel loop (the nearest-centroid search) writes one independent result per point.
#ifndef CLLA_QUANT_KMEANS_H
#define CLLA_QUANT_KMEANS_H

#include <stdint.h>

enum {
    KMEANS_INIT_PLUSPLUS = 0,   // k-means++: first seed with probability w, then w * D^2
    KMEANS_INIT_POINTS = 1,     // k distinct points drawn uniformly (scipy's minit='points')
    KMEANS_INIT_GIVEN = 2,      // start from the centroids passed in
};

// The index of the centroid nearest to x in L2 (the lowest index on a tie); *dist2 (may be
// NULL) receives the squared distance. Distances accumulate in double in channel order, so
// the result does not depend on the machine's vector width.
int kmeans_nearest(const float *centroids, int k, int dim, const float *x, double *dist2);

// Lloyd's algorithm on n points of dim floats, point i at x + i * stride (stride >= dim lets
// a group of channels be read in place inside wider vectors), optional weights w[n] >= 0
// (NULL: all 1). Minimizes sum_i w_i |x_i - c(x_i)|^2: assign each point to its nearest
// centroid by plain L2, then move each centroid to the weighted mean of its points. A cluster
// left without points is re-seeded at the point that contributes most to the objective; a
// cluster whose points all weigh 0 keeps its centroid. Stops after `iters` iterations or when
// no assignment changes (the rest would repeat the same state).
//   centroids[k * dim]: out (in as well with KMEANS_INIT_GIVEN)
//   assign[n]  (may be NULL): the assignment the last centroid update used
//   trace[iters + 1] (may be NULL): the objective with the seeds, then after every iteration
//               (each with the nearest assignment to the centroids of that moment)
// Returns the final objective, or -1 when k < 1, n < k, dim < 1 or stride < dim.
double kmeans_fit(const float *x, int64_t n, int dim, int64_t stride, const float *w, int k,
                  int iters, int init, uint64_t seed, float *centroids, int32_t *assign,
                  double *trace);

#endif
