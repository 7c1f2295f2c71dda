/* One AttendBatch message per store for the attends of several remotes (remote.h): a batched
 * decode step runs one ra_remote per sequence, each with sessions of its own at the same stores,
 * and without this every sequence sends every store a request of its own per layer.
 *
 *   ra_remote_batch *b;  ra_remote_batch_new(&b, &err);
 *   per step, per group of sequences:
 *     per sequence:  ra_remote_attend_via(r_i, b);  ra_remote_attend_begin*(r_i, ...);  // staged here
 *     ra_remote_batch_send(b);             // each store: one message with every staged request
 *     per sequence:  ra_remote_attend_end*(r_i, ...);  // its partials, from its stores' replies
 *   ra_remote_batch_end_step(b);
 *
 * The batch keeps its own connection and AttendBatch stream per store address (opened at the
 * first request for it, with the credentials of the remote that staged it: the sessions' own, so
 * the store lets them in). A store's failure (its send, its reply, a timeout) fails the requests
 * of its messages in flight, and each remote handles that as a failure of its own stream: its
 * heads go to another owner or the remote fails (remote.h); the batch closes the connection and
 * opens a fresh one for the next step. One thread uses a batch at a time. */
#ifndef RA_REMOTE_BATCH_H
#define RA_REMOTE_BATCH_H

#include "client.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_remote_batch ra_remote_batch;

int ra_remote_batch_new(ra_remote_batch **out, ra_error *err);
void ra_remote_batch_free(ra_remote_batch *b);

/* Sends every store its staged requests, one message each. A store whose send fails has that
 * failure returned to each of the message's requests when they are taken. */
void ra_remote_batch_send(ra_remote_batch *b);

/* Ends a step: drops what was staged and not sent and the replies taken; a store with a message
 * whose reply nobody took (its sequences failed meanwhile) gets a fresh stream. */
void ra_remote_batch_end_step(ra_remote_batch *b);

/* Messages sent and requests carried since ra_remote_batch_new (for tests and reports). */
void ra_remote_batch_counts(const ra_remote_batch *b, uint64_t *messages, uint64_t *requests);

/* ---- for remote.c ---- */

/* Where a staged request's reply will be: store, message of the step, item in it. */
typedef struct ra_remote_batch_ticket {
  size_t store, msg, item;
} ra_remote_batch_ticket;

/* Stages req of session s for the store at addr (connected with opt when new); req and what it
 * points to must stay valid until ra_remote_batch_send. */
int ra_remote_batch_stage(ra_remote_batch *b, const char *addr, const ra_kvclient_options *opt,
                          const ra_kvclient_session *s, const ra_kvclient_attend_req *req, ra_remote_batch_ticket *t,
                          ra_error *err);
/* The request's partials (out [req->n_heads]), receiving its message's reply if it has not come
 * yet (timeout_ms for each reply awaited); the request's own error, or its store's. */
int ra_remote_batch_take(ra_remote_batch *b, const ra_remote_batch_ticket *t, const ra_kvclient_session *s,
                         const ra_kvclient_attend_req *req, ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                         ra_error *err);

#endif
