/* Sampler: greedy, nucleus cut-off, frequencies following the tempered softmax, determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>

#include <cmocka.h>

#include "sampler.h"

static const float vals[4] = {2.0f, 1.0f, 0.0f, -1.0f};
static const int32_t ids[4] = {40, 10, 30, 20};

static void test_greedy_and_top_p(void **state) {
  (void)state;
  ra_sampler s;
  ra_sampler_init(&s, 0.0f, 1.0f, 1);
  for (int i = 0; i < 10; i++) assert_int_equal(ra_sampler_pick(&s, vals, ids, 4), 40);
  /* p(40) = 0.64 at T = 1: top_p 0.5 keeps only it */
  ra_sampler_init(&s, 1.0f, 0.5f, 1);
  for (int i = 0; i < 100; i++) assert_int_equal(ra_sampler_pick(&s, vals, ids, 4), 40);
  /* top_p 0.85 keeps 40 and 10 (0.64 + 0.24), never 30 or 20 */
  ra_sampler_init(&s, 1.0f, 0.85f, 2);
  int seen10 = 0;
  for (int i = 0; i < 2000; i++) {
    int32_t t = ra_sampler_pick(&s, vals, ids, 4);
    assert_true(t == 40 || t == 10);
    seen10 += t == 10;
  }
  /* renormalized: 0.237 / (0.644 + 0.237) = 0.269 */
  assert_true(seen10 > 2000 * 0.22 && seen10 < 2000 * 0.32);
}

static void test_frequencies_follow_softmax(void **state) {
  (void)state;
  ra_sampler s;
  ra_sampler_init(&s, 2.0f, 1.0f, 7);
  int count[4] = {0};
  const int n = 20000;
  for (int i = 0; i < n; i++) {
    int32_t t = ra_sampler_pick(&s, vals, ids, 4);
    for (int j = 0; j < 4; j++) count[j] += t == ids[j];
  }
  double z = 0;
  for (int j = 0; j < 4; j++) z += exp(vals[j] / 2.0);
  for (int j = 0; j < 4; j++) {
    double p = exp(vals[j] / 2.0) / z, f = (double)count[j] / n;
    if (fabs(f - p) > 0.02) fail_msg("token %d: frequency %.3f, probability %.3f", ids[j], f, p);
  }
  /* the same seed gives the same sequence */
  ra_sampler a, b;
  ra_sampler_init(&a, 1.0f, 1.0f, 99);
  ra_sampler_init(&b, 1.0f, 1.0f, 99);
  for (int i = 0; i < 100; i++) assert_int_equal(ra_sampler_pick(&a, vals, ids, 4), ra_sampler_pick(&b, vals, ids, 4));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_and_top_p),
      cmocka_unit_test(test_frequencies_follow_softmax),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
