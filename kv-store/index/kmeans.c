#include "kmeans.h"

#include "index_internal.h"
#include "knn.h"

#include <stdlib.h>
#include <string.h>

#define TRAIN_PER_CLUSTER 128u

void ra_kmeans_half_norms(const float *centroids, uint32_t k, int dim, float *half_norm2) {
  for (uint32_t j = 0; j < k; j++) {
    const float *c = centroids + (size_t)j * dim;
    float s = 0.0f;
    for (int d = 0; d < dim; d++) s += c[d] * c[d];
    half_norm2[j] = 0.5f * s;
  }
}

/* Nearest centroid of each of the n points, as a top-1 inner-product search with bias -|c|^2/2. */
static int assign_points(const float *x, uint32_t n, int dim, const float *cent, uint32_t k,
                         float *neg_half, int n_threads, uint32_t *assign, ra_error *err) {
  ra_kmeans_half_norms(cent, k, dim, neg_half);
  for (uint32_t j = 0; j < k; j++) neg_half[j] = -neg_half[j];
  return ra_knn_ip(cent, k, dim, neg_half, x, n, 1, 0, n_threads, assign, NULL, err);
}

int ra_kmeans(const float *x, uint32_t n, int dim, uint32_t k, uint32_t iters, uint64_t seed,
              int n_threads, float *centroids, uint32_t *assign, ra_error *err) {
  if (k == 0 || k > n || dim <= 0)
    return ra_errorf(err, RA_EINVAL, "kmeans: %u clusters for %u points", k, n);
  uint64_t rng = seed;
  uint32_t n_train = n;
  if ((uint64_t)k * TRAIN_PER_CLUSTER < n) n_train = k * TRAIN_PER_CLUSTER;
  int rc = RA_OK;
  uint32_t *perm = malloc((size_t)n * sizeof *perm);
  float *train = n_train < n ? malloc((size_t)n_train * dim * sizeof *train) : NULL;
  uint32_t *tassign = malloc((size_t)n_train * sizeof *tassign);
  uint32_t *count = malloc((size_t)k * sizeof *count);
  float *tmp = malloc((size_t)k * sizeof *tmp);
  if (!perm || (n_train < n && !train) || !tassign || !count || !tmp) {
    rc = ra_errorf(err, RA_ENOMEM, "kmeans: out of memory (%u points, %u clusters)", n, k);
    goto out;
  }
  /* A seeded partial Fisher-Yates shuffle: its first n_train entries are the training sample and
   * its first k the initial centroids. */
  for (uint32_t i = 0; i < n; i++) perm[i] = i;
  for (uint32_t i = 0; i < n_train; i++) {
    uint32_t j = i + ra_index_rng_below(&rng, n - i);
    uint32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  const float *tx = x;
  if (train) {
    for (uint32_t i = 0; i < n_train; i++)
      memcpy(train + (size_t)i * dim, x + (size_t)perm[i] * dim, (size_t)dim * sizeof *train);
    tx = train;
  }
  for (uint32_t j = 0; j < k; j++)
    memcpy(centroids + (size_t)j * dim, x + (size_t)perm[j] * dim, (size_t)dim * sizeof *x);

  for (uint32_t it = 0; it < iters; it++) {
    if ((rc = assign_points(tx, n_train, dim, centroids, k, tmp, n_threads, tassign, err))) goto out;
    memset(centroids, 0, (size_t)k * dim * sizeof *centroids);
    memset(count, 0, (size_t)k * sizeof *count);
    for (uint32_t i = 0; i < n_train; i++) {
      float *c = centroids + (size_t)tassign[i] * dim;
      const float *p = tx + (size_t)i * dim;
      for (int d = 0; d < dim; d++) c[d] += p[d];
      count[tassign[i]]++;
    }
    for (uint32_t j = 0; j < k; j++)
      if (count[j])
        for (int d = 0; d < dim; d++) centroids[(size_t)j * dim + d] /= (float)count[j];
    /* An empty cluster takes half of the largest: both get its centroid, nudged apart. */
    for (uint32_t j = 0; j < k; j++) {
      if (count[j]) continue;
      uint32_t big = 0;
      for (uint32_t b = 1; b < k; b++)
        if (count[b] > count[big]) big = b;
      float *cj = centroids + (size_t)j * dim, *cb = centroids + (size_t)big * dim;
      for (int d = 0; d < dim; d++) {
        float eps = 1e-3f * ((float)ra_index_rng_below(&rng, 2001) / 1000.0f - 1.0f);
        cj[d] = cb[d] * (1.0f + eps);
        cb[d] = cb[d] * (1.0f - eps);
      }
      count[j] = count[big] / 2;
      count[big] -= count[j];
    }
  }
  rc = assign_points(x, n, dim, centroids, k, tmp, n_threads, assign, err);
out:
  free(perm);
  free(train);
  free(tassign);
  free(count);
  free(tmp);
  return rc;
}
