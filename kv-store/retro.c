#include "retro.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct record {
  uint64_t step; /* 0: empty */
  uint64_t horizon;
  uint64_t *pos; /* [n], sorted */
  size_t n, cap;
} record;

struct kvs_retro {
  pthread_mutex_t mu;
  uint32_t n_q_heads;
  size_t n_slots;
  kvs_retro_charge_fn charge;
  void *charge_ctx;
  uint64_t bytes; /* charged: the slots' position capacity */
  record *rec; /* [n_layers * n_q_heads * KVS_RETRO_MAX_WINDOW], record of step s at s % W */
};

size_t kvs_retro_table_bytes(uint32_t n_layers, uint32_t n_q_heads) {
  return sizeof(kvs_retro) + (size_t)n_layers * n_q_heads * KVS_RETRO_MAX_WINDOW * sizeof(record);
}

int kvs_retro_new(uint32_t n_layers, uint32_t n_q_heads, kvs_retro_charge_fn charge, void *charge_ctx,
                  kvs_retro **out, ra_error *err) {
  *out = NULL;
  kvs_retro *r = calloc(1, sizeof *r);
  size_t n = (size_t)n_layers * n_q_heads * KVS_RETRO_MAX_WINDOW;
  if (r) r->rec = calloc(n ? n : 1, sizeof *r->rec);
  if (!r || !r->rec || pthread_mutex_init(&r->mu, NULL) != 0) {
    if (r) free(r->rec);
    free(r);
    return ra_errorf(err, RA_ENOMEM, "out of memory for the retro records");
  }
  r->n_q_heads = n_q_heads;
  r->n_slots = n;
  r->charge = charge;
  r->charge_ctx = charge_ctx;
  *out = r;
  return RA_OK;
}

void kvs_retro_free(kvs_retro *r) {
  if (!r) return;
  if (r->charge && r->bytes) r->charge(r->charge_ctx, -(int64_t)r->bytes, NULL);
  for (size_t i = 0; i < r->n_slots; i++) free(r->rec[i].pos);
  pthread_mutex_destroy(&r->mu);
  free(r->rec);
  free(r);
}

uint64_t kvs_retro_bytes(kvs_retro *r) {
  pthread_mutex_lock(&r->mu);
  uint64_t b = r->bytes;
  pthread_mutex_unlock(&r->mu);
  return b;
}

static record *slot(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step) {
  return &r->rec[((size_t)layer * r->n_q_heads + q_head) * KVS_RETRO_MAX_WINDOW + step % KVS_RETRO_MAX_WINDOW];
}

static int has(const record *c, uint64_t p) {
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->pos[mid] < p) lo = mid + 1;
    else hi = mid;
  }
  return lo < c->n && c->pos[lo] == p;
}

long kvs_retro_unseen(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t past,
                      const uint64_t *pos, size_t n, uint64_t *out) {
  if (past >= step || step - past > KVS_RETRO_MAX_WINDOW) return -1;
  pthread_mutex_lock(&r->mu);
  const record *seen[KVS_RETRO_MAX_WINDOW];
  size_t n_seen = 0;
  long count = 0;
  for (uint64_t u = past; u < step; u++) {
    const record *c = slot(r, layer, q_head, u);
    if (c->step != u) {
      count = -1;
      break;
    }
    seen[n_seen++] = c;
  }
  for (size_t i = 0; count >= 0 && i < n; i++) {
    int unseen = pos[i] < seen[0]->horizon;
    for (size_t u = 0; unseen && u < n_seen; u++) unseen = !has(seen[u], pos[i]);
    if (unseen) out[count++] = pos[i];
  }
  pthread_mutex_unlock(&r->mu);
  return count;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

int kvs_retro_record(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t horizon,
                     const uint64_t *pos, size_t n, ra_error *err) {
  if (step == 0) return ra_errorf(err, RA_EINVAL, "retro step 0 (steps count from 1)");
  pthread_mutex_lock(&r->mu);
  record *c = slot(r, layer, q_head, step);
  int rc = RA_OK;
  if (n > c->cap) {
    const int64_t delta = (int64_t)((n - c->cap) * sizeof *c->pos);
    if (r->charge && (rc = r->charge(r->charge_ctx, delta, err)) != RA_OK)
      ra_error_wrap(err, "a retro record of %zu positions", n);
    uint64_t *grown = rc == RA_OK ? realloc(c->pos, n * sizeof *grown) : NULL;
    if (grown) {
      c->pos = grown;
      c->cap = n;
      r->bytes += (uint64_t)delta;
    } else if (rc == RA_OK) {
      if (r->charge) r->charge(r->charge_ctx, -delta, NULL);
      rc = ra_errorf(err, RA_ENOMEM, "out of memory for a retro record of %zu positions", n);
    }
  }
  if (rc == RA_OK) {
    if (n) memcpy(c->pos, pos, n * sizeof *pos);
    qsort(c->pos, n, sizeof *c->pos, cmp_u64);
    c->n = n;
    c->step = step;
    c->horizon = horizon;
  } else {
    c->step = 0; /* the old record is no step's any more */
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}
