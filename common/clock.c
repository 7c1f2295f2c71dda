#include "clock.h"

#include <time.h>

/* 0 if the clock cannot be read (it always can on Linux for these ids). */
static struct timespec read_clock(clockid_t id) {
  struct timespec ts = {0, 0};
  if (clock_gettime(id, &ts) != 0) ts = (struct timespec){0, 0};
  return ts;
}

static uint64_t to_us(struct timespec ts) {
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t to_ns(struct timespec ts) { return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec; }

static double to_s(struct timespec ts) { return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec; }

uint64_t ra_clock_now_us(void) { return to_us(read_clock(CLOCK_MONOTONIC)); }
uint64_t ra_clock_now_ns(void) { return to_ns(read_clock(CLOCK_MONOTONIC)); }
double ra_clock_now_s(void) { return to_s(read_clock(CLOCK_MONOTONIC)); }
uint64_t ra_clock_thread_cpu_us(void) { return to_us(read_clock(CLOCK_THREAD_CPUTIME_ID)); }
double ra_clock_thread_cpu_s(void) { return to_s(read_clock(CLOCK_THREAD_CPUTIME_ID)); }
double ra_clock_process_cpu_s(void) { return to_s(read_clock(CLOCK_PROCESS_CPUTIME_ID)); }
