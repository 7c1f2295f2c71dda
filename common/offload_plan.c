#include "offload_plan.h"

#include <stdlib.h>
#include <string.h>

void ra_offload_plan_free(ra_offload_plan *p) {
  for (size_t s = 0; s < p->n_stores; s++) {
    free(p->stores[s].shards);
    free(p->stores[s].q_heads);
    free(p->stores[s].n_asked);
  }
  free(p->stores);
  free(p->head_rule_off);
  free(p->head_rules);
  memset(p, 0, sizeof *p);
}

static int cmp_shard(const void *a, const void *b) {
  const ra_plan_shard *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->kv_head != y->kv_head) return x->kv_head < y->kv_head ? -1 : 1;
  return x->token_begin < y->token_begin ? -1 : x->token_begin > y->token_begin;
}

/* Clips [begin, end) to the offloadable positions [S, inf): positions below S are sink tokens
 * and never leave the device. Returns 0 when nothing is left. */
static int clip_to_offload(uint64_t *begin, uint64_t end, uint32_t n_sink) {
  if (*begin < n_sink) *begin = n_sink;
  return end == RA_TOKEN_END_OPEN || *begin < end;
}

static int store_add_rule(ra_offload_plan *p, ra_plan_store *st, const ra_shard_rule *r) {
  uint32_t lhi = r->layer_hi < p->n_layers ? r->layer_hi : p->n_layers - 1;
  uint32_t hhi = r->head_hi < p->n_kv_heads ? r->head_hi : p->n_kv_heads - 1;
  uint32_t group = p->n_q_heads / p->n_kv_heads;
  for (uint32_t l = r->layer_lo; l <= lhi; l++) {
    for (uint32_t g = r->head_lo; g <= hhi; g++) {
      uint64_t begin = r->token_begin;
      if (!clip_to_offload(&begin, r->token_end, p->n_sink)) continue;
      ra_plan_shard *sh = realloc(st->shards, (st->n_shards + 1) * sizeof *sh);
      if (!sh) return RA_ENOMEM;
      st->shards = sh;
      sh[st->n_shards++] = (ra_plan_shard){l, g, begin, r->token_end};
      for (uint32_t h = g * group; h < (g + 1) * group; h++) {
        uint32_t *asked = &st->q_heads[(size_t)l * p->n_q_heads + h];
        if (!*asked) st->n_asked[l]++;
        *asked = 1;
      }
    }
  }
  return RA_OK;
}

/* head_rule_off / head_rules: the rules of each (layer, kv head), by token_begin. */
static int index_head_rules(ra_offload_plan *p) {
  const ra_shard_map *map = p->map;
  size_t n_heads = (size_t)p->n_layers * p->n_kv_heads, total = 0;
  p->head_rule_off = calloc(n_heads + 1, sizeof *p->head_rule_off);
  if (!p->head_rule_off) return RA_ENOMEM;
  for (uint32_t l = 0; l < p->n_layers; l++)
    for (uint32_t g = 0; g < p->n_kv_heads; g++) {
      p->head_rule_off[(size_t)l * p->n_kv_heads + g] = (uint32_t)total;
      for (size_t i = 0; i < map->n_rules; i++) {
        const ra_shard_rule *r = &map->rules[i];
        total += l >= r->layer_lo && l <= r->layer_hi && g >= r->head_lo && g <= r->head_hi;
      }
    }
  p->head_rule_off[n_heads] = (uint32_t)total;
  p->head_rules = malloc((total ? total : 1) * sizeof *p->head_rules);
  if (!p->head_rules) return RA_ENOMEM;
  for (uint32_t l = 0; l < p->n_layers; l++)
    for (uint32_t g = 0; g < p->n_kv_heads; g++) {
      size_t at = p->head_rule_off[(size_t)l * p->n_kv_heads + g], n = 0;
      for (size_t i = 0; i < map->n_rules; i++) {
        const ra_shard_rule *r = &map->rules[i];
        if (!(l >= r->layer_lo && l <= r->layer_hi && g >= r->head_lo && g <= r->head_hi)) continue;
        /* insertion by token_begin: a kv head has a handful of rules */
        size_t j = n++;
        for (; j > 0 && map->rules[p->head_rules[at + j - 1]].token_begin > r->token_begin; j--)
          p->head_rules[at + j] = p->head_rules[at + j - 1];
        p->head_rules[at + j] = (uint32_t)i;
      }
    }
  return RA_OK;
}

/* The first owner of r that down[] does not mark, or -1. */
static int live_owner(const ra_shard_rule *r, const uint8_t *down) {
  for (uint32_t j = 0; j < r->n_owners; j++)
    if (!down || !down[r->owners[j]]) return (int)r->owners[j];
  return -1;
}

int ra_offload_plan_choose(const ra_offload_plan *p, uint32_t layer, const uint8_t *down, uint8_t *asked,
                           ra_error *err) {
  uint32_t group = p->n_q_heads / p->n_kv_heads;
  memset(asked, 0, p->n_stores * p->n_q_heads);
  for (uint32_t g = 0; g < p->n_kv_heads; g++) {
    size_t i = (size_t)layer * p->n_kv_heads + g;
    for (uint32_t k = p->head_rule_off[i]; k < p->head_rule_off[i + 1]; k++) {
      const ra_shard_rule *r = &p->map->rules[p->head_rules[k]];
      if (r->token_end != RA_TOKEN_END_OPEN && r->token_end <= p->n_sink) continue; /* sink only: never offloaded */
      int s = live_owner(r, down);
      if (s < 0)
        return ra_errorf(err, RA_EUNAVAIL, "layer %u kv head %u: every owner of tokens %llu- is down", layer, g,
                         (unsigned long long)r->token_begin);
      memset(asked + (size_t)s * p->n_q_heads + (size_t)g * group, 1, group);
    }
  }
  return RA_OK;
}

int ra_offload_plan_covered(const ra_offload_plan *p, const uint8_t *down, ra_error *err) {
  for (size_t i = 0; i < p->map->n_rules; i++) {
    const ra_shard_rule *r = &p->map->rules[i];
    if (r->token_end != RA_TOKEN_END_OPEN && r->token_end <= p->n_sink) continue; /* never offloaded */
    if (live_owner(r, down) < 0)
      return ra_errorf(err, RA_EUNAVAIL, "shard map rule %zu (layers %u-%u, kv heads %u-%u): every owner is down",
                       i + 1, r->layer_lo, r->layer_hi, r->head_lo, r->head_hi);
  }
  return RA_OK;
}

int ra_offload_plan_build(const ra_shard_map *map, uint32_t n_layers, uint32_t n_q_heads,
                          uint32_t n_kv_heads, uint32_t n_sink, uint32_t n_window,
                          ra_offload_plan *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if (n_layers == 0 || n_kv_heads == 0 || n_q_heads % n_kv_heads != 0)
    return ra_errorf(err, RA_EINVAL, "geometry: %u layers, %u q heads, %u kv heads is not a GQA model",
                     n_layers, n_q_heads, n_kv_heads);
  int rc = ra_shard_map_validate(map, n_layers, n_kv_heads, err);
  if (rc != RA_OK) return rc;
  *out = (ra_offload_plan){.n_layers = n_layers, .n_q_heads = n_q_heads, .n_kv_heads = n_kv_heads,
                           .n_sink = n_sink, .n_window = n_window, .map = map};
  out->stores = calloc(map->n_stores, sizeof *out->stores);
  if (!out->stores) return ra_errorf(err, RA_ENOMEM, "offload plan: out of memory");
  out->n_stores = map->n_stores;
  for (size_t s = 0; s < map->n_stores; s++) {
    ra_plan_store *st = &out->stores[s];
    st->addr = map->stores[s];
    st->q_heads = calloc((size_t)n_layers * n_q_heads, sizeof *st->q_heads);
    st->n_asked = calloc(n_layers, sizeof *st->n_asked);
    if (!st->q_heads || !st->n_asked) rc = RA_ENOMEM;
  }
  for (size_t i = 0; i < map->n_rules && rc == RA_OK; i++) {
    const ra_shard_rule *r = &map->rules[i];
    for (uint32_t j = 0; j < r->n_owners && rc == RA_OK; j++)
      rc = store_add_rule(out, &out->stores[r->owners[j]], r);
    if (r->n_owners > out->max_owners) out->max_owners = r->n_owners;
  }
  if (rc == RA_OK) rc = index_head_rules(out);
  if (rc != RA_OK) {
    ra_offload_plan_free(out);
    return ra_errorf(err, RA_ENOMEM, "offload plan: out of memory");
  }
  for (size_t s = 0; s < out->n_stores; s++)
    if (out->stores[s].n_shards > 1) /* a store may own nothing offloaded: shards is NULL */
      qsort(out->stores[s].shards, out->stores[s].n_shards, sizeof(ra_plan_shard), cmp_shard);
  return RA_OK;
}

void ra_partition_offloaded(uint32_t n_sink, uint32_t n_window, uint64_t n, uint64_t *begin, uint64_t *end) {
  *begin = n_sink;
  *end = n > (uint64_t)n_sink + n_window ? n - n_window : n_sink;
}

int64_t ra_partition_evicted(uint32_t n_sink, uint32_t n_window, uint64_t n) {
  /* Growing to n + 1 tokens moves position n + 1 - W - 1 = n - W out of the window. */
  if (n < (uint64_t)n_window || n - n_window < n_sink) return -1;
  return (int64_t)(n - n_window);
}

void ra_offload_plan_range(const ra_offload_plan *p, uint64_t n, uint64_t *begin, uint64_t *end) {
  ra_partition_offloaded(p->n_sink, p->n_window, n, begin, end);
}

int64_t ra_offload_plan_evicted(const ra_offload_plan *p, uint64_t n) {
  return ra_partition_evicted(p->n_sink, p->n_window, n);
}

const ra_shard_rule *ra_offload_plan_rule(const ra_offload_plan *p, uint32_t layer, uint32_t kv_head, uint64_t pos) {
  return ra_shard_map_find(p->map, layer, kv_head, pos);
}

int ra_offload_plan_owner(const ra_offload_plan *p, uint32_t layer, uint32_t kv_head, uint64_t pos) {
  const ra_shard_rule *r = ra_offload_plan_rule(p, layer, kv_head, pos);
  return r ? (int)r->store : -1;
}
