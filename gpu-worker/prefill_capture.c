#include "prefill_capture.h"

#include <stdlib.h>
#include <string.h>

void ra_prefill_capture_free(ra_prefill_capture *c) {
  if (!c) return;
  free(c->k);
  free(c->v);
  free(c->q);
  free(c->logits);
  free(c->q_step);
  free(c);
}

int ra_prefill_capture_new(const ra_model *m, int64_t n, uint32_t build_queries, ra_prefill_capture **out,
                           ra_error *err) {
  *out = NULL;
  const ra_model_config *mc = &m->cfg;
  if (n < 1 || build_queries < 1)
    return ra_errorf(err, RA_EINVAL, "capture: %lld tokens, %u build queries", (long long)n, build_queries);
  ra_prefill_capture *c = calloc(1, sizeof *c);
  if (!c) return ra_errorf(err, RA_ENOMEM, "capture: out of memory");
  c->n_layers = mc->n_layers;
  c->n_heads = mc->n_heads;
  c->n_kv_heads = mc->n_kv_heads;
  c->head_dim = mc->head_dim;
  c->vocab = mc->vocab;
  c->n = n;
  c->n_queries = n < (int64_t)build_queries ? n : (int64_t)build_queries;
  size_t kv = (size_t)mc->n_layers * (size_t)n * (size_t)mc->n_kv_heads * (size_t)mc->head_dim;
  size_t q_row = (size_t)mc->n_heads * (size_t)mc->head_dim;
  c->k = malloc(kv * sizeof(float));
  c->v = malloc(kv * sizeof(float));
  c->q = malloc((size_t)mc->n_layers * (size_t)c->n_queries * q_row * sizeof(float));
  c->logits = malloc((size_t)mc->vocab * sizeof(float));
  c->q_step = malloc((size_t)n * q_row * sizeof(float));
  if (!c->k || !c->v || !c->q || !c->logits || !c->q_step) {
    ra_prefill_capture_free(c);
    return ra_errorf(err, RA_ENOMEM, "capture: out of memory for %lld tokens", (long long)n);
  }
  *out = c;
  return RA_OK;
}

/* After layer l's q, k, v: its sampled queries and its whole K/V cache (rows [0, n)). */
static int on_qkv(void *ctx, ra_state *st, int layer, ra_error *err) {
  ra_prefill_capture *c = ctx;
  ra_backend *be = st->be;
  size_t q_row = (size_t)c->n_heads * (size_t)c->head_dim, kv_row = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  size_t kv_off = (size_t)layer * (size_t)c->n * kv_row;
  int rc = be->ops->download(be, &st->cur_q, 0, c->q_step, (size_t)c->n * q_row, err);
  float *q = c->q + (size_t)layer * (size_t)c->n_queries * q_row;
  for (int64_t i = 0; rc == RA_OK && i < c->n_queries; i++)
    memcpy(q + (size_t)i * q_row, c->q_step + (size_t)ra_prefill_query_pos(c->n, c->n_queries, i) * q_row,
           q_row * sizeof(float));
  if (rc == RA_OK) rc = be->ops->download(be, &st->k_cache[layer], 0, c->k + kv_off, (size_t)c->n * kv_row, err);
  if (rc == RA_OK) rc = be->ops->download(be, &st->v_cache[layer], 0, c->v + kv_off, (size_t)c->n * kv_row, err);
  return rc;
}

int ra_prefill_capture_run(ra_prefill_capture *c, ra_state *st, const int32_t *tokens, ra_error *err) {
  const ra_model_config *mc = &st->m->cfg;
  if (mc->n_layers != c->n_layers || mc->n_heads != c->n_heads || mc->n_kv_heads != c->n_kv_heads ||
      mc->head_dim != c->head_dim || mc->vocab != c->vocab)
    return ra_errorf(err, RA_EINVAL, "capture: made for another model geometry");
  if (st->pos != 0) return ra_errorf(err, RA_ESTATE, "capture: the state already holds %lld tokens", (long long)st->pos);
  if (st->max_batch < c->n)
    return ra_errorf(err, RA_EINVAL, "capture: the prefill of %lld tokens must be one step (max_batch %lld)",
                     (long long)c->n, (long long)st->max_batch);
  ra_forward_hooks hooks = {.ctx = c, .on_qkv = on_qkv};
  int rc = ra_model_forward(st, tokens, c->n, 0, &hooks, err);
  if (rc == RA_OK) rc = st->be->ops->download(st->be, &st->logits, 0, c->logits, (size_t)c->vocab, err);
  return rc;
}
