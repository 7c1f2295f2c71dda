/* Lloyd's k-means (squared L2) for ivf's coarse clusters. */
#ifndef RA_KMEANS_H
#define RA_KMEANS_H

#include "status.h"

#include <stdint.h>

/* Clusters x [n, dim] fp32 into k <= n clusters: centroids [k, dim], assign [n] (the nearest
 * centroid of every point). Trains on a seeded sample of at most 128 points per cluster (enough
 * for stable means), initialized from k distinct sample points, for iters rounds; an emptied
 * cluster is re-seeded by splitting the largest. Deterministic for a seed. 0, RA_EINVAL, RA_ENOMEM. */
int ra_kmeans(const float *x, uint32_t n, int dim, uint32_t k, uint32_t iters, uint64_t seed,
              int n_threads, float *centroids, uint32_t *assign, ra_error *err);

/* half_norm2[j] = |c_j|^2 / 2, so argmax_j x·c_j - half_norm2[j] is the nearest centroid. */
void ra_kmeans_half_norms(const float *centroids, uint32_t k, int dim, float *half_norm2);

#endif
