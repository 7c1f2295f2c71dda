/* Lloyd's k-means (squared L2) for ivf's coarse clusters, the way faiss trains IVF quantizers:
 * Lloyd rounds on a seeded sample of the points, every assignment a blocked sgemm (points x
 * centroids^T) with an argmax of x·c - |c|^2/2, parallel over point blocks (OpenMP), and one final
 * assignment of ALL points. */
#ifndef RA_KMEANS_H
#define RA_KMEANS_H

#include "half.h"
#include "status.h"

#include <stdint.h>

typedef struct {
  uint32_t iters;             /* Lloyd rounds on the training sample (0: the initial centroids) */
  uint32_t train_per_cluster; /* the sample: at most k * this points; 0 = every point */
  uint64_t seed;              /* sample, initial centroids, empty-cluster splits */
  int n_threads;              /* 0 = OpenMP's default */
} ra_kmeans_params;

/* Points in the training sample of n points for k clusters: min(n, k * train_per_cluster), all n
 * for train_per_cluster 0. At least k whenever k <= n. */
uint32_t ra_kmeans_train_size(uint32_t n, uint32_t k, uint32_t train_per_cluster);

/* The training sample: m <= n distinct point ids, uniformly random and in random order (a seeded
 * partial Fisher-Yates shuffle), so its first k are the initial centroids. perm is [n] scratch;
 * the sample is its first m entries. Deterministic for a seed. */
void ra_kmeans_sample(uint32_t n, uint32_t m, uint64_t seed, uint32_t *perm);

/* Clusters x [n, dim] (dtype f32 / f16 / bf16, converted block by block: no fp32 copy of all
 * points) into k <= n clusters: centroids [k, dim], assign [n] (every point's nearest centroid).
 * Initialized from the sample's first k points; an emptied cluster is re-seeded by splitting the
 * largest. Deterministic for a seed, whatever the thread count. 0, RA_EINVAL, RA_ENOMEM. */
int ra_kmeans(const void *x, ra_dtype dtype, uint32_t n, int dim, uint32_t k,
              const ra_kmeans_params *p, float *centroids, uint32_t *assign, ra_error *err);

/* assign[i] = argmin_j |x_i - c_j|^2 (ties: the lower j) for x [n, dim] in dtype and fp32
 * centroids [k, dim], as argmax_j x_i·c_j - |c_j|^2/2 over sgemm blocks. Parallel (n_threads, 0 =
 * OpenMP's default); the result does not depend on the thread count. 0, RA_EINVAL, RA_ENOMEM. */
int ra_kmeans_assign(const void *x, ra_dtype dtype, uint32_t n, int dim, const float *centroids,
                     uint32_t k, int n_threads, uint32_t *assign, ra_error *err);

/* half_norm2[j] = |c_j|^2 / 2, so argmax_j x·c_j - half_norm2[j] is the nearest centroid. */
void ra_kmeans_half_norms(const float *centroids, uint32_t k, int dim, float *half_norm2);

#endif
