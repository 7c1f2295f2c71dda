/* One prefill, captured so that every attention mode can start from it without running the
 * transformer again.
 *
 * Prefill is exact in every mode (only decode approximates), so a full-attention prefill on an
 * ordinary state yields everything a mode's runtime is built from: each layer's K/V of the whole
 * prompt (what the stores, the sink and the window get), the sample of prefill queries an index
 * build uses (the rule ra_prefill_query_pos, shared with ra_offload_prefill), and the last
 * token's logits. ra_offload_seed (offload.h) turns a capture into a runtime ready to decode;
 * the state the capture ran on keeps decoding as the full-attention reference. */
#ifndef RA_PREFILL_CAPTURE_H
#define RA_PREFILL_CAPTURE_H

#include "model.h"

#include <stdint.h>

typedef struct ra_prefill_capture {
  int n_layers, n_heads, n_kv_heads, head_dim, vocab;
  int64_t n;         /* prompt tokens */
  int64_t n_queries; /* sampled prefill queries per layer: min(n, build_queries) */
  float *k, *v;      /* host [n_layers, n, n_kv_heads, head_dim], post-RoPE, as the cache holds them */
  float *q;          /* host [n_layers, n_queries, n_heads, head_dim], post-RoPE, query i at
                        position ra_prefill_query_pos(n, n_queries, i) */
  float *logits;     /* host [vocab]: the last prompt token's */
  float *q_step;     /* host [n, n_heads, head_dim]: one layer's queries while capturing */
} ra_prefill_capture;

/* The position of sampled query i of n_q spread evenly over a prefill of n tokens (n_q <= n). */
static inline int64_t ra_prefill_query_pos(int64_t n, int64_t n_q, int64_t i) { return n_q == n ? i : i * n / n_q; }

/* Buffers for a prompt of n tokens and build_queries sampled queries per layer (host memory:
 * 2 n_layers n kv_row + n_layers min(n, build_queries) q_row floats, plus one layer's queries). */
int ra_prefill_capture_new(const ra_model *m, int64_t n, uint32_t build_queries, ra_prefill_capture **out,
                           ra_error *err);
void ra_prefill_capture_free(ra_prefill_capture *c);

/* Runs the prefill of tokens[0, c->n) on st (empty, max_batch >= n) with full attention, in one
 * step, capturing as it goes. Afterwards st is the full-attention state after the prompt. */
int ra_prefill_capture_run(ra_prefill_capture *c, ra_state *st, const int32_t *tokens, ra_error *err);

#endif
