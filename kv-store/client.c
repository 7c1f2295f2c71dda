#include "client.h"

#include "buf.h"
#include "kvstore.pb-c.h"
#include "rpc.h"
#include "textfile.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#define KVC_DEFAULT_CHUNK (4u << 20)
#define KVC_DEFAULT_TIMEOUT_MS 30000

struct ra_kvclient {
  ra_rpc_channel *ch;
  size_t chunk_bytes;
  int timeout_ms;
  size_t builds_in_flight; /* started, not yet waited for */
  ra_buf tx, rx;
};

struct ra_kvclient_put {
  ra_kvclient *c;
  ra_rpc_call *call;
  ra_kvclient_session s;
  ra_buf tx;
  int failed; /* the stream already ended with an error */
};

struct ra_kvclient_stream {
  ra_kvclient *c;
  ra_rpc_call *call; /* NULL after an error: reopened by the next attend */
  ra_kvclient_session s;
  uint64_t seq;
  ra_buf tx, rx;
};

static int pack(const ProtobufCMessage *m, ra_buf *b, ra_error *err) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (ra_buf_reserve(b, n ? n : 1) != RA_OK)
    return ra_errorf(err, RA_ENOMEM, "out of memory for a %zu-byte request", n);
  b->len = protobuf_c_message_pack(m, b->data);
  return RA_OK;
}

static int bad_reply(const ra_kvclient *c, const char *what, ra_error *err) {
  return ra_errorf(err, RA_EFORMAT, "%s: malformed %s from the store", ra_kvclient_addr(c), what);
}

int ra_kvclient_connect(const char *addr, const ra_kvclient_options *opt, ra_kvclient **out,
                        ra_error *err) {
  ra_kvclient_options o = {0};
  if (opt) o = *opt;
  ra_kvclient *c = calloc(1, sizeof *c);
  if (!c) return ra_errorf(err, RA_ENOMEM, "out of memory");
  c->chunk_bytes = o.chunk_bytes ? o.chunk_bytes : KVC_DEFAULT_CHUNK;
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : KVC_DEFAULT_TIMEOUT_MS;
  ra_rpc_tls tls = {.cert_pem = o.tls_cert_pem, .key_pem = o.tls_key_pem, .ca_pem = o.tls_ca_pem};
  ra_rpc_channel_config cc = {.max_message_bytes = o.max_message_bytes,
                              .keepalive_ms = c->timeout_ms / 2 > 0 ? c->timeout_ms / 2 : 1,
                              .tls = o.tls ? &tls : NULL,
                              .token = o.auth_token,
                              .fail_after_loss = o.fail_after_loss};
  int rc = ra_rpc_channel_open(addr, &cc, &c->ch, err);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  return RA_OK;
}

int ra_kvclient_options_load(ra_kvclient_options *o, const char *ca_file, const char *cert_file,
                             const char *key_file, const char *token_file, ra_kvclient_secrets *t,
                             ra_error *err) {
  memset(t, 0, sizeof *t);
  const struct {
    const char *path;
    char **text;
  } files[] = {{ca_file, &t->ca}, {cert_file, &t->cert}, {key_file, &t->key}, {token_file, &t->token}};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    if (!files[i].path) continue;
    size_t len;
    int rc = ra_textfile_read(files[i].path, 1u << 20, files[i].text, &len, err);
    if (rc) {
      ra_kvclient_secrets_free(t);
      return rc;
    }
  }
  if (t->token) {
    t->token[strcspn(t->token, "\r\n")] = '\0';
    if (!t->token[0]) {
      ra_kvclient_secrets_free(t);
      return ra_errorf(err, RA_EINVAL, "%s: the first line holds no token", token_file);
    }
  }
  if ((!cert_file) != (!key_file)) {
    ra_kvclient_secrets_free(t);
    return ra_errorf(err, RA_EINVAL, "a client certificate needs its key, and a key its certificate");
  }
  o->tls = o->tls || ca_file || cert_file;
  o->tls_ca_pem = t->ca;
  o->tls_cert_pem = t->cert;
  o->tls_key_pem = t->key;
  o->auth_token = t->token;
  return RA_OK;
}

void ra_kvclient_secrets_free(ra_kvclient_secrets *t) {
  free(t->ca);
  free(t->cert);
  free(t->key);
  free(t->token);
  memset(t, 0, sizeof *t);
}

void ra_kvclient_close(ra_kvclient *c) {
  if (!c) return;
  ra_rpc_channel_close(c->ch);
  ra_buf_free(&c->tx);
  ra_buf_free(&c->rx);
  free(c);
}

const char *ra_kvclient_addr(const ra_kvclient *c) { return ra_rpc_channel_target(c->ch); }

/* The method's name in an error ("Append: 10.0.0.7:7001: DEADLINE_EXCEEDED: ..."). */
static int named(const char *method, int rc, ra_error *err) {
  if (rc == RA_OK) return rc;
  const char *slash = strrchr(method, '/');
  return ra_error_wrap(err, "%s", slash ? slash + 1 : method);
}

static int unary(ra_kvclient *c, const char *method, const ProtobufCMessage *req, ra_error *err) {
  int rc = pack(req, &c->tx, err);
  if (rc) return rc;
  return named(method, ra_rpc_unary(c->ch, method, c->tx.data, c->tx.len, &c->rx, c->timeout_ms, err), err);
}

int ra_kvclient_health(ra_kvclient *c, int *serving, ra_error *err) {
  Rakv__HealthRequest req = RAKV__HEALTH_REQUEST__INIT;
  int rc = unary(c, "/rakv.KvStore/Health", &req.base, err);
  if (rc) return rc;
  Rakv__HealthReply *r = rakv__health_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r) return bad_reply(c, "HealthReply", err);
  *serving = r->serving;
  rakv__health_reply__free_unpacked(r, NULL);
  return RA_OK;
}

int ra_kvclient_stats(ra_kvclient *c, ra_kvclient_store_stats *out, ra_error *err) {
  Rakv__StatsRequest req = RAKV__STATS_REQUEST__INIT;
  int rc = unary(c, "/rakv.KvStore/Stats", &req.base, err);
  if (rc) return rc;
  Rakv__StatsReply *r = rakv__stats_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r) return bad_reply(c, "StatsReply", err);
  *out = (ra_kvclient_store_stats){.sessions = r->sessions,
                             .tokens = r->tokens,
                             .bytes_used = r->bytes_used,
                             .bytes_budget = r->bytes_budget,
                             .requests = r->requests,
                             .errors = r->errors,
                             .attend_requests = r->attend_requests, .attend_batches = r->attend_batches};
  rakv__stats_reply__free_unpacked(r, NULL);
  return RA_OK;
}

static void geometry_to_proto(const ra_kvclient_geometry *geo, Rakv__Geometry *g) {
  rakv__geometry__init(g);
  g->n_layers = geo->n_layers;
  g->n_q_heads = geo->n_q_heads;
  g->n_kv_heads = geo->n_kv_heads;
  g->head_dim = geo->head_dim;
  g->dtype = (Rakv__DType)geo->dtype;
}

int ra_kvclient_open_session(ra_kvclient *c, const ra_kvclient_geometry *geo,
                             const ra_kvclient_shard *shards, size_t n_shards, const char *name,
                             ra_kvclient_session *out, ra_error *err) {
  return ra_kvclient_open_session_indexed(c, geo, shards, n_shards, NULL, name, out, err);
}

int ra_kvclient_open_session_indexed(ra_kvclient *c, const ra_kvclient_geometry *geo,
                                     const ra_kvclient_shard *shards, size_t n_shards,
                                     const ra_index_spec *index, const char *name,
                                     ra_kvclient_session *out, ra_error *err) {
  Rakv__Geometry g;
  geometry_to_proto(geo, &g);
  Rakv__Shard *sh = calloc(n_shards ? n_shards : 1, sizeof *sh);
  Rakv__Shard **ptrs = calloc(n_shards ? n_shards : 1, sizeof *ptrs);
  if (!sh || !ptrs) {
    free(sh);
    free(ptrs);
    return ra_errorf(err, RA_ENOMEM, "out of memory for %zu shards", n_shards);
  }
  for (size_t i = 0; i < n_shards; i++) {
    rakv__shard__init(&sh[i]);
    sh[i].layer = shards[i].layer;
    sh[i].kv_head = shards[i].kv_head;
    sh[i].token_begin = shards[i].token_begin;
    sh[i].token_end = shards[i].token_end == RA_TOKEN_END_OPEN ? 0 : shards[i].token_end;
    ptrs[i] = &sh[i];
  }
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  req.geometry = &g;
  req.n_shards = n_shards;
  req.shards = ptrs;
  req.client = (char *)(name ? name : "");
  Rakv__IndexParams ip;
  int rc = index ? kvs_wire_index_spec_to_proto(index, &ip, err) : RA_OK;
  req.index = index ? &ip : NULL;
  if (rc == RA_OK) rc = unary(c, "/rakv.KvStore/OpenSession", &req.base, err);
  free(sh);
  free(ptrs);
  if (rc) return rc;
  Rakv__OpenSessionReply *r = rakv__open_session_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r || r->session_id.len != sizeof out->id) {
    if (r) rakv__open_session_reply__free_unpacked(r, NULL);
    return bad_reply(c, "OpenSessionReply", err);
  }
  memcpy(out->id, r->session_id.data, sizeof out->id);
  out->geo = *geo;
  rakv__open_session_reply__free_unpacked(r, NULL);
  return RA_OK;
}

int ra_kvclient_resume_session(ra_kvclient *c, const uint8_t id[16], const ra_kvclient_geometry *geo,
                               ra_kvclient_session *out, uint64_t *tokens, ra_error *err) {
  Rakv__Geometry g;
  geometry_to_proto(geo, &g);
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  req.geometry = &g;
  req.resume_session_id.data = (uint8_t *)id;
  req.resume_session_id.len = sizeof out->id;
  int rc = unary(c, "/rakv.KvStore/OpenSession", &req.base, err);
  if (rc) return rc;
  Rakv__OpenSessionReply *r = rakv__open_session_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r || r->session_id.len != sizeof out->id || memcmp(r->session_id.data, id, sizeof out->id) != 0) {
    if (r) rakv__open_session_reply__free_unpacked(r, NULL);
    return bad_reply(c, "OpenSessionReply", err);
  }
  memcpy(out->id, id, sizeof out->id);
  out->geo = *geo;
  if (tokens) *tokens = r->tokens;
  rakv__open_session_reply__free_unpacked(r, NULL);
  return RA_OK;
}

int ra_kvclient_read_kv(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer, uint32_t kv_head,
                        uint64_t token_begin, uint64_t n, void *keys, void *values, ra_error *err) {
  size_t rb = ra_dtype_size(s->geo.dtype) * s->geo.head_dim;
  uint64_t step = c->chunk_bytes / (2 * rb) ? c->chunk_bytes / (2 * rb) : 1;
  if (step > UINT32_MAX) step = UINT32_MAX;
  for (uint64_t done = 0; done < n;) {
    uint64_t k = n - done < step ? n - done : step;
    Rakv__ReadKvRequest req = RAKV__READ_KV_REQUEST__INIT;
    req.session_id.data = (uint8_t *)s->id;
    req.session_id.len = sizeof s->id;
    req.layer = layer;
    req.kv_head = kv_head;
    req.token_begin = token_begin + done;
    req.n_tokens = (uint32_t)k;
    int rc = unary(c, "/rakv.KvStore/ReadKv", &req.base, err);
    if (rc) return rc;
    Rakv__KvChunk *r = rakv__kv_chunk__unpack(NULL, c->rx.len, c->rx.data);
    if (!r || r->n_tokens != k || r->keys.len != k * rb || r->values.len != k * rb) {
      if (r) rakv__kv_chunk__free_unpacked(r, NULL);
      return bad_reply(c, "KvChunk", err);
    }
    memcpy((uint8_t *)keys + done * rb, r->keys.data, k * rb);
    memcpy((uint8_t *)values + done * rb, r->values.data, k * rb);
    rakv__kv_chunk__free_unpacked(r, NULL);
    done += k;
  }
  return RA_OK;
}

int ra_kvclient_close_session(ra_kvclient *c, const ra_kvclient_session *s,
                              uint64_t *bytes_freed, ra_error *err) {
  Rakv__CloseSessionRequest req = RAKV__CLOSE_SESSION_REQUEST__INIT;
  req.session_id.data = (uint8_t *)s->id;
  req.session_id.len = sizeof s->id;
  int rc = unary(c, "/rakv.KvStore/CloseSession", &req.base, err);
  if (rc) return rc;
  Rakv__CloseSessionReply *r = rakv__close_session_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r) return bad_reply(c, "CloseSessionReply", err);
  if (bytes_freed) *bytes_freed = r->bytes_freed;
  rakv__close_session_reply__free_unpacked(r, NULL);
  return RA_OK;
}

struct ra_kvclient_build {
  ra_kvclient *c;
  ra_rpc_call *call;
  uint32_t layer, q_head; /* for its error */
  int deadline_ms;
};

int ra_kvclient_build_index_start(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer,
                                  uint32_t q_head, const ra_index_spec *params,
                                  const ra_kvclient_build_input *in, ra_kvclient_build **out,
                                  ra_error *err) {
  Rakv__BuildIndexRequest req = RAKV__BUILD_INDEX_REQUEST__INIT;
  Rakv__IndexParams ip;
  req.session_id.data = (uint8_t *)s->id;
  req.session_id.len = sizeof s->id;
  req.layer = layer;
  req.q_head = q_head;
  if (params) {
    int rc = kvs_wire_index_spec_to_proto(params, &ip, err);
    if (rc) return rc;
    req.params = &ip;
  }
  if (in) {
    req.n_queries = in->n_queries;
    if (in->queries) {
      req.queries.data = (uint8_t *)in->queries;
      req.queries.len = (size_t)in->n_queries * s->geo.head_dim * sizeof(float);
    }
    if (in->knn_ids) {
      req.knn_ids = (uint64_t *)in->knn_ids;
      req.n_knn_ids = (size_t)in->n_queries * in->knn_k;
    }
    if (in->key_top_queries) {
      req.key_top_queries = (uint32_t *)in->key_top_queries;
      req.n_key_top_queries = (size_t)in->n_key_rows * in->key_top_k;
      req.key_top_k = in->key_top_k;
      req.key_pos_begin = in->key_pos_begin;
    }
  }
  ra_kvclient_build *b = calloc(1, sizeof *b);
  if (!b) return ra_errorf(err, RA_ENOMEM, "out of memory starting a BuildIndex call");
  /* The deadline from the build's size, times the builds queued before it (client.h). */
  uint64_t keys = in && in->n_keys ? in->n_keys : in ? in->n_key_rows : 0;
  uint64_t ms = (uint64_t)RA_KVCLIENT_BUILD_BASE_TIMEOUTS * (uint64_t)c->timeout_ms +
                keys * RA_KVCLIENT_BUILD_US_PER_KEY / 1000 * (c->builds_in_flight + 1);
  if (ms > INT32_MAX) ms = INT32_MAX;
  /* the request is packed into the client's buffer only for the send, which copies it */
  int rc = pack(&req.base, &c->tx, err);
  if (rc == RA_OK)
    rc = ra_rpc_unary_start(c->ch, "/rakv.KvStore/BuildIndex", c->tx.data, c->tx.len, (int)ms, &b->call, err);
  if (rc) {
    free(b);
    return rc;
  }
  b->c = c;
  b->layer = layer;
  b->q_head = q_head;
  b->deadline_ms = (int)ms;
  c->builds_in_flight++;
  *out = b;
  return RA_OK;
}

int ra_kvclient_build_index_wait(ra_kvclient_build *b, ra_kvclient_build_result *out, ra_error *err) {
  ra_kvclient *c = b->c;
  ra_buf rx = {0};
  int rc = ra_rpc_unary_wait(b->call, &rx, err);
  if (rc) ra_error_wrap(err, "BuildIndex of layer %u q head %u (deadline %d ms)", b->layer, b->q_head, b->deadline_ms);
  c->builds_in_flight--;
  free(b);
  Rakv__BuildIndexReply *r = NULL;
  if (rc == RA_OK && !(r = rakv__build_index_reply__unpack(NULL, rx.len, rx.data))) rc = bad_reply(c, "BuildIndexReply", err);
  if (rc == RA_OK && out)
    *out = (ra_kvclient_build_result){.n_keys = r->n_keys, .index_bytes = r->index_bytes, .build_us = r->build_us, .n_repaired = r->n_repaired};
  if (r) rakv__build_index_reply__free_unpacked(r, NULL);
  ra_buf_free(&rx);
  return rc;
}

int ra_kvclient_build_index(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer,
                            uint32_t q_head, const ra_index_spec *params,
                            const ra_kvclient_build_input *in, ra_kvclient_build_result *out,
                            ra_error *err) {
  ra_kvclient_build *b = NULL;
  int rc = ra_kvclient_build_index_start(c, s, layer, q_head, params, in, &b, err);
  return rc ? rc : ra_kvclient_build_index_wait(b, out, err);
}

static size_t row_bytes(const ra_kvclient_geometry *g) {
  return ra_dtype_row_bytes(g->dtype, g->head_dim);
}

static void chunk_fill(Rakv__KvChunk *m, const ra_kvclient_session *s, const ra_kvclient_rows *r,
                       uint64_t first, uint64_t n, int with_id) {
  size_t rb = row_bytes(&s->geo);
  rakv__kv_chunk__init(m);
  if (with_id) {
    m->session_id.data = (uint8_t *)s->id;
    m->session_id.len = sizeof s->id;
  }
  m->layer = r->layer;
  m->kv_head = r->kv_head;
  m->token_begin = r->token_begin + first;
  m->n_tokens = (uint32_t)n;
  m->keys.data = (uint8_t *)r->keys + first * rb;
  m->values.data = (uint8_t *)r->values + first * rb;
  m->keys.len = m->values.len = (size_t)n * rb;
}

/* ---- PutKv ---- */

int ra_kvclient_put_begin(ra_kvclient *c, const ra_kvclient_session *s, ra_kvclient_put **out,
                          ra_error *err) {
  ra_kvclient_put *p = calloc(1, sizeof *p);
  if (!p) return ra_errorf(err, RA_ENOMEM, "out of memory");
  int rc = ra_rpc_call_start(c->ch, "/rakv.KvStore/PutKv", 0, &p->call, err);
  if (rc) {
    free(p);
    return rc;
  }
  p->c = c;
  p->s = *s;
  *out = p;
  return RA_OK;
}

int ra_kvclient_put_rows(ra_kvclient_put *p, const ra_kvclient_rows *rows, ra_error *err) {
  if (p->failed) return ra_errorf(err, RA_ESTATE, "put stream already failed");
  size_t rb = row_bytes(&p->s.geo);
  if (rb == 0) return ra_errorf(err, RA_EINVAL, "session geometry has no row size");
  uint64_t per = p->c->chunk_bytes / (2 * rb);
  if (per == 0) per = 1;
  if (per > UINT32_MAX) per = UINT32_MAX;
  for (uint64_t first = 0; first < rows->n_tokens; first += per) {
    uint64_t n = rows->n_tokens - first < per ? rows->n_tokens - first : per;
    Rakv__KvChunk m;
    chunk_fill(&m, &p->s, rows, first, n, 1);
    int rc = pack(&m.base, &p->tx, err);
    if (rc == RA_OK) rc = ra_rpc_call_send(p->call, p->tx.data, p->tx.len, err);
    if (rc) {
      p->failed = 1;
      return rc;
    }
  }
  return RA_OK;
}

void ra_kvclient_put_abort(ra_kvclient_put *p) {
  if (!p) return;
  ra_rpc_call_destroy(p->call);
  ra_buf_free(&p->tx);
  free(p);
}

int ra_kvclient_put_end(ra_kvclient_put *p, uint64_t *tokens_stored, uint64_t *bytes_stored,
                        ra_error *err) {
  ra_kvclient *c = p->c;
  int rc = RA_OK;
  if (p->failed) {
    /* The store ended the call; its status is the error (already in err from the send). */
    rc = err && err->code ? err->code : RA_EINTERNAL;
    ra_kvclient_put_abort(p);
    return rc;
  }
  rc = ra_rpc_call_close_send(p->call, err);
  if (rc == RA_OK) rc = ra_rpc_call_recv(p->call, &c->rx, c->timeout_ms, err);
  if (rc == RA_EOF) rc = ra_errorf(err, RA_EFORMAT, "%s: PutKv ended without a reply",
                                   ra_kvclient_addr(c));
  if (rc == RA_OK) rc = ra_rpc_call_finish(p->call, err);
  if (rc == RA_OK) {
    Rakv__PutKvReply *r = rakv__put_kv_reply__unpack(NULL, c->rx.len, c->rx.data);
    if (!r) {
      rc = bad_reply(c, "PutKvReply", err);
    } else {
      if (tokens_stored) *tokens_stored = r->tokens_stored;
      if (bytes_stored) *bytes_stored = r->bytes_stored;
      rakv__put_kv_reply__free_unpacked(r, NULL);
    }
  }
  ra_kvclient_put_abort(p);
  return rc;
}

int ra_kvclient_put_kv(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                       size_t n_rows, uint64_t *tokens_stored, ra_error *err) {
  ra_kvclient_put *p = NULL;
  int rc = ra_kvclient_put_begin(c, s, &p, err);
  if (rc) return rc;
  for (size_t i = 0; i < n_rows; i++) {
    rc = ra_kvclient_put_rows(p, &rows[i], err);
    if (rc) break;
  }
  /* After a failed send, end collects the store's status, which says what was wrong. */
  int end = ra_kvclient_put_end(p, tokens_stored, NULL, err);
  return rc ? (end ? end : rc) : end;
}

/* ---- Append ---- */

struct ra_kvclient_append_call {
  ra_rpc_call *call;
};

/* The Append request of rows packed into c->tx. */
static int append_pack(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows, size_t n_rows,
                       ra_error *err) {
  Rakv__KvChunk *chunks = calloc(n_rows ? n_rows : 1, sizeof *chunks);
  Rakv__KvChunk **ptrs = calloc(n_rows ? n_rows : 1, sizeof *ptrs);
  if (!chunks || !ptrs) {
    free(chunks);
    free(ptrs);
    return ra_errorf(err, RA_ENOMEM, "out of memory for %zu chunks", n_rows);
  }
  int rc = RA_OK;
  for (size_t i = 0; i < n_rows; i++) {
    if (rows[i].n_tokens > UINT32_MAX) {
      rc = ra_errorf(err, RA_EINVAL, "append of %llu tokens: at most %u per block",
                     (unsigned long long)rows[i].n_tokens, UINT32_MAX);
      break;
    }
    chunk_fill(&chunks[i], s, &rows[i], 0, rows[i].n_tokens, 0);
    ptrs[i] = &chunks[i];
  }
  if (rc == RA_OK) {
    Rakv__AppendRequest req = RAKV__APPEND_REQUEST__INIT;
    req.session_id.data = (uint8_t *)s->id;
    req.session_id.len = sizeof s->id;
    req.n_chunks = n_rows;
    req.chunks = ptrs;
    rc = pack(&req.base, &c->tx, err);
  }
  free(chunks);
  free(ptrs);
  return rc;
}

int ra_kvclient_append(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                       size_t n_rows, ra_error *err) {
  int rc = append_pack(c, s, rows, n_rows, err);
  if (rc) return rc;
  const char *method = "/rakv.KvStore/Append";
  return named(method, ra_rpc_unary(c->ch, method, c->tx.data, c->tx.len, &c->rx, c->timeout_ms, err), err);
}

int ra_kvclient_append_start(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                             size_t n_rows, ra_kvclient_append_call **out, ra_error *err) {
  *out = NULL;
  ra_kvclient_append_call *a = calloc(1, sizeof *a);
  if (!a) return ra_errorf(err, RA_ENOMEM, "out of memory starting an Append call");
  const char *method = "/rakv.KvStore/Append";
  int rc = append_pack(c, s, rows, n_rows, err);
  if (rc == RA_OK)
    rc = named(method, ra_rpc_unary_start(c->ch, method, c->tx.data, c->tx.len, c->timeout_ms, &a->call, err), err);
  if (rc) {
    free(a);
    return rc;
  }
  *out = a;
  return RA_OK;
}

int ra_kvclient_append_wait(ra_kvclient_append_call *a, ra_error *err) {
  ra_buf rx = {0};
  int rc = named("/rakv.KvStore/Append", ra_rpc_unary_wait(a->call, &rx, err), err);
  ra_buf_free(&rx);
  free(a);
  return rc;
}

/* ---- PutClusters ---- */

int ra_kvclient_put_clusters(ra_kvclient *c, const ra_kvclient_session *s,
                             const ra_kvclient_clusters *in, ra_kvclient_clusters_result *out,
                             ra_error *err) {
  Rakv__PutClustersRequest req = RAKV__PUT_CLUSTERS_REQUEST__INIT;
  req.session_id.data = (uint8_t *)s->id;
  req.session_id.len = sizeof s->id;
  req.layer = in->layer;
  req.kv_head = in->kv_head;
  req.first_cluster = in->first_cluster;
  req.row_begin = in->row_begin;
  req.counts = (uint32_t *)in->counts;
  req.n_counts = in->n_clusters;
  if (in->perm) {
    size_t n = 0;
    for (size_t i = 0; i < in->n_clusters; i++) n += in->counts[i];
    req.perm = (uint32_t *)in->perm;
    req.n_perm = n;
  }
  int rc = unary(c, "/rakv.KvStore/PutClusters", &req.base, err);
  if (rc) return rc;
  Rakv__PutClustersReply *r = rakv__put_clusters_reply__unpack(NULL, c->rx.len, c->rx.data);
  if (!r) return bad_reply(c, "PutClustersReply", err);
  if (out)
    *out = (ra_kvclient_clusters_result){.n_clusters = r->n_clusters,
                                         .rows_clustered = r->rows_clustered,
                                         .rows_lagging = r->rows_lagging,
                                         .directory_bytes = r->directory_bytes};
  rakv__put_clusters_reply__free_unpacked(r, NULL);
  return RA_OK;
}

struct ra_kvclient_fetch {
  ra_kvclient *c;
  ra_rpc_call *call; /* NULL once waited for */
  size_t n_ids;
  size_t row_bytes;
  Rakv__FetchClustersReply *reply;
};

int ra_kvclient_fetch_clusters_start(ra_kvclient *c, const ra_kvclient_session *s,
                                     const ra_kvclient_cluster_sel *sel, ra_kvclient_fetch **out,
                                     ra_error *err) {
  *out = NULL;
  Rakv__FetchClustersRequest req = RAKV__FETCH_CLUSTERS_REQUEST__INIT;
  req.session_id.data = (uint8_t *)s->id;
  req.session_id.len = sizeof s->id;
  req.layer = sel->layer;
  req.kv_heads = (uint32_t *)sel->kv_heads;
  req.n_kv_heads = sel->n_heads;
  req.counts = (uint32_t *)sel->counts;
  req.n_counts = sel->n_heads;
  size_t n = 0;
  for (size_t i = 0; i < sel->n_heads; i++) n += sel->counts[i];
  req.clusters = (uint32_t *)sel->ids;
  req.n_clusters = n;
  ra_kvclient_fetch *f = calloc(1, sizeof *f);
  if (!f) return ra_errorf(err, RA_ENOMEM, "out of memory starting a FetchClusters call");
  int rc = pack(&req.base, &c->tx, err);
  if (rc == RA_OK)
    rc = ra_rpc_unary_start(c->ch, "/rakv.KvStore/FetchClusters", c->tx.data, c->tx.len, c->timeout_ms, &f->call,
                            err);
  if (rc) {
    free(f);
    return rc;
  }
  f->c = c;
  f->n_ids = n;
  f->row_bytes = row_bytes(&s->geo);
  *out = f;
  return RA_OK;
}

int ra_kvclient_fetch_clusters_wait(ra_kvclient_fetch *f, ra_kvclient_cluster_rows *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if (!f->call) return ra_errorf(err, RA_ESTATE, "FetchClusters: waited for twice");
  ra_buf rx = {0};
  int rc = ra_rpc_unary_wait(f->call, &rx, err);
  f->call = NULL;
  Rakv__FetchClustersReply *r = NULL;
  if (rc == RA_OK && !(r = rakv__fetch_clusters_reply__unpack(NULL, rx.len, rx.data)))
    rc = bad_reply(f->c, "FetchClustersReply", err);
  ra_buf_free(&rx);
  uint64_t n = 0;
  for (size_t i = 0; r && rc == RA_OK && i < r->n_rows; i++) n += r->rows[i];
  if (rc == RA_OK && (r->n_rows != f->n_ids || r->keys.len != n * f->row_bytes || r->values.len != n * f->row_bytes))
    rc = bad_reply(f->c, "FetchClustersReply (rows do not match the request)", err);
  if (rc) {
    if (r) rakv__fetch_clusters_reply__free_unpacked(r, NULL);
    return rc;
  }
  f->reply = r;
  *out = (ra_kvclient_cluster_rows){.rows = r->rows, .n_ids = r->n_rows, .n_rows = n, .keys = r->keys.data,
                                    .values = r->values.data};
  return RA_OK;
}

void ra_kvclient_fetch_free(ra_kvclient_fetch *f) {
  if (!f) return;
  if (f->call) ra_rpc_call_destroy(f->call);
  if (f->reply) rakv__fetch_clusters_reply__free_unpacked(f->reply, NULL);
  free(f);
}

/* ---- Attend ---- */

int ra_kvclient_attend_open(ra_kvclient *c, const ra_kvclient_session *s,
                            ra_kvclient_stream **out, ra_error *err) {
  ra_kvclient_stream *st = calloc(1, sizeof *st);
  if (!st) return ra_errorf(err, RA_ENOMEM, "out of memory");
  st->c = c;
  st->s = *s;
  *out = st;
  return RA_OK;
}

/* A stream's polite end: half-close and collect the OK status (a stream with no reply awaited);
 * the caller's destroy then cancels it if that failed. */
static void stream_end(ra_rpc_call *call, ra_buf *rx) {
  ra_error ignored;
  if (call && ra_rpc_call_close_send(call, &ignored) == RA_OK && ra_rpc_call_recv(call, rx, 1000, &ignored) == RA_EOF)
    ra_rpc_call_finish(call, &ignored);
}

void ra_kvclient_attend_close(ra_kvclient_stream *st) {
  if (!st) return;
  stream_end(st->call, &st->rx);
  ra_kvclient_attend_abort(st);
}

void ra_kvclient_attend_abort(ra_kvclient_stream *st) {
  if (!st) return;
  ra_rpc_call_destroy(st->call);
  ra_buf_free(&st->tx);
  ra_buf_free(&st->rx);
  free(st);
}

static void stream_break(ra_kvclient_stream *st) {
  ra_rpc_call_destroy(st->call);
  st->call = NULL;
}

/* Copies a reply into the caller's partials after checking it answers the request (seq, heads). */
static int attend_take(const ra_kvclient *c, uint32_t head_dim, uint64_t seq, const ra_kvclient_attend_req *req,
                       const Rakv__AttendReply *r, ra_head_partial *out, ra_head_partial *retro,
                       uint64_t *compute_us, uint64_t *retro_us, ra_error *err) {
  const size_t n_retro = retro ? (size_t)req->n_retro * req->n_heads : 0;
  if (r->seq != seq || r->n_heads != req->n_heads || r->n_retro != n_retro)
    return ra_errorf(err, RA_EFORMAT, "%s: AttendReply seq %llu with %zu heads answers no request",
                     ra_kvclient_addr(c), (unsigned long long)r->seq, r->n_heads);
  for (size_t i = 0; i < r->n_heads; i++)
    if (r->heads[i]->q_head != req->q_heads[i] || kvs_wire_partial_from_proto(r->heads[i], head_dim, &out[i]) != RA_OK)
      return bad_reply(c, "HeadPartial", err);
  for (size_t i = 0; i < n_retro; i++) {
    retro[i].ids = NULL;
    retro[i].ids_cap = 0;
    if (r->retro[i]->q_head != req->q_heads[i % req->n_heads] ||
        kvs_wire_partial_from_proto(r->retro[i], head_dim, &retro[i]) != RA_OK)
      return bad_reply(c, "retro HeadPartial", err);
  }
  if (compute_us) *compute_us = r->compute_us;
  if (retro_us) *retro_us = r->retro_us;
  return RA_OK;
}

static int attend_unpack(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                         ra_head_partial *out, ra_head_partial *retro, uint64_t *compute_us,
                         uint64_t *retro_us, ra_error *err) {
  Rakv__AttendReply *r = rakv__attend_reply__unpack(NULL, st->rx.len, st->rx.data);
  if (!r) return bad_reply(st->c, "AttendReply", err);
  int rc = attend_take(st->c, st->s.geo.head_dim, st->seq, req, r, out, retro, compute_us, retro_us, err);
  rakv__attend_reply__free_unpacked(r, NULL);
  return rc;
}

/* The request message of req for session s; it points into req and s (and *sp). */
static int attend_msg(const ra_kvclient_session *s, const ra_kvclient_attend_req *req, uint64_t seq,
                      Rakv__AttendRequest *m, Rakv__SearchParams *sp, ra_error *err) {
  rakv__attend_request__init(m);
  int rc = kvs_wire_mode_to_proto(req->mode, &m->mode, err);
  if (rc) return rc;
  m->session_id.data = (uint8_t *)s->id;
  m->session_id.len = sizeof s->id;
  m->layer = req->layer;
  m->n_q_heads = req->n_heads;
  m->q_heads = (uint32_t *)req->q_heads;
  m->q.data = (uint8_t *)req->q;
  m->q.len = req->n_heads * (size_t)s->geo.head_dim * sizeof(float);
  m->top_k = req->top_k;
  m->search = kvs_wire_search_spec_to_proto(&req->search, sp) ? sp : NULL;
  m->seq = seq;
  m->return_ids = req->want_ids != 0;
  size_t n_clusters = 0;
  for (size_t i = 0; req->cluster_counts && i < req->n_cluster_heads; i++) n_clusters += req->cluster_counts[i];
  m->n_cluster_kv_heads = m->n_cluster_counts = req->n_cluster_heads;
  m->cluster_kv_heads = (uint32_t *)req->cluster_kv_heads;
  m->cluster_counts = (uint32_t *)req->cluster_counts;
  m->n_clusters = n_clusters;
  m->clusters = (uint32_t *)req->clusters;
  m->retro_step = req->retro_step;
  m->retro_window = req->retro_window;
  m->n_retro = req->n_retro;
  m->retro_q.data = (uint8_t *)req->retro_q;
  m->retro_q.len = req->retro_q ? (size_t)req->n_retro * req->n_heads * s->geo.head_dim * sizeof(float) : 0;
  if (req->retro_cluster_counts) {
    m->n_retro_cluster_counts = (size_t)req->n_retro * req->n_cluster_heads;
    m->retro_cluster_counts = (uint32_t *)req->retro_cluster_counts;
    for (size_t i = 0; i < m->n_retro_cluster_counts; i++) m->n_retro_clusters += req->retro_cluster_counts[i];
    m->retro_clusters = (uint32_t *)req->retro_clusters;
  }
  return RA_OK;
}

int ra_kvclient_attend_send(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                            ra_error *err) {
  int rc;
  if (!st->call) {
    rc = ra_rpc_call_start(st->c->ch, "/rakv.KvStore/Attend", 0, &st->call, err);
    if (rc) {
      st->call = NULL;
      return rc;
    }
  }
  Rakv__SearchParams sp;
  Rakv__AttendRequest m;
  if ((rc = attend_msg(&st->s, req, ++st->seq, &m, &sp, err))) return rc;
  rc = pack(&m.base, &st->tx, err);
  if (rc == RA_OK) rc = ra_rpc_call_send(st->call, st->tx.data, st->tx.len, err);
  if (rc) stream_break(st);
  return rc;
}

int ra_kvclient_attend_recv(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                            ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                            ra_error *err) {
  return ra_kvclient_attend_recv_retro(st, req, out, NULL, timeout_ms, compute_us, NULL, err);
}

int ra_kvclient_attend_recv_retro(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                                  ra_head_partial *out, ra_head_partial *retro, int timeout_ms,
                                  uint64_t *compute_us, uint64_t *retro_us, ra_error *err) {
  if (!st->call)
    return ra_errorf(err, RA_ESTATE, "%s: no attend request in flight", ra_kvclient_addr(st->c));
  int rc = ra_rpc_call_recv(st->call, &st->rx, timeout_ms, err);
  if (rc == RA_EOF)
    rc = ra_errorf(err, RA_EUNAVAIL, "%s: the store ended the Attend stream",
                   ra_kvclient_addr(st->c));
  if (rc == RA_OK) rc = attend_unpack(st, req, out, req->n_retro ? retro : NULL, compute_us, retro_us, err);
  if (rc) stream_break(st);
  return rc;
}

int ra_kvclient_attend(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                       ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                       ra_error *err) {
  int rc = ra_kvclient_attend_send(st, req, err);
  return rc ? rc : ra_kvclient_attend_recv(st, req, out, timeout_ms, compute_us, err);
}

/* ---- AttendBatch ---- */

typedef struct batch_item {
  ra_kvclient_session s;
  ra_kvclient_attend_req req;
} batch_item;

/* A message sent whose replies have not all come: they come in order, one per item. */
typedef struct batch_flight {
  uint64_t seq;
  size_t n_items, n_got;
} batch_flight;

struct ra_kvclient_batch {
  ra_kvclient *c;
  ra_rpc_call *call; /* NULL until the first send, and after a failure */
  uint64_t seq;      /* of the last message sent */
  batch_item *items; /* staged for the next send */
  size_t n_items, cap_items;
  batch_flight *flights; /* ring of the messages in flight */
  size_t flight0, n_flights, cap_flights;
  Rakv__AttendRequest *msgs;
  Rakv__AttendRequest **ptrs;
  Rakv__SearchParams *sps;
  size_t cap_msgs;
  ra_buf tx, rx;
};

struct ra_kvclient_batch_reply {
  const ra_kvclient *c;
  Rakv__AttendBatchReply *r;
};

int ra_kvclient_batch_open(ra_kvclient *c, ra_kvclient_batch **out, ra_error *err) {
  ra_kvclient_batch *b = calloc(1, sizeof *b);
  if (!b) return ra_errorf(err, RA_ENOMEM, "out of memory for an AttendBatch stream");
  b->c = c;
  *out = b;
  return RA_OK;
}

static void batch_break(ra_kvclient_batch *b) {
  ra_rpc_call_destroy(b->call);
  b->call = NULL;
  b->n_flights = 0;
}

void ra_kvclient_batch_close(ra_kvclient_batch *b) {
  if (!b) return;
  if (b->n_flights == 0) stream_end(b->call, &b->rx);
  ra_rpc_call_destroy(b->call);
  free(b->items);
  free(b->flights);
  free(b->msgs);
  free(b->ptrs);
  free(b->sps);
  ra_buf_free(&b->tx);
  ra_buf_free(&b->rx);
  free(b);
}

int ra_kvclient_batch_add(ra_kvclient_batch *b, const ra_kvclient_session *s, const ra_kvclient_attend_req *req,
                          size_t *item, ra_error *err) {
  if (req->n_retro)
    return ra_errorf(err, RA_EINVAL, "%s: an AttendBatch item cannot carry retro queries", ra_kvclient_addr(b->c));
  if (b->n_items == b->cap_items) {
    size_t cap = b->cap_items ? 2 * b->cap_items : 8;
    batch_item *items = realloc(b->items, cap * sizeof *items);
    if (!items) return ra_errorf(err, RA_ENOMEM, "out of memory staging %zu attends", cap);
    b->items = items;
    b->cap_items = cap;
  }
  *item = b->n_items;
  b->items[b->n_items++] = (batch_item){*s, *req};
  return RA_OK;
}

size_t ra_kvclient_batch_staged(const ra_kvclient_batch *b) { return b->n_items; }

/* Room for n messages' structures and one more flight. */
static int batch_reserve(ra_kvclient_batch *b, size_t n, ra_error *err) {
  if (n > b->cap_msgs) {
    free(b->msgs);
    free(b->ptrs);
    free(b->sps);
    b->msgs = malloc(n * sizeof *b->msgs);
    b->ptrs = malloc(n * sizeof *b->ptrs);
    b->sps = malloc(n * sizeof *b->sps);
    b->cap_msgs = b->msgs && b->ptrs && b->sps ? n : 0;
    if (!b->cap_msgs) return ra_errorf(err, RA_ENOMEM, "out of memory for a batch of %zu attends", n);
  }
  if (b->n_flights == b->cap_flights) {
    size_t cap = b->cap_flights ? 2 * b->cap_flights : 4;
    batch_flight *f = malloc(cap * sizeof *f);
    if (!f) return ra_errorf(err, RA_ENOMEM, "out of memory for AttendBatch messages in flight");
    for (size_t i = 0; i < b->n_flights; i++) f[i] = b->flights[(b->flight0 + i) % b->cap_flights];
    free(b->flights);
    b->flights = f;
    b->flight0 = 0;
    b->cap_flights = cap;
  }
  return RA_OK;
}

int ra_kvclient_batch_send(ra_kvclient_batch *b, ra_error *err) {
  const size_t n = b->n_items;
  b->n_items = 0;
  if (!n) return ra_errorf(err, RA_EINVAL, "%s: an AttendBatch message of no items", ra_kvclient_addr(b->c));
  int rc = batch_reserve(b, n, err);
  for (size_t i = 0; i < n && rc == RA_OK; i++) {
    /* an item's own seq is its layer: its reply echoes it (attend_take checks) */
    rc = attend_msg(&b->items[i].s, &b->items[i].req, b->items[i].req.layer, &b->msgs[i], &b->sps[i], err);
    b->ptrs[i] = &b->msgs[i];
  }
  if (rc) return rc;
  if (!b->call && (rc = ra_rpc_call_start(b->c->ch, "/rakv.KvStore/AttendBatch", 0, &b->call, err)) != RA_OK) {
    b->call = NULL;
    return rc;
  }
  Rakv__AttendBatchRequest m = RAKV__ATTEND_BATCH_REQUEST__INIT;
  m.seq = ++b->seq;
  m.n_items = n;
  m.items = b->ptrs;
  rc = pack(&m.base, &b->tx, err);
  if (rc == RA_OK) rc = ra_rpc_call_send(b->call, b->tx.data, b->tx.len, err);
  if (rc) {
    batch_break(b);
    return rc;
  }
  b->flights[(b->flight0 + b->n_flights++) % b->cap_flights] = (batch_flight){m.seq, n, 0};
  return RA_OK;
}

int ra_kvclient_batch_recv(ra_kvclient_batch *b, int timeout_ms, ra_kvclient_batch_reply **out, ra_error *err) {
  *out = NULL;
  if (!b->call || !b->n_flights)
    return ra_errorf(err, RA_ESTATE, "%s: no AttendBatch reply awaited", ra_kvclient_addr(b->c));
  batch_flight *f = &b->flights[b->flight0];
  int rc = ra_rpc_call_recv(b->call, &b->rx, timeout_ms, err);
  if (rc == RA_EOF) rc = ra_errorf(err, RA_EUNAVAIL, "%s: the store ended the AttendBatch stream", ra_kvclient_addr(b->c));
  Rakv__AttendBatchReply *r = NULL;
  if (rc == RA_OK && !(r = rakv__attend_batch_reply__unpack(NULL, b->rx.len, b->rx.data)))
    rc = bad_reply(b->c, "AttendBatchReply", err);
  if (rc == RA_OK && (r->seq != f->seq || r->item != f->n_got || !r->result))
    rc = ra_errorf(err, RA_EFORMAT, "%s: AttendBatchReply seq %llu item %u, want seq %llu item %zu",
                   ra_kvclient_addr(b->c), (unsigned long long)r->seq, r->item, (unsigned long long)f->seq, f->n_got);
  ra_kvclient_batch_reply *rep = NULL;
  if (rc == RA_OK && !(rep = malloc(sizeof *rep))) rc = ra_errorf(err, RA_ENOMEM, "out of memory for a batch reply");
  if (rc) {
    if (r) rakv__attend_batch_reply__free_unpacked(r, NULL);
    batch_break(b);
    return rc;
  }
  if (++f->n_got == f->n_items) {
    b->flight0 = (b->flight0 + 1) % b->cap_flights;
    b->n_flights--;
  }
  *rep = (ra_kvclient_batch_reply){b->c, r};
  *out = rep;
  return RA_OK;
}

int ra_kvclient_batch_reply_take(const ra_kvclient_batch_reply *rep, const ra_kvclient_session *s,
                                 const ra_kvclient_attend_req *req, ra_head_partial *out, uint64_t *compute_us,
                                 ra_error *err) {
  const Rakv__AttendItemReply *it = rep->r->result;
  if (it->code != 0) {
    int code = ra_status_from_grpc((int)it->code);
    return ra_errorf(err, code == RA_OK ? RA_EINTERNAL : code, "%s: %s", ra_kvclient_addr(rep->c),
                     it->message ? it->message : "");
  }
  if (!it->reply) return bad_reply(rep->c, "AttendItemReply (no reply)", err);
  int rc = attend_take(rep->c, s->geo.head_dim, req->layer, req, it->reply, out, NULL, NULL, NULL, err);
  if (rc == RA_OK && compute_us) *compute_us = rep->r->compute_us;
  return rc;
}

void ra_kvclient_batch_reply_free(ra_kvclient_batch_reply *rep) {
  if (!rep) return;
  rakv__attend_batch_reply__free_unpacked(rep->r, NULL);
  free(rep);
}
