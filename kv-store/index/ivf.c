/* ivf: keys clustered by k-means (L2; kmeans.c trains on a sample of the keys, then assigns every
 * key); a query scans the nprobe clusters whose centroid has the largest q·centroid, as faiss
 * IndexIVFFlat does for inner product. Key-key geometry decides the clusters, so
 * out-of-distribution queries need many probes. */
#include "index_internal.h"
#include "kmeans.h"
#include "topk.h"
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ra_ivf_free(ra_ivf *ivf) {
  if (!ivf) return;
  if (ivf->list)
    for (uint32_t i = 0; i < ivf->n_lists; i++) free(ivf->list[i]);
  free(ivf->list);
  free(ivf->list_len);
  free(ivf->list_cap);
  free(ivf->centroids);
  free(ivf->half_norm2);
  free(ivf->vec);
  free(ivf);
}

size_t ra_ivf_bytes(const ra_ivf *ivf, int dim) {
  size_t b = sizeof *ivf + (size_t)ivf->n_lists * ((size_t)dim * sizeof(float) + sizeof(float) +
                                                   sizeof(uint32_t *) + 2 * sizeof(uint32_t));
  for (uint32_t i = 0; i < ivf->n_lists; i++) b += (size_t)ivf->list_cap[i] * sizeof(uint32_t);
  return b + (size_t)dim * sizeof(float);
}

static int list_push(ra_ivf *ivf, uint32_t l, uint32_t id) {
  if (ivf->list_len[l] == ivf->list_cap[l]) {
    uint32_t cap = ivf->list_cap[l] ? ivf->list_cap[l] * 2 : 16;
    uint32_t *p = realloc(ivf->list[l], (size_t)cap * sizeof *p);
    if (!p) return RA_ENOMEM;
    ivf->list[l] = p;
    ivf->list_cap[l] = cap;
  }
  ivf->list[l][ivf->list_len[l]++] = id;
  return RA_OK;
}

int ra_ivf_build(ra_index *ix, const ra_keys *keys, ra_error *err) {
  const uint32_t n = ix->n;
  const int dim = ix->dim;
  uint32_t nl = ix->params.n_lists;
  if (nl == 0) nl = (uint32_t)(4.0 * sqrt((double)n));
  if (nl > n) nl = n;
  if (nl == 0) nl = 1;
  int rc = RA_OK;
  uint32_t *assign = NULL;
  ra_ivf *ivf = calloc(1, sizeof *ivf);
  if (!ivf) goto nomem;
  ivf->n_lists = nl;
  ivf->centroids = malloc((size_t)nl * dim * sizeof *ivf->centroids);
  ivf->half_norm2 = malloc((size_t)nl * sizeof *ivf->half_norm2);
  ivf->list = calloc(nl, sizeof *ivf->list);
  ivf->list_len = calloc(nl, sizeof *ivf->list_len);
  ivf->list_cap = calloc(nl, sizeof *ivf->list_cap);
  ivf->vec = malloc((size_t)dim * sizeof *ivf->vec);
  assign = malloc(((size_t)n + 1) * sizeof *assign);
  if (!ivf->centroids || !ivf->half_norm2 || !ivf->list || !ivf->list_len || !ivf->list_cap ||
      !ivf->vec || !assign)
    goto nomem;
  if (n == 0) {
    memset(ivf->centroids, 0, (size_t)nl * dim * sizeof *ivf->centroids);
  } else {
    /* k-means reads the keys in their dtype (no fp32 copy of the shard): Lloyd rounds on a
     * sample of train_per_list keys per list, then every key to its nearest centroid. */
    ra_kmeans_params kp = {.iters = ix->params.max_iters,
                           .train_per_cluster = ix->params.train_per_list,
                           .seed = ix->params.seed,
                           .n_threads = ix->params.n_threads};
    rc = ra_kmeans(keys->rows, keys->dtype, n, dim, nl, &kp, ivf->centroids, assign, err);
    if (rc) goto fail;
  }
  ra_kmeans_half_norms(ivf->centroids, nl, dim, ivf->half_norm2);
  /* Lists allocated at their final length: one counting pass, then the ids in key order. */
  for (uint32_t i = 0; i < n; i++) ivf->list_cap[assign[i]]++;
  for (uint32_t l = 0; l < nl; l++) {
    if (!ivf->list_cap[l]) continue;
    if (!(ivf->list[l] = malloc((size_t)ivf->list_cap[l] * sizeof *ivf->list[l]))) goto nomem;
  }
  for (uint32_t i = 0; i < n; i++) ivf->list[assign[i]][ivf->list_len[assign[i]]++] = i;
  free(assign);
  ix->ivf = ivf;
  return RA_OK;
nomem:
  rc = ra_errorf(err, RA_ENOMEM, "ivf: out of memory for %u keys, %u lists", n, nl);
fail:
  free(assign);
  ra_ivf_free(ivf);
  return rc;
}

int ra_ivf_insert(ra_index *ix, const ra_keys *keys, uint32_t id, ra_error *err) {
  ra_ivf *ivf = ix->ivf;
  ra_graph_key_to_f32(keys, id, ivf->vec);
  uint32_t best = 0;
  float best_s = -INFINITY;
  for (uint32_t l = 0; l < ivf->n_lists; l++) {
    float s = ra_vec_dot(ivf->vec, ivf->centroids + (size_t)l * ix->dim, RA_DTYPE_F32, ix->dim) -
              ivf->half_norm2[l];
    if (s > best_s) {
      best_s = s;
      best = l;
    }
  }
  if (list_push(ivf, best, id)) return ra_errorf(err, RA_ENOMEM, "ivf: out of memory inserting");
  return RA_OK;
}

int ra_ivf_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                  uint32_t nprobe, ra_index_scratch *s, uint32_t *ids, float *scores,
                  uint32_t *n_out, uint64_t *n_scanned) {
  const ra_ivf *ivf = ix->ivf;
  if (nprobe > ivf->n_lists) nprobe = ivf->n_lists;
  if (nprobe == 0) nprobe = 1;
  /* Probe order: the nprobe largest q·centroid, selected in the list arrays. */
  ra_vec_dot_rows(q, ivf->centroids, RA_DTYPE_F32, ix->dim, NULL, ivf->n_lists, s->nbr_score);
  ra_topk probe = {.score = s->list_score, .id = s->list_id, .k = nprobe, .n = 0};
  for (uint32_t l = 0; l < ivf->n_lists; l++) ra_topk_push(&probe, s->nbr_score[l], l);
  ra_topk_sort(&probe);

  ra_topk t = {.score = s->pool_score, .id = s->pool_id, .k = k, .n = 0};
  uint64_t scanned = 0;
  for (uint32_t p = 0; p < probe.n; p++) {
    const uint32_t *list = ivf->list[probe.id[p]];
    uint32_t len = ivf->list_len[probe.id[p]];
    for (uint32_t b = 0; b < len; b += s->buf_cap) {
      uint32_t nb = len - b < s->buf_cap ? len - b : s->buf_cap;
      ra_vec_dot_rows(q, keys->rows, keys->dtype, keys->dim, list + b, nb, s->nbr_score);
      float thr = ra_topk_threshold(&t);
      for (uint32_t i = 0; i < nb; i++)
        if (s->nbr_score[i] >= thr) {
          ra_topk_push(&t, s->nbr_score[i], list[b + i]);
          thr = ra_topk_threshold(&t);
        }
    }
    scanned += len;
  }
  ra_topk_sort(&t);
  for (uint32_t i = 0; i < t.n; i++) {
    ids[i] = t.id[i];
    if (scores) scores[i] = t.score[i];
  }
  *n_out = (uint32_t)t.n;
  if (n_scanned) *n_scanned = scanned;
  return RA_OK;
}

int ra_ivf_check(const ra_index *ix, ra_error *err) {
  const ra_ivf *ivf = ix->ivf;
  uint8_t *seen = calloc(ix->n ? ix->n : 1, 1);
  if (!seen) return ra_errorf(err, RA_ENOMEM, "ivf check: out of memory");
  int rc = RA_OK;
  uint64_t total = 0;
  for (uint32_t l = 0; l < ivf->n_lists && !rc; l++)
    for (uint32_t i = 0; i < ivf->list_len[l] && !rc; i++) {
      uint32_t id = ivf->list[l][i];
      if (id >= ix->n || seen[id])
        rc = ra_errorf(err, RA_EINTERNAL, "ivf: key %u %s", id,
                       id >= ix->n ? "out of range" : "in two lists");
      else
        seen[id] = 1;
      total++;
    }
  if (!rc && total != ix->n)
    rc = ra_errorf(err, RA_EINTERNAL, "ivf: %llu keys listed, %u indexed",
                   (unsigned long long)total, ix->n);
  free(seen);
  return rc;
}
