#include "shardmap.h"

#include "textfile.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses "a", "a-b", "a-" or "*" into [lo, hi] (inclusive; "a-" and "*" give hi = max). */
static int parse_range(const char *s, uint64_t max, uint64_t *lo, uint64_t *hi) {
  if (strcmp(s, "*") == 0) {
    *lo = 0;
    *hi = max;
    return RA_OK;
  }
  char *end;
  if (!isdigit((unsigned char)s[0])) return RA_EINVAL;
  errno = 0;
  unsigned long long a = strtoull(s, &end, 10);
  if (errno) return RA_EINVAL;
  unsigned long long b = a;
  if (*end == '-') {
    const char *t = end + 1;
    if (*t == '\0') {
      b = max;
    } else {
      if (!isdigit((unsigned char)t[0])) return RA_EINVAL;
      b = strtoull(t, &end, 10);
      if (errno || *end) return RA_EINVAL;
    }
  } else if (*end) {
    return RA_EINVAL;
  }
  if (b < a || a > max) return RA_EINVAL;
  *lo = a;
  *hi = b;
  return RA_OK;
}

static int map_add_store(ra_shard_map *m, const char *addr, uint32_t *index) {
  for (size_t i = 0; i < m->n_stores; i++) {
    if (strcmp(m->stores[i], addr) == 0) {
      *index = (uint32_t)i;
      return RA_OK;
    }
  }
  char(*s)[RA_ADDR_MAX] = realloc(m->stores, (m->n_stores + 1) * sizeof *s);
  if (!s) return RA_ENOMEM;
  m->stores = s;
  snprintf(m->stores[m->n_stores], RA_ADDR_MAX, "%s", addr);
  *index = (uint32_t)m->n_stores++;
  return RA_OK;
}

static int map_add_rule(ra_shard_map *m, const ra_shard_rule *r) {
  ra_shard_rule *rules = realloc(m->rules, (m->n_rules + 1) * sizeof *rules);
  if (!rules) return RA_ENOMEM;
  m->rules = rules;
  m->rules[m->n_rules++] = *r;
  return RA_OK;
}

static int parse_line(ra_shard_map *m, char *line, int lineno, ra_error *err) {
  char *hash = strchr(line, '#');
  if (hash) *hash = '\0';
  char *fields[5];
  int nf = 0;
  for (char *save = NULL, *tok = strtok_r(line, " \t\r", &save); tok;
       tok = strtok_r(NULL, " \t\r", &save)) {
    if (nf == 5) break;
    fields[nf++] = tok;
  }
  if (nf == 0) return RA_OK;
  if (nf != 4)
    return ra_errorf(err, RA_EINVAL, "shard map line %d: want 'STORE LAYERS KV_HEADS TOKENS', got %d fields",
                     lineno, nf);
  uint64_t llo, lhi, hlo, hhi, tlo, thi;
  if (parse_range(fields[1], UINT32_MAX, &llo, &lhi))
    return ra_errorf(err, RA_EINVAL, "shard map line %d: bad layer range '%s'", lineno, fields[1]);
  if (parse_range(fields[2], UINT32_MAX, &hlo, &hhi))
    return ra_errorf(err, RA_EINVAL, "shard map line %d: bad kv head range '%s'", lineno, fields[2]);
  if (parse_range(fields[3], UINT64_MAX - 1, &tlo, &thi))
    return ra_errorf(err, RA_EINVAL, "shard map line %d: bad token range '%s'", lineno, fields[3]);
  ra_shard_rule r = {
      .layer_lo = (uint32_t)llo, .layer_hi = (uint32_t)lhi,
      .head_lo = (uint32_t)hlo,  .head_hi = (uint32_t)hhi,
      .token_begin = tlo,
      .token_end = thi == UINT64_MAX - 1 ? RA_TOKEN_END_OPEN : thi + 1,
  };
  /* the owners: "A" or "A,B,..." */
  for (char *save = NULL, *a = strtok_r(fields[0], ",", &save); a; a = strtok_r(NULL, ",", &save)) {
    if (strlen(a) >= RA_ADDR_MAX || !strchr(a, ':'))
      return ra_errorf(err, RA_EINVAL, "shard map line %d: store '%s' is not HOST:PORT", lineno, a);
    if (r.n_owners == RA_SHARD_MAX_REPLICAS)
      return ra_errorf(err, RA_EINVAL, "shard map line %d: more than %d owners", lineno, RA_SHARD_MAX_REPLICAS);
    uint32_t idx;
    if (map_add_store(m, a, &idx)) return ra_errorf(err, RA_ENOMEM, "shard map line %d: out of memory", lineno);
    for (uint32_t j = 0; j < r.n_owners; j++)
      if (r.owners[j] == idx) return ra_errorf(err, RA_EINVAL, "shard map line %d: store '%s' named twice", lineno, a);
    r.owners[r.n_owners++] = idx;
  }
  if (r.n_owners == 0) return ra_errorf(err, RA_EINVAL, "shard map line %d: no store named", lineno);
  r.store = r.owners[0];
  if (map_add_rule(m, &r)) return ra_errorf(err, RA_ENOMEM, "shard map line %d: out of memory", lineno);
  return RA_OK;
}

int ra_shard_map_parse(const char *text, ra_shard_map *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  char *copy = strdup(text);
  if (!copy) return ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
  int rc = RA_OK, lineno = 0;
  for (char *line = copy; line && rc == RA_OK;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    rc = parse_line(out, line, ++lineno, err);
    line = nl ? nl + 1 : NULL;
  }
  free(copy);
  if (rc == RA_OK && out->n_rules == 0) rc = ra_errorf(err, RA_EINVAL, "shard map: no rules");
  if (rc != RA_OK) ra_shard_map_free(out);
  return rc;
}

int ra_shard_map_load(const char *path, ra_shard_map *out, ra_error *err) {
  char *text;
  int rc = ra_textfile_read(path, 16u << 20, &text, NULL, err);
  if (rc != RA_OK) {
    if (err) ra_error_wrap(err, "shard map");
    return rc;
  }
  rc = ra_shard_map_parse(text, out, err);
  if (rc != RA_OK && err) ra_error_wrap(err, "%s", path);
  free(text);
  return rc;
}

int ra_shard_map_spread(const char *const *stores, size_t n_stores, uint32_t n_layers,
                        uint32_t n_kv_heads, ra_shard_map *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if (n_stores == 0) return ra_errorf(err, RA_EINVAL, "shard map: no stores given");
  uint32_t *index = calloc(n_stores, sizeof *index);
  if (!index) return ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
  int rc = RA_OK;
  for (size_t i = 0; i < n_stores && rc == RA_OK; i++) {
    if (strlen(stores[i]) >= RA_ADDR_MAX || !strchr(stores[i], ':'))
      rc = ra_errorf(err, RA_EINVAL, "store '%s' is not HOST:PORT", stores[i]);
    else if (map_add_store(out, stores[i], &index[i]))
      rc = ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
  }
  for (uint32_t l = 0; l < n_layers && rc == RA_OK; l++) {
    for (uint32_t h = 0; h < n_kv_heads && rc == RA_OK; h++) {
      uint32_t owner = index[((size_t)l * n_kv_heads + h) % n_stores];
      ra_shard_rule r = {.store = owner, .owners = {owner}, .n_owners = 1,
                         .layer_lo = l, .layer_hi = l, .head_lo = h, .head_hi = h,
                         .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
      if (map_add_rule(out, &r)) rc = ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
    }
  }
  free(index);
  if (rc != RA_OK) ra_shard_map_free(out);
  return rc;
}

int ra_shard_map_spread_list(const char *stores_csv, uint32_t n_layers, uint32_t n_kv_heads,
                             ra_shard_map *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  char *list = strdup(stores_csv);
  size_t n = 1;
  for (const char *c = stores_csv; *c; c++) n += *c == ',';
  const char **addrs = malloc(n * sizeof *addrs);
  int rc = RA_OK;
  if (!list || !addrs) {
    rc = ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
  } else {
    /* split by hand: strtok would skip the empty entries this must refuse */
    char *t = list;
    for (size_t i = 0; i < n && rc == RA_OK; i++) {
      char *comma = strchr(t, ',');
      if (comma) *comma = '\0';
      if (*t == '\0') rc = ra_errorf(err, RA_EINVAL, "store list '%s': entry %zu is empty", stores_csv, i + 1);
      addrs[i] = t;
      t = comma ? comma + 1 : t + strlen(t);
    }
  }
  if (rc == RA_OK) rc = ra_shard_map_spread(addrs, n, n_layers, n_kv_heads, out, err);
  free(addrs);
  free(list);
  return rc;
}

int ra_shard_map_replicate(ra_shard_map *map, uint32_t replicas, ra_error *err) {
  size_t most = map->n_stores < RA_SHARD_MAX_REPLICAS ? map->n_stores : RA_SHARD_MAX_REPLICAS;
  if (replicas < 1 || replicas > most)
    return ra_errorf(err, RA_EINVAL, "%u replicas: want 1 to %zu (the stores given, at most %d)", replicas, most,
                     RA_SHARD_MAX_REPLICAS);
  for (size_t i = 0; i < map->n_rules; i++) {
    ra_shard_rule *r = &map->rules[i];
    r->n_owners = replicas;
    for (uint32_t j = 0; j < replicas; j++) r->owners[j] = (uint32_t)((r->store + j) % map->n_stores);
  }
  return RA_OK;
}

/* 1 if rule r covers (l, h). */
static int rule_covers(const ra_shard_rule *r, uint32_t l, uint32_t h) {
  return l >= r->layer_lo && l <= r->layer_hi && h >= r->head_lo && h <= r->head_hi;
}

static int rule_owned_by(const ra_shard_rule *r, uint32_t store) {
  for (uint32_t j = 0; j < r->n_owners; j++)
    if (r->owners[j] == store) return 1;
  return 0;
}

/* The replica rule of shardmap.h for (l, h): where a covering rule is replicated, no store
 * owns two covering rules. */
static int check_replicas(const ra_shard_map *map, uint32_t l, uint32_t h, ra_error *err) {
  int replicated = 0;
  for (size_t i = 0; i < map->n_rules && !replicated; i++)
    replicated = rule_covers(&map->rules[i], l, h) && map->rules[i].n_owners > 1;
  if (!replicated) return RA_OK;
  for (size_t i = 0; i < map->n_rules; i++) {
    const ra_shard_rule *a = &map->rules[i];
    if (!rule_covers(a, l, h)) continue;
    for (size_t k = i + 1; k < map->n_rules; k++) {
      const ra_shard_rule *b = &map->rules[k];
      if (!rule_covers(b, l, h)) continue;
      for (uint32_t j = 0; j < a->n_owners; j++)
        if (rule_owned_by(b, a->owners[j]))
          return ra_errorf(err, RA_EINVAL,
                           "shard map: layer %u kv head %u: store %s owns rules %zu and %zu, and the kv head is "
                           "replicated (an owner must hold one token range of it)",
                           l, h, map->stores[a->owners[j]], i + 1, k + 1);
    }
  }
  return RA_OK;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int ra_shard_map_validate(const ra_shard_map *map, uint32_t n_layers, uint32_t n_kv_heads,
                          ra_error *err) {
  /* "*" and "a-" leave hi at UINT32_MAX, meaning "to the last one". */
  for (size_t i = 0; i < map->n_rules; i++) {
    const ra_shard_rule *r = &map->rules[i];
    if (r->layer_lo >= n_layers || (r->layer_hi != UINT32_MAX && r->layer_hi >= n_layers))
      return ra_errorf(err, RA_EINVAL, "shard map rule %zu (%s): layers %u-%u outside [0, %u)", i + 1,
                       map->stores[r->store], r->layer_lo, r->layer_hi, n_layers);
    if (r->head_lo >= n_kv_heads || (r->head_hi != UINT32_MAX && r->head_hi >= n_kv_heads))
      return ra_errorf(err, RA_EINVAL, "shard map rule %zu (%s): kv heads %u-%u outside [0, %u)", i + 1,
                       map->stores[r->store], r->head_lo, r->head_hi, n_kv_heads);
  }
  /* For each (layer, head): sort the covering rules' [begin, end) and check they tile [0, inf). */
  uint64_t *spans = malloc(2 * map->n_rules * sizeof *spans);
  if (!spans) return ra_errorf(err, RA_ENOMEM, "shard map: out of memory");
  int rc = RA_OK;
  for (uint32_t l = 0; l < n_layers && rc == RA_OK; l++) {
    for (uint32_t h = 0; h < n_kv_heads && rc == RA_OK; h++) {
      size_t n = 0;
      for (size_t i = 0; i < map->n_rules; i++) {
        const ra_shard_rule *r = &map->rules[i];
        if (!rule_covers(r, l, h)) continue;
        spans[2 * n] = r->token_begin;
        spans[2 * n + 1] = r->token_end;
        n++;
      }
      qsort(spans, n, 2 * sizeof *spans, cmp_u64);
      uint64_t next = 0;
      for (size_t i = 0; i < n && rc == RA_OK; i++) {
        if (spans[2 * i] > next)
          rc = ra_errorf(err, RA_EINVAL, "shard map: layer %u kv head %u: tokens %" PRIu64 "-%" PRIu64 " have no owner",
                         l, h, next, spans[2 * i] - 1);
        else if (spans[2 * i] < next)
          rc = ra_errorf(err, RA_EINVAL, "shard map: layer %u kv head %u: token %" PRIu64 " has two owners", l, h,
                         spans[2 * i]);
        next = spans[2 * i + 1];
      }
      if (rc == RA_OK && next != RA_TOKEN_END_OPEN)
        rc = ra_errorf(err, RA_EINVAL, "shard map: layer %u kv head %u: tokens from %" PRIu64 " on have no owner",
                       l, h, next);
      if (rc == RA_OK) rc = check_replicas(map, l, h, err);
    }
  }
  free(spans);
  return rc;
}

const ra_shard_rule *ra_shard_map_find(const ra_shard_map *map, uint32_t layer, uint32_t head,
                                       uint64_t token) {
  for (size_t i = 0; i < map->n_rules; i++) {
    const ra_shard_rule *r = &map->rules[i];
    if (layer >= r->layer_lo && layer <= r->layer_hi && head >= r->head_lo && head <= r->head_hi &&
        token >= r->token_begin && token < r->token_end)
      return r;
  }
  return NULL;
}

void ra_shard_map_free(ra_shard_map *map) {
  free(map->stores);
  free(map->rules);
  memset(map, 0, sizeof *map);
}
