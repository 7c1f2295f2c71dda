/* The prefill's offload pipe: jobs run in push order on one thread, at most `depth` are
 * outstanding, every job is freed exactly once, and the first failure stops the rest and reaches
 * the producer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "job_pipe.h"

enum { N_JOBS = 24, DEPTH = 2 };

typedef struct counters {
  atomic_int ran, freed;
  int order[N_JOBS];
  int fail_at; /* job index that fails, -1: none */
} counters;

typedef struct job {
  counters *c;
  int index;
} job;

static job jobs[N_JOBS + 4];

static int run_job(void *arg, ra_error *err) {
  job *j = arg;
  struct timespec ts = {0, 2 * 1000 * 1000}; /* slower than the producer: the pipe fills */
  nanosleep(&ts, NULL);
  int slot = atomic_fetch_add(&j->c->ran, 1);
  j->c->order[slot] = j->index;
  if (j->index == j->c->fail_at) return ra_errorf(err, RA_EIO, "store 2 went away (job %d)", j->index);
  return RA_OK;
}

static void free_job(void *arg) {
  job *j = arg;
  atomic_fetch_add(&j->c->freed, 1);
}

static void test_runs_in_order_within_depth(void **state) {
  (void)state;
  counters c = {.fail_at = -1};
  ra_job_pipe *p;
  ra_error err;
  assert_int_equal(ra_job_pipe_start(DEPTH, &p, &err), RA_OK);
  for (int i = 0; i < N_JOBS; i++) {
    jobs[i] = (job){&c, i};
    assert_int_equal(ra_job_pipe_push(p, run_job, free_job, &jobs[i], &err), RA_OK);
    /* pushed i + 1, of which at most DEPTH not yet done */
    assert_true(i + 1 - atomic_load(&c.freed) <= DEPTH);
  }
  assert_int_equal(ra_job_pipe_finish(p, &err), RA_OK);
  assert_int_equal(atomic_load(&c.ran), N_JOBS);
  assert_int_equal(atomic_load(&c.freed), N_JOBS);
  for (int i = 0; i < N_JOBS; i++) assert_int_equal(c.order[i], i);
}

static void test_first_failure_stops_the_rest(void **state) {
  (void)state;
  counters c = {.fail_at = 3};
  ra_job_pipe *p;
  ra_error err;
  assert_int_equal(ra_job_pipe_start(DEPTH, &p, &err), RA_OK);
  int pushed = 0, refused = 0;
  for (int i = 0; i < N_JOBS + 4; i++) {
    jobs[i] = (job){&c, i};
    int rc = ra_job_pipe_push(p, run_job, free_job, &jobs[i], &err);
    if (rc == RA_OK) {
      pushed++;
      continue;
    }
    assert_int_equal(rc, RA_EIO);
    assert_non_null(strstr(err.msg, "store 2 went away (job 3)"));
    refused++;
    break; /* a producer stops at its first refused push */
  }
  assert_int_equal(refused, 1);
  memset(&err, 0, sizeof err);
  assert_int_equal(ra_job_pipe_finish(p, &err), RA_EIO);
  assert_non_null(strstr(err.msg, "job 3"));
  /* jobs 0..3 ran (3 failed), none after; every job was freed, the refused one too */
  assert_int_equal(atomic_load(&c.ran), 4);
  assert_int_equal(atomic_load(&c.freed), pushed + refused);
}

static void test_finish_without_jobs(void **state) {
  (void)state;
  ra_job_pipe *p;
  ra_error err;
  assert_int_equal(ra_job_pipe_start(1, &p, &err), RA_OK);
  assert_int_equal(ra_job_pipe_finish(p, &err), RA_OK);
  assert_int_equal(ra_job_pipe_start(0, &p, &err), RA_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_in_order_within_depth),
      cmocka_unit_test(test_first_failure_stops_the_rest),
      cmocka_unit_test(test_finish_without_jobs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
