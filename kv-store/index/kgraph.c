/* kgraph: the key-key baseline. Each key's candidates are its exact L_build nearest keys by L2
 * (an idealized HNSW/NSG: exact instead of approximate neighbor lists), occlusion-pruned to M by
 * the same L2, plus reverse edges, entry at the key nearest the keys' centroid, connectivity
 * repaired. (Candidates by inner product would favor large keys and need more of the keys
 * scanned: bench/results/defaults/README.md.)
 * Nothing in it knows where queries live, which is what the paper shows failing. */
#include "index_internal.h"
#include "knn.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* The key nearest (L2) the mean of the keys: the classic medoid-like entry. */
static uint32_t centroid_entry(const float *x, uint32_t n, int dim, float *mean) {
  memset(mean, 0, (size_t)dim * sizeof *mean);
  for (uint32_t i = 0; i < n; i++)
    for (int d = 0; d < dim; d++) mean[d] += x[(size_t)i * dim + d];
  for (int d = 0; d < dim; d++) mean[d] /= (float)n;
  uint32_t best = 0;
  float best_d = INFINITY;
  for (uint32_t i = 0; i < n; i++) {
    float s = 0.0f;
    for (int d = 0; d < dim; d++) {
      float t = x[(size_t)i * dim + d] - mean[d];
      s += t * t;
    }
    if (s < best_d) {
      best_d = s;
      best = i;
    }
  }
  return best;
}

int ra_kgraph_build(ra_index *ix, const ra_keys *keys, ra_error *err) {
  const uint32_t n = ix->n, M = ix->params.degree;
  const int dim = ix->dim;
  int nt = ix->params.n_threads > 0 ? ix->params.n_threads : omp_get_max_threads();
  int rc;
  ra_graph *g = calloc(1, sizeof *g);
  if (!g || ra_graph_init(g, M, n, n)) {
    free(g);
    return ra_errorf(err, RA_ENOMEM, "kgraph: out of memory for %u keys", n);
  }
  const float *x = NULL;
  float *mean = NULL;
  uint32_t *lists = NULL;
  ra_graph_work *works = NULL;
  if (n <= 1) goto done_ok;
  uint32_t lc = ix->params.build_ef < n - 1 ? ix->params.build_ef : n - 1;
  /* Identity metric: the cache is the keys in fp32, which the key-key knn reads too. */
  if (ra_graph_cache_metric(g, keys)) goto nomem;
  x = g->mk;
  mean = malloc((size_t)dim * sizeof *mean);
  lists = malloc((size_t)n * lc * sizeof *lists);
  works = calloc((size_t)nt, sizeof *works);
  if (!mean || !lists || !works) goto nomem;
  for (int t = 0; t < nt; t++)
    if (ra_graph_work_init(&works[t], dim, M) || ra_graph_work_reserve(&works[t], lc, n, 1))
      goto nomem;
    else
      ra_graph_work_bind(&works[t], g);
  ra_graph_set_norms(g, keys, 0, n);
  /* Nearest by L2: argmax_r x·r - |r|^2 / 2 (inner product alone would rank large keys first). */
  {
    float *neg = malloc((size_t)n * sizeof *neg);
    if (!neg) goto nomem;
    for (uint32_t v = 0; v < n; v++) neg[v] = -g->hn[v];
    rc = ra_knn_ip(x, n, dim, neg, x, n, lc, 1, nt, lists, NULL, err);
    free(neg);
    if (rc) goto fail;
  }

#pragma omp parallel for num_threads(nt) schedule(dynamic, 64)
  for (uint32_t u = 0; u < n; u++) {
    ra_graph_work *w = &works[omp_get_thread_num()];
    memcpy(w->ids, lists + (size_t)u * lc, (size_t)lc * sizeof *w->ids);
    ra_graph_rank_cands(keys, u, lc, w);
    uint32_t ns = ra_graph_prune(keys, w->cand, lc, M, 1, w);
    ra_graph_set_row(g, u, w->sel, ns);
  }
  g->entry = centroid_entry(x, n, dim, mean);
  for (int t = 0; t < nt; t++) ra_graph_work_free(&works[t]);
  free(works);
  works = NULL;
  free(lists);
  lists = NULL;
  if ((rc = ra_graph_add_reverse_edges(g, keys, nt, err))) goto fail;
  if ((rc = ra_graph_connect(g, keys, ix->params.build_ef, nt, err))) goto fail;
  ra_graph_uncache_metric(g);
done_ok:
  free(mean);
  ix->graph = g;
  return RA_OK;
nomem:
  rc = ra_errorf(err, RA_ENOMEM, "kgraph: out of memory for %u keys", n);
fail:
  if (works)
    for (int t = 0; t < nt; t++) ra_graph_work_free(&works[t]);
  free(works);
  free(lists);
  free(mean);
  ra_graph_free(g);
  free(g);
  return rc;
}
