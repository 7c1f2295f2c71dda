#include "kmeans.h"

#include "index_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Assignment blocks: QB points against KB centroids per sgemm, a [QB, KB] fp32 score block
 * (512 KiB, in a core's L2 on the hosts we run on) that the argmax reads back while it is hot.
 * The blocks are fixed, not derived from the thread count, so every point's scores, and with
 * them the result, are the same on any number of threads. 256 x 512 was the fastest of the sizes
 * tried (bench/results/defaults/README.md). */
#define QB 256u
#define KB 512u

uint32_t ra_kmeans_train_size(uint32_t n, uint32_t k, uint32_t train_per_cluster) {
  if (train_per_cluster == 0 || (uint64_t)k * train_per_cluster >= n) return n;
  return k * train_per_cluster;
}

void ra_kmeans_sample(uint32_t n, uint32_t m, uint64_t seed, uint32_t *perm) {
  uint64_t rng = seed;
  if (m > n) m = n;
  for (uint32_t i = 0; i < n; i++) perm[i] = i;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t j = i + ra_index_rng_below(&rng, n - i);
    uint32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

void ra_kmeans_half_norms(const float *centroids, uint32_t k, int dim, float *half_norm2) {
  for (uint32_t j = 0; j < k; j++) {
    const float *c = centroids + (size_t)j * dim;
    float s = 0.0f;
    for (int d = 0; d < dim; d++) s += c[d] * c[d];
    half_norm2[j] = 0.5f * s;
  }
}

/* One thread's buffers for the assignment. */
typedef struct {
  float *score; /* [QB, KB] */
  float *xb;    /* [QB, dim] fp32 rows of a block when x is not fp32 */
  float *best;  /* [QB] */
} assign_work;

typedef struct {
  assign_work *w;
  int nt;
  float *half; /* [k] */
} assigner;

static void assigner_free(assigner *a) {
  for (int t = 0; a->w && t < a->nt; t++) {
    free(a->w[t].score);
    free(a->w[t].xb);
    free(a->w[t].best);
  }
  free(a->w);
  free(a->half);
  memset(a, 0, sizeof *a);
}

static int assigner_init(assigner *a, int nt, int dim, uint32_t k, int need_xb) {
  memset(a, 0, sizeof *a);
  a->nt = nt;
  a->w = calloc((size_t)nt, sizeof *a->w);
  a->half = malloc((size_t)k * sizeof *a->half);
  if (!a->w || !a->half) return RA_ENOMEM;
  for (int t = 0; t < nt; t++) {
    a->w[t].score = malloc((size_t)QB * KB * sizeof(float));
    a->w[t].best = malloc((size_t)QB * sizeof(float));
    a->w[t].xb = need_xb ? malloc((size_t)QB * dim * sizeof(float)) : NULL;
    if (!a->w[t].score || !a->w[t].best || (need_xb && !a->w[t].xb)) return RA_ENOMEM;
  }
  return RA_OK;
}

/* Points [i0, i0 + nb) (nb <= QB) to their nearest centroids. */
static void assign_block(const void *x, ra_dtype dtype, uint32_t i0, uint32_t nb, int dim,
                         const float *cent, uint32_t k, const float *half, assign_work *w,
                         uint32_t *assign) {
  const float *xb;
  if (dtype == RA_DTYPE_F32) {
    xb = (const float *)x + (size_t)i0 * dim;
  } else {
    ra_dtype_rows_to_fp32(dtype, (const char *)x + (size_t)i0 * ra_dtype_row_bytes(dtype, (size_t)dim),
                          w->xb, nb, (size_t)dim);
    xb = w->xb;
  }
  for (uint32_t r = 0; r < nb; r++) w->best[r] = -INFINITY;
  for (uint32_t j0 = 0; j0 < k; j0 += KB) {
    uint32_t kb = k - j0 < KB ? k - j0 : KB;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)kb, dim, 1.0f, xb, dim,
                cent + (size_t)j0 * dim, dim, 0.0f, w->score, (int)kb);
    const float *h = half + j0;
    for (uint32_t r = 0; r < nb; r++) {
      const float *row = w->score + (size_t)r * kb;
      float b = w->best[r];
      uint32_t bj = j0 ? assign[i0 + r] : 0;
      /* Strictly greater: ties keep the lower centroid id. A NaN score never wins, and a row
       * whose scores are all NaN stays at centroid 0. */
      for (uint32_t j = 0; j < kb; j++) {
        float s = row[j] - h[j];
        if (s > b) {
          b = s;
          bj = j0 + j;
        }
      }
      w->best[r] = b;
      assign[i0 + r] = bj;
    }
  }
}

static void assign_all(const void *x, ra_dtype dtype, uint32_t n, int dim, const float *cent,
                       uint32_t k, assigner *a, uint32_t *assign) {
  ra_kmeans_half_norms(cent, k, dim, a->half);
  const uint32_t n_blocks = (n + QB - 1) / QB;
  int nt = a->nt < (int)n_blocks ? a->nt : (int)n_blocks;
  if (nt < 1) nt = 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (uint32_t b = 0; b < n_blocks; b++) {
    uint32_t i0 = b * QB, nb = n - i0 < QB ? n - i0 : QB;
    assign_block(x, dtype, i0, nb, dim, cent, k, a->half, &a->w[omp_get_thread_num()], assign);
  }
}

static int threads_or_default(int n_threads) {
  return n_threads > 0 ? n_threads : omp_get_max_threads();
}

int ra_kmeans_assign(const void *x, ra_dtype dtype, uint32_t n, int dim, const float *centroids,
                     uint32_t k, int n_threads, uint32_t *assign, ra_error *err) {
  if (k == 0 || dim <= 0 || ra_dtype_row_bytes(dtype, 1) == 0)
    return ra_errorf(err, RA_EINVAL, "kmeans assign: %u centroids, dim %d, dtype %d", k, dim,
                     (int)dtype);
  if (n == 0) return RA_OK;
  assigner a;
  int rc = assigner_init(&a, threads_or_default(n_threads), dim, k, dtype != RA_DTYPE_F32);
  if (rc == RA_OK) assign_all(x, dtype, n, dim, centroids, k, &a, assign);
  assigner_free(&a);
  if (rc) return ra_errorf(err, RA_ENOMEM, "kmeans assign: out of memory (%u centroids)", k);
  return RA_OK;
}

/* Centroids = means of their training points. Threads own ranges of clusters and add their
 * points in sample order, so the sums do not depend on the thread count. count [k] out. */
static void update_centroids(const float *tx, uint32_t m, int dim, const uint32_t *tassign,
                             uint32_t k, int nt, float *cent, uint32_t *count) {
  if ((uint32_t)nt > k) nt = (int)k;
#pragma omp parallel num_threads(nt)
  {
    const uint32_t t = (uint32_t)omp_get_thread_num(), T = (uint32_t)omp_get_num_threads();
    const uint32_t j0 = (uint32_t)((uint64_t)k * t / T), j1 = (uint32_t)((uint64_t)k * (t + 1) / T);
    memset(cent + (size_t)j0 * dim, 0, (size_t)(j1 - j0) * dim * sizeof *cent);
    memset(count + j0, 0, (size_t)(j1 - j0) * sizeof *count);
    for (uint32_t i = 0; i < m; i++) {
      uint32_t a = tassign[i];
      if (a < j0 || a >= j1) continue;
      float *c = cent + (size_t)a * dim;
      const float *p = tx + (size_t)i * dim;
      for (int d = 0; d < dim; d++) c[d] += p[d];
      count[a]++;
    }
    for (uint32_t j = j0; j < j1; j++)
      if (count[j]) {
        float inv = 1.0f / (float)count[j];
        for (int d = 0; d < dim; d++) cent[(size_t)j * dim + d] *= inv;
      }
  }
}

int ra_kmeans(const void *x, ra_dtype dtype, uint32_t n, int dim, uint32_t k,
              const ra_kmeans_params *p, float *centroids, uint32_t *assign, ra_error *err) {
  const size_t rb = dim > 0 ? ra_dtype_row_bytes(dtype, (size_t)dim) : 0;
  if (!p || k == 0 || k > n || dim <= 0 || rb == 0)
    return ra_errorf(err, RA_EINVAL, "kmeans: %u clusters for %u points (dim %d, dtype %d)", k, n,
                     dim, (int)dtype);
  const int nt = threads_or_default(p->n_threads);
  uint64_t rng = p->seed ^ 0x9E3779B97F4A7C15ull; /* the splits' stream, apart from the sample's */
  const uint32_t m = ra_kmeans_train_size(n, k, p->train_per_cluster);
  int rc = RA_OK;
  assigner a = {0};
  uint32_t *perm = malloc((size_t)n * sizeof *perm);
  float *tx = malloc((size_t)m * dim * sizeof *tx);
  uint32_t *tassign = malloc((size_t)m * sizeof *tassign);
  uint32_t *count = malloc((size_t)k * sizeof *count);
  if (!perm || !tx || !tassign || !count || assigner_init(&a, nt, dim, k, dtype != RA_DTYPE_F32)) {
    rc = ra_errorf(err, RA_ENOMEM, "kmeans: out of memory (%u points, %u clusters, %u sampled)",
                   n, k, m);
    goto out;
  }
  /* The sample as fp32 rows, in shuffled order: its first k rows are the initial centroids. */
  ra_kmeans_sample(n, m, p->seed, perm);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (uint32_t i = 0; i < m; i++)
    ra_dtype_rows_to_fp32(dtype, (const char *)x + (size_t)perm[i] * rb, tx + (size_t)i * dim, 1,
                          (size_t)dim);
  memcpy(centroids, tx, (size_t)k * dim * sizeof *centroids);

  for (uint32_t it = 0; it < p->iters; it++) {
    assign_all(tx, RA_DTYPE_F32, m, dim, centroids, k, &a, tassign);
    update_centroids(tx, m, dim, tassign, k, nt, centroids, count);
    /* An empty cluster takes half of the largest: both get its centroid, nudged apart by a
     * relative 1e-3 (faiss splits the same way), and the counts are split so that several empty
     * clusters spread over several large ones. */
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
  /* Every point, sampled or not, to its nearest final centroid. */
  assign_all(x, dtype, n, dim, centroids, k, &a, assign);
out:
  assigner_free(&a);
  free(perm);
  free(tx);
  free(tassign);
  free(count);
  return rc;
}
