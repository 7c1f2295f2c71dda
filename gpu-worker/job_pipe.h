/* A bounded, ordered queue of jobs run by one background thread.
 *
 * The prefill hands each layer's offload (its KV to the stores, the stores' index builds) to a
 * pipe, so that the device computes layer l + 1 while layer l travels. Jobs run one at a time, in
 * the order they were pushed; push blocks while `depth` jobs are waiting or running, which bounds
 * the host memory the jobs hold. The first failing job's error is kept: later jobs are not run
 * (only freed), and push and finish return that error, so the producer stops at its next push.
 *
 *   ra_job_pipe *p;
 *   ra_job_pipe_start(2, &p, err);
 *   for (...) if ((rc = ra_job_pipe_push(p, run_layer, free_layer, job, err))) break;
 *   rc2 = ra_job_pipe_finish(p, rc ? NULL : err);   (waits for the queued jobs, frees p)
 */
#ifndef RA_JOB_PIPE_H
#define RA_JOB_PIPE_H

#include "status.h"

typedef struct ra_job_pipe ra_job_pipe;

/* Runs a job on the pipe's thread; RA_OK or an error (with err filled). */
typedef int (*ra_job_run_fn)(void *job, ra_error *err);
/* Releases a job, run or not. */
typedef void (*ra_job_free_fn)(void *job);

/* depth >= 1: jobs queued or running at once. RA_ENOMEM / RA_EINTERNAL when the thread cannot
 * be started. */
int ra_job_pipe_start(int depth, ra_job_pipe **out, ra_error *err);
/* Queues job (the pipe owns it from here: free_fn is called exactly once, also on failure).
 * Blocks while the pipe is full. Returns the first failure of an earlier job, if any, in which
 * case job is freed without running. */
int ra_job_pipe_push(ra_job_pipe *p, ra_job_run_fn run, ra_job_free_fn free_fn, void *job, ra_error *err);
/* Waits until every queued job has run (or been dropped after a failure), stops the thread and
 * frees the pipe. Returns the first failure (err, when not NULL, gets its message). */
int ra_job_pipe_finish(ra_job_pipe *p, ra_error *err);

#endif
