/* The service layer over serialized protobuf: a full session round trip and every bad-input
 * class with the RA code it must produce (which common/rpc.c maps to a gRPC status); BuildIndex
 * and the index modes: validation, budget refusal, insertion on append, memory given back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "kvstore.pb-c.h"
#include "client.h"
#include "clusters.h"
#include "service.h"
#include "topk.h"

/* The wire contract of BuildIndexRequest.key_top_queries, as the client writes it and the
 * index reads it. */
_Static_assert(RA_KVCLIENT_NO_QUERY == RA_INDEX_NO_QUERY && RA_KVCLIENT_KEY_TOP_MAX == RA_INDEX_KEY_TOP_MAX,
               "client.h and index.h disagree on the key lists");

#define DIM 16

/* Two credentials, as the server names them (service.h kvs_caller): the fixture's session is
 * tenant A's. */
static const kvs_caller tenant_a = {.principal = "token 1", .peer = "ipv4:127.0.0.1:1"};
static const kvs_caller tenant_b = {.principal = "token 2", .peer = "ipv4:127.0.0.1:2"};

typedef struct fx {
  kvs_service *svc;
  const kvs_caller *who; /* the caller of call() */
  uint8_t id[16];
  ra_buf reply;
  ra_error err;
  int threads; /* the service's attend threads */
} fx;

static size_t pack(const ProtobufCMessage *m, uint8_t **out) {
  size_t n = protobuf_c_message_get_packed_size(m);
  *out = malloc(n ? n : 1);
  return protobuf_c_message_pack(m, *out);
}

typedef int (*unary_fn)(kvs_service *, const kvs_caller *, const uint8_t *, size_t, ra_buf *, ra_error *);

static int call(fx *f, unary_fn fn, const ProtobufCMessage *m) {
  uint8_t *b;
  size_t n = pack(m, &b);
  ra_error_clear(&f->err);
  int rc = fn(f->svc, f->who, b, n, &f->reply, &f->err);
  free(b);
  return rc;
}

static void expect_msg(const fx *f, const char *text) {
  if (!strstr(f->err.msg, text)) fail_msg("message '%s' lacks '%s'", f->err.msg, text);
}

/* Geometry 2 layers x 4 q heads x 2 kv heads x 16, f32; the session owns layer 1 kv head 0,
 * tokens [0, open). */
static int fx_open_threads(void **state, uint64_t budget, int threads) {
  fx *f = calloc(1, sizeof *f);
  f->who = &tenant_a;
  f->threads = threads;
  kvs_service_config cfg = {.memory_budget = budget, .attend_threads = threads};
  if (kvs_service_create(&cfg, &f->svc, &f->err) != RA_OK) return -1;
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 2;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = DIM;
  g.dtype = RAKV__DTYPE__DTYPE_F32;
  Rakv__Shard sh = RAKV__SHARD__INIT;
  sh.layer = 1;
  Rakv__Shard *shp = &sh;
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  req.geometry = &g;
  req.n_shards = 1;
  req.shards = &shp;
  req.client = "test";
  if (call(f, kvs_service_open_session, &req.base) != RA_OK) return -1;
  Rakv__OpenSessionReply *r = rakv__open_session_reply__unpack(NULL, f->reply.len, f->reply.data);
  if (!r || r->session_id.len != 16) return -1;
  memcpy(f->id, r->session_id.data, 16);
  rakv__open_session_reply__free_unpacked(r, NULL);
  *state = f;
  return 0;
}

static int fx_open(void **state, uint64_t budget) { return fx_open_threads(state, budget, 1); }

static int fx_setup(void **state) { return fx_open(state, 1 << 20); }
/* More attend threads than a test's batches have items: AttendBatch runs them one after another. */
static int fx_setup_threads8(void **state) { return fx_open_threads(state, 1 << 20, 8); }
/* 50000 rows of 16 f32 (6.4 MB, its growth slack included) leave well under 1 MB free. */
static int fx_setup_8m(void **state) { return fx_open(state, 8u << 20); }
/* Room for indexes: a build's estimate includes fixed-size blocks of several MiB. */
static int fx_setup_big(void **state) { return fx_open(state, 64u << 20); }

static int fx_teardown(void **state) {
  fx *f = *state;
  kvs_service_destroy(f->svc);
  ra_buf_free(&f->reply);
  free(f);
  return 0;
}

/* A chunk of tokens [begin, begin + n) of (layer, kv head) whose rows are all `value`. */
static void chunk_init(Rakv__KvChunk *c, const uint8_t *id, uint32_t layer, uint32_t head,
                       uint64_t begin, uint32_t n, float *buf, float value) {
  rakv__kv_chunk__init(c);
  for (size_t i = 0; i < (size_t)n * DIM; i++) buf[i] = value;
  c->session_id.data = (uint8_t *)id;
  c->session_id.len = 16;
  c->layer = layer;
  c->kv_head = head;
  c->token_begin = begin;
  c->n_tokens = n;
  c->keys.data = c->values.data = (uint8_t *)buf;
  c->keys.len = c->values.len = (size_t)n * DIM * 4;
}

static int put(fx *f, kvs_put_state *st, const Rakv__KvChunk *c) {
  uint8_t *b;
  size_t n = pack(&c->base, &b);
  ra_error_clear(&f->err);
  int rc = kvs_service_put_chunk(f->svc, st, b, n, &f->err);
  free(b);
  return rc;
}

/* An Append of one chunk. */
static void append_init(Rakv__AppendRequest *ar, const uint8_t *id, Rakv__KvChunk **chunk) {
  rakv__append_request__init(ar);
  ar->session_id.data = (uint8_t *)id;
  ar->session_id.len = 16;
  ar->n_chunks = 1;
  ar->chunks = chunk;
}

/* A whole PutKv stream of one chunk: begin, the chunk, finish. */
static int put_stream(fx *f, const Rakv__KvChunk *c) {
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  int rc = put(f, &st, c);
  if (rc == RA_OK) rc = kvs_service_put_finish(f->svc, &st, &f->reply, &f->err);
  return rc;
}

static void attend_init(Rakv__AttendRequest *a, const uint8_t *id, uint32_t *heads, size_t n,
                        float *q) {
  rakv__attend_request__init(a);
  a->session_id.data = (uint8_t *)id;
  a->session_id.len = 16;
  a->layer = 1;
  a->n_q_heads = n;
  a->q_heads = heads;
  a->q.data = (uint8_t *)q;
  a->q.len = n * DIM * 4;
}

static Rakv__StatsReply *stats(fx *f) {
  Rakv__StatsRequest req = RAKV__STATS_REQUEST__INIT;
  assert_int_equal(call(f, kvs_service_stats, &req.base), RA_OK);
  Rakv__StatsReply *s = rakv__stats_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_non_null(s);
  return s;
}

static void test_round_trip(void **state) {
  fx *f = *state;
  float buf[100 * DIM];
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 60, buf, 0.25f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  chunk_init(&c, f->id, 1, 0, 60, 40, buf, 0.25f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  assert_int_equal(kvs_service_put_finish(f->svc, &st, &f->reply, &f->err), RA_OK);
  Rakv__PutKvReply *pr = rakv__put_kv_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(pr->tokens_stored, 100);
  assert_int_equal(pr->bytes_stored, 100 * DIM * 4 * 2);
  rakv__put_kv_reply__free_unpacked(pr, NULL);

  /* Append one token whose value stands out, then attend: it must be seen. */
  chunk_init(&c, f->id, 1, 0, 100, 1, buf, 4.0f);
  Rakv__AppendRequest ar;
  Rakv__KvChunk *cp = &c;
  append_init(&ar, f->id, &cp);
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_OK);

  uint32_t heads[2] = {1, 0};
  float q[2 * DIM];
  for (int i = 0; i < 2 * DIM; i++) q[i] = 1.0f;
  Rakv__AttendRequest a;
  attend_init(&a, f->id, heads, 2, q);
  a.seq = 99;
  a.mode = RAKV__ATTEND_MODE__MODE_FLAT;
  a.top_k = 1;
  a.return_ids = 1;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_non_null(rep);
  assert_int_equal(rep->seq, 99);
  assert_int_equal(rep->n_heads, 2);
  for (int h = 0; h < 2; h++) {
    Rakv__HeadPartial *p = rep->heads[h];
    assert_int_equal(p->q_head, heads[h]);
    assert_int_equal(p->n_keys, 101);
    assert_int_equal(p->n_ids, 1);
    assert_int_equal(p->ids[0], 100);
    assert_int_equal(p->o.len, DIM * 4);
    float o0;
    memcpy(&o0, p->o.data, 4);
    assert_true(o0 == 4.0f);
    /* z = q·k / sqrt(16) = 16 * 4 / 4 */
    assert_true(fabsf(p->m - 16.0f) < 1e-5f && p->l == 1.0f);
  }
  rakv__attend_reply__free_unpacked(rep, NULL);

  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->sessions, 1);
  assert_int_equal(s->tokens, 101);
  assert_int_equal(s->attend_requests, 1);
  assert_int_equal(s->errors, 0);
  assert_int_equal(s->bytes_budget, 1 << 20);
  uint64_t used = s->bytes_used;
  rakv__stats_reply__free_unpacked(s, NULL);

  Rakv__CloseSessionRequest cr = RAKV__CLOSE_SESSION_REQUEST__INIT;
  cr.session_id.data = f->id;
  cr.session_id.len = 16;
  assert_int_equal(call(f, kvs_service_close_session, &cr.base), RA_OK);
  Rakv__CloseSessionReply *crep =
      rakv__close_session_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(crep->bytes_freed, used);
  rakv__close_session_reply__free_unpacked(crep, NULL);
  s = stats(f);
  assert_int_equal(s->sessions, 0);
  assert_int_equal(s->bytes_used, 0);
  assert_int_equal(s->tokens, 0);
  rakv__stats_reply__free_unpacked(s, NULL);
  assert_int_equal(call(f, kvs_service_close_session, &cr.base), RA_ENOTFOUND);
}

static void test_garbage_and_truncated(void **state) {
  fx *f = *state;
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  unary_fn fns[] = {kvs_service_open_session, kvs_service_append, kvs_service_attend,
                    kvs_service_build_index, kvs_service_close_session, kvs_service_stats,
                    kvs_service_health};
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    assert_int_equal(fns[i](f->svc, f->who, garbage, sizeof garbage, &f->reply, &f->err), RA_EFORMAT);
    expect_msg(f, "malformed protobuf (7 bytes)");
  }
  /* A valid attend request cut short in the middle of its q bytes. */
  uint32_t head = 0;
  float q[DIM] = {0};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  uint8_t *b;
  size_t n = pack(&a.base, &b);
  assert_int_equal(kvs_service_attend(f->svc, f->who, b, n - 5, &f->reply, &f->err), RA_EFORMAT);
  free(b);
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  assert_int_equal(kvs_service_put_chunk(f->svc, &st, garbage, sizeof garbage, &f->err),
                   RA_EFORMAT);
  expect_msg(f, "chunk 0: KvChunk: malformed");
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->errors, 9);
  rakv__stats_reply__free_unpacked(s, NULL);
}

static void test_bad_session_ids(void **state) {
  fx *f = *state;
  uint8_t other[16] = {1, 2, 3};
  uint32_t head = 0;
  float q[DIM] = {0};
  Rakv__AttendRequest a;
  attend_init(&a, other, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_ENOTFOUND);
  expect_msg(f, "no session");
  a.session_id.len = 3;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "session id is 3 bytes, want 16");
  float buf[DIM];
  Rakv__KvChunk c;
  chunk_init(&c, other, 1, 0, 0, 1, buf, 1.0f);
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  assert_int_equal(put(f, &st, &c), RA_ENOTFOUND);
  /* An append's chunk naming another session. */
  Rakv__AppendRequest ar;
  Rakv__KvChunk *cp = &c;
  append_init(&ar, f->id, &cp);
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_EINVAL);
  expect_msg(f, "differs");
}

static void test_bad_chunks(void **state) {
  fx *f = *state;
  float buf[8 * DIM];
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 2, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "layer 2 out of range [0, 2)");
  chunk_init(&c, f->id, 1, 2, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "kv head 2 out of range [0, 2)");
  chunk_init(&c, f->id, 0, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "layer 0 kv head 0 has no shard");
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  c.keys.len -= 4;
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "keys are 252 bytes, want 256");
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  c.values.len = 512;
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "values are 512 bytes, want 256");
  chunk_init(&c, f->id, 1, 0, 0, 0, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "n_tokens is 0");
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put_stream(f, &c), RA_OK);
  assert_int_equal(put_stream(f, &c), RA_EINVAL);
  expect_msg(f, "overlap: tokens [0, 4)");
  chunk_init(&c, f->id, 1, 0, 8, 4, buf, 1.0f);
  assert_int_equal(put_stream(f, &c), RA_EINVAL);
  expect_msg(f, "hole: tokens [8, 12)");
  chunk_init(&c, f->id, 1, 0, UINT64_MAX - 2, 4, buf, 1.0f);
  assert_int_equal(put_stream(f, &c), RA_EINVAL);
  expect_msg(f, "overflows");
}

/* Non-finite K or V: INVALID_ARGUMENT naming the element, nothing stored (PutKv and Append). */
static void test_nonfinite_refused(void **state) {
  fx *f = *state;
  float buf[4 * DIM];
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  float keys[4 * DIM];
  memcpy(keys, buf, sizeof keys);
  keys[2 * DIM + 5] = NAN;
  c.keys.data = (uint8_t *)keys;
  assert_int_equal(put_stream(f, &c), RA_EINVAL);
  expect_msg(f, "keys[2][5] (layer 1 kv head 0 position 2) is not finite");
  keys[2 * DIM + 5] = 0.0f;
  float vals[4 * DIM];
  memcpy(vals, buf, sizeof vals);
  vals[3 * DIM] = -INFINITY;
  c.values.data = (uint8_t *)vals;
  assert_int_equal(put_stream(f, &c), RA_EINVAL);
  expect_msg(f, "values[3][0] (layer 1 kv head 0 position 3) is not finite");
  Rakv__AppendRequest ar;
  Rakv__KvChunk *cp = &c;
  append_init(&ar, f->id, &cp);
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_EINVAL);
  expect_msg(f, "values[3][0] (layer 1 kv head 0 position 3) is not finite");
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->tokens, 0);
  rakv__stats_reply__free_unpacked(s, NULL);
  /* A NaN query is refused too (its partial would be NaN). */
  uint32_t head = 0;
  float q[DIM] = {0};
  q[3] = NAN;
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "q[0][3] is not finite");
}

/* A PutKv stream is all or nothing: a failing chunk drops the earlier ones, an abort (the stream
 * cancelled) drops everything, the shard is closed to other writers meanwhile, and a retry from
 * the start succeeds. */
static void test_put_all_or_nothing(void **state) {
  fx *f = *state;
  float buf[8 * DIM];
  Rakv__KvChunk c;
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  chunk_init(&c, f->id, 1, 0, 8, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "PutKv dropped, its 4 earlier tokens too");
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->tokens, 0);
  rakv__stats_reply__free_unpacked(s, NULL);

  kvs_service_put_begin(f->svc, f->who, &st);
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  /* staged rows are invisible, and the shard is the stream's until it ends */
  uint32_t head = 0;
  float q[DIM] = {1};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->heads[0]->n_keys, 0);
  rakv__attend_reply__free_unpacked(rep, NULL);
  chunk_init(&c, f->id, 1, 0, 0, 1, buf, 1.0f);
  Rakv__AppendRequest ar;
  Rakv__KvChunk *cp = &c;
  append_init(&ar, f->id, &cp);
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_ESTATE);
  expect_msg(f, "unfinished PutKv stream");
  kvs_service_put_abort(f->svc, &st);
  s = stats(f);
  assert_int_equal(s->tokens, 0);
  rakv__stats_reply__free_unpacked(s, NULL);

  /* the retry from the start, in two chunks, and then the rows are there */
  kvs_service_put_begin(f->svc, f->who, &st);
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  chunk_init(&c, f->id, 1, 0, 4, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  assert_int_equal(kvs_service_put_finish(f->svc, &st, &f->reply, &f->err), RA_OK);
  s = stats(f);
  assert_int_equal(s->tokens, 8);
  rakv__stats_reply__free_unpacked(s, NULL);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->heads[0]->n_keys, 8);
  rakv__attend_reply__free_unpacked(rep, NULL);
}

static void test_bad_attends(void **state) {
  fx *f = *state;
  uint32_t heads[2] = {0, 1};
  float q[2 * DIM] = {0};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, heads, 1, q);
  a.q.len = DIM * 4 - 4;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "q is 60 bytes, want 64");
  attend_init(&a, f->id, heads, 1, q);
  a.layer = 7;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "layer 7 out of range [0, 2)");
  attend_init(&a, f->id, heads, 1, q);
  heads[0] = 2;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "q head 2 (kv head 1) of layer 1 is not stored here");
  heads[0] = 9;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "q head 9 out of range [0, 4)");
  heads[0] = 0;
  a.mode = RAKV__ATTEND_MODE__MODE_KGRAPH;
  a.top_k = 10;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_ESTATE);
  expect_msg(f, "mode kgraph needs an index: none built for layer 1 q head 0 (shard tokens 0-open)");
  a.mode = RAKV__ATTEND_MODE__MODE_FLAT;
  a.top_k = 4000000000u;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "top_k 4000000000 out of range [1, 65536]");
  a.top_k = 10;
  a.mode = (Rakv__AttendMode)17;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "attend mode 17 is unknown");
}

static void test_bad_open(void **state) {
  fx *f = *state;
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "geometry missing");
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 2;
  g.n_q_heads = 6;
  g.n_kv_heads = 4;
  g.head_dim = 16;
  req.geometry = &g;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "n_q_heads 6 is not a multiple of n_kv_heads 4");
  g.n_q_heads = 8;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "at least one shard");
  Rakv__Shard s1 = RAKV__SHARD__INIT, s2 = RAKV__SHARD__INIT;
  s1.token_begin = 10;
  s1.token_end = 20;
  s2.token_begin = 15; /* open-ended from 15: overlaps [10, 20) */
  Rakv__Shard *shards[2] = {&s1, &s2};
  req.shards = shards;
  req.n_shards = 2;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "shards [10, 20) and [15, open) of layer 0 kv head 0 overlap");
  s2.kv_head = 4;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "kv head 4 out of range [0, 4)");
  g.dtype = (Rakv__DType)5;
  s2.kv_head = 1;
  assert_int_equal(call(f, kvs_service_open_session, &req.base), RA_EINVAL);
  expect_msg(f, "dtype 5");
}

static void test_budget_exhausted(void **state) {
  fx *f = *state;
  /* 1 MiB budget: 5000 tokens x 16 x 4 x 2 = 640 KB fits, another 5000 does not. */
  static float buf[5000 * DIM];
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 5000, buf, 0.5f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  assert_int_equal(kvs_service_put_finish(f->svc, &st, &f->reply, &f->err), RA_OK);
  chunk_init(&c, f->id, 1, 0, 5000, 5000, buf, 0.5f);
  assert_int_equal(put_stream(f, &c), RA_ENOMEM);
  expect_msg(f, "of budget 1048576");
  /* The session still works: attend sees the 5000 tokens, a small append fits. */
  chunk_init(&c, f->id, 1, 0, 5000, 10, buf, 0.5f);
  assert_int_equal(put_stream(f, &c), RA_OK);
  uint32_t head = 1;
  float q[DIM] = {1};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->heads[0]->n_keys, 5010);
  rakv__attend_reply__free_unpacked(rep, NULL);
}

/* ---- indexes ---- */

/* n tokens [begin, begin + n) of layer 1 kv head 0 from keys (values = keys). */
static void put_rows(fx *f, uint64_t begin, uint32_t n, const float *keys) {
  Rakv__KvChunk c;
  rakv__kv_chunk__init(&c);
  c.session_id.data = f->id;
  c.session_id.len = 16;
  c.layer = 1;
  c.token_begin = begin;
  c.n_tokens = n;
  c.keys.data = c.values.data = (uint8_t *)keys;
  c.keys.len = c.values.len = (size_t)n * DIM * 4;
  assert_int_equal(put_stream(f, &c), RA_OK);
}

/* Deterministic spread-out rows: x[i] in [-1, 1). */
static void fill_rows(float *x, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
  }
}

static void build_init(Rakv__BuildIndexRequest *b, Rakv__IndexParams *p, const uint8_t *id,
                       uint32_t q_head, Rakv__AttendMode kind) {
  rakv__build_index_request__init(b);
  rakv__index_params__init(p);
  b->session_id.data = (uint8_t *)id;
  b->session_id.len = 16;
  b->layer = 1;
  b->q_head = q_head;
  p->kind = kind;
  b->params = p;
}

static void set_queries(Rakv__BuildIndexRequest *b, const float *q, uint32_t n) {
  b->queries.data = (uint8_t *)q;
  b->queries.len = (size_t)n * DIM * 4;
  b->n_queries = n;
}

static uint64_t bytes_used(fx *f) {
  Rakv__StatsReply *s = stats(f);
  uint64_t b = s->bytes_used;
  rakv__stats_reply__free_unpacked(s, NULL);
  return b;
}

/* Attends q head `head` in `mode` with top_k k; returns the reply (caller frees). */
static Rakv__AttendReply *attend_one(fx *f, uint32_t head, const float *q, Rakv__AttendMode mode,
                                     uint32_t k) {
  uint32_t h = head;
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &h, 1, (float *)q);
  a.mode = mode;
  a.top_k = k;
  a.return_ids = 1;
  ra_error_clear(&f->err);
  if (call(f, kvs_service_attend, &a.base) != RA_OK) fail_msg("attend: %s", f->err.msg);
  return rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
}

static void test_build_index_validation(void **state) {
  fx *f = *state;
  static float keys[200 * DIM], q[4 * DIM];
  fill_rows(keys, 200 * DIM, 1);
  fill_rows(q, 4 * DIM, 2);
  put_rows(f, 0, 200, keys);
  Rakv__BuildIndexRequest b;
  Rakv__IndexParams p;
  uint8_t other[16] = {9};
  build_init(&b, &p, other, 0, RAKV__ATTEND_MODE__MODE_IVF);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_ENOTFOUND);
  expect_msg(f, "no session");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_IVF);
  b.layer = 7;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "layer 7 out of range [0, 2)");
  build_init(&b, &p, f->id, 9, RAKV__ATTEND_MODE__MODE_IVF);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "q head 9 out of range [0, 4)");
  build_init(&b, &p, f->id, 2, RAKV__ATTEND_MODE__MODE_IVF);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "q head 2 (kv head 1) of layer 1 is not stored here");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_FLAT);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "index kind flat");
  build_init(&b, &p, f->id, 0, (Rakv__AttendMode)9);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "index kind 9 is not ivf (2), kgraph (3) or roar (4)");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_FULL);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "no index kind");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_KGRAPH);
  p.degree = 5000;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "index degree 5000 out of range [2, 1024]");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_ROAR);
  p.query_sample = NAN;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "query_sample nan not in (0, 1]");
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_ROAR);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "a roar index needs the q head's prefill queries");
  set_queries(&b, q, 2);
  b.queries.len -= 4;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "queries are 124 bytes, want 128 (2 queries x head_dim 16 x 4)");
  uint64_t knn[6] = {0, 1, 2, 3, 4};
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_ROAR);
  b.n_queries = 2;
  b.knn_ids = knn;
  b.n_knn_ids = 5;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "knn_ids has 5 ids, not a multiple of n_queries 2");
  b.n_knn_ids = 2;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "knn lists of 1 ids: a roar index needs at least 2");
  /* Key lists: whole rows of key_top_k (1 to 64), with knn lists, naming queries that came. */
  uint64_t knn2[4] = {0, 1, 2, 3};
  uint32_t kt[4] = {0, 1, 5, RA_KVCLIENT_NO_QUERY};
  b.knn_ids = knn2;
  b.n_knn_ids = 4;
  b.key_top_queries = kt;
  b.n_key_top_queries = 3;
  b.key_top_k = 2;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "key_top_queries: 3 entries of 2 per key (1 to 64, and knn_ids with them)");
  b.n_key_top_queries = 4;
  b.key_top_k = 65;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "key_top_queries: 4 entries of 65 per key");
  b.key_top_k = 2;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "key_top_queries: key 1 names query 5 of 2");
  b.key_top_queries = NULL;
  b.n_key_top_queries = 0;
  b.key_top_k = 0;
  b.knn_ids = knn;
  /* Positions the shard does not hold are dropped: nothing is left to build from. */
  uint64_t far[6] = {500, 501, 502, 7, 900, 901};
  b.knn_ids = far;
  b.n_knn_ids = 6;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_EINVAL);
  expect_msg(f, "roar: no query has 2 knn ids among the 200 tokens of shard 0-open of layer 1 "
                "kv head 0 (ids outside a shard are dropped)");
  /* OpenSession checks the session's defaults the same way. */
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 1;
  g.n_q_heads = 2;
  g.n_kv_heads = 1;
  g.head_dim = DIM;
  Rakv__Shard sh = RAKV__SHARD__INIT, *shp = &sh;
  Rakv__OpenSessionRequest o = RAKV__OPEN_SESSION_REQUEST__INIT;
  Rakv__IndexParams ip = RAKV__INDEX_PARAMS__INIT;
  ip.kind = RAKV__ATTEND_MODE__MODE_ROAR;
  ip.knn_nq = 1;
  o.geometry = &g;
  o.n_shards = 1;
  o.shards = &shp;
  o.index = &ip;
  assert_int_equal(call(f, kvs_service_open_session, &o.base), RA_EINVAL);
  expect_msg(f, "index knn_nq 1 out of range [2, 65536]");
  ip.knn_nq = 0;
  ip.n_lists = 1u << 20;
  assert_int_equal(call(f, kvs_service_open_session, &o.base), RA_EINVAL);
  expect_msg(f, "index n_lists 1048576 out of range");
  ip.n_lists = 0;
  ip.keep_topk = 5000;
  assert_int_equal(call(f, kvs_service_open_session, &o.base), RA_EINVAL);
  expect_msg(f, "index keep_topk 5000 out of range [2, 1024]");
  ip.keep_topk = 0;
  ip.keep_queries = 1u << 20;
  assert_int_equal(call(f, kvs_service_open_session, &o.base), RA_EINVAL);
  expect_msg(f, "index keep_queries 1048576 out of range");
  ip.keep_queries = 0;
  ip.pivots = 1u << 20;
  assert_int_equal(call(f, kvs_service_open_session, &o.base), RA_EINVAL);
  expect_msg(f, "index pivots 1048576 out of range");
  /* None of it touched the session. */
  Rakv__AttendReply *r = attend_one(f, 0, q, RAKV__ATTEND_MODE__MODE_FLAT, 5);
  assert_int_equal(r->heads[0]->n_keys, 200);
  rakv__attend_reply__free_unpacked(r, NULL);
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->sessions, 1);
  rakv__stats_reply__free_unpacked(s, NULL);
}

/* Key -> query lists (BuildIndexRequest.key_top_queries) reach the roar build: with each key's
 * best 4 queries by margin, the build links (almost) no key by beam searches, and without them
 * most keys of a shard no sampled list covers are. The lists are for positions from
 * key_pos_begin on; rows of the shard they do not cover fall back to the beam searches. */
static float dot16(const float *a, const float *b) {
  float d = 0;
  for (int c = 0; c < DIM; c++) d += a[c] * b[c];
  return d;
}

static void test_build_index_key_lists(void **state) {
  fx *f = *state;
  enum { N = 1500, NQ = 48, KNN = 10, T = 4 };
  static float keys[N * DIM], q[NQ * DIM];
  static uint64_t knn[NQ * KNN];
  static uint32_t kt[N * T];
  float thr[NQ];
  fill_rows(keys, N * DIM, 11);
  fill_rows(q, NQ * DIM, 12);
  put_rows(f, 0, N, keys);
  /* brute force with the project's top-k heap: each query's top KNN positions, s_q the last;
   * then each key's best T queries by the margin q.k - s_q */
  ra_topk top;
  assert_int_equal(ra_topk_init(&top, KNN), RA_OK);
  for (int j = 0; j < NQ; j++) {
    ra_topk_reset(&top);
    for (int i = 0; i < N; i++) ra_topk_push(&top, dot16(q + j * DIM, keys + i * DIM), (uint32_t)i);
    ra_topk_sort(&top);
    for (int r = 0; r < KNN; r++) knn[j * KNN + r] = top.id[r];
    thr[j] = top.score[KNN - 1];
  }
  ra_topk_free(&top);
  assert_int_equal(ra_topk_init(&top, T), RA_OK);
  for (int i = 0; i < N; i++) {
    ra_topk_reset(&top);
    for (int j = 0; j < NQ; j++) ra_topk_push(&top, dot16(q + j * DIM, keys + i * DIM) - thr[j], (uint32_t)j);
    ra_topk_sort(&top);
    memcpy(kt + i * T, top.id, T * sizeof *kt);
  }
  ra_topk_free(&top);
  Rakv__BuildIndexRequest b;
  Rakv__IndexParams p;
  uint64_t repaired[3];
  for (int run = 0; run < 3; run++) {
    build_init(&b, &p, f->id, 1, RAKV__ATTEND_MODE__MODE_ROAR);
    set_queries(&b, q, NQ);
    b.knn_ids = knn;
    b.n_knn_ids = NQ * KNN;
    if (run > 0) {
      /* run 2: lists for the second half of the positions only */
      b.key_pos_begin = run == 1 ? 0 : N / 2;
      b.key_top_queries = kt + b.key_pos_begin * T;
      b.n_key_top_queries = (size_t)(N - b.key_pos_begin) * T;
      b.key_top_k = T;
    }
    ra_error_clear(&f->err);
    if (call(f, kvs_service_build_index, &b.base) != RA_OK) fail_msg("build: %s", f->err.msg);
    Rakv__BuildIndexReply *br = rakv__build_index_reply__unpack(NULL, f->reply.len, f->reply.data);
    assert_int_equal(br->n_keys, N);
    repaired[run] = br->n_repaired;
    rakv__build_index_reply__free_unpacked(br, NULL);
  }
  print_message("keys linked by beam searches: %llu without key lists, %llu with, %llu with half\n",
                (unsigned long long)repaired[0], (unsigned long long)repaired[1],
                (unsigned long long)repaired[2]);
  assert_true(repaired[0] > N / 4);
  assert_true(repaired[1] * 20 < repaired[0]);
  assert_true(repaired[2] > repaired[1] && repaired[2] < repaired[0]);
  /* the index answers: a query's top key comes back */
  Rakv__AttendReply *r = attend_one(f, 1, q, RAKV__ATTEND_MODE__MODE_ROAR, 5);
  assert_true(r->heads[0]->n_ids > 0);
  rakv__attend_reply__free_unpacked(r, NULL);
}

/* 1 MiB budget: 5000 tokens fit, a graph over them does not; nothing is left charged or
 * installed, and the session goes on. */
static void test_build_index_over_budget(void **state) {
  fx *f = *state;
  static float keys[5000 * DIM];
  fill_rows(keys, 5000 * DIM, 3);
  put_rows(f, 0, 5000, keys);
  uint64_t before = bytes_used(f);
  Rakv__BuildIndexRequest b;
  Rakv__IndexParams p;
  build_init(&b, &p, f->id, 1, RAKV__ATTEND_MODE__MODE_KGRAPH);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_ENOMEM);
  expect_msg(f, "building the kgraph index of layer 1 q head 1: memory budget exceeded");
  assert_int_equal(bytes_used(f), before);
  uint32_t head = 1;
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, keys);
  a.mode = RAKV__ATTEND_MODE__MODE_KGRAPH;
  a.top_k = 4;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_ESTATE);
  expect_msg(f, "mode kgraph needs an index: none built for layer 1 q head 1 (shard tokens "
                "0-open)");
  Rakv__AttendReply *r = attend_one(f, 1, keys, RAKV__ATTEND_MODE__MODE_FLAT, 4);
  assert_int_equal(r->heads[0]->n_keys, 5000);
  assert_int_equal(r->heads[0]->ids[0], 0); /* row 0 against itself */
  rakv__attend_reply__free_unpacked(r, NULL);
}

/* A token appended after the build is found at once: its key is the query, scaled up. Memory:
 * the build is charged, a rebuild replaces (same bytes), close gives everything back. */
static void test_index_insert_rebuild_close(void **state) {
  fx *f = *state;
  enum { N = 800, NQ = 64 };
  static float keys[N * DIM], q[NQ * DIM];
  fill_rows(keys, N * DIM, 4);
  fill_rows(q, NQ * DIM, 5);
  put_rows(f, 0, N, keys);
  uint64_t kv_bytes = bytes_used(f);
  Rakv__BuildIndexRequest b;
  Rakv__IndexParams p;
  build_init(&b, &p, f->id, 1, RAKV__ATTEND_MODE__MODE_ROAR);
  set_queries(&b, q, NQ);
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_OK);
  Rakv__BuildIndexReply *br = rakv__build_index_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(br->n_keys, N);
  uint64_t ix_bytes = br->index_bytes;
  assert_true(ix_bytes > N * 4);
  rakv__build_index_reply__free_unpacked(br, NULL);
  uint64_t built = bytes_used(f);
  assert_true(built >= kv_bytes + ix_bytes);
  /* The request's IndexParams reach the index: 16 kept queries (of the 64) instead of all of
   * them cost 48 x (16 x 2 bytes of fp16 query + 32 x 4 bytes of list + 12) fewer bytes. */
  p.keep_queries = 16;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_OK);
  br = rakv__build_index_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(ix_bytes - br->index_bytes, 48u * (DIM * 2 + 32 * 4 + 12));
  rakv__build_index_reply__free_unpacked(br, NULL);
  p.keep_queries = 0;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_OK);
  assert_int_equal(bytes_used(f), built);

  /* The index is q head 1's own: q head 0 of the same kv head has none. */
  uint32_t head = 0;
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  a.mode = RAKV__ATTEND_MODE__MODE_ROAR;
  a.top_k = 8;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_ESTATE);

  /* Token N: key and value 8 q, far above every other key's score for q. */
  float planted[DIM];
  Rakv__AppendRequest ar = RAKV__APPEND_REQUEST__INIT;
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, N, 1, planted, 0.0f);
  for (int d = 0; d < DIM; d++) planted[d] = 8.0f * q[d];
  Rakv__KvChunk *cp = &c;
  ar.session_id.data = f->id;
  ar.session_id.len = 16;
  ar.n_chunks = 1;
  ar.chunks = &cp;
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_OK);
  /* The Append returned before the insertion (store.h); wait for it, so that the attend below
   * finds the token through the graph rather than by an exact scan. */
  kvs_session *sess;
  assert_int_equal(kvs_store_get(kvs_service_store(f->svc), f->id, 16, &sess, &f->err), RA_OK);
  kvs_session_index_drain(sess);
  assert_int_equal(kvs_session_index_lag(sess), 0);
  kvs_session_release(sess);
  /* A beam of 64 walks the graph (ef >= N/4 would scan exactly, index.h). */
  uint32_t h1 = 1;
  Rakv__SearchParams sp = RAKV__SEARCH_PARAMS__INIT;
  sp.ef = 64;
  attend_init(&a, f->id, &h1, 1, q);
  a.mode = RAKV__ATTEND_MODE__MODE_ROAR;
  a.top_k = 8;
  a.return_ids = 1;
  a.search = &sp;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *r = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(r->heads[0]->n_keys, N + 1);
  assert_int_equal(r->heads[0]->ids[0], N);
  assert_true(r->heads[0]->n_scanned < N + 1);
  rakv__attend_reply__free_unpacked(r, NULL);

  /* per_kv_head: one shared ivf, named by q head 0, serves both q heads of the group. */
  build_init(&b, &p, f->id, 0, RAKV__ATTEND_MODE__MODE_IVF);
  p.per_kv_head = 1;
  assert_int_equal(call(f, kvs_service_build_index, &b.base), RA_OK);
  for (uint32_t h = 0; h < 2; h++) {
    r = attend_one(f, h, q, RAKV__ATTEND_MODE__MODE_IVF, 8);
    assert_int_equal(r->heads[0]->ids[0], N);
    rakv__attend_reply__free_unpacked(r, NULL);
  }

  Rakv__CloseSessionRequest cr = RAKV__CLOSE_SESSION_REQUEST__INIT;
  cr.session_id.data = f->id;
  cr.session_id.len = 16;
  assert_int_equal(call(f, kvs_service_close_session, &cr.base), RA_OK);
  assert_int_equal(bytes_used(f), 0);
}

/* PutClusters: every class of bad request gets its code and a message naming the problem, and
 * changes nothing; a wave attend's selection is checked too. */
typedef struct bad_put {
  uint32_t layer, kv_head, first;
  uint64_t row_begin;
  uint32_t counts[2];
  size_t n;
  uint32_t perm[4];
  size_t n_perm;
  int code;
  const char *msg;
} bad_put;

static int put_clusters(fx *f, uint32_t layer, uint32_t kv, uint32_t first, uint64_t row_begin,
                        uint32_t *counts, size_t n, uint32_t *perm, size_t n_perm) {
  Rakv__PutClustersRequest r = RAKV__PUT_CLUSTERS_REQUEST__INIT;
  r.session_id.data = f->id;
  r.session_id.len = 16;
  r.layer = layer;
  r.kv_head = kv;
  r.first_cluster = first;
  r.row_begin = row_begin;
  r.counts = counts;
  r.n_counts = n;
  r.perm = perm;
  r.n_perm = n_perm;
  return call(f, kvs_service_put_clusters, &r.base);
}

static void test_put_clusters_and_wave(void **state) {
  fx *f = *state;
  float buf[64 * DIM];
  kvs_put_state st;
  kvs_service_put_begin(f->svc, f->who, &st);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 64, buf, 0.5f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  assert_int_equal(kvs_service_put_finish(f->svc, &st, &f->reply, &f->err), RA_OK);
  uint32_t counts[4] = {8, 8, 8, 8};
  assert_int_equal(put_clusters(f, 1, 0, 10, 0, counts, 4, NULL, 0), RA_OK);
  Rakv__PutClustersReply *pr = rakv__put_clusters_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_non_null(pr);
  assert_int_equal(pr->n_clusters, 4);
  assert_int_equal(pr->rows_clustered, 32);
  assert_int_equal(pr->rows_lagging, 32);
  assert_true(pr->directory_bytes > 0);
  rakv__put_clusters_reply__free_unpacked(pr, NULL);

  const bad_put bad[] = {
      {.layer = 2, .counts = {4}, .n = 1, .code = RA_EINVAL, .msg = "layer 2 out of range"},
      {.layer = 1, .kv_head = 2, .counts = {4}, .n = 1, .code = RA_EINVAL, .msg = "kv head 2 out of range"},
      {.layer = 1, .kv_head = 1, .counts = {4}, .n = 1, .code = RA_EINVAL, .msg = "is not stored here"},
      {.layer = 1, .first = 14, .row_begin = 32, .n = 0, .code = RA_EINVAL, .msg = "counts is empty"},
      {.layer = 1, .first = 14, .row_begin = 32, .counts = {4, 0}, .n = 2, .code = RA_EINVAL,
       .msg = "cluster 15 has 0 rows"},
      {.layer = 1, .first = UINT32_MAX, .row_begin = 32, .counts = {4, 4}, .n = 2, .code = RA_EINVAL,
       .msg = "run past"},
      {.layer = 1, .first = 14, .row_begin = UINT64_MAX - 2, .counts = {4}, .n = 1, .code = RA_EINVAL,
       .msg = "overflow"},
      {.layer = 1, .first = 14, .row_begin = 32, .counts = {4}, .n = 1, .perm = {0, 1, 2}, .n_perm = 3,
       .code = RA_EINVAL, .msg = "perm has 3 entries, the clusters cover 4 rows"},
      {.layer = 1, .first = 14, .row_begin = 32, .counts = {4}, .n = 1, .perm = {0, 1, 2, 4}, .n_perm = 4,
       .code = RA_EINVAL, .msg = "perm[3] = 4 is out of range [0, 4)"},
      {.layer = 1, .first = 14, .row_begin = 32, .counts = {2, 2}, .n = 2, .perm = {0, 1, 1, 2},
       .n_perm = 4, .code = RA_EINVAL, .msg = "perm[2] = 1 repeats an entry: not a permutation"},
      {.layer = 1, .first = 14, .row_begin = 32, .counts = {40}, .n = 1, .code = RA_ESTATE,
       .msg = "not all stored yet"},
      {.layer = 1, .first = 14, .row_begin = 16, .counts = {4}, .n = 1, .code = RA_ESTATE,
       .msg = "already clustered"},
      {.layer = 1, .first = 14, .row_begin = 40, .counts = {4}, .n = 1, .code = RA_ESTATE,
       .msg = "start past row 32"},
      {.layer = 1, .first = 12, .row_begin = 32, .counts = {4}, .n = 1, .code = RA_ESTATE,
       .msg = "cluster 12 of layer 1 kv head 0 is already defined"},
      {.layer = 1, .first = 9, .row_begin = 32, .counts = {4, 4}, .n = 2, .code = RA_ESTATE,
       .msg = "cluster 10 of layer 1 kv head 0 is already defined"},
      {.layer = 1, .first = 3, .row_begin = 32, .counts = {4}, .n = 1, .code = RA_ESTATE,
       .msg = "out of order: 3 after 13"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const bad_put *b = &bad[i];
    uint32_t cnt[2], perm[4];
    memcpy(cnt, b->counts, sizeof cnt);
    memcpy(perm, b->perm, sizeof perm);
    int rc = put_clusters(f, b->layer, b->kv_head, b->first, b->row_begin, cnt, b->n,
                          b->n_perm ? perm : NULL, b->n_perm);
    if (rc != b->code)
      fail_msg("case %zu: %s (%s), want %s", i, ra_status_name(rc), f->err.msg, ra_status_name(b->code));
    expect_msg(f, b->msg);
  }
  uint8_t junk[3] = {0xff, 0xff, 0xff};
  ra_error_clear(&f->err);
  assert_int_equal(kvs_service_put_clusters(f->svc, f->who, junk, 3, &f->reply, &f->err), RA_EFORMAT);
  f->id[0] ^= 1;
  assert_int_equal(put_clusters(f, 1, 0, 14, 32, counts, 1, NULL, 0), RA_ENOTFOUND);
  f->id[0] ^= 1;
  /* Nothing was half applied: the next install fits exactly where the clusters ended. */
  uint32_t perm[8] = {7, 6, 5, 4, 3, 2, 1, 0};
  assert_int_equal(put_clusters(f, 1, 0, 14, 32, counts, 1, perm, 8), RA_OK);
  pr = rakv__put_clusters_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(pr->n_clusters, 5);
  assert_int_equal(pr->rows_clustered, 40);
  assert_int_equal(pr->rows_lagging, 24);
  rakv__put_clusters_reply__free_unpacked(pr, NULL);

  /* Wave attends: one cluster + the lag; then bad selections. */
  uint32_t heads[2] = {1, 0}, kv[1] = {0}, cc[1] = {1}, ids[1] = {12};
  float q[2 * DIM] = {0};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, heads, 2, q);
  a.mode = RAKV__ATTEND_MODE__MODE_WAVE;
  a.n_cluster_kv_heads = a.n_cluster_counts = a.n_clusters = 1;
  a.cluster_kv_heads = kv;
  a.cluster_counts = cc;
  a.clusters = ids;
  a.return_ids = 1;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->n_heads, 2);
  assert_int_equal(rep->heads[0]->n_scanned, 8 + 24);
  assert_int_equal(rep->heads[0]->n_keys, 64);
  assert_int_equal(rep->heads[0]->n_ids, 32);
  assert_int_equal(rep->heads[0]->ids[0], 16);
  assert_int_equal(rep->heads[0]->ids[8], 40);
  rakv__attend_reply__free_unpacked(rep, NULL);
  a.n_cluster_counts = 0;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "0 cluster_counts for 1 cluster_kv_heads");
  a.n_cluster_counts = 1;
  ids[0] = 9;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "cluster 9 of layer 1 kv head 0 is not held by this store");
  ids[0] = 12;
  kv[0] = 1;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "kv head 1, which no asked q head");
  kv[0] = 0;
  /* retro: past step 1 gets cluster 12's rows alone (no lag); its lists are checked */
  uint32_t rc_[1] = {1}, rids[1] = {12};
  float rq[2 * DIM] = {0};
  a.return_ids = 0;
  a.retro_step = 3;
  a.retro_window = 2;
  a.n_retro = 1;
  a.retro_q.data = (uint8_t *)rq;
  a.retro_q.len = sizeof rq;
  a.n_retro_cluster_counts = a.n_retro_clusters = 1;
  a.retro_cluster_counts = rc_;
  a.retro_clusters = rids;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->n_retro, 2);
  assert_int_equal(rep->retro[0]->q_head, 1);
  assert_int_equal(rep->retro[0]->n_scanned, 8);
  assert_int_equal(rep->heads[0]->n_scanned, 8 + 24);
  rakv__attend_reply__free_unpacked(rep, NULL);
  a.n_retro_clusters = 0;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "retro_cluster_counts sum to 1, but 0 retro cluster ids came");
  a.n_retro_clusters = 1;
  a.n_retro_cluster_counts = 0;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "retro_cluster_counts has 0 entries, want 1 past steps x 1 cluster_kv_heads");
  a.n_retro_cluster_counts = 1;
  a.mode = RAKV__ATTEND_MODE__MODE_FULL;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  a.retro_window = a.n_retro = 0;
  a.retro_q.len = 0;
  a.n_retro_cluster_counts = a.n_retro_clusters = 0;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EINVAL);
  expect_msg(f, "mode wave only");
}

/* FetchClusters: the rows of named clusters as stored (after a perm), in request order; bad
 * requests get their code and a message naming the problem. */
static int fetch(fx *f, uint32_t layer, uint32_t *kv, uint32_t *counts, size_t n_heads, size_t n_counts,
                 uint32_t *ids, size_t n_ids) {
  Rakv__FetchClustersRequest r = RAKV__FETCH_CLUSTERS_REQUEST__INIT;
  r.session_id.data = f->id;
  r.session_id.len = 16;
  r.layer = layer;
  r.kv_heads = kv;
  r.n_kv_heads = n_heads;
  r.counts = counts;
  r.n_counts = n_counts;
  r.clusters = ids;
  r.n_clusters = n_ids;
  return call(f, kvs_service_fetch_clusters, &r.base);
}

static void test_fetch_clusters(void **state) {
  fx *f = *state;
  enum { N = 64 };
  float keys[N * DIM];
  fill_rows(keys, N * DIM, 5);
  put_rows(f, 0, N, keys);
  uint32_t counts[4] = {8, 8, 8, 8}, perm[8] = {7, 6, 5, 4, 3, 2, 1, 0}, one[1] = {8};
  assert_int_equal(put_clusters(f, 1, 0, 10, 0, counts, 4, NULL, 0), RA_OK);
  assert_int_equal(put_clusters(f, 1, 0, 14, 32, one, 1, perm, 8), RA_OK);

  uint32_t kv[2] = {0, 0}, cc[2] = {3, 0}, ids[3] = {12, 14, 10};
  assert_int_equal(fetch(f, 1, kv, cc, 1, 1, ids, 3), RA_OK);
  Rakv__FetchClustersReply *r = rakv__fetch_clusters_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_non_null(r);
  assert_int_equal(r->n_rows, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(r->rows[i], 8);
  assert_int_equal(r->keys.len, 24 * DIM * 4);
  assert_int_equal(r->values.len, 24 * DIM * 4);
  /* cluster 12: rows [16, 24); 14: rows [32, 40) reversed by the perm; 10: rows [0, 8) */
  const float *k = (const float *)r->keys.data, *v = (const float *)r->values.data;
  for (int i = 0; i < 8; i++) {
    assert_memory_equal(k + i * DIM, keys + (16 + i) * DIM, DIM * 4);
    assert_memory_equal(k + (8 + i) * DIM, keys + (39 - i) * DIM, DIM * 4);
    assert_memory_equal(v + (16 + i) * DIM, keys + i * DIM, DIM * 4);
  }
  rakv__fetch_clusters_reply__free_unpacked(r, NULL);

  const struct {
    uint32_t layer, kv[2], counts[2];
    size_t n_heads, n_counts;
    uint32_t ids[3];
    size_t n_ids;
    int code;
    const char *msg;
  } bad[] = {
      {.layer = 2, .counts = {1}, .n_heads = 1, .n_counts = 1, .ids = {10}, .n_ids = 1, .code = RA_EINVAL,
       .msg = "layer 2 out of range [0, 2)"},
      {.layer = 1, .kv = {2}, .counts = {1}, .n_heads = 1, .n_counts = 1, .ids = {10}, .n_ids = 1,
       .code = RA_EINVAL, .msg = "kv head 2 out of range [0, 2)"},
      {.layer = 1, .counts = {1}, .n_heads = 1, .n_counts = 0, .ids = {10}, .n_ids = 1, .code = RA_EINVAL,
       .msg = "0 counts for 1 kv_heads"},
      {.layer = 1, .counts = {2}, .n_heads = 1, .n_counts = 1, .ids = {10}, .n_ids = 1, .code = RA_EINVAL,
       .msg = "counts sum to 2, but 1 cluster ids came"},
      {.layer = 1, .n_ids = 0, .code = RA_EINVAL, .msg = "no clusters asked for"},
      {.layer = 1, .counts = {1, 1}, .n_heads = 2, .n_counts = 2, .ids = {10, 11}, .n_ids = 2, .code = RA_EINVAL,
       .msg = "kv head 0 named twice"},
      {.layer = 1, .counts = {3}, .n_heads = 1, .n_counts = 1, .ids = {10, 13, 10}, .n_ids = 3, .code = RA_EINVAL,
       .msg = "cluster 10 of layer 1 kv head 0 named twice"},
      {.layer = 1, .counts = {2}, .n_heads = 1, .n_counts = 1, .ids = {10, 9}, .n_ids = 2, .code = RA_ENOTFOUND,
       .msg = "cluster 9 of layer 1 kv head 0 is not held by this store"},
      {.layer = 1, .kv = {1}, .counts = {1}, .n_heads = 1, .n_counts = 1, .ids = {10}, .n_ids = 1,
       .code = RA_ENOTFOUND, .msg = "cluster 10 of layer 1 kv head 1 is not held"},
      {.layer = 0, .counts = {1}, .n_heads = 1, .n_counts = 1, .ids = {10}, .n_ids = 1, .code = RA_ENOTFOUND,
       .msg = "cluster 10 of layer 0 kv head 0 is not held"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint32_t bk[2], bc[2], bi[3];
    memcpy(bk, bad[i].kv, sizeof bk);
    memcpy(bc, bad[i].counts, sizeof bc);
    memcpy(bi, bad[i].ids, sizeof bi);
    int rc = fetch(f, bad[i].layer, bk, bc, bad[i].n_heads, bad[i].n_counts, bi, bad[i].n_ids);
    if (rc != bad[i].code)
      fail_msg("case %zu: %s (%s), want %s", i, ra_status_name(rc), f->err.msg, ra_status_name(bad[i].code));
    expect_msg(f, bad[i].msg);
  }
  uint8_t junk[3] = {0xff, 0xff, 0xff};
  ra_error_clear(&f->err);
  assert_int_equal(kvs_service_fetch_clusters(f->svc, f->who, junk, 3, &f->reply, &f->err), RA_EFORMAT);
  f->id[0] ^= 1;
  assert_int_equal(fetch(f, 1, kv, cc, 1, 1, ids, 3), RA_ENOTFOUND);
  f->id[0] ^= 1;

  /* An answer over the reply's bound is refused, not truncated. */
  kvs_session *s;
  ra_error err;
  assert_int_equal(kvs_store_get(kvs_service_store(f->svc), f->id, 16, &s, &err), RA_OK);
  kvs_cluster_fetch cf = {.layer = 1, .kv_heads = kv, .counts = cc, .n_heads = 1, .ids = ids, .n_ids = 3,
                          .max_bytes = 24 * DIM * 4 * 2 - 1};
  kvs_cluster_rows rows;
  assert_int_equal(kvs_session_fetch_clusters(s, &cf, &rows, &err), RA_EINVAL);
  if (!strstr(err.msg, "more than a reply carries")) fail_msg("%s", err.msg);
  assert_null(rows.keys);
  cf.max_bytes++;
  assert_int_equal(kvs_session_fetch_clusters(s, &cf, &rows, &err), RA_OK);
  assert_int_equal(rows.n_rows, 24);
  kvs_cluster_rows_free(&rows);
  kvs_session_release(s);
}

/* A session is usable only with the credential that opened it; Stats show a caller its own
 * sessions; an in-process caller (NULL) may use any. */
static void test_sessions_bound_to_credential(void **state) {
  fx *f = *state;
  float buf[4 * DIM];
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 4, buf, 1.0f);
  assert_int_equal(put_stream(f, &c), RA_OK);
  f->who = &tenant_b;
  assert_int_equal(put_stream(f, &c), RA_EPERM);
  expect_msg(f, "another credential");
  uint32_t head = 0;
  float q[DIM] = {1};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_EPERM);
  chunk_init(&c, f->id, 1, 0, 4, 1, buf, 1.0f);
  Rakv__AppendRequest ar;
  Rakv__KvChunk *cp = &c;
  append_init(&ar, f->id, &cp);
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_EPERM);
  Rakv__CloseSessionRequest cr = RAKV__CLOSE_SESSION_REQUEST__INIT;
  cr.session_id.data = f->id;
  cr.session_id.len = 16;
  assert_int_equal(call(f, kvs_service_close_session, &cr.base), RA_EPERM);
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->sessions, 0);
  assert_int_equal(s->tokens, 0);
  assert_int_equal(s->bytes_used, 0);
  rakv__stats_reply__free_unpacked(s, NULL);
  f->who = &tenant_a;
  s = stats(f);
  assert_int_equal(s->sessions, 1);
  assert_int_equal(s->tokens, 4);
  assert_true(s->bytes_used > 0);
  rakv__stats_reply__free_unpacked(s, NULL);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  f->who = NULL;
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_OK);
  f->who = &tenant_a;
  assert_int_equal(call(f, kvs_service_close_session, &cr.base), RA_OK);
}

/* An attend whose working memory (top_k candidates per head and task, ids) does not fit what
 * the budget has left is RESOURCE_EXHAUSTED; a decode-sized one still runs on the full store. */
static void test_attend_memory_charged(void **state) {
  fx *f = *state;
  enum { N = 50000 };
  float *buf = calloc((size_t)N * DIM, sizeof *buf);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, N, buf, 0.0f);
  fill_rows(buf, (size_t)N * DIM, 3);
  assert_int_equal(put_stream(f, &c), RA_OK);
  free(buf);
  uint32_t heads[2] = {0, 1};
  float q[2 * DIM] = {1, 2, 3};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, heads, 2, q);
  a.mode = RAKV__ATTEND_MODE__MODE_FLAT;
  a.top_k = N;
  a.return_ids = 1;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_ENOMEM);
  expect_msg(f, "attend working memory (2 heads, top_k 50000)");
  a.top_k = 10;
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
}

static void test_health(void **state) {
  fx *f = *state;
  Rakv__HealthRequest req = RAKV__HEALTH_REQUEST__INIT;
  assert_int_equal(call(f, kvs_service_health, &req.base), RA_OK);
  Rakv__HealthReply *h = rakv__health_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_true(h->serving);
  assert_true(strlen(h->version) > 0);
  rakv__health_reply__free_unpacked(h, NULL);
  kvs_service_set_draining(f->svc);
  assert_int_equal(call(f, kvs_service_health, &req.base), RA_OK);
  h = rakv__health_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_false(h->serving);
  rakv__health_reply__free_unpacked(h, NULL);
}


/* What an AttendBatch call emitted: each item's reply, unpacked. */
typedef struct emitted {
  Rakv__AttendBatchReply *r[8];
  size_t n;
  int fail_at; /* > 0: the fail_at-th emit fails (a client gone) */
} emitted;

static int collect(void *ctx, const uint8_t *data, size_t len, ra_error *err) {
  emitted *e = ctx;
  if (e->fail_at && (int)e->n + 1 == e->fail_at) return ra_errorf(err, RA_EUNAVAIL, "the client went away");
  assert_true(e->n < 8);
  e->r[e->n] = rakv__attend_batch_reply__unpack(NULL, len, data);
  assert_non_null(e->r[e->n]);
  e->n++;
  return RA_OK;
}

static int call_batch(fx *f, Rakv__AttendBatchRequest *br, emitted *e) {
  uint8_t *b;
  size_t n = pack(&br->base, &b);
  ra_error_clear(&f->err);
  int rc = kvs_service_attend_batch(f->svc, f->who, b, n, collect, e, &f->err);
  free(b);
  return rc;
}

static void emitted_free(emitted *e) {
  for (size_t i = 0; i < e->n; i++) rakv__attend_batch_reply__free_unpacked(e->r[i], NULL);
  e->n = 0;
}

/* AttendBatch: each item is answered in order, in a reply of its own, as the same Attend alone;
 * a bad item (an unknown session, a q of the wrong size, another tenant's session) fails alone
 * with its status and message while the items around it are answered; an unparsable or empty
 * message fails the call, and so does a reply that cannot be sent; the store counts items as
 * attend requests and the message as a batch. Run with 1 attend thread (the 4 items in parallel,
 * then answered) and with 8 (one after another, each answered at once: a failed reply stops the
 * rest). */
static void test_attend_batch(void **state) {
  fx *f = *state;
  float buf[100 * DIM];
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 100, buf, 0.5f);
  for (int i = 0; i < 100 * DIM; i++) buf[i] = (float)((i * 7919) % 101) / 101.0f - 0.5f;
  assert_int_equal(put_stream(f, &c), RA_OK);
  uint32_t heads[2] = {0, 1};
  float q[2 * DIM];
  for (int i = 0; i < 2 * DIM; i++) q[i] = (float)(i % 5) - 2.0f;
  Rakv__AttendRequest good;
  attend_init(&good, f->id, heads, 2, q);
  good.mode = RAKV__ATTEND_MODE__MODE_FULL;
  good.seq = 7;
  assert_int_equal(call(f, kvs_service_attend, &good.base), RA_OK);
  Rakv__AttendReply *alone = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_non_null(alone);

  uint8_t unknown[16] = {1, 2, 3};
  Rakv__AttendRequest lost = good, short_q = good;
  lost.session_id.data = unknown;
  short_q.q.len -= 4;
  Rakv__AttendRequest *items[4] = {&good, &lost, &short_q, &good};
  Rakv__AttendBatchRequest br = RAKV__ATTEND_BATCH_REQUEST__INIT;
  br.seq = 41;
  br.n_items = 4;
  br.items = items;
  Rakv__StatsReply *s0 = stats(f);
  emitted e = {0};
  assert_int_equal(call_batch(f, &br, &e), RA_OK);
  assert_int_equal(e.n, 4);
  for (size_t k = 0; k < 4; k++) {
    assert_int_equal(e.r[k]->seq, 41);
    assert_int_equal(e.r[k]->item, k);
    assert_non_null(e.r[k]->result);
  }
  assert_int_equal(e.r[1]->result->code, 5); /* NOT_FOUND */
  assert_null(e.r[1]->result->reply);
  assert_int_equal(e.r[2]->result->code, 3); /* INVALID_ARGUMENT */
  assert_non_null(strstr(e.r[2]->result->message, "q is"));
  for (int k = 0; k < 4; k += 3) {
    const Rakv__AttendItemReply *it = e.r[k]->result;
    assert_int_equal(it->code, 0);
    assert_non_null(it->reply);
    assert_int_equal(it->reply->seq, 7);
    assert_int_equal(it->reply->n_heads, 2);
    for (int h = 0; h < 2; h++) {
      const Rakv__HeadPartial *a = alone->heads[h], *b = it->reply->heads[h];
      assert_int_equal(b->q_head, a->q_head);
      assert_int_equal(b->n_scanned, 100);
      assert_true(b->m == a->m && b->l == a->l);
      assert_memory_equal(b->o.data, a->o.data, DIM * 4);
    }
  }
  emitted_free(&e);
  Rakv__StatsReply *s1 = stats(f);
  assert_int_equal(s1->attend_requests - s0->attend_requests, 4);
  assert_int_equal(s1->attend_batches - s0->attend_batches, 1);
  assert_int_equal(s1->errors - s0->errors, 2);
  rakv__stats_reply__free_unpacked(s0, NULL);
  rakv__stats_reply__free_unpacked(s1, NULL);

  /* a reply that cannot be sent stops the message: no reply after it (one after another: the
   * items after it do not run either) */
  e.fail_at = 2;
  s0 = stats(f);
  assert_int_equal(call_batch(f, &br, &e), RA_EUNAVAIL);
  assert_int_equal(e.n, 1);
  s1 = stats(f);
  assert_int_equal(s1->attend_requests - s0->attend_requests, f->threads > 4 ? 2 : 4);
  rakv__stats_reply__free_unpacked(s0, NULL);
  rakv__stats_reply__free_unpacked(s1, NULL);
  emitted_free(&e);
  e.fail_at = 0;
  /* another tenant's items are refused one by one */
  f->who = &tenant_b;
  Rakv__AttendRequest *one[1] = {&good};
  br.n_items = 1;
  br.items = one;
  assert_int_equal(call_batch(f, &br, &e), RA_OK);
  assert_int_equal(e.n, 1);
  assert_int_equal(e.r[0]->result->code, 7); /* PERMISSION_DENIED */
  emitted_free(&e);
  f->who = &tenant_a;
  /* an empty batch and garbage are the call's errors */
  br.n_items = 0;
  assert_int_equal(call_batch(f, &br, &e), RA_EINVAL);
  expect_msg(f, "no items");
  assert_int_equal(e.n, 0);
  const uint8_t junk[7] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  assert_int_equal(kvs_service_attend_batch(f->svc, f->who, junk, sizeof junk, collect, &e, &f->err), RA_EFORMAT);
  expect_msg(f, "AttendBatchRequest: malformed protobuf (7 bytes)");
  rakv__attend_reply__free_unpacked(alone, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_and_truncated, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_session_ids, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_chunks, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_attends, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_nonfinite_refused, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_put_all_or_nothing, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_open, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_budget_exhausted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_build_index_validation, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_build_index_over_budget, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_build_index_key_lists, fx_setup_big, fx_teardown),
      cmocka_unit_test_setup_teardown(test_index_insert_rebuild_close, fx_setup_big, fx_teardown),
      cmocka_unit_test_setup_teardown(test_put_clusters_and_wave, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fetch_clusters, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_sessions_bound_to_credential, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_attend_memory_charged, fx_setup_8m, fx_teardown),
      cmocka_unit_test_setup_teardown(test_health, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_attend_batch, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_attend_batch, fx_setup_threads8, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
