/* The clocks: the wall clock never goes back, and a thread's CPU clock advances by the work it
 * does and not while it sleeps (what the stores' counters rely on to tell a search's cost from
 * the time its thread waited for a core). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <time.h>

#include "clock.h"

/* Arithmetic until this thread has used 20 ms of CPU or 5 s of wall time went by (a clock that
 * does not count work); returns the wall seconds it took. */
static double spin_20ms_cpu(void) {
  volatile double x = 1.0;
  const double w0 = ra_clock_now_s();
  const uint64_t c0 = ra_clock_thread_cpu_us();
  while (ra_clock_thread_cpu_us() - c0 < 20000 && ra_clock_now_s() - w0 < 5.0) x = x * 1.0000001 + 1e-9;
  return ra_clock_now_s() - w0;
}

static void test_wall_clock_is_monotonic_in_both_units(void **state) {
  (void)state;
  uint64_t prev_us = ra_clock_now_us();
  double prev_s = ra_clock_now_s();
  for (int i = 0; i < 100000; i++) {
    uint64_t us = ra_clock_now_us();
    double s = ra_clock_now_s();
    assert_true(us >= prev_us);
    assert_true(s >= prev_s);
    prev_us = us;
    prev_s = s;
  }
  /* the same clock: seconds and microseconds agree to within a millisecond */
  double s = ra_clock_now_s();
  uint64_t us = ra_clock_now_us();
  assert_true((double)us / 1e6 - s < 1e-3 && s - (double)us / 1e6 < 1e-3);
}

static void test_thread_cpu_counts_work_not_sleep(void **state) {
  (void)state;
  uint64_t c0 = ra_clock_thread_cpu_us();
  double p0 = ra_clock_process_cpu_s();
  struct timespec nap = {0, 50 * 1000 * 1000};
  nanosleep(&nap, NULL);
  uint64_t slept = ra_clock_thread_cpu_us() - c0;
  assert_true(slept < 20000); /* 50 ms asleep: well under 20 ms of CPU */
  c0 = ra_clock_thread_cpu_us();
  double t0 = ra_clock_thread_cpu_s();
  double wall = spin_20ms_cpu();
  uint64_t worked = ra_clock_thread_cpu_us() - c0;
  assert_true(worked >= 20000);
  assert_true(ra_clock_thread_cpu_s() - t0 >= 0.02);
  assert_true(wall >= (double)worked / 1e6 - 1e-3); /* one thread: no more CPU than wall time */
  /* the process's CPU time includes this thread's */
  assert_true(ra_clock_process_cpu_s() - p0 >= (double)worked / 1e6 - 1e-3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wall_clock_is_monotonic_in_both_units),
      cmocka_unit_test(test_thread_cpu_counts_work_not_sleep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
