/* The service layer over serialized protobuf: a full session round trip and every bad-input
 * class with the RA code it must produce (which common/rpc.c maps to a gRPC status). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "kvstore.pb-c.h"
#include "service.h"

#define DIM 16

typedef struct fx {
  kvs_service *svc;
  uint8_t id[16];
  ra_buf reply;
  ra_error err;
} fx;

static size_t pack(const ProtobufCMessage *m, uint8_t **out) {
  size_t n = protobuf_c_message_get_packed_size(m);
  *out = malloc(n ? n : 1);
  return protobuf_c_message_pack(m, *out);
}

typedef int (*unary_fn)(kvs_service *, const uint8_t *, size_t, ra_buf *, ra_error *);

static int call(fx *f, unary_fn fn, const ProtobufCMessage *m) {
  uint8_t *b;
  size_t n = pack(m, &b);
  ra_error_clear(&f->err);
  int rc = fn(f->svc, b, n, &f->reply, &f->err);
  free(b);
  return rc;
}

static void expect_msg(const fx *f, const char *text) {
  if (!strstr(f->err.msg, text)) fail_msg("message '%s' lacks '%s'", f->err.msg, text);
}

/* Geometry 2 layers x 4 q heads x 2 kv heads x 16, f32; the session owns layer 1 kv head 0,
 * tokens [0, open). */
static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  kvs_service_config cfg = {.memory_budget = 1 << 20, .attend_threads = 1};
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
  kvs_service_put_begin(f->svc, &st);
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
  Rakv__AppendRequest ar = RAKV__APPEND_REQUEST__INIT;
  Rakv__KvChunk *cp = &c;
  chunk_init(&c, f->id, 1, 0, 100, 1, buf, 4.0f);
  ar.session_id.data = f->id;
  ar.session_id.len = 16;
  ar.n_chunks = 1;
  ar.chunks = &cp;
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
                    kvs_service_close_session, kvs_service_stats, kvs_service_health};
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    assert_int_equal(fns[i](f->svc, garbage, sizeof garbage, &f->reply, &f->err), RA_EFORMAT);
    expect_msg(f, "malformed protobuf (7 bytes)");
  }
  /* A valid attend request cut short in the middle of its q bytes. */
  uint32_t head = 0;
  float q[DIM] = {0};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  uint8_t *b;
  size_t n = pack(&a.base, &b);
  assert_int_equal(kvs_service_attend(f->svc, b, n - 5, &f->reply, &f->err), RA_EFORMAT);
  free(b);
  kvs_put_state st;
  kvs_service_put_begin(f->svc, &st);
  assert_int_equal(kvs_service_put_chunk(f->svc, &st, garbage, sizeof garbage, &f->err),
                   RA_EFORMAT);
  expect_msg(f, "chunk 0: KvChunk: malformed");
  Rakv__StatsReply *s = stats(f);
  assert_int_equal(s->errors, 8);
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
  kvs_service_put_begin(f->svc, &st);
  assert_int_equal(put(f, &st, &c), RA_ENOTFOUND);
  /* An append's chunk naming another session. */
  Rakv__AppendRequest ar = RAKV__APPEND_REQUEST__INIT;
  Rakv__KvChunk *cp = &c;
  ar.session_id.data = f->id;
  ar.session_id.len = 16;
  ar.n_chunks = 1;
  ar.chunks = &cp;
  assert_int_equal(call(f, kvs_service_append, &ar.base), RA_EINVAL);
  expect_msg(f, "differs");
}

static void test_bad_chunks(void **state) {
  fx *f = *state;
  float buf[8 * DIM];
  kvs_put_state st;
  kvs_service_put_begin(f->svc, &st);
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
  assert_int_equal(put(f, &st, &c), RA_OK);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "overlap: tokens [0, 4)");
  chunk_init(&c, f->id, 1, 0, 8, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "hole: tokens [8, 12)");
  chunk_init(&c, f->id, 1, 0, UINT64_MAX - 2, 4, buf, 1.0f);
  assert_int_equal(put(f, &st, &c), RA_EINVAL);
  expect_msg(f, "overflows");
  assert_int_equal(st.tokens_stored, 4);
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
  kvs_service_put_begin(f->svc, &st);
  Rakv__KvChunk c;
  chunk_init(&c, f->id, 1, 0, 0, 5000, buf, 0.5f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  chunk_init(&c, f->id, 1, 0, 5000, 5000, buf, 0.5f);
  assert_int_equal(put(f, &st, &c), RA_ENOMEM);
  expect_msg(f, "of budget 1048576");
  /* The session still works: attend sees the 5000 tokens, a small append fits. */
  chunk_init(&c, f->id, 1, 0, 5000, 10, buf, 0.5f);
  assert_int_equal(put(f, &st, &c), RA_OK);
  uint32_t head = 1;
  float q[DIM] = {1};
  Rakv__AttendRequest a;
  attend_init(&a, f->id, &head, 1, q);
  assert_int_equal(call(f, kvs_service_attend, &a.base), RA_OK);
  Rakv__AttendReply *rep = rakv__attend_reply__unpack(NULL, f->reply.len, f->reply.data);
  assert_int_equal(rep->heads[0]->n_keys, 5010);
  rakv__attend_reply__free_unpacked(rep, NULL);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_and_truncated, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_session_ids, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_chunks, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_attends, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_bad_open, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_budget_exhausted, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_health, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
