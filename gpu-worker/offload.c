#include "offload_internal.h"

#include <stdlib.h>
#include <string.h>

/* build_queries 4096: fewer sampled prefill queries left roar scanning more for the same recall
 * (bench/results/defaults/README.md). The GPU's score block is build_queries x offloaded keys
 * fp32: 2 GiB at 128K keys. */
void ra_offload_config_default(ra_offload_config *c) {
  *c = (ra_offload_config){.mode = RA_MODE_ROAR, .n_sink = 128, .n_window = 512, .top_k = 100,
                           .knn_nq = 100, .build_queries = 4096, .key_top_queries = 4, .build_layers = 3, .select_group = 4, .kv_dtype = RA_DTYPE_F32,
                           .store_dtype = RA_DTYPE_F16, .max_ctx = 8192, .max_prompt = 8192,
                           .timeout_ms = 10000};
  ra_wave_config_default(&c->wave);
}

/* A host buffer of at least n bytes: a pooled one when one is large enough, else a new one
 * from the backend's host_alloc (pinned on CUDA: a layer's download then runs at DMA speed,
 * bench/results/h200/decode-wave/). */
static void *kv_buf_take(ra_offload *o, size_t n) {
  void *p = NULL;
  uv_mutex_lock(&o->kv_pool_lock);
  for (int i = 0; i < RA_OFFLOAD_KV_POOL && !p; i++)
    if (o->kv_pool_cap[i] >= n) {
      p = o->kv_pool[i];
      o->kv_pool[i] = NULL;
      o->kv_pool_cap[i] = 0;
    }
  uv_mutex_unlock(&o->kv_pool_lock);
  if (p) return p;
  ra_backend *be = o->m->be;
  ra_error err;
  void *q = NULL;
  return be->ops->host_alloc(be, n, &q, &err) == RA_OK ? q : NULL;
}

/* Returns a buffer of n bytes from kv_buf_take to the pool (or frees it when the pool is full). */
static void kv_buf_give(ra_offload *o, void *p, size_t n) {
  if (!p) return;
  uv_mutex_lock(&o->kv_pool_lock);
  for (int i = 0; i < RA_OFFLOAD_KV_POOL && p; i++)
    if (o->kv_pool_cap[i] == 0) {
      o->kv_pool[i] = p;
      o->kv_pool_cap[i] = n;
      p = NULL;
    }
  uv_mutex_unlock(&o->kv_pool_lock);
  o->m->be->ops->host_free(o->m->be, p);
}

static int prefill_finish(ra_offload *o, int rc, ra_offload_stats *stats, ra_error *err);

/* Bytes of n offloaded positions' K (or V) rows on the host, as a layer job holds them. */
static size_t kv_rows_bytes(const ra_offload *o, int64_t n) {
  const size_t es = o->wave ? ra_dtype_size(ra_wave_rows_dtype(o->wave)) : sizeof(float);
  return (size_t)n * o->kv_row * es;
}

void ra_offload_free(ra_offload *o) {
  if (!o) return;
  if (o->pf.active) {
    ra_error ignored;
    ra_errorf(&ignored, RA_ECANCELED, "offload: freed during its prefill");
    (void)prefill_finish(o, RA_ECANCELED, NULL, &ignored);
  }
  for (int i = 0; i < RA_OFFLOAD_KV_POOL; i++) o->m->be->ops->host_free(o->m->be, o->kv_pool[i]);
  uv_mutex_destroy(&o->kv_pool_lock);
  ra_wave_free(o->wave);
  ra_remote_close(o->remote);
  ra_tensor_free(&o->scratch_k);
  ra_tensor_free(&o->scratch_v);
  ra_tensor_free(&o->rem_o);
  ra_tensor_free(&o->rem_ml);
  ra_tensor_free(&o->q_pick);
  free(o->q_pick_rows);
  ra_state_free(o->st);
  free(o->q_host);
  free(o->o_host);
  free(o->ml_host);
  free(o->evict_k);
  ra_tensor_free(&o->evict_dev);
  free(o->retro_tok);
  free(o->retro_q);
  free(o->retro_o);
  free(o->retro_ml);
  free(o->rq);
  free(o->ro);
  free(o->rml);
  free(o->ratt);
  free(o->steps);
  free(o);
}

int ra_offload_new(const ra_model *m, const ra_offload_plan *plan, const ra_offload_config *cfg,
                   ra_offload **out, ra_error *err) {
  *out = NULL;
  const ra_model_config *c = &m->cfg;
  if (cfg->mode == RA_MODE_FULL) return ra_errorf(err, RA_EINVAL, "offload: full attention is not an offload mode");
  int rc = cfg->mode == RA_MODE_WAVE ? ra_wave_config_check(&cfg->wave, err) : RA_OK;
  if (rc) return rc;
  if (cfg->n_window < 1) return ra_errorf(err, RA_EINVAL, "offload: the window must hold at least 1 token");
  if (ra_mode_uses_stores(cfg->mode) && !plan)
    return ra_errorf(err, RA_EINVAL, "offload: mode %s needs kv-stores", ra_mode_name(cfg->mode));
  if (plan && (plan->n_layers != (uint32_t)c->n_layers || plan->n_q_heads != (uint32_t)c->n_heads ||
               plan->n_kv_heads != (uint32_t)c->n_kv_heads || plan->n_sink != cfg->n_sink ||
               plan->n_window != cfg->n_window))
    return ra_errorf(err, RA_EINVAL, "offload: the shard plan's geometry (%u layers, %u/%u heads, sink %u, window %u) "
                     "is not the model's (%d layers, %d/%d heads, sink %u, window %u)",
                     plan->n_layers, plan->n_q_heads, plan->n_kv_heads, plan->n_sink, plan->n_window, c->n_layers,
                     c->n_heads, c->n_kv_heads, cfg->n_sink, cfg->n_window);
  if (cfg->mode == RA_MODE_WAVE && plan && plan->max_owners > 1)
    return ra_errorf(err, RA_EINVAL, "offload: wave mode takes no replicas (its cluster ids are per store)");
  if (ra_mode_has_index(cfg->mode) && (cfg->knn_nq < 2 || cfg->build_queries < 1))
    return ra_errorf(err, RA_EINVAL, "offload: index build needs knn_nq >= 2 and build_queries >= 1");
  if (cfg->select_group < 1 || cfg->select_group > RA_OFFLOAD_MAX_BATCH)
    return ra_errorf(err, RA_EINVAL, "offload: select_group %u (1 to %d)", cfg->select_group, RA_OFFLOAD_MAX_BATCH);
  if (cfg->build_layers < 1 || cfg->build_layers > RA_OFFLOAD_MAX_BUILD_LAYERS)
    return ra_errorf(err, RA_EINVAL, "offload: build_layers %u (1 to %d)", cfg->build_layers,
                     RA_OFFLOAD_MAX_BUILD_LAYERS);
  if (cfg->synthetic_chunk < 0)
    return ra_errorf(err, RA_EINVAL, "offload: synthetic prefill chunk %lld", (long long)cfg->synthetic_chunk);
  if (cfg->key_top_queries > RA_KVCLIENT_KEY_TOP_MAX)
    return ra_errorf(err, RA_EINVAL, "offload: key_top_queries %u (at most %d)", cfg->key_top_queries,
                     RA_KVCLIENT_KEY_TOP_MAX);
  if (cfg->retro_window && !ra_mode_takes_retro(cfg->mode))
    return ra_errorf(err, RA_EINVAL, "offload: mode %s has no retrieval for retro to correct", ra_mode_name(cfg->mode));
  if (cfg->retro_window > RA_OFFLOAD_MAX_RETRO || (cfg->retro_window && cfg->retro_window >= cfg->n_window))
    return ra_errorf(err, RA_EINVAL, "offload: retro window %u (at most %d, and below the window %u: the corrected "
                     "tokens' K/V must still be on the device)", cfg->retro_window, RA_OFFLOAD_MAX_RETRO, cfg->n_window);
  ra_offload *o = calloc(1, sizeof *o);
  if (!o) return ra_errorf(err, RA_ENOMEM, "offload: out of memory");
  if (uv_mutex_init(&o->kv_pool_lock) != 0) {
    free(o);
    return ra_errorf(err, RA_ENOMEM, "offload: cannot create a mutex");
  }
  o->m = m;
  o->plan = plan;
  o->cfg = *cfg;
  o->kv_row = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  int64_t rows = ring_rows(o) < cfg->max_ctx ? ring_rows(o) : cfg->max_ctx;
  int64_t max_prompt = cfg->max_prompt < cfg->max_ctx ? cfg->max_prompt : cfg->max_ctx;
  /* The model's prefill is one step of the whole prompt (layer by layer); a synthetic one runs
   * chunks, so its activations need only a chunk's rows. */
  int64_t max_step = cfg->synthetic_chunk > 0 && cfg->synthetic_chunk < max_prompt ? cfg->synthetic_chunk : max_prompt;
  /* retro: a decode step runs the W corrected tokens through the layers with the new one */
  if (max_step < (int64_t)cfg->retro_window + 1) max_step = (int64_t)cfg->retro_window + 1;
  /* decode-sized: a prefill grows the activations to max_step rows for its own time only, so
   * that a server's admitted sequences do not each hold a prompt's worth */
  int64_t dec_rows = (int64_t)cfg->retro_window + 1;
  if (dec_rows > max_step) dec_rows = max_step;
  rc = ra_state_new_ring(m, cfg->max_ctx, dec_rows, rows, cfg->kv_dtype, &o->st, err);
  o->prefill_rows = max_step;
  o->prefill_ffn = max_step < RA_FFN_ROWS ? max_step : RA_FFN_ROWS;
  int64_t scratch_shape[3] = {max_prompt, c->n_kv_heads, c->head_dim};
  int64_t o_shape[2] = {c->n_heads, c->head_dim}, ml_shape[2] = {c->n_heads, 2};
  if (rc == RA_OK) rc = ra_tensor_new(m->be, &o->scratch_k, cfg->kv_dtype, 3, scratch_shape, err);
  if (rc == RA_OK) rc = ra_tensor_new(m->be, &o->scratch_v, cfg->kv_dtype, 3, scratch_shape, err);
  if (rc == RA_OK) rc = ra_tensor_new(m->be, &o->rem_o, RA_DTYPE_F32, 2, o_shape, err);
  if (rc == RA_OK) rc = ra_tensor_new(m->be, &o->rem_ml, RA_DTYPE_F32, 2, ml_shape, err);
  if (rc == RA_OK && cfg->mode == RA_MODE_ROAR) {
    int64_t n_q = (int64_t)cfg->build_queries < max_prompt ? (int64_t)cfg->build_queries : max_prompt;
    int64_t pick_shape[2] = {n_q, (int64_t)c->n_heads * c->head_dim};
    rc = ra_tensor_new(m->be, &o->q_pick, RA_DTYPE_F32, 2, pick_shape, err);
    o->q_pick_rows = malloc((size_t)n_q * sizeof(int32_t));
    if (rc == RA_OK && !o->q_pick_rows) rc = ra_errorf(err, RA_ENOMEM, "offload: out of memory");
  }
  if (rc == RA_OK) {
    size_t hq = (size_t)c->n_heads * (size_t)c->head_dim, ev = (size_t)c->n_layers * o->kv_row;
    o->q_host = malloc(hq * sizeof(float));
    o->o_host = malloc(hq * sizeof(float));
    o->ml_host = malloc((size_t)c->n_heads * 2 * sizeof(float));
    o->evict_k = malloc(2 * ev * sizeof(float));
    o->evict_v = o->evict_k ? o->evict_k + ev : NULL;
    if (!o->q_host || !o->o_host || !o->ml_host || !o->evict_k)
      rc = ra_errorf(err, RA_ENOMEM, "offload: out of memory");
    int64_t ev_shape[3] = {2, c->n_layers, (int64_t)o->kv_row};
    if (rc == RA_OK) rc = ra_tensor_new(m->be, &o->evict_dev, RA_DTYPE_F32, 3, ev_shape, err);
  }
  if (rc == RA_OK && cfg->retro_window) {
    size_t w = cfg->retro_window, hq = (size_t)c->n_heads * (size_t)c->head_dim, nl = (size_t)c->n_layers;
    o->retro_tok = calloc(w, sizeof *o->retro_tok);
    o->retro_q = calloc(nl * w * hq, sizeof(float));
    o->retro_o = calloc(nl * w * hq, sizeof(float));
    o->retro_ml = calloc(nl * w * (size_t)c->n_heads * 2, sizeof(float));
    o->rq = calloc(w * hq, sizeof(float));
    o->ro = calloc(w * hq, sizeof(float));
    o->rml = calloc(w * (size_t)c->n_heads * 2, sizeof(float));
    o->ratt = calloc(w * hq, sizeof(float));
    if (!o->retro_tok || !o->retro_q || !o->retro_o || !o->retro_ml || !o->rq || !o->ro || !o->rml || !o->ratt)
      rc = ra_errorf(err, RA_ENOMEM, "offload: out of memory for the retro output cache");
  }
  if (rc == RA_OK && plan) {
    ra_remote_config rcfg = {.dtype = cfg->store_dtype, .mode = cfg->mode, .top_k = cfg->top_k,
                             .search = {.ef = cfg->ef, .nprobe = cfg->nprobe}, .timeout_ms = cfg->timeout_ms,
                             .client = cfg->store_client,
                             .roar_per_kv_head = cfg->roar_per_kv_head, .client_name = "gpu-worker",
                             .retro_window = cfg->retro_window, .reconnect_ms = cfg->reconnect_ms,
                             .resume = cfg->resume, .spares = cfg->spares, .n_spares = cfg->n_spares};
    rc = ra_remote_open(plan, (uint32_t)c->head_dim, &rcfg, &o->remote, err);
  }
  if (rc == RA_OK && cfg->mode == RA_MODE_WAVE)
    rc = ra_wave_new(m->be, plan, o->remote, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, cfg->kv_dtype,
                     &cfg->wave, cfg->retro_window, &o->wave, err);
  if (rc != RA_OK) {
    ra_offload_free(o);
    return rc;
  }
  *out = o;
  return RA_OK;
}

ra_state *ra_offload_state(ra_offload *o) { return o->st; }

ra_remote *ra_offload_remote(ra_offload *o) { return o->remote; }

int ra_offload_resume(ra_offload *o, int64_t position, ra_error *err) {
  if (o->wave) return ra_errorf(err, RA_EINVAL, "offload: wave mode cannot resume a saved context");
  if (position < 1 || position >= o->st->n_ctx)
    return ra_errorf(err, RA_EINVAL, "offload: position %lld outside the context of %lld", (long long)position,
                     (long long)o->st->n_ctx);
  o->st->pos = position;
  o->st->n = 0;
  return RA_OK;
}

/* Copies positions [p0, p1) of the layer's scratch cache `src` into its ring `dst` (each
 * contiguous run of ring rows in one copy: at most two per range, where the ring wraps). */
static int ring_fill(ra_offload *o, ra_tensor *dst, const ra_tensor *src, int64_t p0, int64_t p1, ra_error *err) {
  ra_backend *be = o->m->be;
  for (int64_t p = p0; p < p1;) {
    int64_t row = ring_row(o, p), run = p1 - p;
    if (p >= (int64_t)o->cfg.n_sink) {
      int64_t to_wrap = (int64_t)o->cfg.n_sink + o->cfg.n_window - row;
      if (run > to_wrap) run = to_wrap;
    } else if (run > (int64_t)o->cfg.n_sink - p) {
      run = (int64_t)o->cfg.n_sink - p;
    }
    int rc = be->ops->copy(be, dst, (size_t)row * o->kv_row, src, (size_t)p * o->kv_row, (size_t)run * o->kv_row, err);
    if (rc) return rc;
    p += run;
  }
  return RA_OK;
}

/* ---- one layer's offload: a job the prefill hands to its pipe ----
 * The device part (downloading the layer's offloaded K/V, the roar index's kNN on the backend)
 * runs on the prefill's thread; the store part (PutKv to every store at once, then the layer's
 * index builds, all in flight together) runs on the pipe's thread while the device computes the
 * next layer. */
typedef struct layer_job {
  ra_offload *o;
  int layer;
  int64_t b, e;          /* offloaded positions [b, e) */
  const void *k, *v;     /* host [e - b, n_kv_heads, head_dim] fp32; wave: [n_kv_heads, e - b, head_dim]
                          * in ra_wave_rows_dtype, each kv head's rows in its cluster order */
  int own_kv;            /* k, v are the job's (prefill: malloc'ed) or borrowed (seed) */
  ra_wave_puts clusters; /* wave: the layer's PutClusters, sent after its rows */
  /* roar: per q head h, its n_q sampled queries and their top-knn keys among [b, e) */
  float *q;              /* [n_heads, n_q, head_dim] */
  uint64_t *ids;         /* [n_heads, n_q, knn] */
  int64_t n_q;
  int knn;               /* 0: no index, or too few keys to be worth one */
  /* roar with key_top_queries: per build (q head, or kv head with roar_per_kv_head), every
   * offloaded key's best queries of that build's block: [n_builds, e - b, key_top] */
  uint32_t *key_top;
  int key_top_k;
} layer_job;

static void layer_job_free(void *arg) {
  layer_job *j = arg;
  if (!j) return;
  if (j->own_kv) {
    const size_t n = kv_rows_bytes(j->o, j->e - j->b);
    kv_buf_give(j->o, (void *)j->k, n);
    kv_buf_give(j->o, (void *)j->v, n);
  }
  free(j->q);
  free(j->ids);
  free(j->key_top);
  ra_wave_puts_free(&j->clusters);
  free(j);
}

int ra_offload_key_top_queries(ra_backend *be, const ra_tensor *keys, ra_dtype q_dtype, const float *qb,
                               const float *thr, int64_t nq, int key_top, int64_t chunk, uint32_t *out,
                               ra_error *err) {
  const int64_t n_off = keys->ndim == 2 ? keys->shape[0] : -1, hd = keys->ndim == 2 ? keys->shape[1] : 0;
  if (n_off < 0 || hd < 1 || nq < 1 || key_top < 1 || chunk < 0)
    return ra_errorf(err, RA_EINVAL, "offload: key lists of %lld keys, %lld queries, top %d", (long long)n_off,
                     (long long)nq, key_top);
  if (n_off == 0) return RA_OK;
  /* by default a chunk's scores stay under 64M floats (256 MiB on the device) */
  if (chunk == 0) chunk = ((int64_t)64 << 20) / nq;
  if (chunk < 1) chunk = 1;
  if (chunk > n_off) chunk = n_off;
  const int t = key_top < nq ? key_top : (int)nq;
  ra_tensor w = {0}, bias = {0}, y = {0};
  float *nb = malloc((size_t)nq * sizeof(float)), *val = malloc((size_t)(chunk * t) * sizeof(float));
  int32_t *idx = malloc((size_t)(chunk * t) * sizeof(int32_t));
  int64_t ws[2] = {nq, hd}, bs[1] = {nq}, ys[2] = {chunk, nq};
  int rc = (!nb || !val || !idx) ? ra_errorf(err, RA_ENOMEM, "offload: out of memory for the key lists") : RA_OK;
  for (int64_t i = 0; rc == RA_OK && i < nq; i++) nb[i] = -thr[i];
  /* the queries are the "weight": in q_dtype, so that a half-precision cache's scores run on the
   * device's half-precision matmul as the keys' own precision allows */
  if (rc == RA_OK) rc = ra_tensor_new(be, &w, q_dtype, 2, ws, err);
  if (rc == RA_OK) rc = be->ops->upload(be, &w, 0, qb, (size_t)(nq * hd), err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &bias, RA_DTYPE_F32, 1, bs, err);
  if (rc == RA_OK) rc = be->ops->upload(be, &bias, 0, nb, (size_t)nq, err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &y, RA_DTYPE_F32, 2, ys, err);
  for (int64_t k0 = 0; rc == RA_OK && k0 < n_off; k0 += chunk) {
    const int64_t c = n_off - k0 < chunk ? n_off - k0 : chunk;
    ra_tensor xv = ra_tensor_rows(keys, k0, c), yv = ra_tensor_rows(&y, 0, c);
    if ((rc = be->ops->matmul(be, &xv, &w, &bias, &yv, 0, err)) || (rc = be->ops->topk_rows(be, &yv, t, idx, val, err)))
      break;
    for (int64_t r = 0; r < c; r++)
      for (int u = 0; u < key_top; u++)
        out[(k0 + r) * key_top + u] = u < t ? (uint32_t)idx[r * t + u] : RA_KVCLIENT_NO_QUERY;
  }
  ra_tensor_free(&w);
  ra_tensor_free(&bias);
  ra_tensor_free(&y);
  free(nb);
  free(val);
  free(idx);
  return rc;
}

/* Kv head g's offloaded keys on the backend, gathered from the layer's cache rows: kc is
 * [.., n_kv_heads, head_dim] with position b at row kc_b. kf: [n_off, head_dim] fp32 (the key
 * lists' x); kw: the same in kc's dtype, the "weight" of q K^T (kf itself for an fp32 cache), so a
 * half-precision cache's kNN runs on the device's half-precision matmul. ids: [n_off] scratch. */
static int gather_kv_head(ra_backend *be, const ra_tensor *kc, int64_t kc_b, int64_t n_off, int64_t n_kv, int64_t g,
                          int32_t *ids, ra_tensor *kf, ra_tensor *kw, ra_error *err) {
  const int64_t hd = kc->shape[kc->ndim - 1];
  const ra_tensor table = ra_tensor_matrix(kc, hd); /* [rows * n_kv_heads, head_dim] */
  for (int64_t t = 0; t < n_off; t++) ids[t] = (int32_t)((kc_b + t) * n_kv + g);
  int rc = be->ops->get_rows(be, &table, ids, n_off, kf, err);
  if (rc == RA_OK && kw != kf) rc = be->ops->copy(be, kw, 0, kf, 0, (size_t)(n_off * hd), err);
  return rc;
}

/* The roar index's input for one layer, on the backend: for every q head, the layer's sampled
 * prefill queries and their exact top-Nq keys among the offloaded positions (q K^T, then top-k
 * per row), and with key_top_queries every key's best queries. ivf / kgraph learn from the keys
 * alone and need none of it. The keys never leave the device: kc is the layer's cache (rows
 * [.., n_kv_heads, head_dim], position b at row kc_b).
 * q_sample: host [n_q, n_heads, head_dim] (positions ra_prefill_query_pos). */
static int layer_job_knn(layer_job *j, const ra_tensor *kc, int64_t kc_b, const float *q_sample, int64_t n_q,
                         ra_error *err) {
  ra_offload *o = j->o;
  const ra_model_config *c = &o->m->cfg;
  ra_backend *be = o->m->be;
  int64_t n_off = j->e - j->b, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  j->knn = (int)(n_off < (int64_t)o->cfg.knn_nq ? n_off : (int64_t)o->cfg.knn_nq);
  if (j->knn < 2) {
    j->knn = 0; /* too few offloaded keys to be worth an index: the stores scan */
    return RA_OK;
  }
  if (o->cfg.mode != RA_MODE_ROAR) return RA_OK;
  j->n_q = n_q;
  j->q = malloc((size_t)(c->n_heads * n_q * hd) * sizeof(float));
  j->ids = malloc((size_t)(c->n_heads * n_q * j->knn) * sizeof(uint64_t));
  float *val = malloc((size_t)(n_q * j->knn) * sizeof(float));
  int32_t *idx = malloc((size_t)(n_q * j->knn) * sizeof(int32_t)), *rows = malloc((size_t)n_off * sizeof(int32_t));
  ra_tensor kf = {0}, kw_half = {0}, x = {0}, y = {0};
  ra_tensor *kw = kc->dtype == RA_DTYPE_F32 ? &kf : &kw_half;
  const int key_top = (int)o->cfg.key_top_queries;
  const int64_t step = o->cfg.roar_per_kv_head ? group : 1; /* q heads per build */
  float *thr = key_top ? malloc((size_t)(c->n_heads * n_q) * sizeof(float)) : NULL;
  if (key_top) {
    j->key_top_k = key_top;
    j->key_top = malloc((size_t)(c->n_heads / step) * (size_t)n_off * (size_t)key_top * sizeof(uint32_t));
  }
  int rc = (!j->q || !j->ids || !val || !idx || !rows || (key_top && (!thr || !j->key_top)))
               ? ra_errorf(err, RA_ENOMEM, "offload: out of memory for the index build")
               : RA_OK;
  int64_t ks[2] = {n_off, hd}, xs[2] = {n_q, hd}, ys[2] = {n_q, n_off};
  if (rc == RA_OK) rc = ra_tensor_new(be, &kf, RA_DTYPE_F32, 2, ks, err);
  if (rc == RA_OK && kw != &kf) rc = ra_tensor_new(be, kw, kc->dtype, 2, ks, err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &x, RA_DTYPE_F32, 2, xs, err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &y, RA_DTYPE_F32, 2, ys, err);
  for (int64_t g = 0; g < c->n_kv_heads && rc == RA_OK; g++) {
    rc = gather_kv_head(be, kc, kc_b, n_off, c->n_kv_heads, g, rows, &kf, kw, err);
    for (int64_t h = g * group; h < (g + 1) * group && rc == RA_OK; h++) {
      float *qh = j->q + (size_t)(h * n_q * hd);
      uint64_t *ih = j->ids + (size_t)(h * n_q * j->knn);
      for (int64_t i = 0; i < n_q; i++) memcpy(qh + i * hd, q_sample + (i * c->n_heads + h) * hd, (size_t)hd * sizeof(float));
      if ((rc = be->ops->upload(be, &x, 0, qh, (size_t)(n_q * hd), err)) ||
          (rc = be->ops->matmul(be, &x, kw, NULL, &y, 0, err)) ||
          (rc = be->ops->topk_rows(be, &y, j->knn, idx, val, err)))
        break;
      for (int64_t i = 0; i < n_q * j->knn; i++) ih[i] = (uint64_t)(j->b + idx[i]);
      for (int64_t i = 0; thr && i < n_q; i++) thr[h * n_q + i] = val[i * j->knn + j->knn - 1];
    }
    /* the builds of kv head g: its q heads one by one, or the group as one block */
    for (int64_t h = g * group; key_top && rc == RA_OK && h < (g + 1) * group; h += step)
      rc = ra_offload_key_top_queries(be, &kf, kc->dtype, j->q + (size_t)(h * n_q * hd), thr + h * n_q, step * n_q,
                                      key_top, 0, j->key_top + (size_t)(h / step) * (size_t)n_off * (size_t)key_top, err);
  }
  ra_tensor_free(&kf);
  ra_tensor_free(&kw_half);
  ra_tensor_free(&x);
  ra_tensor_free(&y);
  free(val);
  free(idx);
  free(rows);
  free(thr);
  return rc;
}

/* Waits for the index builds started by the layer jobs so far but the `keep` latest (0: all, the
 * last layers' or on failure whatever is in flight) and adds the wait to o->pipe_index_us. */
static int layer_builds_wait(ra_offload *o, size_t keep, ra_error *err) {
  uint64_t t0 = uv_hrtime();
  int rc = ra_remote_build_index_wait_older(o->remote, keep, err);
  o->pipe_index_us += (double)(uv_hrtime() - t0) / 1e3;
  return rc;
}

/* Before a layer job starts its builds: the builds of the build_layers - 1 jobs before it stay in
 * flight, older ones are waited for. */
static int layer_builds_make_room(ra_offload *o, ra_error *err) {
  const uint32_t B = o->cfg.build_layers;
  size_t keep = 0;
  for (uint32_t i = 1; i < B && i <= o->n_jobs; i++) keep += o->job_builds[(o->n_jobs - i) % B];
  return layer_builds_wait(o, keep, err);
}

/* The store part: the layer's K/V to its stores, then its index builds (ivf / kgraph: one per
 * kv head, from the keys; roar: one per q head or kv head, from the kNN lists), all started
 * before any is waited for, so that the stores build them in parallel. The builds are left
 * running: the next layer's K/V travel while they run (a 128K-token layer's PutKv took 0.6 s of
 * the ~4.9 s a layer cost the stores on the H200), and a job waits only for the builds of the
 * jobs before the last build_layers - 1, so that a store's threads go from one layer's builds to
 * the next layer's without idling through the first layer's last builds (layer_builds_make_room).
 * layer_builds_wait(o, 0) after the last job.
 * Timings go to o->pipe_append_us / o->pipe_index_us (written by one thread at a time: the
 * pipe's, or the seed's caller). */
static int layer_job_run(void *arg, ra_error *err) {
  layer_job *j = arg;
  ra_offload *o = j->o;
  const ra_model_config *c = &o->m->cfg;
  uint64_t t0 = uv_hrtime();
  int rc = o->wave ? ra_remote_put_heads(o->remote, (uint32_t)j->layer, j->k, j->v, ra_wave_rows_dtype(o->wave),
                                         (uint64_t)j->b, (uint64_t)(j->e - j->b), err)
                   : ra_remote_put(o->remote, (uint32_t)j->layer, j->k, j->v, (uint64_t)j->b, (uint64_t)(j->e - j->b),
                                   err);
  o->pipe_append_us += (double)(uv_hrtime() - t0) / 1e3;
  if (rc == RA_OK && j->clusters.n) {
    uint64_t t1 = uv_hrtime();
    rc = ra_remote_put_clusters(o->remote, j->clusters.c, j->clusters.n, err);
    o->pipe_index_us += (double)(uv_hrtime() - t1) / 1e3;
  }
  if (rc != RA_OK || !ra_mode_has_index(o->cfg.mode) || j->knn == 0) return rc;
  if ((rc = layer_builds_make_room(o, err)) != RA_OK) return rc;
  const size_t in_flight = ra_remote_builds_in_flight(o->remote);
  int64_t group = c->n_heads / c->n_kv_heads, hd = c->head_dim;
  if (o->cfg.mode == RA_MODE_ROAR) {
    /* per kv head: the group's q heads are consecutive in q and ids, so their queries and lists
     * go as one block of group * n_q */
    const int64_t step = o->cfg.roar_per_kv_head ? group : 1, nq = step * j->n_q;
    const int64_t n_off = j->e - j->b;
    for (int64_t h = 0; h < c->n_heads && rc == RA_OK; h += step) {
      ra_kvclient_build_input in = {.queries = j->q + (size_t)(h * j->n_q * hd),
                                    .n_queries = (uint32_t)nq,
                                    .knn_ids = j->ids + (size_t)(h * j->n_q * j->knn),
                                    .knn_k = (uint32_t)j->knn};
      if (j->key_top) {
        in.key_top_queries = j->key_top + (size_t)(h / step) * (size_t)n_off * (size_t)j->key_top_k;
        in.key_top_k = (uint32_t)j->key_top_k;
        in.key_pos_begin = (uint64_t)j->b;
        in.n_key_rows = (uint64_t)n_off;
      }
      rc = ra_remote_build_index_start(o->remote, (uint32_t)j->layer, (uint32_t)h, &in, err);
    }
  } else {
    for (int64_t g = 0; g < c->n_kv_heads && rc == RA_OK; g++)
      rc = ra_remote_build_index_start(o->remote, (uint32_t)j->layer, (uint32_t)(g * group), NULL, err);
  }
  o->job_builds[o->n_jobs++ % o->cfg.build_layers] = ra_remote_builds_in_flight(o->remote) - in_flight;
  return rc;
}

/* A job for layer l's offloaded rows [b, e) of k, v (host [.., n_kv_heads, head_dim], row 0 =
 * position b), with the roar kNN computed from q_sample and the layer's keys on the backend, kc
 * (rows [.., n_kv_heads, head_dim], position b at row kc_b). */
static int layer_job_new(ra_offload *o, int l, int64_t b, int64_t e, const void *k, const void *v, int own_kv,
                         const ra_tensor *kc, int64_t kc_b, const float *q_sample, int64_t n_q, layer_job **out,
                         ra_error *err) {
  layer_job *j = calloc(1, sizeof *j);
  if (!j) {
    if (own_kv) {
      const size_t n = kv_rows_bytes(o, e - b);
      kv_buf_give(o, (void *)k, n);
      kv_buf_give(o, (void *)v, n);
    }
    return ra_errorf(err, RA_ENOMEM, "offload: out of memory");
  }
  *j = (layer_job){.o = o, .layer = l, .b = b, .e = e, .k = k, .v = v, .own_kv = own_kv};
  int rc = ra_mode_has_index(o->cfg.mode) ? layer_job_knn(j, kc, kc_b, q_sample, n_q, err) : RA_OK;
  if (rc != RA_OK) {
    layer_job_free(j);
    return rc;
  }
  *out = j;
  return RA_OK;
}

/* The sampled prefill queries (ra_prefill_query_pos(n, n_q, i)) that lie in the step's rows
 * [c0, c0 + len) of the prompt (st->cur_q, row 0 = position c0) into their rows of q_host
 * [n_q, n_heads * head_dim]: gathered on the device, then one download. */
static int pick_queries(ra_offload *o, int64_t n, int64_t n_q, int64_t c0, int64_t len, float *q_host,
                        ra_error *err) {
  ra_backend *be = o->m->be;
  const int64_t q_row = (int64_t)o->m->cfg.n_heads * o->m->cfg.head_dim;
  int64_t i0 = 0, m = 0;
  while (i0 < n_q && ra_prefill_query_pos(n, n_q, i0) < c0) i0++;
  for (int64_t p; i0 + m < n_q && (p = ra_prefill_query_pos(n, n_q, i0 + m)) < c0 + len; m++)
    o->q_pick_rows[m] = (int32_t)(p - c0);
  if (m == 0) return RA_OK;
  /* the step's q [len, n_heads, head_dim] as a table of len rows */
  const ra_tensor table = ra_tensor_matrix(&o->st->cur_q, q_row);
  ra_tensor out = ra_tensor_rows(&o->q_pick, 0, m);
  int rc = be->ops->get_rows(be, &table, o->q_pick_rows, m, &out, err);
  return rc ? rc : be->ops->download(be, &out, 0, q_host + i0 * q_row, (size_t)(m * q_row), err);
}

/* Layer l's offloaded rows [b, e) of kc, vc (rows = positions) to new host buffers *k, *v: as
 * they are ([e - b, n_kv_heads, head_dim]), or in wave mode clustered on the backend and in each
 * kv head's cluster order ([n_kv_heads, e - b, head_dim]) with the layer's PutClusters in *puts.
 * *download_us += the downloads' time (the rest is wave's clustering). */
static int offload_rows(ra_offload *o, int l, const ra_tensor *kc, const ra_tensor *vc, int64_t b, int64_t e, void **k,
                        void **v, ra_wave_puts *puts, double *download_us, ra_error *err) {
  ra_backend *be = o->m->be;
  size_t nf = (size_t)(e - b) * o->kv_row;
  *k = kv_buf_take(o, kv_rows_bytes(o, e - b));
  *v = kv_buf_take(o, kv_rows_bytes(o, e - b));
  if (!*k || !*v)
    return ra_errorf(err, RA_ENOMEM, "offload: out of memory for %lld tokens of layer %d", (long long)(e - b), l);
  if (o->wave) return ra_wave_prefill_layer(o->wave, l, kc, vc, b, e, *k, *v, puts, download_us, err);
  const uint64_t t0 = uv_hrtime();
  int rc = be->ops->download(be, kc, (size_t)b * o->kv_row, *k, nf, err);
  if (rc == RA_OK) rc = be->ops->download(be, vc, (size_t)b * o->kv_row, *v, nf, err);
  *download_us += (double)(uv_hrtime() - t0) / 1e3;
  return rc;
}

/* The job of layer l's offloaded rows [b, e) of kc, vc (the layer's cache on the backend, row =
 * position): offload_rows, then layer_job_new with the rows as the job's own. *rows_us: the
 * time of offload_rows, *download_us of its downloads. */
static int layer_job_of_cache(ra_offload *o, int l, const ra_tensor *kc, const ra_tensor *vc, int64_t b, int64_t e,
                              const float *q, int64_t n_q, layer_job **job, double *rows_us, double *download_us,
                              ra_error *err) {
  uint64_t t0 = uv_hrtime();
  void *k = NULL, *v = NULL;
  ra_wave_puts puts = {0};
  int rc = offload_rows(o, l, kc, vc, b, e, &k, &v, &puts, download_us, err);
  *rows_us = (double)(uv_hrtime() - t0) / 1e3;
  if (rc == RA_OK) {
    rc = layer_job_new(o, l, b, e, k, v, 1, kc, b, q, n_q, job, err);
    k = v = NULL; /* the job's now, or freed */
  }
  if (rc == RA_OK) (*job)->clusters = puts;
  else ra_wave_puts_free(&puts);
  kv_buf_give(o, k, kv_rows_bytes(o, e - b));
  kv_buf_give(o, v, kv_rows_bytes(o, e - b));
  return rc;
}

/* After layer l ran over the scratch (st->k_cache[l] is the scratch, sk/sv hold the ring):
 * offloaded positions to the stores (+ index) through the pipe, sink and window into the ring.
 * q: roar's sampled queries of the layer, host [n_q, n_heads, head_dim] (else NULL). */
static int prefill_offload_layer(ra_offload *o, ra_job_pipe *pipe, int l, int64_t n, ra_tensor *ring_k,
                                 ra_tensor *ring_v, const float *q, int64_t n_q, ra_offload_stats *stats,
                                 ra_error *err) {
  ra_state *st = o->st;
  uint64_t b64, e64;
  int rc = RA_OK;
  /* [b, e) leaves the device: to the stores, or (streaming) dropped */
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n, &b64, &e64);
  int64_t b = (int64_t)b64, e = (int64_t)e64;
  if (o->remote && e > b) {
    /* the layer's compute first, so that the times below are the offload's own */
    rc = o->m->be->ops->sync(o->m->be, err);
    uint64_t t0 = uv_hrtime();
    layer_job *job = NULL;
    double rows_us = 0.0, download_us = 0.0;
    if (rc == RA_OK)
      rc = layer_job_of_cache(o, l, &st->k_cache[l], &st->v_cache[l], b, e, q, n_q, &job, &rows_us, &download_us,
                              err);
    uint64_t t2 = uv_hrtime();
    /* the rest of offload_rows is wave's clustering; after it, the kNN of an index mode */
    stats->download_us += download_us;
    stats->index_us += (double)(t2 - t0) / 1e3 - download_us;
    if (rc == RA_OK) rc = ra_job_pipe_push(pipe, layer_job_run, layer_job_free, job, err);
    stats->wait_us += (double)(uv_hrtime() - t2) / 1e3;
  }
  /* sink [0, min(S, n)) and window [min(e, n), n) into the ring */
  int64_t s = n < (int64_t)o->cfg.n_sink ? n : (int64_t)o->cfg.n_sink;
  int64_t w0 = e < n ? e : n;
  if (rc == RA_OK) rc = ring_fill(o, ring_k, &st->k_cache[l], 0, s, err);
  if (rc == RA_OK) rc = ring_fill(o, ring_v, &st->v_cache[l], 0, s, err);
  if (rc == RA_OK) rc = ring_fill(o, ring_k, &st->k_cache[l], w0, n, err);
  if (rc == RA_OK) rc = ring_fill(o, ring_v, &st->v_cache[l], w0, n, err);
  return rc;
}

/* Wave mode, before a prefill (or seed) of n tokens: the meta-index sized for the offloaded
 * positions now and every one a decode up to max_ctx evicts. */
static int wave_begin(ra_offload *o, int64_t n, ra_error *err) {
  if (!o->wave) return RA_OK;
  uint64_t b, e, e_max;
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n, &b, &e);
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)o->cfg.max_ctx, &b, &e_max);
  return ra_wave_begin(o->wave, (int64_t)b, (int64_t)e, (int64_t)e_max, err);
}

/* Layer l of a synthetic prefill (cfg.synthetic_chunk): q/k/v of the token embeddings, chunk by
 * chunk at their own positions, k/v into the layer's scratch cache, the sampled queries into q
 * (roar, else NULL). The chunks' x stays the embedding: no attention, no MLP. */
static int synthetic_layer_qkv(ra_offload *o, const int32_t *tokens, int64_t n, int l, float *q, int64_t n_q,
                               ra_error *err) {
  ra_state *st = o->st;
  int rc = RA_OK;
  for (int64_t c0 = 0; c0 < n && rc == RA_OK; c0 += st->max_batch) {
    const int64_t len = n - c0 < st->max_batch ? n - c0 : st->max_batch;
    st->pos = c0;
    rc = ra_step_begin(st, tokens + c0, len, err);
    if (rc == RA_OK) rc = ra_step_layer_qkv(st, l, err);
    if (rc == RA_OK && q) rc = pick_queries(o, n, n_q, c0, len, q, err);
  }
  return rc;
}

/* After a prefill (done or failed): a decode step is P + 1 <= retro_window + 1 tokens, so the state's
 * prompt-sized activations go (4.3 GB at 32K tokens of Llama-3-8B: what bounded the sequences
 * a server held, bench/results/serve-h200/). A shrink that cannot allocate keeps the old ones. */
static void state_to_decode_size(ra_offload *o) {
  const int64_t rows = (int64_t)o->cfg.retro_window + 1;
  ra_error e;
  (void)ra_state_set_max_batch(o->st, rows, rows < o->prefill_ffn ? rows : o->prefill_ffn, &e);
}

/* After a prefill (done or failed): its pooled host buffers (six layers' K or V, pinned on CUDA: 0.8 GB at 32K
 * tokens in fp32, half in wave's 16-bit rows) go too, or a server's idle sequences would hold them (the pipe is finished). */
static void kv_pool_release(ra_offload *o) {
  uv_mutex_lock(&o->kv_pool_lock);
  void *p[RA_OFFLOAD_KV_POOL];
  for (int i = 0; i < RA_OFFLOAD_KV_POOL; i++) {
    p[i] = o->kv_pool[i];
    o->kv_pool[i] = NULL;
    o->kv_pool_cap[i] = 0;
  }
  uv_mutex_unlock(&o->kv_pool_lock);
  for (int i = 0; i < RA_OFFLOAD_KV_POOL; i++) o->m->be->ops->host_free(o->m->be, p[i]);
}

/* Ends the prefill under way: its last layers' jobs and builds waited for (rc: how its layers
 * went; a store's failure surfaces here at the latest), its buffers freed, the state at the
 * prompt's end or, on failure, back at position 0. */
static int prefill_finish(ra_offload *o, int rc, ra_offload_stats *stats, ra_error *err) {
  prefill_run *pf = &o->pf;
  ra_state *st = o->st;
  /* a layer left after some of its rows (cancelled, or failed in them) gives the scratch back */
  if (pf->row > 0) ra_state_swap_cache(st, pf->layer, &o->scratch_k, &o->scratch_v);
  /* synthetic: the state is at the last chunk, whose x is still its embedding: its last row's
   * logits, and pos moves past the prompt */
  if (rc == RA_OK) rc = ra_step_end(st, 0, err);
  if (rc == RA_OK) rc = o->m->be->ops->sync(o->m->be, err);
  if (pf->pipe) {
    ra_error perr, berr;
    uint64_t tw = uv_hrtime();
    int prc = ra_job_pipe_finish(pf->pipe, rc ? &perr : err);
    if (rc == RA_OK) rc = prc;
    int brc = layer_builds_wait(o, 0, rc ? &berr : err);
    if (rc == RA_OK) rc = brc;
    pf->s.wait_us += (double)(uv_hrtime() - tw) / 1e3;
  }
  free(pf->q);
  ra_offload_stats s = pf->s;
  const int64_t n = pf->n;
  const uint64_t t0 = pf->t0;
  memset(pf, 0, sizeof *pf);
  s.append_us += o->pipe_append_us;
  s.index_us += o->pipe_index_us;
  kv_pool_release(o);
  state_to_decode_size(o);
  if (rc != RA_OK) {
    ra_state_reset(st); /* a synthetic prefill moves pos chunk by chunk; a piece narrows the step */
    return rc;
  }
  if (o->remote) {
    uint64_t b, e;
    ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n, &b, &e);
    s.n_offloaded = e - b;
  }
  s.total_us = (double)(uv_hrtime() - t0) / 1e3;
  o->prefill_stats = s;
  if (stats) *stats = s;
  return RA_OK;
}

int ra_offload_prefill_begin(ra_offload *o, const int32_t *tokens, int64_t n, ra_error *err) {
  ra_state *st = o->st;
  prefill_run *pf = &o->pf;
  if (pf->active) return ra_errorf(err, RA_ESTATE, "offload: a prefill is under way");
  if (st->pos != 0) return ra_errorf(err, RA_ESTATE, "offload: prefill after %lld tokens", (long long)st->pos);
  if (n < 1 || n > o->scratch_k.shape[0])
    return ra_errorf(err, RA_EINVAL, "offload: a prefill of %lld tokens (at most %lld)", (long long)n,
                     (long long)o->scratch_k.shape[0]);
  int rc = ra_state_set_max_batch(st, o->prefill_rows, o->prefill_ffn, err);
  if (rc) return rc;
  *pf = (prefill_run){.active = 1, .tokens = tokens, .n = n, .synthetic = o->cfg.synthetic_chunk > 0,
                      .t0 = uv_hrtime()};
  o->pipe_append_us = o->pipe_index_us = 0.0;
  o->n_jobs = 0;
  /* roar's sampled queries of the layer, reused by every layer (the job copies them) */
  pf->n_q = n < (int64_t)o->cfg.build_queries ? n : (int64_t)o->cfg.build_queries;
  const size_t q_row = (size_t)o->m->cfg.n_heads * (size_t)o->m->cfg.head_dim;
  if (o->remote && o->cfg.mode == RA_MODE_ROAR && !(pf->q = malloc((size_t)pf->n_q * q_row * sizeof(float))))
    rc = ra_errorf(err, RA_ENOMEM, "offload: out of memory for %lld sampled queries", (long long)pf->n_q);
  if (rc == RA_OK) rc = wave_begin(o, n, err);
  /* Two layers in flight: layer l at the stores while the device computes l + 1, and l + 1's
   * job ready behind it (host memory: two layers' offloaded K/V, fp32 or wave's 16-bit rows). */
  if (rc == RA_OK && o->remote) rc = ra_job_pipe_start(2, &pf->pipe, err);
  if (rc == RA_OK && !pf->synthetic) rc = ra_step_begin(st, tokens, n, err);
  return rc ? prefill_finish(o, rc, NULL, err) : RA_OK;
}

/* Reports layer l's end to the progress callback. */
static void prefill_progress(ra_offload *o, int l) {
  const prefill_run *pf = &o->pf;
  uint64_t b, e;
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)pf->n, &b, &e);
  if (!o->remote) e = b; /* streaming sends nothing */
  ra_offload_progress pr = {.layer = l + 1, .n_layers = o->m->cfg.n_layers, .n_tokens = pf->n,
                            .bytes_offloaded = (uint64_t)(l + 1) * (e - b) * 2 * o->m->cfg.n_kv_heads *
                                               ra_dtype_row_bytes(o->cfg.store_dtype, (size_t)o->m->cfg.head_dim),
                            .index_s = pf->s.index_us / 1e6};
  o->cfg.progress(o->cfg.progress_ctx, &pr);
}

/* Rows [r0, r0 + nr) of layer l of the prefill under way (a synthetic layer runs whole). The
 * scratch is layer l's cache from its first rows to its last; after the last rows' attention,
 * the layer's K/V leave for the stores (before the rows' Wo and MLP, which do not read them). */
static int prefill_rows(ra_offload *o, int l, int64_t r0, int64_t nr, ra_error *err) {
  prefill_run *pf = &o->pf;
  ra_state *st = o->st;
  const int64_t n = pf->n;
  const int last = r0 + nr == n;
  int rc;
  /* The scratch becomes layer l's cache for its rows; its ring waits in scratch_k/v. */
  if (r0 == 0) ra_state_swap_cache(st, l, &o->scratch_k, &o->scratch_v);
  pf->row = r0 + nr;
  if (pf->synthetic) {
    rc = synthetic_layer_qkv(o, pf->tokens, n, l, pf->q, pf->n_q, err);
  } else {
    rc = ra_step_rows(st, r0, nr, err);
    if (rc == RA_OK) rc = ra_step_layer_qkv(st, l, err);
    if (rc == RA_OK) rc = ra_step_layer_attend(st, l, err);
    if (rc == RA_OK && pf->q) rc = pick_queries(o, n, pf->n_q, r0, nr, pf->q, err);
  }
  if (last) {
    if (rc == RA_OK)
      rc = prefill_offload_layer(o, pf->pipe, l, n, &o->scratch_k, &o->scratch_v, pf->q, pf->n_q, &pf->s, err);
    ra_state_swap_cache(st, l, &o->scratch_k, &o->scratch_v);
    pf->row = 0;
    pf->layer = l + 1;
  }
  if (rc == RA_OK && !pf->synthetic) rc = ra_step_layer_finish(st, l, err);
  if (rc == RA_OK && last && o->cfg.progress) prefill_progress(o, l);
  return rc;
}

int ra_offload_prefill_next(ra_offload *o, int64_t max_rows, int *done, ra_offload_stats *stats, ra_error *err) {
  *done = 0;
  prefill_run *pf = &o->pf;
  if (!pf->active) return ra_errorf(err, RA_ESTATE, "offload: no prefill under way");
  if (max_rows < 1) return ra_errorf(err, RA_EINVAL, "offload: a prefill piece of %lld rows", (long long)max_rows);
  int rc = RA_OK;
  for (int64_t left = max_rows; left > 0 && pf->layer < o->m->cfg.n_layers && rc == RA_OK;) {
    const int64_t rest = pf->n - pf->row, nr = pf->synthetic || rest <= left ? rest : left;
    rc = prefill_rows(o, pf->layer, pf->row, nr, err);
    left -= nr;
  }
  if (rc == RA_OK && pf->layer < o->m->cfg.n_layers) return RA_OK;
  *done = rc == RA_OK;
  return prefill_finish(o, rc, stats, err);
}

int ra_offload_prefill(ra_offload *o, const int32_t *tokens, int64_t n, ra_offload_stats *stats, ra_error *err) {
  int rc = ra_offload_prefill_begin(o, tokens, n, err), done = 0;
  if (rc == RA_OK) rc = ra_offload_prefill_next(o, n * o->m->cfg.n_layers, &done, stats, err);
  return rc;
}

/* Captured rows [p0, p1) of one layer (host [n, n_kv_heads, head_dim]) into the ring, through the
 * scratch at their own positions so that ring_fill places them as a prefill does. */
static int seed_ring(ra_offload *o, ra_tensor *ring, ra_tensor *scratch, const float *kv, int64_t p0, int64_t p1,
                     ra_error *err) {
  if (p1 <= p0) return RA_OK;
  int rc = o->m->be->ops->upload(o->m->be, scratch, (size_t)p0 * o->kv_row, kv + (size_t)p0 * o->kv_row,
                                 (size_t)(p1 - p0) * o->kv_row, err);
  return rc ? rc : ring_fill(o, ring, scratch, p0, p1, err);
}

int ra_offload_seed(ra_offload *o, const ra_prefill_capture *cap, ra_offload_stats *stats, ra_error *err) {
  ra_state *st = o->st;
  const ra_model_config *c = &o->m->cfg;
  ra_offload_stats s = {0};
  int64_t n = cap->n;
  if (st->pos != 0 || o->pf.active)
    return ra_errorf(err, RA_ESTATE, "offload: seed after %lld tokens or during a prefill", (long long)st->pos);
  if (cap->n_layers != c->n_layers || cap->n_heads != c->n_heads || cap->n_kv_heads != c->n_kv_heads ||
      cap->head_dim != c->head_dim || cap->vocab != c->vocab)
    return ra_errorf(err, RA_EINVAL, "offload: the capture is of another model geometry");
  if (n < 1 || n > o->scratch_k.shape[0])
    return ra_errorf(err, RA_EINVAL, "offload: a seed of %lld tokens (at most %lld)", (long long)n,
                     (long long)o->scratch_k.shape[0]);
  int64_t n_q = n < (int64_t)o->cfg.build_queries ? n : (int64_t)o->cfg.build_queries;
  if (ra_mode_has_index(o->cfg.mode) && cap->n_queries != n_q)
    return ra_errorf(err, RA_EINVAL, "offload: the capture sampled %lld queries per layer, the index build wants %lld",
                     (long long)cap->n_queries, (long long)n_q);
  uint64_t t0 = uv_hrtime(), b64, e64;
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n, &b64, &e64);
  int64_t b = (int64_t)b64, e = (int64_t)e64;
  o->n_jobs = 0;
  int64_t sink_end = n < (int64_t)o->cfg.n_sink ? n : (int64_t)o->cfg.n_sink, w0 = e < n ? e : n;
  size_t q_row = (size_t)c->n_heads * (size_t)c->head_dim;
  int rc = wave_begin(o, n, err);
  for (int l = 0; l < c->n_layers && rc == RA_OK; l++) {
    const float *k = cap->k + (size_t)l * (size_t)n * o->kv_row, *v = cap->v + (size_t)l * (size_t)n * o->kv_row;
    if (o->remote && e > b) {
      /* as the prefill's jobs, run here: the capture's K/V are the job's borrowed rows */
      uint64_t ta = uv_hrtime();
      layer_job *job = NULL;
      o->pipe_append_us = o->pipe_index_us = 0.0;
      /* roar's kNN and wave's clustering read the layer's rows on the backend: the offloaded rows
       * go to the scratch */
      if (o->cfg.mode == RA_MODE_ROAR || o->wave)
        rc = o->m->be->ops->upload(o->m->be, &o->scratch_k, (size_t)b * o->kv_row, k + (size_t)b * o->kv_row,
                                   (size_t)(e - b) * o->kv_row, err);
      if (rc == RA_OK && o->wave)
        rc = o->m->be->ops->upload(o->m->be, &o->scratch_v, (size_t)b * o->kv_row, v + (size_t)b * o->kv_row,
                                   (size_t)(e - b) * o->kv_row, err);
      double rows_us, download_us = 0.0;
      if (rc == RA_OK && o->wave) {
        rc = layer_job_of_cache(o, l, &o->scratch_k, &o->scratch_v, b, e, NULL, 0, &job, &rows_us, &download_us, err);
      } else if (rc == RA_OK) {
        rc = layer_job_new(o, l, b, e, k + (size_t)b * o->kv_row, v + (size_t)b * o->kv_row, 0, &o->scratch_k, b,
                           cap->q + (size_t)l * (size_t)n_q * q_row, n_q, &job, err);
      }
      double knn_us = (double)(uv_hrtime() - ta) / 1e3 - download_us;
      if (rc == RA_OK) rc = layer_job_run(job, err);
      layer_job_free(job);
      s.append_us += o->pipe_append_us;
      s.download_us += download_us;
      s.index_us += knn_us + o->pipe_index_us;
    }
    if (rc == RA_OK) rc = seed_ring(o, &st->k_cache[l], &o->scratch_k, k, 0, sink_end, err);
    if (rc == RA_OK) rc = seed_ring(o, &st->v_cache[l], &o->scratch_v, v, 0, sink_end, err);
    if (rc == RA_OK) rc = seed_ring(o, &st->k_cache[l], &o->scratch_k, k, w0, n, err);
    if (rc == RA_OK) rc = seed_ring(o, &st->v_cache[l], &o->scratch_v, v, w0, n, err);
  }
  if (o->remote) {
    ra_error berr;
    o->pipe_index_us = 0.0;
    int brc = layer_builds_wait(o, 0, rc ? &berr : err);
    if (rc == RA_OK) rc = brc;
    s.index_us += o->pipe_index_us;
  }
  if (rc == RA_OK) rc = o->m->be->ops->upload(o->m->be, &st->logits, 0, cap->logits, (size_t)c->vocab, err);
  if (rc == RA_OK) rc = o->m->be->ops->sync(o->m->be, err);
  if (rc != RA_OK) return rc;
  st->pos = n;
  st->n = 0;
  st->n_logits = 1;
  s.n_offloaded = o->remote && e > b ? (uint64_t)(e - b) : 0;
  s.total_us = (double)(uv_hrtime() - t0) / 1e3;
  o->prefill_stats = s;
  if (stats) *stats = s;
  return RA_OK;
}
