/* Retrospective correction at the store: a past query's cached partial merged (LSE) with the
 * supplementary partials of later steps equals attention over the union of the sets, exactly to
 * fp32 rounding; positions stored after a past step (in its window then) are never given to it;
 * a missing record leaves the partial empty; bad arguments are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "attend.h"
#include "merge.h"
#include "reference.h"
#include "retro.h"
#include "store.h"

enum { DIM = 32, NQ = 4, NKV = 2, LAYER = 1, BEGIN = 10, N0 = 400, N_APPEND = 6, TOP_K = 12 };

typedef struct fixture {
  kvs_store *st;
  kvs_session *s;
  float *k[NKV], *v[NKV]; /* [N0 + N_APPEND, DIM]: position p at row p (rows < BEGIN unused) */
} fixture;

static void write_rows(fixture *f, uint32_t g, uint64_t p0, size_t n) {
  uint16_t *pk = malloc(n * DIM * 2), *pv = malloc(n * DIM * 2);
  ref_pack(RA_DTYPE_F16, f->k[g] + p0 * DIM, pk, n, DIM);
  ref_pack(RA_DTYPE_F16, f->v[g] + p0 * DIM, pv, n, DIM);
  kvs_rows r = {.layer = LAYER, .kv_head = g, .token_begin = p0, .n = n, .keys = pk, .values = pv};
  ra_error err;
  assert_int_equal(kvs_session_write(f->s, &r, 1, NULL, &err), RA_OK);
  free(pk);
  free(pv);
}

static void fixture_make(fixture *f) {
  memset(f, 0, sizeof *f);
  kvs_geometry g = {.n_layers = 2, .n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = DIM, .dtype = RA_DTYPE_F16};
  ra_error err;
  assert_int_equal(kvs_store_create(1ull << 28, &f->st, &err), RA_OK);
  kvs_shard_spec sh[NKV];
  for (uint32_t h = 0; h < NKV; h++)
    sh[h] = (kvs_shard_spec){.layer = LAYER, .kv_head = h, .token_begin = BEGIN, .token_end = RA_TOKEN_END_OPEN};
  assert_int_equal(kvs_store_open(f->st, &g, sh, NKV, NULL, "test", &f->s, &err), RA_OK);
  ref_rng rng = {7};
  for (uint32_t h = 0; h < NKV; h++) {
    f->k[h] = calloc((N0 + N_APPEND) * DIM, sizeof(float));
    f->v[h] = calloc((N0 + N_APPEND) * DIM, sizeof(float));
    ref_fill_normal(&rng, f->k[h], (N0 + N_APPEND) * DIM, 1.0f);
    ref_fill_normal(&rng, f->v[h], (N0 + N_APPEND) * DIM, 1.0f);
    write_rows(f, h, BEGIN, N0 - BEGIN);
  }
}

static void fixture_free(fixture *f) {
  for (uint32_t h = 0; h < NKV; h++) {
    free(f->k[h]);
    free(f->v[h]);
  }
  kvs_session_release(f->s);
  kvs_store_destroy(f->st);
}

static const uint32_t heads[NQ] = {0, 1, 2, 3};

/* One flat attend of every q head as retro step `step` with `n_retro` past queries. */
static void attend_step(fixture *f, const float *q, uint64_t step, uint32_t n_retro, const float *past,
                        kvs_attend_result *res) {
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = NQ, .q = q, .mode = RA_MODE_FLAT,
                       .top_k = TOP_K, .want_ids = 1, .n_threads = 2, .retro_step = step, .retro_window = 4,
                       .n_retro = n_retro, .retro_q = past};
  ra_error err;
  assert_int_equal(kvs_attend(f->s, &a, res, &err), RA_OK);
}

/* positions of a result head into a 0/1 mask over [0, N0 + N_APPEND), limited to p < below */
static void mark(const ra_head_partial *h, uint64_t below, uint8_t *mask) {
  for (size_t i = 0; i < h->n_ids; i++)
    if (h->ids[i] < below) mask[h->ids[i]] = 1;
}

/* attention of q over the marked positions of kv head g, against merged (o, m, l) */
static void check_union(const fixture *f, uint32_t g, const float *q, const uint8_t *mask, const ra_partial *got) {
  uint32_t ids[N0 + N_APPEND];
  size_t n = 0;
  for (uint32_t p = 0; p < N0 + N_APPEND; p++)
    if (mask[p]) ids[n++] = p;
  double want[DIM];
  ref_attention(q, f->k[g], f->v[g], ids, n, DIM, want);
  assert_true(ref_max_abs_diff(got->o, want, DIM) < 2e-6);
  /* l as the direct sum at the merged max */
  double l = 0;
  for (size_t i = 0; i < n; i++) {
    double z = 0;
    for (int d = 0; d < DIM; d++) z += (double)q[d] * f->k[g][ids[i] * DIM + d];
    l += exp(z / sqrt((double)DIM) - got->m);
  }
  assert_true(fabs(l - got->l) < 2e-6 * l);
}

static void test_union_and_horizon(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f);
  ref_rng rng = {11};
  float q[3][NQ * DIM];
  for (int s = 0; s < 3; s++) ref_fill_normal(&rng, q[s], NQ * DIM, 1.0f);
  kvs_attend_result r1, r2, r3;
  attend_step(&f, q[0], 1, 0, NULL, &r1);
  attend_step(&f, q[1], 2, 1, q[0], &r2);
  /* rows appended after step 2, each aligned with step 3's queries so that they are retrieved */
  for (uint32_t g = 0; g < NKV; g++) {
    for (int i = 0; i < N_APPEND; i++)
      for (int d = 0; d < DIM; d++) f.k[g][(N0 + i) * DIM + d] = 4.0f * q[2][(2 * g) * DIM + d];
    write_rows(&f, g, N0, N_APPEND);
  }
  float past3[2 * NQ * DIM]; /* step 2's, then step 1's */
  memcpy(past3, q[1], sizeof q[1]);
  memcpy(past3 + NQ * DIM, q[0], sizeof q[0]);
  attend_step(&f, q[2], 3, 2, past3, &r3);
  uint64_t new_rows = 0;
  for (int h = 0; h < NQ; h++) {
    const uint32_t g = (uint32_t)h / (NQ / NKV);
    for (size_t i = 0; i < r3.heads[h].n_ids; i++) new_rows += r3.heads[h].ids[i] >= N0;
    /* step 1: its own set, then step 2's and step 3's new positions below its horizon */
    ra_partial acc = r1.heads[h].part;
    float o1[DIM];
    memcpy(o1, acc.o, sizeof o1);
    acc.o = o1;
    ra_partial_merge_from(&acc, &r2.retro[h].part, DIM);
    ra_partial_merge_from(&acc, &r3.retro[NQ + h].part, DIM);
    uint8_t mask[N0 + N_APPEND] = {0};
    mark(&r1.heads[h], N0, mask);
    mark(&r2.heads[h], N0, mask);
    mark(&r3.heads[h], N0, mask);
    check_union(&f, g, q[0] + h * DIM, mask, &acc);
    /* the supplementary partials counted exactly the new positions */
    uint8_t m1[N0 + N_APPEND] = {0};
    mark(&r1.heads[h], N0, m1);
    uint64_t fresh = 0;
    for (size_t i = 0; i < r2.heads[h].n_ids; i++) fresh += !m1[r2.heads[h].ids[i]];
    assert_int_equal(r2.retro[h].n_scanned, fresh);
    /* step 2 the same way */
    ra_partial acc2 = r2.heads[h].part;
    float o2[DIM];
    memcpy(o2, acc2.o, sizeof o2);
    acc2.o = o2;
    ra_partial_merge_from(&acc2, &r3.retro[h].part, DIM);
    uint8_t mask2[N0 + N_APPEND] = {0};
    mark(&r2.heads[h], N0, mask2);
    mark(&r3.heads[h], N0, mask2);
    check_union(&f, g, q[1] + h * DIM, mask2, &acc2);
  }
  assert_true(new_rows > 0); /* the horizon was exercised */
  kvs_attend_result_free(&r1);
  kvs_attend_result_free(&r2);
  kvs_attend_result_free(&r3);
  fixture_free(&f);
}

static void test_missing_record(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f);
  ref_rng rng = {5};
  float q[2][NQ * DIM];
  ref_fill_normal(&rng, q[0], NQ * DIM, 1.0f);
  ref_fill_normal(&rng, q[1], NQ * DIM, 1.0f);
  kvs_attend_result r1, r3;
  attend_step(&f, q[0], 1, 0, NULL, &r1);
  /* step 2 never reached this store: step 1 cannot be proved to lack anything */
  float past[2 * NQ * DIM];
  memcpy(past, q[1], sizeof q[1]);
  memcpy(past + NQ * DIM, q[0], sizeof q[0]);
  attend_step(&f, q[1], 3, 2, past, &r3);
  for (int h = 0; h < NQ; h++) {
    assert_int_equal(r3.retro[h].n_scanned, 0);
    assert_int_equal(r3.retro[NQ + h].n_scanned, 0);
    assert_true(r3.retro[NQ + h].part.l == 0.0f && isinf(r3.retro[NQ + h].part.m));
  }
  kvs_attend_result_free(&r1);
  kvs_attend_result_free(&r3);
  fixture_free(&f);
}

static void test_bad_args(void **state) {
  (void)state;
  fixture f;
  fixture_make(&f);
  float q[NQ * DIM] = {0};
  kvs_attend_result r;
  ra_error err;
  kvs_attend_args a = {.layer = LAYER, .q_heads = heads, .n_heads = NQ, .q = q, .mode = RA_MODE_FULL,
                       .retro_step = 1, .retro_window = 2};
  assert_int_equal(kvs_attend(f.s, &a, &r, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "retro"));
  a.mode = RA_MODE_FLAT;
  a.top_k = 4;
  a.retro_window = KVS_RETRO_MAX_WINDOW + 1;
  assert_int_equal(kvs_attend(f.s, &a, &r, &err), RA_EINVAL);
  a.retro_window = 2;
  a.n_retro = 3;
  a.retro_q = q;
  assert_int_equal(kvs_attend(f.s, &a, &r, &err), RA_EINVAL);
  a.n_retro = 0;
  a.retro_step = 0;
  assert_int_equal(kvs_attend(f.s, &a, &r, &err), RA_EINVAL);
  fixture_free(&f);
}

/* The records are charged to the session (and the store's budget) before they grow: a step's
 * record costs its positions, a reused slot nothing more; closing the session gives all back; a
 * record that would pass the budget is refused with the budget's message and charges nothing. */
static void test_records_charged_to_the_budget(void **state) {
  kvs_geometry g = {.n_layers = 2, .n_q_heads = NQ, .n_kv_heads = NKV, .head_dim = DIM, .dtype = RA_DTYPE_F16};
  kvs_shard_spec sh[NKV];
  for (uint32_t h = 0; h < NKV; h++)
    sh[h] = (kvs_shard_spec){.layer = LAYER, .kv_head = h, .token_begin = BEGIN, .token_end = RA_TOKEN_END_OPEN};
  kvs_store *st;
  kvs_session *s;
  ra_error err;
  assert_int_equal(kvs_store_create(1ull << 20, &st, &err), RA_OK);
  assert_int_equal(kvs_store_open(st, &g, sh, NKV, NULL, "test", &s, &err), RA_OK);
  const uint64_t opened = kvs_store_bytes_used(st), session0 = atomic_load(&s->bytes);
  assert_true(session0 >= kvs_retro_table_bytes(g.n_layers, g.n_q_heads)); /* the slot table is metadata */
  enum { N = 1000 };
  uint64_t *pos = malloc(N * sizeof *pos);
  for (size_t i = 0; i < N; i++) pos[i] = N - i;
  assert_int_equal(kvs_retro_record(s->retro, LAYER, 0, 1, N, pos, N, &err), RA_OK);
  assert_int_equal(kvs_retro_bytes(s->retro), N * sizeof(uint64_t));
  assert_int_equal(kvs_store_bytes_used(st), opened + N * sizeof(uint64_t));
  assert_int_equal(atomic_load(&s->bytes), session0 + N * sizeof(uint64_t));
  /* step 1 + KVS_RETRO_MAX_WINDOW reuses step 1's slot: no growth for fewer positions */
  assert_int_equal(kvs_retro_record(s->retro, LAYER, 0, 1 + KVS_RETRO_MAX_WINDOW, N, pos, N / 2, &err), RA_OK);
  assert_int_equal(kvs_store_bytes_used(st), opened + N * sizeof(uint64_t));
  /* another head's slot grows from nothing */
  assert_int_equal(kvs_retro_record(s->retro, LAYER, 1, 2, N, pos, N / 4, &err), RA_OK);
  assert_int_equal(kvs_store_bytes_used(st), opened + (N + N / 4) * sizeof(uint64_t));
  /* past the 1 MiB budget: refused, nothing charged, the slot records no step */
  const uint64_t before = kvs_store_bytes_used(st);
  size_t big = (size_t)((1ull << 20) - before) / sizeof(uint64_t) + 1;
  uint64_t *many = calloc(big, sizeof *many);
  for (size_t i = 0; i < big; i++) many[i] = i;
  assert_int_equal(kvs_retro_record(s->retro, LAYER, 2, 3, big, many, big, &err), RA_ENOMEM);
  assert_non_null(strstr(err.msg, "memory budget exceeded"));
  assert_int_equal(kvs_store_bytes_used(st), before);
  uint64_t out[4];
  assert_int_equal(kvs_retro_unseen(s->retro, LAYER, 2, 4, 3, many, 4, out), -1);
  free(many);
  free(pos);
  /* closing the session gives the records back with everything else */
  uint8_t id[KVS_SESSION_ID_BYTES];
  memcpy(id, s->id, sizeof id);
  kvs_session_release(s);
  assert_int_equal(kvs_store_close(st, id, sizeof id, NULL, &err), RA_OK);
  assert_int_equal(kvs_store_bytes_used(st), 0);
  kvs_store_destroy(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_union_and_horizon),
      cmocka_unit_test(test_missing_record),
      cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_records_charged_to_the_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
