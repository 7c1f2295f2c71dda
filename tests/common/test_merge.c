/* Partial attention and its log-sum-exp merge: splitting a token set any way and merging the
 * parts gives the partial over the whole set; the empty partial is the identity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <math.h>

#include "merge.h"

#define DIM 24

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 4.0f - 2.0f;
}

/* Softmax attention in double, as written in textbooks. */
static void direct(const float *q, const float *k, const float *v, size_t n, double *o) {
  double z[256], m = -INFINITY, l = 0.0, scale = 1.0 / sqrt((double)DIM);
  for (size_t i = 0; i < n; i++) {
    z[i] = 0.0;
    for (int j = 0; j < DIM; j++) z[i] += (double)q[j] * k[i * DIM + j];
    z[i] *= scale;
    if (z[i] > m) m = z[i];
  }
  for (int j = 0; j < DIM; j++) o[j] = 0.0;
  for (size_t i = 0; i < n; i++) {
    double w = exp(z[i] - m);
    l += w;
    for (int j = 0; j < DIM; j++) o[j] += w * v[i * DIM + j];
  }
  for (int j = 0; j < DIM; j++) o[j] /= l;
}

static void test_partial_matches_direct(void **state) {
  (void)state;
  uint64_t s = 1;
  float q[DIM], k[200 * DIM], v[200 * DIM], o[DIM];
  for (int j = 0; j < DIM; j++) q[j] = frand(&s);
  for (int i = 0; i < 200 * DIM; i++) k[i] = frand(&s), v[i] = frand(&s);
  ra_partial p = {.o = o};
  ra_partial_attend_f32(q, k, v, 200, DIM, 1.0f / sqrtf(DIM), &p);
  double want[DIM];
  direct(q, k, v, 200, want);
  for (int j = 0; j < DIM; j++) assert_true(fabs(o[j] - want[j]) < 1e-6);
  assert_true(p.l >= 1.0f && p.l <= 200.0f); /* the max term contributes exactly 1 */
}

static void test_split_and_merge_any_way(void **state) {
  (void)state;
  uint64_t s = 7;
  float q[DIM], k[256 * DIM], v[256 * DIM];
  for (int j = 0; j < DIM; j++) q[j] = 3.0f * frand(&s);
  for (int i = 0; i < 256 * DIM; i++) k[i] = frand(&s), v[i] = frand(&s);
  double want[DIM];
  direct(q, k, v, 256, want);
  const size_t cuts[][4] = {{0, 1, 255, 256}, {0, 100, 200, 256}, {0, 0, 128, 256}, {0, 256, 256, 256}};
  for (size_t c = 0; c < 4; c++) {
    float acc_o[DIM], part_o[DIM];
    ra_partial acc = {.o = acc_o};
    ra_partial_reset(&acc, DIM);
    /* merge the parts in reverse order: the merge is order-independent */
    for (int p = 2; p >= 0; p--) {
      size_t b = cuts[c][p], e = cuts[c][p + 1];
      ra_partial part = {.o = part_o};
      ra_partial_attend_f32(q, k + b * DIM, v + b * DIM, e - b, DIM, 1.0f / sqrtf(DIM), &part);
      ra_partial_merge(&acc, part.o, part.m, part.l, DIM);
    }
    for (int j = 0; j < DIM; j++) assert_true(fabs(acc_o[j] - want[j]) < 1e-5);
  }
}

static void test_empty_is_identity(void **state) {
  (void)state;
  float o[DIM], e[DIM];
  for (int j = 0; j < DIM; j++) o[j] = (float)j;
  ra_partial acc = {.o = o, .m = 2.0f, .l = 3.0f};
  ra_partial empty = {.o = e};
  ra_partial_reset(&empty, DIM);
  assert_true(isinf(empty.m) && empty.m < 0 && empty.l == 0.0f && e[5] == 0.0f);
  ra_partial_merge(&acc, empty.o, empty.m, empty.l, DIM);
  assert_true(acc.m == 2.0f && acc.l == 3.0f && o[5] == 5.0f);
  ra_partial_merge(&empty, o, 2.0f, 3.0f, DIM);
  assert_true(empty.m == 2.0f && empty.l == 3.0f && e[5] == 5.0f);
}

/* Far-apart maxima must not overflow: exp is only ever taken of differences <= 0. */
static void test_large_logits_stay_finite(void **state) {
  (void)state;
  float a[1] = {1.0f}, b[1] = {-1.0f};
  ra_partial acc = {.o = a, .m = 1000.0f, .l = 1.0f};
  ra_partial_merge(&acc, b, 1000.0f + logf(3.0f), 1.0f, 1);
  /* weights 1 and 3: o = (1 - 3) / 4 */
  assert_true(fabsf(a[0] + 0.5f) < 1e-5f);
  assert_true(fabsf(acc.l - 4.0f / 3.0f) < 1e-5f);
  ra_partial_merge(&acc, b, -1000.0f, 5.0f, 1);
  assert_true(isfinite(a[0]) && fabsf(a[0] + 0.5f) < 1e-5f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partial_matches_direct),
      cmocka_unit_test(test_split_and_merge_any_way),
      cmocka_unit_test(test_empty_is_identity),
      cmocka_unit_test(test_large_logits_stay_finite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
