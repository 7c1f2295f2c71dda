/* The wave buffer (gpu-worker/wave_buffer.h) on the CPU backend: a hit's rows attended on the
 * device equal the exact partial over those rows (ra_partial_attend_f32), a kv head without hits
 * gets the empty partial, eviction takes the least recently hit cluster, a cluster larger than
 * the buffer is never held, and pages freed by evictions are reused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "half.h"
#include "merge.h"
#include "wave_buffer.h"

#include "cpu_fixture.h"

enum { HQ = 4, HKV = 2, HD = 8, IDS = 10 };

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static void test_hits_attend_exactly_and_lru_evicts(void **state) {
  (void)state;
  ra_error err;
  ra_wave_buffer *b;
  /* 2 clusters of 8 rows: 2 pages, 16 rows per kv head */
  ok(ra_wave_buffer_new(be, 1, HQ, HKV, HD, RA_DTYPE_F32, IDS, 2, 8, &b, &err), &err);
  assert_int_equal(ra_wave_buffer_rows(b), 16);
  uint64_t s = 3;
  float k[20 * HD], v[20 * HD], q[HQ * HD];
  for (int i = 0; i < 20 * HD; i++) k[i] = frand(&s), v[i] = frand(&s);
  for (int i = 0; i < HQ * HD; i++) q[i] = frand(&s);
  /* kv head 0: cluster 3 (rows 0-4 of k), cluster 4 (rows 5-12) */
  ok(ra_wave_buffer_install(b, 0, 0, 3, k, v, 5, &err), &err);
  ok(ra_wave_buffer_install(b, 0, 0, 4, k + 5 * HD, v + 5 * HD, 8, &err), &err);
  /* staged, not written yet: no hit, and no other layer's installs meanwhile */
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 4), 0);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 1, 3), 0);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 4), 1);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 3), 1);
  ra_tensor qt;
  int64_t qs[2] = {HQ, HD};
  ok(ra_tensor_new(be, &qt, RA_DTYPE_F32, 2, qs, &err), &err);
  ok(be->ops->upload(be, &qt, 0, q, HQ * HD, &err), &err);
  const ra_tensor *o, *ml;
  uint64_t rows;
  const float scale = 1.0f / sqrtf(HD);
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_non_null(o);
  assert_int_equal(rows, 13);
  float go[HQ * HD], gml[HQ * 2];
  ok(be->ops->download(be, o, 0, go, HQ * HD, &err), &err);
  ok(be->ops->download(be, ml, 0, gml, HQ * 2, &err), &err);
  for (int h = 0; h < 2; h++) { /* kv head 0's q heads: rows 0-12 (order does not matter) */
    float ro[HD];
    ra_partial want = {.o = ro};
    ra_partial_attend_f32(q + h * HD, k, v, 13, HD, scale, &want);
    assert_float_equal(gml[2 * h], want.m, 1e-5);
    assert_float_equal(gml[2 * h + 1], want.l, 1e-4);
    for (int d = 0; d < HD; d++) assert_float_equal(go[h * HD + d], ro[d], 1e-5);
  }
  for (int h = 2; h < 4; h++) { /* kv head 1 hit nothing */
    assert_true(isinf(gml[2 * h]) && gml[2 * h] < 0);
    assert_float_equal(gml[2 * h + 1], 0.0f, 0.0f);
  }
  /* the lists were cleared: nothing hit since */
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_null(o);
  assert_int_equal(rows, 0);
  /* 4 was hit before 3: installing 5 (8 rows, one page) evicts 4 */
  ok(ra_wave_buffer_install(b, 0, 0, 5, k + 12 * HD, v + 12 * HD, 8, &err), &err);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 4), 0);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 3), 1);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 5), 1);
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_int_equal(rows, 13);
  ok(be->ops->download(be, o, 0, go, HQ * HD, &err), &err);
  ok(be->ops->download(be, ml, 0, gml, HQ * 2, &err), &err);
  {
    float kk[13 * HD], vv[13 * HD], ro[HD];
    memcpy(kk, k, 5 * HD * sizeof(float));
    memcpy(vv, v, 5 * HD * sizeof(float));
    memcpy(kk + 5 * HD, k + 12 * HD, 8 * HD * sizeof(float));
    memcpy(vv + 5 * HD, v + 12 * HD, 8 * HD * sizeof(float));
    ra_partial want = {.o = ro};
    ra_partial_attend_f32(q, kk, vv, 13, HD, scale, &want);
    assert_float_equal(gml[0], want.m, 1e-5);
    for (int d = 0; d < HD; d++) assert_float_equal(go[d], ro[d], 1e-5);
  }
  /* 17 rows never fit (nothing installed, nothing evicted); 16 take both pages */
  ok(ra_wave_buffer_install(b, 0, 0, 6, k, v, 17, &err), &err);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 6), 0);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 5), 1);
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_int_equal(rows, 8);
  ok(ra_wave_buffer_install(b, 0, 0, 7, k, v, 16, &err), &err);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 3) + ra_wave_buffer_hit(b, 0, 0, 5), 0);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 7), 1);
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_int_equal(rows, 16);
  assert_int_equal(ra_wave_buffer_install(b, 0, 0, IDS, k, v, 1, &err), RA_EINVAL);
  ra_tensor_free(&qt);
  ra_wave_buffer_free(b);
}

/* Installs of one step are staged and written in one scatter: a cluster a later install of the
 * same batch evicts is dropped from it (its pages then hold the later rows, exactly), another
 * layer cannot install meanwhile, and a discarded batch leaves nothing held. */
static void test_staged_batches(void **state) {
  (void)state;
  ra_error err;
  ra_wave_buffer *b;
  ok(ra_wave_buffer_new(be, 2, HQ, HKV, HD, RA_DTYPE_F16, IDS, 2, 8, &b, &err), &err);
  uint64_t s = 11;
  float k[40 * HD], v[40 * HD], q[HQ * HD];
  for (int i = 0; i < 40 * HD; i++) k[i] = frand(&s), v[i] = frand(&s);
  for (int i = 0; i < HQ * HD; i++) q[i] = frand(&s);
  /* 3 and 4 fill kv head 1's two pages; 5 then evicts 3 within the batch */
  ok(ra_wave_buffer_install(b, 1, 1, 3, k, v, 8, &err), &err);
  ok(ra_wave_buffer_install(b, 1, 1, 4, k + 8 * HD, v + 8 * HD, 8, &err), &err);
  ok(ra_wave_buffer_install(b, 1, 1, 5, k + 16 * HD, v + 16 * HD, 8, &err), &err);
  assert_int_equal(ra_wave_buffer_install(b, 0, 1, 6, k, v, 8, &err), RA_ESTATE);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 1, 1, 3), 0);
  assert_int_equal(ra_wave_buffer_hit(b, 1, 1, 4) + ra_wave_buffer_hit(b, 1, 1, 5), 2);
  ra_tensor qt;
  int64_t qs[2] = {HQ, HD};
  ok(ra_tensor_new(be, &qt, RA_DTYPE_F32, 2, qs, &err), &err);
  ok(be->ops->upload(be, &qt, 0, q, HQ * HD, &err), &err);
  const ra_tensor *o, *ml;
  uint64_t rows;
  const float scale = 1.0f / sqrtf(HD);
  ok(ra_wave_buffer_attend(b, 1, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_int_equal(rows, 16);
  float go[HQ * HD], gml[HQ * 2], kk[16 * HD], vv[16 * HD], ro[HD];
  ok(be->ops->download(be, o, 0, go, HQ * HD, &err), &err);
  ok(be->ops->download(be, ml, 0, gml, HQ * 2, &err), &err);
  for (int i = 0; i < 16 * HD; i++) /* the f16 rows the buffer holds */
    kk[i] = ra_fp16_to_fp32(ra_fp32_to_fp16(k[8 * HD + i])), vv[i] = ra_fp16_to_fp32(ra_fp32_to_fp16(v[8 * HD + i]));
  ra_partial want = {.o = ro};
  ra_partial_attend_f32(q + 2 * HD, kk, vv, 16, HD, scale, &want);
  assert_float_equal(gml[4], want.m, 1e-5);
  for (int d = 0; d < HD; d++) assert_float_equal(go[2 * HD + d], ro[d], 1e-5);
  /* a discarded batch: nothing held, the pages free again */
  ok(ra_wave_buffer_install(b, 0, 0, 7, k, v, 16, &err), &err);
  ra_wave_buffer_discard(b);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 7), 0);
  ok(ra_wave_buffer_install(b, 0, 0, 8, k, v, 16, &err), &err);
  ok(ra_wave_buffer_commit(b, &err), &err);
  assert_int_equal(ra_wave_buffer_hit(b, 0, 0, 8), 1);
  ok(ra_wave_buffer_attend(b, 0, &qt, scale, &o, &ml, &rows, &err), &err);
  assert_int_equal(rows, 16);
  ra_tensor_free(&qt);
  ra_wave_buffer_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hits_attend_exactly_and_lru_evicts),
      cmocka_unit_test(test_staged_batches),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
