/* Shard map: which kv-store owns which (layer, kv head, token range).
 *
 * Text format, one rule per line, '#' starts a comment:
 *     # store            layers   kv_heads   tokens
 *     127.0.0.1:7001     0-15     *          0-
 *     127.0.0.1:7002     16-31    0-3        *
 *     10.0.0.7:7000      16-31    4-7        0-65535
 *     10.0.0.8:7000      16-31    4-7        65536-
 * Ranges are inclusive ("a-b"), a single number, "*" (everything) or open-ended ("a-").
 * A valid map gives every token position of every (layer, kv head) exactly one owner. */
#ifndef RA_SHARDMAP_H
#define RA_SHARDMAP_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_ADDR_MAX 128
#define RA_TOKEN_END_OPEN UINT64_MAX

typedef struct ra_shard_rule {
  uint32_t store;                /* index into ra_shard_map.stores */
  uint32_t layer_lo, layer_hi;   /* inclusive */
  uint32_t head_lo, head_hi;     /* inclusive */
  uint64_t token_begin;          /* inclusive */
  uint64_t token_end;            /* exclusive; RA_TOKEN_END_OPEN when open-ended */
} ra_shard_rule;

typedef struct ra_shard_map {
  char (*stores)[RA_ADDR_MAX]; /* distinct store addresses, in order of first appearance */
  size_t n_stores;
  ra_shard_rule *rules;
  size_t n_rules;
} ra_shard_map;

/* Parses the text format; on error names the line and what is wrong. */
int ra_shard_map_parse(const char *text, ra_shard_map *out, ra_error *err);
int ra_shard_map_load(const char *path, ra_shard_map *out, ra_error *err);

/* A map for "--stores A,B,C": (layer, kv head) pairs dealt round-robin, whole token axes. */
int ra_shard_map_spread(const char *const *stores, size_t n_stores, uint32_t n_layers,
                        uint32_t n_kv_heads, ra_shard_map *out, ra_error *err);

/* The same from a comma-separated list "HOST:PORT,HOST:PORT,..." (the --stores flag); an empty
 * entry is an error. */
int ra_shard_map_spread_list(const char *stores_csv, uint32_t n_layers, uint32_t n_kv_heads,
                             ra_shard_map *out, ra_error *err);

/* Checks the map against a geometry: ranges in bounds, and every (layer, kv head) token axis
 * [0, inf) covered exactly once (no gap, no overlap). */
int ra_shard_map_validate(const ra_shard_map *map, uint32_t n_layers, uint32_t n_kv_heads,
                          ra_error *err);

/* The rule owning (layer, head, token), or NULL. */
const ra_shard_rule *ra_shard_map_find(const ra_shard_map *map, uint32_t layer, uint32_t head,
                                       uint64_t token);

void ra_shard_map_free(ra_shard_map *map);

#endif
