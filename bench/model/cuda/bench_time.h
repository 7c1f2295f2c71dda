/* Timing helpers shared by the CUDA benchmarks: ops timed alone with event timing, and the
 * order statistics their results report. */
#ifndef RA_BENCH_TIME_H
#define RA_BENCH_TIME_H

#include "backend.h"
#include "backend_cuda.h"

/* qsort comparator of doubles, ascending */
int ra_bench_cmp_double(const void *a, const void *b);
/* The p-quantile (0..1) of n sorted values, interpolated. */
double ra_bench_pct(const double *sorted, int n, double p);

/* One op alone: microseconds per call, the median of 20 samples of 10 back-to-back calls after
 * 3 warm-up calls, so that launch gaps are amortized as they are inside a decode step. */
typedef int (*ra_bench_op)(ra_backend *be, void *ctx, ra_error *err);
int ra_bench_time_op(ra_cuda_timer *tm, ra_backend *be, ra_bench_op fn, void *ctx, double *us, ra_error *err);

#endif
