/* Exact top-k by inner product, brute force: blocked sgemm (queries x keys^T) and a top-k heap per
 * query row. Ground truth for tests and benchmarks, roar's prefill-query kNN lists when the GPU did
 * not send them, kgraph's key-key candidate lists and k-means assignment. */
#ifndef RA_KNN_H
#define RA_KNN_H

#include "status.h"

#include <stdint.h>

/* For each query i < nq (q [nq, dim] fp32): the k keys (keys [n_keys, dim] fp32) with the largest
 * q_i·key + bias[key] (bias [n_keys] or NULL), best first, ties by lower id, into ids[i*k..] and
 * scores[i*k..] (scores may be NULL). exclude_self: query i is key i and is not its own result.
 * Needs k <= n_keys (- 1 with exclude_self). Parallel (n_threads, 0 = OpenMP default) and
 * deterministic. 0, RA_EINVAL or RA_ENOMEM. */
int ra_knn_ip(const float *keys, uint32_t n_keys, int dim, const float *bias, const float *q,
              uint32_t nq, uint32_t k, int exclude_self, int n_threads, uint32_t *ids,
              float *scores, ra_error *err);

#endif
