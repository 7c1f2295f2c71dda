#include "knn.h"

#include "topk.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Block shape: QB queries x KB keys of scores (8 MiB) per sgemm; big enough for BLAS efficiency,
 * small enough to stay near cache and bounded in memory. */
#define QB 512u
#define KB 4096u

int ra_knn_ip(const float *keys, uint32_t n_keys, int dim, const float *bias, const float *q,
              uint32_t nq, uint32_t k, int exclude_self, int n_threads, uint32_t *ids,
              float *scores, ra_error *err) {
  if (dim <= 0 || k == 0 || (uint64_t)k + (exclude_self ? 1u : 0u) > n_keys)
    return ra_errorf(err, RA_EINVAL, "knn: k %u with %u keys%s, dim %d", k, n_keys,
                     exclude_self ? " (self excluded)" : "", dim);
  if (nq == 0) return RA_OK;
  int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  float *c = malloc((size_t)QB * KB * sizeof *c);
  float *hs = malloc((size_t)QB * k * sizeof *hs);
  uint32_t *hi = malloc((size_t)QB * k * sizeof *hi);
  ra_topk *heap = calloc(QB, sizeof *heap);
  if (!c || !hs || !hi || !heap) {
    free(c);
    free(hs);
    free(hi);
    free(heap);
    return ra_errorf(err, RA_ENOMEM, "knn: out of memory for %u x %u blocks (k %u)", QB, KB, k);
  }
  /* The heaps live in hs/hi: ra_topk only needs its arrays and capacity. */
  for (uint32_t r = 0; r < QB; r++) {
    heap[r].score = hs + (size_t)r * k;
    heap[r].id = hi + (size_t)r * k;
    heap[r].k = k;
  }
  for (uint32_t q0 = 0; q0 < nq; q0 += QB) {
    uint32_t nb = nq - q0 < QB ? nq - q0 : QB;
    for (uint32_t r = 0; r < nb; r++) ra_topk_reset(&heap[r]);
    for (uint32_t k0 = 0; k0 < n_keys; k0 += KB) {
      uint32_t kb = n_keys - k0 < KB ? n_keys - k0 : KB;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)kb, dim, 1.0f,
                  q + (size_t)q0 * dim, dim, keys + (size_t)k0 * dim, dim, 0.0f, c, (int)kb);
#pragma omp parallel for num_threads(nt) schedule(static)
      for (uint32_t r = 0; r < nb; r++) {
        ra_topk *t = &heap[r];
        const float *row = c + (size_t)r * kb;
        float thr = ra_topk_threshold(t);
        for (uint32_t j = 0; j < kb; j++) {
          float s = row[j] + (bias ? bias[k0 + j] : 0.0f);
          if (s < thr) continue;
          if (exclude_self && k0 + j == q0 + r) continue;
          ra_topk_push(t, s, k0 + j);
          thr = ra_topk_threshold(t);
        }
      }
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (uint32_t r = 0; r < nb; r++) {
      ra_topk_sort(&heap[r]);
      memcpy(ids + (size_t)(q0 + r) * k, heap[r].id, (size_t)k * sizeof *ids);
      if (scores) memcpy(scores + (size_t)(q0 + r) * k, heap[r].score, (size_t)k * sizeof *scores);
    }
  }
  free(c);
  free(hs);
  free(hi);
  free(heap);
  return RA_OK;
}
