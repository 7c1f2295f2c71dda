/* Random KV for integration tests: every (layer, kv head) of a geometry, packed in the session
 * dtype (what is sent) and as the rounded fp32 values (what the reference computes with). */
#ifndef RA_KVDATA_H
#define RA_KVDATA_H

#include "client.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvdata {
  ra_kvclient_geometry g;
  size_t n;         /* tokens per (layer, kv head) */
  float *k, *v;     /* [n_layers, n_kv_heads, n, head_dim] rounded to the dtype */
  uint8_t *pk, *pv; /* same, packed in the dtype */
} kvdata;

void kvdata_make(kvdata *d, const ra_kvclient_geometry *g, size_t n, uint64_t seed);
void kvdata_free(kvdata *d);

/* Tokens [begin, end) of (layer, kv head) as a put/append block. */
ra_kvclient_rows kvdata_rows(const kvdata *d, uint32_t layer, uint32_t kv_head, uint64_t begin,
                             uint64_t end);
/* The fp32 rows of (layer, kv head): [n, head_dim]. */
const float *kvdata_k(const kvdata *d, uint32_t layer, uint32_t kv_head);
const float *kvdata_v(const kvdata *d, uint32_t layer, uint32_t kv_head);

#endif
