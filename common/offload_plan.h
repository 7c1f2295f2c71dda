/* The offload plan: how a context's tokens are split between the worker's device memory and
 * the kv-stores, derived from the shard map and the sink/window sizes.
 *
 * At context length n, positions [0, S) (sink) and [max(S, n - W), n) (window) stay on the
 * device; the offloaded positions [S, n - W) live in the stores, each (layer, kv head, position)
 * at the store the shard map names. Decoding one token moves position n - W out of the window
 * and into its store (when n - W >= S), so the three sets never overlap and always cover [0, n).
 *
 * Per decode step and layer, the worker asks every store that owns any offloaded token of that
 * layer for the q heads whose kv head it owns; a kv head split by token range across stores is
 * asked of each, and their partials merge like any others. */
#ifndef RA_OFFLOAD_PLAN_H
#define RA_OFFLOAD_PLAN_H

#include "shardmap.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_plan_shard {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t token_begin; /* absolute positions, >= n_sink */
  uint64_t token_end;   /* exclusive; RA_TOKEN_END_OPEN when the shard takes appends */
} ra_plan_shard;

/* What one store holds and is asked. */
typedef struct ra_plan_store {
  const char *addr;        /* points into the shard map */
  ra_plan_shard *shards;   /* sorted by (layer, kv_head, token_begin) */
  size_t n_shards;
  uint32_t *q_heads;       /* [n_layers][n_q_heads]: 1 if asked for (layer, q head) */
  uint32_t *n_asked;       /* [n_layers]: q heads asked per layer (0: store not used there) */
} ra_plan_store;

typedef struct ra_offload_plan {
  uint32_t n_layers, n_q_heads, n_kv_heads;
  uint32_t n_sink, n_window;
  ra_plan_store *stores; /* one per store of the shard map, in its order */
  size_t n_stores;
  const ra_shard_map *map;
  /* The rules covering each (layer, kv head), by token_begin: rules [head_rule_off[i],
   * head_rule_off[i + 1]) of head_rules (indices into map->rules), i = layer * n_kv_heads + g. */
  uint32_t *head_rule_off;
  uint32_t *head_rules;
  uint32_t max_owners; /* the most owners of any rule (1: no replicas) */
} ra_offload_plan;

/* Validates the map against the geometry (every position of every (layer, kv head) has exactly
 * one owner) and builds the plan. The map must outlive the plan. */
int ra_offload_plan_build(const ra_shard_map *map, uint32_t n_layers, uint32_t n_q_heads,
                          uint32_t n_kv_heads, uint32_t n_sink, uint32_t n_window,
                          ra_offload_plan *out, ra_error *err);
void ra_offload_plan_free(ra_offload_plan *p);

/* The partition itself, for any sink S and window W (streaming mode has no stores, hence no plan):
 * the offloaded positions [*begin, *end) at context length n (empty when n <= S + W), and the
 * position that leaves the window when the context grows from n to n + 1 (-1: none). */
void ra_partition_offloaded(uint32_t n_sink, uint32_t n_window, uint64_t n, uint64_t *begin, uint64_t *end);
int64_t ra_partition_evicted(uint32_t n_sink, uint32_t n_window, uint64_t n);

/* The offloaded positions [*begin, *end) at context length n (empty when n <= S + W). */
void ra_offload_plan_range(const ra_offload_plan *p, uint64_t n, uint64_t *begin, uint64_t *end);

/* The position that leaves the window when the context grows from n to n + 1, or -1 when none
 * does (the context still fits in sink + window). */
int64_t ra_offload_plan_evicted(const ra_offload_plan *p, uint64_t n);

/* The store owning (layer, kv head, position), as an index into p->stores. */
int ra_offload_plan_owner(const ra_offload_plan *p, uint32_t layer, uint32_t kv_head, uint64_t pos);

/* The rule owning (layer, kv head, position), or NULL. */
const ra_shard_rule *ra_offload_plan_rule(const ra_offload_plan *p, uint32_t layer, uint32_t kv_head, uint64_t pos);

/* An attend's choice of owners at `layer`: for every q head h, asked[s * n_q_heads + h] = 1 when
 * store s is asked for it, for each rule of h's kv head its first owner that down[] does not
 * mark (down: [n_stores], NULL: none down). asked: [n_stores, n_q_heads]. Returns RA_OK, or
 * RA_EUNAVAIL naming the first (layer, kv head) whose rule has no live owner. */
int ra_offload_plan_choose(const ra_offload_plan *p, uint32_t layer, const uint8_t *down, uint8_t *asked,
                           ra_error *err);

/* RA_OK when every rule of the map still has an owner down[] does not mark, else RA_EUNAVAIL
 * naming one that has none. */
int ra_offload_plan_covered(const ra_offload_plan *p, const uint8_t *down, ra_error *err);

/* 1 if store s holds tokens of q head h's kv head at layer l (it is asked for it when it is
 * the chosen owner; index builds go to every store holding it). */
static inline int ra_offload_plan_asks(const ra_offload_plan *p, size_t s, uint32_t layer, uint32_t q_head) {
  return (int)p->stores[s].q_heads[(size_t)layer * p->n_q_heads + q_head];
}

#endif
