/* The serve scheduler: one engine thread owns the model and steps every running sequence
 * together (continuous batching); HTTP threads submit requests and wait for their text.
 *
 * A step: requests queued since the last step join (each takes a cached context whose tokens
 * are a prefix of its prompt, or a fresh one), then
 *   - full mode: every decoding sequence's next token and the prefilling sequences' next
 *     prompt chunks (up to `prefill_chunk` tokens per step in all) go through one batched
 *     forward (batch.h): the weights are read once for the whole step;
 *   - an offload mode: each sequence has its own runtime (offload.h: its device ring and its
 *     store sessions); one prefill advances by a piece (prefill_chunk tokens' worth of rows of
 *     layers, within a layer for a long prompt) and every decoding sequence's next token goes
 *     through one batched decode step (ra_offload_decode_batch: the weights read once, the
 *     ring attention batched, one AttendBatch message per store and layer).
 * then each sequence whose input is consumed samples its next token, and finished sequences
 * leave. A finished sequence's context (its KV, at the stores too) is kept for reuse, up to
 * `max_cached` contexts and `cache_ttl_s` idle, evicted least recently used (its store
 * sessions closed). Reuse: full mode takes the longest common prefix of a cached context and
 * the prompt (at most the prompt minus its last token, which is fed again for its logits);
 * offload modes take a cached context only when all of it is a prefix of the prompt (the
 * stores' shards cannot be truncated), and feed the rest one token per step. Only finished
 * contexts are shared, never a running one. A request whose fresh context finds no device
 * memory (the device's, or `kv_budget`) after the idle contexts are freed waits, in order, until
 * a running sequence ends, rather than failing. */
#ifndef RA_SERVE_SCHED_H
#define RA_SERVE_SCHED_H

#include "model.h"
#include "offload.h"
#include "serve_metrics.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

#define RA_SCHED_MAX_STOP 4
#define RA_SCHED_MAX_STOP_LEN 256

typedef struct ra_sched_config {
  const ra_model *m;
  const ra_tokenizer *tok;
  ra_offload_config off;        /* mode RA_MODE_FULL: batched full attention on the device */
  const ra_offload_plan *plan;  /* the stores (offload modes but streaming), else NULL */
  int max_seqs;                 /* sequences running at once; more are refused (429) */
  int64_t max_ctx;              /* prompt + generated tokens of a sequence */
  int64_t prefill_chunk;        /* prompt tokens per step: full mode, all sequences together;
                                   offload modes, a prefill runs prefill_chunk * n_layers
                                   rows of layers per step (a layer over n tokens is n rows)
                                   while others decode */
  int max_cached;               /* idle contexts kept; 0: no reuse */
  size_t kv_budget;             /* device bytes the contexts (running and cached) may hold; 0:
                                   the device's memory. A request whose fresh context does not
                                   fit waits for a running sequence to end; one that fits in no
                                   case fails (503) */
  double cache_ttl_s;           /* an idle context older than this is freed */
  ra_dtype kv_dtype;
  int top_k;                    /* candidates when sampling */
  int attend_batch;             /* offload modes: the step's store requests as AttendBatch
                                   messages (offload.h ra_offload_decode_batch) */
  ra_serve_metrics *metrics;
} ra_sched_config;

typedef struct ra_sched_params {
  int max_tokens;     /* >= 1 */
  float temperature;  /* 0: greedy */
  float top_p;
  uint64_t seed;
  int n_stop;
  char stop[RA_SCHED_MAX_STOP][RA_SCHED_MAX_STOP_LEN + 1];
} ra_sched_params;

typedef struct ra_sched ra_sched;
typedef struct ra_sched_req ra_sched_req;

/* What a waiter sees of a request. */
typedef struct ra_sched_view {
  size_t visible;          /* bytes of text that can be sent (no partial UTF-8 or stop prefix) */
  int done;                /* finished: finish_reason or an error */
  const char *finish;      /* "stop" | "length" when done without error */
  int err_code;            /* RA_E* when the request failed */
  char err_msg[RA_ERROR_MSG_MAX];
  size_t prompt_tokens, completion_tokens, cached_tokens;
} ra_sched_view;

int ra_sched_new(const ra_sched_config *cfg, ra_sched **out, ra_error *err);
/* Stops the engine (running requests fail with RA_ECANCELED) and frees every context. */
void ra_sched_free(ra_sched *s);

/* Queues a request for the prompt's tokens (copied). RA_EINVAL: prompt + max_tokens exceed the
 * context or the prompt is empty; RA_EUNAVAIL: max_seqs sequences are live; RA_ECANCELED:
 * draining. On success *out is the caller's until ra_sched_release. */
int ra_sched_submit(ra_sched *s, const int32_t *prompt, size_t n_prompt, const ra_sched_params *p, ra_sched_req **out,
                    ra_error *err);
/* Waits until more text than `seen` bytes is visible or the request is done, at most
 * timeout_ms; fills *v and returns the text (valid until release; bytes [0, v->visible)). */
const char *ra_sched_wait(ra_sched_req *r, size_t seen, int timeout_ms, ra_sched_view *v);
/* The client went away: the sequence stops at the next step and its context is freed (not
 * cached). */
void ra_sched_cancel(ra_sched_req *r);
/* Drops the caller's reference (cancels the request if it is still running). */
void ra_sched_release(ra_sched_req *r);

/* Refuses new requests from now on and waits until every live one has finished (at most
 * timeout_ms; 0 if they did, RA_ETIMEDOUT otherwise). */
int ra_sched_drain(ra_sched *s, int timeout_ms);
/* Sequences running or queued. */
int ra_sched_live(ra_sched *s);

#endif
