/* CPU implementation of the backend ops table: OpenBLAS sgemm for the linear layers, OpenMP
 * loops for everything else. Weights are dequantized to fp32 once at load (SmolLM2-135M takes
 * ~540 MB that way), which keeps every matmul a plain sgemm. */
#include "backend.h"
#include "backend_check.h"
#include "backend_cpu_wave.h"
#include "backend_fused.h"

#include "merge.h"
#include "quant.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Hot loops are compiled twice, for AVX2+FMA (x86-64-v3) and baseline, picked at load time, so
 * one binary runs anywhere and still gets 8-wide FMAs where the CPU has them. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RA_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define RA_HOT
#endif

#define PF_BQ 32  /* prefill: query tokens per block (per q head) */
#define PF_BK 64  /* prefill: keys per tile */
#define DEC_CHUNK 256 /* decode: tokens per split-K work item */

typedef struct cpu_impl {
  int n_threads;
} cpu_impl;

/* ---------- checks ---------- */

static int want_dtype(const ra_tensor *t, ra_dtype dt, const char *op, const char *name, ra_error *err) {
  return ra_backend_check_dtype("cpu", t, dt, op, name, err);
}

static int64_t last_dim(const ra_tensor *t) { return t->shape[t->ndim - 1]; }
static int64_t n_rows(const ra_tensor *t) { return (int64_t)(ra_tensor_nelem(t) / (size_t)last_dim(t)); }

/* t allocated, of any known dtype (the ops that take half-precision inputs, as the CUDA backend's do). */
static int want_tensor(const ra_tensor *t, const char *op, const char *name, ra_error *err) {
  if (!t || !t->data) return ra_errorf(err, RA_EINVAL, "cpu %s: %s is not allocated", op, name);
  if (ra_dtype_size(t->dtype) == 0)
    return ra_errorf(err, RA_EINVAL, "cpu %s: %s has dtype %d", op, name, (int)t->dtype);
  return RA_OK;
}

/* t's values in fp32: t's own data, or a widened copy in *tmp (to be freed) for a half tensor. */
static int fp32_view(const ra_tensor *t, const char *op, float **tmp, const float **out, ra_error *err) {
  *tmp = NULL;
  if (t->dtype == RA_DTYPE_F32) {
    *out = t->data;
    return RA_OK;
  }
  size_t n = ra_tensor_nelem(t);
  if (!(*tmp = malloc(n * sizeof(float))))
    return ra_errorf(err, RA_ENOMEM, "cpu %s: cannot widen %zu %s elements", op, n, ra_dtype_name(t->dtype));
  ra_dtype_to_fp32_n(t->dtype, t->data, *tmp, n);
  *out = *tmp;
  return RA_OK;
}

/* ---------- memory ---------- */

static int cpu_alloc(ra_backend *be, ra_tensor *t, ra_error *err) {
  t->be = be;
  t->data = calloc(1, t->nbytes ? t->nbytes : 1);
  if (!t->data) return ra_errorf(err, RA_ENOMEM, "cpu: cannot allocate %zu bytes", t->nbytes);
  return RA_OK;
}

static void cpu_free(ra_backend *be, ra_tensor *t) {
  free(t->data);
  t->data = NULL;
}

static int cpu_upload(ra_backend *be, ra_tensor *t, size_t off, const float *src, size_t n, ra_error *err) {
  if (off > ra_tensor_nelem(t) || n > ra_tensor_nelem(t) - off)
    return ra_errorf(err, RA_EINVAL, "cpu upload: [%zu, +%zu) outside %zu elements", off, n, ra_tensor_nelem(t));
  ra_dtype_from_fp32_n(t->dtype, src, (char *)t->data + off * ra_dtype_size(t->dtype), n);
  return RA_OK;
}

static int cpu_download(ra_backend *be, const ra_tensor *t, size_t off, float *dst, size_t n, ra_error *err) {
  if (off > ra_tensor_nelem(t) || n > ra_tensor_nelem(t) - off)
    return ra_errorf(err, RA_EINVAL, "cpu download: [%zu, +%zu) outside %zu elements", off, n, ra_tensor_nelem(t));
  ra_dtype_to_fp32_n(t->dtype, (const char *)t->data + off * ra_dtype_size(t->dtype), dst, n);
  return RA_OK;
}

static int cpu_download_raw(ra_backend *be, const ra_tensor *t, size_t off, void *dst, size_t n, ra_error *err) {
  if (off > ra_tensor_nelem(t) || n > ra_tensor_nelem(t) - off)
    return ra_errorf(err, RA_EINVAL, "cpu download_raw: [%zu, +%zu) outside %zu elements", off, n, ra_tensor_nelem(t));
  const size_t es = ra_dtype_size(t->dtype);
  memcpy(dst, (const char *)t->data + off * es, n * es);
  return RA_OK;
}

static int cpu_host_alloc(ra_backend *be, size_t bytes, void **out, ra_error *err) {
  *out = malloc(bytes ? bytes : 1);
  return *out ? RA_OK : ra_errorf(err, RA_ENOMEM, "cpu host_alloc: no memory for %zu bytes", bytes);
}

static void cpu_host_free(ra_backend *be, void *p) { free(p); }

static int cpu_copy(ra_backend *be, ra_tensor *dst, size_t doff, const ra_tensor *src, size_t soff, size_t n,
                    ra_error *err) {
  if (doff > ra_tensor_nelem(dst) || n > ra_tensor_nelem(dst) - doff || soff > ra_tensor_nelem(src) ||
      n > ra_tensor_nelem(src) - soff)
    return ra_errorf(err, RA_EINVAL, "cpu copy: %zu elements out of bounds", n);
  const char *s = (const char *)src->data + soff * ra_dtype_size(src->dtype);
  char *d = (char *)dst->data + doff * ra_dtype_size(dst->dtype);
  if (src->dtype == dst->dtype) {
    memcpy(d, s, n * ra_dtype_size(src->dtype));
  } else if (src->dtype == RA_DTYPE_F32) {
    ra_dtype_from_fp32_n(dst->dtype, (const float *)s, d, n);
  } else if (dst->dtype == RA_DTYPE_F32) {
    ra_dtype_to_fp32_n(src->dtype, s, (float *)d, n);
  } else {
    float tmp[256];
    for (size_t i = 0; i < n; i += 256) {
      size_t c = n - i < 256 ? n - i : 256;
      ra_dtype_to_fp32_n(src->dtype, s + i * ra_dtype_size(src->dtype), tmp, c);
      ra_dtype_from_fp32_n(dst->dtype, tmp, d + i * ra_dtype_size(dst->dtype), c);
    }
  }
  return RA_OK;
}

static int cpu_load_weight(ra_backend *be, const void *raw, uint32_t type, int64_t rows, int64_t cols, ra_tensor *out,
                           ra_error *err) {
  size_t row_bytes;
  if (rows <= 0 || cols <= 0 || ra_quant_row_bytes(type, (uint64_t)cols, &row_bytes) != RA_OK)
    return ra_errorf(err, RA_EINVAL, "cpu load_weight: cannot load [%lld, %lld] of type %s", (long long)rows,
                     (long long)cols, ra_quant_name(type));
  int64_t shape[2] = {rows, cols};
  int rc = ra_tensor_new(be, out, RA_DTYPE_F32, 2, shape, err);
  if (rc) return rc;
  float *w = out->data;
  const uint8_t *src = raw;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    ra_quant_dequantize(type, src + (size_t)r * row_bytes, w + (size_t)r * (size_t)cols, (size_t)cols);
  return RA_OK;
}

static inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int cpu_fill_random(ra_backend *be, ra_tensor *t, uint64_t seed, float center, float scale, ra_error *err) {
  size_t n = ra_tensor_nelem(t);
  uint64_t base = splitmix64(seed);
#pragma omp parallel
  {
    float buf[256];
#pragma omp for schedule(static)
    for (size_t c = 0; c < (n + 255) / 256; c++) {
      size_t i0 = c * 256, cnt = n - i0 < 256 ? n - i0 : 256;
      for (size_t j = 0; j < cnt; j++) {
        /* 24 random bits -> [0, 1) -> [-1, 1) */
        float u = (float)(splitmix64(base ^ (i0 + j)) >> 40) * 0x1p-24f;
        buf[j] = center + scale * (2.0f * u - 1.0f);
      }
      ra_dtype_from_fp32_n(t->dtype, buf, (char *)t->data + i0 * ra_dtype_size(t->dtype), cnt);
    }
  }
  return RA_OK;
}

/* ---------- layer ops ---------- */

static int cpu_get_rows(ra_backend *be, const ra_tensor *table, const int32_t *ids, int64_t n, ra_tensor *out,
                        ra_error *err) {
  int rc;
  /* table in any dtype (a half-precision KV cache as rows for roar's kNN), out always fp32 */
  if ((rc = want_tensor(table, "get_rows", "table", err)) ||
      (rc = want_dtype(out, RA_DTYPE_F32, "get_rows", "out", err)))
    return rc;
  const size_t esz = ra_dtype_size(table->dtype);
  int64_t dim = last_dim(table), vocab = n_rows(table);
  if (n < 0 || last_dim(out) != dim || n_rows(out) < n)
    return ra_errorf(err, RA_EINVAL, "cpu get_rows: out is not [%lld, %lld]", (long long)n, (long long)dim);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return ra_errorf(err, RA_EINVAL, "cpu get_rows: id %d outside [0, %lld)", ids[i], (long long)vocab);
  for (int64_t i = 0; i < n; i++)
    ra_dtype_to_fp32_n(table->dtype, (const char *)table->data + (size_t)ids[i] * (size_t)dim * esz,
                       (float *)out->data + i * dim, (size_t)dim);
  return RA_OK;
}

static int cpu_set_rows(ra_backend *be, ra_tensor *table, const int32_t *ids, int64_t n, const ra_tensor *src,
                        ra_error *err) {
  (void)be;
  int rc = ra_backend_check_set_rows("cpu", table, ids, n, src, err);
  if (rc) return rc;
  const size_t esz = ra_dtype_size(table->dtype);
  const int64_t dim = last_dim(table);
  for (int64_t i = 0; i < n; i++)
    ra_dtype_from_fp32_n(table->dtype, (const float *)src->data + i * dim,
                         (char *)table->data + (size_t)ids[i] * (size_t)dim * esz, (size_t)dim);
  return RA_OK;
}

static int cpu_matmul(ra_backend *be, const ra_tensor *x, const ra_tensor *w, const ra_tensor *bias, ra_tensor *y,
                      int accumulate, ra_error *err) {
  int rc;
  if ((rc = want_dtype(x, RA_DTYPE_F32, "matmul", "x", err)) || (rc = want_tensor(w, "matmul", "w", err)) ||
      (rc = want_dtype(y, RA_DTYPE_F32, "matmul", "y", err)))
    return rc;
  /* x and y are [n, ...] with everything after the first dim flattened: q [n, heads, hd] is [n, heads*hd] */
  int64_t n = x->shape[0], k = (int64_t)ra_tensor_nelem(x) / n, m = n_rows(w);
  if (last_dim(w) != k || y->shape[0] != n || (int64_t)ra_tensor_nelem(y) != n * m)
    return ra_errorf(err, RA_EINVAL, "cpu matmul: x [%lld, %lld] w [%lld, %lld] y [%lld, %lld] do not fit", (long long)n,
                     (long long)k, (long long)m, (long long)last_dim(w), (long long)y->shape[0],
                     (long long)(ra_tensor_nelem(y) / (size_t)y->shape[0]));
  if (bias && ((rc = want_tensor(bias, "matmul", "bias", err)) || (int64_t)ra_tensor_nelem(bias) != m))
    return rc ? rc : ra_errorf(err, RA_EINVAL, "cpu matmul: bias is not [%lld]", (long long)m);
  /* a half-precision w (roar's kNN against an f16/bf16 cache) or bias is widened for sgemm */
  float *w_tmp = NULL, *b_tmp = NULL;
  const float *wd, *bd = NULL;
  if ((rc = fp32_view(w, "matmul", &w_tmp, &wd, err)) || (bias && (rc = fp32_view(bias, "matmul", &b_tmp, &bd, err)))) {
    free(w_tmp);
    return rc;
  }
  float beta = accumulate ? 1.0f : 0.0f;
  /* One thread pool: OpenBLAS runs single-threaded (set at create) and OpenMP threads each take
   * a slice of the output columns. Two spinning pools (OpenMP + OpenBLAS's pthreads) on the same
   * cores made decode 5x slower. Slices are multiples of 16 columns to keep sgemm's panels whole. */
  const float *xd = x->data;
  float *ydat = y->data;
#pragma omp parallel if ((double)n * (double)m * (double)k > 1e5)
  {
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t per = ((m + nt - 1) / nt + 15) / 16 * 16;
    int64_t m0 = (int64_t)t * per, m1 = m0 + per < m ? m0 + per : m;
    if (m0 < m1) {
      if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(m1 - m0), (int)k, 1.0f, wd + m0 * k, (int)k, xd, 1, beta,
                    ydat + m0, 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(m1 - m0), (int)k, 1.0f, xd, (int)k,
                    wd + m0 * k, (int)k, beta, ydat + m0, (int)m);
    }
  }
  if (bd) {
#pragma omp parallel for schedule(static) if (n > 4)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) ydat[i * m + j] += bd[j];
  }
  free(w_tmp);
  free(b_tmp);
  return RA_OK;
}

static int cpu_rmsnorm(ra_backend *be, const ra_tensor *x, const ra_tensor *w, float eps, ra_tensor *y, ra_error *err) {
  int rc;
  if ((rc = want_dtype(x, RA_DTYPE_F32, "rmsnorm", "x", err)) || (rc = want_dtype(w, RA_DTYPE_F32, "rmsnorm", "w", err)) ||
      (rc = want_dtype(y, RA_DTYPE_F32, "rmsnorm", "y", err)))
    return rc;
  int64_t d = last_dim(x), n = n_rows(x);
  if ((int64_t)ra_tensor_nelem(w) != d || ra_tensor_nelem(y) != ra_tensor_nelem(x))
    return ra_errorf(err, RA_EINVAL, "cpu rmsnorm: shapes do not fit dim %lld", (long long)d);
  const float *xd = x->data, *wd = w->data;
  float *yd = y->data;
#pragma omp parallel for schedule(static) if (n > 4)
  for (int64_t i = 0; i < n; i++) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) ss += (double)xd[i * d + j] * xd[i * d + j];
    float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t j = 0; j < d; j++) yd[i * d + j] = xd[i * d + j] * inv * wd[j];
  }
  return RA_OK;
}

static int cpu_rope(ra_backend *be, ra_tensor *x, int64_t pos0, int n_rot, float theta, ra_rope_style style,
                    ra_error *err) {
  int rc = want_dtype(x, RA_DTYPE_F32, "rope", "x", err);
  if (rc) return rc;
  if (x->ndim != 3) return ra_errorf(err, RA_EINVAL, "cpu rope: x must be [n, heads, head_dim]");
  int64_t n = x->shape[0], h = x->shape[1], hd = x->shape[2];
  if (n_rot <= 0 || n_rot > hd || n_rot % 2 || n_rot > 1024) return ra_errorf(err, RA_EINVAL, "cpu rope: n_rot %d for head_dim %lld", n_rot, (long long)hd);
  int half = n_rot / 2; /* <= 512: the per-token angle tables below */
  float *xd = x->data;
#pragma omp parallel for schedule(static) if (n > 4)
  for (int64_t t = 0; t < n; t++) {
    float cs[512], sn[512];
    for (int j = 0; j < half; j++) {
      /* angles in double: at 128K positions float would lose the low bits of pos * freq */
      double a = (double)(pos0 + t) * pow((double)theta, -2.0 * j / n_rot);
      cs[j] = (float)cos(a);
      sn[j] = (float)sin(a);
    }
    for (int64_t hh = 0; hh < h; hh++) {
      float *v = xd + (t * h + hh) * hd;
      for (int j = 0; j < half; j++) {
        int i0 = style == RA_ROPE_NORM ? 2 * j : j;
        int i1 = style == RA_ROPE_NORM ? 2 * j + 1 : j + half;
        float a = v[i0], b = v[i1];
        v[i0] = a * cs[j] - b * sn[j];
        v[i1] = a * sn[j] + b * cs[j];
      }
    }
  }
  return RA_OK;
}

static int cpu_swiglu(ra_backend *be, const ra_tensor *gate, const ra_tensor *up, ra_tensor *out, ra_error *err) {
  int rc;
  if ((rc = want_dtype(gate, RA_DTYPE_F32, "swiglu", "gate", err)) || (rc = want_dtype(up, RA_DTYPE_F32, "swiglu", "up", err)) ||
      (rc = want_dtype(out, RA_DTYPE_F32, "swiglu", "out", err)))
    return rc;
  size_t n = ra_tensor_nelem(gate);
  if (ra_tensor_nelem(up) != n || ra_tensor_nelem(out) != n) return ra_errorf(err, RA_EINVAL, "cpu swiglu: sizes differ");
  const float *g = gate->data, *u = up->data;
  float *o = out->data;
#pragma omp parallel for schedule(static) if (n > 8192)
  for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  return RA_OK;
}

/* ---------- attention ---------- */

/* exp(x) for x <= 0 (softmax after subtracting the max), ~1 ulp, written so compilers vectorize
 * it: 2^k by exponent bits and a degree-6 polynomial of the remainder on [-ln2/2, ln2/2]. */
static inline float exp_neg(float x) {
  x = x < -87.0f ? -87.0f : x;
  float kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest integer */
  float r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16664183e-2f + r * (8.33336077e-3f + r * 1.38873016e-3f)))));
  int32_t bits = ((int32_t)kf + 127) << 23;
  float s;
  memcpy(&s, &bits, 4);
  return p * s;
}

/* Copies token rows [t0, t0 + nt) of kv head `kvh` of a cache [n_ctx, n_kv, hd] to dst [nt][hd]. */
static void cache_rows_f32(const ra_tensor *c, int64_t t0, int64_t nt, int64_t kvh, float *dst) {
  int64_t n_kv = c->shape[1], hd = c->shape[2];
  size_t es = ra_dtype_size(c->dtype);
  for (int64_t j = 0; j < nt; j++)
    ra_dtype_to_fp32_n(c->dtype, (const char *)c->data + (size_t)(((t0 + j) * n_kv + kvh) * hd) * es,
                       dst + j * hd, (size_t)hd);
}

typedef struct pf_scratch {
  float *qs, *m, *l, *acc, *kbuf, *kt, *vbuf, *s;
} pf_scratch;

/* One prefill work item: all q heads of kv head `kvh` for query tokens [i0, i0 + bq), online
 * softmax over key tiles of PF_BK.  Rows r = g * bq + t (g: head in group, t: token).
 *   qs: [R, hd] (pre-scaled), acc: [R, hd], kt: [hd, PF_BK] (transposed tile), vbuf: [PF_BK, hd] */
RA_HOT static void prefill_block(const float *q, int64_t hq, int64_t hd, int64_t group, int64_t kvh, int64_t i0,
                                 int64_t bq, int64_t pos0, float scale, const ra_tensor *kc, const ra_tensor *vc,
                                 float *out, pf_scratch *sc) {
  int64_t R = group * bq;
  for (int64_t r = 0; r < R; r++) {
    int64_t g = r / bq, t = r % bq, h = kvh * group + g;
    const float *qr = q + ((i0 + t) * hq + h) * hd;
    for (int64_t d = 0; d < hd; d++) sc->qs[r * hd + d] = qr[d] * scale;
    sc->m[r] = -INFINITY;
    sc->l[r] = 0.0f;
    memset(sc->acc + r * hd, 0, (size_t)hd * sizeof(float));
  }
  int64_t kend = pos0 + i0 + bq; /* keys visible to the last token of the block */
  for (int64_t kb = 0; kb < kend; kb += PF_BK) {
    int64_t kt = kend - kb < PF_BK ? kend - kb : PF_BK;
    cache_rows_f32(kc, kb, kt, kvh, sc->kbuf);
    cache_rows_f32(vc, kb, kt, kvh, sc->vbuf);
    for (int64_t j = 0; j < kt; j++)
      for (int64_t d = 0; d < hd; d++) sc->kt[d * PF_BK + j] = sc->kbuf[j * hd + d];
    for (int64_t r = 0; r < R; r++) {
      int64_t t = r % bq;
      int64_t cnt = pos0 + i0 + t + 1 - kb; /* causal: keys <= own position */
      if (cnt <= 0) continue;
      if (cnt > kt) cnt = kt;
      float *s = sc->s;
      const float *qr = sc->qs + r * hd;
      for (int64_t j = 0; j < cnt; j++) s[j] = 0.0f;
      for (int64_t d = 0; d < hd; d++) {
        float qd = qr[d];
        const float *kr = sc->kt + d * PF_BK;
#pragma omp simd
        for (int64_t j = 0; j < cnt; j++) s[j] += qd * kr[j];
      }
      float mx = sc->m[r];
      for (int64_t j = 0; j < cnt; j++) mx = s[j] > mx ? s[j] : mx;
      float corr = sc->m[r] == -INFINITY ? 0.0f : expf(sc->m[r] - mx);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cnt; j++) {
        s[j] = exp_neg(s[j] - mx);
        sum += s[j];
      }
      sc->l[r] = sc->l[r] * corr + sum;
      sc->m[r] = mx;
      float *acc = sc->acc + r * hd;
      for (int64_t d = 0; d < hd; d++) acc[d] *= corr;
      for (int64_t j = 0; j < cnt; j++) {
        float p = s[j];
        const float *vr = sc->vbuf + j * hd;
#pragma omp simd
        for (int64_t d = 0; d < hd; d++) acc[d] += p * vr[d];
      }
    }
  }
  for (int64_t r = 0; r < R; r++) {
    int64_t g = r / bq, t = r % bq, h = kvh * group + g;
    float inv = 1.0f / sc->l[r];
    float *o = out + ((i0 + t) * hq + h) * hd;
    for (int64_t d = 0; d < hd; d++) o[d] = sc->acc[r * hd + d] * inv;
  }
}

static int cpu_attn_prefill(ra_backend *be, const ra_tensor *q, const ra_tensor *kc, const ra_tensor *vc, int64_t pos0,
                            float scale, ra_tensor *out, ra_error *err) {
  int rc = ra_backend_check_attn_prefill("cpu", q, kc, vc, pos0, out, err);
  if (rc) return rc;
  int64_t n = q->shape[0], hq = q->shape[1], hd = q->shape[2], hkv = kc->shape[1];
  int64_t group = hq / hkv, nb = (n + PF_BQ - 1) / PF_BQ;
  int failed = 0;
#pragma omp parallel
  {
    int64_t R = group * PF_BQ;
    pf_scratch sc;
    float *mem = malloc(sizeof(float) * (size_t)(R * hd * 2 + R * 2 + PF_BK * hd * 3 + PF_BK));
    if (!mem) {
#pragma omp atomic write
      failed = 1;
    } else {
      sc.qs = mem;
      sc.acc = sc.qs + R * hd;
      sc.m = sc.acc + R * hd;
      sc.l = sc.m + R;
      sc.kbuf = sc.l + R;
      sc.kt = sc.kbuf + PF_BK * hd;
      sc.vbuf = sc.kt + PF_BK * hd;
      sc.s = sc.vbuf + PF_BK * hd;
    }
    /* Later blocks see more keys: dynamic scheduling balances the causal triangle. */
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t b = 0; b < nb; b++)
      for (int64_t kvh = 0; kvh < hkv; kvh++) {
        if (!mem) continue;
        int64_t i0 = (nb - 1 - b) * PF_BQ; /* longest blocks first */
        int64_t bq = n - i0 < PF_BQ ? n - i0 : PF_BQ;
        prefill_block(q->data, hq, hd, group, kvh, i0, bq, pos0, scale, kc, vc, out->data, &sc);
      }
    free(mem);
  }
  return failed ? ra_errorf(err, RA_ENOMEM, "cpu attn_prefill: out of memory for scratch") : RA_OK;
}

/* One decode work item: the partials of all q heads of kv head `kvh` over cache rows
 * [t0, t0 + nt), nt <= DEC_CHUNK, written unnormalized: part[g] = {m, l, sum p v [hd]}. */
RA_HOT static void decode_chunk(const float *q, int64_t hd, int64_t group, int64_t kvh, int64_t t0, int64_t nt,
                                float scale, const ra_tensor *kc, const ra_tensor *vc, float *kbuf, float *kt,
                                float *s, float *part) {
  cache_rows_f32(kc, t0, nt, kvh, kbuf);
  for (int64_t j = 0; j < nt; j++)
    for (int64_t d = 0; d < hd; d++) kt[d * DEC_CHUNK + j] = kbuf[j * hd + d];
  cache_rows_f32(vc, t0, nt, kvh, kbuf); /* kbuf now holds V rows */
  for (int64_t g = 0; g < group; g++) {
    const float *qg = q + (kvh * group + g) * hd;
    float *pg = part + g * (hd + 2);
    for (int64_t j = 0; j < nt; j++) s[j] = 0.0f;
    for (int64_t d = 0; d < hd; d++) {
      float qd = qg[d] * scale;
      const float *kr = kt + d * DEC_CHUNK;
#pragma omp simd
      for (int64_t j = 0; j < nt; j++) s[j] += qd * kr[j];
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j < nt; j++) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nt; j++) {
      s[j] = exp_neg(s[j] - mx);
      sum += s[j];
    }
    float *o = pg + 2;
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int64_t j = 0; j < nt; j++) {
      float p = s[j];
      const float *vr = kbuf + j * hd;
#pragma omp simd
      for (int64_t d = 0; d < hd; d++) o[d] += p * vr[d];
    }
    pg[0] = mx;
    pg[1] = sum;
  }
}

static int cpu_attn_decode(ra_backend *be, const ra_tensor *q, const ra_tensor *kc, const ra_tensor *vc,
                           const ra_token_range *ranges, int n_ranges, float scale, ra_tensor *o, ra_tensor *ml,
                           ra_error *err) {
  int rc = ra_backend_check_attn_decode("cpu", q, kc, vc, ranges, n_ranges, o, ml, err);
  if (rc) return rc;
  int64_t hd = last_dim(q), hq = (int64_t)ra_tensor_nelem(q) / hd, hkv = kc->shape[1];
  int64_t n_chunks = 0;
  for (int i = 0; i < n_ranges; i++) n_chunks += (ranges[i].end - ranges[i].begin + DEC_CHUNK - 1) / DEC_CHUNK;
  int64_t group = hq / hkv;
  /* chunk c covers [cb[c], cb[c] + cn[c]) */
  int64_t *cb = malloc(sizeof(int64_t) * (size_t)(n_chunks + 1) * 2);
  float *parts = malloc(sizeof(float) * (size_t)((n_chunks ? n_chunks : 1) * hkv * group * (hd + 2)));
  if (!cb || !parts) {
    free(cb);
    free(parts);
    return ra_errorf(err, RA_ENOMEM, "cpu attn_decode: out of memory");
  }
  int64_t *cn = cb + n_chunks + 1, c = 0;
  for (int i = 0; i < n_ranges; i++)
    for (int64_t t = ranges[i].begin; t < ranges[i].end; t += DEC_CHUNK, c++) {
      cb[c] = t;
      cn[c] = ranges[i].end - t < DEC_CHUNK ? ranges[i].end - t : DEC_CHUNK;
    }
  int failed = 0;
#pragma omp parallel if (n_chunks * hkv > 1)
  {
    float *mem = malloc(sizeof(float) * (size_t)(DEC_CHUNK * hd * 2 + DEC_CHUNK));
    if (!mem) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static) collapse(2)
    for (int64_t ci = 0; ci < n_chunks; ci++)
      for (int64_t kvh = 0; kvh < hkv; kvh++) {
        if (!mem) continue;
        decode_chunk(q->data, hd, group, kvh, cb[ci], cn[ci], scale, kc, vc, mem, mem + DEC_CHUNK * hd,
                     mem + DEC_CHUNK * hd * 2, parts + (ci * hkv + kvh) * group * (hd + 2));
      }
    free(mem);
  }
  if (failed) {
    free(cb);
    free(parts);
    return ra_errorf(err, RA_ENOMEM, "cpu attn_decode: out of memory for scratch");
  }
  /* Merge the chunks of every head: m = max m_c, l = sum l_c e^(m_c - m), o = sum o_c e^(m_c - m) / l */
  float *od = o->data, *mld = ml->data;
  for (int64_t h = 0; h < hq; h++) {
    int64_t kvh = h / group, g = h % group;
    float mx = -INFINITY;
    for (int64_t ci = 0; ci < n_chunks; ci++) {
      float mc = parts[((ci * hkv + kvh) * group + g) * (hd + 2)];
      mx = mc > mx ? mc : mx;
    }
    float l = 0.0f;
    float *oh = od + h * hd;
    memset(oh, 0, (size_t)hd * sizeof(float));
    for (int64_t ci = 0; ci < n_chunks; ci++) {
      const float *p = parts + ((ci * hkv + kvh) * group + g) * (hd + 2);
      float w = expf(p[0] - mx);
      l += p[1] * w;
      for (int64_t d = 0; d < hd; d++) oh[d] += p[2 + d] * w;
    }
    if (l > 0.0f)
      for (int64_t d = 0; d < hd; d++) oh[d] /= l;
    mld[2 * h] = mx;
    mld[2 * h + 1] = l;
  }
  free(cb);
  free(parts);
  return RA_OK;
}

static int cpu_attn_decode_batch(ra_backend *be, const ra_attn_decode_item *items, int n_items, float scale,
                                 ra_error *err) {
  int rc = ra_backend_check_attn_decode_batch("cpu", items, n_items, err);
  for (int i = 0; rc == RA_OK && i < n_items; i++) {
    ra_token_range all = {0, items[i].n};
    rc = cpu_attn_decode(be, items[i].q, items[i].k_cache, items[i].v_cache, &all, 1, scale, items[i].o, items[i].ml,
                         err);
  }
  return rc;
}

static int cpu_attn_merge(ra_backend *be, ra_tensor *o_acc, ra_tensor *ml_acc, const ra_tensor *o, const ra_tensor *ml,
                          ra_error *err) {
  int rc = ra_backend_check_attn_merge("cpu", o_acc, ml_acc, o, ml, err);
  if (rc) return rc;
  size_t heads = ra_tensor_nelem(ml) / 2;
  int hd = (int)(ra_tensor_nelem(o) / heads);
  float *oa = o_acc->data, *mla = ml_acc->data;
  const float *ob = o->data, *mlb = ml->data;
  for (size_t h = 0; h < heads; h++) {
    ra_partial acc = {oa + h * (size_t)hd, mla[2 * h], mla[2 * h + 1]};
    ra_partial_merge(&acc, ob + h * (size_t)hd, mlb[2 * h], mlb[2 * h + 1], hd);
    mla[2 * h] = acc.m;
    mla[2 * h + 1] = acc.l;
  }
  return RA_OK;
}

/* heap order: a is "worse" than b (lower value, or equal value and higher index) */
static int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void sift_down(float *v, int32_t *ix, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, w = i;
    if (l < n && worse(v[l], ix[l], v[w], ix[w])) w = l;
    if (r < n && worse(v[r], ix[r], v[w], ix[w])) w = r;
    if (w == i) return;
    float tv = v[i]; v[i] = v[w]; v[w] = tv;
    int32_t ti = ix[i]; ix[i] = ix[w]; ix[w] = ti;
    i = w;
  }
}

static int cpu_topk_rows(ra_backend *be, const ra_tensor *x, int k, int32_t *idx, float *val, ra_error *err) {
  int rc = want_dtype(x, RA_DTYPE_F32, "topk_rows", "x", err);
  if (rc) return rc;
  int64_t m = last_dim(x), n = n_rows(x);
  if (k <= 0 || k > m || m > INT32_MAX) return ra_errorf(err, RA_EINVAL, "cpu topk_rows: k %d for rows of %lld", k, (long long)m);
  const float *xd = x->data;
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t r = 0; r < n; r++) {
    /* min-heap of the best k seen so far: the root is the worst kept */
    float *v = val + r * k;
    int32_t *ix = idx + r * k;
    const float *row = xd + r * m;
    for (int i = 0; i < k; i++) {
      v[i] = row[i];
      ix[i] = i;
    }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(v, ix, k, i);
    for (int64_t j = k; j < m; j++)
      if (worse(v[0], ix[0], row[j], (int32_t)j)) {
        v[0] = row[j];
        ix[0] = (int32_t)j;
        sift_down(v, ix, k, 0);
      }
    /* heap sort: repeatedly move the worst to the end -> descending order */
    for (int end = k - 1; end > 0; end--) {
      float tv = v[0]; v[0] = v[end]; v[end] = tv;
      int32_t ti = ix[0]; ix[0] = ix[end]; ix[end] = ti;
      sift_down(v, ix, end, 0);
    }
  }
  return RA_OK;
}

static int cpu_sync(ra_backend *be, ra_error *err) { return RA_OK; }

static void cpu_destroy(ra_backend *be) {
  free(be->impl);
  free(be);
}

static const ra_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .download_raw = cpu_download_raw,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy = cpu_copy,
    .load_weight = cpu_load_weight,
    .fill_random = cpu_fill_random,
    .get_rows = cpu_get_rows,
    .set_rows = cpu_set_rows,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .attn_prefill = cpu_attn_prefill,
    .attn_decode = cpu_attn_decode,
    .attn_decode_batch = cpu_attn_decode_batch,
    .attn_merge = cpu_attn_merge,
    .topk_rows = cpu_topk_rows,
    .cluster_keys = ra_cpu_cluster_keys,
    .wave_select = ra_cpu_wave_select,
    .wave_select_batch = ra_backend_seq_wave_select_batch,
    .wave_estimate = ra_cpu_wave_estimate,
    .norm_matmul = ra_backend_seq_norm_matmul,
    .norm_swiglu = ra_backend_seq_norm_swiglu,
    .rope_store = ra_backend_seq_rope_store,
    .rope_store_batch = ra_backend_seq_rope_store_batch,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

int ra_backend_cpu_create(const ra_backend_config *cfg, ra_backend **out, ra_error *err) {
  ra_backend *be = calloc(1, sizeof(*be));
  cpu_impl *impl = calloc(1, sizeof(*impl));
  if (!be || !impl) {
    free(be);
    free(impl);
    return ra_errorf(err, RA_ENOMEM, "cpu backend: out of memory");
  }
  impl->n_threads = cfg && cfg->n_threads > 0 ? cfg->n_threads : omp_get_num_procs();
  omp_set_num_threads(impl->n_threads);
  openblas_set_num_threads(1);
  be->ops = &cpu_ops;
  be->name = "cpu";
  be->impl = impl;
  *out = be;
  return RA_OK;
}
