/* The background indexer: writes return before insertion, attends against a lagging index are
 * right (exact retrieval unchanged, fresh rows found) and never wait for a batch, the lag is
 * observable and drains, budget refusals lag and retry, closing or destroying with a backlog,
 * and a concurrent stress of appends, attends and rebuilds (run under ASan/UBSan by the
 * sanitizer build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "attend.h"
#include "reference.h"
#include "store.h"

#define DIM 16
#define ROW_BYTES (DIM * 4) /* f32 */

/* A session of n_layers x n_kv open shards (2 q heads per kv head), f32, with n random rows
 * each; keys[l][h] mirrors what the store holds (room for `room` rows). */
typedef struct fx {
  kvs_store *st;
  kvs_session *s;
  kvs_geometry g;
  uint32_t n_layers, n_kv;
  size_t n0, room;
  float *keys[2][2];
  float *values[2][2];
  size_t n[2][2];
} fx;

static void fx_open(fx *f, uint64_t budget, uint32_t n_layers, uint32_t n_kv, size_t n,
                    size_t room, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->g = (kvs_geometry){.n_layers = n_layers, .n_q_heads = 2 * n_kv, .n_kv_heads = n_kv,
                        .head_dim = DIM, .dtype = RA_DTYPE_F32};
  f->n_layers = n_layers;
  f->n_kv = n_kv;
  f->n0 = n;
  f->room = room;
  ra_error err;
  assert_int_equal(kvs_store_create(budget, &f->st, &err), RA_OK);
  kvs_shard_spec sh[4];
  size_t ns = 0;
  for (uint32_t l = 0; l < n_layers; l++)
    for (uint32_t h = 0; h < n_kv; h++)
      sh[ns++] = (kvs_shard_spec){.layer = l, .kv_head = h, .token_begin = 0,
                                  .token_end = RA_TOKEN_END_OPEN};
  assert_int_equal(kvs_store_open(f->st, &f->g, sh, ns, NULL, "t", &f->s, &err), RA_OK);
  ref_rng rng = {seed};
  for (uint32_t l = 0; l < n_layers; l++)
    for (uint32_t h = 0; h < n_kv; h++) {
      f->keys[l][h] = malloc(room * ROW_BYTES);
      f->values[l][h] = malloc(room * ROW_BYTES);
      ref_fill_normal(&rng, f->keys[l][h], room * DIM, 1.0f);
      ref_fill_normal(&rng, f->values[l][h], room * DIM, 1.0f);
      kvs_rows r = {.layer = l, .kv_head = h, .token_begin = 0, .n = n, .keys = f->keys[l][h],
                    .values = f->values[l][h]};
      assert_int_equal(kvs_session_write(f->s, &r, 1, NULL, &err), RA_OK);
      f->n[l][h] = n;
    }
}

static void fx_free_data(fx *f) {
  for (uint32_t l = 0; l < f->n_layers; l++)
    for (uint32_t h = 0; h < f->n_kv; h++) {
      free(f->keys[l][h]);
      free(f->values[l][h]);
    }
}

static void fx_close(fx *f) {
  fx_free_data(f);
  kvs_session_release(f->s);
  kvs_store_destroy(f->st);
}

/* Appends rows [n, n + count) of the mirror of (l, h), after overwriting row `plant` (if it is
 * in range) with 8 q: its score for q is far above any random key's. */
static int fx_append(fx *f, uint32_t l, uint32_t h, size_t count, size_t plant, const float *q,
                     ra_error *err) {
  size_t b = f->n[l][h];
  if (plant >= b && plant < b + count)
    for (int d = 0; d < DIM; d++) f->keys[l][h][plant * DIM + d] = 8.0f * q[d];
  kvs_rows r = {.layer = l, .kv_head = h, .token_begin = b, .n = count,
                .keys = f->keys[l][h] + b * DIM, .values = f->values[l][h] + b * DIM};
  int rc = kvs_session_write(f->s, &r, 1, NULL, err);
  if (rc == RA_OK) f->n[l][h] += count;
  return rc;
}

/* roar of q head qh of layer l (per q head) from nq random queries. */
static void fx_build(fx *f, uint32_t l, uint32_t qh, uint64_t seed) {
  enum { NQ = 128 };
  static float q[NQ * DIM];
  ref_rng rng = {seed};
  ref_fill_normal(&rng, q, NQ * DIM, 1.0f);
  kvs_build_args b = {.layer = l, .q_head = qh, .queries = q, .n_queries = NQ};
  ra_index_params_default(RA_MODE_ROAR, &b.params);
  b.params.n_threads = 1;
  b.params.seed = seed;
  kvs_build_result res;
  ra_error err;
  if (kvs_session_build_index(f->s, &b, &res, &err) != RA_OK) fail_msg("build: %s", err.msg);
}

static const ra_index *fx_index(fx *f, uint32_t l, uint32_t qh) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(f->s, l, qh / 2, &count);
  return kvs_shard_index(f->s, sh, RA_MODE_ROAR, qh);
}

/* Reads an index's count the way attends do, under its shard's ix_lock. */
static uint32_t fx_count(fx *f, uint32_t l, uint32_t qh) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(f->s, l, qh / 2, &count);
  kvs_shard_index_read_lock(sh);
  uint32_t n = ra_index_count(fx_index(f, l, qh));
  kvs_shard_index_read_unlock(sh);
  return n;
}

static int fx_attend(fx *f, uint32_t l, uint32_t qh, const float *q, ra_mode mode, uint32_t k,
                     uint32_t ef, kvs_attend_result *out) {
  kvs_attend_args a = {.layer = l, .q_heads = &qh, .n_heads = 1, .q = q, .mode = mode,
                       .top_k = k, .search = {.ef = ef}, .want_ids = 1, .n_threads = 1};
  ra_error err;
  int rc = kvs_attend(f->s, &a, out, &err);
  if (rc) print_message("attend: %s\n", err.msg);
  return rc;
}

static void assert_same_selection(const kvs_attend_result *x, const kvs_attend_result *y) {
  assert_int_equal(x->heads[0].n_keys, y->heads[0].n_keys);
  assert_int_equal(x->heads[0].n_ids, y->heads[0].n_ids);
  for (size_t i = 0; i < x->heads[0].n_ids; i++)
    assert_int_equal(x->heads[0].ids[i], y->heads[0].ids[i]);
  /* Same rows; the dot products may come from different kernels (search, scan). */
  assert_true(fabsf(x->heads[0].part.m - y->heads[0].part.m) <= 1e-5f);
  for (int d = 0; d < DIM; d++) assert_true(fabsf(x->heads[0].part.o[d] - y->heads[0].part.o[d]) <= 1e-5f);
}

/* Exact retrieval does not depend on how far insertion has got: with a beam wide enough that the
 * graph answers exactly, an attend against 300 pending rows selects what flat selects, and what
 * the same attend selects once they are inserted. */
static void test_pending_exact_equals_drained(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 64u << 20, 1, 1, 1200, 1500, 1);
  fx_build(&f, 0, 0, 2);
  kvs_store_index_pause(f.st, 1);
  ra_error err;
  for (int i = 0; i < 3; i++) assert_int_equal(fx_append(&f, 0, 0, 100, SIZE_MAX, NULL, &err), RA_OK);
  assert_int_equal(kvs_session_index_lag(f.s), 300);
  assert_int_equal(fx_count(&f, 0, 0), 1200);
  enum { NQ = 6 };
  float q[NQ * DIM];
  ref_rng rng = {3};
  ref_fill_normal(&rng, q, NQ * DIM, 1.0f);
  kvs_attend_result lagging[NQ], flat;
  for (int i = 0; i < NQ; i++) {
    assert_int_equal(fx_attend(&f, 0, 0, q + i * DIM, RA_MODE_ROAR, 20, 1000, &lagging[i]), RA_OK);
    assert_int_equal(lagging[i].heads[0].n_keys, 1500);
    assert_int_equal(fx_attend(&f, 0, 0, q + i * DIM, RA_MODE_FLAT, 20, 0, &flat), RA_OK);
    assert_same_selection(&lagging[i], &flat);
    kvs_attend_result_free(&flat);
  }
  kvs_store_index_pause(f.st, 0);
  kvs_session_index_drain(f.s);
  assert_int_equal(kvs_session_index_lag(f.s), 0);
  assert_int_equal(fx_count(&f, 0, 0), 1500);
  for (int i = 0; i < NQ; i++) {
    kvs_attend_result drained;
    assert_int_equal(fx_attend(&f, 0, 0, q + i * DIM, RA_MODE_ROAR, 20, 1000, &drained), RA_OK);
    assert_same_selection(&lagging[i], &drained);
    kvs_attend_result_free(&drained);
    kvs_attend_result_free(&lagging[i]);
  }
  fx_close(&f);
}

/* Holds a shard's ix_lock for writing, as an insertion batch does, until told to let go (from
 * its own thread and without the session lock, like the indexer). */
typedef struct batch_holder {
  kvs_shard *sh;
  int held, release;
} batch_holder;

static void *hold_batch(void *p) {
  batch_holder *b = p;
  pthread_rwlock_wrlock(&b->sh->ix_lock);
  __atomic_store_n(&b->held, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&b->release, __ATOMIC_ACQUIRE)) sched_yield();
  pthread_rwlock_unlock(&b->sh->ix_lock);
  return NULL;
}

/* An attend never waits for an insertion batch: with the shard's ix_lock held as a batch holds
 * it, a graph-mode attend scans the shard exactly (flat's selection, every key scanned) and
 * returns; released, it walks the graph again. */
static void test_attend_does_not_wait_for_a_batch(void **state) {
  (void)state;
  enum { N = 1500 };
  fx f;
  fx_open(&f, 64u << 20, 1, 1, N, N, 60);
  fx_build(&f, 0, 0, 61);
  float q[DIM];
  ref_rng rng = {62};
  ref_fill_normal(&rng, q, DIM, 1.0f);
  size_t count;
  batch_holder b = {.sh = (kvs_shard *)kvs_session_head(f.s, 0, 0, &count)};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hold_batch, &b), 0);
  while (!__atomic_load_n(&b.held, __ATOMIC_ACQUIRE)) sched_yield();
  kvs_attend_result busy, flat;
  assert_int_equal(fx_attend(&f, 0, 0, q, RA_MODE_ROAR, 20, 32, &busy), RA_OK);
  __atomic_store_n(&b.release, 1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  assert_int_equal(busy.heads[0].n_scanned, N);
  assert_int_equal(fx_attend(&f, 0, 0, q, RA_MODE_FLAT, 20, 0, &flat), RA_OK);
  assert_same_selection(&busy, &flat);
  kvs_attend_result_free(&busy);
  kvs_attend_result_free(&flat);
  kvs_attend_result walk;
  assert_int_equal(fx_attend(&f, 0, 0, q, RA_MODE_ROAR, 20, 32, &walk), RA_OK);
  assert_true(walk.heads[0].n_scanned < N);
  kvs_attend_result_free(&walk);
  fx_close(&f);
}

/* The indexer paused: the lag is exactly what was appended, a graph search (a beam far below a
 * quarter of the keys, so a real walk) finds a fresh key through the lag scan; resumed and
 * drained, the index holds every row and still finds it, now through the graph. */
static void test_paused_lag_then_drain(void **state) {
  (void)state;
  enum { N = 2000, ADD = 50, PLANT = N + 25 };
  fx f;
  fx_open(&f, 64u << 20, 2, 1, N, N + ADD, 4);
  fx_build(&f, 1, 0, 5);
  fx_build(&f, 1, 1, 6);
  float q[DIM];
  ref_rng rng = {7};
  ref_fill_normal(&rng, q, DIM, 1.0f);
  kvs_store_index_pause(f.st, 1);
  ra_error err;
  assert_int_equal(fx_append(&f, 1, 0, ADD, PLANT, q, &err), RA_OK);
  /* Layer 0 has no index: its rows are never queued. */
  assert_int_equal(fx_append(&f, 0, 0, ADD, SIZE_MAX, NULL, &err), RA_OK);
  assert_int_equal(kvs_session_index_lag(f.s), 2 * ADD); /* two indexes on the shard */
  kvs_attend_result r;
  assert_int_equal(fx_attend(&f, 1, 0, q, RA_MODE_ROAR, 10, 32, &r), RA_OK);
  assert_int_equal(r.heads[0].n_keys, N + ADD);
  assert_int_equal(r.heads[0].ids[0], PLANT);
  assert_true(r.heads[0].n_scanned >= ADD && r.heads[0].n_scanned < N);
  kvs_attend_result_free(&r);
  assert_int_equal(fx_count(&f, 1, 0), N);
  assert_int_equal(fx_count(&f, 1, 1), N);

  kvs_store_index_pause(f.st, 0);
  kvs_session_index_drain(f.s);
  assert_int_equal(kvs_session_index_lag(f.s), 0);
  assert_int_equal(fx_count(&f, 1, 0), N + ADD);
  assert_int_equal(fx_count(&f, 1, 1), N + ADD);
  assert_int_equal(ra_index_check(fx_index(&f, 1, 0), &err), RA_OK);
  assert_int_equal(fx_attend(&f, 1, 0, q, RA_MODE_ROAR, 10, 32, &r), RA_OK);
  assert_int_equal(r.heads[0].ids[0], PLANT);
  assert_true(r.heads[0].n_scanned < N);
  kvs_attend_result_free(&r);
  fx_close(&f);
}

/* A rebuild while the shard is queued: the new index is built over the queued rows, so nothing
 * lags, and the queued batch finds nothing to do. (Rows written *during* a build are left to
 * the indexer: test_kvs_attend's test_build_while_appending.) */
static void test_rebuild_while_queued(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 64u << 20, 1, 1, 1000, 1100, 8);
  fx_build(&f, 0, 0, 9);
  kvs_store_index_pause(f.st, 1);
  ra_error err;
  assert_int_equal(fx_append(&f, 0, 0, 100, SIZE_MAX, NULL, &err), RA_OK);
  assert_int_equal(kvs_session_index_lag(f.s), 100);
  fx_build(&f, 0, 0, 10);
  assert_int_equal(kvs_session_index_lag(f.s), 0);
  assert_int_equal(fx_count(&f, 0, 0), 1100);
  kvs_store_index_pause(f.st, 0);
  kvs_session_index_drain(f.s);
  assert_int_equal(fx_count(&f, 0, 0), 1100);
  fx_close(&f);
}

/* An insertion the budget refuses leaves the index lagging (drain still returns, attends still
 * find the rows); once budget is free again, the next write retries it. */
static void test_budget_refusal_lags_then_retries(void **state) {
  (void)state;
  const uint64_t budget = 16u << 20;
  fx f;
  fx_open(&f, budget, 1, 1, 1000, 1200, 11);
  fx_build(&f, 0, 0, 12);
  ra_error err;
  /* Grows the shard's capacity (by 1/8) so that the rows below need no budget of their own. */
  assert_int_equal(fx_append(&f, 0, 0, 1, SIZE_MAX, NULL, &err), RA_OK);
  kvs_session_index_drain(f.s);
  assert_int_equal(kvs_session_index_lag(f.s), 0);
  /* A second session takes all but ~1 KiB of the budget, less than an insertion's margin. */
  kvs_session *filler;
  kvs_shard_spec sh = {.layer = 0, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  assert_int_equal(kvs_store_open(f.st, &f.g, &sh, 1, NULL, "filler", &filler, &err), RA_OK);
  uint64_t rows = (budget - kvs_store_bytes_used(f.st) - 1024) / (2 * ROW_BYTES);
  float *x = calloc(rows, ROW_BYTES);
  kvs_rows r = {.layer = 0, .kv_head = 0, .token_begin = 0, .n = rows, .keys = x, .values = x};
  assert_int_equal(kvs_session_write(filler, &r, 1, NULL, &err), RA_OK);
  free(x);
  assert_true(budget - kvs_store_bytes_used(f.st) < 4096);

  float q[DIM];
  ref_rng rng = {13};
  ref_fill_normal(&rng, q, DIM, 1.0f);
  assert_int_equal(fx_append(&f, 0, 0, 20, 1010, q, &err), RA_OK);
  kvs_session_index_drain(f.s);
  assert_int_equal(kvs_session_index_lag(f.s), 20);
  assert_true(kvs_store_bytes_used(f.st) <= budget);
  kvs_attend_result res;
  assert_int_equal(fx_attend(&f, 0, 0, q, RA_MODE_ROAR, 10, 32, &res), RA_OK);
  assert_int_equal(res.heads[0].ids[0], 1010);
  kvs_attend_result_free(&res);

  uint8_t id[KVS_SESSION_ID_BYTES];
  memcpy(id, filler->id, sizeof id);
  kvs_session_release(filler);
  assert_int_equal(kvs_store_close(f.st, id, sizeof id, NULL, &err), RA_OK);
  assert_int_equal(fx_append(&f, 0, 0, 1, SIZE_MAX, NULL, &err), RA_OK);
  kvs_session_index_drain(f.s);
  assert_int_equal(kvs_session_index_lag(f.s), 0);
  assert_int_equal(fx_count(&f, 0, 0), 1022);
  fx_close(&f);
}

/* A backlog of 4 x 1500 rows x 2 indexes when the session goes: closed while batches run
 * (everything is given back by the time close returns), closed while still referenced (writes
 * after the close are stored but no longer queued), and left open for the store's destroy. */
static void test_close_with_backlog(void **state) {
  (void)state;
  enum { N = 600, ADD = 1500 };
  for (int how = 0; how < 3; how++) {
    fx f;
    fx_open(&f, 256u << 20, 2, 2, N, N + ADD + 10, 20 + (uint64_t)how);
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t qh = 0; qh < 4; qh++) fx_build(&f, l, qh, 30 + qh);
    kvs_store_index_pause(f.st, 1);
    ra_error err;
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t h = 0; h < 2; h++)
        assert_int_equal(fx_append(&f, l, h, ADD, SIZE_MAX, NULL, &err), RA_OK);
    assert_int_equal(kvs_session_index_lag(f.s), 4 * 2 * ADD);
    kvs_store_index_pause(f.st, 0);
    struct timespec ts = {0, 3 * 1000 * 1000}; /* a few batches run */
    nanosleep(&ts, NULL);
    uint8_t id[KVS_SESSION_ID_BYTES];
    memcpy(id, f.s->id, sizeof id);
    if (how == 0) {
      kvs_session_release(f.s);
      uint64_t freed = 0;
      assert_int_equal(kvs_store_close(f.st, id, sizeof id, &freed, &err), RA_OK);
      assert_true(freed > 0);
      assert_int_equal(kvs_store_bytes_used(f.st), 0);
      fx_free_data(&f);
      kvs_store_destroy(f.st);
    } else if (how == 1) {
      assert_int_equal(kvs_store_close(f.st, id, sizeof id, NULL, &err), RA_OK);
      uint64_t lag = kvs_session_index_lag(f.s);
      assert_true(lag > 0);
      assert_int_equal(fx_append(&f, 0, 0, 10, SIZE_MAX, NULL, &err), RA_OK);
      kvs_session_index_drain(f.s); /* nothing is queued for a closed session */
      assert_int_equal(kvs_session_index_lag(f.s), lag + 2 * 10);
      kvs_attend_result r;
      assert_int_equal(fx_attend(&f, 0, 1, f.keys[0][0] + (N + ADD + 5) * DIM, RA_MODE_ROAR, 4,
                                 16, &r),
                       RA_OK);
      assert_int_equal(r.heads[0].n_keys, N + ADD + 10);
      kvs_attend_result_free(&r);
      fx_close(&f);
    } else {
      fx_close(&f); /* the destroy cancels the open session's backlog */
    }
  }
}

/* ---- stress: appends, attends, rebuilds and lag reads from several threads ---- */

enum { S_N = 800, S_STEPS = 120, S_PLANT_STEP = 40 };

typedef struct stress {
  fx f;
  float q[4][DIM]; /* q head h's query; its kv head gets a planted key at step S_PLANT_STEP */
  int appenders_done;
  int failures;
  int attends;       /* attends made while appends ran */
  uint64_t max_lag;  /* the largest lag the builder saw */
} stress;

typedef struct stress_arg {
  stress *x;
  uint32_t id;
} stress_arg;

/* Appender h owns kv head h of both layers: one row to each per step, in one write. A write
 * returns in microseconds now, so the steps are paced (and start once attends run) for the
 * appends to overlap the attends, rebuilds and insertion batches rather than finish first. */
static void *stress_appender(void *p) {
  stress_arg *a = p;
  stress *x = a->x;
  uint32_t h = a->id;
  while (__atomic_load_n(&x->attends, __ATOMIC_RELAXED) < 2) sched_yield();
  for (int t = 0; t < S_STEPS; t++) {
    struct timespec pause = {0, 200 * 1000};
    nanosleep(&pause, NULL);
    kvs_rows r[2];
    for (uint32_t l = 0; l < 2; l++) {
      size_t b = x->f.n[l][h];
      if (t == S_PLANT_STEP)
        for (int d = 0; d < DIM; d++) x->f.keys[l][h][b * DIM + d] = 8.0f * x->q[2 * h][d];
      r[l] = (kvs_rows){.layer = l, .kv_head = h, .token_begin = b, .n = 1,
                        .keys = x->f.keys[l][h] + b * DIM, .values = x->f.values[l][h] + b * DIM};
    }
    ra_error err;
    if (kvs_session_write(x->f.s, r, 2, NULL, &err) != RA_OK) {
      __atomic_add_fetch(&x->failures, 1, __ATOMIC_RELAXED);
      break;
    }
    x->f.n[0][h]++;
    x->f.n[1][h]++;
  }
  __atomic_add_fetch(&x->appenders_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Attends of every q head of a layer, alternately a graph walk (only sanity checked: the graph
 * may miss a key) and an exact beam: once the planted row is stored, the exact one must have it
 * first, whether it is indexed yet or in the lag. */
static void *stress_attender(void *p) {
  stress_arg *a = p;
  stress *x = a->x;
  uint32_t heads[4] = {0, 1, 2, 3};
  uint64_t last[4] = {0};
  for (int it = 0; __atomic_load_n(&x->appenders_done, __ATOMIC_ACQUIRE) < 2; it++) {
    uint32_t l = (uint32_t)(it + a->id) % 2;
    int exact = it % 2;
    kvs_attend_args args = {.layer = l, .q_heads = heads, .n_heads = 4, .q = &x->q[0][0],
                            .mode = RA_MODE_ROAR, .top_k = 8, .search = {.ef = exact ? 4096 : 16},
                            .want_ids = 1, .n_threads = 1};
    kvs_attend_result r;
    ra_error err;
    if (kvs_attend(x->f.s, &args, &r, &err) != RA_OK) {
      __atomic_add_fetch(&x->failures, 1, __ATOMIC_RELAXED);
      break;
    }
    int bad = 0;
    for (uint32_t i = 0; i < 4; i++) {
      const ra_head_partial *hp = &r.heads[i];
      uint64_t plant = S_N + S_PLANT_STEP;
      if (hp->n_keys < S_N || hp->n_keys > S_N + S_STEPS || hp->n_ids == 0) bad = 1;
      if (l == 0 && hp->n_keys < last[i]) bad = 1; /* layer 0's count only grows */
      if (l == 0) last[i] = hp->n_keys;
      if (exact && i % 2 == 0 && hp->n_keys > plant && hp->ids[0] != plant) bad = 1;
    }
    kvs_attend_result_free(&r);
    __atomic_add_fetch(&x->attends, 1, __ATOMIC_RELAXED);
    if (bad) {
      __atomic_add_fetch(&x->failures, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  return NULL;
}

/* Rebuilds layer 1's q head 0 index twice while everything else runs, and reads the lag. */
static void *stress_builder(void *p) {
  stress_arg *a = p;
  stress *x = a->x;
  for (int i = 0; i < 2; i++) {
    fx_build(&x->f, 1, 0, 100 + (uint64_t)i);
    uint64_t lag = kvs_session_index_lag(x->f.s);
    if (lag > x->max_lag) x->max_lag = lag;
  }
  return NULL;
}

static void test_stress_concurrent(void **state) {
  (void)state;
  stress x;
  memset(&x, 0, sizeof x);
  fx_open(&x.f, 256u << 20, 2, 2, S_N, S_N + S_STEPS, 40);
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t qh = 0; qh < 4; qh++) fx_build(&x.f, l, qh, 50 + qh);
  ref_rng rng = {41};
  ref_fill_normal(&rng, &x.q[0][0], 4 * DIM, 1.0f);
  pthread_t th[5];
  stress_arg args[5] = {{&x, 0}, {&x, 1}, {&x, 0}, {&x, 1}, {&x, 0}};
  assert_int_equal(pthread_create(&th[0], NULL, stress_appender, &args[0]), 0);
  assert_int_equal(pthread_create(&th[1], NULL, stress_appender, &args[1]), 0);
  assert_int_equal(pthread_create(&th[2], NULL, stress_attender, &args[2]), 0);
  assert_int_equal(pthread_create(&th[3], NULL, stress_attender, &args[3]), 0);
  assert_int_equal(pthread_create(&th[4], NULL, stress_builder, &args[4]), 0);
  for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
  print_message("stress: %d attends during %d appends per thread, lag seen up to %llu rows\n",
                x.attends, S_STEPS, (unsigned long long)x.max_lag);
  assert_int_equal(x.failures, 0);
  kvs_session_index_drain(x.f.s);
  assert_int_equal(kvs_session_index_lag(x.f.s), 0);
  ra_error err;
  for (uint32_t l = 0; l < 2; l++)
    for (uint32_t qh = 0; qh < 4; qh++) {
      assert_int_equal(fx_count(&x.f, l, qh), S_N + S_STEPS);
      assert_int_equal(ra_index_check(fx_index(&x.f, l, qh), &err), RA_OK);
    }
  fx_close(&x.f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pending_exact_equals_drained),
      cmocka_unit_test(test_paused_lag_then_drain),
      cmocka_unit_test(test_attend_does_not_wait_for_a_batch),
      cmocka_unit_test(test_rebuild_while_queued),
      cmocka_unit_test(test_budget_refusal_lags_then_retries),
      cmocka_unit_test(test_close_with_backlog),
      cmocka_unit_test(test_stress_concurrent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
