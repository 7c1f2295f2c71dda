/* The CUDA backend's ops table: argument checks (the contract shared with the CPU backend is in
 * backend_check.h), memory, scratch buffers, cuBLAS, and dispatch to the kernels of cuda_*.cu. */
#include "cuda_wave.cuh"
#include "ra_cuda.cuh"

#include <cublas_v2.h>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend_check.h"
#include "backend_cuda.h"
#include "backend_fused.h"
}

namespace {

/* A device scratch buffer that only grows. Ops on the one stream run in order, so a buffer can
 * be reused by the next op without waiting; growing frees the old one (cudaFree waits for the
 * device). */
struct scratch {
  void *p = nullptr;
  size_t cap = 0;
};

struct cuda_impl {
  int device = 0;
  int n_sm = 0;
  int cc_major = 0; /* compute capability: PDL needs 9 */
  int gemv_max_x = RA_CUDA_GEMV_MAX_X; /* matmul: rows of x the GEMV takes (ra_backend_cuda_set_gemv_rows) */
  int mma_max_x = RA_CUDA_MMA_DEFAULT_X;   /* and the tensor-core kernel of a few rows (ra_backend_cuda_set_mma_rows) */
  int decode_batch_waves = RA_CUDA_DECODE_BATCH_WAVES; /* attn_decode_batch's warps (set_decode_batch_waves) */
  size_t mem_bytes = 0;
  char dev_name[256] = {0};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  scratch xconv;  /* matmul: x in BF16/F16 for cuBLAS */
  scratch ids;    /* get_rows: token ids */
  scratch ranges; /* attn_decode: range tables beyond RA_CUDA_INLINE_RANGES */
  scratch part;   /* attn_decode: split partials */
  scratch topk;   /* topk_rows: idx + val of a batch of rows */
  scratch raw;    /* load_weight: raw GGUF bytes */
  ra_cuda_wave_scratch wave = {nullptr, 0}; /* cluster_keys, wave_select, wave_estimate */
  ra_cuda_wave_scratch wave_pinned = {nullptr, 0}; /* wave_select's ids, host */
  void *stage = nullptr; /* [RA_CUDA_STAGE_BYTES] pinned host memory: download's bounce buffer */
  scratch widen;         /* download into pinned memory: a chunk widened to fp32 on the device */
};

inline cuda_impl *impl_of(ra_backend *be) { return (cuda_impl *)be->impl; }

int cuda_fail(ra_error *err, const char *op, const char *what, cudaError_t e) {
  int code = e == cudaErrorMemoryAllocation ? RA_ENOMEM : RA_EINTERNAL;
  return ra_errorf(err, code, "cuda %s: %s: %s (%s)", op, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int blas_fail(ra_error *err, const char *op, cublasStatus_t st) {
  int code = st == CUBLAS_STATUS_ALLOC_FAILED ? RA_ENOMEM : RA_EINTERNAL;
  return ra_errorf(err, code, "cuda %s: cuBLAS: %s (%d)", op, cublasGetStatusString(st), (int)st);
}

#define CU_TRY(op, call)                                    \
  do {                                                      \
    cudaError_t e_ = (call);                                \
    if (e_ != cudaSuccess) return cuda_fail(err, op, #call, e_); \
  } while (0)

int grow(scratch *s, size_t bytes, const char *op, ra_error *err) {
  if (bytes <= s->cap) return RA_OK;
  if (s->p) {
    cudaError_t e = cudaFree(s->p);
    s->p = nullptr;
    s->cap = 0;
    if (e != cudaSuccess) return cuda_fail(err, op, "cudaFree(scratch)", e);
  }
  size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
  cudaError_t e = cudaMalloc(&s->p, cap);
  if (e != cudaSuccess) {
    s->p = nullptr;
    return ra_errorf(err, e == cudaErrorMemoryAllocation ? RA_ENOMEM : RA_EINTERNAL,
                     "cuda %s: cannot allocate %zu bytes of scratch: %s", op, cap, cudaGetErrorString(e));
  }
  s->cap = cap;
  return RA_OK;
}

void release(scratch *s) {
  if (s->p) cudaFree(s->p);
  s->p = nullptr;
  s->cap = 0;
}

/* ---------- checks (mirroring backend_cpu.c) ---------- */

size_t nelem(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}
int64_t last_dim(const ra_tensor *t) { return t->shape[t->ndim - 1]; }
int64_t n_rows(const ra_tensor *t) { return (int64_t)(nelem(t) / (size_t)last_dim(t)); }
bool known_dtype(ra_dtype d) { return d == RA_DTYPE_F32 || d == RA_DTYPE_F16 || d == RA_DTYPE_BF16; }

int want_tensor(const ra_tensor *t, const char *op, const char *name, ra_error *err) {
  if (!t || !t->data) return ra_errorf(err, RA_EINVAL, "cuda %s: %s is not allocated", op, name);
  if (!known_dtype(t->dtype)) return ra_errorf(err, RA_EINVAL, "cuda %s: %s has dtype %d", op, name, (int)t->dtype);
  return RA_OK;
}

int want_dtype(const ra_tensor *t, ra_dtype dt, const char *op, const char *name, ra_error *err) {
  int rc = want_tensor(t, op, name, err);
  if (rc) return rc;
  if (t->dtype != dt)
    return ra_errorf(err, RA_EINVAL, "cuda %s: %s is %s, want %s", op, name, ra_dtype_name(t->dtype), ra_dtype_name(dt));
  return RA_OK;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---------- memory ---------- */

int cu_alloc(ra_backend *be, ra_tensor *t, ra_error *err) {
  cuda_impl *im = impl_of(be);
  t->be = be;
  t->data = nullptr;
  size_t bytes = t->nbytes ? t->nbytes : 1;
  cudaError_t e = cudaMalloc(&t->data, bytes);
  if (e != cudaSuccess) {
    t->data = nullptr;
    return ra_errorf(err, e == cudaErrorMemoryAllocation ? RA_ENOMEM : RA_EINTERNAL,
                     "cuda alloc: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(e));
  }
  e = cudaMemsetAsync(t->data, 0, bytes, im->stream);
  if (e != cudaSuccess) {
    cudaFree(t->data);
    t->data = nullptr;
    return cuda_fail(err, "alloc", "cudaMemsetAsync", e);
  }
  return RA_OK;
}

void cu_free(ra_backend *be, ra_tensor *t) {
  (void)be;
  if (t->data) cudaFree(t->data); /* waits for queued work that may still use it */
  t->data = nullptr;
}

int range_ok(const ra_tensor *t, size_t off, size_t n) { return off <= nelem(t) && n <= nelem(t) - off; }

/* t a device tensor that holds elements [off, off + n): the host copies' common check */
int check_span(const ra_tensor *t, size_t off, size_t n, const char *op, ra_error *err) {
  int rc = want_tensor(t, op, "t", err);
  if (rc) return rc;
  if (!range_ok(t, off, n))
    return ra_errorf(err, RA_EINVAL, "cuda %s: [%zu, +%zu) outside %zu elements", op, off, n, nelem(t));
  return RA_OK;
}

int cu_upload(ra_backend *be, ra_tensor *t, size_t off, const float *src, size_t n, ra_error *err) {
  int rc = check_span(t, off, n, "upload", err);
  if (rc) return rc;
  if (n == 0) return RA_OK;
  cuda_impl *im = impl_of(be);
  size_t es = ra_dtype_size(t->dtype);
  char *dst = (char *)t->data + off * es;
  if (t->dtype == RA_DTYPE_F32) {
    /* pageable source: CUDA stages it before returning, so `src` may go away right after */
    CU_TRY("upload", cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyHostToDevice, im->stream));
    return RA_OK;
  }
  void *tmp = malloc(n * es);
  if (!tmp) return ra_errorf(err, RA_ENOMEM, "cuda upload: no host memory for %zu elements", n);
  ra_dtype_from_fp32_n(t->dtype, src, tmp, n);
  cudaError_t e = cudaMemcpyAsync(dst, tmp, n * es, cudaMemcpyHostToDevice, im->stream);
  free(tmp);
  if (e != cudaSuccess) return cuda_fail(err, "upload", "cudaMemcpyAsync", e);
  return RA_OK;
}

/* A download of a 16-bit tensor into pageable memory lands in pinned memory a chunk at a time
 * and is widened to fp32 by all cores, not through a fresh pageable malloc widened by one
 * thread; into host_alloc's pinned memory it is widened on the device instead (the host's
 * cores are the kv-stores' while a prefill offloads). The offloading
 * prefill downloads each layer's K and V (268 MB of bf16 each for 128K tokens of Llama-3-8B) on
 * the device's critical path (5.8 s in all for those 32 layers: bench/results/h200/README.md,
 * the 28b8a21 prefill breakdown). */
#define RA_CUDA_STAGE_BYTES ((size_t)64 << 20)

void widen_parallel(ra_dtype dt, const void *src, float *dst, size_t n) {
  const size_t block = (size_t)1 << 16, es = ra_dtype_size(dt);
  const long nb = (long)((n + block - 1) / block);
#pragma omp parallel for schedule(static) if (nb > 1)
  for (long b = 0; b < nb; b++) {
    size_t i = (size_t)b * block, m = n - i < block ? n - i : block;
    ra_dtype_to_fp32_n(dt, (const char *)src + i * es, dst + i, m);
  }
}

int cu_download(ra_backend *be, const ra_tensor *t, size_t off, float *dst, size_t n, ra_error *err) {
  int rc = check_span(t, off, n, "download", err);
  if (rc) return rc;
  cuda_impl *im = impl_of(be);
  if (n == 0) {
    CU_TRY("download", cudaStreamSynchronize(im->stream));
    return RA_OK;
  }
  size_t es = ra_dtype_size(t->dtype);
  const char *src = (const char *)t->data + off * es;
  if (t->dtype == RA_DTYPE_F32) {
    CU_TRY("download", cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToHost, im->stream));
    CU_TRY("download", cudaStreamSynchronize(im->stream));
    return RA_OK;
  }
  /* pinned dst (host_alloc): widened on the device a chunk at a time and copied by DMA, with
   * one sync; the stream orders each chunk's widen after the previous chunk's copy */
  cudaPointerAttributes pa;
  if (cudaPointerGetAttributes(&pa, dst) == cudaSuccess && pa.type == cudaMemoryTypeHost) {
    const size_t per = RA_CUDA_STAGE_BYTES / 4;
    int rc = grow(&im->widen, (n < per ? n : per) * 4, "download", err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i += per) {
      size_t m = n - i < per ? n - i : per;
      CU_TRY("download", ra_cuda_convert(im->stream, im->widen.p, RA_DTYPE_F32, src + i * es, t->dtype, m));
      CU_TRY("download", cudaMemcpyAsync(dst + i, im->widen.p, m * 4, cudaMemcpyDeviceToHost, im->stream));
    }
    CU_TRY("download", cudaStreamSynchronize(im->stream));
    return RA_OK;
  }
  cudaGetLastError(); /* a pageable dst may leave cudaPointerGetAttributes' error behind */
  if (!im->stage) {
    cudaError_t e = cudaMallocHost(&im->stage, RA_CUDA_STAGE_BYTES);
    if (e != cudaSuccess) {
      im->stage = nullptr;
      return cuda_fail(err, "download", "cudaMallocHost(stage)", e);
    }
  }
  const size_t per = RA_CUDA_STAGE_BYTES / es;
  for (size_t i = 0; i < n; i += per) {
    size_t m = n - i < per ? n - i : per;
    CU_TRY("download", cudaMemcpyAsync(im->stage, src + i * es, m * es, cudaMemcpyDeviceToHost, im->stream));
    CU_TRY("download", cudaStreamSynchronize(im->stream));
    widen_parallel(t->dtype, im->stage, dst + i, m);
  }
  return RA_OK;
}

int cu_download_raw(ra_backend *be, const ra_tensor *t, size_t off, void *dst, size_t n, ra_error *err) {
  int rc = check_span(t, off, n, "download_raw", err);
  if (rc) return rc;
  cuda_impl *im = impl_of(be);
  const size_t es = ra_dtype_size(t->dtype);
  if (n) CU_TRY("download_raw", cudaMemcpyAsync(dst, (const char *)t->data + off * es, n * es,
                                                cudaMemcpyDeviceToHost, im->stream));
  CU_TRY("download_raw", cudaStreamSynchronize(im->stream));
  return RA_OK;
}

int cu_host_alloc(ra_backend *be, size_t bytes, void **out, ra_error *err) {
  (void)be;
  *out = nullptr;
  /* portable: pinned for every device's context */
  CU_TRY("host_alloc", cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
  return RA_OK;
}

void cu_host_free(ra_backend *be, void *p) {
  (void)be;
  if (p) cudaFreeHost(p);
}

int cu_copy(ra_backend *be, ra_tensor *dst, size_t doff, const ra_tensor *src, size_t soff, size_t n, ra_error *err) {
  int rc;
  if ((rc = want_tensor(dst, "copy", "dst", err)) || (rc = want_tensor(src, "copy", "src", err))) return rc;
  if (!range_ok(dst, doff, n) || !range_ok(src, soff, n))
    return ra_errorf(err, RA_EINVAL, "cuda copy: %zu elements out of bounds", n);
  if (n == 0) return RA_OK;
  cuda_impl *im = impl_of(be);
  char *d = (char *)dst->data + doff * ra_dtype_size(dst->dtype);
  const char *s = (const char *)src->data + soff * ra_dtype_size(src->dtype);
  if (dst->dtype == src->dtype)
    CU_TRY("copy", cudaMemcpyAsync(d, s, n * ra_dtype_size(src->dtype), cudaMemcpyDeviceToDevice, im->stream));
  else
    CU_TRY("copy", ra_cuda_convert(im->stream, d, dst->dtype, s, src->dtype, n));
  return RA_OK;
}

int cu_load_weight(ra_backend *be, const void *raw, uint32_t type, int64_t rows, int64_t cols, ra_tensor *out,
                   ra_error *err) {
  size_t bv = 0, bb = 0;
  if (rows <= 0 || cols <= 0 || !ra_cuda_ggml_supported(type, &bv, &bb) || (uint64_t)cols % bv != 0)
    return ra_errorf(err, RA_EINVAL, "cuda load_weight: cannot load [%lld, %lld] of ggml type %u", (long long)rows,
                     (long long)cols, type);
  cuda_impl *im = impl_of(be);
  size_t row_bytes = (size_t)cols / bv * bb, total = row_bytes * (size_t)rows;
  /* matrices in BF16 (half the bytes of F32 for every matmul); vectors in F32 */
  ra_dtype dt = rows == 1 ? RA_DTYPE_F32 : RA_DTYPE_BF16;
  memset(out, 0, sizeof(*out));
  out->dtype = dt;
  out->ndim = 2;
  out->shape[0] = rows;
  out->shape[1] = cols;
  out->nbytes = (size_t)rows * (size_t)cols * ra_dtype_size(dt);
  int rc = cu_alloc(be, out, err);
  if (rc) {
    memset(out, 0, sizeof(*out));
    return rc;
  }
  cudaError_t e;
  if ((rc = grow(&im->raw, total, "load_weight", err)) != RA_OK) goto fail;
  if ((e = cudaMemcpyAsync(im->raw.p, raw, total, cudaMemcpyHostToDevice, im->stream)) != cudaSuccess) {
    rc = cuda_fail(err, "load_weight", "cudaMemcpyAsync", e);
    goto fail;
  }
  if ((e = ra_cuda_dequant(im->stream, im->raw.p, type, rows, cols, row_bytes, out->data, dt)) != cudaSuccess) {
    rc = cuda_fail(err, "load_weight", "dequantize kernel", e);
    goto fail;
  }
  /* one weight's raw bytes can be a gigabyte: do not keep the staging buffer around */
  if (im->raw.cap > ((size_t)256 << 20)) release(&im->raw);
  return RA_OK;
fail:
  cu_free(be, out);
  memset(out, 0, sizeof(*out));
  return rc;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int cu_fill_random(ra_backend *be, ra_tensor *t, uint64_t seed, float center, float scale, ra_error *err) {
  int rc = want_tensor(t, "fill_random", "t", err);
  if (rc) return rc;
  CU_TRY("fill_random",
         ra_cuda_fill_random(impl_of(be)->stream, t->data, t->dtype, nelem(t), splitmix64(seed), center, scale));
  return RA_OK;
}

/* ---------- layer ops ---------- */

int cu_get_rows(ra_backend *be, const ra_tensor *table, const int32_t *ids, int64_t n, ra_tensor *out, ra_error *err) {
  int rc;
  if ((rc = want_tensor(table, "get_rows", "table", err)) || (rc = want_dtype(out, RA_DTYPE_F32, "get_rows", "out", err)))
    return rc;
  int64_t dim = last_dim(table), vocab = n_rows(table);
  if (n < 0 || last_dim(out) != dim || n_rows(out) < n)
    return ra_errorf(err, RA_EINVAL, "cuda get_rows: out is not [%lld, %lld]", (long long)n, (long long)dim);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return ra_errorf(err, RA_EINVAL, "cuda get_rows: id %d outside [0, %lld)", ids[i], (long long)vocab);
  if (n == 0) return RA_OK;
  cuda_impl *im = impl_of(be);
  const int32_t *d_ids = nullptr;
  if (n > RA_CUDA_INLINE_IDS) {
    if ((rc = grow(&im->ids, (size_t)n * sizeof(int32_t), "get_rows", err))) return rc;
    CU_TRY("get_rows", cudaMemcpyAsync(im->ids.p, ids, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, im->stream));
    d_ids = (const int32_t *)im->ids.p;
  }
  CU_TRY("get_rows", ra_cuda_get_rows(im->stream, table->data, table->dtype, dim, ids, d_ids, n, (float *)out->data));
  return RA_OK;
}

int cu_set_rows(ra_backend *be, ra_tensor *table, const int32_t *ids, int64_t n, const ra_tensor *src,
                ra_error *err) {
  int rc = ra_backend_check_set_rows("cuda", table, ids, n, src, err);
  if (rc || n == 0) return rc;
  cuda_impl *im = impl_of(be);
  const int32_t *d_ids = nullptr;
  if (n > RA_CUDA_INLINE_IDS) {
    if ((rc = grow(&im->ids, (size_t)n * sizeof(int32_t), "set_rows", err))) return rc;
    CU_TRY("set_rows", cudaMemcpyAsync(im->ids.p, ids, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, im->stream));
    d_ids = (const int32_t *)im->ids.p;
  }
  CU_TRY("set_rows", ra_cuda_set_rows(im->stream, table->data, table->dtype, last_dim(table), ids, d_ids, n,
                                      (const float *)src->data));
  return RA_OK;
}

/* Whether x [n, k] against weights w_i [m_i, k] (i < n_w, of one 16-bit type) take the
 * tensor-core kernel of a few rows: past the GEMV's rows, up to mma_max_x. */
bool mma_takes(const cuda_impl *im, int64_t n, int64_t k, int n_w, const ra_tensor *const *w) {
  if (n <= im->gemv_max_x || n > im->mma_max_x || k % 8 != 0) return false;
  for (int i = 0; i < n_w; i++)
    if ((w[i]->dtype != RA_DTYPE_BF16 && w[i]->dtype != RA_DTYPE_F16) || w[i]->dtype != w[0]->dtype ||
        !aligned16(w[i]->data))
      return false;
  return true;
}

/* The argument block of ra_cuda_gemm_rows for x [n, k] in w_dtype; the caller adds the weights. */
ra_cuda_gemv_args mma_args(const cuda_impl *im, int64_t n, int64_t k, int w_dtype) {
  ra_cuda_gemv_args a = {};
  a.n_x = (int)n;
  a.k = k;
  a.w_dtype = w_dtype;
  a.n_sm = im->n_sm;
  return a;
}

/* y [n, m] = xb W^T (+ bias) (+ y) through cuBLAS, xb [n, k] already in W's dtype (the 16-bit
 * types; F32 with an F32 W). Column-major: y^T [m, n] = W [k, m]^T xb^T [k, n]; a bias is put
 * into y first and then accumulated with beta = 1. */
int blas_matmul(cuda_impl *im, const char *op, const void *xb, int64_t n, int64_t k, const ra_tensor *w,
                const ra_tensor *bias, float *y, int accumulate, ra_error *err) {
  const int64_t m = n_rows(w);
  float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (bias) {
    CU_TRY(op, ra_cuda_bias_rows(im->stream, y, bias->data, bias->dtype, n, m, accumulate));
    beta = 1.0f;
  }
  cudaDataType_t ab_type = w->dtype == RA_DTYPE_BF16 ? CUDA_R_16BF : w->dtype == RA_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
  cublasStatus_t st = cublasGemmEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &alpha, w->data, ab_type,
                                   (int)k, xb, ab_type, (int)k, &beta, y, CUDA_R_32F, (int)m, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return blas_fail(err, op, st);
  return RA_OK;
}

int cu_matmul(ra_backend *be, const ra_tensor *x, const ra_tensor *w, const ra_tensor *bias, ra_tensor *y,
              int accumulate, ra_error *err) {
  int rc;
  if ((rc = want_dtype(x, RA_DTYPE_F32, "matmul", "x", err)) || (rc = want_tensor(w, "matmul", "w", err)) ||
      (rc = want_dtype(y, RA_DTYPE_F32, "matmul", "y", err)))
    return rc;
  /* As on the CPU: x and y are [n, ...] with everything after the first dim flattened, so the
   * model's q [n, heads, hd] is [n, heads * hd]. */
  int64_t n = x->shape[0], k = (int64_t)nelem(x) / (n ? n : 1), m = n_rows(w);
  if (n < 1 || last_dim(w) != k || y->shape[0] != n || (int64_t)nelem(y) != n * m)
    return ra_errorf(err, RA_EINVAL, "cuda matmul: x [%lld, %lld] w [%lld, %lld] y [%lld, %lld] do not fit",
                     (long long)n, (long long)k, (long long)m, (long long)last_dim(w), (long long)y->shape[0],
                     (long long)(nelem(y) / (size_t)(y->shape[0] ? y->shape[0] : 1)));
  if (bias && ((rc = want_tensor(bias, "matmul", "bias", err)) || (int64_t)nelem(bias) != m))
    return rc ? rc : ra_errorf(err, RA_EINVAL, "cuda matmul: bias is not [%lld]", (long long)m);
  if (k > INT32_MAX || m > INT32_MAX || n > INT32_MAX)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda matmul: dimensions beyond 2^31");
  cuda_impl *im = impl_of(be);
  const void *bp = bias ? bias->data : nullptr;
  int bdt = bias ? bias->dtype : RA_DTYPE_F32;

  /* decode (a step of up to RA_CUDA_GEMV_MAX_X tokens): GEMV straight from the weights, bias
   * and residual fused */
  if (n <= im->gemv_max_x && w->dtype != RA_DTYPE_F32 && k % 8 == 0 && aligned16(w->data) && aligned16(x->data)) {
    CU_TRY("matmul", ra_cuda_gemv(im->stream, im->n_sm, w->data, w->dtype, (const float *)x->data, (int)n, bp, bdt,
                                  (float *)y->data, m, k, accumulate));
    return RA_OK;
  }
  const void *xb = x->data;
  if (w->dtype != RA_DTYPE_F32) {
    if ((rc = grow(&im->xconv, (size_t)n * (size_t)k * 2, "matmul", err))) return rc;
    CU_TRY("matmul", ra_cuda_convert(im->stream, im->xconv.p, w->dtype, x->data, RA_DTYPE_F32, (size_t)n * (size_t)k));
    xb = im->xconv.p;
  }
  /* a batched step (up to RA_CUDA_MMA_MAX_X tokens): the tensor-core kernel of a few rows */
  if (mma_takes(im, n, k, 1, &w)) {
    ra_cuda_gemv_args a = mma_args(im, n, k, w->dtype);
    a.w[0] = w->data;
    a.bias[0] = bp;
    a.bias_dtype[0] = bdt;
    a.y[0] = (float *)y->data;
    a.m[0] = m;
    a.accumulate = accumulate;
    CU_TRY("matmul", ra_cuda_gemm_rows(im->stream, &a, xb));
    return RA_OK;
  }
  return blas_matmul(im, "matmul", xb, n, k, w, bias, (float *)y->data, accumulate, err);
}

int cu_rmsnorm(ra_backend *be, const ra_tensor *x, const ra_tensor *w, float eps, ra_tensor *y, ra_error *err) {
  int rc;
  if ((rc = want_dtype(x, RA_DTYPE_F32, "rmsnorm", "x", err)) || (rc = want_tensor(w, "rmsnorm", "w", err)) ||
      (rc = want_dtype(y, RA_DTYPE_F32, "rmsnorm", "y", err)))
    return rc;
  int64_t d = last_dim(x), n = n_rows(x);
  if ((int64_t)nelem(w) != d || nelem(y) != nelem(x))
    return ra_errorf(err, RA_EINVAL, "cuda rmsnorm: shapes do not fit dim %lld", (long long)d);
  CU_TRY("rmsnorm", ra_cuda_rmsnorm(impl_of(be)->stream, (const float *)x->data, w->data, w->dtype, eps,
                                    (float *)y->data, n, d));
  return RA_OK;
}

int cu_rope(ra_backend *be, ra_tensor *x, int64_t pos0, int n_rot, float theta, ra_rope_style style, ra_error *err) {
  int rc = want_dtype(x, RA_DTYPE_F32, "rope", "x", err);
  if (rc) return rc;
  if (x->ndim != 3) return ra_errorf(err, RA_EINVAL, "cuda rope: x must be [n, heads, head_dim]");
  int64_t n = x->shape[0], h = x->shape[1], hd = x->shape[2];
  if (n_rot <= 0 || n_rot > hd || n_rot % 2)
    return ra_errorf(err, RA_EINVAL, "cuda rope: n_rot %d for head_dim %lld", n_rot, (long long)hd);
  if (style != RA_ROPE_NORM && style != RA_ROPE_NEOX) return ra_errorf(err, RA_EINVAL, "cuda rope: style %d", (int)style);
  CU_TRY("rope", ra_cuda_rope(impl_of(be)->stream, (float *)x->data, n, h, hd, pos0, n_rot, theta, style == RA_ROPE_NEOX));
  return RA_OK;
}

int cu_swiglu(ra_backend *be, const ra_tensor *gate, const ra_tensor *up, ra_tensor *out, ra_error *err) {
  int rc;
  if ((rc = want_dtype(gate, RA_DTYPE_F32, "swiglu", "gate", err)) || (rc = want_dtype(up, RA_DTYPE_F32, "swiglu", "up", err)) ||
      (rc = want_dtype(out, RA_DTYPE_F32, "swiglu", "out", err)))
    return rc;
  size_t n = nelem(gate);
  if (nelem(up) != n || nelem(out) != n) return ra_errorf(err, RA_EINVAL, "cuda swiglu: sizes differ");
  CU_TRY("swiglu", ra_cuda_swiglu(impl_of(be)->stream, (const float *)gate->data, (const float *)up->data,
                                  (float *)out->data, n));
  return RA_OK;
}

/* ---------- attention ---------- */

/* What the kernels need of valid caches (ra_backend_check_attn_*) beyond the table's contract:
 * a dtype they convert from, one dtype for both, 16-byte alignment for vector loads. */
int check_caches(const ra_tensor *kc, const ra_tensor *vc, const char *op, ra_error *err) {
  int rc;
  if ((rc = want_tensor(kc, op, "k_cache", err)) || (rc = want_tensor(vc, op, "v_cache", err))) return rc;
  if (kc->dtype != vc->dtype) return ra_errorf(err, RA_EINVAL, "cuda %s: k and v caches differ in dtype", op);
  if (!aligned16(kc->data) || !aligned16(vc->data))
    return ra_errorf(err, RA_EINVAL, "cuda %s: the caches' data is not 16-byte aligned", op);
  return RA_OK;
}

/* What the kernels support beyond the table's own checks. */
int check_attn_geometry(const char *op, int64_t hq, int64_t hkv, int64_t hd, ra_error *err) {
  if (hd % 8 != 0 || hd > 256)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: head_dim %lld (need a multiple of 8, at most 256)", op,
                     (long long)hd);
  if (hq / hkv > 4096 || !ra_cuda_attn_geometry_ok((int)(hq / hkv), (int)hd))
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: %lld q heads per kv head of dim %lld (at most %d values)", op,
                     (long long)(hq / hkv), (long long)hd, RA_CUDA_ATTN_MAX_GROUP_DIM);
  if (hq > 65535) return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: %lld q heads", op, (long long)hq);
  return RA_OK;
}

/* ---- fused ops: one launch where the model would issue a sequence; anything the fused
 * kernels do not cover (prefill rows, F32 weights, odd shapes) runs the sequence, whose ops
 * also report bad arguments ---- */

/* A batch-1 GEMV input the fused kernel takes: x [1, k] F32 with x staged in shared memory. */
bool gemv_input_ok(const ra_tensor *x, const ra_tensor *norm_w) {
  if (!x || !x->data || x->dtype != RA_DTYPE_F32 || x->shape[0] != 1 || !aligned16(x->data)) return false;
  int64_t k = (int64_t)nelem(x);
  return k % 8 == 0 && k <= RA_CUDA_GEMV_SMEM_COLS && norm_w && norm_w->data && known_dtype(norm_w->dtype) &&
         (int64_t)nelem(norm_w) == k;
}

/* A weight [m, k] of 16-bit type wdt with its output y [1, m] F32 (and bias [m]). */
bool gemv_output_ok(const ra_tensor *w, const ra_tensor *bias, const ra_tensor *y, int64_t k, ra_dtype wdt) {
  if (!w || !w->data || w->dtype != wdt || (wdt != RA_DTYPE_BF16 && wdt != RA_DTYPE_F16) || last_dim(w) != k ||
      !aligned16(w->data))
    return false;
  int64_t m = n_rows(w);
  if (!y || !y->data || y->dtype != RA_DTYPE_F32 || (int64_t)nelem(y) != m) return false;
  return !bias || (bias->data && known_dtype(bias->dtype) && (int64_t)nelem(bias) == m);
}

/* The GEMM path of the fused ops: x [n, k] F32 with n past the GEMV's rows, its RMSNorm weight,
 * and weights [m_i, k] of one 16-bit type with their outputs y_i [n, m_i] F32 (and biases). */
bool gemm_inputs_ok(const cuda_impl *im, const ra_tensor *x, const ra_tensor *norm_w, int n_out,
                    const ra_tensor *const *w, const ra_tensor *const *bias, ra_tensor *const *y) {
  if (!x || !x->data || x->dtype != RA_DTYPE_F32 || !norm_w || !norm_w->data || !known_dtype(norm_w->dtype)) return false;
  const int64_t k = last_dim(x), n = n_rows(x);
  if (n <= im->gemv_max_x || n > INT32_MAX || k > INT32_MAX || (int64_t)nelem(norm_w) != k) return false;
  for (int i = 0; i < n_out; i++) {
    const ra_tensor *b = bias ? bias[i] : nullptr;
    if (!w[i] || !w[i]->data || w[i]->dtype != w[0]->dtype || (w[i]->dtype != RA_DTYPE_BF16 && w[i]->dtype != RA_DTYPE_F16) ||
        last_dim(w[i]) != k || n_rows(w[i]) > INT32_MAX || !y[i] || !y[i]->data || y[i]->dtype != RA_DTYPE_F32 ||
        (int64_t)nelem(y[i]) != n * n_rows(w[i]) || (b && (!b->data || !known_dtype(b->dtype) || (int64_t)nelem(b) != n_rows(w[i]))))
      return false;
  }
  return true;
}

/* RMSNorm of x straight into the GEMM's 16-bit input (im->xconv, [n, k] of w_dtype): one pass
 * instead of a norm to F32 and a conversion per matmul. */
int norm_to_xconv(cuda_impl *im, const char *op, const ra_tensor *x, const ra_tensor *norm_w, float eps, int w_dtype,
                  ra_error *err) {
  const int64_t k = last_dim(x), n = n_rows(x);
  int rc = grow(&im->xconv, (size_t)n * (size_t)k * 2, op, err);
  if (rc) return rc;
  CU_TRY(op, ra_cuda_rmsnorm_to(im->stream, (const float *)x->data, norm_w->data, norm_w->dtype, eps, im->xconv.p,
                                w_dtype, n, k));
  return RA_OK;
}

int cu_norm_matmul(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn, int n_out,
                   const ra_tensor *const *w, const ra_tensor *const *bias, ra_tensor *const *y, ra_error *err) {
  cuda_impl *im = impl_of(be);
  if (n_out >= 1 && n_out <= 3 && gemm_inputs_ok(im, x, norm_w, n_out, w, bias, y)) {
    int rc = norm_to_xconv(im, "norm_matmul", x, norm_w, eps, w[0]->dtype, err);
    if (rc == RA_OK && mma_takes(im, n_rows(x), last_dim(x), n_out, w)) {
      ra_cuda_gemv_args a = mma_args(im, n_rows(x), last_dim(x), w[0]->dtype);
      for (int i = 0; i < n_out; i++) {
        a.w[i] = w[i]->data;
        a.bias[i] = bias && bias[i] ? bias[i]->data : nullptr;
        a.bias_dtype[i] = bias && bias[i] ? bias[i]->dtype : RA_DTYPE_F32;
        a.y[i] = (float *)y[i]->data;
        a.m[i] = n_rows(w[i]);
      }
      CU_TRY("norm_matmul", ra_cuda_gemm_rows(im->stream, &a, im->xconv.p));
      return RA_OK;
    }
    for (int i = 0; rc == RA_OK && i < n_out; i++)
      rc = blas_matmul(im, "norm_matmul", im->xconv.p, n_rows(x), last_dim(x), w[i], bias ? bias[i] : nullptr,
                       (float *)y[i]->data, 0, err);
    return rc;
  }
  bool fuse = n_out >= 1 && n_out <= 3 && gemv_input_ok(x, norm_w);
  const int64_t k = fuse ? (int64_t)nelem(x) : 0;
  for (int i = 0; fuse && i < n_out; i++) fuse = gemv_output_ok(w[i], bias ? bias[i] : nullptr, y[i], k, w[0]->dtype);
  if (!fuse) return ra_backend_seq_norm_matmul(be, x, norm_w, eps, xn, n_out, w, bias, y, err);
  ra_cuda_gemv_args a = {};
  for (int i = 0; i < n_out; i++) {
    a.w[i] = w[i]->data;
    a.bias[i] = bias && bias[i] ? bias[i]->data : nullptr;
    a.bias_dtype[i] = bias && bias[i] ? bias[i]->dtype : RA_DTYPE_F32;
    a.y[i] = (float *)y[i]->data;
    a.m[i] = n_rows(w[i]);
  }
  a.w_dtype = w[0]->dtype;
  a.x = (const float *)x->data;
  a.k = k;
  a.norm_w = norm_w->data;
  a.norm_dtype = norm_w->dtype;
  a.eps = eps;
  a.n_sm = impl_of(be)->n_sm;
  CU_TRY("norm_matmul", ra_cuda_gemv_fused(impl_of(be)->stream, &a));
  return RA_OK;
}

int cu_norm_swiglu(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                   const ra_tensor *w_gate, const ra_tensor *w_up, ra_tensor *up, ra_tensor *out, ra_error *err) {
  cuda_impl *im = impl_of(be);
  const ra_tensor *ws[2] = {w_gate, w_up};
  ra_tensor *ys[2] = {out, up};
  if (gemm_inputs_ok(im, x, norm_w, 2, ws, nullptr, ys) && nelem(up) == nelem(out)) {
    int rc = norm_to_xconv(im, "norm_swiglu", x, norm_w, eps, w_gate->dtype, err);
    if (rc == RA_OK && mma_takes(im, n_rows(x), last_dim(x), 2, ws)) {
      ra_cuda_gemv_args a = mma_args(im, n_rows(x), last_dim(x), w_gate->dtype);
      a.w[0] = w_gate->data;
      a.w[1] = w_up->data;
      a.y[0] = (float *)out->data;
      a.m[0] = a.m[1] = n_rows(w_gate);
      a.swiglu = 1;
      CU_TRY("norm_swiglu", ra_cuda_gemm_rows(im->stream, &a, im->xconv.p));
      return RA_OK;
    }
    if (rc == RA_OK) rc = blas_matmul(im, "norm_swiglu", im->xconv.p, n_rows(x), last_dim(x), w_gate, nullptr,
                                      (float *)out->data, 0, err);
    if (rc == RA_OK) rc = blas_matmul(im, "norm_swiglu", im->xconv.p, n_rows(x), last_dim(x), w_up, nullptr,
                                      (float *)up->data, 0, err);
    if (rc == RA_OK) rc = cu_swiglu(be, out, up, out, err);
    return rc;
  }
  bool fuse = gemv_input_ok(x, norm_w);
  const int64_t k = fuse ? (int64_t)nelem(x) : 0;
  fuse = fuse && gemv_output_ok(w_gate, nullptr, out, k, w_gate->dtype) &&
         gemv_output_ok(w_up, nullptr, out, k, w_gate->dtype);
  if (!fuse) return ra_backend_seq_norm_swiglu(be, x, norm_w, eps, xn, w_gate, w_up, up, out, err);
  ra_cuda_gemv_args a = {};
  a.w[0] = w_gate->data;
  a.w[1] = w_up->data;
  a.y[0] = (float *)out->data;
  a.m[0] = a.m[1] = n_rows(w_gate);
  a.w_dtype = w_gate->dtype;
  a.x = (const float *)x->data;
  a.k = k;
  a.norm_w = norm_w->data;
  a.norm_dtype = norm_w->dtype;
  a.eps = eps;
  a.swiglu = 1;
  a.n_sm = impl_of(be)->n_sm;
  CU_TRY("norm_swiglu", ra_cuda_gemv_fused(impl_of(be)->stream, &a));
  return RA_OK;
}

/* Whether the fused kernel takes rope_store's arguments (else the sequence of basic ops runs,
 * which also reports what is wrong with them). */
bool rope_store_fuses(const ra_tensor *q, const ra_tensor *k, const ra_tensor *v, int n_rot, ra_rope_style style,
                      const ra_tensor *kc, const ra_tensor *vc, int64_t row) {
  bool fuse = q && k && v && kc && vc && q->data && k->data && v->data && kc->data && vc->data &&
              q->dtype == RA_DTYPE_F32 && k->dtype == RA_DTYPE_F32 && v->dtype == RA_DTYPE_F32 && q->ndim == 3 &&
              k->ndim == 3 && v->ndim == 3 && kc->ndim == 3 && vc->ndim == 3 && kc->dtype == vc->dtype &&
              known_dtype(kc->dtype) && (style == RA_ROPE_NORM || style == RA_ROPE_NEOX);
  if (fuse) {
    const int64_t n = q->shape[0], hd = q->shape[2];
    fuse = k->shape[0] == n && v->shape[0] == n && k->shape[2] == hd && v->shape[1] == k->shape[1] &&
           v->shape[2] == hd && n_rot > 0 && n_rot <= hd && n_rot % 2 == 0 && row >= 0 &&
           row + n <= kc->shape[0] && row + n <= vc->shape[0];
    for (int d = 1; fuse && d < 3; d++) fuse = kc->shape[d] == k->shape[d] && vc->shape[d] == k->shape[d];
  }
  return fuse;
}

int cu_rope_store(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v, int64_t pos0, int n_rot, float theta,
                  ra_rope_style style, ra_tensor *kc, ra_tensor *vc, int64_t row, ra_error *err) {
  if (!rope_store_fuses(q, k, v, n_rot, style, kc, vc, row))
    return ra_backend_seq_rope_store(be, q, k, v, pos0, n_rot, theta, style, kc, vc, row, err);
  CU_TRY("rope_store", ra_cuda_rope_store(impl_of(be)->stream, (float *)q->data, (float *)k->data,
                                          (const float *)v->data, q->shape[0], q->shape[1], k->shape[1], q->shape[2],
                                          pos0, n_rot, theta, style == RA_ROPE_NEOX, kc->data, vc->data, kc->dtype,
                                          row));
  return RA_OK;
}

/* One launch per RA_CUDA_ROPE_BATCH items when every item fuses with the first one's cache
 * dtype; otherwise item by item. */
int cu_rope_store_batch(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v, const ra_rope_store_item *items,
                        int n_items, int n_rot, float theta, ra_rope_style style, ra_error *err) {
  bool fuse = n_items >= 1 && items && q && k && v && q->ndim == 3 && k->ndim == 3 && v->ndim == 3 &&
              k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0];
  for (int i = 0; fuse && i < n_items; i++) {
    const ra_rope_store_item *it = &items[i];
    fuse = it->r0 >= 0 && it->n >= 1 && it->r0 + it->n <= q->shape[0] && it->k_cache &&
           it->k_cache->dtype == items[0].k_cache->dtype;
    if (fuse) {
      ra_tensor qi = ra_tensor_rows(q, it->r0, it->n), ki = ra_tensor_rows(k, it->r0, it->n),
                vi = ra_tensor_rows(v, it->r0, it->n);
      fuse = rope_store_fuses(&qi, &ki, &vi, n_rot, style, it->k_cache, it->v_cache, it->row);
    }
  }
  if (!fuse) return ra_backend_seq_rope_store_batch(be, q, k, v, items, n_items, n_rot, theta, style, err);
  ra_cuda_rope_batch b = {};
  b.q = (float *)q->data;
  b.k = (float *)k->data;
  b.v = (const float *)v->data;
  b.hq = q->shape[1];
  b.hkv = k->shape[1];
  b.hd = q->shape[2];
  b.n_rot = n_rot;
  b.neox = style == RA_ROPE_NEOX;
  b.theta = theta;
  for (int i0 = 0; i0 < n_items; i0 += RA_CUDA_ROPE_BATCH) {
    b.n = n_items - i0 < RA_CUDA_ROPE_BATCH ? n_items - i0 : RA_CUDA_ROPE_BATCH;
    for (int i = 0; i < b.n; i++) {
      const ra_rope_store_item *it = &items[i0 + i];
      b.it[i] = {it->r0, it->n, it->pos, it->row, it->k_cache->data, it->v_cache->data};
    }
    cudaError_t e = ra_cuda_rope_store_batch(impl_of(be)->stream, &b, items[0].k_cache->dtype);
    if (e != cudaSuccess) return cuda_fail(err, "rope_store_batch", "ra_cuda_rope_store_batch", e);
  }
  return RA_OK;
}

int cu_attn_prefill(ra_backend *be, const ra_tensor *q, const ra_tensor *kc, const ra_tensor *vc, int64_t pos0,
                    float scale, ra_tensor *out, ra_error *err) {
  int rc;
  if ((rc = ra_backend_check_attn_prefill("cuda", q, kc, vc, pos0, out, err)) ||
      (rc = check_caches(kc, vc, "attn_prefill", err)))
    return rc;
  int64_t n = q->shape[0], hq = q->shape[1], hd = q->shape[2], hkv = kc->shape[1];
  if ((rc = check_attn_geometry("attn_prefill", hq, hkv, hd, err))) return rc;
  CU_TRY("attn_prefill", ra_cuda_attn_prefill(impl_of(be)->stream, (const float *)q->data, kc->data, vc->data,
                                              kc->dtype, n, (int)hq, (int)hkv, (int)hd, pos0, scale,
                                              (float *)out->data));
  return RA_OK;
}

int cu_attn_decode(ra_backend *be, const ra_tensor *q, const ra_tensor *kc, const ra_tensor *vc,
                   const ra_token_range *ranges, int n_ranges, float scale, ra_tensor *o, ra_tensor *ml,
                   ra_error *err) {
  int rc;
  if ((rc = ra_backend_check_attn_decode("cuda", q, kc, vc, ranges, n_ranges, o, ml, err)) ||
      (rc = check_caches(kc, vc, "attn_decode", err)))
    return rc;
  int64_t hd = last_dim(q), hq = (int64_t)nelem(q) / hd, hkv = kc->shape[1];
  if ((rc = check_attn_geometry("attn_decode", hq, hkv, hd, err))) return rc;
  cuda_impl *im = impl_of(be);
  /* the range table without empty ranges: begin[i] and prefix start[i] */
  ra_cuda_ranges r;
  memset(&r, 0, sizeof(r));
  int n_nonempty = 0;
  for (int i = 0; i < n_ranges; i++) n_nonempty += ranges[i].end > ranges[i].begin;
  int64_t *tab = nullptr;
  int64_t *bg = r.begin, *st = r.start;
  if (n_nonempty > RA_CUDA_INLINE_RANGES) {
    tab = (int64_t *)malloc(sizeof(int64_t) * (2 * (size_t)n_nonempty + 1));
    if (!tab) return ra_errorf(err, RA_ENOMEM, "cuda attn_decode: no host memory for %d ranges", n_nonempty);
    bg = tab;
    st = tab + n_nonempty;
  }
  int64_t total = 0;
  for (int i = 0, j = 0; i < n_ranges; i++) {
    if (ranges[i].end <= ranges[i].begin) continue;
    bg[j] = ranges[i].begin;
    st[j] = total;
    total += ranges[i].end - ranges[i].begin;
    j++;
  }
  st[n_nonempty] = total;
  r.n = n_nonempty;
  r.total = total;
  if (tab) {
    size_t bytes = sizeof(int64_t) * (2 * (size_t)n_nonempty + 1);
    rc = grow(&im->ranges, bytes, "attn_decode", err);
    cudaError_t e = rc ? cudaSuccess : cudaMemcpyAsync(im->ranges.p, tab, bytes, cudaMemcpyHostToDevice, im->stream);
    free(tab);
    if (rc) return rc;
    if (e != cudaSuccess) return cuda_fail(err, "attn_decode", "cudaMemcpyAsync(ranges)", e);
    r.d_begin = (const int64_t *)im->ranges.p;
    r.d_start = r.d_begin + n_nonempty;
  }
  int n_splits;
  int64_t chunk;
  ra_cuda_decode_plan(total, (int)hkv, (int)(hq / hkv), (int)hd, kc->dtype, im->n_sm, &n_splits, &chunk);
  float *part_o = nullptr, *part_ml = nullptr;
  if (n_splits > 1) {
    size_t floats = (size_t)n_splits * (size_t)hq * (size_t)(hd + 2);
    if ((rc = grow(&im->part, floats * sizeof(float), "attn_decode", err))) return rc;
    part_o = (float *)im->part.p;
    part_ml = part_o + (size_t)n_splits * (size_t)hq * (size_t)hd;
  }
  CU_TRY("attn_decode", ra_cuda_attn_decode(im->stream, (const float *)q->data, kc->data, vc->data, kc->dtype, (int)hq,
                                            (int)hkv, (int)hd, &r, n_splits, chunk, scale, part_o, part_ml,
                                            (float *)o->data, (float *)ml->data));
  return RA_OK;
}

/* One launch for the batch where the warp kernels apply (else one attn_decode per sequence). The
 * sequences share the GPU, so each is planned with its share of a few waves of SMs
 * (RA_CUDA_DECODE_BATCH_WAVES): fewer, longer splits than alone, and less to reduce. */
int cu_attn_decode_batch(ra_backend *be, const ra_attn_decode_item *items, int n_items, float scale,
                         ra_error *err) {
  int rc = ra_backend_check_attn_decode_batch("cuda", items, n_items, err);
  if (rc) return rc;
  const ra_tensor *q0 = items[0].q, *k0 = items[0].k_cache;
  int64_t hd = last_dim(q0), hq = (int64_t)nelem(q0) / hd, hkv = k0->shape[1];
  if ((rc = check_attn_geometry("attn_decode_batch", hq, hkv, hd, err))) return rc;
  for (int i = 0; i < n_items; i++)
    if ((rc = check_caches(items[i].k_cache, items[i].v_cache, "attn_decode_batch", err))) return rc;
  if (n_items == 1 || !ra_cuda_decode_batch_ok((int)(hq / hkv), (int)hd, k0->dtype)) {
    for (int i = 0; rc == RA_OK && i < n_items; i++) {
      ra_token_range all = {0, items[i].n};
      rc = cu_attn_decode(be, items[i].q, items[i].k_cache, items[i].v_cache, &all, 1, scale, items[i].o,
                          items[i].ml, err);
    }
    return rc;
  }
  cuda_impl *im = impl_of(be);
  ra_cuda_decode_item *it = (ra_cuda_decode_item *)calloc((size_t)n_items, sizeof *it);
  if (!it) return ra_errorf(err, RA_ENOMEM, "cuda attn_decode_batch: no host memory for %d sequences", n_items);
  int share = im->decode_batch_waves * im->n_sm / (n_items < RA_CUDA_DECODE_BATCH ? n_items : RA_CUDA_DECODE_BATCH);
  share = share < 1 ? 1 : share > im->n_sm ? im->n_sm : share;
  size_t floats = 0;
  for (int i = 0; i < n_items; i++) {
    ra_cuda_decode_plan(items[i].n, (int)hkv, (int)(hq / hkv), (int)hd, k0->dtype, share, &it[i].n_splits,
                        &it[i].chunk);
    if (it[i].n_splits > 1) floats += (size_t)it[i].n_splits * (size_t)hq * (size_t)(hd + 2);
  }
  /* every sequence its own scratch: the launches of a long batch then need no ordering */
  if ((rc = grow(&im->part, floats * sizeof(float), "attn_decode_batch", err))) {
    free(it);
    return rc;
  }
  float *part = (float *)im->part.p;
  for (int i = 0; i < n_items; i++) {
    it[i].q = (const float *)items[i].q->data;
    it[i].kc = items[i].k_cache->data;
    it[i].vc = items[i].v_cache->data;
    it[i].o = (float *)items[i].o->data;
    it[i].ml = (float *)items[i].ml->data;
    it[i].total = items[i].n;
    if (it[i].n_splits > 1) {
      it[i].part_o = part;
      it[i].part_ml = part + (size_t)it[i].n_splits * (size_t)hq * (size_t)hd;
      part += (size_t)it[i].n_splits * (size_t)hq * (size_t)(hd + 2);
    }
  }
  cudaError_t e = cudaSuccess;
  for (int b = 0; b < n_items && e == cudaSuccess; b += RA_CUDA_DECODE_BATCH) {
    int n = n_items - b < RA_CUDA_DECODE_BATCH ? n_items - b : RA_CUDA_DECODE_BATCH;
    e = ra_cuda_attn_decode_batch(im->stream, k0->dtype, (int)hq, (int)hkv, (int)hd, scale, it + b, n);
  }
  free(it);
  if (e != cudaSuccess) return cuda_fail(err, "attn_decode_batch", "ra_cuda_attn_decode_batch", e);
  return RA_OK;
}

int cu_attn_merge(ra_backend *be, ra_tensor *o_acc, ra_tensor *ml_acc, const ra_tensor *o, const ra_tensor *ml,
                  ra_error *err) {
  int rc = ra_backend_check_attn_merge("cuda", o_acc, ml_acc, o, ml, err);
  if (rc) return rc;
  size_t heads = nelem(ml) / 2;
  CU_TRY("attn_merge", ra_cuda_attn_merge(impl_of(be)->stream, (float *)o_acc->data, (float *)ml_acc->data,
                                          (const float *)o->data, (const float *)ml->data, (int64_t)heads,
                                          (int64_t)(nelem(o) / heads)));
  return RA_OK;
}

int cu_topk_rows(ra_backend *be, const ra_tensor *x, int k, int32_t *idx, float *val, ra_error *err) {
  int rc = want_dtype(x, RA_DTYPE_F32, "topk_rows", "x", err);
  if (rc) return rc;
  int64_t m = last_dim(x), n = n_rows(x);
  if (k <= 0 || k > m || m > INT32_MAX)
    return ra_errorf(err, RA_EINVAL, "cuda topk_rows: k %d for rows of %lld", k, (long long)m);
  if (k > RA_CUDA_TOPK_MAX)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda topk_rows: k %d above %d", k, RA_CUDA_TOPK_MAX);
  cuda_impl *im = impl_of(be);
  /* rows in batches whose results fit 64 MB of scratch */
  int64_t batch = ((int64_t)64 << 20) / ((int64_t)k * 8);
  if (batch < 1) batch = 1;
  if (batch > n) batch = n;
  if ((rc = grow(&im->topk, (size_t)batch * (size_t)k * 8, "topk_rows", err))) return rc;
  int32_t *d_idx = (int32_t *)im->topk.p;
  float *d_val = (float *)(d_idx + (size_t)batch * (size_t)k);
  for (int64_t r0 = 0; r0 < n; r0 += batch) {
    int64_t nb = n - r0 < batch ? n - r0 : batch;
    CU_TRY("topk_rows", ra_cuda_topk_rows(im->stream, (const float *)x->data + r0 * m, nb, m, k, d_idx, d_val));
    CU_TRY("topk_rows", cudaMemcpyAsync(idx + r0 * k, d_idx, (size_t)nb * k * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                        im->stream));
    CU_TRY("topk_rows", cudaMemcpyAsync(val + r0 * k, d_val, (size_t)nb * k * sizeof(float), cudaMemcpyDeviceToHost,
                                        im->stream));
  }
  CU_TRY("topk_rows", cudaStreamSynchronize(im->stream));
  return RA_OK;
}

/* ---------- wave index (cuda_wave.cu) ---------- */

ra_cuda_wave_ctx wave_ctx(ra_backend *be) {
  cuda_impl *im = impl_of(be);
  return ra_cuda_wave_ctx{im->stream, im->blas, &im->wave, &im->wave_pinned};
}

int cu_cluster_keys(ra_backend *be, const ra_tensor *kc, const ra_tensor *vc, int64_t row0, int64_t n,
                    const ra_wave_cluster_params *p, ra_tensor *centroid, ra_tensor *size, ra_tensor *vsum, int64_t c0,
                    ra_tensor *out_k, ra_tensor *out_v, int32_t *perm, int32_t *counts, ra_error *err) {
  const ra_cuda_wave_ctx ctx = wave_ctx(be);
  return ra_cuda_cluster_keys(&ctx, kc, vc, row0, n, p, centroid, size, vsum, c0, out_k, out_v, perm, counts, err);
}

int cu_wave_select(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                   int64_t n_clusters, float scale, int r, int e, int32_t *idx, const ra_tensor *vsum, ra_tensor *o,
                   ra_tensor *ml, ra_error *err) {
  const ra_cuda_wave_ctx ctx = wave_ctx(be);
  return ra_cuda_wave_select(&ctx, q, centroid, size, n_clusters, scale, r, e, idx, vsum, o, ml, err);
}

int cu_wave_select_batch(ra_backend *be, const ra_wave_select_item *items, int n_items, float scale, ra_error *err) {
  const ra_cuda_wave_ctx ctx = wave_ctx(be);
  return ra_cuda_wave_select_batch(&ctx, items, n_items, scale, err);
}

int cu_wave_estimate(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                     const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids, int n_ids, int64_t ld, float scale,
                     ra_tensor *o, ra_tensor *ml, ra_error *err) {
  const ra_cuda_wave_ctx ctx = wave_ctx(be);
  return ra_cuda_wave_estimate(&ctx, q, centroid, size, vsum, n_clusters, ids, n_ids, ld, scale, o, ml, err);
}

int cu_sync(ra_backend *be, ra_error *err) {
  CU_TRY("sync", cudaStreamSynchronize(impl_of(be)->stream));
  return RA_OK;
}

void cu_destroy(ra_backend *be) {
  if (!be) return;
  cuda_impl *im = impl_of(be);
  if (im) {
    if (im->stream) cudaStreamSynchronize(im->stream);
    release(&im->xconv);
    release(&im->ids);
    release(&im->ranges);
    release(&im->part);
    release(&im->topk);
    release(&im->raw);
    release(&im->widen);
    ra_cuda_wave_scratch_release(&im->wave);
    ra_cuda_wave_pinned_release(&im->wave_pinned);
    if (im->stage) cudaFreeHost(im->stage);
    if (im->blas) cublasDestroy(im->blas);
    if (im->stream) cudaStreamDestroy(im->stream);
    delete im;
  }
  free(be);
}

ra_backend_ops make_ops() {
  ra_backend_ops o;
  memset(&o, 0, sizeof(o));
  o.alloc = cu_alloc;
  o.free = cu_free;
  o.upload = cu_upload;
  o.download = cu_download;
  o.download_raw = cu_download_raw;
  o.host_alloc = cu_host_alloc;
  o.host_free = cu_host_free;
  o.copy = cu_copy;
  o.load_weight = cu_load_weight;
  o.fill_random = cu_fill_random;
  o.get_rows = cu_get_rows;
  o.set_rows = cu_set_rows;
  o.matmul = cu_matmul;
  o.rmsnorm = cu_rmsnorm;
  o.rope = cu_rope;
  o.swiglu = cu_swiglu;
  o.attn_prefill = cu_attn_prefill;
  o.attn_decode = cu_attn_decode;
  o.attn_decode_batch = cu_attn_decode_batch;
  o.attn_merge = cu_attn_merge;
  o.topk_rows = cu_topk_rows;
  o.cluster_keys = cu_cluster_keys;
  o.wave_select = cu_wave_select;
  o.wave_select_batch = cu_wave_select_batch;
  o.wave_estimate = cu_wave_estimate;
  o.norm_matmul = cu_norm_matmul;
  o.norm_swiglu = cu_norm_swiglu;
  o.rope_store = cu_rope_store;
  o.rope_store_batch = cu_rope_store_batch;
  o.sync = cu_sync;
  o.destroy = cu_destroy;
  return o;
}

const ra_backend_ops cuda_ops = make_ops();

} /* namespace */

struct ra_cuda_timer {
  cudaStream_t stream;
  cudaEvent_t start, stop;
};

extern "C" int ra_backend_cuda_create(const ra_backend_config *cfg, ra_backend **out, ra_error *err) {
  *out = nullptr;
  int dev = cfg ? cfg->device : 0, count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return ra_errorf(err, RA_EUNAVAIL, "cuda: no usable CUDA device (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
  if (dev < 0 || dev >= count)
    return ra_errorf(err, RA_EUNAVAIL, "cuda: device %d does not exist (%d devices)", dev, count);
  if ((e = cudaSetDevice(dev)) != cudaSuccess) return cuda_fail(err, "create", "cudaSetDevice", e);
  cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
    return cuda_fail(err, "create", "cudaGetDeviceProperties", e);
  if (prop.major < 8)
    return ra_errorf(err, RA_EUNAVAIL, "cuda: device %d (%s) is sm_%d%d; BF16 kernels need sm_80 or newer", dev,
                     prop.name, prop.major, prop.minor);
  ra_backend *be = (ra_backend *)calloc(1, sizeof(*be));
  cuda_impl *im = new (std::nothrow) cuda_impl();
  if (!be || !im) {
    free(be);
    delete im;
    return ra_errorf(err, RA_ENOMEM, "cuda: out of host memory");
  }
  be->ops = &cuda_ops;
  be->name = "cuda";
  be->impl = im;
  im->device = dev;
  im->n_sm = prop.multiProcessorCount;
  im->cc_major = prop.major;
  im->mem_bytes = prop.totalGlobalMem;
  snprintf(im->dev_name, sizeof(im->dev_name), "%s", prop.name);
  int rc = RA_OK;
  cublasStatus_t st;
  if ((e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess)
    rc = cuda_fail(err, "create", "cudaStreamCreateWithFlags", e);
  else if ((st = cublasCreate(&im->blas)) != CUBLAS_STATUS_SUCCESS)
    rc = blas_fail(err, "create", st);
  else if ((st = cublasSetStream(im->blas, im->stream)) != CUBLAS_STATUS_SUCCESS)
    rc = blas_fail(err, "create", st);
  else if ((e = ra_cuda_attn_init()) != cudaSuccess)
    rc = cuda_fail(err, "create", "attention kernel attributes", e);
  else if ((e = ra_cuda_gemv_init()) != cudaSuccess)
    rc = cuda_fail(err, "create", "GEMV kernel attributes", e);
  if (rc) {
    cu_destroy(be);
    return rc;
  }
  ra_cuda_set_pdl(prop.major >= 9);
  *out = be;
  return RA_OK;
}

namespace {
/* process-wide (see ra_cuda.cuh): kernel launchers take a stream, not a backend */
bool g_pdl = false;
}  // namespace

void ra_cuda_set_pdl(bool on) { g_pdl = on; }
bool ra_cuda_pdl_enabled(void) { return g_pdl; }

extern "C" int ra_backend_cuda_set_pdl(ra_backend *be, int on, ra_error *err) {
  if (!be || !be->name || strcmp(be->name, "cuda") != 0)
    return ra_errorf(err, RA_EINVAL, "cuda set_pdl: not a cuda backend");
  if (on && impl_of(be)->cc_major < 9)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda set_pdl: programmatic dependent launch needs sm_90 (device is sm_%d)",
                     impl_of(be)->cc_major);
  ra_cuda_set_pdl(on != 0);
  return RA_OK;
}

namespace {
/* The measurement setters of one integer field: the value's range, then the backend's kind. */
int set_field(ra_backend *be, const char *op, int v, int lo, int hi, const char *unit, int cuda_impl::*field,
              ra_error *err) {
  if (v < lo || v > hi) return ra_errorf(err, RA_EINVAL, "cuda %s: %d %s (%d to %d)", op, v, unit, lo, hi);
  if (!be || !be->name || strcmp(be->name, "cuda") != 0) return ra_errorf(err, RA_EINVAL, "cuda %s: not a cuda backend", op);
  impl_of(be)->*field = v;
  return RA_OK;
}
}  // namespace

extern "C" int ra_backend_cuda_set_gemv_rows(ra_backend *be, int max_rows, ra_error *err) {
  return set_field(be, "set_gemv_rows", max_rows, 1, RA_CUDA_GEMV_MAX_X, "rows", &cuda_impl::gemv_max_x, err);
}

extern "C" int ra_backend_cuda_set_mma_rows(ra_backend *be, int max_rows, ra_error *err) {
  return set_field(be, "set_mma_rows", max_rows, 0, RA_CUDA_MMA_MAX_X, "rows", &cuda_impl::mma_max_x, err);
}

extern "C" int ra_backend_cuda_set_decode_batch_waves(ra_backend *be, int waves, ra_error *err) {
  return set_field(be, "set_decode_batch_waves", waves, 1, RA_CUDA_DECODE_BATCH_MAX_WAVES, "waves",
                   &cuda_impl::decode_batch_waves, err);
}

extern "C" int ra_backend_cuda_set_prefill_kernel(ra_backend *be, int mode, ra_error *err) {
  if (!be || !be->name || strcmp(be->name, "cuda") != 0)
    return ra_errorf(err, RA_EINVAL, "cuda set_prefill_kernel: not a cuda backend");
  if (mode != RA_CUDA_PREFILL_AUTO && mode != RA_CUDA_PREFILL_MMA)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda set_prefill_kernel: unknown mode %d", mode);
  ra_cuda_attn_prefill_set_kernel(mode);
  return RA_OK;
}

extern "C" const char *ra_backend_cuda_prefill_kernel(ra_backend *be, int hq, int hkv, int hd, ra_dtype kv_dtype,
                                                      int64_t n_keys) {
  (void)be;
  if (hkv <= 0 || hq % hkv != 0) return "cuda-cores";
  switch (ra_cuda_attn_prefill_kernel(hq / hkv, hd, (int)kv_dtype, n_keys)) {
    case RA_CUDA_PREFILL_WITH_WGMMA: return "wgmma";
    case RA_CUDA_PREFILL_WITH_MMA: return "mma";
    default: return "cuda-cores";
  }
}

extern "C" int ra_backend_cuda_device_info(ra_backend *be, char *name, size_t name_len, int *n_sm, size_t *mem_bytes,
                                           ra_error *err) {
  if (!be || !be->name || strcmp(be->name, "cuda") != 0)
    return ra_errorf(err, RA_EINVAL, "cuda device_info: not a cuda backend");
  cuda_impl *im = impl_of(be);
  if (name && name_len) snprintf(name, name_len, "%s", im->dev_name);
  if (n_sm) *n_sm = im->n_sm;
  if (mem_bytes) *mem_bytes = im->mem_bytes;
  return RA_OK;
}

extern "C" int ra_backend_cuda_bind(ra_backend *be, ra_error *err) {
  cudaError_t e = cudaSetDevice(impl_of(be)->device);
  return e == cudaSuccess ? RA_OK : cuda_fail(err, "bind", "cudaSetDevice", e);
}

extern "C" int ra_backend_cuda_device(ra_backend *be) { return impl_of(be)->device; }

extern "C" void *ra_backend_cuda_stream(ra_backend *be) { return impl_of(be)->stream; }

extern "C" int ra_cuda_timer_create(ra_backend *be, ra_cuda_timer **out, ra_error *err) {
  *out = nullptr;
  if (!be || !be->name || strcmp(be->name, "cuda") != 0)
    return ra_errorf(err, RA_EINVAL, "cuda timer: not a cuda backend");
  ra_cuda_timer *t = (ra_cuda_timer *)calloc(1, sizeof(*t));
  if (!t) return ra_errorf(err, RA_ENOMEM, "cuda timer: out of host memory");
  t->stream = impl_of(be)->stream;
  cudaError_t e = cudaEventCreate(&t->start);
  if (e == cudaSuccess) {
    e = cudaEventCreate(&t->stop);
    if (e != cudaSuccess) cudaEventDestroy(t->start);
  }
  if (e != cudaSuccess) {
    free(t);
    return cuda_fail(err, "timer", "cudaEventCreate", e);
  }
  *out = t;
  return RA_OK;
}

extern "C" int ra_cuda_timer_start(ra_cuda_timer *t, ra_error *err) {
  CU_TRY("timer", cudaEventRecord(t->start, t->stream));
  return RA_OK;
}

extern "C" int ra_cuda_timer_stop(ra_cuda_timer *t, float *ms, ra_error *err) {
  CU_TRY("timer", cudaEventRecord(t->stop, t->stream));
  CU_TRY("timer", cudaEventSynchronize(t->stop));
  CU_TRY("timer", cudaEventElapsedTime(ms, t->start, t->stop));
  return RA_OK;
}

extern "C" void ra_cuda_timer_destroy(ra_cuda_timer *t) {
  if (!t) return;
  cudaEventDestroy(t->start);
  cudaEventDestroy(t->stop);
  free(t);
}
