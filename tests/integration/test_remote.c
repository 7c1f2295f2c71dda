/* The worker's remote attention against real kv-store processes: prefill put, decode-time
 * appends of evicted tokens, per-layer fan-out and merge, with one kv head split across two
 * stores by token range; merged with the local sink + window partial it equals direct attention,
 * also with two runtimes' appends in flight together and with two runtimes' attends in one
 * AttendBatch message per store. A store killed mid-decode fails the step with its address,
 * fast, and stops the remote. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#include "half.h"
#include "harness.h"
#include "kvdata.h"
#include "merge.h"
#include "offload_plan.h"
#include "remote.h"
#include "remote_batch.h"

enum { N_LAYERS = 3, N_Q = 6, N_KV = 3, HD = 64, N_TOKENS = 3000, SINK = 64, WINDOW = 256, STEPS = 12 };

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

typedef struct fixture {
  harness_store st[3];
  ra_shard_map map;
  ra_offload_plan plan;
  kvdata d;
} fixture;

/* Three stores and the map `fmt` of their addresses ("%1$s" .. "%3$s"). */
static void fixture_start_map(fixture *f, const char *fmt) {
  for (int i = 0; i < 3; i++) assert_int_equal(harness_store_start(&f->st[i], NULL), 0);
  char text[512];
  snprintf(text, sizeof text, fmt, f->st[0].addr, f->st[1].addr, f->st[2].addr);
  ra_error err;
  ok(ra_shard_map_parse(text, &f->map, &err), &err);
  ok(ra_offload_plan_build(&f->map, N_LAYERS, N_Q, N_KV, SINK, WINDOW, &f->plan, &err), &err);
  ra_kvclient_geometry g = {N_LAYERS, N_Q, N_KV, HD, RA_DTYPE_F16};
  kvdata_make(&f->d, &g, N_TOKENS, 7);
}

/* Store 0 has layer 0 and kv head 2's tokens from 1500 on; store 1 kv heads 0-1 of layers 1-2;
 * store 2 kv head 2 of layers 1-2 up to token 1499. */
static void fixture_start(fixture *f) {
  fixture_start_map(f, "%1$s 0 * *\n%2$s 1-2 0-1 *\n%3$s 1-2 2 0-1499\n%1$s 1-2 2 1500-\n");
}

static void fixture_stop(fixture *f) {
  for (int i = 0; i < 3; i++)
    if (f->st[i].pid > 0) assert_int_equal(harness_store_stop(&f->st[i], 5000), 0);
  kvdata_free(&f->d);
  ra_offload_plan_free(&f->plan);
  ra_shard_map_free(&f->map);
}

/* Positions [b, e) of a layer in the worker's cache layout [n, n_kv_heads, head_dim]. */
static void layer_rows(const kvdata *d, uint32_t layer, uint64_t b, uint64_t e, float *k, float *v) {
  for (uint64_t t = b; t < e; t++)
    for (uint32_t g = 0; g < N_KV; g++) {
      memcpy(k + ((t - b) * N_KV + g) * HD, kvdata_k(d, layer, g) + t * HD, HD * sizeof(float));
      memcpy(v + ((t - b) * N_KV + g) * HD, kvdata_v(d, layer, g) + t * HD, HD * sizeof(float));
    }
}

/* Prefills n0 tokens: every layer's offloaded positions go to their stores. */
static void prefill(ra_remote *r, const fixture *f, uint64_t n0) {
  uint64_t b, e;
  ra_offload_plan_range(&f->plan, n0, &b, &e);
  float *k = malloc((e - b) * N_KV * HD * sizeof(float)), *v = malloc((e - b) * N_KV * HD * sizeof(float));
  ra_error err;
  for (uint32_t l = 0; l < N_LAYERS; l++) {
    layer_rows(&f->d, l, b, e, k, v);
    ok(ra_remote_put(r, l, k, v, b, e - b, &err), &err);
  }
  free(k);
  free(v);
}

/* The remote partial o, ml of `layer` (+ the local sink and window) vs direct attention over
 * [0, n): the largest difference. */
static double layer_error(const fixture *f, uint32_t layer, uint64_t n, const float *q, float *o, const float *ml) {
  float o_loc[HD], o_ref[HD];
  uint64_t b, e;
  ra_offload_plan_range(&f->plan, n, &b, &e);
  double worst = 0;
  for (uint32_t h = 0; h < N_Q; h++) {
    const float *k = kvdata_k(&f->d, layer, h / (N_Q / N_KV)), *v = kvdata_v(&f->d, layer, h / (N_Q / N_KV));
    float scale = 1.0f / sqrtf((float)HD);
    ra_partial acc = {.o = o + h * HD, .m = ml[2 * h], .l = ml[2 * h + 1]}, loc = {.o = o_loc}, ref = {.o = o_ref};
    ra_partial_attend_f32(q + h * HD, k, v, SINK, HD, scale, &loc);
    ra_partial_merge(&acc, loc.o, loc.m, loc.l, HD);
    ra_partial_attend_f32(q + h * HD, k + e * HD, v + e * HD, n - e, HD, scale, &loc);
    ra_partial_merge(&acc, loc.o, loc.m, loc.l, HD);
    ra_partial_attend_f32(q + h * HD, k, v, n, HD, scale, &ref);
    for (int j = 0; j < HD; j++) worst = fmax(worst, fabs((double)acc.o[j] - ref.o[j]));
  }
  return worst;
}

static void query_fill(float *q, uint64_t seed, uint32_t layer) {
  for (int i = 0; i < N_Q * HD; i++) q[i] = (float)sin((double)(seed * 31 + layer * 7 + (uint64_t)i)) * 0.7f;
}

/* Remote partial (+ local sink and window) vs direct attention over [0, n) for every layer. */
static double check_context(ra_remote *r, const fixture *f, uint64_t n, uint64_t seed) {
  float q[N_Q * HD], o[N_Q * HD], ml[N_Q * 2];
  uint64_t b, e;
  ra_offload_plan_range(&f->plan, n, &b, &e);
  double worst = 0;
  ra_error err;
  for (uint32_t layer = 0; layer < N_LAYERS; layer++) {
    query_fill(q, seed, layer);
    ra_remote_stats stats;
    ok(ra_remote_attend(r, layer, q, o, ml, &stats, &err), &err);
    assert_int_equal(stats.n_keys, (e - b) * N_Q); /* every offloaded token, once per q head */
    worst = fmax(worst, layer_error(f, layer, n, q, o, ml));
  }
  return worst;
}

static void decode_steps(ra_remote *r, const fixture *f, uint64_t n0, int steps) {
  float k[N_LAYERS * N_KV * HD], v[N_LAYERS * N_KV * HD];
  ra_error err;
  for (uint64_t n = n0; n < n0 + (uint64_t)steps; n++) {
    int64_t ev = ra_offload_plan_evicted(&f->plan, n);
    assert_true(ev >= SINK);
    for (uint32_t l = 0; l < N_LAYERS; l++) layer_rows(&f->d, l, (uint64_t)ev, (uint64_t)ev + 1, k + l * N_KV * HD,
                                                       v + l * N_KV * HD);
    ok(ra_remote_append(r, (uint64_t)ev, k, v, &err), &err);
    assert_true(check_context(r, f, n + 1, n) < 1e-4);
  }
}

/* The fixture's stores, a remote of cfg over them, and N_TOKENS tokens put. */
static ra_remote *fixture_open_prefilled(fixture *f, const ra_remote_config *cfg) {
  memset(f, 0, sizeof *f);
  fixture_start(f);
  ra_remote *r;
  ra_error err;
  ok(ra_remote_open(&f->plan, HD, cfg, &r, &err), &err);
  prefill(r, f, N_TOKENS);
  return r;
}

static void test_full_mode_matches_direct_attention_through_decode(void **state) {
  fixture f;
  memset(&f, 0, sizeof f);
  fixture_start(&f);
  ra_remote *r;
  ra_error err;
  ra_remote_config cfg = {.dtype = RA_DTYPE_F16, .mode = RA_MODE_FULL, .timeout_ms = 10000};
  ok(ra_remote_open(&f.plan, HD, &cfg, &r, &err), &err);
  uint64_t n0 = N_TOKENS - STEPS;
  prefill(r, &f, n0);
  double e = check_context(r, &f, n0, 1);
  print_message("full mode after prefill: max |err| %.2e\n", e);
  assert_true(e < 1e-4);
  decode_steps(r, &f, n0, STEPS);
  ra_remote_close(r);
  fixture_stop(&f);
}

/* Head-major rows of layer's positions [b, e) in f16: [N_KV, e - b, HD]. */
static uint16_t *layer_heads_f16(const kvdata *d, uint32_t layer, uint64_t b, uint64_t e, int values) {
  uint16_t *x = malloc((e - b) * N_KV * HD * sizeof *x);
  for (uint32_t g = 0; g < N_KV; g++) {
    const float *src = (values ? kvdata_v(d, layer, g) : kvdata_k(d, layer, g)) + b * HD;
    ra_fp32_to_fp16_n(src, x + (size_t)g * (e - b) * HD, (e - b) * HD);
  }
  return x;
}

/* put_heads of rows already in the session dtype sends them as they are: the stores attend as
 * after an fp32 put. Rows in another 16-bit dtype are refused, and a non-finite f16 row is
 * refused by its store, naming it, with nothing stored. */
static void test_put_heads_in_the_session_dtype(void **state) {
  (void)state;
  fixture f;
  memset(&f, 0, sizeof f);
  fixture_start(&f);
  ra_remote *r;
  ra_error err;
  ra_remote_config cfg = {.dtype = RA_DTYPE_F16, .mode = RA_MODE_FULL, .timeout_ms = 10000};
  ok(ra_remote_open(&f.plan, HD, &cfg, &r, &err), &err);
  const uint64_t n0 = N_TOKENS - STEPS;
  uint64_t b, e;
  ra_offload_plan_range(&f.plan, n0, &b, &e);
  for (uint32_t l = 0; l < N_LAYERS; l++) {
    uint16_t *k = layer_heads_f16(&f.d, l, b, e, 0), *v = layer_heads_f16(&f.d, l, b, e, 1);
    if (l == 0) assert_int_equal(ra_remote_put_heads(r, l, k, v, RA_DTYPE_BF16, b, e - b, &err), RA_EINVAL);
    ok(ra_remote_put_heads(r, l, k, v, RA_DTYPE_F16, b, e - b, &err), &err);
    free(k);
    free(v);
  }
  assert_true(check_context(r, &f, n0, 3) < 1e-4);
  decode_steps(r, &f, n0, 2);
  ra_remote_close(r);

  ok(ra_remote_open(&f.plan, HD, &cfg, &r, &err), &err);
  uint16_t *k = layer_heads_f16(&f.d, 0, b, e, 0), *v = layer_heads_f16(&f.d, 0, b, e, 1);
  v[(size_t)2 * (e - b) * HD + 5 * HD + 7] = 0x7c00; /* +inf in kv head 2's sixth row */
  assert_int_not_equal(ra_remote_put_heads(r, 0, k, v, RA_DTYPE_F16, b, e - b, &err), RA_OK);
  print_message("a non-finite row: %s\n", err.msg);
  char want[96];
  snprintf(want, sizeof want, "values[5][7] (layer 0 kv head 2 position %llu) is not finite", (unsigned long long)b + 5);
  assert_non_null(strstr(err.msg, want));
  free(k);
  free(v);
  ra_remote_close(r);
  fixture_stop(&f);
}

/* Two runtimes' appends in flight together (ra_remote_append_start on both before either
 * _wait: a batched decode step's), each still exact; a wait with nothing in flight and a second
 * start before the wait are refused. */
static void test_appends_in_flight_together(void **state) {
  (void)state;
  fixture f;
  memset(&f, 0, sizeof f);
  fixture_start(&f);
  ra_remote *r[2];
  ra_error err;
  ra_remote_config cfg = {.dtype = RA_DTYPE_F16, .mode = RA_MODE_FULL, .timeout_ms = 10000};
  const uint64_t n0 = N_TOKENS - STEPS;
  for (int i = 0; i < 2; i++) {
    ok(ra_remote_open(&f.plan, HD, &cfg, &r[i], &err), &err);
    prefill(r[i], &f, n0);
  }
  assert_int_equal(ra_remote_append_wait(r[0], &err), RA_ESTATE);
  float k[N_LAYERS * N_KV * HD], v[N_LAYERS * N_KV * HD];
  for (uint64_t n = n0; n < n0 + (uint64_t)STEPS; n++) {
    int64_t ev = ra_offload_plan_evicted(&f.plan, n);
    for (uint32_t l = 0; l < N_LAYERS; l++)
      layer_rows(&f.d, l, (uint64_t)ev, (uint64_t)ev + 1, k + l * N_KV * HD, v + l * N_KV * HD);
    for (int i = 0; i < 2; i++) ok(ra_remote_append_start(r[i], (uint64_t)ev, k, v, &err), &err);
    if (n == n0) assert_int_equal(ra_remote_append_start(r[1], (uint64_t)ev, k, v, &err), RA_ESTATE);
    for (int i = 0; i < 2; i++) ok(ra_remote_append_wait(r[i], &err), &err);
    for (int i = 0; i < 2; i++) assert_true(check_context(r[i], &f, n + 1, n + 40 * (uint64_t)i) < 1e-4);
  }
  for (int i = 0; i < 2; i++) ra_remote_close(r[i]);
  fixture_stop(&f);
}

/* With k at least the offloaded count, exact top-k keeps every token: flat equals full. */
static void test_flat_with_k_covering_everything_equals_full(void **state) {
  fixture f;
  ra_remote *r = fixture_open_prefilled(&f, &(ra_remote_config){.dtype = RA_DTYPE_F16, .mode = RA_MODE_FLAT, .top_k = N_TOKENS});
  double e = check_context(r, &f, N_TOKENS, 2);
  print_message("flat k=%d: max |err| %.2e\n", N_TOKENS, e);
  assert_true(e < 1e-4);
  ra_remote_close(r);
  fixture_stop(&f);
}

static void test_store_killed_mid_decode_fails_fast_and_names_it(void **state) {
  fixture f;
  ra_remote *r = fixture_open_prefilled(&f, &(ra_remote_config){.dtype = RA_DTYPE_F16, .mode = RA_MODE_FULL, .timeout_ms = 3000});
  ra_error err;
  assert_true(check_context(r, &f, N_TOKENS, 3) < 1e-4);
  kill(f.st[1].pid, SIGKILL);
  waitpid(f.st[1].pid, NULL, 0);
  f.st[1].pid = 0;
  float q[N_Q * HD] = {0}, o[N_Q * HD], ml[N_Q * 2];
  int rc = ra_remote_attend(r, 1, q, o, ml, NULL, &err);
  assert_true(rc == RA_EUNAVAIL || rc == RA_ETIMEDOUT || rc == RA_ECANCELED);
  print_message("after kill: %s\n", err.msg);
  assert_non_null(strstr(err.msg, f.st[1].addr));
  /* The remote stops: no step runs on half the context. */
  assert_int_equal(ra_remote_attend(r, 0, q, o, ml, NULL, &err), RA_ESTATE);
  assert_non_null(strstr(err.msg, f.st[1].addr));
  ra_remote_close(r);
  /* The surviving stores dropped the session's memory on close. */
  for (int i = 0; i < 3; i += 2) {
    ra_kvclient *c;
    ra_kvclient_store_stats s;
    ok(ra_kvclient_connect(f.st[i].addr, NULL, &c, &err), &err);
    ok(ra_kvclient_stats(c, &s, &err), &err);
    assert_int_equal(s.sessions, 0);
    assert_int_equal(s.bytes_used, 0);
    ra_kvclient_close(c);
  }
  fixture_stop(&f);
}

/* The batched tests' remotes: full mode, f16, a short deadline (a killed store fails fast). */
static const ra_remote_config pair_cfg = {.dtype = RA_DTYPE_F16, .mode = RA_MODE_FULL, .timeout_ms = 3000};

/* Two remotes of f's plan, each prefilled with every token, and a batch. */
static void pair_open(const fixture *f, ra_remote *r[2], ra_remote_batch **rb) {
  ra_error err;
  for (int i = 0; i < 2; i++) {
    ok(ra_remote_open(&f->plan, HD, &pair_cfg, &r[i], &err), &err);
    prefill(r[i], f, N_TOKENS);
  }
  ok(ra_remote_batch_new(rb, &err), &err);
}

/* One decode step of two remotes' attends through batch rb, every layer: both stage, the batch
 * is sent, both take their partials; the largest error against direct attention. */
static double batched_step(ra_remote *r[2], ra_remote_batch *rb, const fixture *f, uint64_t step) {
  float q[2][N_Q * HD], o[2][N_Q * HD], ml[2][N_Q * 2];
  ra_error err;
  double worst = 0;
  for (uint32_t layer = 0; layer < N_LAYERS; layer++) {
    for (int i = 0; i < 2; i++) {
      query_fill(q[i], step * 2 + (uint64_t)i, layer);
      ra_remote_attend_via(r[i], rb);
      ok(ra_remote_attend_begin(r[i], layer, q[i], &err), &err);
    }
    ra_remote_batch_send(rb);
    for (int i = 0; i < 2; i++) {
      ok(ra_remote_attend_end(r[i], o[i], ml[i], NULL, &err), &err);
      worst = fmax(worst, layer_error(f, layer, N_TOKENS, q[i], o[i], ml[i]));
    }
  }
  ra_remote_batch_end_step(rb);
  return worst;
}

/* Two remotes' attends through one batch (remote_batch.h: a batched decode step's): per layer,
 * each store touched gets one AttendBatch message with both remotes' requests, and each remote's
 * merged partial is exact. A store killed then fails both remotes' attends with its address,
 * and the batch goes on with the others at the next step. */
static void test_attends_batched_across_remotes(void **state) {
  (void)state;
  fixture f;
  memset(&f, 0, sizeof f);
  fixture_start(&f);
  ra_remote *r[2];
  ra_remote_batch *rb;
  ra_error err;
  pair_open(&f, r, &rb);
  float q[2][N_Q * HD], o[2][N_Q * HD], ml[2][N_Q * 2];
  double worst = 0;
  for (int step = 0; step < 3; step++) worst = fmax(worst, batched_step(r, rb, &f, (uint64_t)step));
  print_message("two remotes through one batch: max |err| %.2e\n", worst);
  assert_true(worst < 1e-4);
  /* per step: layer 0 at store 0, layers 1 and 2 at all three stores */
  uint64_t msgs, reqs;
  ra_remote_batch_counts(rb, &msgs, &reqs);
  assert_int_equal(msgs, 3 * 7);
  assert_int_equal(reqs, 3 * 7 * 2);
  /* without a via, the same remote attends on its own streams */
  assert_true(check_context(r[0], &f, N_TOKENS, 9) < 1e-4);
  ra_remote_batch_counts(rb, &msgs, &reqs);
  assert_int_equal(msgs, 3 * 7);

  kill(f.st[1].pid, SIGKILL);
  waitpid(f.st[1].pid, NULL, 0);
  f.st[1].pid = 0;
  for (int i = 0; i < 2; i++) {
    query_fill(q[i], 50, 1);
    ra_remote_attend_via(r[i], rb);
    ok(ra_remote_attend_begin(r[i], 1, q[i], &err), &err);
  }
  ra_remote_batch_send(rb);
  for (int i = 0; i < 2; i++) {
    int rc = ra_remote_attend_end(r[i], o[i], ml[i], NULL, &err);
    assert_true(rc == RA_EUNAVAIL || rc == RA_ETIMEDOUT || rc == RA_ECANCELED);
    assert_non_null(strstr(err.msg, f.st[1].addr));
  }
  ra_remote_batch_end_step(rb);
  /* a third remote, on store 0 alone, batches as before: the batch reconnected nothing it did
   * not need and carries on */
  ra_shard_map map0;
  ra_offload_plan plan0;
  char text[128];
  snprintf(text, sizeof text, "%s * * *\n", f.st[0].addr);
  ok(ra_shard_map_parse(text, &map0, &err), &err);
  ok(ra_offload_plan_build(&map0, N_LAYERS, N_Q, N_KV, SINK, WINDOW, &plan0, &err), &err);
  ra_remote *r3;
  ok(ra_remote_open(&plan0, HD, &pair_cfg, &r3, &err), &err);
  uint64_t b, e;
  ra_offload_plan_range(&plan0, N_TOKENS, &b, &e);
  float *k = malloc((e - b) * N_KV * HD * sizeof(float)), *v = malloc((e - b) * N_KV * HD * sizeof(float));
  layer_rows(&f.d, 1, b, e, k, v);
  ok(ra_remote_put(r3, 1, k, v, b, e - b, &err), &err);
  free(k);
  free(v);
  query_fill(q[0], 60, 1);
  ra_remote_attend_via(r3, rb);
  ok(ra_remote_attend_begin(r3, 1, q[0], &err), &err);
  ra_remote_batch_send(rb);
  ok(ra_remote_attend_end(r3, o[0], ml[0], NULL, &err), &err);
  assert_true(layer_error(&f, 1, N_TOKENS, q[0], o[0], ml[0]) < 1e-4);
  ra_remote_batch_counts(rb, &msgs, &reqs);
  assert_int_equal(msgs, 3 * 7 + 3 + 1);
  ra_remote_batch_end_step(rb);
  ra_remote_batch_free(rb);
  ra_remote_close(r3);
  ra_offload_plan_free(&plan0);
  ra_shard_map_free(&map0);
  for (int i = 0; i < 2; i++) ra_remote_close(r[i]);
  fixture_stop(&f);
}

/* Through a batch with replicas: kv heads 0-1 on stores 0 and 1 (store 0 asked first), kv head 2
 * on store 2. Store 0 killed: its items fail, it is marked down, and the heads it held go to
 * store 1 on the remotes' own streams within the same attend, while store 2's items still come
 * from the batch; every partial stays exact, and the next attends batch without store 0. */
static void test_batched_attend_fails_over_to_a_replica(void **state) {
  (void)state;
  fixture f;
  memset(&f, 0, sizeof f);
  fixture_start_map(&f, "%1$s,%2$s * 0-1 *\n%3$s * 2 *\n");
  ra_remote *r[2];
  ra_remote_batch *rb;
  ra_error err;
  pair_open(&f, r, &rb);
  double worst = 0;
  for (int step = 0; step < 3; step++) {
    if (step == 1) {
      kill(f.st[0].pid, SIGKILL);
      waitpid(f.st[0].pid, NULL, 0);
      f.st[0].pid = 0;
    }
    worst = fmax(worst, batched_step(r, rb, &f, (uint64_t)step));
  }
  print_message("batched attends across a replica failover: max |err| %.2e\n", worst);
  assert_true(worst < 1e-4);
  for (int i = 0; i < 2; i++) {
    ra_remote_store_report rep;
    ok(ra_remote_store_state(r[i], 0, &rep), &err);
    assert_true(rep.down);
  }
  /* before the kill both stores per layer, after it store 2 alone (store 1 on the streams in
   * the failed step, then in the batch) */
  uint64_t msgs, reqs;
  ra_remote_batch_counts(rb, &msgs, &reqs);
  assert_int_equal(msgs, 3 * N_LAYERS * 2);
  ra_remote_batch_free(rb);
  for (int i = 0; i < 2; i++) ra_remote_close(r[i]);
  fixture_stop(&f);
}

/* Misuse of a batch stream and of a batch is refused with its reason: a recv with no message
 * in flight, a send of no items, an item with retro queries, a ticket of no sent message. */
static void test_batch_misuse_is_refused(void **state) {
  (void)state;
  harness_store st;
  assert_int_equal(harness_store_start(&st, NULL), 0);
  ra_error err;
  ra_kvclient *c;
  ok(ra_kvclient_connect(st.addr, NULL, &c, &err), &err);
  ra_kvclient_batch *b;
  ok(ra_kvclient_batch_open(c, &b, &err), &err);
  ra_kvclient_batch_reply *rep;
  assert_int_equal(ra_kvclient_batch_recv(b, 1000, &rep, &err), RA_ESTATE);
  assert_null(rep);
  assert_non_null(strstr(err.msg, "no AttendBatch reply awaited"));
  assert_int_equal(ra_kvclient_batch_send(b, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "no items"));
  ra_kvclient_session sess = {.geo = {N_LAYERS, N_Q, N_KV, HD, RA_DTYPE_F16}};
  uint32_t head = 0;
  float q[HD] = {0}, q_past[HD] = {0};
  ra_kvclient_attend_req req = {.q_heads = &head, .n_heads = 1, .q = q, .mode = RA_MODE_FULL, .retro_step = 2,
                                .retro_window = 1, .n_retro = 1, .retro_q = q_past};
  size_t item;
  assert_int_equal(ra_kvclient_batch_add(b, &sess, &req, &item, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "retro"));
  assert_int_equal(ra_kvclient_batch_staged(b), 0);
  ra_kvclient_batch_close(b);
  ra_kvclient_close(c);
  ra_remote_batch *rb;
  ok(ra_remote_batch_new(&rb, &err), &err);
  ra_head_partial part;
  ra_remote_batch_ticket t = {0, 0, 0};
  assert_int_equal(ra_remote_batch_take(rb, &t, &sess, &req, &part, 1000, NULL, &err), RA_ESTATE);
  assert_non_null(strstr(err.msg, "before its message was sent"));
  ra_remote_batch_free(rb);
  assert_int_equal(harness_store_stop(&st, 5000), 0);
}

static void test_unreachable_store_is_named_at_open(void **state) {
  ra_shard_map map;
  ra_offload_plan plan;
  ra_error err;
  ok(ra_shard_map_parse("127.0.0.1:1 * * *\n", &map, &err), &err);
  ok(ra_offload_plan_build(&map, 1, 2, 1, 4, 4, &plan, &err), &err);
  ra_remote *r;
  ra_remote_config cfg = {.dtype = RA_DTYPE_F32, .mode = RA_MODE_FULL};
  assert_int_equal(ra_remote_open(&plan, 8, &cfg, &r, &err), RA_EUNAVAIL);
  assert_non_null(strstr(err.msg, "127.0.0.1:1"));
  ra_offload_plan_free(&plan);
  ra_shard_map_free(&map);
}

/* Index builds of every head go out together and the stores build them in parallel; roar
 * attends then scan a fraction of the keys. A build the store refuses fails the wait with the
 * store's reason, after the other builds in flight were collected, and stops the remote. */
static void test_builds_in_flight_together_and_a_refused_one_is_reported(void **state) {
  fixture f;
  ra_remote *r = fixture_open_prefilled(&f, &(ra_remote_config){.dtype = RA_DTYPE_F16, .mode = RA_MODE_ROAR, .top_k = 50});
  ra_error err;
  enum { NQ = 32 };
  static float qs[NQ * HD];
  /* layer 1's heads: the kv head split by token range makes two stores build one head */
  for (uint32_t h = 0; h < N_Q; h++) {
    /* the kv head's own keys as queries: the stores compute their top lists */
    const float *k = kvdata_k(&f.d, 1, h / (N_Q / N_KV));
    for (int i = 0; i < NQ; i++) memcpy(qs + i * HD, k + (size_t)(SINK + 37 * i + h) * HD, HD * sizeof(float));
    ok(ra_remote_build_index_start(r, 1, h, &(ra_kvclient_build_input){.queries = qs, .n_queries = NQ}, &err), &err);
  }
  ok(ra_remote_build_index_wait(r, &err), &err);
  float q[N_Q * HD], o[N_Q * HD], ml[N_Q * 2];
  for (int i = 0; i < N_Q * HD; i++) q[i] = (float)sin((double)i) * 0.7f;
  ra_remote_stats st;
  ok(ra_remote_attend(r, 1, q, o, ml, &st, &err), &err);
  print_message("roar after parallel builds: %llu of %llu keys scanned\n", (unsigned long long)st.n_scanned,
                (unsigned long long)st.n_keys);
  assert_true(st.n_scanned > 0 && st.n_scanned < st.n_keys);

  /* two refused builds (a roar knn list needs >= 2 ids) and a good one */
  static uint64_t knn[2 * NQ];
  for (int i = 0; i < 2 * NQ; i++) knn[i] = SINK + (uint64_t)i;
  ok(ra_remote_build_index_start(r, 0, 0, &(ra_kvclient_build_input){.queries = qs, .n_queries = NQ, .knn_ids = knn, .knn_k = 1}, &err), &err);
  ok(ra_remote_build_index_start(r, 0, 1, &(ra_kvclient_build_input){.queries = qs, .n_queries = NQ, .knn_ids = knn, .knn_k = 1}, &err), &err);
  ok(ra_remote_build_index_start(r, 0, 2, &(ra_kvclient_build_input){.queries = qs, .n_queries = NQ, .knn_ids = knn, .knn_k = 2}, &err), &err);
  assert_int_equal(ra_remote_build_index_wait(r, &err), RA_EINVAL);
  print_message("refused build: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "at least 2"));
  assert_int_equal(ra_remote_attend(r, 1, q, o, ml, &st, &err), RA_ESTATE);
  ra_remote_close(r);
  fixture_stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_mode_matches_direct_attention_through_decode),
      cmocka_unit_test(test_flat_with_k_covering_everything_equals_full),
      cmocka_unit_test(test_put_heads_in_the_session_dtype),
      cmocka_unit_test(test_appends_in_flight_together),
      cmocka_unit_test(test_builds_in_flight_together_and_a_refused_one_is_reported),
      cmocka_unit_test(test_store_killed_mid_decode_fails_fast_and_names_it),
      cmocka_unit_test(test_attends_batched_across_remotes),
      cmocka_unit_test(test_batched_attend_fails_over_to_a_replica),
      cmocka_unit_test(test_batch_misuse_is_refused),
      cmocka_unit_test(test_unreachable_store_is_named_at_open),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
