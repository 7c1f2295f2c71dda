#include "wire.h"

#include <stdio.h>
#include <string.h>

/* Every mode's table wire value is protobuf-c's constant of the same name; streaming has none
 * (RA_MODE_NO_WIRE), so it is given one here for the assertion to name. */
#define RAKV__ATTEND_MODE__MODE_STREAMING RA_MODE_NO_WIRE
#define WIRE_ASSERT_(id, name, wire, flags, slot, help)      \
  _Static_assert((wire) == (int)RAKV__ATTEND_MODE__MODE_##id, \
                 "mode " name ": wire value differs from proto AttendMode");
RA_MODE_TABLE(WIRE_ASSERT_)
#undef WIRE_ASSERT_
#undef RAKV__ATTEND_MODE__MODE_STREAMING

int kvs_wire_mode_from_proto(Rakv__AttendMode wire, ra_mode *out, ra_error *err) {
  if (ra_mode_from_wire((int)wire, out) != RA_OK)
    return ra_errorf(err, RA_EINVAL, "attend mode %d is unknown", (int)wire);
  return RA_OK;
}

int kvs_wire_mode_to_proto(ra_mode m, Rakv__AttendMode *out, ra_error *err) {
  int wire = ra_mode_to_wire(m);
  if (wire == RA_MODE_NO_WIRE)
    return ra_errorf(err, RA_EINVAL, "mode %s is not one a kv-store answers", ra_mode_name(m));
  *out = (Rakv__AttendMode)wire;
  return RA_OK;
}

/* "ivf (2), kgraph (3) or roar (4)": the indexed modes and their wire values. */
static void indexed_kinds(char *buf, size_t len) {
  size_t at = 0, n = 0;
  buf[0] = '\0';
  for (int m = 0; m < RA_MODE_COUNT; m++) {
    if (!ra_mode_has_index((ra_mode)m)) continue;
    const char *sep = n == 0 ? "" : n + 1 == RA_MODE_N_INDEXED ? " or " : ", ";
    int w = snprintf(buf + at, len - at, "%s%s (%d)", sep, ra_mode_name((ra_mode)m),
                     ra_mode_to_wire((ra_mode)m));
    if (w < 0 || (size_t)w >= len - at) break;
    at += (size_t)w;
    n++;
  }
}

#define COPY_(name, type, lo, hi, modes, zero, flag, help) dst->name = src->name;

int kvs_wire_index_spec_from_proto(const Rakv__IndexParams *src, ra_index_spec *dst,
                                   ra_error *err) {
  memset(dst, 0, sizeof *dst);
  if (!src) return RA_OK;
  ra_mode kind;
  if (ra_mode_from_wire((int)src->kind, &kind) != RA_OK) {
    char kinds[128];
    indexed_kinds(kinds, sizeof kinds);
    return ra_errorf(err, RA_EINVAL, "index kind %d is not %s", (int)src->kind, kinds);
  }
  dst->kind = kind;
  RA_INDEX_PARAM_TABLE(COPY_)
  return RA_OK;
}

int kvs_wire_index_spec_to_proto(const ra_index_spec *src, Rakv__IndexParams *dst, ra_error *err) {
  rakv__index_params__init(dst);
  int rc = kvs_wire_mode_to_proto(src->kind, &dst->kind, err);
  if (rc) return rc;
  RA_INDEX_PARAM_TABLE(COPY_)
  return RA_OK;
}

void kvs_wire_search_spec_from_proto(const Rakv__SearchParams *src, ra_search_spec *dst) {
  memset(dst, 0, sizeof *dst);
  if (!src) return;
  RA_SEARCH_PARAM_TABLE(COPY_)
}

#define ANY_(name, type, lo, hi, modes, zero, flag, help) || src->name
int kvs_wire_search_spec_to_proto(const ra_search_spec *src, Rakv__SearchParams *dst) {
  rakv__search_params__init(dst);
  RA_SEARCH_PARAM_TABLE(COPY_)
  return 0 RA_SEARCH_PARAM_TABLE(ANY_);
}
#undef ANY_
#undef COPY_

void kvs_wire_partial_to_proto(const ra_head_partial *h, uint32_t head_dim, Rakv__HeadPartial *m) {
  rakv__head_partial__init(m);
  m->q_head = h->q_head;
  m->o.data = (uint8_t *)h->part.o;
  m->o.len = (size_t)head_dim * sizeof(float);
  m->m = h->part.m;
  m->l = h->part.l;
  m->n_scanned = h->n_scanned;
  m->n_keys = h->n_keys;
  m->n_ids = h->n_ids;
  m->ids = h->ids;
}

int kvs_wire_partial_from_proto(const Rakv__HeadPartial *m, uint32_t head_dim, ra_head_partial *out) {
  size_t o_bytes = (size_t)head_dim * sizeof(float);
  if (m->o.len != o_bytes) return RA_EFORMAT;
  out->q_head = m->q_head;
  memcpy(out->part.o, m->o.data, o_bytes);
  out->part.m = m->m;
  out->part.l = m->l;
  out->n_scanned = m->n_scanned;
  out->n_keys = m->n_keys;
  out->n_ids = m->n_ids;
  if (out->ids)
    memcpy(out->ids, m->ids, (m->n_ids < out->ids_cap ? m->n_ids : out->ids_cap) * sizeof *out->ids);
  return RA_OK;
}
