#include "backend_check.h"

/* Element count, here rather than ra_tensor_nelem so that the CUDA backend can link these
 * checks without the CPU runtime. */
static size_t nelem(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

int ra_backend_check_dtype(const char *be_name, const ra_tensor *t, ra_dtype dt, const char *op,
                           const char *name, ra_error *err) {
  if (!t || !t->data) return ra_errorf(err, RA_EINVAL, "%s %s: %s is not allocated", be_name, op, name);
  if (t->dtype != dt)
    return ra_errorf(err, RA_EINVAL, "%s %s: %s is %s, want %s", be_name, op, name, ra_dtype_name(t->dtype),
                     ra_dtype_name(dt));
  return RA_OK;
}

static int check_cache(const char *be_name, const ra_tensor *c, const char *op, const char *name, int64_t hd,
                       ra_error *err) {
  if (!c || !c->data || c->ndim != 3 || c->shape[2] != hd)
    return ra_errorf(err, RA_EINVAL, "%s %s: %s must be [n_ctx, n_kv_heads, %lld]", be_name, op, name,
                     (long long)hd);
  return RA_OK;
}

int ra_backend_check_set_rows(const char *be_name, const ra_tensor *table, const int32_t *ids, int64_t n,
                              const ra_tensor *src, ra_error *err) {
  const char *op = "set_rows";
  if (!table || !table->data || table->ndim < 1)
    return ra_errorf(err, RA_EINVAL, "%s %s: table is not allocated", be_name, op);
  int rc = ra_backend_check_dtype(be_name, src, RA_DTYPE_F32, op, "src", err);
  if (rc) return rc;
  const int64_t dim = table->shape[table->ndim - 1], rows = (int64_t)(nelem(table) / (size_t)(dim ? dim : 1));
  if (n < 0 || src->shape[src->ndim - 1] != dim || (int64_t)(nelem(src) / (size_t)(dim ? dim : 1)) < n)
    return ra_errorf(err, RA_EINVAL, "%s %s: src is not [>= %lld, %lld]", be_name, op, (long long)n, (long long)dim);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= rows)
      return ra_errorf(err, RA_EINVAL, "%s %s: id %d outside [0, %lld)", be_name, op, ids[i], (long long)rows);
  return RA_OK;
}

int ra_backend_check_attn_prefill(const char *be_name, const ra_tensor *q, const ra_tensor *kc,
                                  const ra_tensor *vc, int64_t pos0, const ra_tensor *out,
                                  ra_error *err) {
  const char *op = "attn_prefill";
  int rc;
  if ((rc = ra_backend_check_dtype(be_name, q, RA_DTYPE_F32, op, "q", err)) ||
      (rc = ra_backend_check_dtype(be_name, out, RA_DTYPE_F32, op, "out", err)))
    return rc;
  if (q->ndim != 3) return ra_errorf(err, RA_EINVAL, "%s %s: q must be [n, heads, head_dim]", be_name, op);
  int64_t n = q->shape[0], hq = q->shape[1], hd = q->shape[2];
  if ((rc = check_cache(be_name, kc, op, "k_cache", hd, err)) ||
      (rc = check_cache(be_name, vc, op, "v_cache", hd, err)))
    return rc;
  int64_t hkv = kc->shape[1];
  if (vc->shape[1] != hkv || hkv <= 0 || hq % hkv != 0 || nelem(out) != nelem(q))
    return ra_errorf(err, RA_EINVAL, "%s %s: %lld q heads do not group over %lld kv heads", be_name, op,
                     (long long)hq, (long long)hkv);
  if (pos0 < 0 || pos0 + n > kc->shape[0] || pos0 + n > vc->shape[0])
    return ra_errorf(err, RA_EINVAL, "%s %s: positions [%lld, %lld) exceed the cache of %lld", be_name, op,
                     (long long)pos0, (long long)(pos0 + n), (long long)kc->shape[0]);
  return RA_OK;
}

int ra_backend_check_attn_decode(const char *be_name, const ra_tensor *q, const ra_tensor *kc,
                                 const ra_tensor *vc, const ra_token_range *ranges, int n_ranges,
                                 const ra_tensor *o, const ra_tensor *ml, ra_error *err) {
  const char *op = "attn_decode";
  int rc;
  if ((rc = ra_backend_check_dtype(be_name, q, RA_DTYPE_F32, op, "q", err)) ||
      (rc = ra_backend_check_dtype(be_name, o, RA_DTYPE_F32, op, "o", err)) ||
      (rc = ra_backend_check_dtype(be_name, ml, RA_DTYPE_F32, op, "ml", err)))
    return rc;
  int64_t hd = q->shape[q->ndim - 1], hq = (int64_t)nelem(q) / hd;
  if ((rc = check_cache(be_name, kc, op, "k_cache", hd, err)) ||
      (rc = check_cache(be_name, vc, op, "v_cache", hd, err)))
    return rc;
  int64_t hkv = kc->shape[1], n_ctx = kc->shape[0] < vc->shape[0] ? kc->shape[0] : vc->shape[0];
  if (vc->shape[1] != hkv || hkv <= 0 || hq % hkv != 0 || (int64_t)nelem(o) != hq * hd ||
      (int64_t)nelem(ml) != hq * 2)
    return ra_errorf(err, RA_EINVAL, "%s %s: q/o/ml shapes do not fit %lld heads of %lld", be_name, op,
                     (long long)hq, (long long)hd);
  if (n_ranges < 0 || (n_ranges > 0 && !ranges))
    return ra_errorf(err, RA_EINVAL, "%s %s: bad range list", be_name, op);
  for (int i = 0; i < n_ranges; i++)
    if (ranges[i].begin < 0 || ranges[i].end < ranges[i].begin || ranges[i].end > n_ctx)
      return ra_errorf(err, RA_EINVAL, "%s %s: range [%lld, %lld) outside the cache of %lld", be_name, op,
                       (long long)ranges[i].begin, (long long)ranges[i].end, (long long)n_ctx);
  return RA_OK;
}

int ra_backend_check_attn_decode_batch(const char *be_name, const ra_attn_decode_item *items, int n_items,
                                       ra_error *err) {
  const char *op = "attn_decode_batch";
  if (n_items < 1 || !items) return ra_errorf(err, RA_EINVAL, "%s %s: no sequences", be_name, op);
  for (int i = 0; i < n_items; i++) {
    const ra_attn_decode_item *it = &items[i], *i0 = &items[0];
    if (!it->q || !it->k_cache || !it->v_cache || !it->o || !it->ml)
      return ra_errorf(err, RA_EINVAL, "%s %s: sequence %d has a missing tensor", be_name, op, i);
    if (it->k_cache->ndim != 3 || it->n < 1 || it->n > it->k_cache->shape[0])
      return ra_errorf(err, RA_EINVAL, "%s %s: sequence %d: %lld rows of a cache that is not [n_ctx >= them, "
                       "n_kv_heads, head_dim]", be_name, op, i, (long long)it->n);
    if (i > 0 && (nelem(it->q) != nelem(i0->q) || it->k_cache->dtype != i0->k_cache->dtype ||
                  it->k_cache->shape[1] != i0->k_cache->shape[1] || it->k_cache->shape[2] != i0->k_cache->shape[2]))
      return ra_errorf(err, RA_EINVAL, "%s %s: sequence %d's geometry or cache dtype differs from sequence 0's",
                       be_name, op, i);
    ra_token_range all = {0, it->n};
    int rc = ra_backend_check_attn_decode(be_name, it->q, it->k_cache, it->v_cache, &all, 1, it->o, it->ml, err);
    if (rc) return rc;
  }
  return RA_OK;
}

int ra_backend_check_attn_merge(const char *be_name, const ra_tensor *o_acc, const ra_tensor *ml_acc,
                                const ra_tensor *o, const ra_tensor *ml, ra_error *err) {
  const char *op = "attn_merge";
  int rc;
  if ((rc = ra_backend_check_dtype(be_name, o_acc, RA_DTYPE_F32, op, "o_acc", err)) ||
      (rc = ra_backend_check_dtype(be_name, ml_acc, RA_DTYPE_F32, op, "ml_acc", err)) ||
      (rc = ra_backend_check_dtype(be_name, o, RA_DTYPE_F32, op, "o", err)) ||
      (rc = ra_backend_check_dtype(be_name, ml, RA_DTYPE_F32, op, "ml", err)))
    return rc;
  size_t heads = nelem(ml) / 2;
  if (heads == 0 || nelem(ml_acc) != heads * 2 || nelem(o) != nelem(o_acc) || nelem(o) % heads != 0)
    return ra_errorf(err, RA_EINVAL, "%s %s: shapes differ", be_name, op);
  return RA_OK;
}
