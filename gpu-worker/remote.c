#include "remote.h"

#include "merge.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* What the remote keeps per store: the connection, the session, the Attend stream and the
 * buffers of one request (its asked q heads, their q, the partials coming back). */
typedef struct remote_store {
  const ra_plan_store *plan;
  ra_kvclient *client;
  ra_kvclient_session session;
  int session_open;
  ra_kvclient_stream *stream;
  uint32_t *heads;             /* [n_q_heads] */
  float *q;                    /* [n_q_heads, head_dim] */
  float *o;                    /* [n_q_heads, head_dim] */
  ra_head_partial *parts;      /* [n_q_heads] */
  ra_kvclient_attend_req req;  /* the request in flight */
  ra_kvclient_rows *rows;      /* [n_shards + n_layers * n_kv_heads]: put / append blocks */
  size_t n_rows;               /* blocks staged in rows */
  uint64_t *head_tokens;       /* [n_layers * n_kv_heads] tokens sent here: an index build's deadline */
  int unreachable;             /* a call timed out or lost the connection: close skips the store */
} remote_store;

/* Notes a store that stopped answering, so that closing does not wait for it a deadline more
 * per call (its session expires with the store's lease). Returns rc. */
static int store_failed(remote_store *s, int rc) {
  if (rc == RA_ETIMEDOUT || rc == RA_EUNAVAIL || rc == RA_ECANCELED) s->unreachable = 1;
  return rc;
}

struct ra_remote {
  const ra_offload_plan *plan;
  ra_remote_config cfg;
  uint32_t head_dim;
  remote_store *stores;
  size_t n_stores;
  uint8_t *pack;   /* put / append staging in the session dtype */
  size_t pack_cap; /* bytes */
  int failed;      /* a store failed: no more steps (see remote.h) */
  ra_error failure;
  int in_flight;   /* attend_begin sent, attend_end not yet called */
  ra_kvclient_build **builds; /* index builds started, not yet waited for */
  remote_store **build_store; /* [cap_builds] the store of each */
  size_t n_builds, cap_builds;
  uint64_t t_begin;
  ra_partial *acc; /* [n_q_heads] merge accumulators */
};

/* Records the first failure and returns its code; later calls report it. */
static int remote_fail(ra_remote *r, int rc, const ra_error *err) {
  if (!r->failed) {
    r->failed = 1;
    r->failure = *err;
  }
  return rc;
}

static int remote_check(const ra_remote *r, ra_error *err) {
  if (!r->failed) return RA_OK;
  return ra_errorf(err, RA_ESTATE, "remote attention stopped after an earlier failure: %s", r->failure.msg);
}

static int reserve_pack(ra_remote *r, size_t bytes, ra_error *err) {
  if (bytes <= r->pack_cap) return RA_OK;
  uint8_t *p = realloc(r->pack, bytes);
  if (!p) return ra_errorf(err, RA_ENOMEM, "remote: out of memory for %zu bytes of KV", bytes);
  r->pack = p;
  r->pack_cap = bytes;
  return RA_OK;
}

static int store_open(ra_remote *r, remote_store *s, ra_error *err) {
  const ra_offload_plan *p = r->plan;
  size_t nq = p->n_q_heads, hd = r->head_dim;
  size_t n_rows = s->plan->n_shards + (size_t)p->n_layers * p->n_kv_heads;
  s->heads = calloc(nq, sizeof *s->heads);
  s->q = calloc(nq * hd, sizeof *s->q);
  s->o = calloc(nq * hd, sizeof *s->o);
  s->parts = calloc(nq, sizeof *s->parts);
  s->rows = calloc(n_rows, sizeof *s->rows);
  s->head_tokens = calloc((size_t)p->n_layers * p->n_kv_heads, sizeof *s->head_tokens);
  ra_kvclient_shard *shards = calloc(s->plan->n_shards + 1, sizeof *shards);
  if (!s->heads || !s->q || !s->o || !s->parts || !s->rows || !s->head_tokens || !shards) {
    free(shards);
    return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  }
  for (size_t i = 0; i < s->plan->n_shards; i++) {
    const ra_plan_shard *sh = &s->plan->shards[i];
    shards[i] = (ra_kvclient_shard){sh->layer, sh->kv_head, sh->token_begin, sh->token_end};
  }
  ra_kvclient_geometry geo = {p->n_layers, p->n_q_heads, p->n_kv_heads, r->head_dim, r->cfg.dtype};
  int serving = 0;
  ra_kvclient_options copt = r->cfg.client;
  copt.timeout_ms = r->cfg.timeout_ms;
  int rc = ra_kvclient_connect(s->plan->addr, &copt, &s->client, err);
  if (rc == RA_OK) rc = ra_kvclient_health(s->client, &serving, err);
  if (rc == RA_OK && !serving) rc = ra_errorf(err, RA_EUNAVAIL, "%s: store is not serving", s->plan->addr);
  if (rc == RA_OK)
    rc = ra_kvclient_open_session(s->client, &geo, shards, s->plan->n_shards,
                                  r->cfg.client_name ? r->cfg.client_name : "gpu-worker", &s->session, err);
  if (rc == RA_OK) s->session_open = 1;
  if (rc == RA_OK) rc = ra_kvclient_attend_open(s->client, &s->session, &s->stream, err);
  free(shards);
  return rc;
}

static void store_close(remote_store *s) {
  ra_error err;
  if (s->stream && !s->unreachable) ra_kvclient_attend_close(s->stream);
  else if (s->stream) ra_kvclient_attend_abort(s->stream);
  if (s->session_open && !s->unreachable) ra_kvclient_close_session(s->client, &s->session, NULL, &err);
  if (s->client) ra_kvclient_close(s->client);
  free(s->heads);
  free(s->q);
  free(s->o);
  free(s->parts);
  free(s->rows);
  free(s->head_tokens);
}

void ra_remote_close(ra_remote *r) {
  if (!r) return;
  ra_error ignored;
  ra_remote_build_index_wait(r, &ignored);
  free(r->builds);
  free(r->build_store);
  for (size_t i = 0; i < r->n_stores; i++) store_close(&r->stores[i]);
  free(r->stores);
  free(r->pack);
  free(r->acc);
  free(r);
}

int ra_remote_open(const ra_offload_plan *plan, uint32_t head_dim, const ra_remote_config *cfg,
                   ra_remote **out, ra_error *err) {
  *out = NULL;
  if (head_dim == 0 || ra_dtype_size(cfg->dtype) == 0)
    return ra_errorf(err, RA_EINVAL, "remote: bad head_dim %u or dtype", head_dim);
  ra_remote *r = calloc(1, sizeof *r);
  if (!r) return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  r->plan = plan;
  r->cfg = *cfg;
  if (r->cfg.timeout_ms <= 0) r->cfg.timeout_ms = 10000;
  r->head_dim = head_dim;
  r->n_stores = plan->n_stores;
  r->stores = calloc(plan->n_stores, sizeof *r->stores);
  r->acc = calloc(plan->n_q_heads, sizeof *r->acc);
  if (!r->stores || !r->acc) {
    free(r->stores);
    free(r->acc);
    free(r);
    return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  }
  int rc = RA_OK;
  for (size_t i = 0; i < plan->n_stores && rc == RA_OK; i++) {
    r->stores[i].plan = &plan->stores[i];
    if (plan->stores[i].n_shards > 0) rc = store_open(r, &r->stores[i], err);
  }
  if (rc != RA_OK) {
    ra_remote_close(r);
    return rc;
  }
  *out = r;
  return RA_OK;
}

/* Gathers rows [b, e) of kv head g from x (first row = position pos0) into dst as
 * [e - b, head_dim] in the session dtype. x: [n, n_kv_heads, head_dim], or head-major
 * [n_kv_heads, n, head_dim] (n rows per head). */
static void pack_head(const ra_remote *r, const float *x, int head_major, uint64_t n, uint64_t pos0, uint32_t g,
                      uint64_t b, uint64_t e, uint8_t *dst) {
  size_t hd = r->head_dim, es = ra_dtype_size(r->cfg.dtype), nkv = r->plan->n_kv_heads;
  for (uint64_t t = b; t < e; t++) {
    size_t at = head_major ? (size_t)g * n + (t - pos0) : (t - pos0) * nkv + g;
    ra_dtype_from_fp32_n(r->cfg.dtype, x + at * hd, dst + (t - b) * hd * es, hd);
  }
}

/* One store's part of a put: its shards of the layer, packed into its own slice of the staging
 * buffer, sent as one PutKv stream. */
typedef struct put_part {
  ra_remote *r;
  remote_store *s;
  uint32_t layer;
  const float *k, *v;
  int head_major;
  uint64_t pos0, end;
  uint8_t *dst; /* this store's slice */
  int rc;
  ra_error err;
} put_part;

static void put_store(void *arg) {
  put_part *p = arg;
  ra_remote *r = p->r;
  remote_store *s = p->s;
  size_t row_bytes = ra_dtype_size(r->cfg.dtype) * r->head_dim;
  uint8_t *dst = p->dst;
  s->n_rows = 0;
  for (size_t j = 0; j < s->plan->n_shards; j++) {
    const ra_plan_shard *sh = &s->plan->shards[j];
    if (sh->layer != p->layer) continue;
    uint64_t b = sh->token_begin > p->pos0 ? sh->token_begin : p->pos0;
    uint64_t e = sh->token_end < p->end ? sh->token_end : p->end;
    if (b >= e) continue;
    uint8_t *kd = dst, *vd = dst + (e - b) * row_bytes;
    pack_head(r, p->k, p->head_major, p->end - p->pos0, p->pos0, sh->kv_head, b, e, kd);
    pack_head(r, p->v, p->head_major, p->end - p->pos0, p->pos0, sh->kv_head, b, e, vd);
    dst = vd + (e - b) * row_bytes;
    s->rows[s->n_rows++] = (ra_kvclient_rows){p->layer, sh->kv_head, b, e - b, kd, vd};
  }
  p->rc = s->n_rows ? ra_kvclient_put_kv(s->client, &s->session, s->rows, s->n_rows, NULL, &p->err) : RA_OK;
  for (size_t j = 0; p->rc == RA_OK && j < s->n_rows; j++)
    s->head_tokens[(size_t)p->layer * r->plan->n_kv_heads + s->rows[j].kv_head] += s->rows[j].n_tokens;
}

/* Bytes of store s's shards of `layer` within [pos0, end), K and V. */
static size_t put_bytes(const ra_remote *r, const remote_store *s, uint32_t layer, uint64_t pos0, uint64_t end) {
  size_t row_bytes = ra_dtype_size(r->cfg.dtype) * r->head_dim, total = 0;
  for (size_t j = 0; j < s->plan->n_shards; j++) {
    const ra_plan_shard *sh = &s->plan->shards[j];
    uint64_t b = sh->token_begin > pos0 ? sh->token_begin : pos0;
    uint64_t e = sh->token_end < end ? sh->token_end : end;
    if (sh->layer == layer && b < e) total += 2 * (e - b) * row_bytes;
  }
  return total;
}

static int remote_put(ra_remote *r, uint32_t layer, const float *k, const float *v, int head_major, uint64_t pos0,
                      uint64_t n, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (layer >= r->plan->n_layers) return ra_errorf(err, RA_EINVAL, "remote: layer %u out of range", layer);
  size_t row_bytes = ra_dtype_size(r->cfg.dtype) * r->head_dim;
  if ((rc = reserve_pack(r, 2 * n * r->plan->n_kv_heads * row_bytes, err)) != RA_OK) return rc;
  /* Every store packs and sends its own shards on a thread of its own: the stores ingest in
   * parallel (one after the other, a 128K-token layer of Llama-3-8B geometry took as long as
   * the layer's compute on the H200). A shard has one owner, so the slices are disjoint and
   * together no larger than the buffer. */
  put_part *parts = calloc(r->n_stores, sizeof *parts);
  uv_thread_t *th = calloc(r->n_stores, sizeof *th);
  int *started = calloc(r->n_stores, sizeof *started);
  if (!parts || !th || !started) {
    free(parts);
    free(th);
    free(started);
    return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  }
  size_t off = 0;
  for (size_t i = 0; i < r->n_stores; i++) {
    parts[i] = (put_part){r, &r->stores[i], layer, k, v, head_major, pos0, pos0 + n, r->pack + off, RA_OK, {0}};
    off += put_bytes(r, &r->stores[i], layer, pos0, pos0 + n);
  }
  /* store 0 on this thread; a store whose thread cannot start also runs here */
  for (size_t i = 1; i < r->n_stores; i++) started[i] = uv_thread_create(&th[i], put_store, &parts[i]) == 0;
  for (size_t i = 0; i < r->n_stores; i++)
    if (i == 0 || !started[i]) put_store(&parts[i]);
  for (size_t i = 1; i < r->n_stores; i++)
    if (started[i]) uv_thread_join(&th[i]);
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++)
    if (store_failed(parts[i].s, parts[i].rc) != RA_OK) {
      rc = parts[i].rc;
      *err = parts[i].err;
    }
  free(parts);
  free(th);
  free(started);
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

int ra_remote_put(ra_remote *r, uint32_t layer, const float *k, const float *v, uint64_t pos0,
                  uint64_t n, ra_error *err) {
  return remote_put(r, layer, k, v, 0, pos0, n, err);
}

int ra_remote_put_heads(ra_remote *r, uint32_t layer, const float *k, const float *v, uint64_t pos0,
                        uint64_t n, ra_error *err) {
  return remote_put(r, layer, k, v, 1, pos0, n, err);
}

int ra_remote_put_clusters(ra_remote *r, const ra_kvclient_clusters *c, size_t n, ra_error *err) {
  int rc = remote_check(r, err);
  for (size_t i = 0; i < n && rc == RA_OK; i++) {
    if (c[i].layer >= r->plan->n_layers || c[i].kv_head >= r->plan->n_kv_heads)
      return ra_errorf(err, RA_EINVAL, "remote: clusters of layer %u kv head %u out of range", c[i].layer,
                       c[i].kv_head);
    int owner = ra_offload_plan_owner(r->plan, c[i].layer, c[i].kv_head, c[i].row_begin);
    if (owner < 0)
      return ra_errorf(err, RA_EINTERNAL, "remote: position %llu of layer %u kv head %u has no owner",
                       (unsigned long long)c[i].row_begin, c[i].layer, c[i].kv_head);
    remote_store *s = &r->stores[owner];
    if ((rc = ra_kvclient_put_clusters(s->client, &s->session, &c[i], NULL, err)) != RA_OK)
      return remote_fail(r, store_failed(s, rc), err);
  }
  return rc;
}

int ra_remote_build_index_start(ra_remote *r, uint32_t layer, uint32_t q_head, const ra_kvclient_build_input *in,
                                ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (layer >= r->plan->n_layers || q_head >= r->plan->n_q_heads)
    return ra_errorf(err, RA_EINVAL, "remote: layer %u q head %u out of range", layer, q_head);
  /* ivf and kgraph learn from the keys alone: one index per kv head serves its whole group. */
  int key_only = r->cfg.mode == RA_MODE_IVF || r->cfg.mode == RA_MODE_KGRAPH;
  ra_index_spec params = {.kind = r->cfg.mode,
                          .per_kv_head = key_only || (r->cfg.mode == RA_MODE_ROAR && r->cfg.roar_per_kv_head)};
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (!ra_offload_plan_asks(r->plan, i, layer, q_head)) continue;
    if (r->n_builds == r->cap_builds) {
      size_t cap = r->cap_builds ? 2 * r->cap_builds : 64;
      ra_kvclient_build **nb = realloc(r->builds, cap * sizeof *nb);
      if (nb) r->builds = nb;
      remote_store **ns = nb ? realloc(r->build_store, cap * sizeof *ns) : NULL;
      if (!ns) return ra_errorf(err, RA_ENOMEM, "remote: out of memory for %zu index builds", cap);
      r->build_store = ns;
      r->cap_builds = cap;
    }
    /* the keys it covers here size its deadline (client.h) */
    ra_kvclient_build_input bi = in ? *in : (ra_kvclient_build_input){0};
    bi.n_keys = s->head_tokens[(size_t)layer * r->plan->n_kv_heads + q_head / (r->plan->n_q_heads / r->plan->n_kv_heads)];
    rc = ra_kvclient_build_index_start(s->client, &s->session, layer, q_head, &params, &bi, &r->builds[r->n_builds],
                                       err);
    if (rc == RA_OK) r->build_store[r->n_builds++] = s;
    else store_failed(s, rc);
  }
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

int ra_remote_build_index_wait_older(ra_remote *r, size_t keep, ra_error *err) {
  int rc = RA_OK;
  const size_t n_old = keep < r->n_builds ? r->n_builds - keep : 0;
  for (size_t i = 0; i < n_old; i++) {
    ra_error e;
    int one = store_failed(r->build_store[i], ra_kvclient_build_index_wait(r->builds[i], NULL, &e));
    if (one && rc == RA_OK) {
      rc = one;
      *err = e;
    }
  }
  if (n_old) {
    memmove(r->builds, r->builds + n_old, (r->n_builds - n_old) * sizeof *r->builds);
    memmove(r->build_store, r->build_store + n_old, (r->n_builds - n_old) * sizeof *r->build_store);
    r->n_builds -= n_old;
  }
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

int ra_remote_build_index_wait(ra_remote *r, ra_error *err) { return ra_remote_build_index_wait_older(r, 0, err); }

size_t ra_remote_builds_in_flight(const ra_remote *r) { return r->n_builds; }

int ra_remote_build_index(ra_remote *r, uint32_t layer, uint32_t q_head, const ra_kvclient_build_input *in,
                          ra_error *err) {
  int rc = ra_remote_build_index_start(r, layer, q_head, in, err);
  ra_error e;
  int wrc = ra_remote_build_index_wait(r, rc ? &e : err);
  return rc ? rc : wrc;
}

int ra_remote_append(ra_remote *r, uint64_t pos, const float *k, const float *v, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  const ra_offload_plan *p = r->plan;
  size_t hd = r->head_dim, row_bytes = ra_dtype_size(r->cfg.dtype) * hd;
  size_t n_heads = (size_t)p->n_layers * p->n_kv_heads;
  if ((rc = reserve_pack(r, 2 * n_heads * row_bytes, err)) != RA_OK) return rc;
  for (size_t i = 0; i < r->n_stores; i++) r->stores[i].n_rows = 0;
  for (uint32_t l = 0; l < p->n_layers && rc == RA_OK; l++) {
    for (uint32_t g = 0; g < p->n_kv_heads; g++) {
      int owner = ra_offload_plan_owner(p, l, g, pos);
      if (owner < 0) return ra_errorf(err, RA_EINTERNAL, "remote: position %llu of layer %u kv head %u has no owner",
                                      (unsigned long long)pos, l, g);
      size_t at = (size_t)l * p->n_kv_heads + g;
      uint8_t *kd = r->pack + 2 * at * row_bytes, *vd = kd + row_bytes;
      ra_dtype_from_fp32_n(r->cfg.dtype, k + at * hd, kd, hd);
      ra_dtype_from_fp32_n(r->cfg.dtype, v + at * hd, vd, hd);
      remote_store *s = &r->stores[owner];
      s->rows[s->n_rows++] = (ra_kvclient_rows){l, g, pos, 1, kd, vd};
    }
  }
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (s->n_rows) rc = store_failed(s, ra_kvclient_append(s->client, &s->session, s->rows, s->n_rows, err));
    for (size_t j = 0; rc == RA_OK && j < s->n_rows; j++)
      s->head_tokens[(size_t)s->rows[j].layer * p->n_kv_heads + s->rows[j].kv_head] += s->rows[j].n_tokens;
  }
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

/* sel: NULL, or wave mode's selection per store. */
static int attend_begin(ra_remote *r, uint32_t layer, const float *q, const ra_remote_wave_sel *sel, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  const ra_offload_plan *p = r->plan;
  if (layer >= p->n_layers) return ra_errorf(err, RA_EINVAL, "remote: layer %u out of range", layer);
  if (r->in_flight) return ra_errorf(err, RA_ESTATE, "remote: an attend is already in flight");
  size_t hd = r->head_dim;
  r->t_begin = uv_hrtime();
  /* Every store of the layer gets its request before any reply is awaited: the stores work
   * in parallel and the step waits for the slowest, not the sum. */
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    s->req.n_heads = 0;
    if (!s->plan->n_asked[layer]) continue;
    size_t n = 0;
    for (uint32_t h = 0; h < p->n_q_heads; h++) {
      if (!ra_offload_plan_asks(p, i, layer, h)) continue;
      s->heads[n] = h;
      memcpy(s->q + n * hd, q + (size_t)h * hd, hd * sizeof(float));
      s->parts[n] = (ra_head_partial){.part.o = s->o + n * hd};
      n++;
    }
    s->req = (ra_kvclient_attend_req){.layer = layer, .q_heads = s->heads, .n_heads = n, .q = s->q,
                                      .mode = r->cfg.mode, .top_k = r->cfg.top_k, .search = r->cfg.search};
    if (sel) {
      s->req.cluster_kv_heads = sel[i].kv_heads;
      s->req.cluster_counts = sel[i].counts;
      s->req.n_cluster_heads = sel[i].n_heads;
      s->req.clusters = sel[i].clusters;
    }
    rc = store_failed(s, ra_kvclient_attend_send(s->stream, &s->req, err));
  }
  if (rc) return remote_fail(r, rc, err);
  r->in_flight = 1;
  return RA_OK;
}

int ra_remote_attend_begin(ra_remote *r, uint32_t layer, const float *q, ra_error *err) {
  return attend_begin(r, layer, q, NULL, err);
}

int ra_remote_attend_begin_wave(ra_remote *r, uint32_t layer, const float *q, const ra_remote_wave_sel *sel,
                                ra_error *err) {
  if (!sel) return ra_errorf(err, RA_EINVAL, "remote: a wave attend needs its selection");
  return attend_begin(r, layer, q, sel, err);
}

int ra_remote_attend_end(ra_remote *r, float *o, float *ml, ra_remote_stats *stats, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (!r->in_flight) return ra_errorf(err, RA_ESTATE, "remote: no attend in flight");
  r->in_flight = 0;
  const ra_offload_plan *p = r->plan;
  size_t hd = r->head_dim;
  ra_partial *acc = r->acc;
  for (uint32_t h = 0; h < p->n_q_heads; h++) {
    acc[h].o = o + h * hd;
    ra_partial_reset(&acc[h], (int)hd);
  }
  ra_remote_stats st = {0};
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (!s->req.n_heads) continue;
    uint64_t compute_us = 0;
    rc = store_failed(s, ra_kvclient_attend_recv(s->stream, &s->req, s->parts, r->cfg.timeout_ms, &compute_us, err));
    if (rc) break;
    if ((double)compute_us > st.store_us) st.store_us = (double)compute_us;
    for (size_t j = 0; j < s->req.n_heads; j++) {
      const ra_head_partial *pt = &s->parts[j];
      ra_partial_merge_from(&acc[s->heads[j]], &pt->part, (int)hd);
      st.n_scanned += pt->n_scanned;
      st.n_keys += pt->n_keys;
    }
  }
  st.wait_us = (double)(uv_hrtime() - r->t_begin) / 1e3;
  for (uint32_t h = 0; h < p->n_q_heads; h++) {
    ml[2 * h] = acc[h].m;
    ml[2 * h + 1] = acc[h].l;
  }
  if (rc) return remote_fail(r, rc, err);
  if (stats) *stats = st;
  return RA_OK;
}

int ra_remote_attend(ra_remote *r, uint32_t layer, const float *q, float *o, float *ml,
                     ra_remote_stats *stats, ra_error *err) {
  int rc = ra_remote_attend_begin(r, layer, q, err);
  return rc ? rc : ra_remote_attend_end(r, o, ml, stats, err);
}
