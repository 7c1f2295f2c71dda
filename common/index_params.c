#include "index_params.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TYPE_U32 RA_PARAM_U32
#define TYPE_U64 RA_PARAM_U64
#define TYPE_F32 RA_PARAM_F32
#define TYPE_BOOL RA_PARAM_BOOL

#define ROW_(st, build, name, type, lo, hi, modes, zero, flag, help) \
  {#name, flag, help, TYPE_##type, lo, hi, modes, zero, build, offsetof(st, name)},
#define INDEX_BUILD_ROW_(...) ROW_(ra_index_spec, 1, __VA_ARGS__)
#define INDEX_PLACE_ROW_(...) ROW_(ra_index_spec, 0, __VA_ARGS__)
#define SEARCH_ROW_(...) ROW_(ra_search_spec, 0, __VA_ARGS__)

static const ra_param index_rows[] = {
    RA_INDEX_BUILD_PARAM_TABLE(INDEX_BUILD_ROW_) RA_INDEX_PLACE_PARAM_TABLE(INDEX_PLACE_ROW_)};
static const ra_param search_rows[] = {RA_SEARCH_PARAM_TABLE(SEARCH_ROW_)};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

const ra_param *ra_index_param_rows(size_t *n) {
  *n = N_OF(index_rows);
  return index_rows;
}

const ra_param *ra_search_param_rows(size_t *n) {
  *n = N_OF(search_rows);
  return search_rows;
}

static const ra_param *find(const ra_param *rows, size_t n, const char *flag) {
  for (size_t i = 0; flag && i < n; i++)
    if (strcmp(rows[i].flag, flag) == 0) return &rows[i];
  return NULL;
}

const ra_param *ra_index_param_find(const char *flag) {
  return find(index_rows, N_OF(index_rows), flag);
}

const ra_param *ra_search_param_find(const char *flag) {
  return find(search_rows, N_OF(search_rows), flag);
}

double ra_param_get(const ra_param *p, const void *spec) {
  const char *f = (const char *)spec + p->offset;
  switch (p->type) {
    case RA_PARAM_U32: return *(const uint32_t *)f;
    case RA_PARAM_U64: return (double)*(const uint64_t *)f;
    case RA_PARAM_F32: return *(const float *)f;
    case RA_PARAM_BOOL: return *(const int *)f;
  }
  return 0.0;
}

/* A set (nonzero) value within the row's bounds; NaN never is. */
static int in_bounds(const ra_param *p, double v) {
  if (p->type == RA_PARAM_F32) return v > p->lo && v <= p->hi;
  return v >= p->lo && v <= p->hi;
}

/* "[2, 1024]" or "(0, 1]" */
static void bounds_text(const ra_param *p, char *buf, size_t len) {
  if (p->type == RA_PARAM_F32)
    snprintf(buf, len, "(%g, %g]", p->lo, p->hi);
  else
    snprintf(buf, len, "[%.0f, %.0f]", p->lo, p->hi);
}

/* "index degree 5000 out of range [2, 1024]", "index query_sample nan not in (0, 1]" */
static int out_of_bounds(const ra_param *p, const char *prefix, double v, ra_error *err) {
  char b[64];
  bounds_text(p, b, sizeof b);
  if (p->type == RA_PARAM_F32)
    return ra_errorf(err, RA_EINVAL, "%s%s %g not in %s", prefix, p->name, v, b);
  return ra_errorf(err, RA_EINVAL, "%s%s %.0f out of range %s", prefix, p->name, v, b);
}

int ra_param_parse(const ra_param *p, const char *text, void *spec, ra_error *err) {
  char b[64], *end = NULL;
  bounds_text(p, b, sizeof b);
  char *f = (char *)spec + p->offset;
  errno = 0;
  if (text && *text && p->type == RA_PARAM_F32) {
    float v = strtof(text, &end);
    if (errno == 0 && *end == '\0' && (v == 0.0f || in_bounds(p, v))) {
      *(float *)f = v;
      return RA_OK;
    }
  } else if (text && *text && *text != '-') {
    unsigned long long v = strtoull(text, &end, 10);
    if (errno == 0 && *end == '\0' && (v == 0 || in_bounds(p, (double)v))) {
      if (p->type == RA_PARAM_U32) *(uint32_t *)f = (uint32_t)v;
      if (p->type == RA_PARAM_U64) *(uint64_t *)f = (uint64_t)v;
      if (p->type == RA_PARAM_BOOL) *(int *)f = (int)v;
      return RA_OK;
    }
  }
  return ra_errorf(err, RA_EINVAL, "--%s '%s' is not 0 (unset) or in %s", p->flag,
                   text ? text : "", b);
}

int ra_index_spec_check(const ra_index_spec *s, ra_error *err) {
  if (s->kind == RA_MODE_FLAT)
    return ra_errorf(err, RA_EINVAL, "index kind flat: mode flat scans every key, it has no index");
  if (s->kind != RA_MODE_FULL && !ra_mode_has_index(s->kind))
    return ra_errorf(err, RA_EINVAL, "index kind %s has no index", ra_mode_name(s->kind));
  for (size_t i = 0; i < N_OF(index_rows); i++) {
    double v = ra_param_get(&index_rows[i], s);
    if (v != 0.0 && !in_bounds(&index_rows[i], v))
      return out_of_bounds(&index_rows[i], "index ", v, err);
  }
  return RA_OK;
}

int ra_search_spec_check(const ra_search_spec *s, ra_error *err) {
  for (size_t i = 0; i < N_OF(search_rows); i++) {
    double v = ra_param_get(&search_rows[i], s);
    if (v != 0.0 && !in_bounds(&search_rows[i], v))
      return out_of_bounds(&search_rows[i], "search ", v, err);
  }
  return RA_OK;
}

int ra_index_spec_check_resolved(const ra_index_spec *s, ra_error *err) {
  for (size_t i = 0; i < N_OF(index_rows); i++) {
    const ra_param *p = &index_rows[i];
    if (!p->build || !(p->modes & RA_MODE_BIT(s->kind))) continue;
    double v = ra_param_get(p, s);
    if (v == 0.0 ? !p->zero_ok : !in_bounds(p, v)) return out_of_bounds(p, "index: ", v, err);
  }
  return RA_OK;
}
