#include "wave.h"

#include "opts.h"
#include "wave_buffer.h"
#include "wave_retro.h"

#include <math.h>
#include <uv.h>
#include <stdlib.h>
#include <string.h>

/* iters 5: on SmolLM2's keys 5 Lloyd iterations capture the mass and error of 10 (RetroInfer's)
 * to 0.001 (bench/results/wave-smollm2/), and the CUDA clustering's GEMMs cost per iteration. */
void ra_wave_config_default(ra_wave_config *c) {
  *c = (ra_wave_config){.retrieve = 0.018, .retrieve_min = 1024, .estimate = 0.232, .segment = 8192, .cluster = 16,
                        .iters = 5, .block = 1024, .buffer = 0};
}

static int budget_ok(double x) { return isfinite(x) && x >= 0 && (x <= 1 || x == floor(x)); }

int ra_wave_config_check(const ra_wave_config *c, ra_error *err) {
  if (!budget_ok(c->retrieve) || !budget_ok(c->estimate))
    return ra_errorf(err, RA_EINVAL, "wave: budgets retrieve %g / estimate %g (each a fraction in [0, 1] or a "
                     "whole number of tokens)", c->retrieve, c->estimate);
  if (c->retrieve_min < 0)
    return ra_errorf(err, RA_EINVAL, "wave: a retrieval floor of %lld tokens", (long long)c->retrieve_min);
  if (c->cluster < 1 || c->iters < 1)
    return ra_errorf(err, RA_EINVAL, "wave: clusters of %lld rows, %d iterations (each at least 1)",
                     (long long)c->cluster, c->iters);
  if (c->segment < c->cluster)
    return ra_errorf(err, RA_EINVAL, "wave: a segment of %lld rows is smaller than a cluster (%lld)",
                     (long long)c->segment, (long long)c->cluster);
  if (c->buffer < 0)
    return ra_errorf(err, RA_EINVAL, "wave: a buffer of %lld clusters", (long long)c->buffer);
  if (c->block < c->cluster)
    return ra_errorf(err, RA_EINVAL, "wave: a growth block of %lld rows is smaller than a cluster (%lld)",
                     (long long)c->block, (long long)c->cluster);
  return RA_OK;
}

int ra_wave_budget_parse(const char *s, double *out, ra_error *err) {
  char *end;
  double x = strtod(s, &end);
  if (end == s || *end || !isfinite(x) || x < 0)
    return ra_errorf(err, RA_EINVAL, "not a fraction in [0, 1] or a token count");
  if (x > 1 && x != floor(x)) return ra_errorf(err, RA_EINVAL, "above 1 it is a token count: a whole number");
  *out = x;
  return RA_OK;
}

int64_t ra_wave_budget_clusters(double budget, int64_t n_clusters, int64_t cluster) {
  double k = budget <= 1 ? ceil(budget * (double)n_clusters - 1e-9) : ceil(budget / (double)cluster);
  if (k < 0) k = 0;
  return k > (double)n_clusters ? n_clusters : (int64_t)k;
}

int64_t ra_wave_retrieve_clusters(const ra_wave_config *c, int64_t n_clusters) {
  int64_t r = ra_wave_budget_clusters(c->retrieve, n_clusters, c->cluster);
  int64_t floor_r = (c->retrieve_min + c->cluster - 1) / c->cluster;
  if (floor_r > n_clusters) floor_r = n_clusters;
  return r > floor_r ? r : floor_r;
}

struct ra_wave {
  ra_backend *be;
  const ra_offload_plan *plan;
  ra_remote *remote;
  ra_wave_config cfg;
  int n_layers, n_heads, n_kv, hd;
  ra_dtype kv_dtype;
  int64_t cap;                  /* clusters per (layer, kv head) the meta-index holds */
  ra_tensor *centroid, *vsum;   /* [n_layers] x [n_kv, cap, hd] */
  ra_tensor *size;              /* [n_layers] x [n_kv, cap] */
  int64_t *n_clusters;          /* [n_layers] */
  int32_t *sid;                 /* [n_layers, n_kv, cap]: the id at the stores, -1 for an empty cluster */
  uint16_t *owner;              /* [n_layers, n_kv, cap]: the store holding it */
  uint32_t *next_sid;           /* [n_layers, n_kv] */
  /* growth: the evicted rows [blk_p0, blk_p0 + blk_n) of every layer */
  ra_tensor *blk_k, *blk_v;     /* [n_layers] x [block, n_kv, hd] in kv_dtype */
  int64_t blk_p0, blk_n;
  /* clustering scratch (largest piece or block) */
  int32_t *perm, *counts;       /* [n_kv, max rows], [n_kv, max clusters] */
  int64_t max_rows, max_k;
  uint32_t *perm_u;             /* [max rows] */
  ra_tensor out_k, out_v;       /* [n_kv, max rows, hd] (prefill): the cache's rows permuted, in
                                 * the stores' dtype when it is 16-bit (they leave the device as
                                 * the stores keep them), else in kv_dtype, widened on download */
  /* selection */
  int32_t *idx;                 /* [n_kv, cap] */
  ra_tensor est_o, est_ml;      /* [n_heads, hd], [n_heads, 2] */
  ra_remote_wave_sel *sel;      /* [n_stores] */
  uint32_t *sel_heads, *sel_counts, *sel_ids; /* [n_stores, n_kv], [n_stores, n_kv], [n_stores, n_kv * cap] */
  size_t *sel_fill;             /* [2, n_stores]: ids listed per store, and where kv head g's began */
  uint32_t *rows;               /* [n_layers, n_kv, cap]: rows of each cluster */
  /* the device buffer (NULL: off) and its admissions: per (layer, store), the misses of the
   * layer's last step to fetch, in FetchClusters' shape, and the fetch in flight */
  ra_wave_buffer *buf;
  struct wave_adm *adm;         /* [n_layers, n_stores] */
  int64_t adm_max;              /* misses admitted per (layer, kv head) and step at most */
  float *adm_k, *adm_v;         /* host fp32 scratch for one fetched cluster's rows */
  int64_t adm_cap;
  ra_wave_buffer_stats bstats;
  /* retro (retro_w > 0): what each recent step has seen, and per store the clusters to
   * supplement per past step j (1-based) and kv head of its selection: counts [ns, W, n_kv]
   * and ids [ns, W, rt_max] while a selection is built, then compacted in place to the request's
   * [n_past, n_heads] and past-step-major ids */
  uint32_t retro_w;
  ra_wave_retro *retro;
  uint32_t *rt_counts, *rt_ids;
  size_t *rt_fill;              /* [ns, W] */
  int64_t rt_max;               /* ids per (store, past step) at most: n_kv x a full retrieval zone */
  int32_t *rt_ret, *rt_miss;    /* [cap]: one kv head's retrieved clusters, and those a past step missed */
  int begun;
};

typedef struct wave_adm {
  uint32_t *heads, *counts, *ids; /* [n_kv], [n_kv], [n_kv, adm_max]: store ids */
  int32_t *cs;                    /* [n_kv, adm_max]: the meta-index's clusters of ids */
  size_t n_heads, n_ids;
  ra_kvclient_fetch *fetch;
} wave_adm;

static size_t at(const ra_wave *w, int l, int g, int64_t c) {
  return ((size_t)l * (size_t)w->n_kv + (size_t)g) * (size_t)w->cap + (size_t)c;
}

void ra_wave_puts_free(ra_wave_puts *p) {
  free(p->c);
  free(p->counts);
  *p = (ra_wave_puts){0};
}

/* What ra_wave_begin allocates. */
static void meta_free(ra_wave *w) {
  for (size_t i = 0; w->adm && i < (size_t)w->n_layers * w->plan->n_stores; i++) {
    ra_kvclient_fetch_free(w->adm[i].fetch);
    free(w->adm[i].heads);
  }
  free(w->adm);
  w->adm = NULL;
  ra_wave_buffer_free(w->buf);
  w->buf = NULL;
  free(w->adm_k);
  free(w->adm_v);
  free(w->rows);
  ra_wave_retro_free(w->retro);
  w->retro = NULL;
  free(w->rt_counts);
  free(w->rt_ids);
  free(w->rt_fill);
  free(w->rt_ret);
  w->rt_counts = w->rt_ids = NULL;
  w->rt_fill = NULL;
  w->rt_ret = w->rt_miss = NULL;
  w->adm_k = w->adm_v = NULL;
  w->rows = NULL;
  for (int l = 0; w->centroid && l < w->n_layers; l++) {
    ra_tensor_free(&w->centroid[l]);
    ra_tensor_free(&w->vsum[l]);
    ra_tensor_free(&w->size[l]);
    ra_tensor_free(&w->blk_k[l]);
    ra_tensor_free(&w->blk_v[l]);
  }
  free(w->sid);
  free(w->owner);
  free(w->perm);
  free(w->counts);
  free(w->perm_u);
  ra_tensor_free(&w->out_k);
  ra_tensor_free(&w->out_v);
  free(w->idx);
  free(w->sel_heads);
  free(w->sel_counts);
  free(w->sel_ids);
  w->sid = w->idx = NULL;
  w->owner = NULL;
  w->perm = w->counts = NULL;
  w->perm_u = w->sel_heads = w->sel_counts = w->sel_ids = NULL;
}

void ra_wave_free(ra_wave *w) {
  if (!w) return;
  meta_free(w);
  free(w->centroid);
  free(w->vsum);
  free(w->size);
  free(w->blk_k);
  free(w->blk_v);
  free(w->n_clusters);
  free(w->next_sid);
  ra_tensor_free(&w->est_o);
  ra_tensor_free(&w->est_ml);
  free(w->sel);
  free(w->sel_fill);
  free(w);
}

int ra_wave_new(ra_backend *be, const ra_offload_plan *plan, ra_remote *remote, int n_layers, int n_heads,
                int n_kv_heads, int head_dim, ra_dtype kv_dtype, const ra_wave_config *cfg, uint32_t retro_window,
                ra_wave **out, ra_error *err) {
  *out = NULL;
  int rc = ra_wave_config_check(cfg, err);
  if (rc) return rc;
  if (retro_window && cfg->buffer > 0)
    return ra_errorf(err, RA_EINVAL, "wave: retro takes no device buffer (the clusters it attends would not be "
                     "supplemented to past steps)");
  if (plan->n_stores > UINT16_MAX) return ra_errorf(err, RA_EINVAL, "wave: %zu stores", plan->n_stores);
  ra_wave *w = calloc(1, sizeof *w);
  if (!w) return ra_errorf(err, RA_ENOMEM, "wave: out of memory");
  *w = (ra_wave){.be = be, .plan = plan, .remote = remote, .cfg = *cfg, .n_layers = n_layers, .n_heads = n_heads,
                 .n_kv = n_kv_heads, .hd = head_dim, .kv_dtype = kv_dtype, .retro_w = retro_window};
  w->centroid = calloc((size_t)n_layers, sizeof *w->centroid);
  w->vsum = calloc((size_t)n_layers, sizeof *w->vsum);
  w->size = calloc((size_t)n_layers, sizeof *w->size);
  w->blk_k = calloc((size_t)n_layers, sizeof *w->blk_k);
  w->blk_v = calloc((size_t)n_layers, sizeof *w->blk_v);
  w->n_clusters = calloc((size_t)n_layers, sizeof *w->n_clusters);
  w->next_sid = calloc((size_t)n_layers * (size_t)n_kv_heads, sizeof *w->next_sid);
  w->sel = calloc(plan->n_stores, sizeof *w->sel);
  w->sel_fill = calloc(2 * plan->n_stores, sizeof *w->sel_fill);
  int64_t o_shape[2] = {n_heads, head_dim}, ml_shape[2] = {n_heads, 2};
  if (!w->centroid || !w->vsum || !w->size || !w->blk_k || !w->blk_v || !w->n_clusters || !w->next_sid || !w->sel ||
      !w->sel_fill)
    rc = ra_errorf(err, RA_ENOMEM, "wave: out of memory");
  if (rc == RA_OK) rc = ra_tensor_new(be, &w->est_o, RA_DTYPE_F32, 2, o_shape, err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &w->est_ml, RA_DTYPE_F32, 2, ml_shape, err);
  if (rc) {
    ra_wave_free(w);
    return rc;
  }
  *out = w;
  return RA_OK;
}

/* The first shard boundary of the plan (any layer, kv head) after position p; INT64_MAX: none.
 * Clusters are cut there, so that each lies in one shard of every kv head. */
static int64_t next_cut(const ra_wave *w, int64_t p) {
  int64_t best = INT64_MAX;
  for (size_t s = 0; s < w->plan->n_stores; s++)
    for (size_t j = 0; j < w->plan->stores[s].n_shards; j++) {
      const ra_plan_shard *sh = &w->plan->stores[s].shards[j];
      int64_t b = (int64_t)sh->token_begin, e = sh->token_end == RA_TOKEN_END_OPEN ? INT64_MAX : (int64_t)sh->token_end;
      if (b > p && b < best) best = b;
      if (e > p && e < best) best = e;
    }
  return best;
}

/* The end of the piece starting at p of a run ending at e: the next cut, or e. */
static int64_t piece_end(const ra_wave *w, int64_t p, int64_t e) {
  int64_t c = next_cut(w, p);
  return c < e ? c : e;
}

/* The end of the growth block starting at p0: block rows, or the next cut before. */
static int64_t block_end(const ra_wave *w, int64_t p0) { return piece_end(w, p0, p0 + w->cfg.block); }

/* The device buffer and the admission lists, once the meta-index's capacity is known. Misses
 * per (layer, kv head) and step are at most the retrieval zone of a full meta-index, and are
 * admitted only up to a buffer's rows. */
static int buffer_begin(ra_wave *w, ra_error *err) {
  const ra_wave_config *c = &w->cfg;
  /* the stores' dtype, so that the device attends the rows they would; int8 rows (a store dtype
   * only) are held dequantized in fp32, equal to the values the stores attend over */
  const ra_dtype dt = ra_remote_dtype(w->remote) == RA_DTYPE_I8 ? RA_DTYPE_F32 : ra_remote_dtype(w->remote);
  int rc = ra_wave_buffer_new(w->be, w->n_layers, w->n_heads, w->n_kv, w->hd, dt, w->cap, c->buffer, c->cluster,
                              &w->buf, err);
  if (rc) return rc;
  int64_t a = ra_wave_retrieve_clusters(c, w->cap), rmax = ra_wave_buffer_rows(w->buf);
  w->adm_max = a < rmax ? a : rmax;
  if (w->adm_max < 1) w->adm_max = 1;
  const size_t n = (size_t)w->n_layers * w->plan->n_stores, nkv = (size_t)w->n_kv, m = nkv * (size_t)w->adm_max;
  w->adm = calloc(n, sizeof *w->adm);
  if (!w->adm) return ra_errorf(err, RA_ENOMEM, "wave: out of memory for the buffer's admissions");
  for (size_t i = 0; i < n; i++) {
    wave_adm *a_ = &w->adm[i];
    /* one block: heads, counts, ids, cs */
    a_->heads = malloc((2 * nkv + 2 * m) * sizeof(uint32_t));
    if (!a_->heads) return ra_errorf(err, RA_ENOMEM, "wave: out of memory for the buffer's admissions");
    a_->counts = a_->heads + nkv;
    a_->ids = a_->counts + nkv;
    a_->cs = (int32_t *)(a_->ids + m);
  }
  return RA_OK;
}

/* Retro's records and request lists, once the meta-index's capacity is known. */
static int retro_begin(ra_wave *w, ra_error *err) {
  const size_t ns = w->plan->n_stores, nkv = (size_t)w->n_kv, W = w->retro_w;
  int rc = ra_wave_retro_new(w->n_layers, w->n_kv, w->cap, w->retro_w, &w->retro, err);
  if (rc) return rc;
  w->rt_max = (int64_t)nkv * ra_wave_retrieve_clusters(&w->cfg, w->cap);
  w->rt_counts = malloc(ns * W * nkv * sizeof *w->rt_counts);
  w->rt_ids = malloc((ns * W * (size_t)w->rt_max + 1) * sizeof *w->rt_ids);
  w->rt_fill = malloc(ns * W * sizeof *w->rt_fill);
  w->rt_ret = malloc(2 * (size_t)w->cap * sizeof *w->rt_ret);
  if (!w->rt_counts || !w->rt_ids || !w->rt_fill || !w->rt_ret)
    return ra_errorf(err, RA_ENOMEM, "wave: out of memory for retro's lists");
  w->rt_miss = w->rt_ret + w->cap;
  return RA_OK;
}

int ra_wave_begin(ra_wave *w, int64_t b, int64_t e, int64_t max_end, ra_error *err) {
  if (w->begun) return ra_errorf(err, RA_ESTATE, "wave: the meta-index is set up already");
  const ra_wave_config *c = &w->cfg;
  int64_t cap = 0, max_rows = 0, max_k = 0;
  for (int64_t p = b; p < e;) {
    int64_t q = piece_end(w, p, e), k = ra_wave_n_clusters(q - p, c->segment, c->cluster);
    cap += k;
    if (q - p > max_rows) max_rows = q - p;
    if (k > max_k) max_k = k;
    p = q;
  }
  int64_t prefill_rows = max_rows;
  for (int64_t p = e > b ? e : b; p < max_end;) {
    int64_t q = block_end(w, p);
    if (q > max_end) q = max_end;
    int64_t k = ra_wave_n_clusters(q - p, c->block, c->cluster);
    cap += k;
    if (q - p > max_rows) max_rows = q - p;
    if (k > max_k) max_k = k;
    p = q;
  }
  if (cap < 1) cap = 1;
  if (max_rows < 1) max_rows = 1;
  if (max_k < 1) max_k = 1;
  if (cap > INT32_MAX || max_rows > INT32_MAX)
    return ra_errorf(err, RA_EINVAL, "wave: %lld clusters per kv head", (long long)cap);
  w->cap = cap;
  w->max_rows = max_rows;
  w->max_k = max_k;
  w->blk_p0 = e > b ? e : b;
  w->blk_n = 0;
  const size_t nkv = (size_t)w->n_kv, ns = w->plan->n_stores, tab = (size_t)w->n_layers * nkv * (size_t)cap;
  w->sid = malloc(tab * sizeof *w->sid);
  w->owner = calloc(tab, sizeof *w->owner);
  w->perm = malloc(nkv * (size_t)max_rows * sizeof *w->perm);
  w->perm_u = malloc((size_t)max_rows * sizeof *w->perm_u);
  w->counts = malloc(nkv * (size_t)max_k * sizeof *w->counts);
  w->idx = malloc(nkv * (size_t)cap * sizeof *w->idx);
  w->sel_heads = malloc(ns * nkv * sizeof *w->sel_heads);
  w->sel_counts = malloc(ns * nkv * sizeof *w->sel_counts);
  w->sel_ids = malloc(ns * nkv * (size_t)cap * sizeof *w->sel_ids);
  int rc = RA_OK;
  if (!w->sid || !w->owner || !w->perm || !w->perm_u || !w->counts || !w->idx || !w->sel_heads || !w->sel_counts ||
      !w->sel_ids)
    rc = ra_errorf(err, RA_ENOMEM, "wave: out of memory for a meta-index of %lld clusters", (long long)cap);
  if (rc == RA_OK) memset(w->sid, 0xff, tab * sizeof *w->sid);
  int64_t cs[3] = {w->n_kv, cap, w->hd}, ss[2] = {w->n_kv, cap}, bs[3] = {c->block, w->n_kv, w->hd};
  int64_t os[3] = {w->n_kv, prefill_rows > 0 ? prefill_rows : 1, w->hd};
  for (int l = 0; l < w->n_layers && rc == RA_OK; l++) {
    rc = ra_tensor_new(w->be, &w->centroid[l], RA_DTYPE_F32, 3, cs, err);
    if (rc == RA_OK) rc = ra_tensor_new(w->be, &w->vsum[l], RA_DTYPE_F32, 3, cs, err);
    if (rc == RA_OK) rc = ra_tensor_new(w->be, &w->size[l], RA_DTYPE_F32, 2, ss, err);
    if (rc == RA_OK) rc = ra_tensor_new(w->be, &w->blk_k[l], w->kv_dtype, 3, bs, err);
    if (rc == RA_OK) rc = ra_tensor_new(w->be, &w->blk_v[l], w->kv_dtype, 3, bs, err);
  }
  const ra_dtype odt = ra_wave_rows_dtype(w) == RA_DTYPE_F32 ? w->kv_dtype : ra_wave_rows_dtype(w);
  if (rc == RA_OK && prefill_rows > 0) rc = ra_tensor_new(w->be, &w->out_k, odt, 3, os, err);
  if (rc == RA_OK && prefill_rows > 0) rc = ra_tensor_new(w->be, &w->out_v, odt, 3, os, err);
  w->rows = calloc(tab, sizeof *w->rows);
  if (rc == RA_OK && !w->rows) rc = ra_errorf(err, RA_ENOMEM, "wave: out of memory");
  if (rc == RA_OK && c->buffer > 0) rc = buffer_begin(w, err);
  if (rc == RA_OK && w->retro_w) rc = retro_begin(w, err);
  if (rc == RA_OK) w->begun = 1;
  else meta_free(w);
  return rc;
}

/* After cluster_keys of rows from position p of layer l into clusters [c0, c0 + k) (w->counts
 * [n_kv, k]): kv head g's host tables, and its PutClusters request (no perm) in *req: the
 * nonempty clusters under the next dense store ids, their counts written to counts [<= k]. */
static int install(ra_wave *w, int l, int64_t p, int64_t c0, int64_t k, int g, uint32_t *counts,
                   ra_kvclient_clusters *req, ra_error *err) {
  int owner = ra_offload_plan_owner(w->plan, (uint32_t)l, (uint32_t)g, (uint64_t)p);
  if (owner < 0)
    return ra_errorf(err, RA_EINTERNAL, "wave: position %lld of layer %d kv head %d has no owner", (long long)p, l, g);
  uint32_t *next = &w->next_sid[(size_t)l * (size_t)w->n_kv + (size_t)g];
  size_t m = 0;
  for (int64_t j = 0; j < k; j++) {
    int32_t cnt = w->counts[(size_t)g * (size_t)k + (size_t)j];
    size_t a = at(w, l, g, c0 + j);
    w->owner[a] = (uint16_t)owner;
    if (cnt <= 0) continue;
    w->rows[a] = (uint32_t)cnt;
    w->sid[a] = (int32_t)(*next + m);
    counts[m++] = (uint32_t)cnt;
  }
  *req = (ra_kvclient_clusters){.layer = (uint32_t)l, .kv_head = (uint32_t)g, .first_cluster = *next,
                                .row_begin = (uint64_t)p, .counts = counts, .n_clusters = m};
  *next += (uint32_t)m;
  return RA_OK;
}

ra_dtype ra_wave_rows_dtype(const ra_wave *w) {
  const ra_dtype dt = ra_remote_dtype(w->remote);
  return dt == RA_DTYPE_F16 || dt == RA_DTYPE_BF16 ? dt : RA_DTYPE_F32;
}

/* n elements of the permuted rows t from offset off to host dst in ra_wave_rows_dtype: as they
 * are when t holds that dtype, else widened to fp32. */
static int rows_download(ra_wave *w, const ra_tensor *t, size_t off, void *dst, size_t n, ra_error *err) {
  ra_backend *be = w->be;
  return t->dtype == ra_wave_rows_dtype(w) ? be->ops->download_raw(be, t, off, dst, n, err)
                                           : be->ops->download(be, t, off, dst, n, err);
}

int ra_wave_prefill_layer(ra_wave *w, int l, const ra_tensor *kc, const ra_tensor *vc, int64_t b, int64_t e, void *k,
                          void *v, ra_wave_puts *puts, double *download_us, ra_error *err) {
  *puts = (ra_wave_puts){0};
  if (!w->begun) return ra_errorf(err, RA_ESTATE, "wave: prefill before ra_wave_begin");
  if (e <= b) return RA_OK;
  const ra_wave_config *c = &w->cfg;
  ra_backend *be = w->be;
  size_t n_pieces = 0, n_counts = 0;
  for (int64_t p = b; p < e; n_pieces++) {
    int64_t q = piece_end(w, p, e);
    n_counts += (size_t)ra_wave_n_clusters(q - p, c->segment, c->cluster);
    p = q;
  }
  puts->c = calloc(n_pieces * (size_t)w->n_kv, sizeof *puts->c);
  puts->counts = malloc((n_counts ? n_counts : 1) * (size_t)w->n_kv * sizeof *puts->counts);
  if (!puts->c || !puts->counts) {
    ra_wave_puts_free(puts);
    return ra_errorf(err, RA_ENOMEM, "wave: out of memory");
  }
  ra_wave_cluster_params cp = {.seg_len = c->segment, .cluster_size = c->cluster, .iters = c->iters};
  /* host rows: [n_kv, e - b, hd] of es bytes each */
  const size_t hd = (size_t)w->hd, row = (size_t)(e - b) * hd, es = ra_dtype_size(ra_wave_rows_dtype(w));
  uint32_t *cbuf = puts->counts;
  int rc = RA_OK;
  for (int64_t p = b; p < e && rc == RA_OK;) {
    const int64_t q = piece_end(w, p, e), n = q - p, c0 = w->n_clusters[l];
    const int64_t kk = ra_wave_n_clusters(n, c->segment, c->cluster);
    int64_t os[3] = {w->n_kv, n, w->hd};
    ra_tensor ok_ = w->out_k, ov_ = w->out_v; /* views of n rows per head */
    memcpy(ok_.shape, os, sizeof os);
    memcpy(ov_.shape, os, sizeof os);
    ok_.nbytes = ov_.nbytes = (size_t)w->n_kv * (size_t)n * hd * ra_dtype_size(w->out_k.dtype);
    rc = be->ops->cluster_keys(be, kc, vc, p, n, &cp, &w->centroid[l], &w->size[l], &w->vsum[l], c0, &ok_, &ov_,
                               w->perm, w->counts, err);
    for (int g = 0; g < w->n_kv && rc == RA_OK; g++) {
      const size_t at = ((size_t)g * row + (size_t)(p - b) * hd) * es;
      const uint64_t t0 = uv_hrtime();
      rc = rows_download(w, &ok_, (size_t)g * (size_t)n * hd, (char *)k + at, (size_t)n * hd, err);
      if (rc == RA_OK) rc = rows_download(w, &ov_, (size_t)g * (size_t)n * hd, (char *)v + at, (size_t)n * hd, err);
      *download_us += (double)(uv_hrtime() - t0) / 1e3;
      if (rc == RA_OK) rc = install(w, l, p, c0, kk, g, cbuf, &puts->c[puts->n], err);
      if (rc == RA_OK) {
        cbuf += puts->c[puts->n].n_clusters;
        puts->n++;
      }
    }
    if (rc == RA_OK) w->n_clusters[l] = c0 + kk;
    p = q;
  }
  if (rc) ra_wave_puts_free(puts);
  return rc;
}

/* The rows of layer l's fetches (ra_wave_admit of an earlier step) into the buffer. */
static int admit_finish(ra_wave *w, int l, ra_error *err) {
  const size_t ns = w->plan->n_stores, hd = (size_t)w->hd;
  const ra_dtype dt = ra_remote_dtype(w->remote);
  const size_t rb = ra_dtype_row_bytes(dt, hd);
  uint64_t t0 = uv_hrtime();
  int rc = RA_OK;
  for (size_t s = 0; s < ns; s++) {
    wave_adm *a = &w->adm[(size_t)l * ns + s];
    if (!a->fetch) continue;
    ra_kvclient_cluster_rows got;
    if (rc == RA_OK) rc = ra_remote_fetch_clusters_wait(w->remote, a->fetch, &got, err);
    size_t j = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < a->n_heads && rc == RA_OK; i++) {
      const int g = (int)a->heads[i];
      for (uint32_t k = 0; k < a->counts[i] && rc == RA_OK; k++, j++) {
        const int64_t c = a->cs[j], n = got.rows[j];
        if ((uint32_t)n != w->rows[at(w, l, g, c)]) {
          rc = ra_errorf(err, RA_EFORMAT, "wave: the store sent %lld rows of cluster %u (layer %d kv head %d), "
                         "its size is %u", (long long)n, a->ids[j], l, g, w->rows[at(w, l, g, c)]);
          break;
        }
        if (n > w->adm_cap) {
          float *nk = realloc(w->adm_k, (size_t)n * hd * sizeof *nk);
          if (nk) w->adm_k = nk;
          float *nv = realloc(w->adm_v, (size_t)n * hd * sizeof *nv);
          if (nv) w->adm_v = nv;
          if (!nk || !nv) {
            rc = ra_errorf(err, RA_ENOMEM, "wave: out of memory for a cluster of %lld rows", (long long)n);
            break;
          }
          w->adm_cap = n;
        }
        ra_dtype_rows_to_fp32(dt, (const uint8_t *)got.keys + off * rb, w->adm_k, (size_t)n, hd);
        ra_dtype_rows_to_fp32(dt, (const uint8_t *)got.values + off * rb, w->adm_v, (size_t)n, hd);
        rc = ra_wave_buffer_install(w->buf, l, g, c, w->adm_k, w->adm_v, n, err);
        off += (uint64_t)n;
        w->bstats.fetched++;
        w->bstats.fetched_rows += (uint64_t)n;
      }
    }
    ra_kvclient_fetch_free(a->fetch);
    a->fetch = NULL;
  }
  if (rc == RA_OK) rc = ra_wave_buffer_commit(w->buf, err);
  else ra_wave_buffer_discard(w->buf);
  w->bstats.fetch_us += (double)(uv_hrtime() - t0) / 1e3;
  return rc;
}

int ra_wave_admit(ra_wave *w, int l, ra_error *err) {
  if (!w->buf) return RA_OK;
  const size_t ns = w->plan->n_stores;
  int rc = RA_OK;
  for (size_t s = 0; s < ns && rc == RA_OK; s++) {
    wave_adm *a = &w->adm[(size_t)l * ns + s];
    if (!a->n_ids) continue;
    ra_remote_wave_sel sel = {.kv_heads = a->heads, .counts = a->counts, .clusters = a->ids, .n_heads = a->n_heads};
    rc = ra_remote_fetch_clusters_start(w->remote, s, (uint32_t)l, &sel, &a->fetch, err);
  }
  return rc;
}

int ra_wave_attend_buffer(ra_wave *w, int l, const ra_tensor *q, float scale, const ra_tensor **o,
                          const ra_tensor **ml, ra_error *err) {
  *o = *ml = NULL;
  if (!w->buf) return RA_OK;
  uint64_t rows = 0;
  int rc = ra_wave_buffer_attend(w->buf, l, q, scale, o, ml, &rows, err);
  w->bstats.rows += rows;
  return rc;
}

void ra_wave_buffer_totals(const ra_wave *w, ra_wave_buffer_stats *out) { *out = w->bstats; }

/* A retrieved cluster of (l, g) the buffer does not hold: to be fetched after the step when it
 * fits the step's admission (a buffer's rows per kv head, adm_max clusters). *adm_rows: the
 * rows admitted for (l, g) so far this step. */
static void admit_queue(ra_wave *w, int l, int g, int32_t cl, size_t s, int64_t *adm_rows) {
  wave_adm *a = &w->adm[(size_t)l * w->plan->n_stores + s];
  const size_t a_ = at(w, l, g, cl);
  const int64_t n = w->rows[a_], room = ra_wave_buffer_rows(w->buf);
  if (*adm_rows + n > room) return;
  if (!a->n_heads || a->heads[a->n_heads - 1] != (uint32_t)g) {
    a->heads[a->n_heads] = (uint32_t)g;
    a->counts[a->n_heads++] = 0;
  }
  if (a->counts[a->n_heads - 1] >= (uint32_t)w->adm_max) return;
  a->ids[a->n_ids] = (uint32_t)w->sid[a_];
  a->cs[a->n_ids++] = cl;
  a->counts[a->n_heads - 1]++;
  *adm_rows += n;
}

/* Retro, kv head g of layer l at decode step `step`, after its retrieved clusters rt_ret [n_ret]
 * went into the stores' selections: for each past step j, the ones it has not seen go into
 * their store's list of j (whose selection names g last); then the step's zones are recorded
 * (zones [r + e] from wave_select; ids past n_clusters none). */
static void retro_select_head(ra_wave *w, int l, int g, uint64_t step, uint32_t n_past, int64_t nc, size_t n_ret,
                              const int32_t *zones, size_t n_zones) {
  const size_t nkv = (size_t)w->n_kv, W = w->retro_w;
  for (uint32_t j = 1; j <= n_past; j++) {
    size_t m = ra_wave_retro_missing(w->retro, l, g, step - j, w->rt_ret, n_ret, w->rt_miss);
    for (size_t i = 0; i < m; i++) {
      const size_t a = at(w, l, g, w->rt_miss[i]), s = w->owner[a], sj = s * W + (j - 1);
      w->rt_ids[sj * (size_t)w->rt_max + w->rt_fill[sj]++] = (uint32_t)w->sid[a];
      w->rt_counts[sj * nkv + w->sel[s].n_heads - 1]++;
    }
  }
  ra_wave_retro_record(w->retro, l, g, step, nc, zones, n_zones);
}

/* Retro: each store's past-step lists compacted into its selection's request shape. */
static void retro_select_finish(ra_wave *w, uint32_t n_past) {
  const size_t ns = w->plan->n_stores, nkv = (size_t)w->n_kv, W = w->retro_w;
  for (size_t s = 0; s < ns; s++) {
    ra_remote_wave_sel *x = &w->sel[s];
    uint32_t *cnt = w->rt_counts + s * W * nkv, *ids = w->rt_ids + s * W * (size_t)w->rt_max;
    size_t off = 0;
    for (size_t j = 0; j < n_past; j++) {
      for (size_t i = 0; i < x->n_heads; i++) cnt[j * x->n_heads + i] = cnt[j * nkv + i];
      const size_t n = w->rt_fill[s * W + j];
      memmove(ids + off, ids + j * (size_t)w->rt_max, n * sizeof *ids);
      off += n;
    }
    x->retro_counts = cnt;
    x->retro_clusters = ids;
  }
}

/* A selection's first half, before the ranking: the buffer's admissions of layer l's last step
 * installed, the selection emptied, the zones' sizes. *it: the ranking's arguments; *run = 0
 * when no zone holds a cluster (nothing to rank: the selection stays empty). */
static int select_begin(ra_wave *w, int l, const ra_tensor *q, uint64_t step, uint32_t n_past,
                        ra_wave_select_item *it, int *run, ra_error *err) {
  const size_t ns = w->plan->n_stores;
  *run = 0;
  if (w->buf) {
    int rc = admit_finish(w, l, err);
    if (rc) return rc;
    for (size_t s = 0; s < ns; s++) w->adm[(size_t)l * ns + s].n_heads = w->adm[(size_t)l * ns + s].n_ids = 0;
  }
  const int64_t nc = w->begun ? w->n_clusters[l] : 0;
  const int64_t r = ra_wave_retrieve_clusters(&w->cfg, nc);
  int64_t e = ra_wave_budget_clusters(w->cfg.estimate, nc, w->cfg.cluster);
  if (e > nc - r) e = nc - r;
  for (size_t s = 0; s < ns; s++) w->sel[s] = (ra_remote_wave_sel){0};
  if (w->retro && (step == 0 || n_past > w->retro_w || n_past >= step))
    return ra_errorf(err, RA_EINVAL, "wave: retro step %llu with %u past steps (window %u)", (unsigned long long)step,
                     n_past, w->retro_w);
  if (r + e < 1) {
    for (int g = 0; w->retro && g < w->n_kv; g++) ra_wave_retro_record(w->retro, l, g, step, nc, NULL, 0);
    return RA_OK;
  }
  *it = (ra_wave_select_item){q, &w->centroid[l], &w->size[l], nc, (int)r, (int)e, w->idx,
                              e ? &w->vsum[l] : NULL, e ? &w->est_o : NULL, e ? &w->est_ml : NULL};
  *run = 1;
  return RA_OK;
}

/* The second half, once the ranking `it` is in w->idx: per kv head, each store's retrieved ids,
 * appended to its list in kv head order (the buffer's hits left out and its misses queued for
 * admission; retro's past-step lists). */
static void select_end(ra_wave *w, int l, const ra_wave_select_item *it, uint64_t step, uint32_t n_past) {
  const size_t ns = w->plan->n_stores, nkv = (size_t)w->n_kv;
  const int64_t nc = it->n_clusters, r = it->r, e = it->e;
  const int retro = w->retro != NULL;
  size_t *fill = w->sel_fill, *start = w->sel_fill + ns;
  memset(fill, 0, ns * sizeof *fill);
  if (retro) {
    memset(w->rt_counts, 0, ns * w->retro_w * nkv * sizeof *w->rt_counts);
    memset(w->rt_fill, 0, ns * w->retro_w * sizeof *w->rt_fill);
  }
  for (size_t g = 0; g < nkv; g++) {
    memcpy(start, fill, ns * sizeof *fill);
    int64_t adm_rows = 0;
    size_t n_ret = 0;
    for (int64_t j = 0; j < r; j++) {
      int32_t cl = w->idx[g * (size_t)(r + e) + (size_t)j];
      if (cl < 0) continue;
      size_t a = at(w, l, (int)g, cl);
      if (w->sid[a] < 0) continue;
      if (retro) w->rt_ret[n_ret++] = cl;
      if (w->buf && ra_wave_buffer_hit(w->buf, l, (int)g, cl)) {
        w->bstats.hits++;
        continue;
      }
      size_t s = w->owner[a];
      w->sel_ids[s * nkv * (size_t)w->cap + fill[s]++] = (uint32_t)w->sid[a];
      if (w->buf) {
        w->bstats.misses++;
        admit_queue(w, l, (int)g, cl, s, &adm_rows);
      }
    }
    for (size_t s = 0; s < ns; s++) {
      if (fill[s] == start[s]) continue;
      ra_remote_wave_sel *x = &w->sel[s];
      w->sel_heads[s * nkv + x->n_heads] = (uint32_t)g;
      w->sel_counts[s * nkv + x->n_heads] = (uint32_t)(fill[s] - start[s]);
      x->n_heads++;
    }
    if (retro)
      retro_select_head(w, l, (int)g, step, n_past, nc, n_ret, w->idx + g * (size_t)(r + e), (size_t)(r + e));
  }
  if (n_past) retro_select_finish(w, n_past);
  for (size_t s = 0; s < ns; s++) {
    w->sel[s].kv_heads = w->sel_heads + s * nkv;
    w->sel[s].counts = w->sel_counts + s * nkv;
    w->sel[s].clusters = w->sel_ids + s * nkv * (size_t)w->cap;
  }
}

static void select_outputs(ra_wave *w, const ra_wave_select_item *it, int run, ra_wave_selection *out) {
  out->sel = w->sel;
  out->est_o = run && it->e ? &w->est_o : NULL;
  out->est_ml = run && it->e ? &w->est_ml : NULL;
}

int ra_wave_select(ra_wave *w, int l, const ra_tensor *q, float scale, uint64_t step, uint32_t n_past,
                   const ra_remote_wave_sel **sel, const ra_tensor **est_o, const ra_tensor **est_ml, ra_error *err) {
  if (!w->retro) step = 0, n_past = 0;
  ra_wave_select_item it;
  int run;
  ra_wave_selection out;
  int rc = select_begin(w, l, q, step, n_past, &it, &run, err);
  if (rc == RA_OK && run)
    rc = w->be->ops->wave_select(w->be, it.q, it.centroid, it.size, it.n_clusters, scale, it.r, it.e, it.idx, it.vsum,
                                 it.o, it.ml, err);
  if (rc) return rc;
  if (run) select_end(w, l, &it, step, n_past);
  select_outputs(w, &it, run, &out);
  *sel = out.sel;
  *est_o = out.est_o;
  *est_ml = out.est_ml;
  return RA_OK;
}

int ra_wave_select_batch(ra_wave *const *ws, const ra_tensor *const *qs, int n, int l, float scale,
                         ra_wave_selection *out, ra_error *err) {
  enum { MAX = 256 };
  if (n < 1 || n > MAX) return ra_errorf(err, RA_EINVAL, "wave: a batch selection of %d sequences (1 to %d)", n, MAX);
  ra_wave_select_item items[MAX];
  int run[MAX], n_run = 0;
  for (int i = 0; i < n; i++) {
    if (ws[i]->retro) return ra_errorf(err, RA_EINVAL, "wave: sequence %d: a batch selection takes no retro", i);
    if (ws[i]->be != ws[0]->be) return ra_errorf(err, RA_EINVAL, "wave: sequence %d is on another backend", i);
  }
  for (int i = 0; i < n; i++) {
    int rc = select_begin(ws[i], l, qs[i], 0, 0, &items[n_run], &run[i], err);
    if (rc) {
      ra_error_wrap(err, "sequence %d", i);
      return rc;
    }
    n_run += run[i];
  }
  if (n_run) {
    int rc = ws[0]->be->ops->wave_select_batch(ws[0]->be, items, n_run, scale, err);
    if (rc) return rc;
  }
  for (int i = 0, j = 0; i < n; i++) {
    if (run[i]) select_end(ws[i], l, &items[j], 0, 0);
    select_outputs(ws[i], &items[j], run[i], &out[i]);
    j += run[i];
  }
  return RA_OK;
}

/* Clusters the growth block of every layer and installs the clusters at the stores. */
static int block_flush(ra_wave *w, ra_error *err) {
  const ra_wave_config *c = &w->cfg;
  ra_backend *be = w->be;
  const int64_t n = w->blk_n, p0 = w->blk_p0, k = ra_wave_n_clusters(n, c->block, c->cluster);
  ra_wave_cluster_params cp = {.seg_len = c->block, .cluster_size = c->cluster, .iters = c->iters};
  uint32_t *counts = malloc((size_t)(k ? k : 1) * sizeof *counts);
  int rc = counts ? RA_OK : ra_errorf(err, RA_ENOMEM, "wave: out of memory");
  for (int l = 0; l < w->n_layers && rc == RA_OK; l++) {
    const int64_t c0 = w->n_clusters[l];
    rc = be->ops->cluster_keys(be, &w->blk_k[l], &w->blk_v[l], 0, n, &cp, &w->centroid[l], &w->size[l], &w->vsum[l],
                               c0, NULL, NULL, w->perm, w->counts, err);
    if (rc == RA_OK) w->n_clusters[l] = c0 + k;
    for (int g = 0; g < w->n_kv && rc == RA_OK; g++) {
      ra_kvclient_clusters req;
      rc = install(w, l, p0, c0, k, g, counts, &req, err);
      for (int64_t i = 0; i < n; i++) w->perm_u[i] = (uint32_t)w->perm[(size_t)g * (size_t)n + (size_t)i];
      req.perm = w->perm_u;
      if (rc == RA_OK) rc = ra_remote_put_clusters(w->remote, &req, 1, err);
    }
  }
  free(counts);
  w->blk_p0 = p0 + n;
  w->blk_n = 0;
  return rc;
}

int ra_wave_evict(ra_wave *w, int64_t pos, const ra_tensor *k_caches, const ra_tensor *v_caches, int64_t row,
                  ra_error *err) {
  if (!w->begun) return ra_errorf(err, RA_ESTATE, "wave: decode before ra_wave_begin");
  if (pos != w->blk_p0 + w->blk_n)
    return ra_errorf(err, RA_EINTERNAL, "wave: evicted position %lld, the block expects %lld", (long long)pos,
                     (long long)(w->blk_p0 + w->blk_n));
  ra_backend *be = w->be;
  const size_t kv_row = (size_t)w->n_kv * (size_t)w->hd;
  int rc = RA_OK;
  for (int l = 0; l < w->n_layers && rc == RA_OK; l++) {
    rc = be->ops->copy(be, &w->blk_k[l], (size_t)w->blk_n * kv_row, &k_caches[l], (size_t)row * kv_row, kv_row, err);
    if (rc == RA_OK)
      rc = be->ops->copy(be, &w->blk_v[l], (size_t)w->blk_n * kv_row, &v_caches[l], (size_t)row * kv_row, kv_row, err);
  }
  if (rc) return rc;
  w->blk_n++;
  if (w->blk_p0 + w->blk_n < block_end(w, w->blk_p0)) return RA_OK;
  return block_flush(w, err);
}

int64_t ra_wave_n_clusters_of(const ra_wave *w, int l) { return w->begun ? w->n_clusters[l] : 0; }

int64_t ra_wave_block_rows(const ra_wave *w) { return w->blk_n; }
