#include "wave_retro.h"

#include <stdlib.h>

typedef struct slot {
  uint64_t step;      /* 0: no record */
  int64_t n_clusters; /* clusters at that step */
} slot;

struct ra_wave_retro {
  int n_kv;
  int64_t cap;
  uint32_t window;
  size_t words; /* uint64 words per bitset */
  slot *slots;  /* [n_layers, n_kv, window] */
  uint64_t *seen; /* [n_layers, n_kv, window, words] */
};

int ra_wave_retro_new(int n_layers, int n_kv_heads, int64_t cap, uint32_t window, ra_wave_retro **out,
                      ra_error *err) {
  *out = NULL;
  if (n_layers < 1 || n_kv_heads < 1 || cap < 0 || window < 1)
    return ra_errorf(err, RA_EINVAL, "wave retro: %d layers, %d kv heads, %lld clusters, window %u", n_layers,
                     n_kv_heads, (long long)cap, window);
  ra_wave_retro *r = calloc(1, sizeof *r);
  const size_t n_slots = (size_t)n_layers * (size_t)n_kv_heads * window, words = ((size_t)cap + 63) / 64;
  if (r) {
    *r = (ra_wave_retro){.n_kv = n_kv_heads, .cap = cap, .window = window, .words = words};
    r->slots = calloc(n_slots, sizeof *r->slots);
    r->seen = calloc(n_slots * (words ? words : 1), sizeof *r->seen);
  }
  if (!r || !r->slots || !r->seen) {
    ra_wave_retro_free(r);
    return ra_errorf(err, RA_ENOMEM, "wave retro: out of memory for %zu records of %lld clusters", n_slots,
                     (long long)cap);
  }
  *out = r;
  return RA_OK;
}

void ra_wave_retro_free(ra_wave_retro *r) {
  if (!r) return;
  free(r->slots);
  free(r->seen);
  free(r);
}

static size_t slot_at(const ra_wave_retro *r, int l, int g, uint64_t step) {
  return ((size_t)l * (size_t)r->n_kv + (size_t)g) * r->window + (size_t)((step - 1) % r->window);
}

void ra_wave_retro_record(ra_wave_retro *r, int l, int g, uint64_t step, int64_t n_clusters, const int32_t *seen,
                          size_t n) {
  const size_t at = slot_at(r, l, g, step);
  uint64_t *bits = r->seen + at * r->words;
  for (size_t i = 0; i < r->words; i++) bits[i] = 0;
  for (size_t i = 0; i < n; i++)
    if (seen[i] >= 0 && seen[i] < r->cap) bits[seen[i] / 64] |= 1ull << (seen[i] % 64);
  r->slots[at] = (slot){.step = step, .n_clusters = n_clusters};
}

size_t ra_wave_retro_missing(ra_wave_retro *r, int l, int g, uint64_t past, const int32_t *ret, size_t n,
                             int32_t *out) {
  if (past == 0) return 0;
  const size_t at = slot_at(r, l, g, past);
  const slot *s = &r->slots[at];
  if (s->step != past) return 0;
  uint64_t *bits = r->seen + at * r->words;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t c = ret[i];
    if (c < 0 || c >= s->n_clusters || c >= r->cap) continue;
    const uint64_t bit = 1ull << (c % 64);
    if (bits[c / 64] & bit) continue;
    bits[c / 64] |= bit;
    out[m++] = c;
  }
  return m;
}
