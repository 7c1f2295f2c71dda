#include "remote.h"

#include "log.h"
#include "remote_batch.h"
#include "merge.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* PutKv streams a put sends to one store at once, each on a connection of its own (remote_put):
 * one store ingested 1.00 GB/s from one stream and 1.20 GB/s from four on the H200 host
 * (bench/results/h200/kvstore-ingest/), and the four pack their rows in parallel. */
#define RA_REMOTE_PUT_LANES 4

/* What the remote keeps per store: the connection, the session, the Attend stream, the buffers
 * of one decode step's requests (its asked q heads, their q, the partials coming back; a step
 * may send a store a second request when another owner failed) and its health. */
typedef struct remote_store {
  const ra_plan_store *plan;
  char addr[RA_ADDR_MAX];      /* where it is: the plan's store, or the spare that replaced it */
  char replaced[RA_ADDR_MAX];  /* the plan's store a spare replaced ("": none) */
  ra_kvclient *client;
  ra_kvclient_session session;
  int session_open;
  ra_kvclient_stream *stream;
  ra_kvclient_append_call *append; /* the step's append while in flight */
  int append_rc;
  ra_error append_err;
  uint32_t *heads;             /* [n_q_heads]: the q heads sent this step, in order */
  float *q;                    /* [n_q_heads, head_dim] */
  float *o;                    /* [n_q_heads, head_dim] */
  ra_head_partial *parts;      /* [n_q_heads] */
  float *rq, *ro;              /* retro: [retro_window, n_q_heads, head_dim] past queries, partials */
  ra_head_partial *rparts;     /* retro: [retro_window, n_q_heads], the request in flight's */
  int32_t *slot;               /* [n_q_heads]: head h's index in heads this step, -1: not sent */
  size_t n_heads;              /* heads sent this step */
  size_t req_begin;            /* the request in flight asks heads [req_begin, n_heads) */
  int pending;                 /* a request is in flight */
  ra_kvclient_attend_req req;  /* the request in flight */
  ra_remote_batch *batch;      /* the request went through this batch (ticket), not the stream */
  ra_remote_batch_ticket ticket;
  ra_kvclient_rows *rows;      /* [n_shards + n_layers * n_kv_heads]: put / append blocks */
  size_t n_rows;               /* blocks staged in rows */
  uint64_t tokens;             /* rows this store acknowledged (puts and appends) */
  uint64_t held;               /* rows the store reported when it was reattached */
  int down;                    /* failed: its rules go on at their other owners */
  ra_error why;                /* what failed it */
  uint32_t reconnects;         /* times it came back (reattached) */
  uint64_t *head_tokens;       /* [n_layers * n_kv_heads] tokens sent here: an index build's deadline */
  int unreachable;             /* a call timed out or lost the connection: close skips the store */
  ra_kvclient *lanes[RA_REMOTE_PUT_LANES - 1]; /* puts' further connections (remote_put) */
} remote_store;

static void lanes_close(remote_store *s) {
  for (size_t l = 0; l + 1 < RA_REMOTE_PUT_LANES; l++) {
    if (s->lanes[l]) ra_kvclient_close(s->lanes[l]);
    s->lanes[l] = NULL;
  }
}

struct ra_remote {
  const ra_offload_plan *plan;
  ra_remote_config cfg;
  uint32_t head_dim;
  remote_store *stores;
  size_t n_stores;
  uint8_t *down;   /* [n_stores]: stores[i].down, the layout ra_offload_plan_choose takes */
  uint8_t *asked;  /* [n_stores, n_q_heads]: this step's choice of owners */
  uint64_t *merged; /* [n_stores]: merge_gen when the store's partial of the head being merged
                       was taken (a store owning several rules of a kv head is merged once) */
  uint64_t merge_gen;
  uint8_t *pack;   /* put / append staging in the session dtype */
  size_t pack_cap; /* bytes */
  int failed;      /* a store failed and no owner was left: no more steps (see remote.h) */
  ra_error failure;
  int in_flight;   /* attend_begin sent, attend_end not yet called */
  uint32_t layer;  /* of the attend in flight */
  const ra_remote_wave_sel *sel; /* wave: its selection (the caller's, valid until attend_end) */
  ra_kvclient_options store_opt; /* the options of every connection to a store */
  ra_remote_batch *via_next; /* ra_remote_attend_via: the next attend's batch */
  ra_remote_batch *via;      /* the attend in flight's batch (NULL: the stores' own streams, and
                                after a failure: what is sent again goes on them) */
  ra_kvclient_build **builds; /* index builds started, not yet waited for */
  size_t *build_store;        /* [cap_builds]: the store of each */
  size_t n_builds, cap_builds;
  int keep_sessions; /* close leaves the sessions on the stores (a saved context) */
  size_t next_spare; /* cfg.spares[next_spare] is the next spare to take */
  uint64_t pos_end;  /* positions [n_sink, pos_end) have been written to the stores */
  uint64_t append_pos; /* the append in flight (appending), between ra_remote_append_start and _wait */
  int appending;
  uint64_t t_begin;
  ra_partial *acc; /* [n_q_heads] merge accumulators */
  float *q_step;   /* [n_q_heads, head_dim]: the attend's q, for heads sent again to another owner */
  /* retro: the attend in flight's step and past queries ([n_past, n_q_heads, head_dim], the
   * caller's), and the past partials merged as replies come */
  uint64_t retro_step;
  uint32_t n_past;
  const float *q_past;
  ra_partial *racc; /* [retro_window, n_q_heads] */
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

static void sleep_ms(unsigned ms) { uv_sleep(ms); }

/* Connects to store s and reattaches its session (a store restarted from --data-dir, or a
 * connection that broke), retrying for up to cfg.reconnect_ms. s->held gets the rows the store
 * reports. */
static int store_reconnect(ra_remote *r, remote_store *s, ra_error *err) {
  if (s->stream) ra_kvclient_attend_close(s->stream);
  s->stream = NULL;
  if (s->client) ra_kvclient_close(s->client);
  s->client = NULL;
  lanes_close(s);
  uint64_t t0 = uv_hrtime(), limit = (uint64_t)r->cfg.reconnect_ms * 1000000u;
  int rc;
  do {
    int serving = 0;
    rc = ra_kvclient_connect(s->addr, &r->store_opt, &s->client, err);
    if (rc == RA_OK) rc = ra_kvclient_health(s->client, &serving, err);
    if (rc == RA_OK && !serving) rc = ra_errorf(err, RA_EUNAVAIL, "%s: store is not serving", s->addr);
    if (rc == RA_OK) rc = ra_kvclient_resume_session(s->client, s->session.id, &s->session.geo, &s->session, &s->held, err);
    if (rc == RA_OK) rc = ra_kvclient_attend_open(s->client, &s->session, &s->stream, err);
    if (rc == RA_OK) {
      s->reconnects++;
      s->unreachable = 0;
      ra_log_warn("store %s back after %.0f ms: session reattached with %llu rows", s->addr,
                  (double)(uv_hrtime() - t0) / 1e6, (unsigned long long)s->held);
      return RA_OK;
    }
    if (s->client) ra_kvclient_close(s->client);
    s->client = NULL;
    /* a store that answers but lost the session will not get it back by waiting */
    if (rc == RA_ENOTFOUND) break;
    sleep_ms(100);
  } while (uv_hrtime() - t0 < limit);
  return ra_error_wrap(err, "%s: no reattach within %d ms", s->addr, r->cfg.reconnect_ms);
}

/* Store i failed an operation with e. Returns RA_OK when the remote goes on: marked down with
 * every rule still owned by a live store (its shards go on at their replicas), or -- when its
 * rules have no other owner and cfg.reconnect_ms is set -- reconnected and its session
 * reattached (*back = 1: the caller checks s->held and redoes its operation there; back NULL:
 * no reattach, as in a prefill, which is not resumed). Otherwise the failure, recorded: the
 * remote takes no more steps. */
static int store_failed(ra_remote *r, size_t i, const ra_error *e, int *back, ra_error *err) {
  remote_store *s = &r->stores[i];
  ra_error why = *e;
  if (back) *back = 0;
  s->pending = 0;
  /* one that stopped answering is not waited for again at close */
  if (e->code == RA_ETIMEDOUT || e->code == RA_EUNAVAIL || e->code == RA_ECANCELED) s->unreachable = 1;
  r->down[i] = 1;
  ra_error cover;
  if (r->plan->max_owners > 1 && ra_offload_plan_covered(r->plan, r->down, &cover) == RA_OK) {
    s->down = 1;
    s->why = why;
    if (s->stream) ra_kvclient_attend_close(s->stream);
    s->stream = NULL;
    ra_log_warn("store %s marked down, its shards go on at their other owners: %s", s->addr, why.msg);
    return RA_OK;
  }
  r->down[i] = 0;
  if (back && r->cfg.reconnect_ms > 0 && s->session_open) {
    ra_log_warn("store %s failed (%s); reattaching its session", s->addr, why.msg);
    ra_error rerr;
    if (store_reconnect(r, s, &rerr) == RA_OK) {
      *back = 1;
      return RA_OK;
    }
    ra_errorf(&why, e->code, "%s; %s", e->msg, rerr.msg);
  }
  *err = why;
  return remote_fail(r, why.code ? why.code : RA_EUNAVAIL, &why);
}

/* After store s came back: RA_OK when it holds what it acknowledged (plus `extra` rows when
 * the failed write may have landed: *landed says whether it did). */
static int store_check_held(const remote_store *s, uint64_t extra, int *landed, ra_error *err) {
  *landed = extra && s->held == s->tokens + extra;
  if (s->held == s->tokens || *landed) return RA_OK;
  return ra_errorf(err, RA_EINTERNAL, "%s came back with %llu rows of the session, the worker wrote %llu: data lost",
                   s->addr, (unsigned long long)s->held, (unsigned long long)s->tokens);
}

static int reserve_pack(ra_remote *r, size_t bytes, ra_error *err) {
  if (bytes <= r->pack_cap) return RA_OK;
  uint8_t *p = realloc(r->pack, bytes);
  if (!p) return ra_errorf(err, RA_ENOMEM, "remote: out of memory for %zu bytes of KV", bytes);
  r->pack = p;
  r->pack_cap = bytes;
  return RA_OK;
}

/* resume: NULL to open a new session, else the one to reattach and the rows it must hold. */
static int store_open(ra_remote *r, remote_store *s, const ra_remote_session *resume, ra_error *err) {
  const ra_offload_plan *p = r->plan;
  size_t nq = p->n_q_heads, hd = r->head_dim;
  size_t n_rows = s->plan->n_shards + (size_t)p->n_layers * p->n_kv_heads;
  s->heads = calloc(nq, sizeof *s->heads);
  s->q = calloc(nq * hd, sizeof *s->q);
  s->o = calloc(nq * hd, sizeof *s->o);
  s->parts = calloc(nq, sizeof *s->parts);
  s->rows = calloc(n_rows, sizeof *s->rows);
  s->slot = malloc(nq * sizeof *s->slot);
  size_t nr = (size_t)r->cfg.retro_window * nq;
  s->rq = calloc(nr * hd + 1, sizeof *s->rq);
  s->ro = calloc(nr * hd + 1, sizeof *s->ro);
  s->rparts = calloc(nr + 1, sizeof *s->rparts);
  s->head_tokens = calloc((size_t)p->n_layers * p->n_kv_heads, sizeof *s->head_tokens);
  ra_kvclient_shard *shards = calloc(s->plan->n_shards + 1, sizeof *shards);
  if (!s->heads || !s->q || !s->o || !s->parts || !s->rows || !s->slot || !s->rq || !s->ro || !s->rparts ||
      !s->head_tokens || !shards) {
    free(shards);
    return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  }
  for (size_t i = 0; i < s->plan->n_shards; i++) {
    const ra_plan_shard *sh = &s->plan->shards[i];
    shards[i] = (ra_kvclient_shard){sh->layer, sh->kv_head, sh->token_begin, sh->token_end};
  }
  ra_kvclient_geometry geo = {p->n_layers, p->n_q_heads, p->n_kv_heads, r->head_dim, r->cfg.dtype};
  int serving = 0;
  int rc = ra_kvclient_connect(s->addr, &r->store_opt, &s->client, err);
  if (rc == RA_OK) rc = ra_kvclient_health(s->client, &serving, err);
  if (rc == RA_OK && !serving) rc = ra_errorf(err, RA_EUNAVAIL, "%s: store is not serving", s->addr);
  if (rc == RA_OK && resume) {
    rc = ra_kvclient_resume_session(s->client, resume->id, &geo, &s->session, &s->held, err);
    s->tokens = resume->tokens;
    int landed;
    if (rc == RA_OK) rc = store_check_held(s, 0, &landed, err);
  } else if (rc == RA_OK) {
    rc = ra_kvclient_open_session(s->client, &geo, shards, s->plan->n_shards,
                                  r->cfg.client_name ? r->cfg.client_name : "gpu-worker", &s->session, err);
  }
  if (rc == RA_OK) s->session_open = 1;
  if (rc == RA_OK) rc = ra_kvclient_attend_open(s->client, &s->session, &s->stream, err);
  free(shards);
  return rc;
}

static void store_close(remote_store *s, int keep_session) {
  ra_error err;
  if (s->stream && !s->unreachable) ra_kvclient_attend_close(s->stream);
  else if (s->stream) ra_kvclient_attend_abort(s->stream);
  /* a down or unreachable store is not waited for (its lease expires the session) */
  if (s->session_open && !s->down && !s->unreachable && !keep_session)
    ra_kvclient_close_session(s->client, &s->session, NULL, &err);
  if (s->client) ra_kvclient_close(s->client);
  lanes_close(s);
  free(s->heads);
  free(s->q);
  free(s->o);
  free(s->parts);
  free(s->rows);
  free(s->slot);
  free(s->rq);
  free(s->ro);
  free(s->rparts);
  free(s->head_tokens);
}

void ra_remote_close(ra_remote *r) {
  if (!r) return;
  ra_error ignored;
  ra_remote_build_index_wait(r, &ignored);
  free(r->builds);
  free(r->build_store);
  for (size_t i = 0; i < r->n_stores; i++) store_close(&r->stores[i], r->keep_sessions);
  free(r->stores);
  free(r->down);
  free(r->asked);
  free(r->merged);
  free(r->pack);
  free(r->acc);
  free(r->q_step);
  free(r->racc);
  free(r);
}

int ra_remote_open(const ra_offload_plan *plan, uint32_t head_dim, const ra_remote_config *cfg,
                   ra_remote **out, ra_error *err) {
  *out = NULL;
  if (head_dim == 0 || ra_dtype_row_bytes(cfg->dtype, head_dim) == 0)
    return ra_errorf(err, RA_EINVAL, "remote: bad head_dim %u or dtype", head_dim);
  ra_remote *r = calloc(1, sizeof *r);
  if (!r) return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  r->plan = plan;
  r->cfg = *cfg;
  /* every connection to a store: the caller's security, the remote's deadline; a lost store is
   * reconnected on a new channel (store_reconnect) */
  r->store_opt = cfg->client;
  r->store_opt.timeout_ms = cfg->timeout_ms;
  r->store_opt.fail_after_loss = 1;
  if (r->cfg.timeout_ms <= 0) r->cfg.timeout_ms = 10000;
  r->head_dim = head_dim;
  r->n_stores = plan->n_stores;
  r->stores = calloc(plan->n_stores, sizeof *r->stores);
  r->acc = calloc(plan->n_q_heads, sizeof *r->acc);
  r->down = calloc(plan->n_stores, 1);
  r->asked = calloc(plan->n_stores * plan->n_q_heads, 1);
  r->merged = calloc(plan->n_stores, sizeof *r->merged);
  r->q_step = calloc((size_t)plan->n_q_heads * head_dim, sizeof *r->q_step);
  r->racc = calloc((size_t)cfg->retro_window * plan->n_q_heads + 1, sizeof *r->racc);
  if (!r->stores || !r->acc || !r->down || !r->asked || !r->merged || !r->q_step || !r->racc) {
    if (!r->stores) r->n_stores = 0;
    ra_remote_close(r);
    return ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  }
  int rc = RA_OK;
  for (size_t i = 0; i < plan->n_stores; i++) {
    r->stores[i].plan = &plan->stores[i];
    snprintf(r->stores[i].addr, sizeof r->stores[i].addr, "%s", plan->stores[i].addr);
  }
  for (size_t i = 0; i < plan->n_stores && rc == RA_OK; i++) {
    if (plan->stores[i].n_shards == 0) continue;
    ra_error e;
    /* a store that cannot open its session is down from the start when replicas cover it */
    if (store_open(r, &r->stores[i], cfg->resume ? &cfg->resume[i] : NULL, &e) != RA_OK)
      rc = store_failed(r, i, &e, NULL, err);
  }
  if (rc != RA_OK) {
    ra_remote_close(r);
    return rc;
  }
  *out = r;
  return RA_OK;
}

/* Converts one K or V row (head_dim floats) of (layer, kv head g) at position pos into dst in
 * the session dtype: int8 quantizes it here, before the wire, and refuses a non-finite row. */
static int pack_row(const ra_remote *r, const float *x, uint32_t layer, uint32_t g, uint64_t pos, const char *what,
                    uint8_t *dst, ra_error *err) {
  if (ra_dtype_rows_from_fp32(r->cfg.dtype, x, dst, 1, r->head_dim, NULL) == RA_OK) return RA_OK;
  return ra_errorf(err, RA_EINVAL,
                   "remote: the %s of layer %u kv head %u position %llu is not finite (inf or NaN): it has "
                   "no %s form",
                   what, layer, g, (unsigned long long)pos, ra_dtype_name(r->cfg.dtype));
}

/* Gathers rows [b, e) of kv head g from x (first row = position pos0) into dst as
 * [e - b, head_dim] in the session dtype. x: [n, n_kv_heads, head_dim], or head-major
 * [n_kv_heads, n, head_dim] (n rows per head). */
static int pack_head(const ra_remote *r, const float *x, int head_major, uint64_t n, uint64_t pos0, uint32_t layer,
                     uint32_t g, uint64_t b, uint64_t e, const char *what, uint8_t *dst, ra_error *err) {
  size_t hd = r->head_dim, rb = ra_dtype_row_bytes(r->cfg.dtype, hd), nkv = r->plan->n_kv_heads;
  int rc = RA_OK;
  for (uint64_t t = b; t < e && rc == RA_OK; t++) {
    size_t at = head_major ? (size_t)g * n + (t - pos0) : (t - pos0) * nkv + g;
    rc = pack_row(r, x + at * hd, layer, g, t, what, dst + (t - b) * rb, err);
  }
  return rc;
}

/* One PutKv stream of a put: some of one store's shards of the layer, packed into its own slice
 * of the staging buffer and sent on the store's lane-th connection. */
typedef struct put_part {
  ra_remote *r;
  remote_store *s;
  size_t store;
  uint32_t lane, lanes; /* this part's lane of the store's lanes in the put */
  uint32_t layer;
  const void *k, *v;      /* fp32, or (raw) head-major rows in the session dtype */
  int head_major, raw;
  uint64_t pos0, end;
  uint8_t *dst;           /* this part's slice (raw: unused, the rows go from k, v as they are) */
  ra_kvclient_rows *rows; /* [the store's shards]: the blocks packed */
  size_t n_rows;
  int rc;
  ra_error err;
} put_part;

/* The store's shard j holds rows of layer within [pos0, end): *b, *e are their bounds. */
static int shard_in_put(const remote_store *s, size_t j, uint32_t layer, uint64_t pos0, uint64_t end, uint64_t *b,
                        uint64_t *e) {
  const ra_plan_shard *sh = &s->plan->shards[j];
  *b = sh->token_begin > pos0 ? sh->token_begin : pos0;
  *e = sh->token_end < end ? sh->token_end : end;
  return sh->layer == layer && *b < *e;
}

/* The lanes a put of layer's [pos0, end) uses at store s (one per shard it touches, at most
 * RA_REMOTE_PUT_LANES), and the bytes of lane `lane` (K and V; lane < 0: all lanes) in the
 * session dtype. Shard j of the layer's touched ones goes to lane (its ordinal mod the lanes). */
static uint32_t put_lanes(const ra_remote *r, const remote_store *s, uint32_t layer, uint64_t pos0, uint64_t end,
                          int lane, size_t *bytes) {
  size_t row_bytes = ra_dtype_row_bytes(r->cfg.dtype, r->head_dim), touched = 0;
  uint64_t b, e;
  for (size_t j = 0; j < s->plan->n_shards; j++) touched += shard_in_put(s, j, layer, pos0, end, &b, &e);
  uint32_t lanes = touched < RA_REMOTE_PUT_LANES ? (uint32_t)touched : RA_REMOTE_PUT_LANES;
  *bytes = 0;
  for (size_t j = 0, ord = 0; j < s->plan->n_shards; j++)
    if (shard_in_put(s, j, layer, pos0, end, &b, &e) && (lane < 0 || ord++ % lanes == (size_t)lane))
      *bytes += 2 * (e - b) * row_bytes;
  return lanes;
}

/* The store's connection for lane l: lane 0 is its own, the others are opened on first use
 * (each stream on a connection of its own, so that the store reads them in parallel). */
static int lane_client(ra_remote *r, remote_store *s, uint32_t l, ra_kvclient **out, ra_error *err) {
  if (l == 0) {
    *out = s->client;
    return RA_OK;
  }
  if (!s->lanes[l - 1]) {
    int rc = ra_kvclient_connect(s->addr, &r->store_opt, &s->lanes[l - 1], err);
    if (rc) return rc;
  }
  *out = s->lanes[l - 1];
  return RA_OK;
}

static void put_part_run(void *arg) {
  put_part *p = arg;
  ra_remote *r = p->r;
  remote_store *s = p->s;
  size_t row_bytes = ra_dtype_row_bytes(r->cfg.dtype, r->head_dim);
  const uint32_t lanes = p->lanes;
  uint8_t *dst = p->dst;
  uint64_t b, e;
  for (size_t j = 0, ord = 0; j < s->plan->n_shards; j++) {
    if (!shard_in_put(s, j, p->layer, p->pos0, p->end, &b, &e) || ord++ % lanes != p->lane) continue;
    const uint32_t g = s->plan->shards[j].kv_head;
    if (p->raw) { /* kv head g's rows [b, e) lie together in head-major rows */
      const size_t at = ((size_t)g * (p->end - p->pos0) + (b - p->pos0)) * row_bytes;
      p->rows[p->n_rows++] =
          (ra_kvclient_rows){p->layer, g, b, e - b, (const uint8_t *)p->k + at, (const uint8_t *)p->v + at};
      continue;
    }
    uint8_t *kd = dst, *vd = dst + (e - b) * row_bytes;
    if ((p->rc = pack_head(r, p->k, p->head_major, p->end - p->pos0, p->pos0, p->layer, g, b, e, "key", kd,
                           &p->err)) ||
        (p->rc = pack_head(r, p->v, p->head_major, p->end - p->pos0, p->pos0, p->layer, g, b, e, "value", vd,
                           &p->err)))
      return;
    dst = vd + (e - b) * row_bytes;
    p->rows[p->n_rows++] = (ra_kvclient_rows){p->layer, g, b, e - b, kd, vd};
  }
  ra_kvclient *c = NULL;
  p->rc = lane_client(r, s, p->lane, &c, &p->err);
  if (p->rc == RA_OK) p->rc = ra_kvclient_put_kv(c, &s->session, p->rows, p->n_rows, NULL, &p->err);
}

static int remote_put(ra_remote *r, uint32_t layer, const void *k, const void *v, ra_dtype dt, int head_major,
                      uint64_t pos0, uint64_t n, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (layer >= r->plan->n_layers) return ra_errorf(err, RA_EINVAL, "remote: layer %u out of range", layer);
  /* rows already in the session dtype go out as they are: no staging copy, no conversion */
  const int raw = head_major && dt == r->cfg.dtype && dt != RA_DTYPE_F32;
  if (!raw && dt != RA_DTYPE_F32)
    return ra_errorf(err, RA_EINVAL, "remote: rows in %s for a session in %s (fp32 or the session's own)",
                     ra_dtype_name(dt), ra_dtype_name(r->cfg.dtype));
  /* Every store's shards go out on up to RA_REMOTE_PUT_LANES streams at once, each packed and
   * sent by a thread of its own: the stores ingest in parallel (one stream a store at a time,
   * a 128K-token layer of Llama-3-8B geometry took as long as the layer's compute on the H200),
   * and so do a store's lanes. Each owner of a shard gets its own copy, in its own slice of the
   * staging buffer. */
  size_t n_parts = 0, n_shards = 0, total = 0;
  for (size_t i = 0; i < r->n_stores; i++) {
    if (r->stores[i].down) continue;
    size_t bytes;
    const uint32_t lanes = put_lanes(r, &r->stores[i], layer, pos0, pos0 + n, -1, &bytes);
    n_parts += lanes;
    n_shards += lanes * r->stores[i].plan->n_shards; /* a lane packs at most all the store's shards */
    total += raw ? 0 : bytes;
  }
  put_part *parts = calloc(n_parts + 1, sizeof *parts);
  ra_kvclient_rows *rows = calloc(n_shards + 1, sizeof *rows);
  uv_thread_t *th = calloc(n_parts + 1, sizeof *th);
  int *started = calloc(n_parts + 1, sizeof *started);
  if (!parts || !rows || !th || !started) rc = ra_errorf(err, RA_ENOMEM, "remote: out of memory");
  if (rc == RA_OK) rc = reserve_pack(r, total, err);
  size_t np = 0, off = 0, row0 = 0;
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (s->down) continue;
    size_t bytes;
    const uint32_t lanes = put_lanes(r, s, layer, pos0, pos0 + n, -1, &bytes);
    for (uint32_t l = 0; l < lanes; l++) {
      put_lanes(r, s, layer, pos0, pos0 + n, (int)l, &bytes);
      parts[np++] = (put_part){.r = r, .s = s, .store = i, .lane = l, .lanes = lanes, .layer = layer, .k = k, .v = v,
                               .head_major = head_major, .raw = raw, .pos0 = pos0, .end = pos0 + n,
                               .dst = raw ? NULL : r->pack + off, .rows = rows + row0};
      off += raw ? 0 : bytes;
      row0 += s->plan->n_shards;
    }
  }
  /* part 0 on this thread; a part whose thread cannot start also runs here */
  for (size_t i = 1; i < np && rc == RA_OK; i++) started[i] = uv_thread_create(&th[i], put_part_run, &parts[i]) == 0;
  for (size_t i = 0; i < np && rc == RA_OK; i++)
    if (i == 0 || !started[i]) put_part_run(&parts[i]);
  for (size_t i = 1; i < np; i++)
    if (started[i]) uv_thread_join(&th[i]);
  /* a failed owner is marked down when the shard has others (a prefill is not resumed) */
  for (size_t i = 0; i < np && rc == RA_OK; i++) {
    remote_store *s = parts[i].s;
    if (parts[i].rc != RA_OK) {
      if (!s->down) rc = store_failed(r, parts[i].store, &parts[i].err, NULL, err);
      continue;
    }
    for (size_t j = 0; j < parts[i].n_rows; j++) {
      s->tokens += parts[i].rows[j].n_tokens;
      s->head_tokens[(size_t)layer * r->plan->n_kv_heads + parts[i].rows[j].kv_head] += parts[i].rows[j].n_tokens;
    }
  }
  free(parts);
  free(rows);
  free(th);
  free(started);
  if (rc == RA_OK && pos0 + n > r->pos_end) r->pos_end = pos0 + n;
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

int ra_remote_put(ra_remote *r, uint32_t layer, const float *k, const float *v, uint64_t pos0,
                  uint64_t n, ra_error *err) {
  return remote_put(r, layer, k, v, RA_DTYPE_F32, 0, pos0, n, err);
}

int ra_remote_put_heads(ra_remote *r, uint32_t layer, const void *k, const void *v, ra_dtype dt, uint64_t pos0,
                        uint64_t n, ra_error *err) {
  return remote_put(r, layer, k, v, dt, 1, pos0, n, err);
}

int ra_remote_put_clusters(ra_remote *r, const ra_kvclient_clusters *c, size_t n, ra_error *err) {
  int rc = remote_check(r, err);
  for (size_t i = 0; i < n && rc == RA_OK; i++) {
    if (c[i].layer >= r->plan->n_layers || c[i].kv_head >= r->plan->n_kv_heads)
      return ra_errorf(err, RA_EINVAL, "remote: clusters of layer %u kv head %u out of range", c[i].layer,
                       c[i].kv_head);
    const ra_shard_rule *rule = ra_offload_plan_rule(r->plan, c[i].layer, c[i].kv_head, c[i].row_begin);
    if (!rule)
      return ra_errorf(err, RA_EINTERNAL, "remote: position %llu of layer %u kv head %u has no owner",
                       (unsigned long long)c[i].row_begin, c[i].layer, c[i].kv_head);
    for (uint32_t j = 0; j < rule->n_owners && rc == RA_OK; j++) {
      remote_store *s = &r->stores[rule->owners[j]];
      if (s->down) continue;
      ra_error e;
      if (ra_kvclient_put_clusters(s->client, &s->session, &c[i], NULL, &e) != RA_OK)
        rc = store_failed(r, rule->owners[j], &e, NULL, err);
    }
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
  /* every store holding the kv head builds: each owner of a replicated shard has its index */
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (!ra_offload_plan_asks(r->plan, i, layer, q_head) || s->down) continue;
    if (r->n_builds == r->cap_builds) {
      size_t cap = r->cap_builds ? 2 * r->cap_builds : 64;
      ra_kvclient_build **nb = realloc(r->builds, cap * sizeof *nb);
      if (nb) r->builds = nb;
      size_t *ns = nb ? realloc(r->build_store, cap * sizeof *ns) : NULL;
      if (ns) r->build_store = ns;
      if (!nb || !ns) return ra_errorf(err, RA_ENOMEM, "remote: out of memory for %zu index builds", cap);
      r->cap_builds = cap;
    }
    /* the keys it covers here size its deadline (client.h) */
    ra_kvclient_build_input bi = in ? *in : (ra_kvclient_build_input){0};
    bi.n_keys = s->head_tokens[(size_t)layer * r->plan->n_kv_heads + q_head / (r->plan->n_q_heads / r->plan->n_kv_heads)];
    ra_error e;
    if (ra_kvclient_build_index_start(s->client, &s->session, layer, q_head, &params, &bi, &r->builds[r->n_builds],
                                      &e) == RA_OK)
      r->build_store[r->n_builds++] = i;
    else
      rc = store_failed(r, i, &e, NULL, err);
  }
  return rc;
}

int ra_remote_build_index_wait_older(ra_remote *r, size_t keep, ra_error *err) {
  int rc = RA_OK;
  const size_t n_old = keep < r->n_builds ? r->n_builds - keep : 0;
  for (size_t i = 0; i < n_old; i++) {
    ra_error e;
    size_t si = r->build_store[i];
    int one = ra_kvclient_build_index_wait(r->builds[i], NULL, &e);
    if (one && rc == RA_OK && !r->stores[si].down) rc = store_failed(r, si, &e, NULL, err);
  }
  if (n_old) {
    memmove(r->builds, r->builds + n_old, (r->n_builds - n_old) * sizeof *r->builds);
    memmove(r->build_store, r->build_store + n_old, (r->n_builds - n_old) * sizeof *r->build_store);
    r->n_builds -= n_old;
  }
  return rc;
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

/* Spare stores (cfg.spares): a down store's shards are copied to the next spare, which then
 * takes its place. Only between operations (every live owner has every write so far) and with
 * no index build in flight. The rows come from a live owner of each shard's rule (ReadKv, then
 * PutKv to the spare); ivf and kgraph indexes are built again from the keys; roar's build
 * inputs (prefill queries) are not kept by the worker, so a roar remote takes no spare. */
static int store_restore(ra_remote *r, size_t i, const char *addr, ra_error *err) {
  remote_store *s = &r->stores[i];
  const ra_offload_plan *p = r->plan;
  ra_kvclient_geometry geo = s->session.geo;
  ra_kvclient *c = NULL;
  ra_kvclient_session sess;
  ra_kvclient_stream *stream = NULL;
  int serving = 0, opened = 0;
  size_t n_shards = s->plan->n_shards, row_bytes = ra_dtype_row_bytes(geo.dtype, geo.head_dim);
  ra_kvclient_shard *shards = calloc(n_shards, sizeof *shards);
  int rc = shards ? ra_kvclient_connect(addr, &r->store_opt, &c, err) : ra_errorf(err, RA_ENOMEM, "out of memory");
  if (rc == RA_OK) rc = ra_kvclient_health(c, &serving, err);
  if (rc == RA_OK && !serving) rc = ra_errorf(err, RA_EUNAVAIL, "%s: store is not serving", addr);
  for (size_t k = 0; rc == RA_OK && k < n_shards; k++) {
    const ra_plan_shard *sh = &s->plan->shards[k];
    shards[k] = (ra_kvclient_shard){sh->layer, sh->kv_head, sh->token_begin, sh->token_end};
  }
  if (rc == RA_OK) rc = ra_kvclient_open_session(c, &geo, shards, n_shards, r->cfg.client_name, &sess, err);
  opened = rc == RA_OK;
  uint64_t copied = 0;
  const uint64_t piece = 4096;
  if (rc == RA_OK) rc = reserve_pack(r, 2 * piece * row_bytes, err);
  for (size_t k = 0; rc == RA_OK && k < n_shards; k++) {
    const ra_plan_shard *sh = &s->plan->shards[k];
    uint64_t b = sh->token_begin, e = sh->token_end < r->pos_end ? sh->token_end : r->pos_end;
    if (b >= e) continue;
    const ra_shard_rule *rule = ra_offload_plan_rule(p, sh->layer, sh->kv_head, b);
    int src = -1;
    for (uint32_t j = 0; rule && j < rule->n_owners && src < 0; j++)
      if (rule->owners[j] != i && !r->stores[rule->owners[j]].down) src = (int)rule->owners[j];
    if (src < 0) {
      rc = ra_errorf(err, RA_EUNAVAIL, "layer %u kv head %u: no live owner to copy from", sh->layer, sh->kv_head);
      break;
    }
    remote_store *from = &r->stores[src];
    for (uint64_t t = b; rc == RA_OK && t < e; t += piece) {
      uint64_t n = e - t < piece ? e - t : piece;
      uint8_t *kd = r->pack, *vd = r->pack + piece * row_bytes;
      ra_kvclient_rows rows = {sh->layer, sh->kv_head, t, n, kd, vd};
      rc = ra_kvclient_read_kv(from->client, &from->session, sh->layer, sh->kv_head, t, n, kd, vd, err);
      if (rc == RA_OK) rc = ra_kvclient_put_kv(c, &sess, &rows, 1, NULL, err);
      copied += rc == RA_OK ? n : 0;
    }
  }
  if (rc == RA_OK && (r->cfg.mode == RA_MODE_IVF || r->cfg.mode == RA_MODE_KGRAPH)) {
    ra_index_spec params = {.kind = r->cfg.mode, .per_kv_head = 1};
    uint32_t group = p->n_q_heads / p->n_kv_heads;
    for (size_t k = 0; rc == RA_OK && k < n_shards; k++) {
      const ra_plan_shard *sh = &s->plan->shards[k];
      if (k > 0 && sh->layer == s->plan->shards[k - 1].layer && sh->kv_head == s->plan->shards[k - 1].kv_head) continue;
      rc = ra_kvclient_build_index(c, &sess, sh->layer, sh->kv_head * group, &params, NULL, NULL, err);
    }
  }
  if (rc == RA_OK) rc = ra_kvclient_attend_open(c, &sess, &stream, err);
  free(shards);
  if (rc) {
    ra_error ignored;
    if (opened) ra_kvclient_close_session(c, &sess, NULL, &ignored);
    ra_kvclient_close(c);
    return rc;
  }
  if (s->client) ra_kvclient_close(s->client);
  if (!s->replaced[0]) snprintf(s->replaced, sizeof s->replaced, "%s", s->addr);
  ra_log_warn("store %s replaced by spare %s: %llu rows copied from the other owners", s->addr, addr,
              (unsigned long long)copied);
  snprintf(s->addr, sizeof s->addr, "%s", addr);
  s->client = c;
  s->session = sess;
  s->session_open = 1;
  s->stream = stream;
  s->tokens = copied;
  s->down = 0;
  s->unreachable = 0;
  memset(s->head_tokens, 0, (size_t)p->n_layers * p->n_kv_heads * sizeof *s->head_tokens);
  r->down[i] = 0;
  return RA_OK;
}

static void restore_replicas(ra_remote *r) {
  if (r->next_spare >= r->cfg.n_spares || r->n_builds || r->cfg.mode == RA_MODE_ROAR || r->cfg.mode == RA_MODE_WAVE)
    return;
  for (size_t i = 0; i < r->n_stores; i++) {
    while (r->stores[i].down && r->next_spare < r->cfg.n_spares) {
      const char *addr = r->cfg.spares[r->next_spare++];
      ra_error e;
      if (store_restore(r, i, addr, &e) != RA_OK)
        ra_log_warn("spare store %s not used for %s: %s", addr, r->stores[i].addr, e.msg);
    }
  }
}

/* Sends store i its staged append rows; on failure the store is marked down or reattached, and
 * a reattached store gets the rows again unless they had landed before it failed. */
/* Store i took its rows of the step's append. */
static void append_landed(ra_remote *r, size_t i) {
  remote_store *s = &r->stores[i];
  s->tokens += s->n_rows; /* one row per block */
  for (size_t j = 0; j < s->n_rows; j++)
    s->head_tokens[(size_t)s->rows[j].layer * r->plan->n_kv_heads + s->rows[j].kv_head] += s->rows[j].n_tokens;
}

/* Store i's append failed with e: the store is marked down, or reattached and sent the rows
 * again until they land. */
static int append_recover(ra_remote *r, size_t i, ra_error *e, ra_error *err) {
  remote_store *s = &r->stores[i];
  uint64_t n = s->n_rows;
  for (;;) {
    int back, landed, rc = store_failed(r, i, e, &back, err);
    if (rc || !back) return rc;
    if ((rc = store_check_held(s, n, &landed, err)) != RA_OK) return remote_fail(r, rc, err);
    if (landed) {
      s->tokens += n;
      return RA_OK;
    }
    if (ra_kvclient_append(s->client, &s->session, s->rows, s->n_rows, e) == RA_OK) {
      append_landed(r, i);
      return RA_OK;
    }
  }
}

int ra_remote_append(ra_remote *r, uint64_t pos, const float *k, const float *v, ra_error *err) {
  int rc = ra_remote_append_start(r, pos, k, v, err);
  return rc ? rc : ra_remote_append_wait(r, err);
}

int ra_remote_append_start(ra_remote *r, uint64_t pos, const float *k, const float *v, ra_error *err) {
  if (r->appending) return ra_errorf(err, RA_ESTATE, "remote: an append is in flight already");
  int rc = remote_check(r, err);
  if (rc) return rc;
  restore_replicas(r);
  const ra_offload_plan *p = r->plan;
  size_t hd = r->head_dim, row_bytes = ra_dtype_row_bytes(r->cfg.dtype, hd);
  size_t n_heads = (size_t)p->n_layers * p->n_kv_heads;
  if ((rc = reserve_pack(r, 2 * n_heads * row_bytes, err)) != RA_OK) return rc;
  for (size_t i = 0; i < r->n_stores; i++) r->stores[i].n_rows = 0;
  for (uint32_t l = 0; l < p->n_layers && rc == RA_OK; l++) {
    for (uint32_t g = 0; g < p->n_kv_heads; g++) {
      const ra_shard_rule *rule = ra_offload_plan_rule(p, l, g, pos);
      if (!rule) return ra_errorf(err, RA_EINTERNAL, "remote: position %llu of layer %u kv head %u has no owner",
                                  (unsigned long long)pos, l, g);
      size_t at = (size_t)l * p->n_kv_heads + g;
      uint8_t *kd = r->pack + 2 * at * row_bytes, *vd = kd + row_bytes;
      if ((rc = pack_row(r, k + at * hd, l, g, pos, "key", kd, err)) ||
          (rc = pack_row(r, v + at * hd, l, g, pos, "value", vd, err)))
        break;
      /* every live owner gets the row: the staged bytes are shared, read only */
      for (uint32_t j = 0; j < rule->n_owners; j++) {
        remote_store *s = &r->stores[rule->owners[j]];
        if (!s->down) s->rows[s->n_rows++] = (ra_kvclient_rows){l, g, pos, 1, kd, vd};
      }
    }
  }
  if (rc) return rc;
  /* every store's append in flight at once (each waited for in ra_remote_append_wait) */
  for (size_t i = 0; i < r->n_stores; i++) {
    remote_store *s = &r->stores[i];
    s->append = NULL;
    s->append_rc = RA_OK;
    if (s->n_rows && !s->down)
      s->append_rc = ra_kvclient_append_start(s->client, &s->session, s->rows, s->n_rows, &s->append, &s->append_err);
  }
  r->append_pos = pos;
  r->appending = 1;
  return RA_OK;
}

int ra_remote_append_wait(ra_remote *r, ra_error *err) {
  if (!r->appending) return ra_errorf(err, RA_ESTATE, "remote: no append in flight");
  r->appending = 0;
  const uint64_t pos = r->append_pos;
  int rc = RA_OK;
  for (size_t i = 0; i < r->n_stores; i++) {
    remote_store *s = &r->stores[i];
    if (s->append) s->append_rc = ra_kvclient_append_wait(s->append, &s->append_err);
    s->append = NULL;
  }
  for (size_t i = 0; i < r->n_stores && rc == RA_OK; i++) {
    remote_store *s = &r->stores[i];
    if (!s->n_rows || s->down) continue;
    if (s->append_rc == RA_OK) append_landed(r, i);
    else rc = append_recover(r, i, &s->append_err, err);
  }
  if (rc == RA_OK && pos + 1 > r->pos_end) r->pos_end = pos + 1;
  return rc;
}

/* Sends every live store the q heads this step's choice (r->asked) gives it and it was not yet
 * sent: one request per store, asking heads [req_begin, n_heads) of its step buffers. A store
 * that fails to take it is marked down or reattached; the caller chooses again. *resend: a
 * store failed, choose again. */
static int send_pending(ra_remote *r, const float *q, int *resend, ra_error *err) {
  const ra_offload_plan *p = r->plan;
  size_t hd = r->head_dim;
  *resend = 0;
  for (size_t i = 0; i < r->n_stores; i++) {
    remote_store *s = &r->stores[i];
    if (s->down || s->pending) continue;
    size_t begin = s->n_heads;
    for (uint32_t h = 0; h < p->n_q_heads; h++) {
      if (!r->asked[i * p->n_q_heads + h] || s->slot[h] >= 0) continue;
      size_t n = s->n_heads++;
      s->slot[h] = (int32_t)n;
      s->heads[n] = h;
      memcpy(s->q + n * hd, q + (size_t)h * hd, hd * sizeof(float));
      s->parts[n] = (ra_head_partial){.part.o = s->o + n * hd};
    }
    if (s->n_heads == begin) continue;
    s->req_begin = begin;
    s->req = (ra_kvclient_attend_req){.layer = r->layer, .q_heads = s->heads + begin, .n_heads = s->n_heads - begin,
                                      .q = s->q + begin * hd, .mode = r->cfg.mode, .top_k = r->cfg.top_k,
                                      .search = r->cfg.search};
    if (r->sel) {
      s->req.cluster_kv_heads = r->sel[i].kv_heads;
      s->req.cluster_counts = r->sel[i].counts;
      s->req.n_cluster_heads = r->sel[i].n_heads;
      s->req.clusters = r->sel[i].clusters;
    }
    if (r->q_past) {
      /* retro: the past queries of the request's heads, [n_past, n, head_dim] */
      const size_t n = s->n_heads - begin;
      for (uint32_t j = 0; j < r->n_past; j++)
        for (size_t k = 0; k < n; k++) {
          memcpy(s->rq + ((size_t)j * n + k) * hd, r->q_past + ((size_t)j * p->n_q_heads + s->heads[begin + k]) * hd,
                 hd * sizeof(float));
          s->rparts[(size_t)j * n + k] = (ra_head_partial){.part.o = s->ro + ((size_t)j * n + k) * hd};
        }
      s->req.retro_step = r->retro_step;
      s->req.retro_window = r->cfg.retro_window;
      s->req.n_retro = r->n_past;
      s->req.retro_q = r->n_past ? s->rq : NULL;
      if (r->sel && r->n_past) {
        s->req.retro_cluster_counts = r->sel[i].retro_counts;
        s->req.retro_clusters = r->sel[i].retro_clusters;
      }
    }
    ra_error e;
    s->batch = NULL;
    if (r->via) {
      /* a request the batch cannot take (its store unreachable to it) goes on the stream */
      if (ra_remote_batch_stage(r->via, s->addr, &r->store_opt, &s->session, &s->req, &s->ticket, &e) == RA_OK)
        s->batch = r->via;
    }
    if (s->batch || ra_kvclient_attend_send(s->stream, &s->req, &e) == RA_OK) {
      s->pending = 1;
      continue;
    }
    int back, landed;
    int rc = store_failed(r, i, &e, &back, err);
    if (rc == RA_OK && back && (rc = store_check_held(s, 0, &landed, err)) != RA_OK) rc = remote_fail(r, rc, err);
    if (rc) return rc;
    /* its heads of this request are sent again, there or to another owner */
    for (size_t j = begin; j < s->n_heads; j++) s->slot[s->heads[j]] = -1;
    s->n_heads = begin;
    *resend = 1;
  }
  return RA_OK;
}

/* Chooses an owner per rule among the live stores and sends what is not yet sent, until every
 * send went through. */
static int choose_and_send(ra_remote *r, ra_error *err) {
  int resend = 1, rc = RA_OK;
  while (rc == RA_OK && resend) {
    rc = ra_offload_plan_choose(r->plan, r->layer, r->down, r->asked, err);
    if (rc) return remote_fail(r, rc, err);
    rc = send_pending(r, r->q_step, &resend, err);
  }
  return rc;
}

/* sel: NULL, or wave mode's selection per store. q_past: NULL, or retro's n_past past queries of
 * step `step`. */
static int attend_begin(ra_remote *r, uint32_t layer, const float *q, const ra_remote_wave_sel *sel, uint64_t step,
                        uint32_t n_past, const float *q_past, ra_error *err) {
  /* retro's supplementary partials do not travel in a batch */
  r->via = q_past ? NULL : r->via_next;
  r->via_next = NULL;
  int rc = remote_check(r, err);
  if (rc) return rc;
  const ra_offload_plan *p = r->plan;
  if (layer >= p->n_layers) return ra_errorf(err, RA_EINVAL, "remote: layer %u out of range", layer);
  if (r->in_flight) return ra_errorf(err, RA_ESTATE, "remote: an attend is already in flight");
  if (!sel) restore_replicas(r);
  r->t_begin = uv_hrtime();
  r->layer = layer;
  r->sel = sel;
  r->retro_step = step;
  r->n_past = q_past ? n_past : 0;
  r->q_past = q_past;
  memcpy(r->q_step, q, (size_t)p->n_q_heads * r->head_dim * sizeof *q);
  for (size_t i = 0; i < r->n_stores; i++) {
    remote_store *s = &r->stores[i];
    s->n_heads = 0;
    s->pending = 0;
    s->batch = NULL;
    if (s->slot)
      for (uint32_t h = 0; h < p->n_q_heads; h++) s->slot[h] = -1;
  }
  /* Every store of the layer gets its request before any reply is awaited: the stores work
   * in parallel and the step waits for the slowest, not the sum. */
  if ((rc = choose_and_send(r, err)) != RA_OK) return rc;
  r->in_flight = 1;
  return RA_OK;
}

void ra_remote_attend_via(ra_remote *r, ra_remote_batch *b) { r->via_next = b; }

int ra_remote_attend_begin(ra_remote *r, uint32_t layer, const float *q, ra_error *err) {
  return attend_begin(r, layer, q, NULL, 0, 0, NULL, err);
}

static int retro_check(const ra_remote *r, uint64_t step, uint32_t n_past, const float *q_past, ra_error *err) {
  if (r->cfg.retro_window == 0 || n_past > r->cfg.retro_window || step == 0 || (n_past && !q_past))
    return ra_errorf(err, RA_EINVAL, "remote: retro step %llu with %u past queries (window %u)",
                     (unsigned long long)step, n_past, r->cfg.retro_window);
  return RA_OK;
}

int ra_remote_attend_begin_retro(ra_remote *r, uint32_t layer, const float *q, uint64_t step, uint32_t n_past,
                                 const float *q_past, ra_error *err) {
  int rc = retro_check(r, step, n_past, q_past, err);
  if (rc) return rc;
  static const float none = 0.0f;
  return attend_begin(r, layer, q, NULL, step, n_past, q_past ? q_past : &none, err);
}

int ra_remote_attend_begin_wave(ra_remote *r, uint32_t layer, const float *q, const ra_remote_wave_sel *sel,
                                uint64_t step, uint32_t n_past, const float *q_past, ra_error *err) {
  if (!sel) return ra_errorf(err, RA_EINVAL, "remote: a wave attend needs its selection");
  if (n_past == 0) return attend_begin(r, layer, q, sel, 0, 0, NULL, err);
  int rc = retro_check(r, step, n_past, q_past, err);
  return rc ? rc : attend_begin(r, layer, q, sel, step, n_past, q_past, err);
}

int ra_remote_fetch_clusters_start(ra_remote *r, size_t store, uint32_t layer, const ra_remote_wave_sel *sel,
                                   ra_kvclient_fetch **out, ra_error *err) {
  *out = NULL;
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (store >= r->n_stores || layer >= r->plan->n_layers || !r->stores[store].client || r->stores[store].down)
    return ra_errorf(err, RA_EINVAL, "remote: no store %zu with layer %u to fetch clusters from", store, layer);
  remote_store *s = &r->stores[store];
  ra_kvclient_cluster_sel cs = {.layer = layer, .kv_heads = sel->kv_heads, .counts = sel->counts,
                                .n_heads = sel->n_heads, .ids = sel->clusters};
  rc = ra_kvclient_fetch_clusters_start(s->client, &s->session, &cs, out, err);
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

int ra_remote_fetch_clusters_wait(ra_remote *r, ra_kvclient_fetch *f, ra_kvclient_cluster_rows *out, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc == RA_OK) rc = ra_kvclient_fetch_clusters_wait(f, out, err);
  return rc ? remote_fail(r, rc, err) : RA_OK;
}

ra_dtype ra_remote_dtype(const ra_remote *r) { return r->cfg.dtype; }

/* Receives every reply in flight. A store that fails is marked down (or reattached) and the
 * heads it did not answer are sent to the next owner of their rules, within this step, until
 * every chosen owner has answered. */
static int receive_all(ra_remote *r, ra_remote_stats *st, int want_past, ra_error *err) {
  const size_t hd = r->head_dim, nq = r->plan->n_q_heads;
  for (;;) {
    int failed = 0;
    for (size_t i = 0; i < r->n_stores; i++) {
      remote_store *s = &r->stores[i];
      if (!s->pending) continue;
      uint64_t compute_us = 0, retro_us = 0;
      ra_error e;
      s->pending = 0;
      int rc = s->batch ? ra_remote_batch_take(s->batch, &s->ticket, &s->session, &s->req, s->parts + s->req_begin,
                                               r->cfg.timeout_ms, &compute_us, &e)
                        : ra_kvclient_attend_recv_retro(s->stream, &s->req, s->parts + s->req_begin, s->rparts,
                                                        r->cfg.timeout_ms, &compute_us, &retro_us, &e);
      if (rc != RA_OK && s->batch) r->via = NULL; /* the heads sent again go on the streams */
      s->batch = NULL;
      if (rc == RA_OK) {
        if ((double)compute_us > st->store_us) st->store_us = (double)compute_us;
        if ((double)retro_us > st->retro_us) st->retro_us = (double)retro_us;
        /* retro: each past query's supplementary partials, merged as their replies come */
        const size_t n = s->req.n_heads;
        for (size_t j = 0; want_past && j < (size_t)r->n_past * n; j++) {
          const ra_head_partial *pt = &s->rparts[j];
          ra_partial_merge_from(&r->racc[(j / n) * nq + s->heads[s->req_begin + j % n]], &pt->part, (int)hd);
          st->retro_rows += pt->n_scanned;
        }
        continue;
      }
      int back, landed;
      rc = store_failed(r, i, &e, &back, err);
      if (rc == RA_OK && back && (rc = store_check_held(s, 0, &landed, err)) != RA_OK) rc = remote_fail(r, rc, err);
      if (rc) return rc;
      for (size_t j = s->req_begin; j < s->n_heads; j++) s->slot[s->heads[j]] = -1;
      s->n_heads = s->req_begin;
      failed = 1;
    }
    if (!failed) return RA_OK;
    int rc = choose_and_send(r, err);
    if (rc) return rc;
  }
}

int ra_remote_attend_end(ra_remote *r, float *o, float *ml, ra_remote_stats *stats, ra_error *err) {
  return ra_remote_attend_end_retro(r, o, ml, NULL, NULL, stats, err);
}

int ra_remote_attend_end_retro(ra_remote *r, float *o, float *ml, float *o_past, float *ml_past,
                               ra_remote_stats *stats, ra_error *err) {
  int rc = remote_check(r, err);
  if (rc) return rc;
  if (!r->in_flight) return ra_errorf(err, RA_ESTATE, "remote: no attend in flight");
  r->in_flight = 0;
  const ra_offload_plan *p = r->plan;
  size_t hd = r->head_dim;
  ra_partial *acc = r->acc;
  ra_remote_stats st = {0};
  const uint32_t n_past = o_past && ml_past ? r->n_past : 0;
  for (size_t i = 0; i < (size_t)n_past * p->n_q_heads; i++) {
    r->racc[i].o = o_past + i * hd;
    ra_partial_reset(&r->racc[i], (int)hd);
  }
  rc = receive_all(r, &st, n_past > 0, err);
  r->via = NULL;
  for (size_t i = 0; i < (size_t)n_past * p->n_q_heads; i++) {
    ml_past[2 * i] = r->racc[i].m;
    ml_past[2 * i + 1] = r->racc[i].l;
  }
  /* Merged per head in the order of its kv head's rules, each rule's partial from its chosen
   * owner: a failover changes who answers, not the order, so the sum is the one an undisturbed
   * step makes (the owners hold the same rows). A store answering for several rules of the kv
   * head (no replicas) is merged once. */
  uint32_t group = p->n_q_heads / p->n_kv_heads;
  for (uint32_t h = 0; h < p->n_q_heads; h++) {
    acc[h].o = o + h * hd;
    ra_partial_reset(&acc[h], (int)hd);
    size_t at = (size_t)r->layer * p->n_kv_heads + h / group;
    r->merge_gen++;
    for (uint32_t k = p->head_rule_off[at]; rc == RA_OK && k < p->head_rule_off[at + 1]; k++) {
      const ra_shard_rule *rule = &p->map->rules[p->head_rules[k]];
      int c = -1;
      for (uint32_t j = 0; j < rule->n_owners && c < 0; j++)
        if (!r->down[rule->owners[j]]) c = (int)rule->owners[j];
      if (c < 0 || r->merged[c] == r->merge_gen || r->stores[c].slot[h] < 0) continue;
      r->merged[c] = r->merge_gen;
      const ra_head_partial *pt = &r->stores[c].parts[r->stores[c].slot[h]];
      ra_partial_merge_from(&acc[h], &pt->part, (int)hd);
      st.n_scanned += pt->n_scanned;
      st.n_keys += pt->n_keys;
    }
    ml[2 * h] = acc[h].m;
    ml[2 * h + 1] = acc[h].l;
  }
  st.wait_us = (double)(uv_hrtime() - r->t_begin) / 1e3;
  if (rc) return rc;
  if (stats) *stats = st;
  return RA_OK;
}

int ra_remote_attend(ra_remote *r, uint32_t layer, const float *q, float *o, float *ml,
                     ra_remote_stats *stats, ra_error *err) {
  int rc = ra_remote_attend_begin(r, layer, q, err);
  return rc ? rc : ra_remote_attend_end(r, o, ml, stats, err);
}

size_t ra_remote_n_stores(const ra_remote *r) { return r->n_stores; }

int ra_remote_store_state(const ra_remote *r, size_t i, ra_remote_store_report *out) {
  if (i >= r->n_stores) return RA_EINVAL;
  const remote_store *s = &r->stores[i];
  *out = (ra_remote_store_report){.addr = s->addr, .replaced = s->replaced[0] ? s->replaced : NULL,
                                  .down = s->down, .why = s->down ? s->why.msg : NULL,
                                  .reconnects = s->reconnects, .tokens = s->tokens};
  memcpy(out->session_id, s->session.id, sizeof out->session_id);
  return RA_OK;
}

void ra_remote_keep_sessions(ra_remote *r) { r->keep_sessions = 1; }
