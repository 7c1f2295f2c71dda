/* The wave ops' argument contract (backend.h: cluster_keys, wave_select, wave_estimate), checked
 * the same way by every backend so that they refuse the same calls with the same RA_EINVAL. */
#ifndef RA_BACKEND_CHECK_WAVE_H
#define RA_BACKEND_CHECK_WAVE_H

#include "backend.h"

/* Caches [n_ctx, n_kv_heads, head_dim] of one dtype and shape; rows [row0, row0 + n) inside,
 * n >= 1; params positive; centroid, vsum [n_kv_heads, cap, head_dim] and size
 * [n_kv_heads, cap] F32 with c0 + K <= cap (K returned in *n_clusters); out_k, out_v NULL or
 * [n_kv_heads, n, head_dim]; perm and counts not NULL. */
int ra_backend_check_wave_cluster(const char *be_name, const ra_tensor *kc, const ra_tensor *vc, int64_t row0,
                                  int64_t n, const ra_wave_cluster_params *p, const ra_tensor *centroid,
                                  const ra_tensor *size, const ra_tensor *vsum, int64_t c0, const ra_tensor *out_k,
                                  const ra_tensor *out_v, const int32_t *perm, const int32_t *counts,
                                  int64_t *n_clusters, ra_error *err);

/* q F32 [.., head_dim] grouping over centroid's kv heads; centroid, size as above with
 * 0 <= n_clusters <= cap; r, e >= 0 with 1 <= r + e <= INT32_MAX; idx not NULL; o and ml both
 * NULL, or F32 [n_q_heads, head_dim] and [n_q_heads, 2] with vsum shaped as centroid. */
int ra_backend_check_wave_select(const char *be_name, const ra_tensor *q, const ra_tensor *centroid,
                                 const ra_tensor *size, int64_t n_clusters, int r, int e, const int32_t *idx,
                                 const ra_tensor *vsum, const ra_tensor *o, const ra_tensor *ml, ra_error *err);

/* As wave_select's with o, ml and vsum required; 0 <= n_ids <= ld; every id -1 or in
 * [0, n_clusters). */
int ra_backend_check_wave_estimate(const char *be_name, const ra_tensor *q, const ra_tensor *centroid,
                                   const ra_tensor *size, const ra_tensor *vsum, int64_t n_clusters,
                                   const int32_t *ids, int n_ids, int64_t ld, const ra_tensor *o,
                                   const ra_tensor *ml, ra_error *err);

#endif
