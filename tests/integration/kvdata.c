#include "kvdata.h"

#include "reference.h"

#include <stdlib.h>

/* The first row of (layer, kv head). */
static size_t head_row(const kvdata *d, uint32_t layer, uint32_t kv_head) {
  return ((size_t)layer * d->g.n_kv_heads + kv_head) * d->n;
}

void kvdata_make(kvdata *d, const ra_kvclient_geometry *g, size_t n, uint64_t seed) {
  d->g = *g;
  d->n = n;
  size_t rows = (size_t)g->n_layers * g->n_kv_heads * n, total = rows * g->head_dim;
  size_t rb = ra_dtype_row_bytes(g->dtype, g->head_dim);
  d->k = malloc(total * sizeof(float));
  d->v = malloc(total * sizeof(float));
  d->pk = malloc(rows * rb);
  d->pv = malloc(rows * rb);
  ref_rng rng = {seed};
  ref_fill_normal(&rng, d->k, total, 2.0f);
  ref_fill_normal(&rng, d->v, total, 1.0f);
  ref_pack(g->dtype, d->k, d->pk, rows, g->head_dim);
  ref_pack(g->dtype, d->v, d->pv, rows, g->head_dim);
}

void kvdata_free(kvdata *d) {
  free(d->k);
  free(d->v);
  free(d->pk);
  free(d->pv);
}

ra_kvclient_rows kvdata_rows(const kvdata *d, uint32_t layer, uint32_t kv_head, uint64_t begin,
                             uint64_t end) {
  size_t off = (head_row(d, layer, kv_head) + begin) * ra_dtype_row_bytes(d->g.dtype, d->g.head_dim);
  return (ra_kvclient_rows){.layer = layer, .kv_head = kv_head, .token_begin = begin,
                            .n_tokens = end - begin, .keys = d->pk + off, .values = d->pv + off};
}

const float *kvdata_k(const kvdata *d, uint32_t layer, uint32_t kv_head) {
  return d->k + head_row(d, layer, kv_head) * d->g.head_dim;
}
const float *kvdata_v(const kvdata *d, uint32_t layer, uint32_t kv_head) {
  return d->v + head_row(d, layer, kv_head) * d->g.head_dim;
}
