#include "modes.h"

#include "status.h"

#include <stdio.h>
#include <string.h>

typedef struct mode_row {
  const char *name;
  int wire;
  unsigned flags;
  int slot;
  const char *help;
} mode_row;

static const mode_row rows[RA_MODE_COUNT] = {
#define ROW_(id, name, wire, flags, slot, help) [RA_MODE_##id] = {name, wire, flags, slot, help},
    RA_MODE_TABLE(ROW_)
#undef ROW_
};

/* Slots are 0 .. N - 1 in row order: each indexed row's slot is the count of indexed rows
 * before it, so their sum is 0 + 1 + ... + (N - 1). */
#define SLOT_SUM_(id, name, wire, flags, slot, help) +((slot) >= 0 ? (slot) : 0)
_Static_assert(0 RA_MODE_TABLE(SLOT_SUM_) == RA_MODE_N_INDEXED * (RA_MODE_N_INDEXED - 1) / 2,
               "index slots must be 0 .. RA_MODE_N_INDEXED - 1");
#undef SLOT_SUM_

static const mode_row *row_of(ra_mode m) {
  return (unsigned)m < RA_MODE_COUNT ? &rows[m] : NULL;
}

const char *ra_mode_name(ra_mode m) {
  const mode_row *r = row_of(m);
  return r ? r->name : "?";
}

const char *ra_mode_help(ra_mode m) {
  const mode_row *r = row_of(m);
  return r ? r->help : "";
}

int ra_mode_parse(const char *name, ra_mode *out) {
  for (int m = 0; name && m < RA_MODE_COUNT; m++)
    if (strcmp(name, rows[m].name) == 0) {
      *out = (ra_mode)m;
      return RA_OK;
    }
  return RA_EINVAL;
}

size_t ra_mode_list(char *buf, size_t cap, unsigned flags) {
  size_t len = 0;
  if (cap) buf[0] = '\0';
  for (int m = 0; m < RA_MODE_COUNT; m++) {
    if ((rows[m].flags & flags) != flags) continue;
    int n = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%s",
                     len ? ", " : "", rows[m].name);
    len += (size_t)n;
  }
  return len;
}

int ra_mode_uses_stores(ra_mode m) {
  const mode_row *r = row_of(m);
  return r && (r->flags & RA_MODE_F_STORES);
}

int ra_mode_takes_top_k(ra_mode m) {
  const mode_row *r = row_of(m);
  return r && (r->flags & RA_MODE_F_TOP_K);
}

int ra_mode_takes_retro(ra_mode m) {
  const mode_row *r = row_of(m);
  return r && (r->flags & RA_MODE_F_RETRO);
}

int ra_mode_has_index(ra_mode m) { return ra_mode_index_slot(m) >= 0; }

int ra_mode_index_slot(ra_mode m) {
  const mode_row *r = row_of(m);
  return r ? r->slot : -1;
}

int ra_mode_to_wire(ra_mode m) {
  const mode_row *r = row_of(m);
  return r ? r->wire : RA_MODE_NO_WIRE;
}

int ra_mode_from_wire(int wire, ra_mode *out) {
  for (int m = 0; wire != RA_MODE_NO_WIRE && m < RA_MODE_COUNT; m++)
    if (rows[m].wire == wire) {
      *out = (ra_mode)m;
      return RA_OK;
    }
  return RA_EINVAL;
}
