#include "backend_fused.h"

#include "backend_check_wave.h"

static size_t nelem(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

int ra_backend_seq_norm_matmul(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                               int n_out, const ra_tensor *const *w, const ra_tensor *const *bias, ra_tensor *const *y,
                               ra_error *err) {
  if (n_out < 1 || n_out > 3) return ra_errorf(err, RA_EINVAL, "%s norm_matmul: %d outputs (1..3)", be->name, n_out);
  int rc = be->ops->rmsnorm(be, x, norm_w, eps, xn, err);
  for (int i = 0; rc == RA_OK && i < n_out; i++) rc = be->ops->matmul(be, xn, w[i], bias ? bias[i] : NULL, y[i], 0, err);
  return rc;
}

int ra_backend_seq_norm_swiglu(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                               const ra_tensor *w_gate, const ra_tensor *w_up, ra_tensor *up, ra_tensor *out,
                               ra_error *err) {
  int rc;
  if ((rc = be->ops->rmsnorm(be, x, norm_w, eps, xn, err)) || (rc = be->ops->matmul(be, xn, w_gate, NULL, out, 0, err)) ||
      (rc = be->ops->matmul(be, xn, w_up, NULL, up, 0, err)))
    return rc;
  return be->ops->swiglu(be, out, up, out, err);
}

int ra_backend_seq_rope_store(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v, int64_t pos0, int n_rot,
                              float theta, ra_rope_style style, ra_tensor *k_cache, ra_tensor *v_cache, int64_t row,
                              ra_error *err) {
  int rc;
  if (row < 0) return ra_errorf(err, RA_EINVAL, "%s rope_store: cache row %lld", be->name, (long long)row);
  if ((rc = be->ops->rope(be, q, pos0, n_rot, theta, style, err)) ||
      (rc = be->ops->rope(be, k, pos0, n_rot, theta, style, err)))
    return rc;
  /* one cache row holds one token's kv heads: the copy offset is in elements */
  size_t row_elems = k->shape[0] > 0 ? nelem(k) / (size_t)k->shape[0] : 0;
  if ((rc = be->ops->copy(be, k_cache, (size_t)row * row_elems, k, 0, nelem(k), err))) return rc;
  return be->ops->copy(be, v_cache, (size_t)row * row_elems, v, 0, nelem(v), err);
}

int ra_backend_seq_rope_store_batch(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v,
                                    const ra_rope_store_item *items, int n_items, int n_rot, float theta,
                                    ra_rope_style style, ra_error *err) {
  if (!q || !k || !v || q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || k->shape[0] != q->shape[0] ||
      v->shape[0] != q->shape[0])
    return ra_errorf(err, RA_EINVAL, "%s rope_store_batch: q, k, v must be [T, heads, head_dim] of the same T", be->name);
  if (n_items < 1 || !items) return ra_errorf(err, RA_EINVAL, "%s rope_store_batch: %d items", be->name, n_items);
  for (int i = 0; i < n_items; i++) {
    const ra_rope_store_item *it = &items[i];
    if (it->r0 < 0 || it->n < 1 || it->r0 + it->n > q->shape[0])
      return ra_errorf(err, RA_EINVAL, "%s rope_store_batch: item %d: rows [%lld, %lld) of %lld", be->name, i,
                       (long long)it->r0, (long long)(it->r0 + it->n), (long long)q->shape[0]);
    ra_tensor qi = ra_tensor_rows(q, it->r0, it->n), ki = ra_tensor_rows(k, it->r0, it->n),
              vi = ra_tensor_rows(v, it->r0, it->n);
    int rc = be->ops->rope_store(be, &qi, &ki, &vi, it->pos, n_rot, theta, style, it->k_cache, it->v_cache, it->row, err);
    if (rc) {
      ra_error_wrap(err, "item %d", i);
      return rc;
    }
  }
  return RA_OK;
}

int ra_backend_seq_wave_select_batch(ra_backend *be, const ra_wave_select_item *items, int n_items, float scale,
                                     ra_error *err) {
  if (n_items < 1 || !items) return ra_errorf(err, RA_EINVAL, "%s wave_select_batch: %d items", be->name, n_items);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n_items; i++) {
      const ra_wave_select_item *it = &items[i];
      int rc = pass == 0 ? ra_backend_check_wave_select(be->name, it->q, it->centroid, it->size, it->n_clusters, it->r,
                                                        it->e, it->idx, it->vsum, it->o, it->ml, err)
                         : be->ops->wave_select(be, it->q, it->centroid, it->size, it->n_clusters, scale, it->r, it->e,
                                                it->idx, it->vsum, it->o, it->ml, err);
      if (rc) {
        ra_error_wrap(err, "item %d", i);
        return rc;
      }
    }
  return RA_OK;
}
