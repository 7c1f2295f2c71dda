#include "backend.h"

#include <string.h>

#ifdef RA_WITH_CUDA
#include "backend_cuda.h"
#endif

int ra_backend_create(const char *name, const ra_backend_config *cfg, ra_backend **out, ra_error *err) {
  if (strcmp(name, "cpu") == 0) return ra_backend_cpu_create(cfg, out, err);
  if (strcmp(name, "cuda") == 0) {
#ifdef RA_WITH_CUDA
    return ra_backend_cuda_create(cfg, out, err);
#else
    return ra_errorf(err, RA_EUNSUPPORTED, "backend: the cuda backend is not built into this binary");
#endif
  }
  return ra_errorf(err, RA_EINVAL, "backend: unknown backend '%s' (cpu or cuda)", name);
}

void ra_backend_destroy(ra_backend *be) {
  if (be) be->ops->destroy(be);
}

size_t ra_tensor_nelem(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

int ra_tensor_new(ra_backend *be, ra_tensor *t, ra_dtype dtype, int ndim, const int64_t *shape, ra_error *err) {
  memset(t, 0, sizeof(*t));
  if (ndim < 1 || ndim > RA_TENSOR_MAX_DIMS) return ra_errorf(err, RA_EINVAL, "tensor: %d dims", ndim);
  t->be = be;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0) return ra_errorf(err, RA_EINVAL, "tensor: dim %d is %lld", i, (long long)shape[i]);
    t->shape[i] = shape[i];
  }
  t->nbytes = ra_tensor_nelem(t) * ra_dtype_size(dtype);
  int rc = be->ops->alloc(be, t, err);
  if (rc != RA_OK) memset(t, 0, sizeof(*t));
  return rc;
}

void ra_tensor_free(ra_tensor *t) {
  if (t->be && t->data) t->be->ops->free(t->be, t);
  memset(t, 0, sizeof(*t));
}

ra_tensor ra_tensor_rows(const ra_tensor *t, int64_t row0, int64_t n_rows) {
  ra_tensor v = *t;
  size_t row_bytes = t->nbytes / (size_t)t->shape[0];
  v.shape[0] = n_rows;
  v.data = (char *)t->data + (size_t)row0 * row_bytes;
  v.nbytes = (size_t)n_rows * row_bytes;
  return v;
}

ra_tensor ra_tensor_matrix(const ra_tensor *t, int64_t row_len) {
  ra_tensor v = *t;
  v.ndim = 2;
  v.shape[0] = (int64_t)(ra_tensor_nelem(t) / (size_t)row_len);
  v.shape[1] = row_len;
  for (int i = 2; i < RA_TENSOR_MAX_DIMS; i++) v.shape[i] = 0;
  return v;
}
