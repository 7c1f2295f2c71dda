/* The CUDA backend's wave ops (backend.h: cluster_keys, wave_select, wave_select_batch,
 * wave_estimate), CUDA C++
 * only: backend_cuda.cu forwards its table entries here with its stream, cuBLAS handle and a
 * scratch buffer these ops own. */
#ifndef RA_CUDA_WAVE_CUH
#define RA_CUDA_WAVE_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend.h"
}

/* Device scratch that only grows (cudaFree on growth waits for queued work). */
typedef struct ra_cuda_wave_scratch {
  void *p;
  size_t cap;
} ra_cuda_wave_scratch;

typedef struct ra_cuda_wave_ctx {
  cudaStream_t stream;
  cublasHandle_t blas;
  ra_cuda_wave_scratch *scratch;
  ra_cuda_wave_scratch *pinned; /* host memory, pinned: wave_select's ids land there */
} ra_cuda_wave_ctx;

void ra_cuda_wave_scratch_release(ra_cuda_wave_scratch *s);
void ra_cuda_wave_pinned_release(ra_cuda_wave_scratch *s);

int ra_cuda_cluster_keys(const ra_cuda_wave_ctx *ctx, const ra_tensor *k_cache, const ra_tensor *v_cache,
                         int64_t row0, int64_t n, const ra_wave_cluster_params *p, ra_tensor *centroid,
                         ra_tensor *size, ra_tensor *vsum, int64_t c0, ra_tensor *out_k, ra_tensor *out_v,
                         int32_t *perm, int32_t *counts, ra_error *err);
int ra_cuda_wave_select(const ra_cuda_wave_ctx *ctx, const ra_tensor *q, const ra_tensor *centroid,
                        const ra_tensor *size, int64_t n_clusters, float scale, int r, int e, int32_t *idx,
                        const ra_tensor *vsum, ra_tensor *o, ra_tensor *ml, ra_error *err);
int ra_cuda_wave_select_batch(const ra_cuda_wave_ctx *ctx, const ra_wave_select_item *items, int n_items,
                              float scale, ra_error *err);
int ra_cuda_wave_estimate(const ra_cuda_wave_ctx *ctx, const ra_tensor *q, const ra_tensor *centroid,
                          const ra_tensor *size, const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids,
                          int n_ids, int64_t ld, float scale, ra_tensor *o, ra_tensor *ml, ra_error *err);

#endif
