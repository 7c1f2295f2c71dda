/* Index modes against real kv-store processes: BuildIndex, then attends in roar / ivf / kgraph
 * mode compared with flat mode on the same store, head by head. Where a head's retrieved id set
 * equals flat's, (o, m, l) must equal flat's; over all heads recall@k against flat must reach a
 * floor that a wrong index (wrong rows, wrong shard mapping, no insertion) cannot.
 *
 * Data with planted structure (as tests/index does): keys = c_g + B_g z + noise per kv head g,
 * queries = b_h + A_h z' + noise per q head h, over a shared 8-dim latent. Keys and queries come
 * from different maps (attention's query/key distribution shift), build and test queries from the
 * same distribution, so a graph built from the build queries' top keys serves the test queries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <time.h>

#include "client.h"
#include "harness.h"
#include "merge.h"
#include "reference.h"

#define DIM 64
#define R 8
#define NQH 4
#define NKV 2
#define NK 3000  /* tokens per kv head */
#define NQB 300  /* build queries per q head */
#define NQT 16   /* test queries per q head */
#define KNN 64   /* knn ids sent per build query */
#define TOPK 32
#define EF 128
#define TIMEOUT_MS 20000

typedef struct world {
  ra_kvclient_geometry g;
  float *k[NKV], *v[NKV];     /* [NK, DIM], rounded to f16 */
  uint16_t *pk[NKV], *pv[NKV];
  float *qb[NQH];             /* [NQB, DIM] build queries */
  float *qt[NQH];             /* [NQT, DIM] test queries */
  uint64_t *knn[NQH];         /* [NQB, KNN] exact top token positions of each build query */
} world;

static world W;

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

/* y = off + M z + 0.3 noise, z ~ N(0, I_R). */
static void sample(ref_rng *rng, const float *off, const float *M, float *y) {
  float z[R];
  for (int r = 0; r < R; r++) z[r] = ref_rng_normal(rng);
  for (int i = 0; i < DIM; i++) {
    float s = off[i];
    for (int r = 0; r < R; r++) s += M[i * R + r] * z[r];
    y[i] = s + 0.3f * ref_rng_normal(rng);
  }
}

static int world_setup(void **state) {
  (void)state;
  ref_rng rng = {2024};
  W.g = (ra_kvclient_geometry){.n_layers = 1, .n_q_heads = NQH, .n_kv_heads = NKV,
                               .head_dim = DIM, .dtype = RA_DTYPE_F16};
  float off[DIM], M[DIM * R];
  for (int g = 0; g < NKV; g++) {
    ref_fill_normal(&rng, off, DIM, 2.0f);
    ref_fill_normal(&rng, M, DIM * R, 1.0f);
    W.k[g] = malloc((size_t)NK * DIM * sizeof(float));
    W.v[g] = malloc((size_t)NK * DIM * sizeof(float));
    W.pk[g] = malloc((size_t)NK * DIM * 2);
    W.pv[g] = malloc((size_t)NK * DIM * 2);
    for (int t = 0; t < NK; t++) sample(&rng, off, M, W.k[g] + (size_t)t * DIM);
    ref_fill_normal(&rng, W.v[g], (size_t)NK * DIM, 1.0f);
    ref_pack(RA_DTYPE_F16, W.k[g], W.pk[g], NK, DIM);
    ref_pack(RA_DTYPE_F16, W.v[g], W.pv[g], NK, DIM);
  }
  double *scores = malloc(NK * sizeof *scores);
  uint32_t top[KNN];
  for (int h = 0; h < NQH; h++) {
    ref_fill_normal(&rng, off, DIM, 0.5f);
    ref_fill_normal(&rng, M, DIM * R, 1.0f);
    W.qb[h] = malloc((size_t)NQB * DIM * sizeof(float));
    W.qt[h] = malloc((size_t)NQT * DIM * sizeof(float));
    W.knn[h] = malloc((size_t)NQB * KNN * sizeof(uint64_t));
    for (int i = 0; i < NQB; i++) sample(&rng, off, M, W.qb[h] + (size_t)i * DIM);
    for (int i = 0; i < NQT; i++) sample(&rng, off, M, W.qt[h] + (size_t)i * DIM);
    for (int i = 0; i < NQB; i++) {
      ref_scores(W.qb[h] + (size_t)i * DIM, W.k[h / (NQH / NKV)], NK, DIM, scores);
      ref_topk(scores, NK, KNN, top);
      for (int j = 0; j < KNN; j++) W.knn[h][(size_t)i * KNN + j] = top[j];
    }
  }
  free(scores);
  return 0;
}

static int world_teardown(void **state) {
  (void)state;
  for (int g = 0; g < NKV; g++) {
    free(W.k[g]);
    free(W.v[g]);
    free(W.pk[g]);
    free(W.pv[g]);
  }
  for (int h = 0; h < NQH; h++) {
    free(W.qb[h]);
    free(W.qt[h]);
    free(W.knn[h]);
  }
  return 0;
}

/* Tokens [begin, end) of kv head g. */
static ra_kvclient_rows rows_of(uint32_t g, uint64_t begin, uint64_t end) {
  return (ra_kvclient_rows){.layer = 0, .kv_head = g, .token_begin = begin,
                            .n_tokens = end - begin, .keys = W.pk[g] + begin * DIM,
                            .values = W.pv[g] + begin * DIM};
}

typedef struct conn {
  harness_store st;
  ra_kvclient *c;
  ra_kvclient_session s;
  ra_kvclient_stream *stream;
} conn;

/* A store holding tokens [begin, end) of both kv heads (end RA_TOKEN_END_OPEN: open shards
 * filled up to NK). */
static void conn_open(conn *cn, uint64_t begin, uint64_t end,
                      const ra_index_spec *defaults) {
  ra_error err;
  assert_int_equal(harness_store_start(&cn->st, NULL), 0);
  ok(ra_kvclient_connect(cn->st.addr, NULL, &cn->c, &err), &err);
  ra_kvclient_shard sh[NKV];
  ra_kvclient_rows rows[NKV];
  uint64_t fill = end == RA_TOKEN_END_OPEN ? NK : end;
  for (uint32_t g = 0; g < NKV; g++) {
    sh[g] = (ra_kvclient_shard){.layer = 0, .kv_head = g, .token_begin = begin, .token_end = end};
    rows[g] = rows_of(g, begin, fill);
  }
  ok(ra_kvclient_open_session_indexed(cn->c, &W.g, sh, NKV, defaults, "index", &cn->s, &err),
     &err);
  ok(ra_kvclient_put_kv(cn->c, &cn->s, rows, NKV, NULL, &err), &err);
  ok(ra_kvclient_attend_open(cn->c, &cn->s, &cn->stream, &err), &err);
}

static void conn_close(conn *cn) {
  ra_error err;
  ra_kvclient_attend_close(cn->stream);
  uint64_t freed = 0;
  ok(ra_kvclient_close_session(cn->c, &cn->s, &freed, &err), &err);
  ra_kvclient_store_stats st;
  ok(ra_kvclient_stats(cn->c, &st, &err), &err);
  assert_int_equal(st.bytes_used, 0); /* KV and indexes all uncharged */
  ra_kvclient_close(cn->c);
  assert_int_equal(harness_store_stop(&cn->st, 10000), 0);
}

/* One attend of q heads [first, first + n) for test query i (a->p[0..n)). */
typedef struct answer {
  ra_head_partial p[NQH];
  float o[NQH][DIM];
  uint64_t ids[NQH][TOPK];
  uint64_t compute_us;
} answer;

static void attend_some(conn *cn, int i, uint32_t first, uint32_t n, ra_mode mode,
                        uint32_t ef, uint32_t nprobe, answer *a) {
  uint32_t heads[NQH];
  float q[NQH * DIM];
  for (uint32_t j = 0; j < n; j++) {
    heads[j] = first + j;
    memcpy(q + j * DIM, W.qt[first + j] + (size_t)i * DIM, DIM * sizeof(float));
    a->p[j] = (ra_head_partial){.part.o = a->o[j], .ids = a->ids[j], .ids_cap = TOPK};
  }
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = heads, .n_heads = n, .q = q,
                                .mode = mode, .top_k = TOPK, .search = {.ef = ef, .nprobe = nprobe},
                                .want_ids = 1};
  ra_error err;
  ok(ra_kvclient_attend(cn->stream, &req, a->p, TIMEOUT_MS, &a->compute_us, &err), &err);
}

static void attend_all(conn *cn, int i, ra_mode mode, uint32_t ef, uint32_t nprobe,
                       answer *a) {
  attend_some(cn, i, 0, NQH, mode, ef, nprobe, a);
}

typedef struct tally {
  int heads, same;       /* heads compared, heads whose id sets equal flat's */
  double recall;         /* sum of recall@k against flat */
  double scanned;        /* sum of n_scanned / n_keys */
  uint64_t us_index, us_flat;
} tally;

static int has(const uint64_t *ids, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == id) return 1;
  return 0;
}

static int close_rel(double a, double b, double tol) {
  return fabs(a - b) <= tol * (fabs(b) > 1.0 ? fabs(b) : 1.0);
}

/* Head by head: recall of the index's ids against flat's; equal (o, m, l) when the sets agree. */
static void compare(const ra_head_partial *x, const ra_head_partial *f, tally *t) {
  assert_int_equal(x->q_head, f->q_head);
  assert_int_equal(x->n_keys, f->n_keys);
  assert_true(x->n_ids <= TOPK && f->n_ids <= TOPK);
  size_t hit = 0;
  for (size_t i = 0; i < x->n_ids; i++) hit += (size_t)has(f->ids, f->n_ids, x->ids[i]);
  t->heads++;
  t->recall += f->n_ids ? (double)hit / (double)f->n_ids : 1.0;
  t->scanned += (double)x->n_scanned / (double)x->n_keys;
  if (hit != f->n_ids || x->n_ids != f->n_ids) return;
  t->same++;
  if (!close_rel(x->part.m, f->part.m, 1e-5) || !close_rel(x->part.l, f->part.l, 1e-4))
    fail_msg("head %u: same ids, (m, l) = (%g, %g) vs flat (%g, %g)", x->q_head, x->part.m, x->part.l,
             f->part.m, f->part.l);
  for (int d = 0; d < DIM; d++)
    if (!close_rel(x->part.o[d], f->part.o[d], 1e-4))
      fail_msg("head %u: same ids, o[%d] = %g vs flat %g", x->q_head, d, x->part.o[d], f->part.o[d]);
}

/* Every test query in `mode` and in flat; asserts recall >= floor, and that the index scanned
 * at most max_scan of the keys (it searched, it did not fall back to a scan). */
static tally check_mode(conn *cn, ra_mode mode, uint32_t ef, uint32_t nprobe,
                        double floor, double max_scan, const char *what) {
  tally t = {0};
  answer x, f;
  for (int i = 0; i < NQT; i++) {
    attend_all(cn, i, mode, ef, nprobe, &x);
    attend_all(cn, i, RA_MODE_FLAT, 0, 0, &f);
    t.us_index += x.compute_us;
    t.us_flat += f.compute_us;
    for (int h = 0; h < NQH; h++) compare(&x.p[h], &f.p[h], &t);
  }
  double recall = t.recall / t.heads, scan = t.scanned / t.heads;
  print_message("%s: recall@%d vs flat %.3f, id sets equal %d/%d, scanned %.3f of keys, attend "
                "%.0f us vs flat %.0f us\n",
                what, TOPK, recall, t.same, t.heads, scan, (double)t.us_index / NQT,
                (double)t.us_flat / NQT);
  if (recall < floor) fail_msg("%s: recall %.3f < %.2f", what, recall, floor);
  if (scan > max_scan) fail_msg("%s: scanned %.3f of the keys > %.2f", what, scan, max_scan);
  return t;
}

static const ra_index_spec ROAR = {.kind = RA_MODE_ROAR};

/* roar indexes of every q head; the store holds n_keys tokens of each kv head. */
static void build_roar_per_q_head(conn *cn, uint64_t n_keys) {
  ra_error err;
  for (uint32_t h = 0; h < NQH; h++) {
    ra_kvclient_build_result r;
    ok(ra_kvclient_build_index(cn->c, &cn->s, 0, h, &ROAR, &(ra_kvclient_build_input){.queries = W.qb[h], .n_queries = NQB, .knn_ids = W.knn[h], .knn_k = KNN}, &r, &err),
       &err);
    assert_int_equal(r.n_keys, n_keys);
    assert_true(r.index_bytes > n_keys * 4);
  }
}

static void test_roar_per_q_head_matches_flat(void **state) {
  (void)state;
  conn cn;
  conn_open(&cn, 0, RA_TOKEN_END_OPEN, NULL);
  build_roar_per_q_head(&cn, NK);
  tally t = check_mode(&cn, RA_MODE_ROAR, EF, 0, 0.9, 0.5, "roar per q head, ef 128");
  assert_true(t.same > 0);
  conn_close(&cn);
}

/* One shared graph per kv head, built from the whole group's queries by a request naming the
 * group's second head. */
static void test_roar_per_kv_head_matches_flat(void **state) {
  (void)state;
  conn cn;
  conn_open(&cn, 0, RA_TOKEN_END_OPEN, NULL);
  const int gs = NQH / NKV;
  float *q = malloc((size_t)gs * NQB * DIM * sizeof *q);
  uint64_t *knn = malloc((size_t)gs * NQB * KNN * sizeof *knn);
  ra_index_spec p = {.kind = RA_MODE_ROAR, .per_kv_head = 1};
  ra_error err;
  for (uint32_t g = 0; g < NKV; g++) {
    for (int j = 0; j < gs; j++) {
      memcpy(q + (size_t)j * NQB * DIM, W.qb[g * gs + j], (size_t)NQB * DIM * sizeof *q);
      memcpy(knn + (size_t)j * NQB * KNN, W.knn[g * gs + j], (size_t)NQB * KNN * sizeof *knn);
    }
    ra_kvclient_build_result r;
    ok(ra_kvclient_build_index(cn.c, &cn.s, 0, g * gs + 1, &p, &(ra_kvclient_build_input){.queries = q, .n_queries = gs * NQB, .knn_ids = knn, .knn_k = KNN}, &r, &err),
       &err);
    assert_int_equal(r.n_keys, NK);
  }
  free(q);
  free(knn);
  check_mode(&cn, RA_MODE_ROAR, EF, 0, 0.9, 0.5, "roar per kv head, ef 128");
  conn_close(&cn);
}

/* ivf from the session's defaults (OpenSession IndexParams), kgraph from the request's. */
static void test_ivf_and_kgraph(void **state) {
  (void)state;
  conn cn;
  ra_index_spec ivf = {.kind = RA_MODE_IVF, .n_lists = 64};
  conn_open(&cn, 0, RA_TOKEN_END_OPEN, &ivf);
  ra_index_spec kg = {.kind = RA_MODE_KGRAPH};
  ra_error err;
  for (uint32_t h = 0; h < NQH; h++) {
    ra_kvclient_build_result r;
    ok(ra_kvclient_build_index(cn.c, &cn.s, 0, h, NULL, NULL, &r, &err), &err);
    assert_int_equal(r.n_keys, NK);
    ok(ra_kvclient_build_index(cn.c, &cn.s, 0, h, &kg, NULL, &r, &err), &err);
    assert_int_equal(r.n_keys, NK);
  }
  check_mode(&cn, RA_MODE_IVF, 0, 16, 0.9, 0.5, "ivf 64 lists, nprobe 16");
  check_mode(&cn, RA_MODE_KGRAPH, 256, 0, 0.9, 0.6, "kgraph, ef 256");
  conn_close(&cn);
}

/* kv heads split by token range over two stores, each with its own roar index built from the
 * same knn lists (each keeps the positions it holds): per store the index agrees with its flat,
 * and the two stores' partials merge into what the two flat partials merge into. */
static void test_split_across_two_stores(void **state) {
  (void)state;
  const uint64_t split = 1200;
  conn a, b;
  conn_open(&a, 0, split, NULL);
  conn_open(&b, split, RA_TOKEN_END_OPEN, NULL);
  build_roar_per_q_head(&a, split);
  ra_error err;
  for (uint32_t h = 0; h < NQH; h++) {
    ra_kvclient_build_result r;
    ok(ra_kvclient_build_index(b.c, &b.s, 0, h, &ROAR, &(ra_kvclient_build_input){.queries = W.qb[h], .n_queries = NQB, .knn_ids = W.knn[h], .knn_k = KNN}, &r, &err),
       &err);
    assert_int_equal(r.n_keys, NK - split);
  }
  tally t = {0};
  int merged_same = 0;
  for (int i = 0; i < NQT; i++) {
    answer xa, xb, fa, fb;
    attend_all(&a, i, RA_MODE_ROAR, EF, 0, &xa);
    attend_all(&b, i, RA_MODE_ROAR, EF, 0, &xb);
    attend_all(&a, i, RA_MODE_FLAT, 0, 0, &fa);
    attend_all(&b, i, RA_MODE_FLAT, 0, 0, &fb);
    for (int h = 0; h < NQH; h++) {
      int before = t.same;
      compare(&xa.p[h], &fa.p[h], &t);
      compare(&xb.p[h], &fb.p[h], &t);
      for (size_t j = 0; j < xa.p[h].n_ids; j++) assert_true(xa.ids[h][j] < split);
      for (size_t j = 0; j < xb.p[h].n_ids; j++) assert_true(xb.ids[h][j] >= split);
      if (t.same - before < 2) continue;
      merged_same++;
      float ox[DIM], of[DIM];
      ra_partial mx = {.o = ox}, mf = {.o = of};
      ra_partial_reset(&mx, DIM);
      ra_partial_reset(&mf, DIM);
      ra_partial_merge_from(&mx, &xa.p[h].part, DIM);
      ra_partial_merge_from(&mx, &xb.p[h].part, DIM);
      ra_partial_merge_from(&mf, &fa.p[h].part, DIM);
      ra_partial_merge_from(&mf, &fb.p[h].part, DIM);
      for (int d = 0; d < DIM; d++) assert_true(close_rel(ox[d], of[d], 1e-4));
    }
  }
  double recall = t.recall / t.heads;
  print_message("split over two stores: recall@%d vs each store's flat %.3f, merged heads equal "
                "%d/%d\n", TOPK, recall, merged_same, NQT * NQH);
  assert_true(recall >= 0.9);
  assert_true(merged_same > 0);
  conn_close(&a);
  conn_close(&b);
}

/* An appended token is retrievable at once: a key planted along a test query, far above every
 * other key's score, is the first id returned, whether the store's background indexer has
 * inserted it yet (the graph finds it) or not (the lag, or the shard being inserted into, is
 * scanned exactly); once it is in, the graph finds it scanning a fraction of the keys. */
static void test_append_is_retrievable(void **state) {
  (void)state;
  conn cn;
  conn_open(&cn, 0, RA_TOKEN_END_OPEN, NULL);
  ra_error err;
  const uint32_t head = 2, g = head / (NQH / NKV);
  ra_kvclient_build_result br;
  ok(ra_kvclient_build_index(cn.c, &cn.s, 0, head, &ROAR, &(ra_kvclient_build_input){.queries = W.qb[head], .n_queries = NQB, .knn_ids = W.knn[head], .knn_k = KNN}, &br,
                             &err),
     &err);
  float key[DIM], val[DIM];
  uint16_t pk[DIM], pv[DIM];
  for (int d = 0; d < DIM; d++) {
    key[d] = 4.0f * W.qt[head][d]; /* test query 0 of head 2 */
    val[d] = 0.5f;
  }
  ref_pack(RA_DTYPE_F16, key, pk, 1, DIM);
  ref_pack(RA_DTYPE_F16, val, pv, 1, DIM);
  ra_kvclient_rows r = {.layer = 0, .kv_head = g, .token_begin = NK, .n_tokens = 1, .keys = pk,
                        .values = pv};
  ok(ra_kvclient_append(cn.c, &cn.s, &r, 1, &err), &err);
  answer x;
  attend_some(&cn, 0, head, 1, RA_MODE_ROAR, EF, 0, &x);
  assert_int_equal(x.p[0].n_keys, NK + 1);
  assert_true(x.p[0].n_ids > 0);
  assert_int_equal(x.ids[0][0], NK);
  /* The planted key takes (nearly) all the softmax mass: o is its value. */
  for (int d = 0; d < DIM; d++) assert_true(fabsf(x.p[0].part.o[d] - 0.5f) < 1e-3f);
  /* No drain over RPC: ask again until the insertion is done (2 s at most). */
  for (int i = 0; i < 200 && x.p[0].n_scanned >= NK / 2; i++) {
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
    attend_some(&cn, 0, head, 1, RA_MODE_ROAR, EF, 0, &x);
    assert_int_equal(x.ids[0][0], NK);
  }
  assert_true(x.p[0].n_scanned < NK / 2);
  /* The other kv head is untouched by it. */
  attend_some(&cn, 0, 0, 1, RA_MODE_FLAT, 0, 0, &x);
  assert_int_equal(x.p[0].n_keys, NK);
  conn_close(&cn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roar_per_q_head_matches_flat),
      cmocka_unit_test(test_roar_per_kv_head_matches_flat),
      cmocka_unit_test(test_ivf_and_kgraph),
      cmocka_unit_test(test_split_across_two_stores),
      cmocka_unit_test(test_append_is_retrievable),
  };
  return cmocka_run_group_tests(tests, world_setup, world_teardown);
}
