#include "job_pipe.h"

#include <stdlib.h>
#include <uv.h>

typedef struct pipe_job {
  ra_job_run_fn run;
  ra_job_free_fn free_fn;
  void *job;
} pipe_job;

struct ra_job_pipe {
  uv_thread_t thread;
  uv_mutex_t mu;
  uv_cond_t changed; /* a job was queued or finished, or the pipe is closing */
  pipe_job *ring;    /* [depth] */
  int depth, head, count; /* count: queued + running */
  int closing;
  int rc; /* the first failure */
  ra_error err;
};

static void pipe_main(void *arg) {
  ra_job_pipe *p = arg;
  uv_mutex_lock(&p->mu);
  for (;;) {
    while (p->count == 0 && !p->closing) uv_cond_wait(&p->changed, &p->mu);
    if (p->count == 0) break; /* closing and drained */
    pipe_job j = p->ring[p->head];
    int failed = p->rc != RA_OK;
    uv_mutex_unlock(&p->mu);
    /* run outside the lock: the producer keeps pushing while a job runs */
    ra_error err;
    int rc = RA_OK;
    if (!failed) rc = j.run(j.job, &err);
    j.free_fn(j.job);
    uv_mutex_lock(&p->mu);
    if (rc != RA_OK && p->rc == RA_OK) {
      p->rc = rc;
      p->err = err;
    }
    p->head = (p->head + 1) % p->depth;
    p->count--;
    uv_cond_broadcast(&p->changed);
  }
  uv_mutex_unlock(&p->mu);
}

int ra_job_pipe_start(int depth, ra_job_pipe **out, ra_error *err) {
  *out = NULL;
  if (depth < 1) return ra_errorf(err, RA_EINVAL, "job pipe: depth %d", depth);
  ra_job_pipe *p = calloc(1, sizeof *p);
  pipe_job *ring = calloc((size_t)depth, sizeof *ring);
  if (!p || !ring) {
    free(p);
    free(ring);
    return ra_errorf(err, RA_ENOMEM, "job pipe: out of memory");
  }
  p->ring = ring;
  p->depth = depth;
  if (uv_mutex_init(&p->mu) != 0) {
    free(ring);
    free(p);
    return ra_errorf(err, RA_EINTERNAL, "job pipe: cannot create a mutex");
  }
  if (uv_cond_init(&p->changed) != 0) {
    uv_mutex_destroy(&p->mu);
    free(ring);
    free(p);
    return ra_errorf(err, RA_EINTERNAL, "job pipe: cannot create a condition variable");
  }
  int e = uv_thread_create(&p->thread, pipe_main, p);
  if (e != 0) {
    uv_cond_destroy(&p->changed);
    uv_mutex_destroy(&p->mu);
    free(ring);
    free(p);
    return ra_errorf(err, RA_EINTERNAL, "job pipe: cannot start its thread: %s", uv_strerror(e));
  }
  *out = p;
  return RA_OK;
}

int ra_job_pipe_push(ra_job_pipe *p, ra_job_run_fn run, ra_job_free_fn free_fn, void *job, ra_error *err) {
  uv_mutex_lock(&p->mu);
  while (p->count == p->depth && p->rc == RA_OK) uv_cond_wait(&p->changed, &p->mu);
  int rc = p->rc;
  if (rc != RA_OK) {
    if (err) *err = p->err;
    uv_mutex_unlock(&p->mu);
    free_fn(job);
    return rc;
  }
  p->ring[(p->head + p->count) % p->depth] = (pipe_job){run, free_fn, job};
  p->count++;
  uv_cond_broadcast(&p->changed);
  uv_mutex_unlock(&p->mu);
  return RA_OK;
}

int ra_job_pipe_finish(ra_job_pipe *p, ra_error *err) {
  uv_mutex_lock(&p->mu);
  p->closing = 1;
  uv_cond_broadcast(&p->changed);
  uv_mutex_unlock(&p->mu);
  uv_thread_join(&p->thread);
  int rc = p->rc;
  if (rc != RA_OK && err) *err = p->err;
  uv_cond_destroy(&p->changed);
  uv_mutex_destroy(&p->mu);
  free(p->ring);
  free(p);
  return rc;
}
