/* Saved contexts (gpu-worker generate --save-context FILE, then --context FILE): a generation's
 * state kept so that a later worker continues it without prefill.
 *
 * Where it lives: the stores keep their sessions (the worker leaves them open; a store with
 * --data-dir keeps them across restarts, and --session-idle-timeout still ends them, so run
 * those stores with 0 or a long one), with their K/V, indexes and clusters. FILE, on the
 * worker's disk, holds the worker's part, little-endian:
 *     magic "RACTX01\0" | u32 n_layers, n_q_heads, n_kv_heads, head_dim, vocab
 *     | u32 mode, n_sink, n_window, kv_dtype, store_dtype, top_k, ring_rows, n_stores
 *     | i64 position (tokens in the context) | i32 next token (sampled, not yet fed)
 *     | per store: addr[128], session id[16], u64 rows it acknowledged
 *     | per layer: the device ring's K then V, fp32 [ring_rows, n_kv_heads, head_dim]
 *     | u32 crc32 of everything before it
 * Reopening checks the model geometry, the mode and its parameters and the store list against
 * the file, reattaches each session (the store must hold exactly the rows acknowledged),
 * uploads the ring and feeds the saved next token as the first decode step: a greedy
 * continuation is then the one the first run would have made. (Sampling restarts from --seed.)
 * Wave mode keeps its meta-index on the worker and is not saved. */
#ifndef RA_CONTEXT_H
#define RA_CONTEXT_H

#include "offload.h"
#include "remote.h"
#include "status.h"

#include <stdint.h>

typedef struct ra_context {
  uint32_t n_layers, n_q_heads, n_kv_heads, head_dim, vocab;
  uint32_t mode, n_sink, n_window, kv_dtype, store_dtype, top_k, ring_rows, n_stores;
  int64_t position;
  int32_t next_token;
  char (*addrs)[128];          /* [n_stores] */
  ra_remote_session *sessions; /* [n_stores] */
  float *ring;                 /* [n_layers][2][ring_rows, n_kv_heads, head_dim] */
} ra_context;

/* Writes FILE from a runtime whose generation stopped with `next_token` sampled and not fed; the
 * caller then closes the runtime with ra_remote_keep_sessions so the stores keep the sessions.
 * Written to FILE.tmp, then renamed: a reader never sees half of it. */
int ra_context_save(const char *path, ra_offload *o, const ra_offload_config *cfg, int32_t next_token,
                    ra_error *err);
/* Reads and checks (magic, sizes, crc) FILE. */
int ra_context_read(const char *path, ra_context *out, ra_error *err);
/* RA_OK when the runtime about to be built (model geometry, cfg, the plan's stores in order)
 * matches the saved context; else RA_EINVAL naming the first difference. */
int ra_context_check(const ra_context *c, const ra_model_config *m, const ra_offload_config *cfg,
                     const ra_offload_plan *plan, ra_error *err);
/* Uploads the ring into a runtime opened with cfg.resume = c->sessions and sets its position. */
int ra_context_restore(const ra_context *c, ra_offload *o, ra_error *err);
void ra_context_free(ra_context *c);

#endif
