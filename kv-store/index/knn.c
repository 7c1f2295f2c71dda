#include "knn.h"

#include "topk.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Each thread takes a block of at most QB queries and walks the keys KB at a time: one
 * single-threaded sgemm of [qb, KB] scores (4 MiB at most), then those rows into the block's
 * heaps. Threads own whole query blocks, so the work needs no synchronization and the results do
 * not depend on the thread count. BLAS itself runs single-threaded (index.h): the parallelism is
 * OpenMP's, here and in the builds that call this. */
#define QB 512u
#define KB 2048u

/* One thread's scores and heaps. */
typedef struct knn_work {
  float *c;      /* [QB, KB] */
  float *hs;     /* [QB, k] heap scores */
  uint32_t *hi;  /* [QB, k] heap ids */
  ra_topk *heap; /* [QB] */
} knn_work;

static void work_free(knn_work *w) {
  free(w->c);
  free(w->hs);
  free(w->hi);
  free(w->heap);
}

static int work_init(knn_work *w, uint32_t qb, uint32_t k) {
  w->c = malloc((size_t)qb * KB * sizeof *w->c);
  w->hs = malloc((size_t)qb * k * sizeof *w->hs);
  w->hi = malloc((size_t)qb * k * sizeof *w->hi);
  w->heap = calloc(qb, sizeof *w->heap);
  if (!w->c || !w->hs || !w->hi || !w->heap) return RA_ENOMEM;
  /* The heaps live in hs/hi: ra_topk only needs its arrays and capacity. */
  for (uint32_t r = 0; r < qb; r++) {
    w->heap[r].score = w->hs + (size_t)r * k;
    w->heap[r].id = w->hi + (size_t)r * k;
    w->heap[r].k = k;
  }
  return RA_OK;
}

/* Queries [q0, q0 + nb) against every key, into ids/scores. */
static void knn_block(const float *keys, uint32_t n_keys, int dim, const float *bias, const float *q,
                      uint32_t q0, uint32_t nb, uint32_t k, int exclude_self, knn_work *w,
                      uint32_t *ids, float *scores) {
  for (uint32_t r = 0; r < nb; r++) ra_topk_reset(&w->heap[r]);
  for (uint32_t k0 = 0; k0 < n_keys; k0 += KB) {
    uint32_t kb = n_keys - k0 < KB ? n_keys - k0 : KB;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)kb, dim, 1.0f,
                q + (size_t)q0 * dim, dim, keys + (size_t)k0 * dim, dim, 0.0f, w->c, (int)kb);
    for (uint32_t r = 0; r < nb; r++) {
      ra_topk *t = &w->heap[r];
      const float *row = w->c + (size_t)r * kb;
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
  for (uint32_t r = 0; r < nb; r++) {
    ra_topk_sort(&w->heap[r]);
    memcpy(ids + (size_t)(q0 + r) * k, w->heap[r].id, (size_t)k * sizeof *ids);
    if (scores) memcpy(scores + (size_t)(q0 + r) * k, w->heap[r].score, (size_t)k * sizeof *scores);
  }
}

int ra_knn_ip(const float *keys, uint32_t n_keys, int dim, const float *bias, const float *q,
              uint32_t nq, uint32_t k, int exclude_self, int n_threads, uint32_t *ids,
              float *scores, ra_error *err) {
  if (dim <= 0 || k == 0 || (uint64_t)k + (exclude_self ? 1u : 0u) > n_keys)
    return ra_errorf(err, RA_EINVAL, "knn: k %u with %u keys%s, dim %d", k, n_keys,
                     exclude_self ? " (self excluded)" : "", dim);
  if (nq == 0) return RA_OK;
  int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  /* Blocks small enough that every thread gets one when there are few queries (k-means of a
   * small shard), 64 queries at least so that the sgemm stays efficient. */
  uint32_t qb = (nq + (uint32_t)nt - 1) / (uint32_t)nt;
  if (qb < 64) qb = 64;
  if (qb > QB) qb = QB;
  uint32_t n_blocks = (nq + qb - 1) / qb;
  if ((uint32_t)nt > n_blocks) nt = (int)n_blocks;
  knn_work *works = calloc((size_t)nt, sizeof *works);
  int rc = works ? RA_OK : RA_ENOMEM;
  for (int t = 0; rc == RA_OK && t < nt; t++) rc = work_init(&works[t], qb, k);
  if (rc == RA_OK) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (uint32_t b = 0; b < n_blocks; b++) {
      uint32_t q0 = b * qb, nb = nq - q0 < qb ? nq - q0 : qb;
      knn_block(keys, n_keys, dim, bias, q, q0, nb, k, exclude_self, &works[omp_get_thread_num()],
                ids, scores);
    }
  }
  for (int t = 0; works && t < nt; t++) work_free(&works[t]);
  free(works);
  if (rc) return ra_errorf(err, RA_ENOMEM, "knn: out of memory for %d x %u x %u blocks (k %u)", nt, qb, KB, k);
  return RA_OK;
}
