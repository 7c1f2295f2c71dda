#include "batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ra_batch {
  const ra_model *m;
  int64_t max_tokens;
  int max_items;
  ra_tensor x, xn, q, k, v, att, gate, up; /* [max_tokens, ...] */
  ra_tensor ml;                            /* [max_items * n_heads, 2]: the decode kernel's (m, l), unused */
  ra_attn_decode_item *dec;                /* [max_items]: a layer's one-token items, attended together */
  ra_rope_store_item *rope;                /* [max_items]: and their RoPE and cache rows, in one op */
  ra_tensor *dec_q, *dec_o, *dec_ml;       /* [max_items] each: their views of q, att and ml */
  ra_tensor last, last_n;                  /* [max_items, dim]: the items' last rows, normed */
  ra_tensor logits;                        /* [max_items, vocab] */
  int32_t *tokens;                         /* [max_tokens] host */
  unsigned char *flush_at;                 /* [max_items]: the first item of its attn group */
};

void ra_batch_free(ra_batch *b) {
  if (!b) return;
  ra_tensor *all[] = {&b->x, &b->xn, &b->q, &b->k, &b->v, &b->att, &b->gate, &b->up, &b->ml, &b->last, &b->last_n, &b->logits};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ra_tensor_free(all[i]);
  free(b->tokens);
  free(b->flush_at);
  free(b->dec);
  free(b->rope);
  free(b->dec_q);
  free(b);
}

int ra_batch_new(const ra_model *m, int64_t max_tokens, int max_items, ra_batch **out, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  if (max_tokens < 1 || max_items < 1 || max_items > max_tokens)
    return ra_errorf(err, RA_EINVAL, "batch: %lld tokens for %d sequences", (long long)max_tokens, max_items);
  ra_batch *b = calloc(1, sizeof *b);
  if (!b) return ra_errorf(err, RA_ENOMEM, "batch: out of memory");
  b->m = m;
  b->max_tokens = max_tokens;
  b->max_items = max_items;
  int64_t t = max_tokens;
  int64_t sx[2] = {t, c->dim}, sq[3] = {t, c->n_heads, c->head_dim}, skv[3] = {t, c->n_kv_heads, c->head_dim},
          sf[2] = {t, c->ffn_dim}, sml[2] = {(int64_t)max_items * c->n_heads, 2}, sl[2] = {max_items, c->dim}, slg[2] = {max_items, c->vocab};
  int rc;
  if (!(b->tokens = malloc(sizeof(int32_t) * (size_t)t)) || !(b->dec = calloc((size_t)max_items, sizeof *b->dec)) ||
      !(b->rope = calloc((size_t)max_items, sizeof *b->rope)) || !(b->dec_q = calloc(3 * (size_t)max_items, sizeof *b->dec_q)) ||
      !(b->flush_at = calloc((size_t)max_items, 1)))
    rc = ra_errorf(err, RA_ENOMEM, "batch: out of memory");
  else if ((rc = ra_tensor_new(m->be, &b->x, RA_DTYPE_F32, 2, sx, err)) ||
           (rc = ra_tensor_new(m->be, &b->xn, RA_DTYPE_F32, 2, sx, err)) ||
           (rc = ra_tensor_new(m->be, &b->q, RA_DTYPE_F32, 3, sq, err)) ||
           (rc = ra_tensor_new(m->be, &b->k, RA_DTYPE_F32, 3, skv, err)) ||
           (rc = ra_tensor_new(m->be, &b->v, RA_DTYPE_F32, 3, skv, err)) ||
           (rc = ra_tensor_new(m->be, &b->att, RA_DTYPE_F32, 3, sq, err)) ||
           (rc = ra_tensor_new(m->be, &b->gate, RA_DTYPE_F32, 2, sf, err)) ||
           (rc = ra_tensor_new(m->be, &b->up, RA_DTYPE_F32, 2, sf, err)) ||
           (rc = ra_tensor_new(m->be, &b->ml, RA_DTYPE_F32, 2, sml, err)) ||
           (rc = ra_tensor_new(m->be, &b->last, RA_DTYPE_F32, 2, sl, err)) ||
           (rc = ra_tensor_new(m->be, &b->last_n, RA_DTYPE_F32, 2, sl, err)) ||
           (rc = ra_tensor_new(m->be, &b->logits, RA_DTYPE_F32, 2, slg, err))) {
  }
  if (rc) {
    ra_batch_free(b);
    return rc;
  }
  b->dec_o = b->dec_q + max_items;
  b->dec_ml = b->dec_q + 2 * (size_t)max_items;
  *out = b;
  return RA_OK;
}

const ra_tensor *ra_batch_logits(const ra_batch *b) { return &b->logits; }

/* Layer l's attention part for item it (rows [r0, r0 + n) of the step): a one-token item is
 * queued in b->dec and b->rope (n_dec of them so far) for the layer's one RoPE + cache-row op and
 * one batched decode; a prompt chunk gets RoPE, its cache rows and its attention here. */
static int item_attend(ra_batch *b, const ra_batch_item *it, int64_t r0, int l, int *n_dec, ra_error *err) {
  const ra_model_config *c = &b->m->cfg;
  ra_backend *be = b->m->be;
  ra_state *st = it->st;
  ra_tensor q = ra_tensor_rows(&b->q, r0, it->n), k = ra_tensor_rows(&b->k, r0, it->n),
            v = ra_tensor_rows(&b->v, r0, it->n), att = ra_tensor_rows(&b->att, r0, it->n);
  if (it->n == 1) {
    b->rope[*n_dec] = (ra_rope_store_item){r0, 1, st->pos, st->pos, &st->k_cache[l], &st->v_cache[l]};
    b->dec_q[*n_dec] = q;
    b->dec_o[*n_dec] = att;
    b->dec_ml[*n_dec] = ra_tensor_rows(&b->ml, (int64_t)*n_dec * c->n_heads, c->n_heads);
    b->dec[*n_dec] = (ra_attn_decode_item){&b->dec_q[*n_dec], &st->k_cache[l], &st->v_cache[l], st->pos + 1,
                                           &b->dec_o[*n_dec], &b->dec_ml[*n_dec]};
    (*n_dec)++;
    return RA_OK;
  }
  int rc = be->ops->rope_store(be, &q, &k, &v, st->pos, c->n_rot, c->rope_theta, c->rope_style, &st->k_cache[l],
                               &st->v_cache[l], st->pos, err);
  if (rc) return rc;
  return be->ops->attn_prefill(be, &q, &st->k_cache[l], &st->v_cache[l], st->pos, 1.0f / sqrtf((float)c->head_dim),
                               &att, err);
}

int ra_batch_forward(ra_batch *b, const ra_batch_item *items, int n_items, ra_error *err) {
  const ra_model *m = b->m;
  const ra_model_config *c = &m->cfg;
  const ra_backend_ops *op = m->be->ops;
  ra_backend *be = m->be;
  if (n_items < 1 || n_items > b->max_items)
    return ra_errorf(err, RA_EINVAL, "batch: %d sequences (at most %d)", n_items, b->max_items);
  int64_t t = 0;
  for (int i = 0; i < n_items; i++) {
    const ra_batch_item *it = &items[i];
    if (it->n < 1 || it->st->m != m || it->st->pos + it->n > it->st->n_ctx || t + it->n > b->max_tokens)
      return ra_errorf(err, RA_EINVAL, "batch: sequence %d: %lld tokens at %lld of %lld (step has %lld of %lld)", i,
                       (long long)it->n, (long long)it->st->pos, (long long)it->st->n_ctx, (long long)t,
                       (long long)b->max_tokens);
    memcpy(b->tokens + t, it->tokens, sizeof(int32_t) * (size_t)it->n);
    t += it->n;
  }
  for (int i = 0; i < n_items; i++) {
    const ra_batch_attn *a = items[i].attn;
    b->flush_at[i] = a != NULL;
    for (int j = 0; b->flush_at[i] && j < i; j++) b->flush_at[i] = items[j].attn != a;
  }
  ra_tensor x = ra_tensor_rows(&b->x, 0, t), xn = ra_tensor_rows(&b->xn, 0, t), q = ra_tensor_rows(&b->q, 0, t),
            k = ra_tensor_rows(&b->k, 0, t), v = ra_tensor_rows(&b->v, 0, t), att = ra_tensor_rows(&b->att, 0, t),
            gate = ra_tensor_rows(&b->gate, 0, t), up = ra_tensor_rows(&b->up, 0, t);
  int rc = op->get_rows(be, &m->tok_embd, b->tokens, t, &x, err);
  for (int l = 0; rc == RA_OK && l < c->n_layers; l++) {
    const ra_layer_weights *w = &m->layers[l];
    const ra_tensor *ws[3] = {&w->wq, &w->wk, &w->wv};
    const ra_tensor *bs[3] = {c->qkv_bias ? &w->bq : NULL, c->qkv_bias ? &w->bk : NULL, c->qkv_bias ? &w->bv : NULL};
    ra_tensor *ys[3] = {&q, &k, &v};
    rc = op->norm_matmul(be, &x, &w->attn_norm, c->norm_eps, &xn, 3, ws, bs, ys, err);
    int n_dec = 0;
    for (int64_t i = 0, r0 = 0; rc == RA_OK && i < n_items; r0 += items[i].n, i++)
      if (!items[i].attn) rc = item_attend(b, &items[i], r0, l, &n_dec, err);
    for (int i = 0; rc == RA_OK && i < n_items; i++)
      if (b->flush_at[i]) rc = items[i].attn->flush(items[i].attn->ctx, l, &q, &k, &v, &att, err);
    if (rc == RA_OK && n_dec > 0)
      rc = op->rope_store_batch(be, &q, &k, &v, b->rope, n_dec, c->n_rot, c->rope_theta, c->rope_style, err);
    if (rc == RA_OK && n_dec > 0) rc = op->attn_decode_batch(be, b->dec, n_dec, 1.0f / sqrtf((float)c->head_dim), err);
    for (int64_t i = 0, r0 = 0; rc == RA_OK && i < n_items; r0 += items[i].n, i++) {
      const ra_batch_item *it = &items[i];
      ra_tensor qi = ra_tensor_rows(&b->q, r0, it->n), atti = ra_tensor_rows(&b->att, r0, it->n);
      if (it->attn) rc = it->attn->end(it->attn->ctx, (int)i, l, &qi, &atti, err);
    }
    if (rc == RA_OK) rc = op->matmul(be, &att, &w->wo, NULL, &x, 1, err);
    if (rc == RA_OK) rc = op->norm_swiglu(be, &x, &w->ffn_norm, c->norm_eps, &xn, &w->w_gate, &w->w_up, &up, &gate, err);
    if (rc == RA_OK) rc = op->matmul(be, &gate, &w->w_down, NULL, &x, 1, err);
    if (rc) ra_error_wrap(err, "layer %d", l);
  }
  /* the last row of every item, then the final norm and the logits over those B rows */
  for (int64_t i = 0, r = 0; rc == RA_OK && i < n_items; i++) {
    r += items[i].n;
    rc = op->copy(be, &b->last, (size_t)(i * c->dim), &b->x, (size_t)((r - 1) * c->dim), (size_t)c->dim, err);
  }
  ra_tensor last = ra_tensor_rows(&b->last, 0, n_items), last_n = ra_tensor_rows(&b->last_n, 0, n_items),
            lg = ra_tensor_rows(&b->logits, 0, n_items);
  const ra_tensor *out_w = c->tied_embeddings ? &m->tok_embd : &m->output;
  if (rc == RA_OK) rc = op->rmsnorm(be, &last, &m->out_norm, c->norm_eps, &last_n, err);
  if (rc == RA_OK) rc = op->matmul(be, &last_n, out_w, NULL, &lg, 0, err);
  if (rc) return rc;
  for (int i = 0; i < n_items; i++) {
    items[i].st->pos += items[i].n;
    items[i].st->n_logits = 0;
  }
  return RA_OK;
}
