/* A kv-store's life: health and stats, append then attend sees the appended token, close frees
 * the memory, several clients at once, SIGTERM with an Attend stream open still exits 0, and a
 * session whose worker went away without closing it expires (the idle lease). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "client.h"
#include "harness.h"
#include "kvdata.h"
#include "reference.h"

#define DIM 32

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static const ra_kvclient_geometry geo = {
    .n_layers = 1, .n_q_heads = 2, .n_kv_heads = 1, .head_dim = DIM, .dtype = RA_DTYPE_BF16};

static ra_kvclient_session open_one(ra_kvclient *c) {
  ra_kvclient_shard sh = {.layer = 0, .kv_head = 0, .token_begin = 0,
                          .token_end = RA_TOKEN_END_OPEN};
  ra_kvclient_session s;
  ra_error err;
  ok(ra_kvclient_open_session(c, &geo, &sh, 1, "lifecycle", &s, &err), &err);
  return s;
}

static void test_stats_append_close(void **state) {
  (void)state;
  harness_store st;
  const char *args[] = {"--memory-budget", "256M", "--threads", "2", NULL};
  assert_int_equal(harness_store_start(&st, args), 0);
  ra_kvclient *c;
  ra_error err;
  ok(ra_kvclient_connect(st.addr, NULL, &c, &err), &err);
  int serving = 0;
  ok(ra_kvclient_health(c, &serving, &err), &err);
  assert_true(serving);
  ra_kvclient_store_stats s0;
  ok(ra_kvclient_stats(c, &s0, &err), &err);
  assert_int_equal(s0.sessions, 0);
  assert_int_equal(s0.bytes_used, 0);
  assert_int_equal(s0.bytes_budget, 256u << 20);

  kvdata d;
  kvdata_make(&d, &geo, 1001, 9);
  ra_kvclient_session s = open_one(c);
  ra_kvclient_rows rows = kvdata_rows(&d, 0, 0, 0, 1000);
  ok(ra_kvclient_put_kv(c, &s, &rows, 1, NULL, &err), &err);
  ra_kvclient_store_stats s1;
  ok(ra_kvclient_stats(c, &s1, &err), &err);
  assert_int_equal(s1.sessions, 1);
  assert_int_equal(s1.tokens, 1000);
  assert_true(s1.bytes_used >= 1000u * DIM * 2 * 2);

  /* A query aligned with the last token's key: after the append it dominates the top-1. */
  float q[2 * DIM];
  const float *k = kvdata_k(&d, 0, 0);
  for (int j = 0; j < DIM; j++) q[j] = q[DIM + j] = 4.0f * k[1000 * DIM + j];
  ra_kvclient_stream *stream;
  ok(ra_kvclient_attend_open(c, &s, &stream, &err), &err);
  uint32_t heads[2] = {0, 1};
  float o[2][DIM];
  uint64_t ids[2][1];
  ra_head_partial p[2] = {{.part.o = o[0], .ids = ids[0], .ids_cap = 1},
                              {.part.o = o[1], .ids = ids[1], .ids_cap = 1}};
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = heads, .n_heads = 2, .q = q,
                                .mode = RA_MODE_FLAT, .top_k = 1, .want_ids = 1};
  ok(ra_kvclient_attend(stream, &req, p, 10000, NULL, &err), &err);
  assert_int_equal(p[0].n_keys, 1000);
  assert_true(ids[0][0] != 1000);
  ra_kvclient_rows one = kvdata_rows(&d, 0, 0, 1000, 1001);
  ok(ra_kvclient_append(c, &s, &one, 1, &err), &err);
  ok(ra_kvclient_attend(stream, &req, p, 10000, NULL, &err), &err);
  for (int h = 0; h < 2; h++) {
    assert_int_equal(p[h].n_keys, 1001);
    assert_int_equal(p[h].n_ids, 1);
    assert_int_equal(ids[h][0], 1000);
    /* attention over one key is its value */
    for (int j = 0; j < DIM; j++) assert_true(o[h][j] == kvdata_v(&d, 0, 0)[1000 * DIM + j]);
  }
  ra_kvclient_attend_close(stream);

  uint64_t freed = 0;
  ok(ra_kvclient_close_session(c, &s, &freed, &err), &err);
  assert_true(freed >= 1001u * DIM * 2 * 2);
  ra_kvclient_store_stats s2;
  ok(ra_kvclient_stats(c, &s2, &err), &err);
  assert_int_equal(s2.sessions, 0);
  assert_int_equal(s2.tokens, 0);
  assert_int_equal(s2.bytes_used, 0);
  assert_int_equal(s2.errors, 0);
  assert_int_equal(s2.attend_requests, 2);
  assert_true(s2.requests > s1.requests);
  kvdata_free(&d);
  ra_kvclient_close(c);
  assert_int_equal(harness_store_stop(&st, 10000), 0);
}

/* Several clients, each with its own session and stream, attending at once. */
typedef struct worker {
  const char *addr;
  int failures;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  ra_error err;
  ra_kvclient *c;
  if (ra_kvclient_connect(w->addr, NULL, &c, &err) != RA_OK) {
    w->failures++;
    return NULL;
  }
  kvdata d;
  kvdata_make(&d, &geo, 2000, (uint64_t)(uintptr_t)w);
  ra_kvclient_shard sh = {.layer = 0, .kv_head = 0, .token_begin = 0,
                          .token_end = RA_TOKEN_END_OPEN};
  ra_kvclient_session s;
  ra_kvclient_stream *stream = NULL;
  ra_kvclient_rows rows = kvdata_rows(&d, 0, 0, 0, 2000);
  if (ra_kvclient_open_session(c, &geo, &sh, 1, "worker", &s, &err) != RA_OK ||
      ra_kvclient_put_kv(c, &s, &rows, 1, NULL, &err) != RA_OK ||
      ra_kvclient_attend_open(c, &s, &stream, &err) != RA_OK) {
    w->failures++;
  } else {
    ref_rng rng = {3};
    float q[DIM], o[DIM];
    double want[DIM];
    uint32_t head = 1;
    for (int i = 0; i < 20; i++) {
      ref_fill_normal(&rng, q, DIM, 1.0f);
      ra_head_partial p = {.part.o = o};
      ra_kvclient_attend_req req = {.layer = 0, .q_heads = &head, .n_heads = 1, .q = q};
      if (ra_kvclient_attend(stream, &req, &p, 10000, NULL, &err) != RA_OK) {
        w->failures++;
        break;
      }
      ref_attention(q, kvdata_k(&d, 0, 0), kvdata_v(&d, 0, 0), NULL, 2000, DIM, want);
      if (ref_max_abs_diff(o, want, DIM) > 1e-5) w->failures++;
    }
    ra_kvclient_attend_close(stream);
    if (ra_kvclient_close_session(c, &s, NULL, &err) != RA_OK) w->failures++;
  }
  kvdata_free(&d);
  ra_kvclient_close(c);
  return NULL;
}

static void test_concurrent_clients(void **state) {
  (void)state;
  harness_store st;
  assert_int_equal(harness_store_start(&st, NULL), 0);
  worker w[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){.addr = st.addr};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].failures, 0);
  }
  assert_int_equal(harness_store_stop(&st, 10000), 0);
}

/* SIGTERM while a client holds an open Attend stream: the store cancels it after the grace
 * period and exits 0; the client's next attend fails instead of hanging. */
static void test_shutdown_with_open_stream(void **state) {
  (void)state;
  harness_store st;
  const char *args[] = {"--grace-ms", "300", NULL};
  assert_int_equal(harness_store_start(&st, args), 0);
  ra_kvclient *c;
  ra_error err;
  ok(ra_kvclient_connect(st.addr, NULL, &c, &err), &err);
  ra_kvclient_session s = open_one(c);
  ra_kvclient_stream *stream;
  ok(ra_kvclient_attend_open(c, &s, &stream, &err), &err);
  uint32_t head = 0;
  float q[DIM] = {1}, o[DIM];
  ra_head_partial p = {.part.o = o};
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = &head, .n_heads = 1, .q = q};
  ok(ra_kvclient_attend(stream, &req, &p, 10000, NULL, &err), &err);
  assert_int_equal(harness_store_stop(&st, 5000), 0);
  int rc = ra_kvclient_attend(stream, &req, &p, 5000, NULL, &err);
  assert_true(rc == RA_EUNAVAIL || rc == RA_ECANCELED);
  ra_kvclient_attend_close(stream);
  ra_kvclient_close(c);
}

/* A session nobody touches for --session-idle-timeout is closed and its memory freed; one in use
 * (an attend every 300 ms) lives on. */
static void test_idle_session_expires(void **state) {
  (void)state;
  harness_store st;
  const char *args[] = {"--session-idle-timeout", "1", NULL};
  assert_int_equal(harness_store_start(&st, args), 0);
  ra_kvclient *c;
  ra_error err;
  ok(ra_kvclient_connect(st.addr, NULL, &c, &err), &err);
  kvdata d;
  kvdata_make(&d, &geo, 500, 3);
  ra_kvclient_session idle = open_one(c), busy = open_one(c);
  ra_kvclient_rows rows = kvdata_rows(&d, 0, 0, 0, 500);
  ok(ra_kvclient_put_kv(c, &idle, &rows, 1, NULL, &err), &err);
  ok(ra_kvclient_put_kv(c, &busy, &rows, 1, NULL, &err), &err);
  ra_kvclient_store_stats s0, s1;
  ok(ra_kvclient_stats(c, &s0, &err), &err);
  assert_int_equal(s0.sessions, 2);

  ra_kvclient_stream *stream;
  ok(ra_kvclient_attend_open(c, &busy, &stream, &err), &err);
  float q[2 * DIM] = {0}, o[2 * DIM];
  uint32_t heads[2] = {0, 1};
  ra_head_partial parts[2] = {{.part.o = o}, {.part.o = o + DIM}};
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = heads, .n_heads = 2, .q = q, .mode = RA_MODE_FULL};
  for (int i = 0; i < 10; i++) { /* 3 s: past the 1 s lease, checked every 250 ms */
    ok(ra_kvclient_attend(stream, &req, parts, 5000, NULL, &err), &err);
    usleep(300 * 1000);
  }
  ok(ra_kvclient_stats(c, &s1, &err), &err);
  assert_int_equal(s1.sessions, 1);
  assert_true(s1.bytes_used < s0.bytes_used);
  ok(ra_kvclient_attend(stream, &req, parts, 5000, NULL, &err), &err);
  /* The idle one is gone: its next request says so. */
  assert_int_equal(ra_kvclient_put_kv(c, &idle, &rows, 1, NULL, &err), RA_ENOTFOUND);
  assert_non_null(strstr(err.msg, "expired"));
  ra_kvclient_attend_close(stream);
  ok(ra_kvclient_close_session(c, &busy, NULL, &err), &err);
  ok(ra_kvclient_stats(c, &s1, &err), &err);
  assert_int_equal(s1.sessions, 0);
  assert_int_equal(s1.bytes_used, 0);
  ra_kvclient_close(c);
  kvdata_free(&d);
  assert_int_equal(harness_store_stop(&st, 5000), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stats_append_close),
      cmocka_unit_test(test_concurrent_clients),
      cmocka_unit_test(test_shutdown_with_open_stream),
      cmocka_unit_test(test_idle_session_expires),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
