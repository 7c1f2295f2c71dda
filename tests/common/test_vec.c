/* Dot, axpy and vector-matrix kernels (every set this CPU has) against a double-precision scalar loop,
 * for every dtype (int8 rows with their scale), dims with and without vector tails, and gathers by id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "half.h"
#include "status.h"
#include "vec.h"

#include <stdio.h>

#define MAXD 160
#define ROWS 37

static float frand(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / (float)(1 << 24) * 2.0f - 1.0f;
}

static void check_dtype(ra_dtype t, int dim) {
  uint32_t s = (uint32_t)dim * 31u + (uint32_t)t;
  float q[MAXD], rows32[ROWS * MAXD];
  uint8_t rows[ROWS * (MAXD * 4 + 4)];
  for (int i = 0; i < dim; i++) q[i] = frand(&s);
  for (int i = 0; i < ROWS * dim; i++) rows32[i] = frand(&s);
  assert_int_equal(ra_dtype_rows_from_fp32(t, rows32, rows, ROWS, (size_t)dim, NULL), 0);
  ra_dtype_rows_to_fp32(t, rows, rows32, ROWS, (size_t)dim); /* exact stored values */
  size_t rb = ra_dtype_row_bytes(t, (size_t)dim);

  double want[ROWS];
  for (int r = 0; r < ROWS; r++) {
    want[r] = 0.0;
    for (int i = 0; i < dim; i++) want[r] += (double)q[i] * rows32[r * dim + i];
  }
  float scores[ROWS];
  ra_vec_dot_rows(q, rows, t, dim, NULL, ROWS, scores);
  for (int r = 0; r < ROWS; r++) {
    assert_true(fabs(scores[r] - want[r]) < 1e-5 * dim);
    assert_true(ra_vec_dot(q, rows + r * rb, t, dim) == scores[r]);
  }
  uint32_t ids[5] = {36, 0, 17, 17, 5};
  ra_vec_dot_rows(q, rows, t, dim, ids, 5, scores);
  for (int i = 0; i < 5; i++) assert_true(fabs(scores[i] - want[ids[i]]) < 1e-5 * dim);

  /* The batched forms give ra_vec_dot's scores bit for bit (index builds rely on it: the graph
   * must not depend on which form ranked a candidate). */
  uint32_t ids9[9] = {36, 0, 17, 17, 5, 2, 30, 1, 8};
  float batch[9], qs[6 * MAXD];
  for (size_t n = 0; n <= 9; n++) {
    ra_vec_dot_rows4(q, rows, t, dim, ids9, n, batch);
    for (size_t i = 0; i < n; i++) assert_true(batch[i] == ra_vec_dot(q, rows + ids9[i] * rb, t, dim));
  }
  for (size_t n = 0; n <= 9; n++) {
    ra_vec_dot_rows4(q, rows, t, dim, NULL, n, batch);
    for (size_t i = 0; i < n; i++) assert_true(batch[i] == ra_vec_dot(q, rows + i * rb, t, dim));
  }
  for (int i = 0; i < 6 * dim; i++) qs[i] = frand(&s);
  for (size_t n = 0; n <= 6; n++) {
    ra_vec_dot_queries(qs, n, rows + 11 * rb, t, dim, batch);
    for (size_t i = 0; i < n; i++)
      assert_true(batch[i] == ra_vec_dot(qs + i * (size_t)dim, rows + 11 * rb, t, dim));
  }

  /* The strip forms over gathered rows: Q K^T within rounding of the exact dots for query
   * counts on and off the kernel's four and row counts on and off its two; P V bit for bit the
   * axpy calls it stands for. */
  const void *strip[9];
  for (int i = 0; i < 9; i++) strip[i] = rows + ids9[i] * rb;
  float strip_scores[6 * 9];
  for (size_t nq = 1; nq <= 6; nq++)
    for (size_t n = 0; n <= 9; n++) {
      for (size_t i = 0; i < 6 * 9; i++) strip_scores[i] = 99.0f;
      ra_vec_dot_queries_rows(qs, nq, strip, n, t, dim, strip_scores, 9);
      for (size_t j = 0; j < 6; j++)
        for (size_t r = 0; r < 9; r++) {
          if (j >= nq || r >= n) {
            assert_true(strip_scores[j * 9 + r] == 99.0f); /* nothing outside the asked block */
            continue;
          }
          double w = 0.0;
          for (int i = 0; i < dim; i++) w += (double)qs[j * (size_t)dim + i] * rows32[ids9[r] * dim + i];
          assert_true(fabs(strip_scores[j * 9 + r] - w) < 1e-5 * dim);
        }
    }
  for (size_t nq = 1; nq <= 6; nq++) {
    float got[6 * MAXD], ref[6 * MAXD];
    for (size_t i = 0; i < nq * (size_t)dim; i++) got[i] = ref[i] = frand(&s);
    ra_vec_accumulate_rows(got, nq, strip_scores, 9, strip, 9, t, dim);
    for (size_t r = 0; r < 9; r++)
      for (size_t j = 0; j < nq; j++) ra_vec_axpy(ref + j * (size_t)dim, strip_scores[j * 9 + r], strip[r], t, dim);
    assert_memory_equal(got, ref, nq * (size_t)dim * sizeof *got);
  }

  float acc[MAXD];
  for (int i = 0; i < dim; i++) acc[i] = 0.5f;
  ra_vec_axpy(acc, -2.0f, rows + 3 * rb, t, dim);
  for (int i = 0; i < dim; i++) assert_true(fabsf(acc[i] - (0.5f - 2.0f * rows32[3 * dim + i])) < 1e-6f);
}

static void test_all_dtypes_and_dims(void **state) {
  (void)state;
  const int dims[] = {1, 7, 8, 15, 16, 17, 64, 100, 128, 160};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
    for (int t = RA_DTYPE_F32; t <= RA_DTYPE_I8; t++) check_dtype((ra_dtype)t, dims[d]);
}

/* int8 rows against the fp32 rows they were quantized from: each dot within its bound
 * sum_i |q_i| * scale / 2 (every value off by at most half a step), an accumulation of rows
 * within sum_r w * scale_r / 2 per element. */
static void test_int8_dot_vs_fp32(void **state) {
  (void)state;
  const int dims[] = {8, 17, 64, 128};
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    const int dim = dims[di];
    uint32_t s = 77u + (uint32_t)dim;
    float q[MAXD], x[ROWS * MAXD], acc[MAXD], want_acc[MAXD];
    uint8_t rows[ROWS * (MAXD + 4)];
    for (int i = 0; i < dim; i++) q[i] = frand(&s) * 3.0f;
    for (int i = 0; i < ROWS * dim; i++) x[i] = frand(&s) * (1.0f + (float)(i / dim)); /* row scales differ */
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_I8, x, rows, ROWS, (size_t)dim, NULL), 0);
    const size_t rb = ra_dtype_row_bytes(RA_DTYPE_I8, (size_t)dim);
    double qabs = 0, acc_bound = 1e-5;
    for (int i = 0; i < dim; i++) qabs += fabs(q[i]);
    float scores[ROWS];
    ra_vec_dot_rows(q, rows, RA_DTYPE_I8, dim, NULL, ROWS, scores);
    for (int i = 0; i < dim; i++) acc[i] = want_acc[i] = 0.0f;
    for (int r = 0; r < ROWS; r++) {
      const float *xr = x + r * dim;
      double want = 0;
      for (int i = 0; i < dim; i++) want += (double)q[i] * xr[i];
      const double scale = ra_i8_row_scale(rows + r * rb, (size_t)dim);
      assert_true(fabs(scores[r] - want) <= qabs * scale / 2 + 1e-5 * dim);
      ra_vec_axpy(acc, 0.25f, rows + r * rb, RA_DTYPE_I8, dim);
      acc_bound += 0.25 * scale / 2;
      for (int i = 0; i < dim; i++) want_acc[i] += 0.25f * xr[i];
    }
    for (int i = 0; i < dim; i++) assert_true(fabsf(acc[i] - want_acc[i]) <= acc_bound);
  }
}

/* Q K^T over int8 rows in integer arithmetic, for dims on and off the kernels' 16 and 32, query
 * counts on and off their two and four, and row counts on and off four: the queries' halves
 * within fp32's rounding of their largest value; the scores within the fp32 strip form's bound of the
 * exact (double) dots over the stored rows; nothing written outside the asked block; and the
 * same bits from every kernel set as from the portable one. */
static void test_int8_strips(void **state) {
  (void)state;
  enum { NQ = 6, NR = 11 };
  const int dims[] = {16, 40, 64, 100, 128, 160};
  const char *set = ra_vec_kernel_name();
  uint8_t rows[NR * (MAXD + 4)];
  float x[NR * MAXD], qs[NQ * MAXD], scores[NQ * NR], ref_scores[NQ * NR], qscale[NQ];
  int16_t q16[NQ * 2 * MAXD];
  const void *strip[NR];
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    const int dim = dims[di];
    const size_t D = (size_t)dim;
    uint32_t s = 1000u + (uint32_t)dim;
    for (size_t i = 0; i < NR * D; i++) x[i] = frand(&s) * (1.0f + (float)(i / D % 5));
    assert_int_equal(ra_dtype_rows_from_fp32(RA_DTYPE_I8, x, rows, NR, D, NULL), 0);
    ra_dtype_rows_to_fp32(RA_DTYPE_I8, rows, x, NR, D); /* the stored values */
    const size_t rb = ra_dtype_row_bytes(RA_DTYPE_I8, D);
    for (size_t r = 0; r < NR; r++) strip[r] = rows + ((r * 7) % NR) * rb; /* gathered */
    for (size_t i = 0; i < NQ * D; i++) qs[i] = frand(&s) * 3.0f;
    for (size_t i = 0; i < D; i++) qs[2 * D + i] = 0.0f; /* an all-zero query */
    ra_vec_queries_to_i16(qs, NQ, dim, q16, qscale);
    assert_true(qscale[2] == 0.0f);
    for (size_t j = 0; j < NQ; j++)
      for (size_t i = 0; i < D; i++) {
        const double v = ((double)q16[2 * j * D + i] + q16[(2 * j + 1) * D + i] / 32768.0) * qscale[j];
        assert_true(fabs(v - qs[j * D + i]) <= qscale[j] * 32767.0 * 0x1p-22);
      }
    for (size_t n = 0; n <= NR; n++)
      for (size_t nq = 1; nq <= NQ; nq++) {
        for (size_t i = 0; i < NQ * NR; i++) scores[i] = ref_scores[i] = 99.0f;
        ra_vec_dot_queries_rows_i8(q16, qscale, nq, strip, n, dim, scores, NR);
        for (size_t j = 0; j < NQ; j++)
          for (size_t r = 0; r < NR; r++) {
            if (j >= nq || r >= n) {
              assert_true(scores[j * NR + r] == 99.0f); /* nothing outside the asked block */
              continue;
            }
            const float *k = x + (((const uint8_t *)strip[r] - rows) / rb) * D;
            double want = 0.0;
            for (size_t i = 0; i < D; i++) want += (double)qs[j * D + i] * k[i];
            assert_true(fabs(scores[j * NR + r] - want) < 1e-5 * dim);
          }
        /* every set gives the portable set's bits */
        assert_int_equal(ra_vec_use_kernels("portable"), RA_OK);
        ra_vec_dot_queries_rows_i8(q16, qscale, nq, strip, n, dim, ref_scores, NR);
        assert_int_equal(ra_vec_use_kernels(set), RA_OK);
        assert_memory_equal(scores, ref_scores, sizeof scores);
      }
  }
}

/* x A against a double-precision loop, for column counts with and without 64- and 8-wide tails
 * and row counts other than the column count. */
/* Every dtype: the first NaN / infinity found wherever it sits (block edges, the tail), and
 * none in finite data with large and subnormal values. */
static void test_first_nonfinite(void **state) {
  (void)state;
  enum { N = 200 };
  float x[N];
  for (int i = 0; i < N; i++) x[i] = (float)(i - 100) * 500.0f; /* within f16 range */
  x[7] = 1e-40f; /* subnormal f32 */
  for (ra_dtype t = RA_DTYPE_F32; t <= RA_DTYPE_BF16; t++) {
    float conv[N];
    uint8_t buf[N * 4 + 1];
    uint8_t *row = buf + 1; /* unaligned, as in a protobuf bytes field */
    const size_t es = ra_dtype_size(t);
    ra_dtype_from_fp32_n(t, x, conv, N);
    memcpy(row, conv, N * es);
    assert_int_equal(ra_vec_first_nonfinite(row, t, N), N);
    const size_t at[] = {0, 63, 64, 130, N - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
      for (size_t b = 0; b < 3; b++) {
        uint8_t save[4];
        memcpy(save, row + at[i] * es, es);
        float one;
        ra_dtype_from_fp32_n(t, &bad[b], &one, 1);
        memcpy(row + at[i] * es, &one, es);
        assert_int_equal(ra_vec_first_nonfinite(row, t, N), at[i]);
        memcpy(row + at[i] * es, save, es);
      }
  }
}

static void test_vecmat(void **state) {
  (void)state;
  const int shapes[][2] = {{1, 1}, {3, 7}, {16, 8}, {64, 64}, {128, 128}, {100, 72}, {7, 137}};
  static float A[160 * 160];
  float x[160], out[160];
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const int rows = shapes[k][0], cols = shapes[k][1];
    uint32_t s = (uint32_t)(rows * 1000 + cols);
    for (int i = 0; i < rows * cols; i++) A[i] = frand(&s);
    for (int j = 0; j < rows; j++) x[j] = frand(&s);
    out[cols] = 42.0f; /* the kernel writes [0, cols) only */
    ra_vec_vecmat(x, A, rows, cols, out);
    for (int c = 0; c < cols; c++) {
      double want = 0.0;
      for (int j = 0; j < rows; j++) want += (double)x[j] * A[j * cols + c];
      assert_true(fabs(out[c] - want) < 1e-5 * rows);
    }
    assert_true(out[cols] == 42.0f);
  }
}

/* The maximum wherever it sits (vector lanes, the tail, the first element), for lengths on and
 * off the vector width, negative values included. */
static void test_max(void **state) {
  (void)state;
  float x[37];
  uint32_t s = 5;
  for (size_t n = 1; n <= 37; n++)
    for (size_t at = 0; at < n; at++) {
      for (size_t i = 0; i < n; i++) x[i] = -10.0f + frand(&s);
      x[at] = -8.5f;
      assert_true(ra_vec_max(x, n) == -8.5f);
    }
}

/* exp_sum against double exp over the logit range attention sees (0 down to far below the
 * max), lengths with and without a vector tail, and arguments that must give 0. */
static void test_exp_sum(void **state) {
  (void)state;
  float x[203];
  double want_sum = 0.0, want[203];
  uint32_t s = 7;
  for (int i = 0; i < 203; i++) {
    x[i] = 40.0f * frand(&s) - 30.0f; /* shifted by 10: arguments in [-80, 0] */
    want[i] = exp((double)(x[i] - 10.0f)); /* the argument as the kernel rounds it */
    want_sum += want[i];
  }
  x[5] = -INFINITY;
  want_sum -= want[5];
  want[5] = 0.0;
  x[6] = -200.0f;
  want_sum -= want[6];
  want[6] = 0.0;
  float sum = ra_vec_exp_sum(x, 203, 10.0f);
  for (int i = 0; i < 203; i++)
    if (fabs(x[i] - want[i]) > 4e-7 * want[i] + 1e-37)
      fail_msg("exp(%g): %.9g, want %.9g", (double)i, (double)x[i], want[i]);
  assert_true(fabs(sum - want_sum) <= 1e-6 * want_sum);
  for (size_t n = 0; n < 17; n++) {
    for (size_t i = 0; i < n; i++) x[i] = -(float)i;
    float t = ra_vec_exp_sum(x, n, 0.0f);
    double w = 0.0;
    for (size_t i = 0; i < n; i++) w += exp(-(double)i);
    assert_true(fabs(t - w) <= 1e-6 * (w + 1.0));
    if (n) assert_true(x[0] == 1.0f);
  }
}

/* Every test runs once per kernel set this CPU has. */
int main(void) {
  /* Unknown names are refused; a set above the CPU's is refused as unsupported. */
  if (ra_vec_use_kernels("avx1024") != RA_EINVAL) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_dtypes_and_dims),
      cmocka_unit_test(test_int8_dot_vs_fp32),
      cmocka_unit_test(test_int8_strips),
      cmocka_unit_test(test_vecmat),
      cmocka_unit_test(test_first_nonfinite),
      cmocka_unit_test(test_exp_sum),
      cmocka_unit_test(test_max),
  };
  static const char *const sets[] = {"portable", "avx2", "avx512"};
  int failed = 0;
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
    const char *name = sets[i];
    int rc = ra_vec_use_kernels(name);
    if (rc == RA_EUNSUPPORTED) {
      printf("[ SKIPPED  ] kernel set %s: this CPU lacks it\n", name);
      continue;
    }
    if (rc != RA_OK || strcmp(ra_vec_kernel_name(), name) != 0) return 1;
    failed += cmocka_run_group_tests_name(name, tests, NULL, NULL);
  }
  return failed;
}
