#include "bench_time.h"

#include <stdlib.h>

int ra_bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double ra_bench_pct(const double *sorted, int n, double p) {
  double i = p * (n - 1);
  int lo = (int)i;
  int hi = lo + 1 < n ? lo + 1 : lo;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (i - lo);
}

int ra_bench_time_op(ra_cuda_timer *tm, ra_backend *be, ra_bench_op fn, void *ctx, double *us, ra_error *err) {
  enum { kSamples = 20, kReps = 10 };
  double t[kSamples];
  int rc;
  for (int i = 0; i < 3; i++)
    if ((rc = fn(be, ctx, err))) return rc;
  for (int s = 0; s < kSamples; s++) {
    float ms = 0.0f;
    if ((rc = ra_cuda_timer_start(tm, err))) return rc;
    for (int r = 0; r < kReps; r++)
      if ((rc = fn(be, ctx, err))) return rc;
    if ((rc = ra_cuda_timer_stop(tm, &ms, err))) return rc;
    t[s] = ms * 1e3 / kReps;
  }
  qsort(t, kSamples, sizeof(double), ra_bench_cmp_double);
  *us = ra_bench_pct(t, kSamples, 0.5);
  return RA_OK;
}
