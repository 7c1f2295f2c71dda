/* Wave mode on real kv-store processes: each kv head split over two stores by token range, its
 * keys clustered the way the worker does (a permutation within segments, then cluster sizes).
 * Store A gets its rows already permuted and clusters without a perm; store B gets rows in
 * token order and the perm with the clusters. A wave attend selecting every cluster equals mode
 * full; any selection equals the reference over its clusters' tokens plus the unclustered
 * (appended) rows, before and after those are clustered with a perm; bad requests (retro's
 * past-step cluster lists too) get clear statuses and leave the stores serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "client.h"
#include "harness.h"
#include "kvdata.h"
#include "merge.h"
#include "reference.h"

#define TIMEOUT_MS 10000
#define DIM 64
#define NQ 8
#define NKV 2
#define SPLIT 2048   /* store A: tokens [0, SPLIT), store B: [SPLIT, open) */
#define PREFILL 4096
#define APPENDED 100
#define TOTAL (PREFILL + APPENDED)
#define SEGMENT 1024
#define MAX_CL (TOTAL / 4)

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static void expect(int rc, int code, const ra_error *err, const char *text) {
  if (rc != code) fail_msg("got %s (%s), want %s", ra_status_name(rc), err->msg, ra_status_name(code));
  if (!strstr(err->msg, text)) fail_msg("message '%s' lacks '%s'", err->msg, text);
}

/* The worker's view of one kv head: which token each row position holds, and the clusters. */
typedef struct head_view {
  uint32_t tok[TOTAL];          /* row position -> token */
  uint64_t cl_pos[MAX_CL];      /* cluster id -> first row position */
  uint32_t cl_cnt[MAX_CL];
  uint32_t n_cl;
  uint64_t clustered[2];        /* per store: rows clustered up to this position */
} head_view;

typedef struct wave_fx {
  harness_store st[2];
  ra_kvclient *c[2];
  ra_kvclient_session s[2];
  ra_kvclient_stream *stream[2];
  kvdata d;
  head_view h[NKV];
  ref_rng rng;
} wave_fx;

/* A segment's clustering: a random permutation and cluster sizes 8..24 covering n rows. */
static size_t cluster_segment(ref_rng *r, uint32_t *perm, uint32_t *counts, size_t n) {
  ref_shuffle(r, perm, n);
  size_t c = 0;
  for (size_t left = n; left > 0;) {
    uint32_t k = 8 + (uint32_t)(ref_rng_next(r) % 17);
    if (k > left) k = (uint32_t)left;
    counts[c++] = k;
    left -= k;
  }
  return c;
}

/* Clusters rows [b, e) of kv head kv on store si as the worker would. prepermuted: the rows
 * were sent in cluster order (the view already says so) and no perm goes with the clusters. */
static void install(wave_fx *f, int si, uint32_t kv, uint64_t b, uint64_t e, const uint32_t *perm,
                    const uint32_t *counts, size_t n_cl, int prepermuted) {
  head_view *h = &f->h[kv];
  ra_kvclient_clusters cl = {.layer = 0, .kv_head = kv, .first_cluster = h->n_cl, .row_begin = b,
                             .counts = counts, .n_clusters = n_cl,
                             .perm = prepermuted ? NULL : perm};
  ra_kvclient_clusters_result res;
  ra_error err;
  ok(ra_kvclient_put_clusters(f->c[si], &f->s[si], &cl, &res, &err), &err);
  if (!prepermuted) {
    uint32_t *old = malloc((e - b) * sizeof *old);
    memcpy(old, h->tok + b, (e - b) * sizeof *old);
    for (uint64_t j = 0; j < e - b; j++) h->tok[b + j] = old[perm[j]];
    free(old);
  }
  uint64_t pos = b;
  for (size_t i = 0; i < n_cl; i++) {
    h->cl_pos[h->n_cl] = pos;
    h->cl_cnt[h->n_cl++] = counts[i];
    pos += counts[i];
  }
  h->clustered[si] = e;
  assert_int_equal(res.rows_clustered, e - (si ? SPLIT : 0)); /* a prefix of the store's rows */
}

static void fx_start(wave_fx *f) {
  memset(f, 0, sizeof *f);
  f->rng.s = 99;
  ra_error err;
  ra_kvclient_geometry g = {.n_layers = 1, .n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = DIM,
                            .dtype = RA_DTYPE_F32};
  kvdata_make(&f->d, &g, TOTAL, 12);
  for (int si = 0; si < 2; si++) {
    assert_int_equal(harness_store_start(&f->st[si], NULL), 0);
    ok(ra_kvclient_connect(f->st[si].addr, NULL, &f->c[si], &err), &err);
    ra_kvclient_shard sh[NKV];
    for (uint32_t kv = 0; kv < NKV; kv++)
      sh[kv] = (ra_kvclient_shard){.layer = 0, .kv_head = kv, .token_begin = si ? SPLIT : 0,
                                   .token_end = si ? RA_TOKEN_END_OPEN : SPLIT};
    ok(ra_kvclient_open_session(f->c[si], &g, sh, NKV, "wave", &f->s[si], &err), &err);
  }
  const size_t rb = DIM * sizeof(float);
  uint32_t perm[SEGMENT], counts[SEGMENT];
  for (uint32_t kv = 0; kv < NKV; kv++) {
    head_view *h = &f->h[kv];
    for (uint32_t t = 0; t < TOTAL; t++) h->tok[t] = t;
    /* Store A: each segment's rows sent permuted, then its clusters alone. */
    for (uint64_t b = 0; b < SPLIT; b += SEGMENT) {
      size_t n_cl = cluster_segment(&f->rng, perm, counts, SEGMENT);
      ra_kvclient_rows src = kvdata_rows(&f->d, 0, kv, b, b + SEGMENT);
      uint8_t *k = malloc(SEGMENT * rb), *v = malloc(SEGMENT * rb);
      for (size_t j = 0; j < SEGMENT; j++) {
        memcpy(k + j * rb, (const uint8_t *)src.keys + perm[j] * rb, rb);
        memcpy(v + j * rb, (const uint8_t *)src.values + perm[j] * rb, rb);
        h->tok[b + j] = (uint32_t)(b + perm[j]);
      }
      ra_kvclient_rows rows = {.layer = 0, .kv_head = kv, .token_begin = b, .n_tokens = SEGMENT,
                               .keys = k, .values = v};
      ok(ra_kvclient_put_kv(f->c[0], &f->s[0], &rows, 1, NULL, &err), &err);
      install(f, 0, kv, b, b + SEGMENT, perm, counts, n_cl, 1);
      free(k);
      free(v);
    }
    /* Store B: the rows in token order, each segment's perm with its clusters. */
    ra_kvclient_rows rows = kvdata_rows(&f->d, 0, kv, SPLIT, PREFILL);
    ok(ra_kvclient_put_kv(f->c[1], &f->s[1], &rows, 1, NULL, &err), &err);
    for (uint64_t b = SPLIT; b < PREFILL; b += SEGMENT) {
      size_t n_cl = cluster_segment(&f->rng, perm, counts, SEGMENT);
      install(f, 1, kv, b, b + SEGMENT, perm, counts, n_cl, 0);
    }
  }
  for (int si = 0; si < 2; si++) ok(ra_kvclient_attend_open(f->c[si], &f->s[si], &f->stream[si], &err), &err);
}

static void fx_stop(wave_fx *f) {
  ra_error err;
  for (int si = 0; si < 2; si++) {
    ra_kvclient_attend_close(f->stream[si]);
    ok(ra_kvclient_close_session(f->c[si], &f->s[si], NULL, &err), &err);
    ra_kvclient_close(f->c[si]);
    assert_int_equal(harness_store_stop(&f->st[si], 10000), 0);
  }
  kvdata_free(&f->d);
}

/* The store holding row position pos. */
static int store_of(uint64_t pos) { return pos >= SPLIT; }

/* Every q head's partial merged over both stores. wave: mode wave with the clusters picked by
 * `pick` (id -> selected), split by the store holding each. scanned: rows read, summed. */
static void attend_both(wave_fx *f, const float *q, int wave, int (*pick)(uint32_t, uint32_t),
                        float o[NQ][DIM], uint64_t *scanned) {
  ra_error err;
  ra_partial acc[NQ];
  for (int h = 0; h < NQ; h++) {
    acc[h].o = o[h];
    ra_partial_reset(&acc[h], DIM);
  }
  *scanned = 0;
  uint32_t heads[NQ];
  for (uint32_t h = 0; h < NQ; h++) heads[h] = h;
  static uint32_t ids[NKV * MAX_CL];
  for (int si = 0; si < 2; si++) {
    uint32_t kvs[NKV], counts[NKV];
    size_t n = 0;
    for (uint32_t kv = 0; kv < NKV; kv++) {
      kvs[kv] = kv;
      counts[kv] = 0;
      for (uint32_t c = 0; wave && c < f->h[kv].n_cl; c++)
        if (store_of(f->h[kv].cl_pos[c]) == si && pick(kv, c)) {
          ids[n++] = c;
          counts[kv]++;
        }
    }
    float out[NQ][DIM];
    ra_head_partial parts[NQ];
    for (int h = 0; h < NQ; h++) parts[h] = (ra_head_partial){.part = {.o = out[h]}};
    ra_kvclient_attend_req req = {.layer = 0, .q_heads = heads, .n_heads = NQ, .q = q,
                                  .mode = wave ? RA_MODE_WAVE : RA_MODE_FULL};
    if (wave) {
      req.cluster_kv_heads = kvs;
      req.cluster_counts = counts;
      req.n_cluster_heads = NKV;
      req.clusters = ids;
    }
    ok(ra_kvclient_attend(f->stream[si], &req, parts, TIMEOUT_MS, NULL, &err), &err);
    for (int h = 0; h < NQ; h++) {
      ra_partial_merge(&acc[h], parts[h].part.o, parts[h].part.m, parts[h].part.l, DIM);
      *scanned += parts[h].n_scanned;
    }
  }
}

static int pick_all(uint32_t kv, uint32_t c) {
  (void)kv;
  (void)c;
  return 1;
}
static int pick_some(uint32_t kv, uint32_t c) { return (c * 7 + kv * 3) % 10 < 2; }

/* The tokens a selection attends: its clusters' and every unclustered row's. */
static size_t selected_tokens(const wave_fx *f, uint32_t kv, uint64_t stored_b,
                              int (*pick)(uint32_t, uint32_t), uint32_t *tok) {
  const head_view *h = &f->h[kv];
  size_t n = 0;
  for (uint32_t c = 0; c < h->n_cl; c++)
    if (pick(kv, c))
      for (uint32_t r = 0; r < h->cl_cnt[c]; r++) tok[n++] = h->tok[h->cl_pos[c] + r];
  for (uint64_t p = h->clustered[0]; p < SPLIT; p++) tok[n++] = h->tok[p];
  for (uint64_t p = h->clustered[1]; p < stored_b; p++) tok[n++] = h->tok[p];
  return n;
}

/* At the current state (store B holding rows up to stored_b): wave over every cluster equals
 * full and the reference; a partial selection equals the reference over its tokens. */
static void check_state(wave_fx *f, uint64_t stored_b) {
  float q[NQ * DIM], full[NQ][DIM], wave[NQ][DIM];
  ref_fill_normal(&f->rng, q, NQ * DIM, 1.0f);
  uint64_t scanned_full, scanned_wave;
  attend_both(f, q, 0, pick_all, full, &scanned_full);
  attend_both(f, q, 1, pick_all, wave, &scanned_wave);
  assert_int_equal(scanned_full, (uint64_t)NQ * stored_b);
  assert_int_equal(scanned_wave, scanned_full);
  double want[DIM], worst = 0.0;
  static uint32_t tok[TOTAL];
  for (int h = 0; h < NQ; h++) {
    for (int d = 0; d < DIM; d++) {
      double e = fabs((double)full[h][d] - wave[h][d]);
      worst = e > worst ? e : worst;
    }
    ref_attention(q + h * DIM, kvdata_k(&f->d, 0, h / 4), kvdata_v(&f->d, 0, h / 4), NULL,
                  stored_b, DIM, want);
    assert_true(ref_max_abs_diff(wave[h], want, DIM) <= 1e-5);
  }
  if (worst > 1e-5) fail_msg("wave over every cluster differs from full by %g", worst);

  attend_both(f, q, 1, pick_some, wave, &scanned_wave);
  uint64_t want_scanned = 0;
  for (int h = 0; h < NQ; h++) {
    size_t n = selected_tokens(f, (uint32_t)h / 4, stored_b, pick_some, tok);
    want_scanned += n;
    ref_attention(q + h * DIM, kvdata_k(&f->d, 0, h / 4), kvdata_v(&f->d, 0, h / 4), tok, n, DIM,
                  want);
    double e = ref_max_abs_diff(wave[h], want, DIM);
    if (e > 1e-5) fail_msg("head %d: a partial selection is off the reference by %g", h, e);
  }
  assert_int_equal(scanned_wave, want_scanned);
  assert_true(want_scanned < scanned_full);
}

static void test_wave_two_stores(void **state) {
  (void)state;
  wave_fx f;
  fx_start(&f);
  check_state(&f, PREFILL);

  /* Decode: tokens evicted to store B, scanned exactly while unclustered. */
  ra_error err;
  ra_kvclient_rows rows[NKV];
  for (uint32_t kv = 0; kv < NKV; kv++) rows[kv] = kvdata_rows(&f.d, 0, kv, PREFILL, TOTAL);
  ok(ra_kvclient_append(f.c[1], &f.s[1], rows, NKV, &err), &err);
  check_state(&f, TOTAL);

  /* The block clustered on the device: its perm and clusters; the rows stay visible. */
  uint32_t perm[APPENDED], counts[APPENDED];
  for (uint32_t kv = 0; kv < NKV; kv++) {
    size_t n_cl = cluster_segment(&f.rng, perm, counts, APPENDED);
    install(&f, 1, kv, PREFILL, TOTAL, perm, counts, n_cl, 0);
  }
  check_state(&f, TOTAL);
  fx_stop(&f);
}

/* Bad PutClusters and wave attends: their statuses, and the stores keep serving. */
static void test_wave_bad_requests(void **state) {
  (void)state;
  wave_fx f;
  fx_start(&f);
  ra_error err;
  uint32_t counts[2] = {4, 4}, perm[8] = {0, 1, 2, 3, 4, 5, 6, 6};
  ra_kvclient_clusters cl = {.layer = 0, .kv_head = 0, .first_cluster = 3, .row_begin = SPLIT,
                             .counts = counts, .n_clusters = 2};
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_ESTATE, &err,
         "already clustered");
  cl.row_begin = PREFILL;
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_ESTATE, &err,
         "not all stored yet");
  ra_kvclient_rows rows = kvdata_rows(&f.d, 0, 0, PREFILL, PREFILL + 8);
  ok(ra_kvclient_append(f.c[1], &f.s[1], &rows, 1, &err), &err);
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_ESTATE, &err,
         "out of order: 3 after"); /* store A's id */
  uint32_t first_b = 0;
  while (f.h[0].cl_pos[first_b] < SPLIT) first_b++;
  cl.first_cluster = first_b;
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_ESTATE, &err,
         "is already defined");
  cl.first_cluster = f.h[0].n_cl;
  cl.perm = perm;
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_EINVAL, &err,
         "not a permutation");
  cl.row_begin = 100;
  cl.perm = NULL;
  expect(ra_kvclient_put_clusters(f.c[1], &f.s[1], &cl, NULL, &err), RA_EINVAL, &err,
         "in no shard of this store");

  /* A cluster of the other store, and a selection outside mode wave. */
  uint32_t head = 1, kv = 0, one = 1, id = 0;
  float q[DIM] = {0}, o[DIM];
  ra_head_partial part = {.part = {.o = o}};
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = &head, .n_heads = 1, .q = q,
                                .mode = RA_MODE_WAVE, .cluster_kv_heads = &kv,
                                .cluster_counts = &one, .n_cluster_heads = 1, .clusters = &id};
  expect(ra_kvclient_attend(f.stream[1], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err,
         "cluster 0 of layer 0 kv head 0 is not held by this store");
  req.mode = RA_MODE_FULL;
  expect(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err,
         "mode wave only");
  /* Both streams reopen and serve. */
  req.mode = RA_MODE_WAVE;
  ok(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), &err);
  assert_int_equal(part.n_scanned, f.h[0].cl_cnt[0]);
  req.n_cluster_heads = 0;
  ok(ra_kvclient_attend(f.stream[1], &req, &part, TIMEOUT_MS, NULL, &err), &err);
  assert_int_equal(part.n_scanned, 8); /* the appended rows alone */

  /* Retro: a past step's partial over the cluster named for it (no lag rows), then malformed
   * lists refused and the stream serving again. */
  req.n_cluster_heads = 1;
  uint32_t rcounts[3] = {1, 1, 1}, rids[3] = {0, 0, 0};
  float rq[3 * DIM] = {0}, ro[3 * DIM];
  ra_head_partial rparts[3];
  for (int j = 0; j < 3; j++) rparts[j] = (ra_head_partial){.part = {.o = ro + j * DIM}};
  req.retro_step = 5;
  req.retro_window = 2;
  req.n_retro = 1;
  req.retro_q = rq;
  req.retro_cluster_counts = rcounts;
  req.retro_clusters = rids;
  ok(ra_kvclient_attend_send(f.stream[0], &req, &err), &err);
  ok(ra_kvclient_attend_recv_retro(f.stream[0], &req, &part, rparts, TIMEOUT_MS, NULL, NULL, &err), &err);
  assert_int_equal(part.n_scanned, f.h[0].cl_cnt[0]);
  assert_int_equal(rparts[0].n_scanned, f.h[0].cl_cnt[0]);
  assert_int_equal(rparts[0].q_head, head);
  for (int d = 0; d < DIM; d++) assert_true(fabsf(rparts[0].part.o[d] - part.part.o[d]) <= 1e-6f);
  rcounts[0] = 2; /* cluster 0 named twice for past step 1 */
  expect(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err,
         "retro clusters of past step 1: cluster 0 of layer 0 kv head 0 selected twice");
  rcounts[0] = 1;
  rids[0] = first_b; /* store B's */
  expect(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err,
         "is not held by this store");
  rids[0] = 0;
  req.n_retro = 3; /* over the window */
  expect(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err,
         "window 2 with 3 past queries");
  req.n_retro = 1;
  req.mode = RA_MODE_FULL;
  req.n_cluster_heads = 0;
  expect(ra_kvclient_attend(f.stream[0], &req, &part, TIMEOUT_MS, NULL, &err), RA_EINVAL, &err, "retro");
  req.mode = RA_MODE_WAVE;
  req.n_cluster_heads = 1;
  ok(ra_kvclient_attend_send(f.stream[0], &req, &err), &err);
  ok(ra_kvclient_attend_recv_retro(f.stream[0], &req, &part, rparts, TIMEOUT_MS, NULL, NULL, &err), &err);
  assert_int_equal(rparts[0].n_scanned, f.h[0].cl_cnt[0]);
  fx_stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wave_two_stores),
      cmocka_unit_test(test_wave_bad_requests),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
