/* ra_offload_key_top_queries (the roar build's key -> query lists, offload.h) on the CPU backend
 * against a brute force over the margins q.k - thr[q]: in every key's list the queries are in
 * order and none left out beats the last one taken (to float tolerance: the backend's sgemm sums
 * in another order than the double loop here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "offload.h"

#include "cpu_fixture.h"

static double margin(const float *k, const float *q, double thr, int hd) {
  double d = 0;
  for (int i = 0; i < hd; i++) d += (double)k[i] * q[i];
  return d - thr;
}

/* keys [n, hd] as the backend tensor the key lists read */
static ra_tensor keys_tensor(const float *k, int64_t n, int64_t hd) {
  ra_tensor t = {0};
  int64_t shape[2] = {n, hd};
  ra_error err;
  if (ra_tensor_new(be, &t, RA_DTYPE_F32, 2, shape, &err) || be->ops->upload(be, &t, 0, k, (size_t)(n * hd), &err))
    fail_msg("%s", err.msg);
  return t;
}

/* n keys, nq queries of dimension hd, lists of t, computed in chunks of `chunk` keys. */
static void check_lists(int n, int nq, int hd, int t, int64_t chunk) {
  uint64_t seed = 7;
  float *k = malloc((size_t)n * hd * sizeof *k), *q = malloc((size_t)nq * hd * sizeof *q);
  float *thr = malloc((size_t)nq * sizeof *thr);
  uint32_t *out = malloc((size_t)n * t * sizeof *out);
  for (int i = 0; i < n * hd; i++) k[i] = frand(&seed);
  for (int i = 0; i < nq * hd; i++) q[i] = frand(&seed);
  for (int i = 0; i < nq; i++) thr[i] = 2.0f * frand(&seed);
  ra_error err;
  ra_tensor kt = keys_tensor(k, n, hd);
  int rc = ra_offload_key_top_queries(be, &kt, RA_DTYPE_F32, q, thr, nq, t, chunk, out, &err);
  ra_tensor_free(&kt);
  if (rc) fail_msg("%s", err.msg);
  const int have = t < nq ? t : nq;
  uint8_t *taken = malloc((size_t)nq);
  for (int i = 0; i < n; i++) {
    const uint32_t *row = out + (size_t)i * t;
    memset(taken, 0, (size_t)nq);
    double last = INFINITY;
    for (int u = 0; u < have; u++) {
      assert_true(row[u] < (uint32_t)nq);
      assert_false(taken[row[u]]);
      taken[row[u]] = 1;
      const double m = margin(k + (size_t)i * hd, q + (size_t)row[u] * hd, thr[row[u]], hd);
      assert_true(m <= last + 1e-4);
      last = m;
    }
    for (int u = have; u < t; u++) assert_int_equal(row[u], RA_KVCLIENT_NO_QUERY);
    for (int j = 0; j < nq; j++)
      if (!taken[j]) assert_true(margin(k + (size_t)i * hd, q + (size_t)j * hd, thr[j], hd) <= last + 1e-4);
  }
  free(taken);
  free(k);
  free(q);
  free(thr);
  free(out);
}

static void test_lists_are_the_best_margins(void **state) {
  (void)state;
  check_lists(300, 97, 16, 4, 0);
}

/* several chunks, the last one short */
static void test_chunks_give_the_same_lists(void **state) {
  (void)state;
  check_lists(301, 64, 8, 3, 50);
}

/* fewer queries than the list length: the rest is padding */
static void test_short_lists_are_padded(void **state) {
  (void)state;
  check_lists(40, 2, 8, 5, 0);
}

static void test_bad_arguments_are_refused(void **state) {
  (void)state;
  float k[8] = {0}, q[8] = {0}, thr[1] = {0};
  uint32_t out[8];
  ra_error err;
  ra_tensor kt = keys_tensor(k, 1, 8), none = ra_tensor_rows(&kt, 0, 0);
  assert_int_equal(ra_offload_key_top_queries(be, &kt, RA_DTYPE_F32, q, thr, 1, 0, 0, out, &err), RA_EINVAL);
  assert_int_equal(ra_offload_key_top_queries(be, &kt, RA_DTYPE_F32, q, thr, 0, 2, 0, out, &err), RA_EINVAL);
  assert_int_equal(ra_offload_key_top_queries(be, &none, RA_DTYPE_F32, q, thr, 1, 2, 0, out, &err), RA_OK);
  ra_tensor_free(&kt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lists_are_the_best_margins),
      cmocka_unit_test(test_chunks_give_the_same_lists),
      cmocka_unit_test(test_short_lists_are_padded),
      cmocka_unit_test(test_bad_arguments_are_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
