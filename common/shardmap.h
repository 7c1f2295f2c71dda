/* Shard map: which kv-store owns which (layer, kv head, token range).
 *
 * Text format, one rule per line, '#' starts a comment:
 *     # store            layers   kv_heads   tokens
 *     127.0.0.1:7001     0-15     *          0-
 *     127.0.0.1:7002     16-31    0-3        *
 *     10.0.0.7:7000      16-31    4-7        0-65535
 *     10.0.0.8:7000      16-31    4-7        65536-
 *     10.0.0.9:7000,10.0.0.10:7000  0-31  *  0-     # two replicas of these shards
 * Ranges are inclusive ("a-b"), a single number, "*" (everything) or open-ended ("a-").
 * A valid map gives every token position of every (layer, kv head) exactly one rule; a rule
 * names one to RA_SHARD_MAX_REPLICAS distinct owners (comma-separated), each holding a copy of
 * its shards: writes go to every owner, an attend to one. Where a (layer, kv head) has a
 * replicated rule, no store may own two of its rules: an attend asks a store for a q head
 * and the store answers over all of that kv head's tokens it holds, so each owner must hold
 * exactly one rule's range there for any choice of one owner per rule to count every token
 * once. */
#ifndef RA_SHARDMAP_H
#define RA_SHARDMAP_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_ADDR_MAX 128
#define RA_TOKEN_END_OPEN UINT64_MAX
#define RA_SHARD_MAX_REPLICAS 8

typedef struct ra_shard_rule {
  uint32_t store;                /* the first owner: index into ra_shard_map.stores */
  uint32_t owners[RA_SHARD_MAX_REPLICAS]; /* every owner, owners[0] == store, distinct */
  uint32_t n_owners;             /* >= 1 */
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

/* Gives every rule of a spread map R owners: its own store and the next R - 1 of the store
 * list, round-robin (so a (layer, kv head) served by store i is also held by i + 1, ...).
 * R must be 1 to min(n_stores, RA_SHARD_MAX_REPLICAS). */
int ra_shard_map_replicate(ra_shard_map *map, uint32_t replicas, ra_error *err);

/* The same from a comma-separated list "HOST:PORT,HOST:PORT,..." (the --stores flag); an empty
 * entry is an error. */
int ra_shard_map_spread_list(const char *stores_csv, uint32_t n_layers, uint32_t n_kv_heads,
                             ra_shard_map *out, ra_error *err);

/* Checks the map against a geometry: ranges in bounds, and every (layer, kv head) token axis
 * [0, inf) covered exactly once (no gap, no overlap), and the replica rule above. */
int ra_shard_map_validate(const ra_shard_map *map, uint32_t n_layers, uint32_t n_kv_heads,
                          ra_error *err);

/* The rule owning (layer, head, token), or NULL. */
const ra_shard_rule *ra_shard_map_find(const ra_shard_map *map, uint32_t layer, uint32_t head,
                                       uint64_t token);

void ra_shard_map_free(ra_shard_map *map);

#endif
