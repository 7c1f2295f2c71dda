/* The CPU backend's wave ops (backend.h: cluster_keys, wave_select, wave_estimate), in their own
 * file; backend_cpu.c puts them in its ops table. */
#ifndef RA_BACKEND_CPU_WAVE_H
#define RA_BACKEND_CPU_WAVE_H

#include "backend.h"

int ra_cpu_cluster_keys(ra_backend *be, const ra_tensor *k_cache, const ra_tensor *v_cache, int64_t row0, int64_t n,
                        const ra_wave_cluster_params *p, ra_tensor *centroid, ra_tensor *size, ra_tensor *vsum,
                        int64_t c0, ra_tensor *out_k, ra_tensor *out_v, int32_t *perm, int32_t *counts,
                        ra_error *err);
int ra_cpu_wave_select(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                       int64_t n_clusters, float scale, int r, int e, int32_t *idx, const ra_tensor *vsum,
                       ra_tensor *o, ra_tensor *ml, ra_error *err);
int ra_cpu_wave_estimate(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                         const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids, int n_ids, int64_t ld,
                         float scale, ra_tensor *o, ra_tensor *ml, ra_error *err);

#endif
