/* Every bad-input class against a real kv-store, asserting the gRPC status (as the RA code
 * common/rpc.c maps it back to: INVALID_ARGUMENT -> RA_EINVAL, NOT_FOUND -> RA_ENOTFOUND,
 * RESOURCE_EXHAUSTED -> RA_ENOMEM, FAILED_PRECONDITION -> RA_ESTATE) and its message, and that
 * the store and the session are unharmed afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client.h"
#include "harness.h"
#include "kvstore.pb-c.h"
#include "rpc.h"

#define DIM 16
#define BUDGET (4u << 20)

typedef struct fx {
  harness_store st;
  ra_kvclient *c;
  ra_kvclient_session s;
  ra_kvclient_geometry g;
  ra_error err;
} fx;

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static void expect(fx *f, int got, int code, const char *grpc_name, const char *text) {
  if (got != code) fail_msg("got %s (%s), want %s", ra_status_name(got), f->err.msg, ra_status_name(code));
  if (!strstr(f->err.msg, grpc_name)) fail_msg("message '%s' lacks '%s'", f->err.msg, grpc_name);
  if (!strstr(f->err.msg, text)) fail_msg("message '%s' lacks '%s'", f->err.msg, text);
  ra_error_clear(&f->err);
}

/* A store with a 4 MiB budget and 1 MiB message limit; the session (f32, 2 layers, 4 q heads,
 * 2 kv heads, head_dim 16) owns layer 1 kv head 0 [0, open) and kv head 1 [0, 100), and holds
 * 50 tokens of kv head 0. */
static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  const char *args[] = {"--memory-budget", "4M", "--max-message", "1M", NULL};
  if (harness_store_start(&f->st, args) != 0) return -1;
  ra_kvclient_options opt = {.chunk_bytes = 4u << 20, .max_message_bytes = 16u << 20};
  if (ra_kvclient_connect(f->st.addr, &opt, &f->c, &f->err) != RA_OK) return -1;
  f->g = (ra_kvclient_geometry){.n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = DIM,
                                .dtype = RA_DTYPE_F32};
  ra_kvclient_shard sh[2] = {
      {.layer = 1, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN},
      {.layer = 1, .kv_head = 1, .token_begin = 0, .token_end = 100}};
  if (ra_kvclient_open_session(f->c, &f->g, sh, 2, "errors", &f->s, &f->err) != RA_OK) return -1;
  static float x[50 * DIM];
  ra_kvclient_rows r = {.layer = 1, .kv_head = 0, .token_begin = 0, .n_tokens = 50, .keys = x,
                        .values = x};
  if (ra_kvclient_put_kv(f->c, &f->s, &r, 1, NULL, &f->err) != RA_OK) return -1;
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fx *f = *state;
  ra_kvclient_close(f->c);
  int status = harness_store_stop(&f->st, 10000);
  free(f);
  return status == 0 ? 0 : -1;
}

/* Attends over layer 1 heads {0} and checks the session still holds `n_keys` tokens there. */
static void expect_intact(fx *f, uint64_t n_keys) {
  ra_kvclient_stream *st;
  ok(ra_kvclient_attend_open(f->c, &f->s, &st, &f->err), &f->err);
  uint32_t head = 0;
  float q[DIM] = {1}, o[DIM];
  ra_head_partial p = {.part.o = o};
  ra_kvclient_attend_req req = {.layer = 1, .q_heads = &head, .n_heads = 1, .q = q};
  ok(ra_kvclient_attend(st, &req, &p, 10000, NULL, &f->err), &f->err);
  assert_int_equal(p.n_keys, n_keys);
  ra_kvclient_attend_close(st);
  int serving = 0;
  ok(ra_kvclient_health(f->c, &serving, &f->err), &f->err);
  assert_true(serving);
}

static int attend_once(fx *f, const ra_kvclient_session *s, const ra_kvclient_attend_req *req) {
  ra_kvclient_stream *st;
  ok(ra_kvclient_attend_open(f->c, s, &st, &f->err), &f->err);
  float o[4][DIM];
  ra_head_partial p[4] = {{.part.o = o[0]}, {.part.o = o[1]}, {.part.o = o[2]}, {.part.o = o[3]}};
  int rc = ra_kvclient_attend(st, req, p, 10000, NULL, &f->err);
  ra_kvclient_attend_close(st);
  return rc;
}

static int put_one(fx *f, uint32_t layer, uint32_t head, uint64_t begin, uint64_t n) {
  float *x = calloc(n * DIM, sizeof *x);
  ra_kvclient_rows r = {.layer = layer, .kv_head = head, .token_begin = begin, .n_tokens = n,
                        .keys = x, .values = x};
  int rc = ra_kvclient_put_kv(f->c, &f->s, &r, 1, NULL, &f->err);
  free(x);
  return rc;
}

static void test_unknown_session(void **state) {
  fx *f = *state;
  ra_kvclient_session other = f->s;
  other.id[0] ^= 0xff;
  uint32_t head = 0;
  float q[DIM] = {0};
  ra_kvclient_attend_req req = {.layer = 1, .q_heads = &head, .n_heads = 1, .q = q};
  expect(f, attend_once(f, &other, &req), RA_ENOTFOUND, "NOT_FOUND", "no session");
  expect(f, ra_kvclient_close_session(f->c, &other, NULL, &f->err), RA_ENOTFOUND, "NOT_FOUND",
         "no session");
  /* A session id of the wrong length, sent raw. */
  Rakv__CloseSessionRequest cr = RAKV__CLOSE_SESSION_REQUEST__INIT;
  uint8_t id3[3] = {1, 2, 3}, buf[64];
  cr.session_id.data = id3;
  cr.session_id.len = 3;
  size_t n = rakv__close_session_request__pack(&cr, buf);
  ra_rpc_channel *ch;
  ok(ra_rpc_channel_open(f->st.addr, NULL, &ch, &f->err), &f->err);
  ra_buf reply = {0};
  expect(f, ra_rpc_unary(ch, "/rakv.KvStore/CloseSession", buf, n, &reply, 10000, &f->err),
         RA_EINVAL, "INVALID_ARGUMENT", "session id is 3 bytes, want 16");
  ra_buf_free(&reply);
  ra_rpc_channel_close(ch);
  expect_intact(f, 50);
}

static void test_out_of_range(void **state) {
  fx *f = *state;
  uint32_t heads[2] = {0, 1};
  float q[2 * DIM] = {0};
  ra_kvclient_attend_req req = {.layer = 5, .q_heads = heads, .n_heads = 1, .q = q};
  expect(f, attend_once(f, &f->s, &req), RA_EINVAL, "INVALID_ARGUMENT",
         "layer 5 out of range [0, 2)");
  req.layer = 1;
  heads[0] = 4;
  expect(f, attend_once(f, &f->s, &req), RA_EINVAL, "INVALID_ARGUMENT",
         "q head 4 out of range [0, 4)");
  heads[0] = 0;
  req.layer = 0;
  expect(f, attend_once(f, &f->s, &req), RA_EINVAL, "INVALID_ARGUMENT",
         "q head 0 (kv head 0) of layer 0 is not stored here");
  expect(f, put_one(f, 2, 0, 0, 1), RA_EINVAL, "INVALID_ARGUMENT", "layer 2 out of range [0, 2)");
  expect(f, put_one(f, 1, 3, 0, 1), RA_EINVAL, "INVALID_ARGUMENT",
         "kv head 3 out of range [0, 2)");
  expect(f, put_one(f, 1, 1, 90, 20), RA_EINVAL, "INVALID_ARGUMENT", "hole");
  expect_intact(f, 50);
}

static void test_wrong_vector_length(void **state) {
  fx *f = *state;
  /* A client that believes head_dim is 8 sends q and KV of the wrong length. */
  ra_kvclient_session wrong = f->s;
  wrong.geo.head_dim = 8;
  uint32_t head = 0;
  float q[DIM] = {0};
  ra_kvclient_attend_req req = {.layer = 1, .q_heads = &head, .n_heads = 1, .q = q};
  expect(f, attend_once(f, &wrong, &req), RA_EINVAL, "INVALID_ARGUMENT", "q is 32 bytes, want 64");
  float x[4 * DIM] = {0};
  ra_kvclient_rows r = {.layer = 1, .kv_head = 0, .token_begin = 50, .n_tokens = 4, .keys = x,
                        .values = x};
  expect(f, ra_kvclient_append(f->c, &wrong, &r, 1, &f->err), RA_EINVAL, "INVALID_ARGUMENT",
         "keys are 128 bytes, want 256");
  expect_intact(f, 50);
}

static void test_overlap_and_hole(void **state) {
  fx *f = *state;
  expect(f, put_one(f, 1, 0, 40, 20), RA_EINVAL, "INVALID_ARGUMENT",
         "overlap: tokens [40, 60) of layer 1 kv head 0 overlap tokens [0, 50) already stored");
  expect(f, put_one(f, 1, 0, 51, 20), RA_EINVAL, "INVALID_ARGUMENT",
         "hole: tokens [51, 71) of layer 1 kv head 0 start at 51 but the shard is filled up to 50");
  expect_intact(f, 50);
  ok(put_one(f, 1, 0, 50, 20), &f->err);
  expect_intact(f, 70);
}

static void test_garbage_and_truncated(void **state) {
  fx *f = *state;
  ra_rpc_channel *ch;
  ok(ra_rpc_channel_open(f->st.addr, NULL, &ch, &f->err), &f->err);
  ra_buf reply = {0};
  static const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
  const char *methods[] = {"/rakv.KvStore/OpenSession", "/rakv.KvStore/Append",
                           "/rakv.KvStore/CloseSession", "/rakv.KvStore/Stats",
                           "/rakv.KvStore/Health"};
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    expect(f, ra_rpc_unary(ch, methods[i], garbage, sizeof garbage, &reply, 10000, &f->err),
           RA_EINVAL, "INVALID_ARGUMENT", "malformed protobuf (7 bytes)");
  /* A valid OpenSession request cut short. */
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 1;
  g.n_q_heads = g.n_kv_heads = 1;
  g.head_dim = 8;
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  req.geometry = &g;
  req.client = "a client name long enough to cut";
  uint8_t buf[256];
  size_t n = rakv__open_session_request__pack(&req, buf);
  expect(f, ra_rpc_unary(ch, "/rakv.KvStore/OpenSession", buf, n - 6, &reply, 10000, &f->err),
         RA_EINVAL, "INVALID_ARGUMENT", "OpenSessionRequest: malformed protobuf");
  /* Garbage on the two streams. */
  ra_rpc_call *call;
  for (int m = 0; m < 2; m++) {
    ok(ra_rpc_call_start(ch, m ? "/rakv.KvStore/Attend" : "/rakv.KvStore/PutKv", 0, &call,
                         &f->err),
       &f->err);
    int rc = ra_rpc_call_send(call, garbage, sizeof garbage, &f->err);
    if (rc == RA_OK) rc = ra_rpc_call_recv(call, &reply, 10000, &f->err);
    expect(f, rc, RA_EINVAL, "INVALID_ARGUMENT", "malformed protobuf (7 bytes)");
    ra_rpc_call_destroy(call);
  }
  expect(f, ra_rpc_unary(ch, "/rakv.KvStore/BuildIndex", garbage, sizeof garbage, &reply, 10000,
                         &f->err),
         RA_EINVAL, "INVALID_ARGUMENT", "BuildIndexRequest: malformed protobuf");
  ra_buf_free(&reply);
  ra_rpc_channel_close(ch);
  expect_intact(f, 50);
}

static void test_oversized_message(void **state) {
  fx *f = *state;
  /* 9000 tokens x 16 x 4 bytes x 2 = 1.15 MB in one chunk > the store's 1 MiB limit. */
  expect(f, put_one(f, 1, 0, 50, 9000), RA_ENOMEM, "RESOURCE_EXHAUSTED", "");
  expect_intact(f, 50);
}

static void test_memory_budget(void **state) {
  fx *f = *state;
  /* 20000 tokens x 128 bytes = 2.56 MB: the first fits in 4 MiB, the second would not. */
  ra_kvclient_options opt = {.chunk_bytes = 512u << 10};
  ra_kvclient *c;
  ok(ra_kvclient_connect(f->st.addr, &opt, &c, &f->err), &f->err);
  float *x = calloc(20000 * DIM, sizeof *x);
  ra_kvclient_rows r = {.layer = 1, .kv_head = 0, .token_begin = 50, .n_tokens = 20000, .keys = x,
                        .values = x};
  ok(ra_kvclient_put_kv(c, &f->s, &r, 1, NULL, &f->err), &f->err);
  r.token_begin = 20050;
  expect(f, ra_kvclient_put_kv(c, &f->s, &r, 1, NULL, &f->err), RA_ENOMEM, "RESOURCE_EXHAUSTED",
         "of budget 4194304");
  ra_kvclient_store_stats s;
  ok(ra_kvclient_stats(c, &s, &f->err), &f->err);
  assert_true(s.bytes_used <= BUDGET);
  assert_int_equal(s.bytes_budget, BUDGET);
  /* Chunks before the refusal are kept, each whole; the session goes on from where it stops. */
  uint64_t have = s.tokens;
  assert_true(have >= 20050 && have < 40050);
  expect_intact(f, have);
  r.token_begin = have;
  r.n_tokens = 10;
  ok(ra_kvclient_append(c, &f->s, &r, 1, &f->err), &f->err);
  expect_intact(f, have + 10);
  free(x);
  ra_kvclient_close(c);
}

static void test_index_mode_without_index(void **state) {
  fx *f = *state;
  uint32_t head = 1;
  float q[DIM] = {0};
  ra_kvclient_attend_req req = {.layer = 1, .q_heads = &head, .n_heads = 1, .q = q,
                                .mode = RA_MODE_ROAR, .top_k = 10};
  expect(f, attend_once(f, &f->s, &req), RA_ESTATE, "FAILED_PRECONDITION",
         "mode roar needs an index: none built for layer 1 q head 1 (shard tokens 0-open)");
  ra_kvclient_store_stats s;
  ok(ra_kvclient_stats(f->c, &s, &f->err), &f->err);
  assert_int_equal(s.errors, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unknown_session, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_out_of_range, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_wrong_vector_length, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_overlap_and_hole, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_and_truncated, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_oversized_message, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_memory_budget, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_index_mode_without_index, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
