/* The serve command's view of its kv-stores for /health and /metrics: one client per store,
 * Health and Stats on demand (each client used under the module's lock). */
#ifndef RA_SERVE_STORES_H
#define RA_SERVE_STORES_H

#include "offload_plan.h"
#include "serve_metrics.h"

#include <stddef.h>

typedef struct ra_serve_stores ra_serve_stores;

/* plan: NULL (no stores: always healthy). Connects lazily. */
int ra_serve_stores_new(const ra_offload_plan *plan, ra_serve_stores **out);
void ra_serve_stores_free(ra_serve_stores *s);
/* 1 when every store answers Health as serving; else 0 with the first failing store's
 * address and reason in why. */
int ra_serve_stores_healthy(ra_serve_stores *s, char *why, size_t why_len);
/* Every store's Stats into m->store_bytes / m->store_up. */
void ra_serve_stores_metrics(ra_serve_stores *s, ra_serve_metrics *m);

#endif
