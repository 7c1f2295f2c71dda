/* Wave mode at the store: the cluster directory (installs, lookups, runs, lag, memory), rows
 * permuted in place, and the wave attend against a double-precision reference over the selected
 * clusters' rows plus the unclustered ones, for every dtype, GQA groups, several shards per kv
 * head, the selection's errors, and retro's past steps' partials over the clusters named for them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "attend.h"
#include "clusters.h"
#include "merge.h"
#include "reference.h"
#include "store.h"

#define LAYER 1
#define MAX_CLUSTERS 512

/* What the test installed on one kv head, and its rows as stored (fp32, rounded). */
typedef struct head_data {
  uint64_t base;       /* position of row 0 */
  size_t n;            /* rows stored */
  float *k, *v;        /* [n, dim] in row-position order, permutations applied */
  uint32_t n_cl;       /* clusters installed */
  uint32_t id[MAX_CLUSTERS];
  uint64_t pos[MAX_CLUSTERS], cnt[MAX_CLUSTERS];
} head_data;

/* Layer 1 of 2, 8 q heads over 2 kv heads; kv head 0 in shards [0, 300) and [300, open) with
 * 700 rows, kv head 1 in [50, open) with 500. */
typedef struct fixture {
  kvs_store *st;
  kvs_session *s;
  kvs_geometry g;
  head_data h[2];
  ref_rng rng;
} fixture;

static void fixture_make(fixture *f, ra_dtype t, int dim, uint64_t budget) {
  memset(f, 0, sizeof *f);
  f->g = (kvs_geometry){.n_layers = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = (uint32_t)dim,
                        .dtype = t};
  f->rng.s = 1000 + (uint64_t)t * 7 + (uint64_t)dim;
  ra_error err;
  assert_int_equal(kvs_store_create(budget, &f->st, &err), RA_OK);
  kvs_shard_spec sh[3] = {{.layer = LAYER, .kv_head = 0, .token_begin = 0, .token_end = 300},
                          {.layer = LAYER, .kv_head = 0, .token_begin = 300, .token_end = RA_TOKEN_END_OPEN},
                          {.layer = LAYER, .kv_head = 1, .token_begin = 50, .token_end = RA_TOKEN_END_OPEN}};
  assert_int_equal(kvs_store_open(f->st, &f->g, sh, 3, NULL, "wave", &f->s, &err), RA_OK);
  const size_t rows[2] = {700, 500}, rb = ra_dtype_row_bytes(t, (size_t)dim);
  for (int kv = 0; kv < 2; kv++) {
    head_data *h = &f->h[kv];
    h->base = kv == 0 ? 0 : 50;
    h->n = rows[kv];
    h->k = malloc(h->n * dim * sizeof(float));
    h->v = malloc(h->n * dim * sizeof(float));
    ref_fill_normal(&f->rng, h->k, h->n * dim, 2.0f);
    ref_fill_normal(&f->rng, h->v, h->n * dim, 1.0f);
    void *pk = malloc(h->n * rb), *pv = malloc(h->n * rb);
    ref_pack(t, h->k, pk, h->n, dim);
    ref_pack(t, h->v, pv, h->n, dim);
    if (kv == 0) {
      kvs_rows r[2] = {{.layer = LAYER, .kv_head = 0, .token_begin = 0, .n = 300, .keys = pk, .values = pv},
                       {.layer = LAYER, .kv_head = 0, .token_begin = 300, .n = 400,
                        .keys = (char *)pk + 300 * rb, .values = (char *)pv + 300 * rb}};
      assert_int_equal(kvs_session_write(f->s, r, 2, NULL, &err), RA_OK);
    } else {
      kvs_rows r = {.layer = LAYER, .kv_head = 1, .token_begin = 50, .n = 500, .keys = pk, .values = pv};
      assert_int_equal(kvs_session_write(f->s, &r, 1, NULL, &err), RA_OK);
    }
    free(pk);
    free(pv);
  }
}

static void fixture_free(fixture *f) {
  for (int kv = 0; kv < 2; kv++) {
    free(f->h[kv].k);
    free(f->h[kv].v);
  }
  kvs_session_release(f->s);
  kvs_store_destroy(f->st);
}

/* Installs clusters on kv head kv and, on success, mirrors them (and perm) in the test's copy. */
static int put(fixture *f, uint32_t kv, uint32_t first, uint64_t row_begin, const uint32_t *counts,
               size_t n, const uint32_t *perm, ra_error *err) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += counts[i];
  kvs_cluster_put p = {.layer = LAYER, .kv_head = kv, .first_cluster = first,
                       .row_begin = row_begin, .counts = counts, .n_clusters = n, .perm = perm,
                       .n_perm = perm ? (size_t)total : 0};
  int rc = kvs_session_put_clusters(f->s, &p, NULL, err);
  if (rc) return rc;
  head_data *h = &f->h[kv];
  const size_t dim = f->g.head_dim, r0 = (size_t)(row_begin - h->base);
  if (perm) {
    float *k = malloc(total * dim * sizeof *k), *v = malloc(total * dim * sizeof *v);
    for (size_t j = 0; j < total; j++) {
      memcpy(k + j * dim, h->k + (r0 + perm[j]) * dim, dim * sizeof *k);
      memcpy(v + j * dim, h->v + (r0 + perm[j]) * dim, dim * sizeof *v);
    }
    memcpy(h->k + r0 * dim, k, total * dim * sizeof *k);
    memcpy(h->v + r0 * dim, v, total * dim * sizeof *v);
    free(k);
    free(v);
  }
  uint64_t pos = row_begin;
  for (size_t i = 0; i < n; i++) {
    h->id[h->n_cl] = first + (uint32_t)i;
    h->pos[h->n_cl] = pos;
    h->cnt[h->n_cl++] = counts[i];
    pos += counts[i];
  }
  return RA_OK;
}

/* Random cluster sizes 1..31 covering exactly n rows; returns how many. */
static size_t random_counts(ref_rng *r, uint64_t n, uint32_t *counts) {
  size_t c = 0;
  while (n > 0) {
    uint32_t k = 1 + (uint32_t)(ref_rng_next(r) % 31);
    if (k > n) k = (uint32_t)n;
    counts[c++] = k;
    n -= k;
  }
  return c;
}

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static void expect(int rc, int code, const ra_error *err, const char *text) {
  if (rc != code) fail_msg("got %s (%s), want %s", ra_status_name(rc), err->msg, ra_status_name(code));
  if (!strstr(err->msg, text)) fail_msg("message '%s' lacks '%s'", err->msg, text);
}

static void test_directory(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F32, 16, 1u << 26);
  ra_error err;
  const uint64_t before = atomic_load(&f.s->bytes);
  uint32_t c1[3] = {10, 20, 70}, c2[2] = {50, 50}, c3[1] = {40};
  ok(put(&f, 0, 5, 0, c1, 3, NULL, &err), &err);
  ok(put(&f, 0, 8, 100, c2, 2, NULL, &err), &err); /* continues the run */
  ok(put(&f, 0, 20, 300, c3, 1, NULL, &err), &err); /* the second shard: a run of its own */
  const kvs_cluster_dir *d = kvs_session_clusters(f.s, LAYER, 0);
  assert_non_null(d);
  assert_int_equal(d->n_runs, 2);
  assert_null(kvs_session_clusters(f.s, LAYER, 1));
  kvs_cluster_span sp;
  assert_true(kvs_cluster_dir_find(d, 6, &sp));
  assert_int_equal(sp.shard, 0);
  assert_int_equal(sp.row, 10);
  assert_int_equal(sp.count, 20);
  assert_true(kvs_cluster_dir_find(d, 9, &sp));
  assert_int_equal(sp.row, 150);
  assert_true(kvs_cluster_dir_find(d, 20, &sp));
  assert_int_equal(sp.shard, 1);
  assert_int_equal(sp.row, 0);
  assert_int_equal(sp.count, 40);
  assert_false(kvs_cluster_dir_find(d, 4, &sp));
  assert_false(kvs_cluster_dir_find(d, 10, &sp));
  assert_false(kvs_cluster_dir_find(d, 21, &sp));
  assert_false(kvs_cluster_dir_find(NULL, 0, &sp));
  assert_int_equal(kvs_cluster_dir_clustered(d, 0), 200);
  assert_int_equal(kvs_cluster_dir_clustered(d, 1), 40);
  kvs_cluster_stats cs;
  kvs_session_cluster_stats(f.s, LAYER, 0, &cs);
  assert_int_equal(cs.n_clusters, 6);
  assert_int_equal(cs.rows_clustered, 240);
  assert_int_equal(cs.rows_lagging, 700 - 240);
  /* The directory is charged: in the session's bytes and the store's. */
  assert_true(cs.directory_bytes > 0);
  assert_int_equal(atomic_load(&f.s->bytes) - before, cs.directory_bytes);
  /* A store with other ids of the kv head between: gaps are fine, order is kept. */
  uint32_t c4[1] = {10};
  ok(put(&f, 0, 100, 340, c4, 1, NULL, &err), &err);
  assert_true(kvs_cluster_dir_find(kvs_session_clusters(f.s, LAYER, 0), 100, &sp));
  assert_int_equal(sp.row, 40);
  /* Freed with the session: the store's bytes go back to nothing. */
  uint8_t id[KVS_SESSION_ID_BYTES];
  memcpy(id, f.s->id, sizeof id);
  kvs_session_release(f.s);
  assert_int_equal(kvs_store_close(f.st, id, sizeof id, NULL, &err), RA_OK);
  assert_int_equal(kvs_store_bytes_used(f.st), 0);
  kvs_store_destroy(f.st);
  for (int kv = 0; kv < 2; kv++) {
    free(f.h[kv].k);
    free(f.h[kv].v);
  }
}

/* The rows of (LAYER, kv) as the store holds them equal the test's copy. */
static void check_rows_match(const fixture *f, uint32_t kv) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(f->s, LAYER, kv, &count);
  const head_data *h = &f->h[kv];
  const int dim = (int)f->g.head_dim;
  float *row = malloc(dim * sizeof *row);
  for (size_t k = 0; k < count; k++)
    for (uint64_t r = 0; r < sh[k].n; r++) {
      size_t at = (size_t)(sh[k].spec.token_begin + r - h->base);
      ra_dtype_rows_to_fp32(f->g.dtype, (const char *)sh[k].keys + r * kvs_row_bytes(&f->g), row, 1, dim);
      assert_memory_equal(row, h->k + at * dim, dim * sizeof *row);
      ra_dtype_rows_to_fp32(f->g.dtype, (const char *)sh[k].values + r * kvs_row_bytes(&f->g), row, 1, dim);
      assert_memory_equal(row, h->v + at * dim, dim * sizeof *row);
    }
  free(row);
}

/* A perm reorders exactly its rows, keys and values (an int8 row with its scale), whatever its
 * cycles. */
static void check_perm_in_place(ra_dtype t) {
  fixture f;
  fixture_make(&f, t, 24, 1u << 26);
  ra_error err;
  uint32_t perm[400], counts[400];
  /* a random one over the first 130 rows of kv head 1 */
  ref_shuffle(&f.rng, perm, 130);
  size_t n = random_counts(&f.rng, 130, counts);
  ok(put(&f, 1, 0, 50, counts, n, perm, &err), &err);
  check_rows_match(&f, 1);
  /* one long cycle, then the identity */
  for (uint32_t j = 0; j < 64; j++) perm[j] = (j + 1) % 64;
  counts[0] = 64;
  ok(put(&f, 1, (uint32_t)n, 180, counts, 1, perm, &err), &err);
  for (uint32_t j = 0; j < 16; j++) perm[j] = j;
  counts[0] = 16;
  ok(put(&f, 1, (uint32_t)n + 1, 244, counts, 1, perm, &err), &err);
  check_rows_match(&f, 1);
  /* a shard boundary does not matter to a perm inside the second shard */
  ref_shuffle(&f.rng, perm, 400);
  counts[0] = 400;
  ok(put(&f, 0, 0, 300, counts, 1, perm, &err), &err);
  check_rows_match(&f, 0);
  fixture_free(&f);
}

static void test_perm_in_place(void **state) {
  (void)state;
  check_perm_in_place(RA_DTYPE_BF16);
  check_perm_in_place(RA_DTYPE_I8);
}

/* Refused installs change nothing: the directory, the rows, the bytes. */
static void test_put_refused_unchanged(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F16, 16, 1u << 26);
  ra_error err;
  uint32_t counts[2] = {8, 8}, perm[16];
  ok(put(&f, 1, 0, 50, counts, 2, NULL, &err), &err);
  kvs_cluster_stats before, after;
  kvs_session_cluster_stats(f.s, LAYER, 1, &before);
  /* a bad perm: the rows stay as they were */
  for (uint32_t j = 0; j < 16; j++) perm[j] = 15 - j;
  perm[3] = perm[4];
  expect(put(&f, 1, 2, 66, counts, 2, perm, &err), RA_EINVAL, &err, "not a permutation");
  check_rows_match(&f, 1);
  /* the budget: refused before anything is touched */
  const uint64_t left = kvs_store_budget(f.st) - kvs_store_bytes_used(f.st);
  ok(kvs_store_charge(f.st, left, &err), &err);
  uint32_t many[200];
  for (int i = 0; i < 200; i++) many[i] = 1;
  for (uint32_t j = 0; j < 16; j++) perm[j] = 15 - j;
  expect(put(&f, 0, 0, 0, many, 200, NULL, &err), RA_ENOMEM, &err, "budget");
  kvs_session_cluster_stats(f.s, LAYER, 1, &after);
  assert_memory_equal(&before, &after, sizeof before);
  assert_null(kvs_session_clusters(f.s, LAYER, 0));
  kvs_store_uncharge(f.st, left);
  ok(put(&f, 0, 0, 0, many, 200, NULL, &err), &err);
  /* the clustered prefix of kv head 1 grows on from where it ended */
  ok(put(&f, 1, 2, 66, counts, 2, perm, &err), &err);
  check_rows_match(&f, 1);
  fixture_free(&f);
}

/* Rows outside this store's shards, or crossing a shard's end. */
static void test_put_rows_outside(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F32, 16, 1u << 26);
  ra_error err;
  uint32_t counts[1] = {20};
  expect(put(&f, 1, 0, 10, counts, 1, NULL, &err), RA_EINVAL, &err,
         "rows [10, 30) of layer 1 kv head 1 are in no shard of this store");
  uint32_t c300[2] = {290, 20};
  expect(put(&f, 0, 0, 0, c300, 2, NULL, &err), RA_EINVAL, &err,
         "rows [0, 310) of layer 1 kv head 0 run past the end 300 of their shard");
  assert_null(f.s->clusters);
  fixture_free(&f);
}

/* A perm of a shard that has a search index is refused: the index's ids are rows. */
static void test_perm_refused_with_index(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F32, 16, 1u << 28);
  ra_error err;
  kvs_build_args b = {.layer = LAYER, .q_head = 4, .per_kv_head = 1};
  ra_index_params_default(RA_MODE_IVF, &b.params);
  b.params.n_lists = 4;
  b.params.n_threads = 1;
  kvs_build_result res;
  ok(kvs_session_build_index(f.s, &b, &res, &err), &err);
  uint32_t counts[1] = {16}, perm[16];
  for (uint32_t j = 0; j < 16; j++) perm[j] = 15 - j;
  expect(put(&f, 1, 0, 50, counts, 1, perm, &err), RA_ESTATE, &err, "search index");
  ok(put(&f, 1, 0, 50, counts, 1, NULL, &err), &err); /* rows as they are: fine */
  fixture_free(&f);
}

/* Reference partial over rows `pos` (positions) of kv head h: o in double, m and l. */
static void ref_partial(const fixture *f, const head_data *h, const float *q, const uint64_t *pos,
                        size_t n, double *o, double *m, double *l) {
  const int dim = (int)f->g.head_dim;
  uint32_t *ids = calloc(n ? n : 1, sizeof *ids);
  for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)(pos[i] - h->base);
  ref_attention(q, h->k, h->v, ids, n, dim, o);
  double mx = -INFINITY, sum = 0.0;
  for (size_t i = 0; i < n; i++) {
    double z = 0.0;
    for (int d = 0; d < dim; d++) z += (double)q[d] * h->k[(size_t)ids[i] * dim + d];
    z /= sqrt((double)dim);
    if (z > mx) {
      sum = sum * exp(mx - z) + 1.0;
      mx = z;
    } else {
      sum += exp(z - mx);
    }
  }
  *m = mx;
  *l = sum;
  free(ids);
}

static int pos_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The rows of kv head kv's clusters sel, in selection order. */
static size_t cluster_rows(const fixture *f, uint32_t kv, const uint32_t *sel, size_t n_sel, uint64_t *out) {
  const head_data *h = &f->h[kv];
  size_t n = 0;
  for (size_t i = 0; i < n_sel; i++)
    for (uint32_t c = 0; c < h->n_cl; c++)
      if (h->id[c] == sel[i])
        for (uint64_t r = 0; r < h->cnt[c]; r++) out[n++] = h->pos[c] + r;
  return n;
}

/* The rows a wave attend of kv head kv with selection sel must read, sorted: the selected
 * clusters' and every row past each shard's clustered prefix. */
static size_t expected_rows(const fixture *f, uint32_t kv, const uint32_t *sel, size_t n_sel,
                            uint64_t *out) {
  const head_data *h = &f->h[kv];
  size_t n = cluster_rows(f, kv, sel, n_sel, out);
  size_t count;
  const kvs_shard *sh = kvs_session_head(f->s, LAYER, kv, &count);
  for (size_t k = 0; k < count; k++) {
    uint64_t b = sh[k].spec.token_begin, e = b + sh[k].n, done = b;
    for (uint32_t c = 0; c < h->n_cl; c++)
      if (h->pos[c] >= b && h->pos[c] < e && h->pos[c] + h->cnt[c] > done) done = h->pos[c] + h->cnt[c];
    for (uint64_t r = done; r < e; r++) out[n++] = r;
  }
  qsort(out, n, sizeof *out, pos_cmp);
  return n;
}

/* Clusters over most of both kv heads, some rows permuted, lag left on every shard; a wave
 * attend of 5 q heads (2 of kv head 0, 3 of kv head 1) against the reference. */
static void check_wave(ra_dtype t, int dim, double tol) {
  fixture f;
  fixture_make(&f, t, dim, 1u << 26);
  ra_error err;
  uint32_t counts[400], perm[400];
  size_t n = random_counts(&f.rng, 250, counts); /* shard 0: rows [0, 250), lag [250, 300) */
  ok(put(&f, 0, 0, 0, counts, n, NULL, &err), &err);
  uint32_t next = (uint32_t)n;
  ref_shuffle(&f.rng, perm, 300);
  n = random_counts(&f.rng, 300, counts); /* shard 1: [300, 600) permuted, lag [600, 700) */
  ok(put(&f, 0, next, 300, counts, n, perm, &err), &err);
  ref_shuffle(&f.rng, perm, 380);
  n = random_counts(&f.rng, 380, counts); /* kv head 1: ids from 1000, lag [430, 550) */
  ok(put(&f, 1, 1000, 50, counts, n, perm, &err), &err);

  /* Selections: every third cluster of kv head 0; a few of kv head 1, out of order. */
  uint32_t sel[MAX_CLUSTERS], sel_heads[2] = {1, 0}, sel_counts[2];
  size_t ns = 0;
  for (uint32_t c = 0; c < f.h[1].n_cl; c += 5) sel[ns++] = f.h[1].id[f.h[1].n_cl - 1 - c];
  sel_counts[0] = (uint32_t)ns;
  for (uint32_t c = 0; c < f.h[0].n_cl; c += 3) sel[ns++] = f.h[0].id[c];
  sel_counts[1] = (uint32_t)(ns - sel_counts[0]);

  uint32_t heads[5] = {6, 1, 4, 2, 7};
  float *q = malloc(5 * dim * sizeof *q);
  ref_fill_normal(&f.rng, q, 5 * (size_t)dim, 1.0f);
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = 5, .q = q,
                       .mode = RA_MODE_WAVE, .want_ids = 1, .n_threads = 3,
                       .wave = {.kv_heads = sel_heads, .counts = sel_counts, .n_heads = 2,
                                .ids = sel, .n_ids = ns}};
  kvs_attend_result res;
  ok(kvs_attend(f.s, &a, &res, &err), &err);
  uint64_t *want_pos = malloc(1200 * sizeof *want_pos), *got = malloc(1200 * sizeof *got);
  double *o = malloc(dim * sizeof *o);
  for (int i = 0; i < 5; i++) {
    const uint32_t kv = heads[i] / 4;
    const uint32_t *s = kv == 1 ? sel : sel + sel_counts[0];
    size_t nw = expected_rows(&f, kv, s, sel_counts[kv == 1 ? 0 : 1], want_pos);
    const ra_head_partial *h = &res.heads[i];
    assert_int_equal(h->q_head, heads[i]);
    assert_int_equal(h->n_scanned, nw);
    assert_int_equal(h->n_keys, f.h[kv].n);
    assert_int_equal(h->n_ids, nw);
    memcpy(got, h->ids, nw * sizeof *got);
    qsort(got, nw, sizeof *got, pos_cmp);
    assert_memory_equal(got, want_pos, nw * sizeof *got);
    double m, l;
    ref_partial(&f, &f.h[kv], q + i * dim, want_pos, nw, o, &m, &l);
    double e = ref_max_abs_diff(h->part.o, o, dim);
    if (e > tol) fail_msg("%s dim %d head %u: max abs error %g > %g", ra_dtype_name(t), dim, heads[i], e, tol);
    assert_true(fabs(h->part.m - m) <= 1e-5 * (1.0 + fabs(m)));
    assert_true(fabs(h->part.l - l) <= 1e-5 * l);
  }
  /* One thread: the same partials to rounding. */
  kvs_attend_result r1;
  a.n_threads = 1;
  ok(kvs_attend(f.s, &a, &r1, &err), &err);
  for (int i = 0; i < 5; i++) {
    for (int d = 0; d < dim; d++) assert_true(fabsf(r1.heads[i].part.o[d] - res.heads[i].part.o[d]) <= 1e-6f);
    assert_true(fabsf(r1.heads[i].part.m - res.heads[i].part.m) <= 1e-6f * (1.0f + fabsf(res.heads[i].part.m)));
  }
  kvs_attend_result_free(&r1);
  kvs_attend_result_free(&res);
  free(want_pos);
  free(got);
  free(o);
  free(q);
  fixture_free(&f);
}

static void test_wave_f32(void **state) {
  (void)state;
  check_wave(RA_DTYPE_F32, 64, 1e-5);
  check_wave(RA_DTYPE_F32, 40, 1e-5); /* a head_dim off the vector width */
}
static void test_wave_f16(void **state) {
  (void)state;
  check_wave(RA_DTYPE_F16, 128, 1e-5);
}
static void test_wave_bf16(void **state) {
  (void)state;
  check_wave(RA_DTYPE_BF16, 64, 1e-5);
}
/* int8 rows against the reference over their dequantized values: the kernels' scale applied once
 * a row rounds differently from scaling every element, hence 2e-5. */
static void test_wave_int8(void **state) {
  (void)state;
  check_wave(RA_DTYPE_I8, 128, 2e-5);
  check_wave(RA_DTYPE_I8, 40, 2e-5);
}

/* Every cluster selected (or none installed at all) reads every row: mode full's partial. */
static void test_wave_all_equals_full(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F16, 64, 1u << 26);
  ra_error err;
  uint32_t counts[400], perm[400];
  ref_shuffle(&f.rng, perm, 300);
  size_t n = random_counts(&f.rng, 300, counts);
  ok(put(&f, 0, 0, 0, counts, n, NULL, &err), &err);
  ok(put(&f, 0, (uint32_t)n, 300, counts, n, perm, &err), &err);
  uint32_t all[MAX_CLUSTERS];
  for (uint32_t c = 0; c < f.h[0].n_cl; c++) all[c] = f.h[0].id[f.h[0].n_cl - 1 - c];
  uint32_t heads[6] = {0, 1, 2, 3, 4, 5}, kv0 = 0, cnt = f.h[0].n_cl;
  float q[6 * 64];
  ref_fill_normal(&f.rng, q, 6 * 64, 1.0f);
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = 6, .q = q,
                       .mode = RA_MODE_FULL, .n_threads = 2};
  kvs_attend_result full, wave;
  ok(kvs_attend(f.s, &a, &full, &err), &err);
  a.mode = RA_MODE_WAVE;
  a.wave = (kvs_wave_select){.kv_heads = &kv0, .counts = &cnt, .n_heads = 1, .ids = all,
                             .n_ids = cnt};
  ok(kvs_attend(f.s, &a, &wave, &err), &err);
  for (int i = 0; i < 6; i++) {
    for (int d = 0; d < 64; d++) assert_true(fabsf(full.heads[i].part.o[d] - wave.heads[i].part.o[d]) <= 1e-5f);
    assert_true(fabsf(full.heads[i].part.m - wave.heads[i].part.m) <= 1e-5f);
    assert_true(fabsf(full.heads[i].part.l - wave.heads[i].part.l) <= 1e-5f * full.heads[i].part.l);
    assert_int_equal(wave.heads[i].n_scanned, full.heads[i].n_keys);
  }
  kvs_attend_result_free(&full);
  kvs_attend_result_free(&wave);
  fixture_free(&f);
}

/* Retro: each past step's queries get the exact partial over the clusters named for it, no lag
 * rows, in the same pass; the request's own partials are those of the attend without retro. */
static void check_wave_retro(ra_dtype t, int dim, double tol) {
  fixture f;
  fixture_make(&f, t, dim, 1u << 26);
  ra_error err;
  uint32_t counts[400], perm[400];
  size_t n = random_counts(&f.rng, 250, counts);
  ok(put(&f, 0, 0, 0, counts, n, NULL, &err), &err);
  ref_shuffle(&f.rng, perm, 300);
  size_t n2 = random_counts(&f.rng, 300, counts);
  ok(put(&f, 0, (uint32_t)n, 300, counts, n2, perm, &err), &err);
  ref_shuffle(&f.rng, perm, 380);
  n = random_counts(&f.rng, 380, counts);
  ok(put(&f, 1, 1000, 50, counts, n, perm, &err), &err);
  /* this step selects every 4th cluster of each kv head (kv head 1 named first) */
  uint32_t sel[MAX_CLUSTERS], sel_heads[2] = {1, 0}, sel_counts[2];
  size_t ns = 0;
  for (uint32_t c = 0; c < f.h[1].n_cl; c += 4) sel[ns++] = f.h[1].id[c];
  sel_counts[0] = (uint32_t)ns;
  for (uint32_t c = 1; c < f.h[0].n_cl; c += 4) sel[ns++] = f.h[0].id[c];
  sel_counts[1] = (uint32_t)(ns - sel_counts[0]);
  /* past step 1: some of those of both kv heads; past step 2: none of kv head 1, others of 0;
   * past step 3: nothing */
  uint32_t rids[MAX_CLUSTERS], rcounts[3][2] = {{0}};
  size_t nr = 0;
  for (uint32_t i = 0; i < sel_counts[0]; i += 2, rcounts[0][0]++) rids[nr++] = sel[i];
  for (uint32_t i = 0; i < sel_counts[1]; i += 3, rcounts[0][1]++) rids[nr++] = sel[sel_counts[0] + i];
  for (uint32_t i = 1; i < sel_counts[1]; i += 2, rcounts[1][1]++) rids[nr++] = sel[sel_counts[0] + i];
  uint32_t heads[5] = {6, 1, 4, 2, 7};
  float *q = malloc(5 * dim * sizeof *q), *rq = malloc(3 * 5 * dim * sizeof *rq);
  ref_fill_normal(&f.rng, q, 5 * (size_t)dim, 1.0f);
  ref_fill_normal(&f.rng, rq, 3 * 5 * (size_t)dim, 1.0f);
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = 5, .q = q,
                       .mode = RA_MODE_WAVE, .n_threads = 3,
                       .wave = {.kv_heads = sel_heads, .counts = sel_counts, .n_heads = 2, .ids = sel, .n_ids = ns}};
  kvs_attend_result plain, res;
  ok(kvs_attend(f.s, &a, &plain, &err), &err);
  a.retro_step = 9;
  a.retro_window = 4;
  a.n_retro = 3;
  a.retro_q = rq;
  a.wave.retro_counts = &rcounts[0][0];
  a.wave.n_retro_counts = 6;
  a.wave.retro_ids = rids;
  a.wave.n_retro_ids = nr;
  ok(kvs_attend(f.s, &a, &res, &err), &err);
  for (int i = 0; i < 5; i++) {
    assert_memory_equal(res.heads[i].part.o, plain.heads[i].part.o, (size_t)dim * sizeof(float));
    assert_int_equal(res.heads[i].n_scanned, plain.heads[i].n_scanned);
  }
  assert_non_null(res.retro);
  uint64_t *pos = malloc(1200 * sizeof *pos);
  double *o = malloc(dim * sizeof *o);
  uint64_t total = 0;
  for (int j = 0; j < 3; j++) {
    size_t off = 0;
    for (int k = 0; k < j; k++) off += rcounts[k][0] + rcounts[k][1];
    for (int i = 0; i < 5; i++) {
      const uint32_t kv = heads[i] / 4;
      const uint32_t *ids = rids + off + (kv == 1 ? 0 : rcounts[j][0]);
      size_t np = cluster_rows(&f, kv, ids, rcounts[j][kv == 1 ? 0 : 1], pos);
      const ra_head_partial *h = &res.retro[j * 5 + i];
      assert_int_equal(h->q_head, heads[i]);
      assert_int_equal(h->n_scanned, np);
      total += np;
      if (np == 0) {
        assert_true(isinf(h->part.m) && h->part.m < 0);
        assert_true(h->part.l == 0.0f);
        continue;
      }
      double m, l;
      ref_partial(&f, &f.h[kv], rq + ((size_t)j * 5 + i) * dim, pos, np, o, &m, &l);
      double e = ref_max_abs_diff(h->part.o, o, dim);
      if (e > tol) fail_msg("%s past step %d head %u: max abs error %g > %g", ra_dtype_name(t), j + 1, heads[i], e, tol);
      assert_true(fabs(h->part.m - m) <= 1e-5 * (1.0 + fabs(m)));
      assert_true(fabs(h->part.l - l) <= 1e-5 * l);
    }
  }
  assert_true(total > 0);
  kvs_attend_result_free(&res);

  /* malformed retro lists: refused, the session unchanged */
  a.wave.n_retro_counts = 4;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "retro_cluster_counts has 4 entries, want 3 past steps x 2");
  a.wave.n_retro_counts = 6;
  a.wave.n_retro_ids = nr - 1;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "but");
  a.wave.n_retro_ids = nr;
  const uint32_t keep = rids[nr - 1];
  rids[nr - 1] = 999; /* of no kv head here */
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "retro clusters of past step 2: cluster 999");
  rids[nr - 1] = keep;
  a.n_retro = 5; /* over the window */
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "window 4 with 5 past queries");
  a.n_retro = 0;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "without past queries");
  a.n_retro = 3;
  a.mode = RA_MODE_FULL;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "retro");
  a.mode = RA_MODE_WAVE;
  ok(kvs_attend(f.s, &a, &res, &err), &err);
  kvs_attend_result_free(&res);
  /* a cluster named twice for one past step is refused; two steps may name one cluster */
  const uint32_t second = rids[1];
  rids[1] = rids[0];
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "retro clusters of past step 1: cluster");
  rids[1] = second;

  /* past step 3 names a cluster this step does not select: its rows are loaded for step 3 alone,
   * and the request's own partials stay those of the attend without retro */
  const uint32_t outside = f.h[0].id[2];
  rids[nr] = outside;
  rcounts[2][1] = 1;
  a.wave.n_retro_ids = nr + 1;
  ok(kvs_attend(f.s, &a, &res, &err), &err);
  for (int i = 0; i < 5; i++) {
    for (int d = 0; d < dim; d++) o[d] = plain.heads[i].part.o[d];
    assert_true(ref_max_abs_diff(res.heads[i].part.o, o, dim) <= tol);
    assert_int_equal(res.heads[i].n_scanned, plain.heads[i].n_scanned);
    const ra_head_partial *h = &res.retro[2 * 5 + i];
    size_t np = heads[i] / 4 == 0 ? cluster_rows(&f, 0, &outside, 1, pos) : 0;
    assert_int_equal(h->n_scanned, np);
    if (np == 0) continue;
    double m, l;
    ref_partial(&f, &f.h[0], rq + ((size_t)2 * 5 + i) * dim, pos, np, o, &m, &l);
    assert_true(ref_max_abs_diff(h->part.o, o, dim) <= tol);
    assert_true(fabs(h->part.l - l) <= 1e-5 * l);
  }
  kvs_attend_result_free(&res);
  kvs_attend_result_free(&plain);
  free(pos);
  free(o);
  free(q);
  free(rq);
  fixture_free(&f);
}

static void test_wave_retro(void **state) {
  (void)state;
  check_wave_retro(RA_DTYPE_F32, 64, 1e-5);
  check_wave_retro(RA_DTYPE_F16, 40, 1e-5);
}

static void test_wave_errors(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f, RA_DTYPE_F32, 16, 1u << 26);
  ra_error err;
  uint32_t counts[2] = {10, 10};
  ok(put(&f, 0, 7, 0, counts, 2, NULL, &err), &err);
  uint32_t heads[2] = {0, 4};
  float q[2 * 16] = {0};
  uint32_t kvs[2] = {0, 1}, cnt[2] = {1, 0}, ids[2] = {7, 8};
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = 2, .q = q,
                       .mode = RA_MODE_WAVE,
                       .wave = {.kv_heads = kvs, .counts = cnt, .n_heads = 2, .ids = ids, .n_ids = 1}};
  kvs_attend_result res;
  ok(kvs_attend(f.s, &a, &res, &err), &err);
  assert_int_equal(res.heads[0].n_scanned, 10 + 280 + 400); /* cluster 7 + both shards' lag */
  assert_int_equal(res.heads[1].n_scanned, 500); /* nothing clustered: all lag */
  kvs_attend_result_free(&res);

  ids[0] = 9;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "cluster 9 of layer 1 kv head 0 is not held");
  ids[0] = 7;
  ids[1] = 7;
  cnt[0] = 2;
  a.wave.n_ids = 2;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "cluster 7 of layer 1 kv head 0 selected twice");
  cnt[0] = 1;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "sum to 1, but 2 cluster ids");
  cnt[0] = 1;
  a.wave.n_ids = 1;
  kvs[1] = 0;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "kv head 0 selected twice");
  kvs[1] = 1;
  a.n_heads = 1; /* kv head 1 named, none of its q heads asked */
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "no asked q head");
  a.n_heads = 2;
  a.mode = RA_MODE_FULL;
  expect(kvs_attend(f.s, &a, &res, &err), RA_EINVAL, &err, "mode wave only");
  a.mode = RA_MODE_WAVE;
  ok(kvs_attend(f.s, &a, &res, &err), &err); /* the session is still fine */
  kvs_attend_result_free(&res);
  fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_directory),
      cmocka_unit_test(test_perm_in_place),
      cmocka_unit_test(test_put_refused_unchanged),
      cmocka_unit_test(test_put_rows_outside),
      cmocka_unit_test(test_perm_refused_with_index),
      cmocka_unit_test(test_wave_f32),
      cmocka_unit_test(test_wave_f16),
      cmocka_unit_test(test_wave_bf16),
      cmocka_unit_test(test_wave_int8),
      cmocka_unit_test(test_wave_all_equals_full),
      cmocka_unit_test(test_wave_retro),
      cmocka_unit_test(test_wave_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
