/* Top-k heap against a full sort, with ties, k = 0, k > n, and reuse after reset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <math.h>

#include "status.h"
#include "topk.h"

typedef struct pair {
  float score;
  uint32_t id;
} pair;

static int by_score_desc_id_asc(const void *a, const void *b) {
  const pair *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static void check_against_sort(size_t n, size_t k, int levels, uint32_t seed) {
  pair *all = malloc(n * sizeof *all);
  ra_topk t;
  assert_int_equal(ra_topk_init(&t, k), RA_OK);
  uint32_t x = seed;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    /* few distinct levels make many ties */
    all[i] = (pair){.score = (float)((x >> 8) % (uint32_t)levels), .id = (uint32_t)i};
    ra_topk_push(&t, all[i].score, all[i].id);
  }
  qsort(all, n, sizeof *all, by_score_desc_id_asc);
  size_t want = k < n ? k : n;
  assert_int_equal(t.n, want);
  if (want == k && k > 0) assert_true(ra_topk_threshold(&t) == all[k - 1].score);
  ra_topk_sort(&t);
  for (size_t i = 0; i < want; i++) {
    assert_true(t.score[i] == all[i].score);
    assert_int_equal(t.id[i], all[i].id);
  }
  ra_topk_free(&t);
  free(all);
}

static void test_matches_sort(void **state) {
  (void)state;
  check_against_sort(10000, 100, 1 << 20, 1);
  check_against_sort(10000, 100, 7, 2); /* heavy ties: lower ids win */
  check_against_sort(50, 100, 1000, 3); /* k > n */
  check_against_sort(1, 1, 10, 4);
}

static void test_zero_k_and_reset(void **state) {
  (void)state;
  ra_topk t;
  assert_int_equal(ra_topk_init(&t, 0), RA_OK);
  ra_topk_push(&t, 1.0f, 1);
  assert_int_equal(t.n, 0);
  assert_true(isinf(ra_topk_threshold(&t)));
  ra_topk_free(&t);

  assert_int_equal(ra_topk_init(&t, 2), RA_OK);
  assert_true(isinf(ra_topk_threshold(&t)) && ra_topk_threshold(&t) < 0);
  ra_topk_push(&t, 5.0f, 9);
  ra_topk_push(&t, 1.0f, 8);
  ra_topk_push(&t, 3.0f, 7);
  ra_topk_sort(&t);
  assert_int_equal(t.id[0], 9);
  assert_int_equal(t.id[1], 7);
  ra_topk_reset(&t);
  ra_topk_push(&t, -1.0f, 1);
  assert_int_equal(t.n, 1);
  assert_int_equal(t.id[0], 1);
  ra_topk_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_sort),
      cmocka_unit_test(test_zero_k_and_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
