/* ra_index: exactness, graph invariants, insertion, determinism, errors, on small synthetic keys
 * whose queries come from a different distribution than the keys (as attention's do). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "index.h"
#include "index_internal.h"
#include "kmeans.h"
#include "knn.h"
#include "vec.h"

#define DIM 32
#define NK 2000
#define NQ 1000

typedef struct {
  float *keys;  /* [NK + extra, DIM] */
  float *q;     /* [NQ, DIM] build queries */
  float *qtest; /* [NQ, DIM] held-out queries */
  uint32_t n;
} data;

static uint64_t rng_state;
static float gauss(void) {
  double u1 = ((double)(ra_index_rng_next(&rng_state) >> 11) + 0.5) / 9007199254740992.0;
  double u2 = ((double)(ra_index_rng_next(&rng_state) >> 11) + 0.5) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* keys = c + B z + noise, queries = b + A z' + noise: shared latent z (dim 8), different maps and
 * offsets, so key-key and query-key neighborhoods differ. */
static void make_data(data *d, uint32_t n, uint64_t seed) {
  enum { R = 8 };
  rng_state = seed;
  float A[DIM][R], B[DIM][R], b[DIM], c[DIM];
  for (int i = 0; i < DIM; i++) {
    for (int r = 0; r < R; r++) {
      A[i][r] = gauss();
      B[i][r] = gauss();
    }
    b[i] = 0.5f * gauss();
    c[i] = 2.0f * gauss();
  }
  d->n = n;
  d->keys = malloc((size_t)n * DIM * sizeof(float));
  d->q = malloc((size_t)NQ * DIM * sizeof(float));
  d->qtest = malloc((size_t)NQ * DIM * sizeof(float));
  assert_non_null(d->keys);
  assert_non_null(d->q);
  assert_non_null(d->qtest);
  for (uint32_t t = 0; t < n + 2 * NQ; t++) {
    float z[R], *out;
    for (int r = 0; r < R; r++) z[r] = gauss();
    int is_key = t < n;
    out = is_key ? d->keys + (size_t)t * DIM
                 : (t < n + NQ ? d->q + (size_t)(t - n) * DIM : d->qtest + (size_t)(t - n - NQ) * DIM);
    for (int i = 0; i < DIM; i++) {
      float s = is_key ? c[i] : b[i];
      for (int r = 0; r < R; r++) s += (is_key ? B[i][r] : A[i][r]) * z[r];
      out[i] = s + 0.3f * gauss();
    }
  }
}

static void free_data(data *d) {
  free(d->keys);
  free(d->q);
  free(d->qtest);
}

static ra_keys keys_of(const data *d, uint32_t n) {
  ra_keys k = {.rows = d->keys, .dtype = RA_DTYPE_F32, .dim = DIM, .n = n};
  return k;
}

static ra_index *build(ra_mode kind, const data *d, uint32_t n, int threads) {
  ra_index_params p;
  ra_index_params_default(kind, &p);
  p.n_threads = threads;
  ra_keys k = keys_of(d, n);
  ra_queries qs = {.q = d->q, .n = NQ};
  ra_index *ix = NULL;
  ra_error err;
  ra_error_clear(&err);
  int rc = ra_index_build(&p, &k, kind == RA_MODE_ROAR ? &qs : NULL, &ix, &err);
  if (rc) fail_msg("build %s: %s", ra_mode_name(kind), err.msg);
  return ix;
}

/* Independent of ra_index_check: degree <= M, no self loops/duplicates, BFS over all edges from
 * the entry reaches every node. */
static void assert_graph_invariants(const ra_index *ix) {
  const ra_graph *g = ix->graph;
  assert_non_null(g);
  assert_int_equal(g->n, ix->n);
  uint8_t *seen = calloc(g->n, 1);
  uint32_t *queue = malloc(g->n * sizeof *queue);
  assert_non_null(seen);
  assert_non_null(queue);
  for (uint32_t u = 0; u < g->n; u++) {
    const uint32_t *row = g->adj + (size_t)u * g->M;
    assert_true(g->deg[u] <= g->M);
    for (uint32_t j = 0; j < g->deg[u]; j++) {
      assert_true(row[j] < g->n);
      assert_true(row[j] != u);
      for (uint32_t i = 0; i < j; i++) assert_true(row[i] != row[j]);
    }
  }
  uint32_t head = 0, tail = 0;
  seen[g->entry] = 1;
  queue[tail++] = g->entry;
  while (head < tail) {
    uint32_t u = queue[head++];
    for (uint32_t j = 0; j < g->deg[u]; j++) {
      uint32_t v = g->adj[(size_t)u * g->M + j];
      if (!seen[v]) {
        seen[v] = 1;
        queue[tail++] = v;
      }
    }
  }
  assert_int_equal(tail, g->n);
  free(seen);
  free(queue);
  ra_error err;
  if (ra_index_check(ix, &err)) fail_msg("check: %s", err.msg);
}

/* Exact top-k of q over the first n keys, by brute force (the same kernels as the index). */
static void exact_topk(const data *d, uint32_t n, const float *q, uint32_t k, uint32_t *ids,
                       float *sc) {
  ra_error err;
  assert_int_equal(ra_knn_ip(d->keys, n, DIM, NULL, q, 1, k, 0, 1, ids, sc, &err), RA_OK);
}

static double recall_of(const uint32_t *got, uint32_t n_got, const uint32_t *want, uint32_t k) {
  uint32_t hit = 0;
  for (uint32_t i = 0; i < k; i++)
    for (uint32_t j = 0; j < n_got; j++)
      if (got[j] == want[i]) {
        hit++;
        break;
      }
  return (double)hit / k;
}

static void test_knn_matches_naive(void **state) {
  (void)state;
  data d;
  make_data(&d, 700, 11);
  enum { K = 20 };
  uint32_t ids[K];
  float sc[K];
  for (int qi = 0; qi < 5; qi++) {
    const float *q = d.qtest + (size_t)qi * DIM;
    exact_topk(&d, 700, q, K, ids, sc);
    float prev = INFINITY;
    for (int i = 0; i < K; i++) {
      double s = 0;
      for (int j = 0; j < DIM; j++) s += (double)q[j] * d.keys[(size_t)ids[i] * DIM + j];
      assert_true(fabs(s - sc[i]) < 1e-3 * (1 + fabs(s)));
      assert_true(sc[i] <= prev);
      prev = sc[i];
      /* No key outside the list beats the k-th. */
    }
    for (uint32_t v = 0; v < 700; v++) {
      double s = 0;
      for (int j = 0; j < DIM; j++) s += (double)q[j] * d.keys[(size_t)v * DIM + j];
      int in = 0;
      for (int i = 0; i < K; i++) in |= ids[i] == v;
      if (!in) assert_true(s <= sc[K - 1] + 1e-3 * (1 + fabs(s)));
    }
  }
  free_data(&d);
}

/* Reference order for the candidate sort: descending similarity, ties by ascending id. */
static int cand_ref_cmp(const void *a, const void *b) {
  const ra_cand *x = a, *y = b;
  if (x->sim != y->sim) return x->sim > y->sim ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The graph's own sort against qsort, with many ties (few distinct similarities). */
static void test_sort_cands(void **state) {
  (void)state;
  const uint32_t sizes[] = {0, 1, 2, 16, 17, 100, 1000, 5000};
  uint32_t x = 12345;
  for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
    uint32_t n = sizes[t];
    ra_cand *a = malloc((n ? n : 1) * sizeof *a), *b = malloc((n ? n : 1) * sizeof *b);
    for (uint32_t i = 0; i < n; i++) {
      x = x * 1664525u + 1013904223u;
      a[i] = (ra_cand){.sim = (float)((x >> 10) % 7) - 3.0f, .id = (x >> 3) % 100000 * 8 + i % 8};
    }
    /* ids must be unique, as candidates are */
    for (uint32_t i = 0; i < n; i++) a[i].id = a[i].id * 8192 + i;
    memcpy(b, a, n * sizeof *a);
    ra_graph_sort_cands(a, n);
    qsort(b, n, sizeof *b, cand_ref_cmp);
    for (uint32_t i = 0; i < n; i++) {
      assert_int_equal(a[i].id, b[i].id);
      assert_true(a[i].sim == b[i].sim);
    }
    free(a);
    free(b);
  }
  /* Continuous similarities of both signs, signed zeros and exact ties, at the sizes the radix
   * path takes (up to 1024) and past them. */
  const uint32_t sizes2[] = {17, 300, 1024, 1025};
  for (size_t t = 0; t < sizeof sizes2 / sizeof *sizes2; t++) {
    uint32_t n = sizes2[t];
    ra_cand *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (uint32_t i = 0; i < n; i++) {
      x = x * 1664525u + 1013904223u;
      float v = ((float)(x >> 8) / (float)(1 << 24) - 0.5f) * 1e3f;
      if (i % 50 == 7) v = (i % 100 == 7) ? -0.0f : 0.0f;
      if (i % 31 == 3 && i > 0) v = a[i - 1].sim;
      a[i] = (ra_cand){.sim = v, .id = (x >> 4) % 1000 * 2048 + i};
    }
    memcpy(b, a, n * sizeof *a);
    ra_graph_sort_cands(a, n);
    qsort(b, n, sizeof *b, cand_ref_cmp);
    for (uint32_t i = 0; i < n; i++) {
      assert_int_equal(a[i].id, b[i].id);
      assert_true(a[i].sim == b[i].sim);
    }
    free(a);
    free(b);
  }
}

/* knn splits queries over threads: the lists do not depend on how many. */
static void test_knn_thread_independent(void **state) {
  (void)state;
  data d;
  make_data(&d, 700, 12);
  enum { NQK = 300, K = 30 };
  uint32_t *a = malloc(NQK * K * sizeof *a), *b = malloc(NQK * K * sizeof *b);
  ra_error err;
  assert_int_equal(ra_knn_ip(d.keys, 700, DIM, NULL, d.keys, NQK, K, 1, 1, a, NULL, &err), RA_OK);
  assert_int_equal(ra_knn_ip(d.keys, 700, DIM, NULL, d.keys, NQK, K, 1, 3, b, NULL, &err), RA_OK);
  assert_memory_equal(a, b, NQK * K * sizeof *a);
  for (int i = 0; i < NQK * K; i++) assert_true(a[i] != (uint32_t)(i / K)); /* self excluded */
  free(a);
  free(b);
  free_data(&d);
}

static void test_flat_is_exact(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 1);
  ra_index *ix = build(RA_MODE_FLAT, &d, NK, 0);
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, 0, 50, NULL), RA_OK);
  ra_keys k = keys_of(&d, NK);
  uint32_t ids[50], want[50], n = 0;
  float sc[50], wsc[50];
  uint64_t scanned = 0;
  for (int qi = 0; qi < 20; qi++) {
    const float *q = d.qtest + (size_t)qi * DIM;
    assert_int_equal(ra_index_search(ix, &k, q, 50, NULL, &s, ids, sc, &n, &scanned), RA_OK);
    exact_topk(&d, NK, q, 50, want, wsc);
    assert_int_equal(n, 50);
    assert_int_equal(scanned, NK);
    for (int i = 0; i < 50; i++) {
      assert_true(i == 0 || sc[i] <= sc[i - 1]);
      assert_true(fabsf(sc[i] - wsc[i]) <= 1e-3f * (1 + fabsf(wsc[i])));
    }
    assert_true(recall_of(ids, n, want, 50) >= 0.98); /* sgemm vs dot rounding at ties only */
  }
  ra_index_scratch_free(&s);
  ra_index_free(ix);
  free_data(&d);
}

/* With L >= n a beam search visits every reachable node, so on a connected graph it must return
 * exactly flat's answer (same kernels, same tie order). */
static void check_exact_when_beam_covers(ra_mode kind) {
  data d;
  make_data(&d, NK, 2);
  ra_index *ix = build(kind, &d, NK, 2);
  ra_index *fl = build(RA_MODE_FLAT, &d, NK, 0);
  assert_graph_invariants(ix);
  ra_keys k = keys_of(&d, NK);
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, NK, 100, NULL), RA_OK);
  ra_search_params sp = {.ef = NK, .nprobe = 0};
  uint32_t ids[100], fids[100], n, fn;
  float sc[100], fsc[100];
  uint64_t scanned;
  for (int qi = 0; qi < 10; qi++) {
    const float *q = d.qtest + (size_t)qi * DIM;
    assert_int_equal(ra_index_search(ix, &k, q, 100, &sp, &s, ids, sc, &n, &scanned), RA_OK);
    assert_int_equal(ra_index_search(fl, &k, q, 100, NULL, &s, fids, fsc, &fn, NULL), RA_OK);
    assert_int_equal(n, 100);
    assert_int_equal(scanned, NK);
    assert_memory_equal(ids, fids, sizeof ids);
    assert_memory_equal(sc, fsc, sizeof sc);
  }
  ra_index_scratch_free(&s);
  ra_index_free(ix);
  ra_index_free(fl);
  free_data(&d);
}

static void test_roar_exact_when_beam_covers(void **state) {
  (void)state;
  check_exact_when_beam_covers(RA_MODE_ROAR);
}

static void test_kgraph_exact_when_beam_covers(void **state) {
  (void)state;
  check_exact_when_beam_covers(RA_MODE_KGRAPH);
}

static void test_ivf_all_probes_exact(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 3);
  ra_index *ix = build(RA_MODE_IVF, &d, NK, 2);
  ra_index *fl = build(RA_MODE_FLAT, &d, NK, 0);
  ra_error err;
  if (ra_index_check(ix, &err)) fail_msg("%s", err.msg);
  ra_keys k = keys_of(&d, NK);
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, 0, 30, NULL), RA_OK);
  ra_search_params all = {.ef = 0, .nprobe = 1u << 30}, few = {.ef = 0, .nprobe = 2};
  uint32_t ids[30], fids[30], n, fn;
  float sc[30], fsc[30];
  uint64_t scanned, scanned_few;
  for (int qi = 0; qi < 10; qi++) {
    const float *q = d.qtest + (size_t)qi * DIM;
    assert_int_equal(ra_index_search(ix, &k, q, 30, &all, &s, ids, sc, &n, &scanned), RA_OK);
    assert_int_equal(ra_index_search(fl, &k, q, 30, NULL, &s, fids, fsc, &fn, NULL), RA_OK);
    assert_int_equal(scanned, NK);
    assert_memory_equal(ids, fids, sizeof ids);
    assert_int_equal(ra_index_search(ix, &k, q, 30, &few, &s, ids, sc, &n, &scanned_few), RA_OK);
    assert_true(scanned_few < NK / 4);
  }
  ra_index_scratch_free(&s);
  ra_index_free(ix);
  ra_index_free(fl);
  free_data(&d);
}

/* Mean recall@10 of held-out queries at beam ef, and mean fraction scanned. */
static double mean_recall(const ra_index *ix, const data *d, uint32_t n, uint32_t ef,
                          double *frac) {
  enum { K = 10, NT = 100 };
  ra_keys k = keys_of(d, n);
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, ef, K, NULL), RA_OK);
  ra_search_params sp = {.ef = ef, .nprobe = 8};
  double r = 0, f = 0;
  for (int qi = 0; qi < NT; qi++) {
    const float *q = d->qtest + (size_t)qi * DIM;
    uint32_t ids[K], want[K], got;
    float sc[K], wsc[K];
    uint64_t scanned;
    assert_int_equal(ra_index_search(ix, &k, q, K, &sp, &s, ids, sc, &got, &scanned), RA_OK);
    exact_topk(d, n, q, K, want, wsc);
    r += recall_of(ids, got, want, K);
    f += (double)scanned / n;
  }
  ra_index_scratch_free(&s);
  if (frac) *frac = f / NT;
  return r / NT;
}

static void test_roar_recall_on_shifted_queries(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 4);
  ra_index *ix = build(RA_MODE_ROAR, &d, NK, 2);
  double frac;
  double r = mean_recall(ix, &d, NK, 40, &frac);
  print_message("roar recall@10 %.3f scanning %.3f of keys\n", r, frac);
  assert_true(r >= 0.9);
  assert_true(frac < 0.25);
  ra_index_free(ix);
  free_data(&d);
}

static void test_insertion_keeps_invariants_and_recall(void **state) {
  (void)state;
  data d;
  const uint32_t n0 = NK * 8 / 10;
  make_data(&d, NK, 5);
  ra_index *ix = build(RA_MODE_ROAR, &d, n0, 2);
  ra_index *kg = build(RA_MODE_KGRAPH, &d, n0, 2);
  ra_index *iv = build(RA_MODE_IVF, &d, n0, 2);
  ra_index *full = build(RA_MODE_ROAR, &d, NK, 2);
  ra_keys k = keys_of(&d, NK);
  ra_error err;
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, 64, 1, NULL), RA_OK);
  for (uint32_t id = n0; id < NK; id++) {
    assert_int_equal(ra_index_insert(ix, &k, id, &err), RA_OK);
    assert_int_equal(ra_index_insert(kg, &k, id, &err), RA_OK);
    assert_int_equal(ra_index_insert(iv, &k, id, &err), RA_OK);
    assert_int_equal(ra_index_count(ix), id + 1);
    if (id % 100 == 0) {
      /* Retrievable at once: the new key's own row as the query, full beam. */
      ra_search_params sp = {.ef = id + 1, .nprobe = 0};
      uint32_t got[1], n;
      float sc[1];
      uint64_t scanned;
      assert_int_equal(ra_index_search(ix, &k, d.keys + (size_t)id * DIM, 1, &sp, &s, got, sc, &n,
                                       &scanned),
                       RA_OK);
      assert_int_equal(scanned, id + 1);
    }
  }
  assert_graph_invariants(ix);
  assert_graph_invariants(kg);
  if (ra_index_check(iv, &err)) fail_msg("%s", err.msg);
  double fi, ff;
  double ri = mean_recall(ix, &d, NK, 40, &fi), rf = mean_recall(full, &d, NK, 40, &ff);
  print_message("after insertion recall %.3f (scan %.3f); rebuilt %.3f (scan %.3f)\n", ri, fi, rf,
                ff);
  /* The goal allows 0.02 after 10 % growth; this grows by 20 %. */
  assert_true(ri >= rf - 0.02);
  ra_index_scratch_free(&s);
  ra_index_free(ix);
  ra_index_free(kg);
  ra_index_free(iv);
  ra_index_free(full);
  free_data(&d);
}

static ra_index *build_roar_keep(const data *d, uint32_t n, uint32_t keep_queries) {
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.n_threads = 2;
  p.keep_queries = keep_queries;
  ra_keys k = keys_of(d, n);
  ra_queries qs = {.q = d->q, .n = NQ};
  ra_index *ix = NULL;
  ra_error err;
  if (ra_index_build(&p, &k, &qs, &ix, &err)) fail_msg("build roar: %s", err.msg);
  return ix;
}

static int in_row(const ra_graph *g, uint32_t u, uint32_t v) {
  for (uint32_t j = 0; j < g->deg[u]; j++)
    if (g->adj[(size_t)u * g->M + j] == v) return 1;
  return 0;
}

/* A key that kept queries rank first enters their lists (which stay sorted, the bar rising),
 * links to their old top keys and gets edges from their top keys; keys that no list takes leave
 * the lists alone. */
static void test_insert_updates_kept_queries(void **state) {
  (void)state;
  data d;
  const uint32_t n0 = NK * 9 / 10;
  make_data(&d, NK, 17);
  ra_index *ix = build_roar_keep(&d, n0, 256);
  const ra_roar_keep *k = ix->keep;
  assert_non_null(k);
  assert_int_equal(k->n, 256);
  assert_int_equal(k->T, 32);
  const uint32_t T = k->T, n = k->n;
  /* New key n0: kept query 0 itself, scaled far out, so that it tops query 0's list. */
  float *x = d.keys + (size_t)n0 * DIM, q0[DIM];
  for (int i = 0; i < DIM; i++) q0[i] = ra_fp16_to_fp32(k->q[i]);
  for (int i = 0; i < DIM; i++) x[i] = 8.0f * q0[i];
  uint32_t *top0 = malloc((size_t)n * T * sizeof *top0);
  float *thr0 = malloc((size_t)n * sizeof *thr0);
  assert_non_null(top0);
  assert_non_null(thr0);
  memcpy(top0, k->top, (size_t)n * T * sizeof *top0);
  memcpy(thr0, k->thr, (size_t)n * sizeof *thr0);
  ra_keys keys = keys_of(&d, NK);
  ra_error err;
  assert_int_equal(ra_index_insert(ix, &keys, n0, &err), RA_OK);
  const ra_graph *g = ix->graph;
  uint32_t entered = 0, linked_out = 0, linked_in = 0;
  uint8_t *was_top = calloc(n0, 1);
  assert_non_null(was_top);
  for (uint32_t i = 0; i < n; i++) {
    float qf[DIM];
    for (int j = 0; j < DIM; j++) qf[j] = ra_fp16_to_fp32(k->q[(size_t)i * DIM + j]);
    float s = 0;
    for (int j = 0; j < DIM; j++) s += qf[j] * x[j];
    const uint32_t *l = k->top + (size_t)i * T;
    int has = 0;
    for (uint32_t r = 0; r < T; r++) has |= l[r] == n0;
    if (s <= thr0[i] - 1e-3f * fabsf(thr0[i])) {
      assert_false(has);
      assert_memory_equal(l, top0 + (size_t)i * T, T * sizeof *l);
      continue;
    }
    if (s < thr0[i] + 1e-3f * fabsf(thr0[i])) continue; /* too close to call in fp32 */
    assert_true(has);
    assert_true(k->thr[i] >= thr0[i]);
    entered++;
    for (uint32_t r = 0; r < T; r++) was_top[top0[(size_t)i * T + r]] = 1;
    linked_in += in_row(g, top0[(size_t)i * T], n0);
    /* Sorted by the kept query's scores. */
    for (uint32_t r = 1; r < T; r++) {
      float a = 0, b = 0;
      for (int j = 0; j < DIM; j++) {
        a += qf[j] * d.keys[(size_t)l[r - 1] * DIM + j];
        b += qf[j] * d.keys[(size_t)l[r] * DIM + j];
      }
      assert_true(a >= b - 1e-3f * fabsf(b));
    }
  }
  assert_int_equal(k->top[0], n0); /* query 0's best key now */
  for (uint32_t j = 0; j < g->deg[n0]; j++) linked_out += g->adj[(size_t)n0 * g->M + j] < n0 &&
                                                          was_top[g->adj[(size_t)n0 * g->M + j]];
  print_message("entered %u lists; %u of %u out-edges to their old top keys; %u in-edges\n",
                entered, linked_out, g->deg[n0], linked_in);
  assert_true(entered >= 1);
  assert_true(linked_out >= g->M / 2);
  assert_true(linked_in >= 1);
  assert_graph_invariants(ix);
  free(was_top);
  free(top0);
  free(thr0);
  ra_index_free(ix);
  free_data(&d);
}

/* Over 10 % growth, each kept list is what inserting by a full re-sort gives (the list the key
 * enters, its place and the new bar, bit for bit): insertion finds the place by a binary search
 * over recomputed scores (roar.c, keep_enter), which holds only while every list stays sorted by
 * exactly those scores. */
static void test_kept_lists_match_full_resort(void **state) {
  (void)state;
  data d;
  const uint32_t n0 = NK * 9 / 10;
  make_data(&d, NK, 23);
  ra_index *ix = build_roar_keep(&d, n0, 256);
  ra_roar_keep *k = ix->keep;
  assert_non_null(k);
  const uint32_t T = k->T, n = k->n;
  uint32_t *top = malloc((size_t)n * T * sizeof *top);
  float *thr = malloc((size_t)n * sizeof *thr), *qf = malloc((size_t)n * DIM * sizeof *qf);
  assert_non_null(top);
  assert_non_null(thr);
  assert_non_null(qf);
  memcpy(top, k->top, (size_t)n * T * sizeof *top);
  memcpy(thr, k->thr, (size_t)n * sizeof *thr);
  ra_fp16_to_fp32_n(k->q, qf, (size_t)n * DIM);
  ra_keys keys = keys_of(&d, NK);
  ra_error err;
  uint32_t entered = 0;
  for (uint32_t id = n0; id < NK; id++) {
    assert_int_equal(ra_index_insert(ix, &keys, id, &err), RA_OK);
    for (uint32_t i = 0; i < n; i++) {
      float s = ra_vec_dot(qf + (size_t)i * DIM, d.keys + (size_t)id * DIM, RA_DTYPE_F32, DIM);
      if (!(s > thr[i])) continue;
      uint32_t *l = top + (size_t)i * T;
      float sc[64];
      assert_true(T <= 64);
      for (uint32_t r = 0; r < T; r++)
        sc[r] = ra_vec_dot(qf + (size_t)i * DIM, d.keys + (size_t)l[r] * DIM, RA_DTYPE_F32, DIM);
      uint32_t j = T - 1;
      for (; j > 0 && sc[j - 1] < s; j--) {
        l[j] = l[j - 1];
        sc[j] = sc[j - 1];
      }
      l[j] = id;
      sc[j] = s;
      thr[i] = sc[T - 1];
      entered++;
    }
    assert_memory_equal(k->top, top, (size_t)n * T * sizeof *top);
    assert_memory_equal(k->thr, thr, (size_t)n * sizeof *thr);
  }
  print_message("%u list entries over %u insertions\n", entered, NK - n0);
  assert_true(entered > NK - n0);
  free(top);
  free(thr);
  free(qf);
  ra_index_free(ix);
  free_data(&d);
}

/* The kept queries are the index's memory: in ra_index_bytes and in the estimate the store
 * charges before a build. */
static void test_kept_queries_are_accounted(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 18);
  ra_index *with = build_roar_keep(&d, NK, 1024), *without = build_roar_keep(&d, NK, 0);
  assert_non_null(with->keep);
  assert_null(without->keep);
  const ra_roar_keep *k = with->keep;
  size_t extra = ra_index_bytes(with) - ra_index_bytes(without);
  size_t least = (size_t)k->n * DIM * 2 + (size_t)k->n * k->T * 4 + (size_t)k->n * 4;
  print_message("%u kept queries x T %u: %zu bytes\n", k->n, k->T, extra);
  assert_int_equal(k->n, NQ);
  assert_true(extra >= least);
  assert_int_equal(extra, ra_roar_keep_bytes(k));
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.n_threads = 2;
  size_t est = ra_index_estimate_bytes(&p, NK, DIM, NQ);
  p.keep_queries = 0;
  size_t est0 = ra_index_estimate_bytes(&p, NK, DIM, NQ);
  assert_true(est - est0 >= extra);
  assert_true(ra_index_bytes(with) <= est);
  /* Growing by insertion keeps the kept queries' bytes as they were. */
  ra_keys keys = keys_of(&d, NK);
  ra_error err;
  ra_index *grown = build_roar_keep(&d, NK - 100, 1024);
  for (uint32_t id = NK - 100; id < NK; id++)
    assert_int_equal(ra_index_insert(grown, &keys, id, &err), RA_OK);
  assert_int_equal(ra_roar_keep_bytes(grown->keep), ra_roar_keep_bytes(k));
  ra_index_free(grown);
  ra_index_free(with);
  ra_index_free(without);
  free_data(&d);
}

static void test_insert_into_empty(void **state) {
  (void)state;
  data d;
  make_data(&d, 300, 6);
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  ra_keys k0 = keys_of(&d, 0), k = keys_of(&d, 300);
  ra_index *ix = NULL;
  ra_error err;
  assert_int_equal(ra_index_build(&p, &k0, NULL, &ix, &err), RA_OK);
  for (uint32_t id = 0; id < 300; id++) assert_int_equal(ra_index_insert(ix, &k, id, &err), RA_OK);
  assert_graph_invariants(ix);
  ra_index_free(ix);
  free_data(&d);
}

/* Two graph indexes hold the same graph: nodes, entry, degrees, pinned counts, norms, rows. */
static void assert_same_graph(const ra_index *a, const ra_index *b) {
  const ra_graph *ga = a->graph, *gb = b->graph;
  assert_int_equal(ga->n, gb->n);
  assert_int_equal(ga->entry, gb->entry);
  assert_memory_equal(ga->deg, gb->deg, ga->n * sizeof *ga->deg);
  assert_memory_equal(ga->npin, gb->npin, ga->n * sizeof *ga->npin);
  assert_memory_equal(ga->hn, gb->hn, ga->n * sizeof *ga->hn);
  for (uint32_t u = 0; u < ga->n; u++)
    assert_memory_equal(ga->adj + (size_t)u * ga->M, gb->adj + (size_t)u * gb->M,
                        ga->deg[u] * sizeof *ga->adj);
}

static void test_build_is_deterministic(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 7);
  ra_mode kinds[] = {RA_MODE_ROAR, RA_MODE_KGRAPH};
  for (int t = 0; t < 2; t++) {
    ra_index *a = build(kinds[t], &d, NK, 2), *b = build(kinds[t], &d, NK, 1);
    assert_int_equal(a->graph->n, NK);
    assert_same_graph(a, b);
    ra_index_free(a);
    ra_index_free(b);
  }
  /* ivf too: same centroids and lists for the same seed, on any number of threads. */
  ra_index *a = build(RA_MODE_IVF, &d, NK, 2), *b = build(RA_MODE_IVF, &d, NK, 1);
  assert_int_equal(a->ivf->n_lists, b->ivf->n_lists);
  assert_memory_equal(a->ivf->centroids, b->ivf->centroids,
                      (size_t)a->ivf->n_lists * DIM * sizeof(float));
  for (uint32_t l = 0; l < a->ivf->n_lists; l++) {
    assert_int_equal(a->ivf->list_len[l], b->ivf->list_len[l]);
    assert_memory_equal(a->ivf->list[l], b->ivf->list[l],
                        a->ivf->list_len[l] * sizeof *a->ivf->list[l]);
  }
  ra_index_free(a);
  ra_index_free(b);
  free_data(&d);
}

/* The k-means training sample: bounded by k * train_per_cluster (and n), at least k, distinct
 * ids, the same for a seed and different for another. */
static void test_kmeans_sample(void **state) {
  (void)state;
  assert_int_equal(ra_kmeans_train_size(100000, 100, 64), 6400);
  assert_int_equal(ra_kmeans_train_size(1000, 100, 64), 1000); /* fewer points than the cap */
  assert_int_equal(ra_kmeans_train_size(1000, 100, 0), 1000);   /* 0: every point */
  assert_int_equal(ra_kmeans_train_size(1000, 1000, 1), 1000);
  assert_int_equal(ra_kmeans_train_size(0xffffffffu, 0x10000u, 0x10000u), 0xffffffffu);
  enum { N = 5000, M = 700 };
  uint32_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
  uint8_t *seen = calloc(N, 1);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_non_null(seen);
  ra_kmeans_sample(N, M, 42, a);
  ra_kmeans_sample(N, M, 42, b);
  ra_kmeans_sample(N, M, 43, c);
  assert_memory_equal(a, b, M * sizeof *a);
  assert_memory_not_equal(a, c, M * sizeof *a);
  /* The whole array stays a permutation; its first M entries are the sample. */
  for (uint32_t i = 0; i < N; i++) {
    assert_true(a[i] < N);
    assert_false(seen[a[i]]);
    seen[a[i]] = 1;
  }
  /* Uniform, not a prefix of the ids: about a fifth of the sample lies in the top fifth. */
  uint32_t high = 0;
  for (uint32_t i = 0; i < M; i++) high += a[i] >= N - N / 5;
  assert_true(high > M / 10 && high < M * 3 / 10);
  free(a);
  free(b);
  free(c);
  free(seen);
}

/* Squared L2 between x and c. */
static double l2sq(const float *x, const float *c, int dim) {
  double s = 0;
  for (int i = 0; i < dim; i++) s += ((double)x[i] - c[i]) * ((double)x[i] - c[i]);
  return s;
}

/* The sgemm assignment picks the nearest centroid (up to fp32 rounding of |x|^2 - 2 x.c + |c|^2),
 * from fp32 and from fp16 points, the same on 1 and 3 threads. */
static void test_kmeans_assign_nearest(void **state) {
  (void)state;
  enum { N = 1500, K = 700 }; /* K > the 512 centroids of one sgemm block */
  data d;
  make_data(&d, N + K, 21);
  const float *x = d.keys, *cent = d.keys + (size_t)N * DIM;
  uint32_t *a1 = malloc(N * sizeof *a1), *a3 = malloc(N * sizeof *a3);
  uint16_t *h = malloc((size_t)N * DIM * sizeof *h);
  float *xh = malloc((size_t)N * DIM * sizeof *xh);
  assert_non_null(a1);
  assert_non_null(a3);
  assert_non_null(h);
  assert_non_null(xh);
  ra_error err;
  assert_int_equal(ra_kmeans_assign(x, RA_DTYPE_F32, N, DIM, cent, K, 1, a1, &err), RA_OK);
  assert_int_equal(ra_kmeans_assign(x, RA_DTYPE_F32, N, DIM, cent, K, 3, a3, &err), RA_OK);
  assert_memory_equal(a1, a3, N * sizeof *a1);
  for (uint32_t i = 0; i < N; i++) {
    const float *p = x + (size_t)i * DIM;
    double best = INFINITY;
    for (uint32_t j = 0; j < K; j++) {
      double dd = l2sq(p, cent + (size_t)j * DIM, DIM);
      if (dd < best) best = dd;
    }
    assert_true(a1[i] < K);
    assert_true(l2sq(p, cent + (size_t)a1[i] * DIM, DIM) <= best + 1e-3 * (1.0 + best));
  }
  /* fp16 points are converted block by block: the same as assigning their fp32 values. */
  ra_fp32_to_fp16_n(x, h, (size_t)N * DIM);
  ra_fp16_to_fp32_n(h, xh, (size_t)N * DIM);
  assert_int_equal(ra_kmeans_assign(h, RA_DTYPE_F16, N, DIM, cent, K, 2, a3, &err), RA_OK);
  assert_int_equal(ra_kmeans_assign(xh, RA_DTYPE_F32, N, DIM, cent, K, 2, a1, &err), RA_OK);
  assert_memory_equal(a1, a3, N * sizeof *a1);
  assert_int_equal(ra_kmeans_assign(x, RA_DTYPE_F32, N, DIM, cent, 0, 1, a1, &err), RA_EINVAL);
  free(a1);
  free(a3);
  free(h);
  free(xh);
  free_data(&d);
}

/* Sum of squared distances of x [n] to their assigned centroids. */
static double kmeans_sse(const float *x, uint32_t n, const float *cent, const uint32_t *assign) {
  double s = 0;
  for (uint32_t i = 0; i < n; i++) s += l2sq(x + (size_t)i * DIM, cent + (size_t)assign[i] * DIM, DIM);
  return s;
}

/* k-means on a sample: every point ends assigned to its nearest final centroid (the last pass
 * covers all points, not the sample only), Lloyd rounds on the sample lower the error of all
 * points, a sample of 8 per cluster stays near training on every point, and k == n works. */
static void test_kmeans_sampled(void **state) {
  (void)state;
  enum { N = 4000, K = 100 };
  data d;
  make_data(&d, N, 22);
  float *c = malloc((size_t)K * DIM * sizeof *c), *c0 = malloc((size_t)N * DIM * sizeof *c0);
  uint32_t *a = malloc(N * sizeof *a), *near = malloc(N * sizeof *near);
  assert_non_null(c);
  assert_non_null(c0);
  assert_non_null(a);
  assert_non_null(near);
  ra_error err;
  ra_kmeans_params p = {.iters = 0, .train_per_cluster = 8, .seed = 5, .n_threads = 2};
  assert_int_equal(ra_kmeans(d.keys, RA_DTYPE_F32, N, DIM, K, &p, c, a, &err), RA_OK);
  double sse_init = kmeans_sse(d.keys, N, c, a);
  /* Initial centroids are sample points, and no two are the same point. */
  for (uint32_t j = 0; j < K; j++) {
    int found = 0;
    for (uint32_t i = 0; i < N && !found; i++)
      found = !memcmp(c + (size_t)j * DIM, d.keys + (size_t)i * DIM, DIM * sizeof *c);
    assert_true(found);
  }
  p.iters = 10;
  assert_int_equal(ra_kmeans(d.keys, RA_DTYPE_F32, N, DIM, K, &p, c, a, &err), RA_OK);
  double sse_sampled = kmeans_sse(d.keys, N, c, a);
  assert_int_equal(ra_kmeans_assign(d.keys, RA_DTYPE_F32, N, DIM, c, K, 1, near, &err), RA_OK);
  assert_memory_equal(a, near, N * sizeof *a);
  p.train_per_cluster = 0;
  assert_int_equal(ra_kmeans(d.keys, RA_DTYPE_F32, N, DIM, K, &p, c, a, &err), RA_OK);
  double sse_all = kmeans_sse(d.keys, N, c, a);
  print_message("k-means error: initial %.0f, 10 rounds on 8 per cluster %.0f, on all %.0f\n",
                sse_init, sse_sampled, sse_all);
  assert_true(sse_sampled < 0.95 * sse_init);
  assert_true(sse_sampled < 1.25 * sse_all);
  /* As many clusters as points: every point is its own centroid. */
  p.train_per_cluster = 1;
  assert_int_equal(ra_kmeans(d.keys, RA_DTYPE_F32, 300, DIM, 300, &p, c0, a, &err), RA_OK);
  assert_true(kmeans_sse(d.keys, 300, c0, a) < 1e-6);
  assert_int_equal(ra_kmeans(d.keys, RA_DTYPE_F32, 300, DIM, 301, &p, c0, a, &err), RA_EINVAL);
  free(c);
  free(c0);
  free(a);
  free(near);
  free_data(&d);
}

/* ivf trained on a sample of 4 keys per list (400 of 4000): every key is in exactly one list, the
 * list of its nearest centroid, in ascending id order; the build does not depend on the thread
 * count; all probes are still exact. */
static void test_ivf_sampled_lists(void **state) {
  (void)state;
  enum { N = 4000, L = 100 };
  data d;
  make_data(&d, N, 23);
  ra_keys k = keys_of(&d, N);
  ra_index_params p;
  ra_index_params_default(RA_MODE_IVF, &p);
  p.n_lists = L;
  p.train_per_list = 4;
  ra_index *ix[2] = {NULL, NULL};
  ra_error err;
  for (int t = 0; t < 2; t++) {
    p.n_threads = t + 1;
    if (ra_index_build(&p, &k, NULL, &ix[t], &err)) fail_msg("%s", err.msg);
    if (ra_index_check(ix[t], &err)) fail_msg("%s", err.msg);
  }
  const ra_ivf *iv = ix[0]->ivf;
  assert_int_equal(iv->n_lists, L);
  assert_memory_equal(iv->centroids, ix[1]->ivf->centroids, (size_t)L * DIM * sizeof(float));
  uint32_t *near = malloc(N * sizeof *near), *count = calloc(N, sizeof *count);
  assert_non_null(near);
  assert_non_null(count);
  assert_int_equal(ra_kmeans_assign(d.keys, RA_DTYPE_F32, N, DIM, iv->centroids, L, 1, near, &err),
                   RA_OK);
  uint32_t used = 0;
  for (uint32_t l = 0; l < L; l++) {
    assert_int_equal(iv->list_len[l], ix[1]->ivf->list_len[l]);
    used += iv->list_len[l] > 0;
    for (uint32_t i = 0; i < iv->list_len[l]; i++) {
      uint32_t id = iv->list[l][i];
      assert_int_equal(id, ix[1]->ivf->list[l][i]);
      assert_int_equal(near[id], l);
      if (i) assert_true(iv->list[l][i - 1] < id);
      count[id]++;
    }
  }
  for (uint32_t i = 0; i < N; i++) assert_int_equal(count[i], 1);
  assert_true(used > L * 9 / 10); /* empty clusters were split, not left to pile up */
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix[0], 0, 20, NULL), RA_OK);
  ra_search_params all = {.ef = 0, .nprobe = L};
  uint32_t ids[20], want[20], n;
  float sc[20], wsc[20];
  for (int qi = 0; qi < 5; qi++) {
    const float *q = d.qtest + (size_t)qi * DIM;
    assert_int_equal(ra_index_search(ix[0], &k, q, 20, &all, &s, ids, sc, &n, NULL), RA_OK);
    exact_topk(&d, N, q, 20, want, wsc);
    assert_memory_equal(ids, want, sizeof ids);
  }
  p.train_per_list = 70000;
  ra_index *bad = NULL;
  assert_int_equal(ra_index_build(&p, &k, NULL, &bad, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "train_per_list"));
  ra_index_scratch_free(&s);
  ra_index_free(ix[0]);
  ra_index_free(ix[1]);
  free(near);
  free(count);
  free_data(&d);
}

static void test_roar_from_knn_lists(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 8);
  enum { KK = 64 };
  uint32_t *knn = malloc((size_t)NQ * KK * sizeof *knn);
  assert_non_null(knn);
  ra_error err;
  assert_int_equal(ra_knn_ip(d.keys, NK, DIM, NULL, d.q, NQ, KK, 0, 2, knn, NULL, &err), RA_OK);
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  ra_keys k = keys_of(&d, NK);
  ra_queries qs = {.q = NULL, .n = NQ, .knn = knn, .knn_k = KK};
  ra_index *ix = NULL;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_OK);
  assert_graph_invariants(ix);
  assert_true(mean_recall(ix, &d, NK, 40, NULL) >= 0.85);
  ra_index_free(ix);
  /* An id outside the keys is the caller's error, reported before anything is built. */
  knn[5 * KK + 3] = NK;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  assert_null(ix);
  assert_non_null(strstr(err.msg, "knn id"));
  free(knn);
  free_data(&d);
}

/* The first min(pivots, knn_k) ids of every list are pivots: n_pivots counts them, distinct. */
static void test_roar_pivots_per_list(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 12);
  enum { KK = 16 };
  uint32_t *knn = malloc((size_t)NQ * KK * sizeof *knn);
  uint8_t *seen = malloc(NK);
  assert_non_null(knn);
  assert_non_null(seen);
  ra_error err;
  assert_int_equal(ra_knn_ip(d.keys, NK, DIM, NULL, d.q, NQ, KK, 0, 2, knn, NULL, &err), RA_OK);
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  ra_keys k = keys_of(&d, NK);
  ra_queries qs = {.q = d.q, .n = NQ, .knn = knn, .knn_k = KK};
  static const uint32_t pivots[] = {1, 4, 64};
  uint32_t prev = 0;
  for (size_t t = 0; t < sizeof pivots / sizeof *pivots; t++) {
    p.pivots = pivots[t];
    uint32_t cols = pivots[t] < KK ? pivots[t] : KK, want = 0;
    memset(seen, 0, NK);
    for (uint32_t i = 0; i < NQ; i++)
      for (uint32_t j = 0; j < cols; j++)
        if (!seen[knn[(size_t)i * KK + j]]) {
          seen[knn[(size_t)i * KK + j]] = 1;
          want++;
        }
    ra_index *ix = NULL;
    assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_OK);
    assert_graph_invariants(ix);
    ra_index_graph_stats st;
    ra_index_get_graph_stats(ix, &st);
    assert_int_equal(st.n_pivots, want);
    assert_true(st.n_pivots > prev);
    prev = st.n_pivots;
    ra_index_free(ix);
  }
  p.pivots = 65537;
  ra_index *ix = NULL;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  assert_null(ix);
  free(seen);
  free(knn);
  free_data(&d);
}

/* A key in no query's list (here the one with the largest mean_q·k, appended after the lists
 * were computed) has no edges after the projection: it must not become the entry, from which no
 * walk would get anywhere. */
static void test_roar_entry_is_a_pivot(void **state) {
  (void)state;
  data d;
  make_data(&d, NK + 1, 13);
  enum { KK = 16 };
  uint32_t *knn = malloc((size_t)NQ * KK * sizeof *knn);
  assert_non_null(knn);
  ra_error err;
  assert_int_equal(ra_knn_ip(d.keys, NK, DIM, NULL, d.q, NQ, KK, 0, 2, knn, NULL, &err), RA_OK);
  float *outlier = d.keys + (size_t)NK * DIM;
  memset(outlier, 0, DIM * sizeof *outlier);
  for (uint32_t i = 0; i < NQ; i++)
    for (int j = 0; j < DIM; j++) outlier[j] += 100.0f * d.q[(size_t)i * DIM + j] / NQ;
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  ra_keys k = keys_of(&d, NK + 1);
  ra_queries qs = {.q = d.q, .n = NQ, .knn = knn, .knn_k = KK};
  ra_index *ix = NULL;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_OK);
  assert_int_not_equal(ix->graph->entry, NK);
  assert_true(ix->graph->deg[ix->graph->entry] > 0);
  assert_int_equal(ra_index_check(ix, &err), RA_OK);
  assert_graph_invariants(ix);
  ra_index_free(ix);
  free(knn);
  free_data(&d);
}

/* Connectivity repair of a graph with no edges at all: everything hangs from the entry, whose pin
 * room (M / 2) runs out within the first batch of 64, so later nodes must hang from nodes
 * repaired before them in the same batch. */
static void test_connect_edgeless_graph(void **state) {
  (void)state;
  data d;
  make_data(&d, 300, 14);
  ra_keys k = keys_of(&d, 300);
  ra_graph g;
  ra_error err;
  assert_int_equal(ra_graph_init(&g, 8, 300, 300), RA_OK);
  ra_graph_set_norms(&g, &k, 0, 300);
  g.entry = 17;
  assert_int_equal(ra_graph_connect(&g, &k, 32, 2, &err), RA_OK);
  assert_int_equal(g.n_repaired, 299);
  assert_int_equal(ra_graph_check(&g, &err), RA_OK);
  ra_graph_free(&g);
  free_data(&d);
}

/* Repair of runs of consecutive near-duplicate keys (as recent tokens are): a run must end up
 * linked within itself, or walks reach its keys only one by one through their parents. Repair
 * batches of consecutive ids held whole runs, whose members could not see each other. */
static void test_connect_links_runs_of_near_keys(void **state) {
  (void)state;
  enum { N = 512, RUN = 8 };
  float *x = malloc((size_t)N * DIM * sizeof *x);
  assert_non_null(x);
  rng_state = 15;
  for (uint32_t r = 0; r < N / RUN; r++) {
    float c[DIM];
    for (int j = 0; j < DIM; j++) c[j] = 3.0f * gauss();
    for (uint32_t i = r * RUN; i < (r + 1) * RUN; i++)
      for (int j = 0; j < DIM; j++) x[(size_t)i * DIM + j] = c[j] + 0.01f * gauss();
  }
  ra_keys k = {.rows = x, .dtype = RA_DTYPE_F32, .dim = DIM, .n = N};
  ra_graph g;
  ra_error err;
  assert_int_equal(ra_graph_init(&g, 8, N, N), RA_OK);
  ra_graph_set_norms(&g, &k, 0, N);
  g.entry = 0;
  assert_int_equal(ra_graph_connect(&g, &k, 32, 2, &err), RA_OK);
  assert_int_equal(ra_graph_check(&g, &err), RA_OK);
  uint32_t linked = 0;
  for (uint32_t u = 0; u < N; u++) {
    uint32_t hit = 0;
    for (uint32_t j = 0; j < g.deg[u]; j++) hit |= g.adj[(size_t)u * g.M + j] / RUN == u / RUN;
    linked += hit;
  }
  print_message("%u of %u keys link to a key of their run\n", linked, N);
  assert_true(linked >= N * 9 / 10);
  ra_graph_free(&g);
  free(x);
}

/* Keys stored as f16 or int8 rows: every kind built over the first 900 and grown to 1000 by
 * insertion finds, searched exhaustively (ef = n, every IVF list), what flat finds over the same
 * rows. */
static void check_row_keys(ra_dtype t) {
  enum { NB = 900, NT = 1000 };
  data d;
  make_data(&d, NT, 9);
  void *rows = malloc(NT * ra_dtype_row_bytes(t, DIM));
  assert_non_null(rows);
  assert_int_equal(ra_dtype_rows_from_fp32(t, d.keys, rows, NT, DIM, NULL), RA_OK);
  ra_keys k = {.rows = rows, .dtype = t, .dim = DIM, .n = NB};
  ra_queries qs = {.q = d.q, .n = NQ};
  ra_index_params p;
  ra_error err;
  ra_index *fl = NULL;
  ra_index_params_default(RA_MODE_FLAT, &p);
  assert_int_equal(ra_index_build(&p, &k, NULL, &fl, &err), RA_OK);
  static const ra_mode kinds[] = {RA_MODE_ROAR, RA_MODE_KGRAPH, RA_MODE_IVF};
  for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
    ra_index *ix = NULL;
    ra_index_params_default(kinds[ki], &p);
    k.n = NB;
    assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_OK);
    k.n = NT;
    for (uint32_t id = NB; id < NT; id++) assert_int_equal(ra_index_insert(ix, &k, id, &err), RA_OK);
    if (kinds[ki] != RA_MODE_IVF) assert_graph_invariants(ix);
    if (ki == 0)
      for (uint32_t id = NB; id < NT; id++) assert_int_equal(ra_index_insert(fl, &k, id, &err), RA_OK);
    ra_index_scratch s;
    assert_int_equal(ra_index_scratch_init(&s, ix, NT, 20, &err), RA_OK);
    ra_search_params sp = {.ef = NT, .nprobe = NT};
    uint32_t a[20], b[20], na, nb;
    for (int qi = 0; qi < 5; qi++) {
      const float *q = d.qtest + (size_t)qi * DIM;
      assert_int_equal(ra_index_search(ix, &k, q, 20, &sp, &s, a, NULL, &na, NULL), RA_OK);
      assert_int_equal(ra_index_search(fl, &k, q, 20, NULL, &s, b, NULL, &nb, NULL), RA_OK);
      assert_int_equal(na, 20);
      assert_memory_equal(a, b, sizeof a);
    }
    ra_index_scratch_free(&s);
    ra_index_free(ix);
  }
  ra_index_free(fl);
  free(rows);
  free_data(&d);
}

static void test_f16_keys(void **state) {
  (void)state;
  check_row_keys(RA_DTYPE_F16);
}

static void test_int8_keys(void **state) {
  (void)state;
  check_row_keys(RA_DTYPE_I8);
}

static void test_errors(void **state) {
  (void)state;
  data d;
  make_data(&d, 200, 10);
  ra_keys k = keys_of(&d, 200);
  ra_index_params p;
  ra_index *ix = (ra_index *)&p; /* must be reset to NULL on failure */
  ra_error err;
  ra_index_params_default(RA_MODE_ROAR, &p);
  assert_int_equal(ra_index_build(&p, &k, NULL, &ix, &err), RA_EINVAL);
  assert_null(ix);
  assert_non_null(strstr(err.msg, "queries"));
  p.degree = 1;
  ra_queries qs = {.q = d.q, .n = NQ};
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "degree"));
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.query_sample = 0.0f;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  p.kind = (ra_mode)9;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  ra_index_params_default(RA_MODE_KGRAPH, &p);
  ra_keys bad = k;
  bad.dim = 0;
  assert_int_equal(ra_index_build(&p, &bad, NULL, &ix, &err), RA_EINVAL);
  assert_int_equal(ra_index_build(&p, &k, NULL, &ix, &err), RA_OK);
  assert_int_equal(ra_index_insert(ix, &k, 150, &err), RA_EINVAL); /* not the next id */
  assert_non_null(strstr(err.msg, "next id"));
  assert_int_equal(ra_index_insert(ix, &k, 200, &err), RA_EINVAL); /* beyond the view */
  ra_keys k16 = k;
  k16.dtype = RA_DTYPE_F16;
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, 10, 10, &err), RA_OK);
  uint32_t ids[10], n = 7;
  assert_int_equal(ra_index_search(ix, &k16, d.q, 10, NULL, &s, ids, NULL, &n, NULL), RA_EINVAL);
  assert_int_equal(n, 0);
  ra_keys small = k;
  small.n = 100;
  assert_int_equal(ra_index_search(ix, &small, d.q, 10, NULL, &s, ids, NULL, &n, NULL), RA_EINVAL);
  ra_mode kind;
  assert_int_equal(ra_mode_parse("roar", &kind), RA_OK);
  assert_int_equal(kind, RA_MODE_ROAR);
  assert_int_equal(ra_mode_parse("hnsw", &kind), RA_EINVAL);
  ra_index_scratch_free(&s);
  ra_index_free(ix);
  free_data(&d);
}

static void test_estimate_covers_bytes(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 12);
  ra_mode kinds[] = {RA_MODE_FLAT, RA_MODE_IVF, RA_MODE_KGRAPH, RA_MODE_ROAR};
  for (int t = 0; t < 4; t++) {
    ra_index *ix = build(kinds[t], &d, NK, 2);
    ra_index_params p;
    ra_index_params_default(kinds[t], &p);
    p.n_threads = 2;
    size_t est = ra_index_estimate_bytes(&p, NK, DIM, NQ), got = ra_index_bytes(ix);
    print_message("%s: %zu bytes held, %zu estimated\n", ra_mode_name(kinds[t]), got, est);
    assert_true(got <= est);
    if (kinds[t] == RA_MODE_ROAR) assert_true(got >= (size_t)NK * p.degree * 4);
    ra_index_free(ix);
  }
  free_data(&d);
}

/* What the worker's GPU step sends for roar with key -> query lists: nb build queries' top-kk keys
 * (knn [nb, kk]) and each of the n keys' top-t queries by the margin q_j·k - s_j, s_j the j-th
 * query's kk-th score (ktq [n, t]); index-bench computes them the same way. */
static void make_key_lists(const data *d, uint32_t n, uint32_t nb, uint32_t kk, uint32_t t,
                           uint32_t *knn, uint32_t *ktq) {
  float *sc = malloc((size_t)nb * kk * sizeof *sc), *bias = malloc((size_t)nb * sizeof *bias);
  assert_non_null(sc);
  assert_non_null(bias);
  ra_error err;
  assert_int_equal(ra_knn_ip(d->keys, n, DIM, NULL, d->q, nb, kk, 0, 2, knn, sc, &err), RA_OK);
  for (uint32_t j = 0; j < nb; j++) bias[j] = -sc[(size_t)j * kk + kk - 1];
  assert_int_equal(ra_knn_ip(d->q, nb, DIM, bias, d->keys, n, t, 0, 2, ktq, NULL, &err), RA_OK);
  free(sc);
  free(bias);
}

/* Few build queries with short lists (as 4096 queries over 134K keys): most keys are in no list. */
enum { KQ_NB = 64, KQ_KK = 24, KQ_T = 4 };

static ra_index *build_key_lists(const data *d, uint32_t n, const uint32_t *knn,
                                 const uint32_t *ktq, int threads) {
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.n_threads = threads;
  ra_keys k = keys_of(d, n);
  ra_queries qs = {.q = d->q, .n = KQ_NB, .knn = knn, .knn_k = KQ_KK, .key_top_queries = ktq,
                   .key_top_k = ktq ? KQ_T : 0};
  ra_index *ix = NULL;
  ra_error err;
  if (ra_index_build(&p, &k, &qs, &ix, &err)) fail_msg("build roar: %s", err.msg);
  return ix;
}

/* The key-list tests' fixture: NK keys from seed, and the lists (knn [KQ_NB, KQ_KK], key ->
 * query [NK, KQ_T]) of the first n of them. */
typedef struct kq_fixture {
  data d;
  uint32_t *knn, *ktq;
} kq_fixture;

static void kq_up(kq_fixture *f, uint64_t seed, uint32_t n) {
  make_data(&f->d, NK, seed);
  f->knn = malloc((size_t)KQ_NB * KQ_KK * sizeof *f->knn);
  f->ktq = malloc((size_t)NK * KQ_T * sizeof *f->ktq);
  assert_non_null(f->knn);
  assert_non_null(f->ktq);
  make_key_lists(&f->d, n, KQ_NB, KQ_KK, KQ_T, f->knn, f->ktq);
}

static void kq_down(kq_fixture *f) {
  free(f->knn);
  free(f->ktq);
  free_data(&f->d);
}

/* The keys in no query's list get rows from the key -> query lists instead of beam searches: a
 * valid graph with every key reachable, almost nothing left to the repair, and recall like the
 * beam-search repair's. */
static void test_roar_key_queries_link_uncovered(void **state) {
  (void)state;
  kq_fixture f;
  kq_up(&f, 21, NK);
  data d = f.d;
  uint32_t *knn = f.knn, *ktq = f.ktq;
  ra_index *old = build_key_lists(&d, NK, knn, NULL, 2), *kq = build_key_lists(&d, NK, knn, ktq, 2);
  assert_graph_invariants(kq);
  ra_index_graph_stats so, sk;
  ra_index_get_graph_stats(old, &so);
  ra_index_get_graph_stats(kq, &sk);
  double fo, fk, ro = mean_recall(old, &d, NK, 40, &fo), rk = mean_recall(kq, &d, NK, 40, &fk);
  print_message("repaired %u -> %u of %u keys; recall@10 at ef 40 %.3f (scan %.3f) -> %.3f (scan "
                "%.3f)\n",
                so.n_repaired, sk.n_repaired, NK, ro, fo, rk, fk);
  assert_true(so.n_repaired > NK / 2); /* the case this path is for */
  assert_true(sk.n_repaired < NK / 50);
  assert_true(rk >= ro - 0.03);
  assert_true(fk < 0.3);
  ra_index_free(old);
  ra_index_free(kq);
  kq_down(&f);
}

/* pivots 0 (the default): ROAR_PIVOTS_KEYED (32) per list with key -> query lists that name
 * queries, 64 without them; an explicit count applies either way. Lists of 100 as the worker
 * sends, so that the two counts make different pivot sets. */
static void test_roar_pivots_auto(void **state) {
  (void)state;
  enum { KK = 100 }; /* the worker's list length: 32 and 64 pivots per list differ */
  kq_fixture f;
  kq_up(&f, 23, NK);
  uint32_t *knn = malloc((size_t)KQ_NB * KK * sizeof *knn);
  assert_non_null(knn);
  make_key_lists(&f.d, NK, KQ_NB, KK, KQ_T, knn, f.ktq);
  ra_keys k = keys_of(&f.d, NK);
  uint32_t got[2][3]; /* [with key lists][pivots 0 (auto), 32, 64] */
  const uint32_t piv[3] = {0, 32, 64};
  for (int kl = 0; kl < 2; kl++)
    for (int t = 0; t < 3; t++) {
      ra_index_params p;
      ra_index_params_default(RA_MODE_ROAR, &p);
      assert_int_equal(p.pivots, 0);
      p.pivots = piv[t];
      p.n_threads = 2;
      ra_queries qs = {.q = f.d.q, .n = KQ_NB, .knn = knn, .knn_k = KK,
                       .key_top_queries = kl ? f.ktq : NULL, .key_top_k = kl ? KQ_T : 0};
      ra_index *ix = NULL;
      ra_error err;
      if (ra_index_build(&p, &k, &qs, &ix, &err)) fail_msg("build roar: %s", err.msg);
      ra_index_graph_stats st;
      ra_index_get_graph_stats(ix, &st);
      got[kl][t] = st.n_pivots;
      ra_index_free(ix);
    }
  print_message("pivot keys: lists alone auto/32/64 %u/%u/%u, with key lists %u/%u/%u\n", got[0][0], got[0][1],
                got[0][2], got[1][0], got[1][1], got[1][2]);
  assert_true(got[0][1] < got[0][2]);     /* the two settings differ on these lists */
  assert_int_equal(got[0][0], got[0][2]); /* lists alone: 64 */
  assert_int_equal(got[1][0], got[1][1]); /* with key lists: 32 */
  free(knn);
  kq_down(&f);
}

/* Same seed, any thread count, the same graph; lists naming no query give the old build's graph. */
static void test_roar_key_queries_deterministic(void **state) {
  (void)state;
  kq_fixture f;
  kq_up(&f, 22, NK);
  data d = f.d;
  uint32_t *knn = f.knn, *ktq = f.ktq;
  ra_index *a = build_key_lists(&d, NK, knn, ktq, 1), *b = build_key_lists(&d, NK, knn, ktq, 2),
           *c = build_key_lists(&d, NK, knn, ktq, 3);
  assert_same_graph(a, b);
  assert_same_graph(a, c);
  ra_index_free(a);
  ra_index_free(b);
  ra_index_free(c);
  for (size_t i = 0; i < (size_t)NK * KQ_T; i++) ktq[i] = RA_INDEX_NO_QUERY;
  a = build_key_lists(&d, NK, knn, ktq, 2);
  b = build_key_lists(&d, NK, knn, NULL, 2);
  assert_same_graph(a, b);
  ra_index_free(a);
  ra_index_free(b);
  kq_down(&f);
}

/* Bad key -> query lists are the caller's error, reported before anything is built; queries the
 * build did not sample are skipped. */
static void test_roar_key_queries_validated(void **state) {
  (void)state;
  kq_fixture f;
  kq_up(&f, 23, NK);
  data d = f.d;
  uint32_t *knn = f.knn, *ktq = f.ktq;
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.n_threads = 2;
  ra_keys k = keys_of(&d, NK);
  ra_queries qs = {.q = d.q, .n = KQ_NB, .knn = knn, .knn_k = KQ_KK, .key_top_queries = ktq,
                   .key_top_k = KQ_T};
  ra_index *ix = (ra_index *)&p; /* must be reset to NULL on failure */
  ra_error err;
  uint32_t saved = ktq[(size_t)1234 * KQ_T + 2];
  ktq[(size_t)1234 * KQ_T + 2] = KQ_NB; /* one past the queries */
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  assert_null(ix);
  assert_non_null(strstr(err.msg, "key 1234's top query 64"));
  ktq[(size_t)1234 * KQ_T + 2] = saved;
  qs.key_top_k = 0;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "key_top_k"));
  qs.key_top_k = RA_INDEX_KEY_TOP_MAX + 1;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_EINVAL);
  /* Rows padded with "no query", and a sample that leaves some named queries out: valid. */
  qs.key_top_k = KQ_T;
  for (uint32_t u = 0; u < NK; u += 3) ktq[(size_t)u * KQ_T + KQ_T - 1] = RA_INDEX_NO_QUERY;
  for (uint32_t r = 0; r < KQ_T; r++) ktq[(size_t)7 * KQ_T + r] = RA_INDEX_NO_QUERY;
  p.query_sample = 0.5f;
  assert_int_equal(ra_index_build(&p, &k, &qs, &ix, &err), RA_OK);
  assert_graph_invariants(ix);
  ra_index_free(ix);
  kq_down(&f);
}

/* Query-aware insertion on a graph built from key -> query lists keeps the invariants and the
 * recall of a rebuild. */
static void test_roar_key_queries_then_insert(void **state) {
  (void)state;
  const uint32_t n0 = NK * 9 / 10;
  kq_fixture f;
  kq_up(&f, 24, n0);
  data d = f.d;
  uint32_t *knn = f.knn, *ktq = f.ktq;
  ra_index *ix = build_key_lists(&d, n0, knn, ktq, 2);
  assert_non_null(ix->keep);
  ra_keys k = keys_of(&d, NK);
  ra_error err;
  for (uint32_t id = n0; id < NK; id++) assert_int_equal(ra_index_insert(ix, &k, id, &err), RA_OK);
  assert_graph_invariants(ix);
  make_key_lists(&d, NK, KQ_NB, KQ_KK, KQ_T, knn, ktq);
  ra_index *full = build_key_lists(&d, NK, knn, ktq, 2);
  double fi, ff, ri = mean_recall(ix, &d, NK, 40, &fi), rf = mean_recall(full, &d, NK, 40, &ff);
  print_message("after insertion recall %.3f (scan %.3f); rebuilt %.3f (scan %.3f)\n", ri, fi, rf,
                ff);
  assert_true(ri >= rf - 0.03);
  ra_index_free(ix);
  ra_index_free(full);
  kq_down(&f);
}

/* The insertion work's map cache (graph.h, ra_graph_work_cache) returns what a cacheless work
 * maps, bit for bit, through hits, evictions (one 4-way set) and a metric changed under it, and
 * the same work bound to another graph takes nothing from the first one's entries. */
static void test_map_cache_matches_uncached(void **state) {
  (void)state;
  data d;
  make_data(&d, 64, 29);
  ra_keys k = keys_of(&d, 64);
  float C1[DIM * DIM], C2[DIM * DIM], got[DIM], want[DIM];
  for (int i = 0; i < DIM; i++)
    for (int j = 0; j <= i; j++) {
      C1[i * DIM + j] = C1[j * DIM + i] = gauss();
      C2[i * DIM + j] = C2[j * DIM + i] = gauss();
    }
  ra_graph g, h;
  assert_int_equal(ra_graph_init(&g, 8, 64, 64), RA_OK);
  assert_int_equal(ra_graph_init(&h, 8, 64, 64), RA_OK);
  assert_int_equal(ra_graph_set_metric(&g, C1, DIM), RA_OK);
  assert_int_equal(ra_graph_set_metric(&h, C2, DIM), RA_OK);
  ra_graph_work w, ref;
  assert_int_equal(ra_graph_work_init(&w, DIM, 8), RA_OK);
  assert_int_equal(ra_graph_work_init(&ref, DIM, 8), RA_OK);
  assert_int_equal(ra_graph_work_cache(&w, 4), RA_OK);
  assert_int_equal(w.mc_n, 4u);
  const ra_graph *bound[] = {&g, &g, &h, &g};
  uint64_t rng = 7;
  for (int phase = 0; phase < 4; phase++) {
    if (phase == 1) /* a new metric on the same graph: the old entries must not answer */
      assert_int_equal(ra_graph_set_metric(&g, C2, DIM), RA_OK);
    ra_graph_work_bind(&w, bound[phase]);
    ra_graph_work_bind(&ref, bound[phase]);
    for (int i = 0; i < 200; i++) {
      /* Ids 0-5 mostly (hits and evictions in the one set), sometimes any. */
      uint32_t id = i % 3 ? (uint32_t)ra_index_rng_below(&rng, 6) : (uint32_t)ra_index_rng_below(&rng, 64);
      ra_graph_key_to_metric(&k, id, &w, got);
      ra_graph_key_to_metric(&k, id, &ref, want);
      assert_memory_equal(got, want, sizeof got);
    }
  }
  assert_true(w.mc_hits > 0 && w.mc_misses > 0);
  assert_int_equal(ref.mc_hits + ref.mc_misses, 0);
  ra_graph_work_free(&w);
  ra_graph_work_free(&ref);
  ra_graph_free(&g);
  ra_graph_free(&h);
  free_data(&d);
}

/* Insertion with the default map cache and with one of 4 entries (nearly every map computed
 * afresh) gives the same graph: a cached map is what insertion would have computed. */
static void test_insert_map_cache_same_graph(void **state) {
  (void)state;
  data d;
  const uint32_t n0 = NK * 9 / 10;
  make_data(&d, NK, 31);
  ra_index *a = build(RA_MODE_ROAR, &d, n0, 2), *b = build(RA_MODE_ROAR, &d, n0, 2);
  assert_int_equal(ra_graph_work_cache(b->ins_work, 4), RA_OK);
  ra_keys k = keys_of(&d, NK);
  ra_error err;
  for (uint32_t id = n0; id < NK; id++) {
    assert_int_equal(ra_index_insert(a, &k, id, &err), RA_OK);
    assert_int_equal(ra_index_insert(b, &k, id, &err), RA_OK);
  }
  assert_true(a->ins_work->mc_n > 4u);
  assert_int_equal(b->ins_work->mc_n, 4u);
  assert_true(a->ins_work->mc_hits > b->ins_work->mc_hits);
  assert_same_graph(a, b);
  assert_graph_invariants(a);
  ra_index_free(a);
  ra_index_free(b);
  free_data(&d);
}

/* Concurrent searches, one scratch each, give the sequential answers. */
static void test_concurrent_search(void **state) {
  (void)state;
  data d;
  make_data(&d, NK, 13);
  ra_index *ix = build(RA_MODE_ROAR, &d, NK, 2);
  ra_keys k = keys_of(&d, NK);
  enum { NT = 64, K = 10 };
  static uint32_t seq[NT][K], par[NT][K];
  ra_index_scratch s;
  assert_int_equal(ra_index_scratch_init(&s, ix, 64, K, NULL), RA_OK);
  ra_search_params sp = {.ef = 64};
  for (int i = 0; i < NT; i++) {
    uint32_t n;
    assert_int_equal(ra_index_search(ix, &k, d.qtest + (size_t)i * DIM, K, &sp, &s, seq[i], NULL,
                                     &n, NULL),
                     RA_OK);
  }
  ra_index_scratch_free(&s);
  int bad = 0;
#pragma omp parallel num_threads(2) reduction(+ : bad)
  {
    ra_index_scratch ts;
    if (ra_index_scratch_init(&ts, ix, 8, 1, NULL)) bad++; /* grows on first use */
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < NT; i++) {
      uint32_t n;
      if (ra_index_search(ix, &k, d.qtest + (size_t)i * DIM, K, &sp, &ts, par[i], NULL, &n, NULL))
        bad++;
    }
    ra_index_scratch_free(&ts);
  }
  assert_int_equal(bad, 0);
  assert_memory_equal(seq, par, sizeof seq);
  ra_index_free(ix);
  free_data(&d);
}

/* Two executables from this file (RA_TEST_GROUP 1: search, 2: build and insertion) keep each
 * ctest entry well under its time budget, also under ASan. */
int main(void) {
  const struct CMUnitTest search_tests[] = {
      cmocka_unit_test(test_knn_matches_naive),
      cmocka_unit_test(test_sort_cands),
      cmocka_unit_test(test_knn_thread_independent),
      cmocka_unit_test(test_flat_is_exact),
      cmocka_unit_test(test_roar_exact_when_beam_covers),
      cmocka_unit_test(test_kgraph_exact_when_beam_covers),
      cmocka_unit_test(test_ivf_all_probes_exact),
      cmocka_unit_test(test_f16_keys),
      cmocka_unit_test(test_int8_keys),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_concurrent_search),
      cmocka_unit_test(test_roar_from_knn_lists),
      cmocka_unit_test(test_insert_into_empty),
  };
  const struct CMUnitTest build_tests[] = {
      cmocka_unit_test(test_roar_recall_on_shifted_queries),
      cmocka_unit_test(test_insertion_keeps_invariants_and_recall),
      cmocka_unit_test(test_insert_updates_kept_queries),
      cmocka_unit_test(test_kept_lists_match_full_resort),
      cmocka_unit_test(test_kept_queries_are_accounted),
      cmocka_unit_test(test_build_is_deterministic),
      cmocka_unit_test(test_kmeans_sample),
      cmocka_unit_test(test_kmeans_assign_nearest),
      cmocka_unit_test(test_kmeans_sampled),
      cmocka_unit_test(test_ivf_sampled_lists),
      cmocka_unit_test(test_roar_pivots_per_list),
      cmocka_unit_test(test_roar_entry_is_a_pivot),
      cmocka_unit_test(test_connect_edgeless_graph),
      cmocka_unit_test(test_connect_links_runs_of_near_keys),
      cmocka_unit_test(test_estimate_covers_bytes),
      cmocka_unit_test(test_roar_key_queries_link_uncovered),
      cmocka_unit_test(test_roar_key_queries_deterministic),
      cmocka_unit_test(test_roar_pivots_auto),
      cmocka_unit_test(test_roar_key_queries_validated),
      cmocka_unit_test(test_roar_key_queries_then_insert),
      cmocka_unit_test(test_map_cache_matches_uncached),
      cmocka_unit_test(test_insert_map_cache_same_graph),
  };
  if (RA_TEST_GROUP == 1) return cmocka_run_group_tests(search_tests, NULL, NULL);
  return cmocka_run_group_tests(build_tests, NULL, NULL);
}
