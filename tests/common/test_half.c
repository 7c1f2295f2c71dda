/* fp16 / bf16 conversions: exact values, round-to-nearest-even, specials, and bulk (F16C)
 * conversions agreeing with the scalar ones bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "half.h"
#include "status.h"

static void test_fp16_exact_values(void **state) {
  (void)state;
  assert_int_equal(ra_fp32_to_fp16(1.0f), 0x3c00);
  assert_int_equal(ra_fp32_to_fp16(-2.0f), 0xc000);
  assert_int_equal(ra_fp32_to_fp16(65504.0f), 0x7bff);
  assert_int_equal(ra_fp32_to_fp16(0x1p-24f), 0x0001); /* smallest subnormal */
  assert_int_equal(ra_fp32_to_fp16(0.0f), 0x0000);
  assert_int_equal(ra_fp32_to_fp16(-0.0f), 0x8000);
  assert_true(ra_fp16_to_fp32(0x3555) == 0x1.554p-2f);
  assert_true(ra_fp16_to_fp32(0x0001) == 0x1p-24f);
  assert_true(ra_fp16_to_fp32(0x7bff) == 65504.0f);
}

static void test_fp16_rounding_and_specials(void **state) {
  (void)state;
  /* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1). */
  assert_int_equal(ra_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
  /* 1 + 3 * 2^-11 is halfway between odd 0x3c01 and even 0x3c02. */
  assert_int_equal(ra_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(ra_fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  assert_int_equal(ra_fp32_to_fp16(65520.0f), 0x7c00); /* rounds past the max: inf */
  assert_int_equal(ra_fp32_to_fp16(INFINITY), 0x7c00);
  assert_int_equal(ra_fp32_to_fp16(-INFINITY), 0xfc00);
  assert_true(isnan(ra_fp16_to_fp32(ra_fp32_to_fp16(NAN))));
  assert_true(isinf(ra_fp16_to_fp32(0x7c00)));
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(ra_fp32_to_bf16(1.0f), 0x3f80);
  assert_true(ra_bf16_to_fp32(0x3f80) == 1.0f);
  assert_true(ra_bf16_to_fp32(0xc2f7) == -123.5f);
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even. */
  assert_int_equal(ra_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(ra_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_true(isnan(ra_bf16_to_fp32(ra_fp32_to_bf16(NAN))));
  assert_int_equal(ra_fp32_to_bf16(INFINITY), 0x7f80);
}

/* Every fp16 bit pattern survives fp16 -> fp32 -> fp16 (NaNs stay NaN). */
static void test_fp16_round_trip_all(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = ra_fp16_to_fp32((ra_fp16)h);
    if (isnan(f)) {
      assert_true(isnan(ra_fp16_to_fp32(ra_fp32_to_fp16(f))));
      continue;
    }
    assert_int_equal(ra_fp32_to_fp16(f), h);
  }
}

static void test_bulk_matches_scalar(void **state) {
  (void)state;
  enum { N = 1003 }; /* not a multiple of 8: covers the vector tails */
  float src[N], back[N];
  ra_fp16 h[N];
  ra_bf16 b[N];
  uint32_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    src[i] = ldexpf((float)(x >> 8) / (float)(1 << 24) - 0.5f, (int)(x % 40) - 20);
  }
  src[0] = 65519.0f;
  src[1] = 0x1p-25f;
  ra_fp32_to_fp16_n(src, h, N);
  for (int i = 0; i < N; i++) assert_int_equal(h[i], ra_fp32_to_fp16(src[i]));
  ra_fp16_to_fp32_n(h, back, N);
  for (int i = 0; i < N; i++) assert_true(back[i] == ra_fp16_to_fp32(h[i]));
  ra_fp32_to_bf16_n(src, b, N);
  for (int i = 0; i < N; i++) assert_int_equal(b[i], ra_fp32_to_bf16(src[i]));
  ra_dtype_to_fp32_n(RA_DTYPE_BF16, b, back, N);
  for (int i = 0; i < N; i++) assert_true(back[i] == ra_bf16_to_fp32(b[i]));
  uint8_t raw[N * 4];
  ra_dtype_from_fp32_n(RA_DTYPE_F32, src, raw, N);
  assert_memory_equal(raw, src, sizeof src);
}

/* int8 rows: every value within half a step (max|x| / 254) of its source, the largest exactly
 * +-127 steps, an all-zero or tiny row zeros with scale 0, and a row with inf or NaN refused by
 * index (no silent wrong row); the scale check refuses NaN and negative scales. */
static void test_int8_round_trip(void **state) {
  (void)state;
  enum { R = 6, MAXD = 130 };
  const size_t dims[] = {1, 7, 8, 17, 64, 128, 130};
  float x[R * MAXD], back[R * MAXD];
  uint8_t q[R * (MAXD + 4)];
  uint32_t s = 9;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    const size_t dim = dims[di], rb = ra_dtype_row_bytes(RA_DTYPE_I8, dim);
    assert_int_equal(rb, dim + 4);
    for (size_t i = 0; i < R * dim; i++) {
      s = s * 1664525u + 1013904223u;
      x[i] = ((float)(s >> 8) / (float)(1 << 24) - 0.5f) * ldexpf(1.0f, (int)(i / dim) * 4 - 8);
    }
    for (size_t i = 0; i < dim; i++) x[4 * dim + i] = 0.0f;  /* row 4: zeros */
    for (size_t i = 0; i < dim; i++) x[5 * dim + i] = 1e-38f; /* row 5: below the smallest scale */
    size_t bad = 99;
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_I8, x, q, R, dim, &bad), RA_OK);
    assert_int_equal(bad, 99);
    ra_dtype_rows_to_fp32(RA_DTYPE_I8, q, back, R, dim);
    for (size_t r = 0; r < R; r++) {
      float mx = 0, scale = ra_i8_row_scale(q + r * rb, dim);
      size_t at = 0;
      for (size_t i = 0; i < dim; i++)
        if (fabsf(x[r * dim + i]) > mx) mx = fabsf(x[r * dim + (at = i)]);
      if (r >= 4) {
        assert_true(scale == 0.0f);
        for (size_t i = 0; i < dim; i++) assert_true(back[r * dim + i] == 0.0f);
        continue;
      }
      assert_true(scale == mx / 127.0f);
      assert_int_equal(abs((int8_t)q[r * rb + at]), 127);
      for (size_t i = 0; i < dim; i++) assert_true(fabsf(back[r * dim + i] - x[r * dim + i]) <= scale * 0.5f * 1.0001f);
    }
    assert_int_equal(ra_dtype_rows_check(RA_DTYPE_I8, q, R, dim, &bad), RA_OK);
    x[2 * dim + dim / 2] = INFINITY;
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_I8, x, q, R, dim, &bad), RA_EINVAL);
    assert_int_equal(bad, 2);
    x[2 * dim + dim / 2] = 0.0f;
    x[3 * dim + dim - 1] = NAN; /* the last element: a vector tail or the last lane */
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_I8, x, q, R, dim, &bad), RA_EINVAL);
    assert_int_equal(bad, 3);
    /* element dtypes keep what they keep: no refusal */
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_F16, x, back, R, dim, &bad), RA_OK);
    const float scales[2] = {NAN, -0.5f};
    for (int i = 0; i < 2; i++) {
      memcpy(q + 1 * rb + dim, &scales[i], sizeof(float));
      assert_int_equal(ra_dtype_rows_check(RA_DTYPE_I8, q, R, dim, &bad), RA_EINVAL);
      assert_int_equal(bad, 1);
    }
  }
}

static void test_dtype_names(void **state) {
  (void)state;
  ra_dtype t;
  assert_int_equal(ra_dtype_parse("bf16", &t), RA_OK);
  assert_int_equal(t, RA_DTYPE_BF16);
  assert_int_equal(ra_dtype_parse("fp8", &t), RA_EINVAL);
  assert_int_equal(ra_dtype_size(RA_DTYPE_F32), 4);
  assert_int_equal(ra_dtype_size(RA_DTYPE_F16), 2);
  assert_int_equal(ra_dtype_size((ra_dtype)9), 0);
  assert_string_equal(ra_dtype_name(RA_DTYPE_F16), "f16");
  assert_int_equal(ra_dtype_parse("int8", &t), RA_OK);
  assert_int_equal(t, RA_DTYPE_I8);
  assert_int_equal(ra_dtype_size(RA_DTYPE_I8), 0); /* not an element dtype */
  assert_int_equal(ra_dtype_row_bytes(RA_DTYPE_I8, 64), 68);
  assert_int_equal(ra_dtype_row_bytes(RA_DTYPE_BF16, 64), 128);
  assert_int_equal(ra_dtype_row_bytes((ra_dtype)9, 64), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp16_exact_values),   cmocka_unit_test(test_fp16_rounding_and_specials),
      cmocka_unit_test(test_bf16),                cmocka_unit_test(test_fp16_round_trip_all),
      cmocka_unit_test(test_bulk_matches_scalar), cmocka_unit_test(test_dtype_names),
      cmocka_unit_test(test_int8_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
