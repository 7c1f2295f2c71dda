#include "backend_check_wave.h"

#include "backend_check.h"

#include <stdint.h>

int64_t ra_wave_n_clusters(int64_t n, int64_t seg_len, int64_t cluster_size) {
  if (seg_len <= 0 || cluster_size <= 0) return -1;
  if (n <= 0) return 0;
  int64_t full = n / seg_len, tail = n % seg_len;
  return full * ((seg_len + cluster_size - 1) / cluster_size) + (tail + cluster_size - 1) / cluster_size;
}

static size_t nelem(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

static int known(ra_dtype d) { return d == RA_DTYPE_F32 || d == RA_DTYPE_F16 || d == RA_DTYPE_BF16; }

/* centroid [hkv, cap, hd], size [hkv, cap] and (when given) vsum [hkv, cap, hd], all F32. */
static int check_clusters(const char *be, const char *op, const ra_tensor *centroid, const ra_tensor *size,
                          const ra_tensor *vsum, int64_t hd, ra_error *err) {
  int rc;
  if ((rc = ra_backend_check_dtype(be, centroid, RA_DTYPE_F32, op, "centroid", err)) ||
      (rc = ra_backend_check_dtype(be, size, RA_DTYPE_F32, op, "size", err)) ||
      (vsum && (rc = ra_backend_check_dtype(be, vsum, RA_DTYPE_F32, op, "vsum", err))))
    return rc;
  if (centroid->ndim != 3 || (hd > 0 && centroid->shape[2] != hd))
    return ra_errorf(err, RA_EINVAL, "%s %s: centroid must be [n_kv_heads, cap, %lld]", be, op, (long long)hd);
  if (size->ndim != 2 || size->shape[0] != centroid->shape[0] || size->shape[1] != centroid->shape[1])
    return ra_errorf(err, RA_EINVAL, "%s %s: size must be [%lld, %lld] like centroid", be, op,
                     (long long)centroid->shape[0], (long long)centroid->shape[1]);
  if (vsum && (vsum->ndim != 3 || vsum->shape[0] != centroid->shape[0] || vsum->shape[1] != centroid->shape[1] ||
               vsum->shape[2] != centroid->shape[2]))
    return ra_errorf(err, RA_EINVAL, "%s %s: vsum must have centroid's shape", be, op);
  return RA_OK;
}

int ra_backend_check_wave_cluster(const char *be_name, const ra_tensor *kc, const ra_tensor *vc, int64_t row0,
                                  int64_t n, const ra_wave_cluster_params *p, const ra_tensor *centroid,
                                  const ra_tensor *size, const ra_tensor *vsum, int64_t c0, const ra_tensor *out_k,
                                  const ra_tensor *out_v, const int32_t *perm, const int32_t *counts,
                                  int64_t *n_clusters, ra_error *err) {
  const char *op = "cluster_keys";
  if (!kc || !vc || !kc->data || !vc->data || kc->ndim != 3 || vc->ndim != 3 || !known(kc->dtype) ||
      kc->dtype != vc->dtype)
    return ra_errorf(err, RA_EINVAL, "%s %s: k_cache and v_cache must be allocated [n_ctx, n_kv_heads, head_dim] of one dtype",
                     be_name, op);
  for (int d = 0; d < 3; d++)
    if (kc->shape[d] != vc->shape[d])
      return ra_errorf(err, RA_EINVAL, "%s %s: k_cache and v_cache differ in shape", be_name, op);
  int64_t hkv = kc->shape[1], hd = kc->shape[2];
  if (n < 1 || n > INT32_MAX || row0 < 0 || row0 + n > kc->shape[0])
    return ra_errorf(err, RA_EINVAL, "%s %s: rows [%lld, %lld) are not inside the cache of %lld", be_name, op,
                     (long long)row0, (long long)(row0 + n), (long long)kc->shape[0]);
  if (!p || p->seg_len < 1 || p->cluster_size < 1 || p->iters < 1)
    return ra_errorf(err, RA_EINVAL, "%s %s: seg_len, cluster_size and iters must be positive", be_name, op);
  int rc = check_clusters(be_name, op, centroid, size, vsum, hd, err);
  if (rc) return rc;
  if (!vsum) return ra_errorf(err, RA_EINVAL, "%s %s: vsum is required", be_name, op);
  if (centroid->shape[0] != hkv)
    return ra_errorf(err, RA_EINVAL, "%s %s: centroid has %lld kv heads, the caches %lld", be_name, op,
                     (long long)centroid->shape[0], (long long)hkv);
  int64_t k = ra_wave_n_clusters(n, p->seg_len, p->cluster_size);
  if (c0 < 0 || c0 + k > centroid->shape[1])
    return ra_errorf(err, RA_EINVAL, "%s %s: clusters [%lld, %lld) do not fit the capacity %lld", be_name, op,
                     (long long)c0, (long long)(c0 + k), (long long)centroid->shape[1]);
  const ra_tensor *outs[2] = {out_k, out_v};
  for (int i = 0; i < 2; i++) {
    const ra_tensor *t = outs[i];
    if (t && (!t->data || !known(t->dtype) || t->ndim != 3 || t->shape[0] != hkv || t->shape[1] != n ||
              t->shape[2] != hd))
      return ra_errorf(err, RA_EINVAL, "%s %s: %s must be [%lld, %lld, %lld]", be_name, op, i ? "out_v" : "out_k",
                       (long long)hkv, (long long)n, (long long)hd);
  }
  if (!perm || !counts) return ra_errorf(err, RA_EINVAL, "%s %s: perm and counts are required", be_name, op);
  *n_clusters = k;
  return RA_OK;
}

/* q grouping over the clusters' kv heads; o and ml (when given) sized for its heads. */
static int check_query(const char *be, const char *op, const ra_tensor *q, const ra_tensor *centroid,
                       const ra_tensor *size, const ra_tensor *vsum, int64_t n_clusters, const ra_tensor *o,
                       const ra_tensor *ml, ra_error *err) {
  int rc;
  if ((rc = ra_backend_check_dtype(be, q, RA_DTYPE_F32, op, "q", err))) return rc;
  int64_t hd = q->shape[q->ndim - 1], hq = (int64_t)nelem(q) / hd;
  if ((rc = check_clusters(be, op, centroid, size, vsum, hd, err))) return rc;
  int64_t hkv = centroid->shape[0];
  if (hkv <= 0 || hq % hkv != 0)
    return ra_errorf(err, RA_EINVAL, "%s %s: %lld q heads do not group over %lld kv heads", be, op, (long long)hq,
                     (long long)hkv);
  if (n_clusters < 0 || n_clusters > centroid->shape[1] || n_clusters > INT32_MAX)
    return ra_errorf(err, RA_EINVAL, "%s %s: %lld clusters of a capacity of %lld", be, op, (long long)n_clusters,
                     (long long)centroid->shape[1]);
  if (!o && !ml) return RA_OK;
  if (!o || !ml) return ra_errorf(err, RA_EINVAL, "%s %s: o and ml go together", be, op);
  if ((rc = ra_backend_check_dtype(be, o, RA_DTYPE_F32, op, "o", err)) ||
      (rc = ra_backend_check_dtype(be, ml, RA_DTYPE_F32, op, "ml", err)))
    return rc;
  if ((int64_t)nelem(o) != hq * hd || (int64_t)nelem(ml) != hq * 2)
    return ra_errorf(err, RA_EINVAL, "%s %s: o must be [%lld, %lld] and ml [%lld, 2]", be, op, (long long)hq,
                     (long long)hd, (long long)hq);
  if (!vsum) return ra_errorf(err, RA_EINVAL, "%s %s: the estimate needs vsum", be, op);
  return RA_OK;
}

int ra_backend_check_wave_select(const char *be_name, const ra_tensor *q, const ra_tensor *centroid,
                                 const ra_tensor *size, int64_t n_clusters, int r, int e, const int32_t *idx,
                                 const ra_tensor *vsum, const ra_tensor *o, const ra_tensor *ml, ra_error *err) {
  const char *op = "wave_select";
  int rc = check_query(be_name, op, q, centroid, size, vsum, n_clusters, o, ml, err);
  if (rc) return rc;
  if (r < 0 || e < 0 || (int64_t)r + e < 1 || (int64_t)r + e > INT32_MAX)
    return ra_errorf(err, RA_EINVAL, "%s %s: zones r %d and e %d (need r, e >= 0 and r + e >= 1)", be_name, op, r, e);
  if (!idx) return ra_errorf(err, RA_EINVAL, "%s %s: idx is required", be_name, op);
  return RA_OK;
}

int ra_backend_check_wave_estimate(const char *be_name, const ra_tensor *q, const ra_tensor *centroid,
                                   const ra_tensor *size, const ra_tensor *vsum, int64_t n_clusters,
                                   const int32_t *ids, int n_ids, int64_t ld, const ra_tensor *o,
                                   const ra_tensor *ml, ra_error *err) {
  const char *op = "wave_estimate";
  if (!vsum || !o || !ml) return ra_errorf(err, RA_EINVAL, "%s %s: vsum, o and ml are required", be_name, op);
  int rc = check_query(be_name, op, q, centroid, size, vsum, n_clusters, o, ml, err);
  if (rc) return rc;
  if (n_ids < 0 || ld < n_ids || (n_ids > 0 && !ids))
    return ra_errorf(err, RA_EINVAL, "%s %s: %d ids with a row stride of %lld", be_name, op, n_ids, (long long)ld);
  for (int64_t h = 0; h < centroid->shape[0]; h++)
    for (int j = 0; j < n_ids; j++) {
      int32_t c = ids[h * ld + j];
      if (c < -1 || c >= n_clusters)
        return ra_errorf(err, RA_EINVAL, "%s %s: cluster id %d of kv head %lld outside [0, %lld)", be_name, op, c,
                         (long long)h, (long long)n_clusters);
    }
  return RA_OK;
}
