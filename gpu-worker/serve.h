/* gpu-worker serve: the OpenAI-compatible HTTP server (libmicrohttpd, a thread per
 * connection) in front of the scheduler (serve_sched.h).
 *   POST /v1/completions, POST /v1/chat/completions   (stream: Server-Sent Events)
 *   GET /v1/models, GET /health, GET /metrics
 * Runs until SIGTERM or SIGINT: then new requests get 503, running ones finish (at most
 * drain_timeout_ms), and it returns. */
#ifndef RA_SERVE_H
#define RA_SERVE_H

#include "serve_sched.h"
#include "serve_stores.h"

#include <stddef.h>

typedef struct ra_serve_config {
  const char *listen;     /* HOST:PORT (port 0: any free one) */
  const char *ready_file; /* optional: the bound HOST:PORT is written here once serving */
  const char *model_name; /* the id clients name */
  size_t max_body;        /* request bodies above this get 413 */
  int max_conns;          /* connections at once */
  int drain_timeout_ms;
  size_t weight_bytes;    /* the model's weights on the device (a metric) */
  ra_sched_config sched;  /* its metrics pointer is filled by ra_serve_run */
} ra_serve_config;

int ra_serve_run(const ra_serve_config *cfg, ra_error *err);

#endif
