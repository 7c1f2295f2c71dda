#include "service.h"

#include "clock.h"
#include "attend.h"
#include "client.h"
#include "clusters.h"
#include "journal.h"
#include "kvstore.pb-c.h"
#include "log.h"
#include "vec.h"
#include "wire.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Vectors travel as little-endian bytes and are used in place. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kv-store needs a little-endian host");

#ifndef RA_VERSION
#define RA_VERSION "dev"
#endif

struct kvs_service {
  kvs_store *store;
  int attend_threads;
  ra_gate build_gate; /* the store's threads, shared by concurrent index builds */
  atomic_int draining;
  atomic_uint_fast64_t requests;
  atomic_uint_fast64_t errors;
  atomic_uint_fast64_t attend_requests;
  atomic_uint_fast64_t attend_batches;
  kvs_data_dir *data; /* --data-dir (NULL: none) */
  int replaying;      /* kvs_service_create replays journals: the changes are not recorded again */
};

/* Records a change of s that succeeded (journal.h), unless it is being replayed. */
static int journal_record(kvs_service *svc, kvs_session *s, int type, const uint8_t *req, size_t len, ra_error *err) {
  if (!s->journal || svc->replaying) return RA_OK;
  int rc = kvs_journal_append(s->journal, type, req, len, err);
  return rc ? ra_error_wrap(err, "the change is in memory but not on disk") : RA_OK;
}

/* Writes of one session are recorded in the order they were made (a write must start where
 * the shard's rows end, so replay needs that order). */
static void journal_order_lock(kvs_session *s) {
  if (s->journal) kvs_journal_lock(s->journal);
}
static void journal_order_unlock(kvs_session *s) {
  if (s->journal) kvs_journal_unlock(s->journal);
}

static int replay_record(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], int type, const uint8_t *data, size_t len,
                         ra_error *err);
static void replay_attach(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal *j);
static void replay_drop(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES]);

/* Opens the data dir and restores its sessions. */
static int service_restore(kvs_service *svc, const kvs_service_config *cfg, ra_error *err) {
  int rc = kvs_data_dir_open(cfg->data_dir, cfg->fsync_ms, 0, &svc->data, err);
  if (rc) return rc;
  uint64_t t0 = ra_clock_now_us(), n_records;
  size_t n_sessions;
  svc->replaying = 1;
  rc = kvs_data_dir_replay(svc->data, replay_record, replay_attach, replay_drop, svc, &n_sessions, &n_records, err);
  svc->replaying = 0;
  atomic_store(&svc->requests, 0); /* the counters are the clients' requests */
  atomic_store(&svc->errors, 0);
  if (rc == RA_OK)
    ra_log_info("data dir %s: %zu sessions restored from %llu records in %.1f ms (%llu rows)", cfg->data_dir,
                n_sessions, (unsigned long long)n_records, (double)(ra_clock_now_us() - t0) / 1e3,
                (unsigned long long)kvs_store_tokens(svc->store));
  return rc;
}

int kvs_service_create(const kvs_service_config *cfg, kvs_service **out, ra_error *err) {
  if (cfg->attend_threads < 0)
    return ra_errorf(err, RA_EINVAL, "attend threads %d must be >= 0", cfg->attend_threads);
  if (cfg->index_threads < 0)
    return ra_errorf(err, RA_EINVAL, "index threads %d must be >= 0", cfg->index_threads);
  kvs_service *svc = calloc(1, sizeof *svc);
  if (!svc) return ra_errorf(err, RA_ENOMEM, "out of memory creating the service");
  int rc = kvs_store_create(cfg->memory_budget, &svc->store, err);
  if (rc) {
    free(svc);
    return rc;
  }
  int gate = cfg->attend_threads > 0 ? cfg->attend_threads : omp_get_max_threads();
  if (ra_gate_init(&svc->build_gate, gate) != RA_OK) {
    kvs_store_destroy(svc->store);
    free(svc);
    return ra_errorf(err, RA_ENOMEM, "cannot create the build gate");
  }
  /* By default the store's threads (--threads) insert too, like they attend and build: a decode
   * step's Append touches every layer's shards at once, and they are independent (indexer.c).
   * Fewer (--index-threads) leave the cores to the attends that the next layers send meanwhile;
   * an index that lags is scanned exactly for its rest, so a smaller pool costs accuracy
   * nothing, only scan time if it falls far behind. */
  kvs_store_set_index_threads(svc->store, cfg->index_threads > 0 ? cfg->index_threads : gate);
  svc->attend_threads = cfg->attend_threads;
  if (cfg->data_dir && (rc = service_restore(svc, cfg, err)) != RA_OK) {
    kvs_service_destroy(svc);
    return rc;
  }
  *out = svc;
  return RA_OK;
}

void kvs_service_destroy(kvs_service *svc) {
  if (!svc) return;
  kvs_store_destroy(svc->store); /* closes the journals, keeping them */
  kvs_data_dir_close(svc->data);
  ra_gate_destroy(&svc->build_gate);
  free(svc);
}

kvs_store *kvs_service_store(kvs_service *svc) { return svc->store; }
void kvs_service_set_draining(kvs_service *svc) { atomic_store(&svc->draining, 1); }
void kvs_service_count_error(kvs_service *svc) { atomic_fetch_add(&svc->errors, 1); }

/* Counts a finished request and passes its code through. */
static int counted(kvs_service *svc, int rc) {
  atomic_fetch_add(&svc->requests, 1);
  if (rc < 0) atomic_fetch_add(&svc->errors, 1);
  return rc;
}

static int malformed(ra_error *err, const char *what, size_t len) {
  return ra_errorf(err, RA_EFORMAT, "%s: malformed protobuf (%zu bytes)", what, len);
}

static int pack_reply(const ProtobufCMessage *m, ra_buf *out, ra_error *err) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (ra_buf_reserve(out, n ? n : 1) != RA_OK)
    return ra_errorf(err, RA_ENOMEM, "out of memory for a %zu-byte reply", n);
  out->len = protobuf_c_message_pack(m, out->data);
  return RA_OK;
}

static const char *principal_of(const kvs_caller *who) { return who && who->principal ? who->principal : ""; }

/* A session for a request: looked up by id, and refused (RA_EPERM) to a caller whose credential
 * is not the one that opened it; a NULL caller (in-process use) may use any. */
static int session_get(kvs_service *svc, const kvs_caller *who, const ProtobufCBinaryData *id, kvs_session **out,
                       ra_error *err) {
  int rc = kvs_store_get(svc->store, id->data, id->len, out, err);
  if (rc || !who || strcmp((*out)->owner, principal_of(who)) == 0) return rc;
  kvs_session_release(*out);
  *out = NULL;
  return ra_errorf(err, RA_EPERM, "the session was opened with another credential");
}

/* ---- OpenSession ---- */

/* The one check of a request's index parameters: converted from the wire, then bounded. */
static int index_spec(const Rakv__IndexParams *m, ra_index_spec *out, ra_error *err) {
  int rc = kvs_wire_index_spec_from_proto(m, out, err);
  return rc ? rc : ra_index_spec_check(out, err);
}

/* OpenSession with resume_session_id: the session as it is, its id and rows. */
static int resume_session(kvs_service *svc, const kvs_caller *who, const Rakv__OpenSessionRequest *r, ra_buf *reply,
                          ra_error *err) {
  kvs_session *s;
  ProtobufCBinaryData id = r->resume_session_id;
  int rc = kvs_store_get(svc->store, id.data, id.len, &s, err);
  if (rc) return rc;
  /* A session restored from --data-dir has no owner (the journal keeps requests, not
   * credentials): the first caller that names its id claims it. */
  if (who && !s->owner[0]) snprintf(s->owner, sizeof s->owner, "%s", principal_of(who));
  if (who && strcmp(s->owner, principal_of(who)) != 0) {
    kvs_session_release(s);
    return ra_errorf(err, RA_EPERM, "the session was opened with another credential");
  }
  const Rakv__Geometry *g = r->geometry;
  if (g && (g->n_layers != s->geo.n_layers || g->n_q_heads != s->geo.n_q_heads || g->n_kv_heads != s->geo.n_kv_heads ||
            g->head_dim != s->geo.head_dim || (ra_dtype)g->dtype != s->geo.dtype))
    rc = ra_errorf(err, RA_EINVAL, "resume: geometry %u layers, %u/%u heads, head_dim %u is not the session's (%u, %u/%u, %u)",
                   g->n_layers, g->n_q_heads, g->n_kv_heads, g->head_dim, s->geo.n_layers, s->geo.n_q_heads,
                   s->geo.n_kv_heads, s->geo.head_dim);
  if (rc == RA_OK) {
    Rakv__OpenSessionReply out = RAKV__OPEN_SESSION_REPLY__INIT;
    out.session_id.data = s->id;
    out.session_id.len = KVS_SESSION_ID_BYTES;
    out.tokens = atomic_load(&s->tokens);
    rc = pack_reply(&out.base, reply, err);
  }
  if (rc == RA_OK) {
    char tag[KVS_SESSION_TAG_LEN];
    kvs_session_tag(s->id, tag);
    ra_log_info("session %s resumed: %llu rows", tag, (unsigned long long)atomic_load(&s->tokens));
  }
  kvs_session_release(s);
  return rc;
}

/* id: NULL for a new session, else the id it had (a replay). raw: the request, for the journal. */
static int open_session(kvs_service *svc, const kvs_caller *who, const Rakv__OpenSessionRequest *r, const uint8_t *id,
                        const uint8_t *raw, size_t raw_len, ra_buf *reply, ra_error *err) {
  if (r->resume_session_id.len) return resume_session(svc, who, r, reply, err);
  if (!r->geometry) return ra_errorf(err, RA_EINVAL, "geometry missing");
  kvs_geometry g = {
      .n_layers = r->geometry->n_layers,
      .n_q_heads = r->geometry->n_q_heads,
      .n_kv_heads = r->geometry->n_kv_heads,
      .head_dim = r->geometry->head_dim,
      .dtype = (ra_dtype)r->geometry->dtype,
  };
  ra_index_spec ix;
  int rc = kvs_geometry_check(&g, err);
  if (rc == RA_OK) rc = index_spec(r->index, &ix, err);
  if (rc) return rc;
  if (r->n_shards == 0) return ra_errorf(err, RA_EINVAL, "a session needs at least one shard");
  kvs_shard_spec *specs = malloc(r->n_shards * sizeof *specs);
  if (!specs) return ra_errorf(err, RA_ENOMEM, "out of memory for %zu shards", r->n_shards);
  for (size_t i = 0; i < r->n_shards; i++) {
    const Rakv__Shard *s = r->shards[i];
    specs[i] = (kvs_shard_spec){
        .layer = s->layer,
        .kv_head = s->kv_head,
        .token_begin = s->token_begin,
        .token_end = s->token_end == 0 ? RA_TOKEN_END_OPEN : s->token_end,
    };
  }
  kvs_session *s = NULL;
  rc = kvs_store_open_as(svc->store, id, &g, specs, r->n_shards, &ix, r->client, &s, err);
  free(specs);
  if (rc) return rc;
  /* before the id leaves the store: until then no request can name the session */
  snprintf(s->owner, sizeof s->owner, "%s", principal_of(who));
  if (svc->data && !svc->replaying) {
    kvs_journal *j = NULL;
    rc = kvs_journal_create(svc->data, s->id, &j, err);
    if (rc == RA_OK && (rc = kvs_journal_append_open(j, raw, raw_len, err)) != RA_OK) kvs_journal_close(j, 1);
    if (rc == RA_OK) s->journal = j;
    if (rc) {
      kvs_store_close(svc->store, s->id, KVS_SESSION_ID_BYTES, NULL, NULL);
      kvs_session_release(s);
      return ra_error_wrap(err, "opening a session");
    }
  }
  Rakv__OpenSessionReply out = RAKV__OPEN_SESSION_REPLY__INIT;
  out.session_id.data = s->id;
  out.session_id.len = KVS_SESSION_ID_BYTES;
  rc = pack_reply(&out.base, reply, err);
  char tag[KVS_SESSION_TAG_LEN], name[sizeof s->client * 4], owner[sizeof s->owner * 4];
  kvs_session_tag(s->id, tag);
  if (rc) {
    kvs_store_close(svc->store, s->id, KVS_SESSION_ID_BYTES, NULL, NULL);
  } else {
    ra_log_info("session %s opened by '%s' (%s) from %s: %u layers, %u/%u q/kv heads, head_dim %u, %s, %zu "
                "shards",
                tag, ra_log_escape(s->client, strlen(s->client), name, sizeof name),
                s->owner[0] ? ra_log_escape(s->owner, strlen(s->owner), owner, sizeof owner) : "no credential",
                who && who->peer ? who->peer : "in-process", g.n_layers, g.n_q_heads, g.n_kv_heads, g.head_dim,
                ra_dtype_name(g.dtype), r->n_shards);
  }
  kvs_session_release(s);
  return rc;
}

int kvs_service_open_session(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                             ra_buf *reply, ra_error *err) {
  Rakv__OpenSessionRequest *r = rakv__open_session_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "OpenSessionRequest", len));
  int rc = open_session(svc, who, r, NULL, req, len, reply, err);
  rakv__open_session_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- PutKv and Append ---- */

/* Refuses rows [n, head_dim] (geometry's dtype) holding a NaN or an infinity: one such key turns
 * a full-mode partial into the empty one (m = -inf) without an error. */
static int finite_check(const void *x, const kvs_geometry *g, const Rakv__KvChunk *c, size_t i, const char *field,
                        ra_error *err) {
  if (g->dtype == RA_DTYPE_I8) return RA_OK; /* the store checks int8 rows' scales (ra_dtype_rows_check) */
  size_t total = (size_t)c->n_tokens * g->head_dim, bad = ra_vec_first_nonfinite(x, g->dtype, total);
  if (bad == total) return RA_OK;
  return ra_errorf(err, RA_EINVAL,
                   "chunk %zu: %s[%zu][%zu] (layer %u kv head %u position %llu) is not finite (NaN or infinity); "
                   "nothing stored",
                   i, field, bad / g->head_dim, bad % g->head_dim, c->layer, c->kv_head,
                   (unsigned long long)(c->token_begin + bad / g->head_dim));
}

/* Checks a chunk's sizes and values against the session and describes it as a row block. */
static int chunk_rows(const kvs_session *s, const Rakv__KvChunk *c, size_t i, kvs_rows *out,
                      ra_error *err) {
  uint64_t want = (uint64_t)c->n_tokens * kvs_row_bytes(&s->geo);
  if (c->n_tokens == 0) return ra_errorf(err, RA_EINVAL, "chunk %zu: n_tokens is 0", i);
  if (c->keys.len != want)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: keys are %zu bytes, want %llu (%u tokens x head_dim %u x %s)", i,
                     c->keys.len, (unsigned long long)want, c->n_tokens, s->geo.head_dim,
                     ra_dtype_name(s->geo.dtype));
  if (c->values.len != want)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: values are %zu bytes, want %llu (%u tokens x head_dim %u x %s)",
                     i, c->values.len, (unsigned long long)want, c->n_tokens, s->geo.head_dim,
                     ra_dtype_name(s->geo.dtype));
  int rc = finite_check(c->keys.data, &s->geo, c, i, "keys", err);
  if (rc == RA_OK) rc = finite_check(c->values.data, &s->geo, c, i, "values", err);
  if (rc) return rc;
  *out = (kvs_rows){
      .layer = c->layer,
      .kv_head = c->kv_head,
      .token_begin = c->token_begin,
      .n = c->n_tokens,
      .keys = c->keys.data,
      .values = c->values.data,
  };
  return RA_OK;
}

void kvs_service_put_begin(kvs_service *svc, const kvs_caller *who, kvs_put_state *st) {
  (void)svc;
  memset(st, 0, sizeof *st);
  st->who = who;
}

static void put_raw_free(kvs_put_state *st) {
  for (size_t i = 0; i < st->n_raw; i++) free(st->raw[i]);
  free(st->raw);
  free(st->raw_len);
  st->raw = NULL;
  st->raw_len = NULL;
  st->n_raw = st->cap_raw = 0;
}

/* What a stream's state holds besides its stage: the journal's chunks and the unpack arena. */
static void put_state_release(kvs_put_state *st) {
  put_raw_free(st);
  pb_arena_free(&st->arena);
}

void kvs_service_put_abort(kvs_service *svc, kvs_put_state *st) {
  (void)svc;
  kvs_stage_abort(&st->stage);
  put_state_release(st);
  st->tokens_stored = st->bytes_stored = 0;
}

/* Keeps a staged chunk's bytes for the journal (finish records them with the commit). */
static int put_keep_raw(kvs_service *svc, const kvs_session *s, kvs_put_state *st, const uint8_t *raw, size_t len,
                        ra_error *err) {
  if (!s->journal || svc->replaying) return RA_OK;
  if (st->n_raw == st->cap_raw) {
    size_t cap = st->cap_raw ? 2 * st->cap_raw : 16;
    uint8_t **r = realloc(st->raw, cap * sizeof *r);
    if (r) st->raw = r;
    size_t *l = r ? realloc(st->raw_len, cap * sizeof *l) : NULL;
    if (l) st->raw_len = l;
    if (!l) return ra_errorf(err, RA_ENOMEM, "out of memory keeping %zu chunks for the journal", cap);
    st->cap_raw = cap;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return ra_errorf(err, RA_ENOMEM, "out of memory keeping a chunk of %zu bytes for the journal", len);
  if (len) memcpy(copy, raw, len);
  st->raw[st->n_raw] = copy;
  st->raw_len[st->n_raw++] = len;
  return RA_OK;
}

static int put_chunk(kvs_service *svc, kvs_put_state *st, const Rakv__KvChunk *c, const uint8_t *raw,
                     size_t raw_len, ra_error *err) {
  kvs_session *s;
  int rc = session_get(svc, st->who, &c->session_id, &s, err);
  if (rc) return rc;
  kvs_rows rows;
  uint64_t bytes = 0;
  rc = chunk_rows(s, c, (size_t)st->chunks, &rows, err);
  if (rc == RA_OK) rc = kvs_session_stage(s, &st->stage, &rows, 1, &bytes, err);
  if (rc == RA_OK) rc = put_keep_raw(svc, s, st, raw, raw_len, err);
  kvs_session_release(s);
  if (rc) return rc;
  st->tokens_stored += rows.n;
  st->bytes_stored += bytes;
  return RA_OK;
}

int kvs_service_put_chunk(kvs_service *svc, kvs_put_state *st, const uint8_t *chunk, size_t len,
                          ra_error *err) {
  pb_arena_reset(&st->arena, len);
  Rakv__KvChunk *c = rakv__kv_chunk__unpack(pb_arena_allocator(&st->arena), len, chunk);
  int rc;
  if (!c) {
    rc = ra_errorf(err, RA_EFORMAT, "chunk %llu: KvChunk: malformed protobuf (%zu bytes)",
                   (unsigned long long)st->chunks, len);
  } else {
    rc = put_chunk(svc, st, c, chunk, len, err);
    rakv__kv_chunk__free_unpacked(c, pb_arena_allocator(&st->arena));
  }
  st->chunks++;
  if (rc) {
    if (st->stage.tokens)
      ra_error_wrap(err, "PutKv dropped, its %llu earlier tokens too (nothing of the stream is stored)",
                    (unsigned long long)st->stage.tokens);
    kvs_service_put_abort(svc, st);
    counted(svc, rc);
  }
  return rc;
}

int kvs_service_put_finish(kvs_service *svc, kvs_put_state *st, ra_buf *reply, ra_error *err) {
  Rakv__PutKvReply out = RAKV__PUT_KV_REPLY__INIT;
  out.tokens_stored = st->tokens_stored;
  out.bytes_stored = st->bytes_stored;
  int rc = pack_reply(&out.base, reply, err);
  kvs_session *s = st->stage.s;
  if (rc == RA_OK && s && st->n_raw) {
    /* recorded and published under the journal's order lock: replay applies them in this place */
    atomic_fetch_add(&s->refs, 1);
    journal_order_lock(s);
    for (size_t i = 0; i < st->n_raw && rc == RA_OK; i++)
      rc = journal_record(svc, s, KVS_REC_PUT, st->raw[i], st->raw_len[i], err);
    if (rc == RA_OK) kvs_stage_commit(&st->stage);
    journal_order_unlock(s);
    kvs_session_release(s);
  } else if (rc == RA_OK) {
    kvs_stage_commit(&st->stage);
  }
  if (rc) kvs_service_put_abort(svc, st);
  put_state_release(st);
  return counted(svc, rc);
}

static int append(kvs_service *svc, const kvs_caller *who, const Rakv__AppendRequest *r, const uint8_t *raw,
                  size_t raw_len, ra_buf *reply, ra_error *err) {
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  kvs_rows *rows = NULL;
  if (r->n_chunks == 0) {
    rc = ra_errorf(err, RA_EINVAL, "append has no chunks");
    goto out;
  }
  rows = malloc(r->n_chunks * sizeof *rows);
  if (!rows) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for %zu chunks", r->n_chunks);
    goto out;
  }
  uint64_t tokens = 0;
  for (size_t i = 0; i < r->n_chunks; i++) {
    const Rakv__KvChunk *c = r->chunks[i];
    if (c->session_id.len != 0 &&
        (c->session_id.len != KVS_SESSION_ID_BYTES ||
         memcmp(c->session_id.data, s->id, KVS_SESSION_ID_BYTES) != 0)) {
      rc = ra_errorf(err, RA_EINVAL, "chunk %zu: session id differs from the request's", i);
      goto out;
    }
    rc = chunk_rows(s, c, i, &rows[i], err);
    if (rc) goto out;
    tokens += rows[i].n;
  }
  journal_order_lock(s);
  rc = kvs_session_write(s, rows, r->n_chunks, NULL, err);
  if (rc == RA_OK) rc = journal_record(svc, s, KVS_REC_APPEND, raw, raw_len, err);
  journal_order_unlock(s);
  if (rc == RA_OK) {
    Rakv__AppendReply out = RAKV__APPEND_REPLY__INIT;
    out.tokens_stored = tokens;
    rc = pack_reply(&out.base, reply, err);
  }
out:
  free(rows);
  kvs_session_release(s);
  return rc;
}

int kvs_service_append(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err) {
  Rakv__AppendRequest *r = rakv__append_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "AppendRequest", len));
  int rc = append(svc, who, r, req, len, reply, err);
  rakv__append_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- Attend ---- */

/* One attend's answer, kept until its reply is packed: the reply's head partials point into
 * res. */
typedef struct attend_out {
  kvs_attend_result res;
  Rakv__HeadPartial *heads;
  Rakv__HeadPartial **ptrs;
  Rakv__AttendReply msg;
} attend_out;

static void attend_out_free(attend_out *o) {
  kvs_attend_result_free(&o->res);
  free(o->heads);
  free(o->ptrs);
  memset(o, 0, sizeof *o);
}

static int attend_reply(const Rakv__AttendRequest *r, const kvs_session *s, uint64_t compute_us, attend_out *out,
                        ra_error *err) {
  const kvs_attend_result *res = &out->res;
  size_t n = res->n_heads, n_retro = res->retro ? (size_t)r->n_retro * n : 0;
  out->heads = malloc((n + n_retro) * sizeof *out->heads);
  out->ptrs = malloc((n + n_retro) * sizeof *out->ptrs);
  if (!out->heads || !out->ptrs) return ra_errorf(err, RA_ENOMEM, "out of memory for %zu head partials", n + n_retro);
  for (size_t i = 0; i < n + n_retro; i++) {
    kvs_wire_partial_to_proto(i < n ? &res->heads[i] : &res->retro[i - n], s->geo.head_dim, &out->heads[i]);
    out->ptrs[i] = &out->heads[i];
  }
  Rakv__AttendReply *m = &out->msg;
  rakv__attend_reply__init(m);
  m->seq = r->seq;
  m->n_heads = n;
  m->heads = out->ptrs;
  m->n_retro = n_retro;
  m->retro = out->ptrs + n;
  m->retro_us = res->retro_us;
  m->compute_us = compute_us;
  return RA_OK;
}

/* Runs one attend request into out (its reply message); on failure out holds nothing. */
static int attend(kvs_service *svc, const kvs_caller *who, const Rakv__AttendRequest *r, attend_out *out,
                  ra_error *err) {
  memset(out, 0, sizeof *out);
  atomic_fetch_add(&svc->attend_requests, 1);
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  float *q = NULL, *retro_q = NULL;
  uint64_t t0 = ra_clock_now_us();
  size_t want = r->n_q_heads * (size_t)s->geo.head_dim * sizeof(float);
  if (r->n_q_heads > s->geo.n_q_heads) {
    rc = ra_errorf(err, RA_EINVAL, "%zu q heads asked for, the model has %u", r->n_q_heads,
                   s->geo.n_q_heads);
    goto out;
  }
  if (r->q.len != want) {
    rc = ra_errorf(err, RA_EINVAL, "q is %zu bytes, want %zu (%zu heads x head_dim %u x 4)",
                   r->q.len, want, r->n_q_heads, s->geo.head_dim);
    goto out;
  }
  /* protobuf-c gives no alignment promise for bytes fields. */
  q = malloc(want ? want : 1);
  if (!q) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for q");
    goto out;
  }
  if (want) memcpy(q, r->q.data, want);
  size_t bad = ra_vec_first_nonfinite(q, RA_DTYPE_F32, want / sizeof(float));
  if (bad < want / sizeof(float)) {
    rc = ra_errorf(err, RA_EINVAL, "q[%zu][%zu] is not finite (NaN or infinity)", bad / s->geo.head_dim,
                   bad % s->geo.head_dim);
    goto out;
  }
  if (r->retro_q.len != (size_t)r->n_retro * want) {
    rc = ra_errorf(err, RA_EINVAL, "retro_q is %zu bytes, want %zu (%u past queries x %zu heads x head_dim %u x 4)",
                   r->retro_q.len, (size_t)r->n_retro * want, r->n_retro, r->n_q_heads, s->geo.head_dim);
    goto out;
  }
  if (r->retro_q.len && !(retro_q = malloc(r->retro_q.len))) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for retro_q");
    goto out;
  }
  if (retro_q) memcpy(retro_q, r->retro_q.data, r->retro_q.len);
  ra_search_spec sp;
  ra_mode mode;
  kvs_wire_search_spec_from_proto(r->search, &sp);
  if ((rc = kvs_wire_mode_from_proto(r->mode, &mode, err)) || (rc = ra_search_spec_check(&sp, err)))
    goto out;
  kvs_attend_args a = {
      .layer = r->layer,
      .q_heads = r->q_heads,
      .n_heads = r->n_q_heads,
      .q = q,
      .mode = mode,
      .top_k = r->top_k,
      .search = sp,
      .want_ids = r->return_ids,
      .n_threads = svc->attend_threads,
      .wave = {.kv_heads = r->cluster_kv_heads, .counts = r->cluster_counts,
               .n_heads = r->n_cluster_kv_heads, .ids = r->clusters, .n_ids = r->n_clusters,
               .retro_counts = r->retro_cluster_counts, .n_retro_counts = r->n_retro_cluster_counts,
               .retro_ids = r->retro_clusters, .n_retro_ids = r->n_retro_clusters},
      .retro_step = r->retro_step,
      .retro_window = r->retro_window,
      .n_retro = r->n_retro,
      .retro_q = retro_q,
  };
  if (r->n_cluster_counts != r->n_cluster_kv_heads) {
    rc = ra_errorf(err, RA_EINVAL, "%zu cluster_counts for %zu cluster_kv_heads",
                   r->n_cluster_counts, r->n_cluster_kv_heads);
    goto out;
  }
  rc = kvs_attend(s, &a, &out->res, err);
  if (rc == RA_OK) rc = attend_reply(r, s, ra_clock_now_us() - t0, out, err);
out:
  if (rc) attend_out_free(out);
  free(q);
  free(retro_q);
  kvs_session_release(s);
  return rc;
}

int kvs_service_attend(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err) {
  Rakv__AttendRequest *r = rakv__attend_request__unpack(NULL, len, req);
  if (!r) {
    atomic_fetch_add(&svc->attend_requests, 1);
    return counted(svc, malformed(err, "AttendRequest", len));
  }
  attend_out out;
  int rc = attend(svc, who, r, &out, err);
  if (rc == RA_OK) rc = pack_reply(&out.msg.base, reply, err);
  attend_out_free(&out);
  rakv__attend_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* Item i's reply, packed into out. */
static int batch_item_reply(const Rakv__AttendBatchRequest *r, size_t i, int rc, attend_out *o, const ra_error *e,
                            uint64_t us, ra_buf *out, ra_error *err) {
  Rakv__AttendItemReply it = RAKV__ATTEND_ITEM_REPLY__INIT;
  if (rc == RA_OK) {
    it.reply = &o->msg;
  } else {
    it.code = (uint32_t)ra_status_to_grpc(rc);
    it.message = (char *)e->msg;
  }
  Rakv__AttendBatchReply m = RAKV__ATTEND_BATCH_REPLY__INIT;
  m.seq = r->seq;
  m.item = (uint32_t)i;
  m.result = &it;
  m.compute_us = us;
  return pack_reply(&m.base, out, err);
}

int kvs_service_attend_batch(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                             kvs_emit_fn emit, void *ctx, ra_error *err) {
  atomic_fetch_add(&svc->attend_batches, 1);
  Rakv__AttendBatchRequest *r = rakv__attend_batch_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "AttendBatchRequest", len));
  const size_t n = r->n_items;
  const int nt = svc->attend_threads > 0 ? svc->attend_threads : omp_get_max_threads();
  int rc = n ? RA_OK : ra_errorf(err, RA_EINVAL, "an AttendBatch message of no items");
  ra_buf out = {0};
  /* Fewer items than threads: one after another, each on all the threads (an item splits into
   * enough tasks), and each answered as soon as it is done. At least as many: the items
   * themselves in parallel, one thread each (an item's own parallel regions run on that thread:
   * nested regions are inactive), so that items of a few tasks each do not leave threads idle,
   * then answered in order. Each item counts as a request of its own (its failure as an error),
   * the message as one more. */
  if (rc == RA_OK && (n < 2 || n < (size_t)nt)) {
    for (size_t i = 0; rc == RA_OK && i < n; i++) {
      uint64_t t0 = ra_clock_now_us();
      attend_out o;
      ra_error e;
      int irc = counted(svc, attend(svc, who, r->items[i], &o, &e));
      rc = batch_item_reply(r, i, irc, &o, &e, ra_clock_now_us() - t0, &out, err);
      attend_out_free(&o);
      if (rc == RA_OK) rc = emit(ctx, out.data, out.len, err);
    }
  } else if (rc == RA_OK) {
    attend_out *o = calloc(n, sizeof *o);
    ra_error *e = calloc(n, sizeof *e);
    int *irc = calloc(n, sizeof *irc);
    uint64_t *us = calloc(n, sizeof *us);
    if (!o || !e || !irc || !us) rc = ra_errorf(err, RA_ENOMEM, "out of memory for a batch of %zu attends", n);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (rc == RA_OK)
    for (size_t i = 0; i < n; i++) {
      if (rc != RA_OK) continue;
      uint64_t t0 = ra_clock_now_us();
      irc[i] = counted(svc, attend(svc, who, r->items[i], &o[i], &e[i]));
      us[i] = ra_clock_now_us() - t0;
    }
    for (size_t i = 0; rc == RA_OK && i < n; i++) {
      rc = batch_item_reply(r, i, irc[i], &o[i], &e[i], us[i], &out, err);
      if (rc == RA_OK) rc = emit(ctx, out.data, out.len, err);
    }
    for (size_t i = 0; o && i < n; i++) attend_out_free(&o[i]);
    free(o);
    free(e);
    free(irc);
    free(us);
  }
  ra_buf_free(&out);
  rakv__attend_batch_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- PutClusters ---- */

static int put_clusters(kvs_service *svc, const kvs_caller *who, const Rakv__PutClustersRequest *r, const uint8_t *raw,
                        size_t raw_len, ra_buf *reply, ra_error *err) {
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  kvs_cluster_put p = {.layer = r->layer, .kv_head = r->kv_head,
                       .first_cluster = r->first_cluster, .row_begin = r->row_begin,
                       .counts = r->counts, .n_clusters = r->n_counts,
                       .perm = r->n_perm ? r->perm : NULL, .n_perm = r->n_perm};
  kvs_cluster_stats st;
  journal_order_lock(s);
  rc = kvs_session_put_clusters(s, &p, &st, err);
  if (rc == RA_OK) rc = journal_record(svc, s, KVS_REC_CLUSTERS, raw, raw_len, err);
  journal_order_unlock(s);
  if (rc == RA_OK) {
    Rakv__PutClustersReply out = RAKV__PUT_CLUSTERS_REPLY__INIT;
    out.n_clusters = st.n_clusters;
    out.rows_clustered = st.rows_clustered;
    out.rows_lagging = st.rows_lagging;
    out.directory_bytes = st.directory_bytes;
    rc = pack_reply(&out.base, reply, err);
  }
  kvs_session_release(s);
  return rc;
}

int kvs_service_put_clusters(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                             ra_buf *reply, ra_error *err) {
  Rakv__PutClustersRequest *r = rakv__put_clusters_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "PutClustersRequest", len));
  int rc = put_clusters(svc, who, r, req, len, reply, err);
  rakv__put_clusters_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- FetchClusters ---- */

static int fetch_clusters(kvs_service *svc, const kvs_caller *who, const Rakv__FetchClustersRequest *r, ra_buf *reply,
                          ra_error *err) {
  if (r->n_counts != r->n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "%zu counts for %zu kv_heads", r->n_counts, r->n_kv_heads);
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  kvs_cluster_fetch f = {.layer = r->layer, .kv_heads = r->kv_heads, .counts = r->counts,
                         .n_heads = r->n_kv_heads, .ids = r->clusters, .n_ids = r->n_clusters,
                         .max_bytes = RA_KVCLIENT_FETCH_MAX_BYTES};
  kvs_cluster_rows rows;
  rc = kvs_session_fetch_clusters(s, &f, &rows, err);
  if (rc == RA_OK) {
    const size_t bytes = (size_t)rows.n_rows * kvs_row_bytes(&s->geo);
    Rakv__FetchClustersReply out = RAKV__FETCH_CLUSTERS_REPLY__INIT;
    out.rows = rows.rows;
    out.n_rows = r->n_clusters;
    out.keys = (ProtobufCBinaryData){.len = bytes, .data = rows.keys};
    out.values = (ProtobufCBinaryData){.len = bytes, .data = rows.values};
    rc = pack_reply(&out.base, reply, err);
    kvs_cluster_rows_free(&rows);
  }
  kvs_session_release(s);
  return rc;
}

int kvs_service_fetch_clusters(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                               ra_error *err) {
  Rakv__FetchClustersRequest *r = rakv__fetch_clusters_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "FetchClustersRequest", len));
  int rc = fetch_clusters(svc, who, r, reply, err);
  rakv__fetch_clusters_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- BuildIndex ---- */

static int build_index(kvs_service *svc, const kvs_caller *who, const Rakv__BuildIndexRequest *r, const uint8_t *raw,
                       size_t raw_len, ra_buf *reply, ra_error *err) {
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  float *q = NULL;
  uint64_t t0 = ra_clock_now_us();
  ra_index_spec req;
  kvs_build_args a = {.layer = r->layer, .q_head = r->q_head, .n_queries = r->n_queries};
  if ((rc = index_spec(r->params, &req, err))) goto out;
  if ((rc = kvs_index_spec_resolve(&req, &s->index, &a.params, &a.per_kv_head, err))) goto out;
  a.params.n_threads = svc->attend_threads;
  a.gate = &svc->build_gate;
  size_t dim = s->geo.head_dim;
  if (r->queries.len > 0) {
    size_t want = (size_t)r->n_queries * dim * sizeof(float);
    if (r->queries.len != want) {
      rc = ra_errorf(err, RA_EINVAL, "queries are %zu bytes, want %zu (%u queries x head_dim %zu "
                     "x 4)", r->queries.len, want, r->n_queries, dim);
      goto out;
    }
    /* protobuf-c gives no alignment promise for bytes fields. */
    q = malloc(want);
    if (!q) {
      rc = ra_errorf(err, RA_ENOMEM, "out of memory for %u queries", r->n_queries);
      goto out;
    }
    memcpy(q, r->queries.data, want);
    size_t bad = ra_vec_first_nonfinite(q, RA_DTYPE_F32, want / sizeof(float));
    if (bad < want / sizeof(float)) {
      rc = ra_errorf(err, RA_EINVAL, "queries[%zu][%zu] is not finite (NaN or infinity)", bad / dim, bad % dim);
      goto out;
    }
    a.queries = q;
  }
  if (r->n_knn_ids > 0) {
    if (r->n_queries == 0 || r->n_knn_ids % r->n_queries != 0) {
      rc = ra_errorf(err, RA_EINVAL, "knn_ids has %zu ids, not a multiple of n_queries %u",
                     r->n_knn_ids, r->n_queries);
      goto out;
    }
    if (r->n_knn_ids / r->n_queries > RA_INDEX_MAX_EF) {
      rc = ra_errorf(err, RA_EINVAL, "knn_ids has %zu ids per query, more than %u",
                     r->n_knn_ids / r->n_queries, RA_INDEX_MAX_EF);
      goto out;
    }
    a.knn = r->knn_ids;
    a.knn_k = (uint32_t)(r->n_knn_ids / r->n_queries);
  }
  if (r->n_key_top_queries > 0) {
    if (!a.knn || r->key_top_k < 1 || r->key_top_k > RA_INDEX_KEY_TOP_MAX ||
        r->n_key_top_queries % r->key_top_k != 0) {
      rc = ra_errorf(err, RA_EINVAL, "key_top_queries: %zu entries of %u per key (1 to %u, and knn_ids with them)",
                     r->n_key_top_queries, r->key_top_k, RA_INDEX_KEY_TOP_MAX);
      goto out;
    }
    for (size_t i = 0; i < r->n_key_top_queries; i++)
      if (r->key_top_queries[i] >= r->n_queries && r->key_top_queries[i] != RA_INDEX_NO_QUERY) {
        rc = ra_errorf(err, RA_EINVAL, "key_top_queries: key %zu names query %u of %u", i / r->key_top_k,
                       r->key_top_queries[i], r->n_queries);
        goto out;
      }
    a.key_top_queries = r->key_top_queries;
    a.key_top_k = r->key_top_k;
    a.key_pos_begin = r->key_pos_begin;
    a.n_key_rows = r->n_key_top_queries / r->key_top_k;
  }
  if (r->n_queries > 0 && !a.queries && !a.knn) {
    rc = ra_errorf(err, RA_EINVAL, "n_queries is %u but neither queries nor knn_ids came",
                   r->n_queries);
    goto out;
  }
  kvs_build_result res;
  if ((rc = kvs_session_build_index(s, &a, &res, err))) goto out;
  /* recorded once installed: a replay builds over the rows written before this record, which
   * may include rows written while the build ran (they were lagging; here they are indexed) */
  if ((rc = journal_record(svc, s, KVS_REC_BUILD, raw, raw_len, err))) goto out;
  uint64_t us = ra_clock_now_us() - t0;
  Rakv__BuildIndexReply m = RAKV__BUILD_INDEX_REPLY__INIT;
  m.n_keys = res.n_keys;
  m.index_bytes = res.index_bytes;
  m.build_us = us;
  m.n_repaired = res.n_repaired;
  rc = pack_reply(&m.base, reply, err);
  char hex[KVS_SESSION_TAG_LEN];
  kvs_session_tag(s->id, hex);
  ra_log_info("session %s: %s index of layer %u %s %u: %llu keys in %u shards, %llu bytes, "
              "%llu repaired, %.1f ms",
              hex, ra_mode_name(a.params.kind), a.layer, a.per_kv_head ? "kv head" : "q head",
              a.per_kv_head ? a.q_head / (s->geo.n_q_heads / s->geo.n_kv_heads) : a.q_head,
              (unsigned long long)res.n_keys, res.n_shards, (unsigned long long)res.index_bytes,
              (unsigned long long)res.n_repaired, (double)us / 1000.0);
out:
  free(q);
  kvs_session_release(s);
  return rc;
}

int kvs_service_build_index(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                            ra_buf *reply, ra_error *err) {
  Rakv__BuildIndexRequest *r = rakv__build_index_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "BuildIndexRequest", len));
  int rc = build_index(svc, who, r, req, len, reply, err);
  rakv__build_index_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- ReadKv ---- */

static int read_kv(kvs_service *svc, const kvs_caller *who, const Rakv__ReadKvRequest *r, ra_buf *reply, ra_error *err) {
  kvs_session *s;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  if (rc) return rc;
  size_t bytes = (size_t)r->n_tokens * kvs_row_bytes(&s->geo);
  uint8_t *kv = malloc(2 * bytes + 1);
  if (!kv) rc = ra_errorf(err, RA_ENOMEM, "out of memory for %u rows", r->n_tokens);
  if (rc == RA_OK) rc = kvs_session_read(s, r->layer, r->kv_head, r->token_begin, r->n_tokens, kv, kv + bytes, err);
  if (rc == RA_OK) {
    Rakv__KvChunk out = RAKV__KV_CHUNK__INIT;
    out.layer = r->layer;
    out.kv_head = r->kv_head;
    out.token_begin = r->token_begin;
    out.n_tokens = r->n_tokens;
    out.keys = (ProtobufCBinaryData){bytes, kv};
    out.values = (ProtobufCBinaryData){bytes, kv + bytes};
    rc = pack_reply(&out.base, reply, err);
  }
  free(kv);
  kvs_session_release(s);
  return rc;
}

int kvs_service_read_kv(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                        ra_error *err) {
  Rakv__ReadKvRequest *r = rakv__read_kv_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "ReadKvRequest", len));
  int rc = read_kv(svc, who, r, reply, err);
  rakv__read_kv_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

/* ---- CloseSession, Stats, Health ---- */

int kvs_service_close_session(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                              ra_buf *reply, ra_error *err) {
  Rakv__CloseSessionRequest *r = rakv__close_session_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "CloseSessionRequest", len));
  uint64_t freed = 0;
  kvs_session *s = NULL;
  int rc = session_get(svc, who, &r->session_id, &s, err);
  kvs_session_release(s);
  if (rc == RA_OK) rc = kvs_store_close(svc->store, r->session_id.data, r->session_id.len, &freed, err);
  if (rc == RA_OK) {
    char hex[KVS_SESSION_TAG_LEN];
    kvs_session_tag(r->session_id.data, hex);
    ra_log_info("session %s closed: %llu bytes freed", hex, (unsigned long long)freed);
    Rakv__CloseSessionReply out = RAKV__CLOSE_SESSION_REPLY__INIT;
    out.bytes_freed = freed;
    rc = pack_reply(&out.base, reply, err);
  }
  rakv__close_session_request__free_unpacked(r, NULL);
  return counted(svc, rc);
}

int kvs_service_stats(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                      ra_error *err) {
  Rakv__StatsRequest *r = rakv__stats_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "StatsRequest", len));
  rakv__stats_request__free_unpacked(r, NULL);
  /* This request counts itself, so a client sees its own Stats call. */
  atomic_fetch_add(&svc->requests, 1);
  Rakv__StatsReply out = RAKV__STATS_REPLY__INIT;
  if (principal_of(who)[0]) {
    /* a tenant sees its own sessions only */
    kvs_store_owner_totals(svc->store, principal_of(who), &out.sessions, &out.tokens, &out.bytes_used);
  } else {
    out.sessions = kvs_store_sessions(svc->store);
    out.tokens = kvs_store_tokens(svc->store);
    out.bytes_used = kvs_store_bytes_used(svc->store);
  }
  out.bytes_budget = kvs_store_budget(svc->store);
  out.requests = atomic_load(&svc->requests);
  out.errors = atomic_load(&svc->errors);
  out.attend_requests = atomic_load(&svc->attend_requests);
  out.attend_batches = atomic_load(&svc->attend_batches);
  int rc = pack_reply(&out.base, reply, err);
  if (rc) atomic_fetch_add(&svc->errors, 1);
  return rc;
}

int kvs_service_health(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err) {
  (void)who;
  Rakv__HealthRequest *r = rakv__health_request__unpack(NULL, len, req);
  if (!r) return counted(svc, malformed(err, "HealthRequest", len));
  rakv__health_request__free_unpacked(r, NULL);
  Rakv__HealthReply out = RAKV__HEALTH_REPLY__INIT;
  out.serving = !atomic_load(&svc->draining);
  out.version = (char *)RA_VERSION;
  return counted(svc, pack_reply(&out.base, reply, err));
}

/* ---- Restoring sessions from the data dir (journal.h) ---- */

static int replay_record(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], int type, const uint8_t *data, size_t len,
                         ra_error *err) {
  kvs_service *svc = ctx;
  ra_buf reply = {0};
  int rc;
  switch (type) {
  case KVS_REC_OPEN: {
    Rakv__OpenSessionRequest *r =
        len >= KVS_JOURNAL_ID_BYTES ? rakv__open_session_request__unpack(NULL, len - KVS_JOURNAL_ID_BYTES,
                                                                         data + KVS_JOURNAL_ID_BYTES)
                                    : NULL;
    if (!r || memcmp(data, id, KVS_JOURNAL_ID_BYTES) != 0) {
      rc = ra_errorf(err, RA_EFORMAT, "a malformed OpenSession record");
    } else {
      rc = open_session(svc, NULL, r, id, NULL, 0, &reply, err);
    }
    if (r) rakv__open_session_request__free_unpacked(r, NULL);
    break;
  }
  case KVS_REC_PUT: {
    kvs_put_state st;
    kvs_service_put_begin(svc, NULL, &st);
    rc = kvs_service_put_chunk(svc, &st, data, len, err);
    if (rc == RA_OK) kvs_stage_commit(&st.stage);
    put_state_release(&st);
    break;
  }
  case KVS_REC_APPEND: rc = kvs_service_append(svc, NULL, data, len, &reply, err); break;
  case KVS_REC_BUILD: rc = kvs_service_build_index(svc, NULL, data, len, &reply, err); break;
  case KVS_REC_CLUSTERS: rc = kvs_service_put_clusters(svc, NULL, data, len, &reply, err); break;
  default: rc = ra_errorf(err, RA_EFORMAT, "a record of unknown type %d", type);
  }
  ra_buf_free(&reply);
  return rc;
}

static void replay_attach(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal *j) {
  kvs_service *svc = ctx;
  kvs_session *s;
  ra_error err;
  if (kvs_store_get(svc->store, id, KVS_JOURNAL_ID_BYTES, &s, &err) != RA_OK) {
    /* no OpenSession record made it to disk: the session never answered its opener */
    kvs_journal_close(j, 1);
    return;
  }
  s->journal = j;
  char tag[KVS_SESSION_TAG_LEN], name[sizeof s->client * 4];
  kvs_session_tag(s->id, tag);
  ra_log_info("session %s of '%s' restored: %llu rows", tag, ra_log_escape(s->client, strlen(s->client), name, sizeof name),
              (unsigned long long)atomic_load(&s->tokens));
  kvs_session_release(s);
}

static void replay_drop(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES]) {
  kvs_service *svc = ctx;
  ra_error err;
  kvs_store_close(svc->store, id, KVS_JOURNAL_ID_BYTES, NULL, &err);
}
