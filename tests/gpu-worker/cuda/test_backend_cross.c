/* The CUDA backend against the CPU backend (the reference), op by op and for whole forward
 * passes (the idea of ggml's test-backend-ops).
 *
 * Every case runs the same inputs through both backends and compares with a stated tolerance;
 * the table printed at the end lists each case's error metric next to its bound. Metrics:
 *   bits     number of elements whose fp32 bit patterns differ (conversions, fill_random,
 *            dequantization, get_rows: both sides compute the same fp32 values; a BF16 result
 *            is compared with the CPU's fp32 value rounded to BF16)
 *   rel_dot  max_i |y_gpu - y_cpu| / (sum_j |x_j w_ij| + |bias_i| + |y0_i|): matmul. The bound
 *            follows the path: fp32 accumulation of identical operands (GEMV, F32 weights) 1e-4;
 *            cuBLAS with x rounded to BF16 2^-8, to FP16 2^-10
 *   abs      max |gpu - cpu| on outputs of magnitude <= ~1 (rope, attention o, merge)
 *   rel      max |gpu - cpu| / max |cpu|  (rmsnorm, swiglu, logits)
 *   argmax   1 when the last token's argmax differs and the CPU's top-2 gap exceeds twice the
 *            max logit error (a near tie may flip)
 * Attention on tensor cores (head_dim 64/128) rounds Q, K, V and P to FP16: bound 1e-2 abs
 * (observed errors are expected around 1e-3); the CUDA-core path (other head dims) 1e-4.
 *
 * Usage: test_backend_cross [--json FILE]
 * Exit: 0 all cases pass, 1 a case failed, 77 no CUDA device (ctest SKIP_RETURN_CODE). */
#include "backend.h"
#include "backend_cuda.h"
#include "gguf.h"
#include "half.h"
#include "model.h"
#include "quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static ra_backend *g_cpu, *g_gpu;

/* ---------- results ---------- */

typedef struct result {
  char op[24];
  char desc[112];
  const char *metric;
  double err, tol;
  int pass;
} result;

static result g_res[1024];
static int g_nres, g_nfail;

static void report(const char *op, const char *metric, double err, double tol, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void report(const char *op, const char *metric, double err, double tol, const char *fmt, ...) {
  result r;
  memset(&r, 0, sizeof r);
  snprintf(r.op, sizeof r.op, "%s", op);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.desc, sizeof r.desc, fmt, ap);
  va_end(ap);
  r.metric = metric;
  r.err = err;
  r.tol = tol;
  r.pass = err <= tol; /* NaN fails */
  if (!r.pass) g_nfail++;
  printf("%-12s %-58s %-8s %10.3e %10.3e  %s\n", r.op, r.desc, r.metric, r.err, r.tol, r.pass ? "ok" : "FAIL");
  fflush(stdout);
  if (g_nres < (int)(sizeof g_res / sizeof g_res[0])) g_res[g_nres++] = r;
}

/* An op that should have worked returned an error: the case fails with the message. */
static void report_error(const char *op, const char *desc, const ra_error *err) {
  printf("%-12s %-58s ERROR: %s\n", op, desc, err->msg);
  report(op, "error", INFINITY, 0.0, "%s", desc);
}

#define TRY(op, desc, call)            \
  do {                                 \
    if ((call) != RA_OK) {             \
      report_error(op, desc, &err);    \
      goto done;                       \
    }                                  \
  } while (0)

/* ---------- host data ---------- */

static uint64_t g_rng = 0x1234abcdull;

static uint64_t rnext(void) {
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* uniform in [-a, a) */
static float urand(float a) { return a * ((float)(rnext() >> 40) * 0x1p-23f - 1.0f); }

static float *rand_vec(size_t n, float a) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  if (!v) abort();
  for (size_t i = 0; i < n; i++) v[i] = urand(a);
  return v;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of host memory\n");
    exit(1);
  }
  return p;
}

/* ---------- tensors on both backends ---------- */

typedef struct pair {
  ra_tensor c, g;
} pair;

static int pair_new(pair *p, ra_dtype dt, int ndim, const int64_t *shape, const float *host, ra_error *err) {
  memset(p, 0, sizeof *p);
  int rc;
  if ((rc = ra_tensor_new(g_cpu, &p->c, dt, ndim, shape, err)) || (rc = ra_tensor_new(g_gpu, &p->g, dt, ndim, shape, err)))
    return rc;
  if (host) {
    size_t n = ra_tensor_nelem(&p->c);
    if ((rc = g_cpu->ops->upload(g_cpu, &p->c, 0, host, n, err)) || (rc = g_gpu->ops->upload(g_gpu, &p->g, 0, host, n, err)))
      return rc;
  }
  return RA_OK;
}

static void pair_free(pair *p) {
  ra_tensor_free(&p->c);
  ra_tensor_free(&p->g);
}

/* Downloads the whole tensor into a new host buffer. */
static int fetch(const ra_tensor *t, float **out, ra_error *err) {
  size_t n = ra_tensor_nelem(t);
  *out = xmalloc(n * sizeof(float));
  return t->be->ops->download(t->be, t, 0, *out, n, err);
}

static int fetch_pair(const pair *p, float **c, float **g, ra_error *err) {
  *c = *g = NULL;
  int rc = fetch(&p->c, c, err);
  return rc ? rc : fetch(&p->g, g, err);
}

/* ---------- metrics ---------- */

static double bits_differ(const float *a, const float *b, size_t n) {
  size_t d = 0;
  for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return (double)d;
}

static float bf16_round(float x) { return ra_bf16_to_fp32(ra_fp32_to_bf16(x)); }

static double max_abs(const float *ref, const float *x, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)ref[i] - (double)x[i]);
    if (isinf(ref[i]) && ref[i] == x[i]) d = 0.0;
    if (d != d || d > m) m = d != d ? INFINITY : d;
  }
  return m;
}

static double max_rel(const float *ref, const float *x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s = fabs(ref[i]) > s ? fabs(ref[i]) : s;
  return max_abs(ref, x, n) / (s > 0.0 ? s : 1.0);
}

static const char *dt_name(ra_dtype d) { return ra_dtype_name(d); }

/* ---------- memory and conversions ---------- */

static void test_upload_download(void) {
  ra_error err;
  /* The 16-bit tensors also at 40M elements: more than one chunk of the CUDA download's
   * 64 MiB pinned bounce buffer, converted by all cores. */
  const ra_dtype dts[] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16, RA_DTYPE_F16, RA_DTYPE_BF16};
  const size_t ns[] = {1001, 1001, 1001, 40000003, 40000003};
  for (int i = 0; i < 5; i++) {
    pair p;
    const size_t n = ns[i];
    float *h = rand_vec(n, 3.0f), *c = NULL, *g = NULL;
    void *pin = NULL, *raw = NULL;
    h[0] = 70000.0f; /* overflows f16 */
    h[1] = 1e-9f;    /* f16 subnormal / zero */
    int64_t shape[1] = {(int64_t)n};
    char desc[64];
    snprintf(desc, sizeof desc, "%s n=%zu, offset 3", dt_name(dts[i]), n);
    TRY("upload", desc, pair_new(&p, dts[i], 1, shape, NULL, &err));
    TRY("upload", desc, g_cpu->ops->upload(g_cpu, &p.c, 3, h, n - 4, &err));
    TRY("upload", desc, g_gpu->ops->upload(g_gpu, &p.g, 3, h, n - 4, &err));
    TRY("download", desc, fetch_pair(&p, &c, &g, &err));
    report("up/download", "bits", bits_differ(c, g, n), 0, "%s", desc);
    /* into the backend's pinned host memory at an interior pointer: widened on the device */
    TRY("download", desc, g_gpu->ops->host_alloc(g_gpu, (n + 5) * sizeof(float), &pin, &err));
    TRY("download", desc, g_gpu->ops->download(g_gpu, &p.g, 0, (float *)pin + 5, n, &err));
    report("up/download", "bits", bits_differ(c, (float *)pin + 5, n), 0, "%s, into host_alloc memory", desc);
    /* as stored, from offset 2, into host_alloc memory (the GPU) and malloc'ed (the CPU) */
    const size_t es = ra_dtype_size(dts[i]);
    TRY("download_raw", desc, !(raw = malloc((n - 2) * es)) ? ra_errorf(&err, RA_ENOMEM, "no memory") : RA_OK);
    TRY("download_raw", desc, g_cpu->ops->download_raw(g_cpu, &p.c, 2, raw, n - 2, &err));
    TRY("download_raw", desc, g_gpu->ops->download_raw(g_gpu, &p.g, 2, pin, n - 2, &err));
    report("download_raw", "bytes", memcmp(raw, pin, (n - 2) * es) != 0, 0, "%s n=%zu, from element 2",
           dt_name(dts[i]), n);
  done:
    free(raw);
    g_gpu->ops->host_free(g_gpu, pin);
    pair_free(&p);
    free(h);
    free(c);
    free(g);
  }
}

static void test_copy(void) {
  ra_error err;
  const ra_dtype dts[] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  for (int s = 0; s < 3; s++)
    for (int d = 0; d < 3; d++) {
      pair src, dst;
      memset(&dst, 0, sizeof dst);
      float *h = rand_vec(1003, 100.0f), *c = NULL, *g = NULL;
      int64_t shape[1] = {1003};
      char desc[64];
      snprintf(desc, sizeof desc, "%s -> %s, 990 elements at 2 -> 5", dt_name(dts[s]), dt_name(dts[d]));
      TRY("copy", desc, pair_new(&src, dts[s], 1, shape, h, &err));
      TRY("copy", desc, pair_new(&dst, dts[d], 1, shape, NULL, &err));
      TRY("copy", desc, g_cpu->ops->copy(g_cpu, &dst.c, 5, &src.c, 2, 990, &err));
      TRY("copy", desc, g_gpu->ops->copy(g_gpu, &dst.g, 5, &src.g, 2, 990, &err));
      TRY("copy", desc, fetch_pair(&dst, &c, &g, &err));
      report("copy", "bits", bits_differ(c, g, 1003), 0, "%s", desc);
    done:
      pair_free(&src);
      pair_free(&dst);
      free(h);
      free(c);
      free(g);
    }
}

static void test_fill_random(void) {
  ra_error err;
  const ra_dtype dts[] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  const int64_t sizes[] = {1, 257, 1000003};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      pair p;
      float *c = NULL, *g = NULL;
      char desc[64];
      snprintf(desc, sizeof desc, "%s n=%lld seed %d", dt_name(dts[i]), (long long)sizes[j], 7 + j);
      TRY("fill_random", desc, pair_new(&p, dts[i], 1, &sizes[j], NULL, &err));
      TRY("fill_random", desc, g_cpu->ops->fill_random(g_cpu, &p.c, 7 + (uint64_t)j, 0.25f, 1.5f, &err));
      TRY("fill_random", desc, g_gpu->ops->fill_random(g_gpu, &p.g, 7 + (uint64_t)j, 0.25f, 1.5f, &err));
      TRY("fill_random", desc, fetch_pair(&p, &c, &g, &err));
      report("fill_random", "bits", bits_differ(c, g, (size_t)sizes[j]), 0, "%s", desc);
    done:
      pair_free(&p);
      free(c);
      free(g);
    }
}

/* ---------- weights ---------- */

/* Random raw data of `type` with sane fp16 scale fields (random bytes there could be NaN). */
static uint8_t *rand_raw(uint32_t type, int64_t rows, int64_t cols, size_t *bytes) {
  size_t rb = 0;
  ra_quant_row_bytes(type, (uint64_t)cols, &rb);
  size_t total = rb * (size_t)rows;
  uint8_t *raw = xmalloc(total);
  *bytes = total;
  size_t n = (size_t)rows * (size_t)cols;
  if (type == RA_GGML_F32 || type == RA_GGML_F16 || type == RA_GGML_BF16) {
    for (size_t i = 0; i < n; i++) {
      float v = urand(2.0f);
      if (type == RA_GGML_F32) memcpy(raw + 4 * i, &v, 4);
      uint16_t h = type == RA_GGML_F16 ? ra_fp32_to_fp16(v) : ra_fp32_to_bf16(v);
      if (type != RA_GGML_F32) memcpy(raw + 2 * i, &h, 2);
    }
    return raw;
  }
  for (size_t i = 0; i < total; i++) raw[i] = (uint8_t)rnext();
  int offs[2] = {-1, -1};
  switch (type) {
    case RA_GGML_Q4_0: case RA_GGML_Q5_0: case RA_GGML_Q8_0: offs[0] = 0; break;
    case RA_GGML_Q4_1: case RA_GGML_Q5_1: case RA_GGML_Q4_K: case RA_GGML_Q5_K: offs[0] = 0; offs[1] = 2; break;
    case RA_GGML_Q2_K: offs[0] = 80; offs[1] = 82; break;
    case RA_GGML_Q3_K: offs[0] = 108; break;
    case RA_GGML_Q6_K: offs[0] = 208; break;
    default: break;
  }
  size_t bb = ra_quant_block_bytes(type);
  for (size_t b = 0; b < total / bb; b++)
    for (int k = 0; k < 2; k++)
      if (offs[k] >= 0) {
        uint16_t h = ra_fp32_to_fp16(0.001f + 0.05f * (urand(1.0f) + 1.0f));
        memcpy(raw + b * bb + (size_t)offs[k], &h, 2);
      }
  return raw;
}

static void test_load_weight(void) {
  ra_error err;
  const uint32_t types[] = {RA_GGML_F32,  RA_GGML_F16,  RA_GGML_BF16, RA_GGML_Q4_0, RA_GGML_Q4_1,
                            RA_GGML_Q5_0, RA_GGML_Q5_1, RA_GGML_Q8_0, RA_GGML_Q2_K, RA_GGML_Q3_K,
                            RA_GGML_Q4_K, RA_GGML_Q5_K, RA_GGML_Q6_K};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    for (int rows = 1; rows <= 5; rows += 4) {
      int64_t bs = (int64_t)ra_quant_block_size(types[i]);
      int64_t cols = bs == 1 ? 257 : 3 * bs;
      size_t bytes;
      uint8_t *raw = rand_raw(types[i], rows, cols, &bytes);
      ra_tensor c, g;
      memset(&c, 0, sizeof c);
      memset(&g, 0, sizeof g);
      float *hc = NULL, *hg = NULL;
      char desc[80];
      snprintf(desc, sizeof desc, "%s [%d, %lld]", ra_quant_name(types[i]), rows, (long long)cols);
      TRY("load_weight", desc, g_cpu->ops->load_weight(g_cpu, raw, types[i], rows, cols, &c, &err));
      TRY("load_weight", desc, g_gpu->ops->load_weight(g_gpu, raw, types[i], rows, cols, &g, &err));
      TRY("load_weight", desc, fetch(&c, &hc, &err));
      TRY("load_weight", desc, fetch(&g, &hg, &err));
      size_t n = (size_t)rows * (size_t)cols;
      if (g.dtype == RA_DTYPE_BF16)
        for (size_t j = 0; j < n; j++) hc[j] = bf16_round(hc[j]);
      report("load_weight", "bits", bits_differ(hc, hg, n), 0, "%s -> %s", desc, dt_name(g.dtype));
    done:
      ra_tensor_free(&c);
      ra_tensor_free(&g);
      free(raw);
      free(hc);
      free(hg);
    }
}

static void test_get_rows(void) {
  ra_error err;
  /* 0: F32 table, 1: loaded (BF16 on CUDA), 2: 100 ids, 3 / 4: F16 / BF16 tables on both sides
   * (a half-precision KV cache as rows, roar's kNN) */
  for (int variant = 0; variant < 5; variant++) {
    int64_t vocab = 1001, dim = 96;
    int n = variant == 2 ? 100 : 7; /* more than RA_CUDA_INLINE_IDS (64) go through device memory */
    const ra_dtype tdt = variant == 3 ? RA_DTYPE_F16 : variant == 4 ? RA_DTYPE_BF16 : RA_DTYPE_F32;
    int32_t ids[100];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 389 + (i == 1 ? 1000 : 0)) % vocab);
    float *tab = rand_vec((size_t)(vocab * dim), 1.0f), *c = NULL, *g = NULL;
    ra_tensor tc, tg;
    memset(&tc, 0, sizeof tc);
    memset(&tg, 0, sizeof tg);
    pair out;
    memset(&out, 0, sizeof out);
    int64_t tshape[2] = {vocab, dim}, oshape[2] = {n, dim};
    const char *desc = variant == 0   ? "7 ids, F32 table"
                       : variant == 1 ? "7 ids, table from load_weight F32 (BF16 on CUDA)"
                       : variant == 2 ? "100 ids, table from load_weight F32 (BF16 on CUDA)"
                       : variant == 3 ? "7 ids, F16 table"
                                      : "7 ids, BF16 table";
    if (variant == 1 || variant == 2) {
      TRY("get_rows", desc, g_cpu->ops->load_weight(g_cpu, tab, RA_GGML_F32, vocab, dim, &tc, &err));
      TRY("get_rows", desc, g_gpu->ops->load_weight(g_gpu, tab, RA_GGML_F32, vocab, dim, &tg, &err));
    } else {
      TRY("get_rows", desc, ra_tensor_new(g_cpu, &tc, tdt, 2, tshape, &err));
      TRY("get_rows", desc, ra_tensor_new(g_gpu, &tg, tdt, 2, tshape, &err));
      TRY("get_rows", desc, g_cpu->ops->upload(g_cpu, &tc, 0, tab, (size_t)(vocab * dim), &err));
      TRY("get_rows", desc, g_gpu->ops->upload(g_gpu, &tg, 0, tab, (size_t)(vocab * dim), &err));
    }
    TRY("get_rows", desc, pair_new(&out, RA_DTYPE_F32, 2, oshape, NULL, &err));
    TRY("get_rows", desc, g_cpu->ops->get_rows(g_cpu, &tc, ids, n, &out.c, &err));
    TRY("get_rows", desc, g_gpu->ops->get_rows(g_gpu, &tg, ids, n, &out.g, &err));
    TRY("get_rows", desc, fetch_pair(&out, &c, &g, &err));
    if (tg.dtype == RA_DTYPE_BF16)
      for (int64_t j = 0; j < n * dim; j++) c[j] = bf16_round(c[j]);
    report("get_rows", "bits", bits_differ(c, g, (size_t)(n * dim)), 0, "%s", desc);
  done:
    ra_tensor_free(&tc);
    ra_tensor_free(&tg);
    pair_free(&out);
    free(tab);
    free(c);
    free(g);
  }
}

/* set_rows: the same fp32 rows scattered into F32 / F16 / BF16 tables on both sides (7 ids
 * inline, 100 through device memory) give the same table bits. */
static void test_set_rows(void) {
  ra_error err;
  for (int variant = 0; variant < 4; variant++) {
    const int64_t rows = 1000, dim = 128;
    const int n = variant == 3 ? 100 : 7;
    const ra_dtype tdt = variant == 1 ? RA_DTYPE_F16 : variant == 0 ? RA_DTYPE_F32 : RA_DTYPE_BF16;
    int32_t ids[100];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 389 + 7) % rows);
    float *hs = rand_vec((size_t)(n * dim), 2.0f), *c = NULL, *g = NULL;
    pair tab, src;
    memset(&tab, 0, sizeof tab);
    memset(&src, 0, sizeof src);
    int64_t tshape[2] = {rows, dim}, sshape[2] = {n, dim};
    char desc[64];
    snprintf(desc, sizeof desc, "%d ids into a %s table", n, ra_dtype_name(tdt));
    TRY("set_rows", desc, pair_new(&tab, tdt, 2, tshape, NULL, &err));
    TRY("set_rows", desc, pair_new(&src, RA_DTYPE_F32, 2, sshape, hs, &err));
    TRY("set_rows", desc, g_cpu->ops->set_rows(g_cpu, &tab.c, ids, n, &src.c, &err));
    TRY("set_rows", desc, g_gpu->ops->set_rows(g_gpu, &tab.g, ids, n, &src.g, &err));
    TRY("set_rows", desc, fetch_pair(&tab, &c, &g, &err));
    report("set_rows", "bits", bits_differ(c, g, (size_t)(rows * dim)), 0, "%s", desc);
  done:
    pair_free(&tab);
    pair_free(&src);
    free(hs);
    free(c);
    free(g);
  }
}

/* ---------- matmul ---------- */

enum { W_LOADED, W_F16, W_F32 };

typedef struct mm_case {
  int64_t n, k, m;
  int bias, acc, wkind;
} mm_case;

static void test_matmul_case(const mm_case *mc) {
  ra_error err;
  const char *wname[] = {"load_weight (BF16)", "F16", "F32"};
  char desc[112];
  snprintf(desc, sizeof desc, "n=%lld k=%lld m=%lld w %s%s%s", (long long)mc->n, (long long)mc->k, (long long)mc->m,
           wname[mc->wkind], mc->bias ? " +bias" : "", mc->acc ? " +acc" : "");
  int64_t n = mc->n, k = mc->k, m = mc->m;
  float *x = rand_vec((size_t)(n * k), 1.0f), *w = rand_vec((size_t)(m * k), 0.1f), *b = rand_vec((size_t)m, 1.0f);
  float *y0 = rand_vec((size_t)(n * m), 1.0f), *wq = NULL, *c = NULL, *g = NULL;
  ra_tensor wc, wg;
  memset(&wc, 0, sizeof wc);
  memset(&wg, 0, sizeof wg);
  pair px, pb, py;
  memset(&px, 0, sizeof px);
  memset(&pb, 0, sizeof pb);
  memset(&py, 0, sizeof py);
  int64_t wshape[2] = {m, k}, xshape[2] = {n, k}, yshape[2] = {n, m}, bshape[1] = {m};
  /* the GPU weight first; the CPU gets exactly its (rounded) values in F32 */
  if (mc->wkind == W_LOADED) {
    TRY("matmul", desc, g_gpu->ops->load_weight(g_gpu, w, RA_GGML_F32, m, k, &wg, &err));
  } else {
    TRY("matmul", desc, ra_tensor_new(g_gpu, &wg, mc->wkind == W_F16 ? RA_DTYPE_F16 : RA_DTYPE_F32, 2, wshape, &err));
    TRY("matmul", desc, g_gpu->ops->upload(g_gpu, &wg, 0, w, (size_t)(m * k), &err));
  }
  TRY("matmul", desc, fetch(&wg, &wq, &err));
  TRY("matmul", desc, ra_tensor_new(g_cpu, &wc, RA_DTYPE_F32, 2, wshape, &err));
  TRY("matmul", desc, g_cpu->ops->upload(g_cpu, &wc, 0, wq, (size_t)(m * k), &err));
  TRY("matmul", desc, pair_new(&px, RA_DTYPE_F32, 2, xshape, x, &err));
  TRY("matmul", desc, pair_new(&py, RA_DTYPE_F32, 2, yshape, y0, &err));
  if (mc->bias) TRY("matmul", desc, pair_new(&pb, RA_DTYPE_F32, 1, bshape, b, &err));
  TRY("matmul", desc, g_cpu->ops->matmul(g_cpu, &px.c, &wc, mc->bias ? &pb.c : NULL, &py.c, mc->acc, &err));
  TRY("matmul", desc, g_gpu->ops->matmul(g_gpu, &px.g, &wg, mc->bias ? &pb.g : NULL, &py.g, mc->acc, &err));
  TRY("matmul", desc, fetch_pair(&py, &c, &g, &err));
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) {
      double s = (mc->bias ? fabs(b[j]) : 0.0) + (mc->acc ? fabs(y0[i * m + j]) : 0.0);
      for (int64_t t = 0; t < k; t++) s += fabs((double)x[i * k + t] * wq[j * k + t]);
      double e = fabs((double)c[i * m + j] - g[i * m + j]) / (s > 0 ? s : 1.0);
      if (e != e || e > worst) worst = e != e ? INFINITY : e;
    }
  /* which CUDA path ran decides the bound (see the top of the file) */
  int gemv = n <= RA_CUDA_GEMV_MAX_X && mc->wkind != W_F32 && k % 8 == 0;
  int mma = !gemv && n <= RA_CUDA_MMA_MAX_X && mc->wkind != W_F32 && k % 8 == 0;
  double tol = (gemv || mc->wkind == W_F32) ? 1e-4 : mc->wkind == W_F16 ? 0x1p-10 : 0x1p-8;
  report("matmul", "rel_dot", worst, tol, "%s%s", desc, gemv ? " [gemv]" : mma ? " [mma]" : " [cublas]");
done:
  ra_tensor_free(&wc);
  ra_tensor_free(&wg);
  pair_free(&px);
  pair_free(&pb);
  pair_free(&py);
  free(x);
  free(w);
  free(b);
  free(y0);
  free(wq);
  free(c);
  free(g);
}

static void test_matmul(void) {
  const mm_case cases[] = {
      {1, 64, 7, 0, 0, W_LOADED},       {1, 576, 1536, 1, 0, W_LOADED},   {1, 4096, 1024, 0, 1, W_LOADED},
      {1, 14336, 64, 0, 0, W_LOADED},   {1, 100, 33, 0, 0, W_LOADED},     {3, 100, 33, 1, 1, W_LOADED},
      {17, 576, 193, 0, 0, W_LOADED},   {64, 1024, 512, 1, 1, W_LOADED},  {1, 256, 300, 1, 1, W_F16},
      {9, 256, 300, 1, 0, W_F16},       {1, 128, 50, 0, 0, W_F32},        {5, 128, 50, 1, 1, W_F32},
      /* GEMV paths: x beyond shared memory (k > 16384), two rows per warp (m >= 8192, odd m) */
      {1, 20480, 40, 0, 1, W_LOADED},   {1, 512, 9001, 1, 1, W_LOADED},   {1, 1536, 16392, 0, 0, W_F16},
      /* GEMV of 2-3 rows of x (odd m: a short last unit), then cuBLAS past them */
      {2, 4096, 1024, 1, 1, W_LOADED},  {3, 576, 1536, 0, 0, W_LOADED},   {4, 14336, 64, 1, 0, W_LOADED},
      {4, 512, 9001, 1, 1, W_LOADED},   {3, 1536, 301, 0, 1, W_F16},      {2, 20480, 40, 0, 0, W_LOADED},
      {2, 576, 193, 1, 1, W_LOADED},
      /* the tensor-core kernel of 4-16 rows: one and two n8 tiles of x, 16- and 32-row weight
       * tiles (odd m: a short last tile), k not a multiple of 32, then cuBLAS past 16 */
      {5, 4096, 1024, 1, 1, W_LOADED},  {8, 584, 301, 1, 1, W_LOADED},   {9, 1536, 16392, 0, 0, W_F16},
      {16, 14336, 520, 1, 0, W_LOADED}, {12, 576, 193, 0, 1, W_F16},     {16, 512, 9001, 1, 1, W_LOADED},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_matmul_case(&cases[i]);
}

/* ---------- element-wise ---------- */

static void test_rmsnorm(void) {
  ra_error err;
  const int64_t shapes[][2] = {{1, 64}, {5, 576}, {3, 4097}, {2, 4096}};
  for (int i = 0; i < 4; i++)
    for (int variant = 0; variant < 3; variant++) { /* 0: F32 w, 1: BF16 w on CUDA, 2: in place */
      int64_t n = shapes[i][0], d = shapes[i][1];
      float *x = rand_vec((size_t)(n * d), 2.0f), *w = rand_vec((size_t)d, 1.0f), *c = NULL, *g = NULL;
      pair px, py;
      memset(&px, 0, sizeof px);
      memset(&py, 0, sizeof py);
      ra_tensor wc, wg;
      memset(&wc, 0, sizeof wc);
      memset(&wg, 0, sizeof wg);
      int64_t xs[2] = {n, d}, ws[1] = {d};
      char desc[96];
      snprintf(desc, sizeof desc, "[%lld, %lld]%s", (long long)n, (long long)d,
               variant == 1 ? " w BF16 on CUDA" : variant == 2 ? " in place" : "");
      if (variant == 1)
        for (int64_t j = 0; j < d; j++) w[j] = bf16_round(w[j]);
      TRY("rmsnorm", desc, ra_tensor_new(g_cpu, &wc, RA_DTYPE_F32, 1, ws, &err));
      TRY("rmsnorm", desc, ra_tensor_new(g_gpu, &wg, variant == 1 ? RA_DTYPE_BF16 : RA_DTYPE_F32, 1, ws, &err));
      TRY("rmsnorm", desc, g_cpu->ops->upload(g_cpu, &wc, 0, w, (size_t)d, &err));
      TRY("rmsnorm", desc, g_gpu->ops->upload(g_gpu, &wg, 0, w, (size_t)d, &err));
      TRY("rmsnorm", desc, pair_new(&px, RA_DTYPE_F32, 2, xs, x, &err));
      if (variant != 2) TRY("rmsnorm", desc, pair_new(&py, RA_DTYPE_F32, 2, xs, NULL, &err));
      pair *out = variant == 2 ? &px : &py;
      TRY("rmsnorm", desc, g_cpu->ops->rmsnorm(g_cpu, &px.c, &wc, 1e-5f, &out->c, &err));
      TRY("rmsnorm", desc, g_gpu->ops->rmsnorm(g_gpu, &px.g, &wg, 1e-5f, &out->g, &err));
      TRY("rmsnorm", desc, fetch_pair(out, &c, &g, &err));
      report("rmsnorm", "rel", max_rel(c, g, (size_t)(n * d)), 1e-6, "%s", desc);
    done:
      pair_free(&px);
      pair_free(&py);
      ra_tensor_free(&wc);
      ra_tensor_free(&wg);
      free(x);
      free(w);
      free(c);
      free(g);
    }
}

static void test_rope(void) {
  ra_error err;
  const struct {
    int64_t n, heads, hd;
    int n_rot;
    ra_rope_style style;
    int64_t pos0;
  } cases[] = {{7, 5, 64, 64, RA_ROPE_NORM, 0},     {7, 5, 64, 64, RA_ROPE_NEOX, 131000},
               {3, 2, 128, 64, RA_ROPE_NEOX, 17},   {4, 3, 80, 80, RA_ROPE_NORM, 32000},
               {2, 32, 128, 128, RA_ROPE_NEOX, 8191}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t shape[3] = {cases[i].n, cases[i].heads, cases[i].hd};
    size_t ne = (size_t)(shape[0] * shape[1] * shape[2]);
    float *x = rand_vec(ne, 1.0f), *c = NULL, *g = NULL;
    pair p;
    memset(&p, 0, sizeof p);
    char desc[96];
    snprintf(desc, sizeof desc, "[%lld, %lld, %lld] n_rot %d %s pos0 %lld", (long long)shape[0], (long long)shape[1],
             (long long)shape[2], cases[i].n_rot, cases[i].style == RA_ROPE_NEOX ? "NEOX" : "NORM",
             (long long)cases[i].pos0);
    TRY("rope", desc, pair_new(&p, RA_DTYPE_F32, 3, shape, x, &err));
    TRY("rope", desc, g_cpu->ops->rope(g_cpu, &p.c, cases[i].pos0, cases[i].n_rot, 500000.0f, cases[i].style, &err));
    TRY("rope", desc, g_gpu->ops->rope(g_gpu, &p.g, cases[i].pos0, cases[i].n_rot, 500000.0f, cases[i].style, &err));
    TRY("rope", desc, fetch_pair(&p, &c, &g, &err));
    report("rope", "abs", max_abs(c, g, ne), 1e-5, "%s", desc);
  done:
    pair_free(&p);
    free(x);
    free(c);
    free(g);
  }
}

static void test_swiglu(void) {
  ra_error err;
  for (int alias = 0; alias < 2; alias++) {
    int64_t shape[2] = {7, 1433};
    size_t n = 7 * 1433;
    float *gt = rand_vec(n, 8.0f), *up = rand_vec(n, 2.0f), *c = NULL, *g = NULL;
    pair pg, pu, po;
    memset(&pg, 0, sizeof pg);
    memset(&pu, 0, sizeof pu);
    memset(&po, 0, sizeof po);
    const char *desc = alias ? "[7, 1433] out aliases gate" : "[7, 1433]";
    TRY("swiglu", desc, pair_new(&pg, RA_DTYPE_F32, 2, shape, gt, &err));
    TRY("swiglu", desc, pair_new(&pu, RA_DTYPE_F32, 2, shape, up, &err));
    if (!alias) TRY("swiglu", desc, pair_new(&po, RA_DTYPE_F32, 2, shape, NULL, &err));
    pair *out = alias ? &pg : &po;
    TRY("swiglu", desc, g_cpu->ops->swiglu(g_cpu, &pg.c, &pu.c, &out->c, &err));
    TRY("swiglu", desc, g_gpu->ops->swiglu(g_gpu, &pg.g, &pu.g, &out->g, &err));
    TRY("swiglu", desc, fetch_pair(out, &c, &g, &err));
    report("swiglu", "rel", max_rel(c, g, n), 1e-6, "%s", desc);
  done:
    pair_free(&pg);
    pair_free(&pu);
    pair_free(&po);
    free(gt);
    free(up);
    free(c);
    free(g);
  }
}

/* ---------- attention ---------- */

/* K/V caches [n_ctx, hkv, hd] of dtype dt with the same random contents on both backends. */
static int make_caches(pair *k, pair *v, ra_dtype dt, int64_t n_ctx, int64_t hkv, int64_t hd, ra_error *err) {
  int64_t shape[3] = {n_ctx, hkv, hd};
  size_t n = (size_t)(n_ctx * hkv * hd);
  float *h = rand_vec(n, 1.0f);
  int rc = pair_new(k, dt, 3, shape, h, err);
  free(h);
  if (rc) return rc;
  h = rand_vec(n, 1.0f);
  rc = pair_new(v, dt, 3, shape, h, err);
  free(h);
  return rc;
}

/* ---------- fused ops (CUDA's fusions against the CPU's sequence of basic ops) ---------- */

/* A weight [m, k] on the GPU (load_weight: BF16, or F16) and the same rounded values in F32 on
 * the CPU. */
static int weight_pair(int f16, int64_t m, int64_t k, float scale, ra_tensor *wc, ra_tensor *wg, ra_error *err) {
  float *w = rand_vec((size_t)(m * k), scale), *wq = NULL;
  int64_t shape[2] = {m, k};
  int rc;
  memset(wc, 0, sizeof *wc);
  memset(wg, 0, sizeof *wg);
  if (f16) {
    rc = ra_tensor_new(g_gpu, wg, RA_DTYPE_F16, 2, shape, err);
    if (rc == RA_OK) rc = g_gpu->ops->upload(g_gpu, wg, 0, w, (size_t)(m * k), err);
  } else {
    rc = g_gpu->ops->load_weight(g_gpu, w, RA_GGML_F32, m, k, wg, err);
  }
  if (rc == RA_OK) rc = fetch(wg, &wq, err);
  if (rc == RA_OK) rc = ra_tensor_new(g_cpu, wc, RA_DTYPE_F32, 2, shape, err);
  if (rc == RA_OK) rc = g_cpu->ops->upload(g_cpu, wc, 0, wq, (size_t)(m * k), err);
  free(w);
  free(wq);
  return rc;
}

/* The path a fused norm + matmul op of n rows takes on CUDA. */
static const char *gemm_path(int64_t n) {
  return n == 1 ? " [fused]" : n <= RA_CUDA_GEMV_MAX_X ? " [sequence]" : n <= RA_CUDA_MMA_MAX_X ? " [mma]" : " [gemm]";
}

static void test_norm_matmul(void) {
  ra_error err;
  const struct {
    int64_t n, k, m[3];
    int n_out, bias, f16;
  } cases[] = {
      {1, 4096, {4096, 1024, 1024}, 3, 0, 0}, {1, 576, {576, 192, 192}, 3, 1, 0}, {1, 256, {40, 0, 0}, 1, 1, 1},
      {1, 20480, {16, 8, 0}, 2, 0, 0} /* x beyond shared memory: the sequence */,
      {3, 256, {64, 32, 32}, 3, 1, 0} /* GEMV rows: the sequence */,
      {16, 4096, {4096, 1024, 1024}, 3, 0, 0} /* serve's 16 sequences: norm into the mma kernel's input */,
      {5, 584, {576, 197, 192}, 3, 1, 1} /* the mma kernel: segments off its tiles, F16, biases */,
      {37, 576, {576, 192, 192}, 3, 1, 1} /* prefill rows, F16, biases */,
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t n = cases[i].n, k = cases[i].k;
    int no = cases[i].n_out;
    char desc[112];
    snprintf(desc, sizeof desc, "n=%lld k=%lld m=%lld,%lld,%lld %s%s", (long long)n, (long long)k,
             (long long)cases[i].m[0], (long long)cases[i].m[1], (long long)cases[i].m[2], cases[i].f16 ? "F16" : "BF16",
             cases[i].bias ? " +bias" : "");
    float *x = rand_vec((size_t)(n * k), 1.0f), *nw = rand_vec((size_t)k, 1.0f), *c = NULL, *g = NULL;
    ra_tensor wc[3], wg[3];
    pair px, pn, pxn, pb[3], py[3];
    memset(wc, 0, sizeof wc);
    memset(wg, 0, sizeof wg);
    memset(&px, 0, sizeof px);
    memset(&pn, 0, sizeof pn);
    memset(&pxn, 0, sizeof pxn);
    memset(pb, 0, sizeof pb);
    memset(py, 0, sizeof py);
    int64_t xs[2] = {n, k}, ns[1] = {k};
    TRY("norm_matmul", desc, pair_new(&px, RA_DTYPE_F32, 2, xs, x, &err));
    TRY("norm_matmul", desc, pair_new(&pn, RA_DTYPE_F32, 1, ns, nw, &err));
    TRY("norm_matmul", desc, pair_new(&pxn, RA_DTYPE_F32, 2, xs, NULL, &err));
    const ra_tensor *wcs[3], *wgs[3], *bcs[3] = {NULL, NULL, NULL}, *bgs[3] = {NULL, NULL, NULL};
    ra_tensor *ycs[3], *ygs[3];
    for (int o = 0; o < no; o++) {
      int64_t m = cases[i].m[o], ys[2] = {n, m}, bs[1] = {m};
      TRY("norm_matmul", desc, weight_pair(cases[i].f16, m, k, 0.05f, &wc[o], &wg[o], &err));
      TRY("norm_matmul", desc, pair_new(&py[o], RA_DTYPE_F32, 2, ys, NULL, &err));
      wcs[o] = &wc[o];
      wgs[o] = &wg[o];
      ycs[o] = &py[o].c;
      ygs[o] = &py[o].g;
      if (cases[i].bias) {
        float *b = rand_vec((size_t)m, 1.0f);
        int rc = pair_new(&pb[o], RA_DTYPE_F32, 1, bs, b, &err);
        free(b);
        TRY("norm_matmul", desc, rc);
        bcs[o] = &pb[o].c;
        bgs[o] = &pb[o].g;
      }
    }
    TRY("norm_matmul", desc, g_cpu->ops->norm_matmul(g_cpu, &px.c, &pn.c, 1e-5f, &pxn.c, no, wcs, bcs, ycs, &err));
    TRY("norm_matmul", desc, g_gpu->ops->norm_matmul(g_gpu, &px.g, &pn.g, 1e-5f, &pxn.g, no, wgs, bgs, ygs, &err));
    for (int o = 0; o < no; o++) {
      TRY("norm_matmul", desc, fetch_pair(&py[o], &c, &g, &err));
      /* one row: the fused GEMV (fp32 x); 2-3: the sequence's GEMVs; more: the norm written in the
       * weights' type into the mma kernel (up to 16 rows) or cuBLAS (x rounded to BF16/FP16) */
      report("norm_matmul", "rel", max_rel(c, g, (size_t)(n * cases[i].m[o])), n == 1 ? 1e-4 : 0x1p-8, "y%d %s%s", o,
             desc, gemm_path(n));
      free(c);
      free(g);
      c = g = NULL;
    }
  done:
    for (int o = 0; o < 3; o++) {
      ra_tensor_free(&wc[o]);
      ra_tensor_free(&wg[o]);
      pair_free(&pb[o]);
      pair_free(&py[o]);
    }
    pair_free(&px);
    pair_free(&pn);
    pair_free(&pxn);
    free(x);
    free(nw);
    free(c);
    free(g);
  }
}

static void test_norm_swiglu(void) {
  ra_error err;
  const struct {
    int64_t n, k, ffn;
    int f16;
  } cases[] = {{1, 4096, 14336, 0}, {1, 576, 1536, 1}, {2, 576, 1536, 0} /* GEMV rows: the sequence */,
               {16, 4096, 14336, 0} /* norm into the mma kernel's input */,
               {6, 576, 1537, 1} /* the mma kernel, a short last tile */, {37, 576, 1536, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t n = cases[i].n, k = cases[i].k, f = cases[i].ffn;
    char desc[112];
    snprintf(desc, sizeof desc, "n=%lld k=%lld ffn=%lld %s", (long long)n, (long long)k, (long long)f,
             cases[i].f16 ? "F16" : "BF16");
    float *x = rand_vec((size_t)(n * k), 1.0f), *nw = rand_vec((size_t)k, 1.0f), *c = NULL, *g = NULL;
    ra_tensor gc, gg, uc, ug;
    pair px, pn, pxn, pu, po;
    memset(&gc, 0, sizeof gc);
    memset(&gg, 0, sizeof gg);
    memset(&uc, 0, sizeof uc);
    memset(&ug, 0, sizeof ug);
    memset(&px, 0, sizeof px);
    memset(&pn, 0, sizeof pn);
    memset(&pxn, 0, sizeof pxn);
    memset(&pu, 0, sizeof pu);
    memset(&po, 0, sizeof po);
    int64_t xs[2] = {n, k}, ns[1] = {k}, os[2] = {n, f};
    TRY("norm_swiglu", desc, pair_new(&px, RA_DTYPE_F32, 2, xs, x, &err));
    TRY("norm_swiglu", desc, pair_new(&pn, RA_DTYPE_F32, 1, ns, nw, &err));
    TRY("norm_swiglu", desc, pair_new(&pxn, RA_DTYPE_F32, 2, xs, NULL, &err));
    TRY("norm_swiglu", desc, pair_new(&pu, RA_DTYPE_F32, 2, os, NULL, &err));
    TRY("norm_swiglu", desc, pair_new(&po, RA_DTYPE_F32, 2, os, NULL, &err));
    TRY("norm_swiglu", desc, weight_pair(cases[i].f16, f, k, 0.05f, &gc, &gg, &err));
    TRY("norm_swiglu", desc, weight_pair(cases[i].f16, f, k, 0.05f, &uc, &ug, &err));
    TRY("norm_swiglu", desc, g_cpu->ops->norm_swiglu(g_cpu, &px.c, &pn.c, 1e-5f, &pxn.c, &gc, &uc, &pu.c, &po.c, &err));
    TRY("norm_swiglu", desc, g_gpu->ops->norm_swiglu(g_gpu, &px.g, &pn.g, 1e-5f, &pxn.g, &gg, &ug, &pu.g, &po.g, &err));
    TRY("norm_swiglu", desc, fetch_pair(&po, &c, &g, &err));
    report("norm_swiglu", "rel", max_rel(c, g, (size_t)(n * f)), n == 1 ? 1e-4 : 0x1p-8, "%s%s", desc, gemm_path(n));
  done:
    ra_tensor_free(&gc);
    ra_tensor_free(&gg);
    ra_tensor_free(&uc);
    ra_tensor_free(&ug);
    pair_free(&px);
    pair_free(&pn);
    pair_free(&pxn);
    pair_free(&pu);
    pair_free(&po);
    free(x);
    free(nw);
    free(c);
    free(g);
  }
}

static void test_rope_store(void) {
  ra_error err;
  const struct {
    int64_t n, hq, hkv, hd, row;
    int n_rot;
    ra_rope_style style;
    ra_dtype dt;
  } cases[] = {{1, 32, 8, 128, 8191, 128, RA_ROPE_NORM, RA_DTYPE_BF16}, {1, 9, 3, 64, 700, 64, RA_ROPE_NEOX, RA_DTYPE_F16},
               {5, 6, 2, 128, 40, 64, RA_ROPE_NEOX, RA_DTYPE_F32},    {3, 4, 4, 80, 0, 80, RA_ROPE_NORM, RA_DTYPE_BF16}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t n = cases[i].n, hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd, row = cases[i].row;
    int64_t n_ctx = row + n + 3, pos0 = row + 100000;
    char desc[112];
    snprintf(desc, sizeof desc, "n=%lld heads %lld/%lld hd %lld n_rot %d %s row %lld %s", (long long)n, (long long)hq,
             (long long)hkv, (long long)hd, cases[i].n_rot, cases[i].style == RA_ROPE_NEOX ? "NEOX" : "NORM",
             (long long)row, dt_name(cases[i].dt));
    size_t nq = (size_t)(n * hq * hd), nk = (size_t)(n * hkv * hd), nc = (size_t)(n_ctx * hkv * hd);
    float *q = rand_vec(nq, 1.0f), *k = rand_vec(nk, 1.0f), *v = rand_vec(nk, 1.0f), *c = NULL, *g = NULL;
    pair pq, pk, pv, kc, vc;
    memset(&pq, 0, sizeof pq);
    memset(&pk, 0, sizeof pk);
    memset(&pv, 0, sizeof pv);
    memset(&kc, 0, sizeof kc);
    memset(&vc, 0, sizeof vc);
    int64_t qs[3] = {n, hq, hd}, ks[3] = {n, hkv, hd};
    TRY("rope_store", desc, pair_new(&pq, RA_DTYPE_F32, 3, qs, q, &err));
    TRY("rope_store", desc, pair_new(&pk, RA_DTYPE_F32, 3, ks, k, &err));
    TRY("rope_store", desc, pair_new(&pv, RA_DTYPE_F32, 3, ks, v, &err));
    TRY("rope_store", desc, make_caches(&kc, &vc, cases[i].dt, n_ctx, hkv, hd, &err));
    TRY("rope_store", desc, g_cpu->ops->rope_store(g_cpu, &pq.c, &pk.c, &pv.c, pos0, cases[i].n_rot, 500000.0f,
                                                   cases[i].style, &kc.c, &vc.c, row, &err));
    TRY("rope_store", desc, g_gpu->ops->rope_store(g_gpu, &pq.g, &pk.g, &pv.g, pos0, cases[i].n_rot, 500000.0f,
                                                   cases[i].style, &kc.g, &vc.g, row, &err));
    /* rope is bit-exact (test_rope); a 16-bit cache may still round a 1-ulp fp32 difference */
    double tol16 = cases[i].dt == RA_DTYPE_F32 ? 1e-5 : 1e-2;
    TRY("rope_store", desc, fetch_pair(&pq, &c, &g, &err));
    report("rope_store", "abs", max_abs(c, g, nq), 1e-5, "q %s", desc);
    free(c);
    free(g);
    c = g = NULL;
    TRY("rope_store", desc, fetch_pair(&kc, &c, &g, &err));
    report("rope_store", "abs", max_abs(c, g, nc), tol16, "k cache %s", desc);
    free(c);
    free(g);
    c = g = NULL;
    TRY("rope_store", desc, fetch_pair(&vc, &c, &g, &err));
    report("rope_store", "abs", max_abs(c, g, nc), tol16, "v cache %s", desc);
  done:
    pair_free(&pq);
    pair_free(&pk);
    pair_free(&pv);
    pair_free(&kc);
    pair_free(&vc);
    free(q);
    free(k);
    free(v);
    free(c);
    free(g);
  }
}

/* A batch's decoders: one-token items (and one of 3 tokens) at their own positions into their own
 * caches; 35 items take two launches of at most 32. */
static void test_rope_store_batch(void) {
  ra_error err;
  const struct {
    int n_items;
    int64_t hq, hkv, hd;
    int n_rot;
    ra_rope_style style;
    ra_dtype dt;
  } cases[] = {{16, 32, 8, 128, 128, RA_ROPE_NORM, RA_DTYPE_BF16}, {35, 9, 3, 64, 64, RA_ROPE_NEOX, RA_DTYPE_F16},
               {5, 6, 2, 128, 64, RA_ROPE_NEOX, RA_DTYPE_F32}};
  enum { MAX_ITEMS = 35 };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int n_items = cases[i].n_items;
    const int64_t hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd, n_ctx = 64, T = n_items + 2;
    char desc[112];
    snprintf(desc, sizeof desc, "%d items heads %lld/%lld hd %lld n_rot %d %s %s", n_items, (long long)hq,
             (long long)hkv, (long long)hd, cases[i].n_rot, cases[i].style == RA_ROPE_NEOX ? "NEOX" : "NORM",
             dt_name(cases[i].dt));
    size_t nq = (size_t)(T * hq * hd), nk = (size_t)(T * hkv * hd), nc = (size_t)(n_ctx * hkv * hd);
    float *q = rand_vec(nq, 1.0f), *k = rand_vec(nk, 1.0f), *v = rand_vec(nk, 1.0f), *c = NULL, *g = NULL;
    pair pq, pk, pv, kc[MAX_ITEMS], vc[MAX_ITEMS];
    memset(&pq, 0, sizeof pq);
    memset(&pk, 0, sizeof pk);
    memset(&pv, 0, sizeof pv);
    memset(kc, 0, sizeof kc);
    memset(vc, 0, sizeof vc);
    ra_rope_store_item ic[MAX_ITEMS], ig[MAX_ITEMS];
    int64_t qs[3] = {T, hq, hd}, ks[3] = {T, hkv, hd};
    TRY("rope_batch", desc, pair_new(&pq, RA_DTYPE_F32, 3, qs, q, &err));
    TRY("rope_batch", desc, pair_new(&pk, RA_DTYPE_F32, 3, ks, k, &err));
    TRY("rope_batch", desc, pair_new(&pv, RA_DTYPE_F32, 3, ks, v, &err));
    for (int j = 0, r0 = 0; j < n_items; j++) {
      const int64_t n = j == 1 ? 3 : 1, row = (j * 7) % (n_ctx - 3);
      TRY("rope_batch", desc, make_caches(&kc[j], &vc[j], cases[i].dt, n_ctx, hkv, hd, &err));
      ic[j] = (ra_rope_store_item){r0, n, 1000 + 977 * (int64_t)j, row, &kc[j].c, &vc[j].c};
      ig[j] = (ra_rope_store_item){r0, n, 1000 + 977 * (int64_t)j, row, &kc[j].g, &vc[j].g};
      r0 += (int)n;
    }
    TRY("rope_batch", desc, g_cpu->ops->rope_store_batch(g_cpu, &pq.c, &pk.c, &pv.c, ic, n_items, cases[i].n_rot,
                                                         500000.0f, cases[i].style, &err));
    TRY("rope_batch", desc, g_gpu->ops->rope_store_batch(g_gpu, &pq.g, &pk.g, &pv.g, ig, n_items, cases[i].n_rot,
                                                         500000.0f, cases[i].style, &err));
    /* as rope_store: rope is bit-exact, a 16-bit cache may round a 1-ulp fp32 difference */
    double tol16 = cases[i].dt == RA_DTYPE_F32 ? 1e-5 : 1e-2, worst_k = 0.0, worst_v = 0.0;
    TRY("rope_batch", desc, fetch_pair(&pq, &c, &g, &err));
    report("rope_batch", "abs", max_abs(c, g, nq), 1e-5, "q %s", desc);
    for (int j = 0; j < n_items; j++) {
      free(c);
      free(g);
      c = g = NULL;
      TRY("rope_batch", desc, fetch_pair(&kc[j], &c, &g, &err));
      double e = max_abs(c, g, nc);
      worst_k = e > worst_k ? e : worst_k;
      free(c);
      free(g);
      c = g = NULL;
      TRY("rope_batch", desc, fetch_pair(&vc[j], &c, &g, &err));
      e = max_abs(c, g, nc);
      worst_v = e > worst_v ? e : worst_v;
    }
    report("rope_batch", "abs", worst_k, tol16, "k caches %s", desc);
    report("rope_batch", "abs", worst_v, tol16, "v caches %s", desc);
  done:
    pair_free(&pq);
    pair_free(&pk);
    pair_free(&pv);
    for (int j = 0; j < MAX_ITEMS; j++) {
      pair_free(&kc[j]);
      pair_free(&vc[j]);
    }
    free(q);
    free(k);
    free(v);
    free(c);
    free(g);
  }
}

static void test_attn_prefill(void) {
  ra_error err;
  /* Tensor cores for head dims 64 and 128: GQA ratios 1, 2, 3, 4, 8, 16, 32 (a block holds
   * 128 / G query positions), lengths off the key tiles (64 keys for mma.sync, 128 for wgmma)
   * and off the block's positions, key counts just past a tile, chunk offsets (pos0 > 0: the
   * worker's chunked prefill), F16/BF16 caches (operands of that type) and F32 (staged as F16).
   * Other head dims: the CUDA-core kernel. On sm_90 the BF16/F16 cases take the wgmma kernel;
   * they run a second time with the mma.sync kernel forced. */
  const struct {
    int64_t n, pos0, hq, hkv, hd;
    ra_dtype dt;
  } cases[] = {
      {1, 0, 4, 4, 64, RA_DTYPE_F32},       {37, 0, 12, 4, 64, RA_DTYPE_BF16},   {200, 100, 8, 2, 128, RA_DTYPE_F16},
      {64, 0, 6, 2, 80, RA_DTYPE_BF16},     {33, 7, 4, 2, 16, RA_DTYPE_F32},     {130, 16000, 3, 3, 64, RA_DTYPE_F16},
      {256, 3840, 8, 2, 128, RA_DTYPE_BF16}, {64, 32704, 4, 1, 128, RA_DTYPE_BF16},
      {300, 0, 8, 1, 128, RA_DTYPE_BF16},   {300, 0, 8, 1, 64, RA_DTYPE_F16},    {129, 0, 4, 4, 128, RA_DTYPE_BF16},
      {77, 1000, 12, 4, 128, RA_DTYPE_F16},  {1000, 0, 9, 3, 64, RA_DTYPE_BF16},  {43, 5, 9, 3, 64, RA_DTYPE_F16},
      {65, 63, 16, 2, 64, RA_DTYPE_BF16},   {2, 4094, 32, 8, 128, RA_DTYPE_BF16}, {255, 2049, 32, 8, 128, RA_DTYPE_F16},
      {513, 20000, 8, 2, 128, RA_DTYPE_BF16}, {190, 70, 6, 2, 128, RA_DTYPE_F32}, {100, 3000, 9, 3, 64, RA_DTYPE_F32},
      {200, 0, 4, 4, 128, RA_DTYPE_BF16},    {129, 127, 2, 2, 64, RA_DTYPE_F16},  {256, 0, 2, 2, 128, RA_DTYPE_F16},
      {100, 129, 8, 4, 128, RA_DTYPE_F16},   {65, 0, 4, 2, 64, RA_DTYPE_BF16},    {33, 95, 32, 8, 128, RA_DTYPE_BF16},
      {31, 98, 32, 8, 128, RA_DTYPE_F16},    {300, 1000, 8, 2, 64, RA_DTYPE_F16}, {17, 240, 16, 2, 128, RA_DTYPE_BF16},
      {50, 5, 8, 1, 64, RA_DTYPE_BF16},      {1, 128, 16, 1, 128, RA_DTYPE_F16},  {5, 300, 32, 1, 128, RA_DTYPE_BF16},
      {640, 1337, 32, 8, 128, RA_DTYPE_BF16}, {96, 161, 16, 1, 64, RA_DTYPE_F16},
  };
  const size_t n_cases = sizeof cases / sizeof cases[0];
  int wgmma_case[sizeof cases / sizeof cases[0]];
  memset(wgmma_case, 0, sizeof wgmma_case);
  for (size_t ci = 0; ci < 2 * n_cases; ci++) {
    const size_t i = ci % n_cases;
    const int pass_mma = ci >= n_cases; /* the second pass: the wgmma kernel's cases on mma.sync */
    if (ci == n_cases && ra_backend_cuda_set_prefill_kernel(g_gpu, RA_CUDA_PREFILL_MMA, &err) != RA_OK) {
      report_error("attn_prefill", "set_prefill_kernel", &err);
      break;
    }
    if (pass_mma && !wgmma_case[i]) continue;
    int64_t n = cases[i].n, pos0 = cases[i].pos0, hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd;
    const char *kernel = ra_backend_cuda_prefill_kernel(g_gpu, (int)hq, (int)hkv, (int)hd, cases[i].dt, pos0 + n);
    if (!pass_mma) wgmma_case[i] = strcmp(kernel, "wgmma") == 0;
    pair q, k, v, o;
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    memset(&o, 0, sizeof o);
    float *hq_ = rand_vec((size_t)(n * hq * hd), 4.0f), *c = NULL, *g = NULL;
    int64_t qs[3] = {n, hq, hd};
    int tc = hd == 64 || hd == 128;
    char desc[112];
    snprintf(desc, sizeof desc, "n=%lld pos0=%lld heads %lld/%lld hd %lld %s [%s]", (long long)n, (long long)pos0,
             (long long)hq, (long long)hkv, (long long)hd, dt_name(cases[i].dt), kernel);
    /* 5 extra rows of random data past pos0 + n must be ignored */
    TRY("attn_prefill", desc, make_caches(&k, &v, cases[i].dt, pos0 + n + 5, hkv, hd, &err));
    TRY("attn_prefill", desc, pair_new(&q, RA_DTYPE_F32, 3, qs, hq_, &err));
    TRY("attn_prefill", desc, pair_new(&o, RA_DTYPE_F32, 3, qs, NULL, &err));
    float scale = 1.0f / sqrtf((float)hd);
    TRY("attn_prefill", desc, g_cpu->ops->attn_prefill(g_cpu, &q.c, &k.c, &v.c, pos0, scale, &o.c, &err));
    TRY("attn_prefill", desc, g_gpu->ops->attn_prefill(g_gpu, &q.g, &k.g, &v.g, pos0, scale, &o.g, &err));
    TRY("attn_prefill", desc, fetch_pair(&o, &c, &g, &err));
    report("attn_prefill", "abs", max_abs(c, g, (size_t)(n * hq * hd)), tc ? 1e-2 : 1e-4, "%s", desc);
  done:
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
    pair_free(&o);
    free(hq_);
    free(c);
    free(g);
  }
  if (ra_backend_cuda_set_prefill_kernel(g_gpu, RA_CUDA_PREFILL_AUTO, &err) != RA_OK)
    report_error("attn_prefill", "set_prefill_kernel", &err);
}

/* Partials (o, ml) of both backends: o abs, m abs, l relative (l grows with the token count). */
static void report_partial(const char *op, const char *desc, const float *oc, const float *og, const float *mc,
                           const float *mg, int64_t hq, int64_t hd) {
  double em = 0.0, el = 0.0;
  for (int64_t h = 0; h < hq; h++) {
    float m1 = mc[2 * h], m2 = mg[2 * h], l1 = mc[2 * h + 1], l2 = mg[2 * h + 1];
    double dm = (isinf(m1) && m1 == m2) ? 0.0 : fabs((double)m1 - m2);
    double dl = fabs((double)l1 - l2) / (l1 > 0 ? l1 : 1.0);
    if (dm != dm || dm > em) em = dm != dm ? INFINITY : dm;
    if (dl != dl || dl > el) el = dl != dl ? INFINITY : dl;
  }
  report(op, "abs", max_abs(oc, og, (size_t)(hq * hd)), 1e-4, "o  %s", desc);
  report(op, "abs", em, 1e-4, "m  %s", desc);
  report(op, "rel", el, 1e-4, "l  %s", desc);
}

static void test_attn_decode(void) {
  ra_error err;
  enum { FULL, SINK_WINDOW, SCATTERED, EMPTY };
  const char *kinds[] = {"[0, T)", "[0,4) + [T-64, T)", "20 ranges (3 empty)", "no ranges"};
  const struct {
    int64_t T, hq, hkv, hd;
    ra_dtype dt;
    int kind;
  } cases[] = {
      {1, 8, 8, 64, RA_DTYPE_F32, FULL},          {100, 12, 4, 64, RA_DTYPE_F16, FULL},
      {4096, 32, 8, 128, RA_DTYPE_BF16, FULL},    {32768, 32, 8, 128, RA_DTYPE_BF16, FULL},
      {8192, 32, 8, 128, RA_DTYPE_BF16, SINK_WINDOW}, {5000, 6, 2, 80, RA_DTYPE_F32, SCATTERED},
      {300, 9, 3, 64, RA_DTYPE_BF16, EMPTY},      {1000, 4, 1, 16, RA_DTYPE_F16, FULL},
      /* the warp kernel with 8 q heads per kv head; ranges in device memory (> 16 of them) */
      {2000, 16, 2, 128, RA_DTYPE_F16, SINK_WINDOW}, {4000, 8, 1, 64, RA_DTYPE_BF16, SCATTERED},
      {70000, 24, 3, 64, RA_DTYPE_BF16, FULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t T = cases[i].T, hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd;
    pair q, k, v, o, ml;
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    memset(&o, 0, sizeof o);
    memset(&ml, 0, sizeof ml);
    float *hqv = rand_vec((size_t)(hq * hd), 4.0f), *oc = NULL, *og = NULL, *mc = NULL, *mg = NULL;
    ra_token_range r[20];
    int nr = 0;
    switch (cases[i].kind) {
      case FULL: r[nr++] = (ra_token_range){0, T}; break;
      case SINK_WINDOW:
        r[nr++] = (ra_token_range){0, 4};
        r[nr++] = (ra_token_range){T - 64, T};
        break;
      case SCATTERED:
        for (int j = 0; j < 20; j++) {
          int64_t b = j * (T / 20) + (j % 3) * 7, e = j % 7 == 3 ? b : b + 1 + (j * 37) % 200;
          r[nr++] = (ra_token_range){b, e};
        }
        break;
      default: break;
    }
    int64_t qs[2] = {hq, hd}, ms[2] = {hq, 2};
    char desc[112];
    snprintf(desc, sizeof desc, "T=%lld %s heads %lld/%lld hd %lld %s", (long long)T, kinds[cases[i].kind],
             (long long)hq, (long long)hkv, (long long)hd, dt_name(cases[i].dt));
    TRY("attn_decode", desc, make_caches(&k, &v, cases[i].dt, T + 3, hkv, hd, &err));
    TRY("attn_decode", desc, pair_new(&q, RA_DTYPE_F32, 2, qs, hqv, &err));
    TRY("attn_decode", desc, pair_new(&o, RA_DTYPE_F32, 2, qs, NULL, &err));
    TRY("attn_decode", desc, pair_new(&ml, RA_DTYPE_F32, 2, ms, NULL, &err));
    float scale = 1.0f / sqrtf((float)hd);
    TRY("attn_decode", desc, g_cpu->ops->attn_decode(g_cpu, &q.c, &k.c, &v.c, r, nr, scale, &o.c, &ml.c, &err));
    TRY("attn_decode", desc, g_gpu->ops->attn_decode(g_gpu, &q.g, &k.g, &v.g, r, nr, scale, &o.g, &ml.g, &err));
    TRY("attn_decode", desc, fetch_pair(&o, &oc, &og, &err));
    TRY("attn_decode", desc, fetch_pair(&ml, &mc, &mg, &err));
    report_partial("attn_decode", desc, oc, og, mc, mg, hq, hd);
  done:
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
    pair_free(&o);
    pair_free(&ml);
    free(hqv);
    free(oc);
    free(og);
    free(mc);
    free(mg);
  }
}

/* The batched decode against the CPU's: sequences of several lengths (one split, many, more
 * than one launch holds), the g4 and g8 warp kernels, and a geometry that falls back to one
 * decode per sequence. */
static void test_attn_decode_batch(void) {
  ra_error err;
  static const int64_t lens_a[] = {1, 31, 33, 100, 4097, 32768};
  static const int64_t lens_b[] = {2000, 5, 70000};
  static const int64_t lens_c[] = {900, 100, 1};
  static const int64_t lens_d[] = {50, 300};
  int64_t lens_e[40];
  for (int i = 0; i < 40; i++) lens_e[i] = 1 + 97 * i;
  const struct {
    int64_t hq, hkv, hd;
    ra_dtype dt;
    const int64_t *lens;
    int n;
  } cases[] = {
      {32, 8, 128, RA_DTYPE_BF16, lens_a, 6}, {16, 2, 128, RA_DTYPE_F16, lens_b, 3},
      {12, 4, 64, RA_DTYPE_BF16, lens_c, 3},  {6, 2, 80, RA_DTYPE_F32, lens_d, 2},
      {4, 1, 64, RA_DTYPE_F16, lens_e, 40},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t hq = cases[ci].hq, hkv = cases[ci].hkv, hd = cases[ci].hd;
    const int n = cases[ci].n;
    pair *q = calloc((size_t)n, sizeof *q), *k = calloc((size_t)n, sizeof *k), *v = calloc((size_t)n, sizeof *v),
         *o = calloc((size_t)n, sizeof *o), *ml = calloc((size_t)n, sizeof *ml);
    ra_attn_decode_item *ic = calloc((size_t)n, sizeof *ic), *ig = calloc((size_t)n, sizeof *ig);
    char desc[112];
    snprintf(desc, sizeof desc, "%d sequences up to T=%lld heads %lld/%lld hd %lld %s", n,
             (long long)cases[ci].lens[n - 1 > 5 ? 5 : n - 1], (long long)hq, (long long)hkv, (long long)hd,
             dt_name(cases[ci].dt));
    int64_t qs[2] = {hq, hd}, ms[2] = {hq, 2};
    for (int i = 0; i < n; i++) {
      float *hqv = rand_vec((size_t)(hq * hd), 4.0f);
      int64_t T = cases[ci].lens[i];
      int rc = make_caches(&k[i], &v[i], cases[ci].dt, T + 3, hkv, hd, &err);
      if (rc == RA_OK) rc = pair_new(&q[i], RA_DTYPE_F32, 2, qs, hqv, &err);
      if (rc == RA_OK) rc = pair_new(&o[i], RA_DTYPE_F32, 2, qs, NULL, &err);
      if (rc == RA_OK) rc = pair_new(&ml[i], RA_DTYPE_F32, 2, ms, NULL, &err);
      free(hqv);
      if (rc) {
        report_error("attn_decode_batch", desc, &err);
        goto done;
      }
      ic[i] = (ra_attn_decode_item){&q[i].c, &k[i].c, &v[i].c, T, &o[i].c, &ml[i].c};
      ig[i] = (ra_attn_decode_item){&q[i].g, &k[i].g, &v[i].g, T, &o[i].g, &ml[i].g};
    }
    float scale = 1.0f / sqrtf((float)hd);
    TRY("attn_decode_batch", desc, g_cpu->ops->attn_decode_batch(g_cpu, ic, n, scale, &err));
    TRY("attn_decode_batch", desc, g_gpu->ops->attn_decode_batch(g_gpu, ig, n, scale, &err));
    for (int i = 0; i < n; i++) {
      float *oc = NULL, *og = NULL, *mc = NULL, *mg = NULL;
      char d2[160];
      snprintf(d2, sizeof d2, "%s, sequence %d (T=%lld)", desc, i, (long long)cases[ci].lens[i]);
      if (fetch_pair(&o[i], &oc, &og, &err) == RA_OK && fetch_pair(&ml[i], &mc, &mg, &err) == RA_OK)
        report_partial("attn_decode_batch", d2, oc, og, mc, mg, hq, hd);
      else
        report_error("attn_decode_batch", d2, &err);
      free(oc), free(og), free(mc), free(mg);
    }
  done:
    for (int i = 0; i < n; i++) {
      pair_free(&q[i]), pair_free(&k[i]), pair_free(&v[i]), pair_free(&o[i]), pair_free(&ml[i]);
    }
    free(q), free(k), free(v), free(o), free(ml), free(ic), free(ig);
  }
}

static void test_attn_merge(void) {
  ra_error err;
  const int64_t heads = 12, hd = 64;
  float *oa = rand_vec((size_t)(heads * hd), 1.0f), *ob = rand_vec((size_t)(heads * hd), 1.0f);
  float mla[24], mlb[24];
  /* heads 0-2: acc empty; 3-5: incoming empty; 6: both empty; the rest: both non-empty */
  for (int h = 0; h < heads; h++) {
    mla[2 * h] = urand(5.0f);
    mla[2 * h + 1] = 1.0f + 20.0f * (urand(1.0f) + 1.0f);
    mlb[2 * h] = urand(5.0f);
    mlb[2 * h + 1] = 1.0f + 20.0f * (urand(1.0f) + 1.0f);
    if (h <= 2 || h == 6) {
      mla[2 * h] = -INFINITY;
      mla[2 * h + 1] = 0.0f;
      for (int d = 0; d < hd; d++) oa[h * hd + d] = 0.0f;
    }
    if ((h >= 3 && h <= 5) || h == 6) {
      mlb[2 * h] = -INFINITY;
      mlb[2 * h + 1] = 0.0f;
      for (int d = 0; d < hd; d++) ob[h * hd + d] = 0.0f;
    }
  }
  pair pa, pma, pb, pmb;
  memset(&pa, 0, sizeof pa);
  memset(&pma, 0, sizeof pma);
  memset(&pb, 0, sizeof pb);
  memset(&pmb, 0, sizeof pmb);
  float *c = NULL, *g = NULL, *mc = NULL, *mg = NULL;
  int64_t os[2] = {heads, hd}, ms[2] = {heads, 2};
  const char *desc = "12 heads x 64, empty partials on either side";
  TRY("attn_merge", desc, pair_new(&pa, RA_DTYPE_F32, 2, os, oa, &err));
  TRY("attn_merge", desc, pair_new(&pb, RA_DTYPE_F32, 2, os, ob, &err));
  TRY("attn_merge", desc, pair_new(&pma, RA_DTYPE_F32, 2, ms, mla, &err));
  TRY("attn_merge", desc, pair_new(&pmb, RA_DTYPE_F32, 2, ms, mlb, &err));
  TRY("attn_merge", desc, g_cpu->ops->attn_merge(g_cpu, &pa.c, &pma.c, &pb.c, &pmb.c, &err));
  TRY("attn_merge", desc, g_gpu->ops->attn_merge(g_gpu, &pa.g, &pma.g, &pb.g, &pmb.g, &err));
  TRY("attn_merge", desc, fetch_pair(&pa, &c, &g, &err));
  TRY("attn_merge", desc, fetch_pair(&pma, &mc, &mg, &err));
  report("attn_merge", "abs", max_abs(c, g, (size_t)(heads * hd)), 1e-6, "o  %s", desc);
  report("attn_merge", "rel", max_rel(mc, mg, (size_t)(heads * 2)), 1e-6, "ml %s", desc);
done:
  pair_free(&pa);
  pair_free(&pb);
  pair_free(&pma);
  pair_free(&pmb);
  free(oa);
  free(ob);
  free(c);
  free(g);
  free(mc);
  free(mg);
}

static void test_topk(void) {
  ra_error err;
  const struct {
    int64_t n, m;
    int k, levels; /* levels > 0: values from that many distinct levels (ties), with +-0 */
  } cases[] = {{1, 1, 1, 0},          {3, 100, 100, 0},   {7, 4097, 10, 0}, {2, 131072, 2048, 0},
               {5, 5000, 2048, 16},   {4, 1000, 37, 3},   {3, 70000, 1, 0}, {1, 3000, 1500, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t n = cases[i].n, m = cases[i].m;
    int k = cases[i].k;
    float *x = rand_vec((size_t)(n * m), 10.0f);
    if (cases[i].levels)
      for (int64_t j = 0; j < n * m; j++) {
        x[j] = floorf((x[j] + 10.0f) / 20.0f * (float)cases[i].levels) - (float)(cases[i].levels / 2);
        if (x[j] == 0.0f && (j & 1)) x[j] = -0.0f;
      }
    int32_t *ic = xmalloc((size_t)(n * k) * 4), *ig = xmalloc((size_t)(n * k) * 4);
    float *vc = xmalloc((size_t)(n * k) * 4), *vg = xmalloc((size_t)(n * k) * 4);
    pair p;
    memset(&p, 0, sizeof p);
    int64_t shape[2] = {n, m};
    char desc[96];
    snprintf(desc, sizeof desc, "[%lld, %lld] k=%d%s", (long long)n, (long long)m, k,
             cases[i].levels ? " (many ties, +-0)" : "");
    TRY("topk_rows", desc, pair_new(&p, RA_DTYPE_F32, 2, shape, x, &err));
    TRY("topk_rows", desc, g_cpu->ops->topk_rows(g_cpu, &p.c, k, ic, vc, &err));
    TRY("topk_rows", desc, g_gpu->ops->topk_rows(g_gpu, &p.g, k, ig, vg, &err));
    /* ties go to the lower index on both backends, so the lists are identical */
    size_t bad = 0;
    for (int64_t j = 0; j < n * k; j++) bad += ic[j] != ig[j] || vc[j] != vg[j];
    report("topk_rows", "elems", (double)bad, 0, "%s", desc);
  done:
    pair_free(&p);
    free(x);
    free(ic);
    free(ig);
    free(vc);
    free(vg);
  }
}

/* ---------- wave index ---------- */

/* Keys in well-separated clusters per (kv head, segment) (centre + 0.05 noise + a per-head
 * offset, the init rows floor(j * len / k) forced to cluster j), so that TF32 and FP32 scores
 * assign every row alike; values uniform. */
static void wave_keys(int64_t n_ctx, int64_t hkv, int64_t hd, int64_t row0, int64_t n, int64_t seg, int64_t cs,
                      float *keys, float *vals) {
  int64_t L = seg < n ? seg : n, KS = (L + cs - 1) / cs;
  float *centre = xmalloc(sizeof(float) * (size_t)(KS * hd)), *off = xmalloc(sizeof(float) * (size_t)hd);
  int32_t *label = xmalloc(sizeof(int32_t) * (size_t)L);
  for (int64_t i = 0; i < n_ctx * hkv * hd; i++) keys[i] = urand(1.0f), vals[i] = urand(1.0f);
  for (int64_t h = 0; h < hkv; h++) {
    for (int64_t d = 0; d < hd; d++) off[d] = urand(2.0f);
    for (int64_t t0 = 0; t0 < n; t0 += L) {
      int64_t len = n - t0 < L ? n - t0 : L, k = (len + cs - 1) / cs;
      for (int64_t i = 0; i < k * hd; i++) centre[i] = urand(1.0f);
      for (int64_t t = 0; t < len; t++) label[t] = (int32_t)(rnext() % (uint64_t)k);
      for (int64_t j = 0; j < k; j++) label[j * len / k] = (int32_t)j;
      for (int64_t t = 0; t < len; t++)
        for (int64_t d = 0; d < hd; d++)
          keys[((row0 + t0 + t) * hkv + h) * hd + d] = off[d] + centre[label[t] * hd + d] + urand(0.05f);
    }
  }
  free(centre), free(off), free(label);
}

static void test_wave_cluster(void) {
  ra_error err;
  const struct {
    int64_t n, row0, hkv, hd, seg, cs, c0;
    int iters;
    ra_dtype dt;
  } cases[] = {{20000, 100, 8, 128, 8192, 16, 5, 10, RA_DTYPE_BF16},
               {3000, 0, 2, 64, 1024, 16, 0, 8, RA_DTYPE_F16},
               {500, 7, 3, 80, 256, 8, 2, 5, RA_DTYPE_F32}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t n = cases[i].n, hkv = cases[i].hkv, hd = cases[i].hd, n_ctx = n + cases[i].row0 + 3;
    ra_wave_cluster_params p = {cases[i].seg, cases[i].cs, cases[i].iters};
    int64_t K = ra_wave_n_clusters(n, p.seg_len, p.cluster_size), cap = K + cases[i].c0 + 4;
    pair k, v, cen, sz, vs, ok, ov;
    memset(&k, 0, sizeof k), memset(&v, 0, sizeof v), memset(&cen, 0, sizeof cen), memset(&sz, 0, sizeof sz);
    memset(&vs, 0, sizeof vs), memset(&ok, 0, sizeof ok), memset(&ov, 0, sizeof ov);
    size_t nel = (size_t)(n_ctx * hkv * hd);
    float *hk = xmalloc(nel * 4), *hv = xmalloc(nel * 4), *a = NULL, *b = NULL;
    int32_t *pc = xmalloc((size_t)(hkv * n) * 4), *pg = xmalloc((size_t)(hkv * n) * 4);
    int32_t *cc = xmalloc((size_t)(hkv * K) * 4), *cg = xmalloc((size_t)(hkv * K) * 4);
    wave_keys(n_ctx, hkv, hd, cases[i].row0, n, p.seg_len, p.cluster_size, hk, hv);
    char desc[112];
    snprintf(desc, sizeof desc, "n=%lld kv %lld hd %lld seg %lld/%lld %s", (long long)n, (long long)hkv,
             (long long)hd, (long long)p.seg_len, (long long)p.cluster_size, dt_name(cases[i].dt));
    int64_t cs[3] = {n_ctx, hkv, hd}, cl[3] = {hkv, cap, hd}, os[3] = {hkv, n, hd};
    TRY("cluster_keys", desc, pair_new(&k, cases[i].dt, 3, cs, hk, &err));
    TRY("cluster_keys", desc, pair_new(&v, cases[i].dt, 3, cs, hv, &err));
    TRY("cluster_keys", desc, pair_new(&cen, RA_DTYPE_F32, 3, cl, NULL, &err));
    TRY("cluster_keys", desc, pair_new(&vs, RA_DTYPE_F32, 3, cl, NULL, &err));
    TRY("cluster_keys", desc, pair_new(&sz, RA_DTYPE_F32, 2, cl, NULL, &err));
    TRY("cluster_keys", desc, pair_new(&ok, RA_DTYPE_BF16, 3, os, NULL, &err));
    TRY("cluster_keys", desc, pair_new(&ov, RA_DTYPE_F32, 3, os, NULL, &err));
    TRY("cluster_keys", desc, g_cpu->ops->cluster_keys(g_cpu, &k.c, &v.c, cases[i].row0, n, &p, &cen.c, &sz.c, &vs.c,
                                                       cases[i].c0, &ok.c, &ov.c, pc, cc, &err));
    TRY("cluster_keys", desc, g_gpu->ops->cluster_keys(g_gpu, &k.g, &v.g, cases[i].row0, n, &p, &cen.g, &sz.g, &vs.g,
                                                       cases[i].c0, &ok.g, &ov.g, pg, cg, &err));
    size_t bad = 0;
    for (int64_t j = 0; j < hkv * n; j++) bad += pc[j] != pg[j];
    for (int64_t j = 0; j < hkv * K; j++) bad += cc[j] != cg[j];
    report("cluster_keys", "elems", (double)bad, 0, "perm+counts %s", desc);
    TRY("cluster_keys", desc, fetch_pair(&cen, &a, &b, &err));
    report("cluster_keys", "rel", max_rel(a, b, ra_tensor_nelem(&cen.c)), 1e-5, "centroid %s", desc);
    free(a), free(b), a = b = NULL;
    TRY("cluster_keys", desc, fetch_pair(&vs, &a, &b, &err));
    report("cluster_keys", "rel", max_rel(a, b, ra_tensor_nelem(&vs.c)), 1e-5, "vsum %s", desc);
    free(a), free(b), a = b = NULL;
    TRY("cluster_keys", desc, fetch_pair(&sz, &a, &b, &err));
    report("cluster_keys", "bits", bits_differ(a, b, ra_tensor_nelem(&sz.c)), 0, "size %s", desc);
    free(a), free(b), a = b = NULL;
    TRY("cluster_keys", desc, fetch_pair(&ok, &a, &b, &err));
    report("cluster_keys", "bits", bits_differ(a, b, ra_tensor_nelem(&ok.c)), 0, "out_k bf16 %s", desc);
    free(a), free(b), a = b = NULL;
    TRY("cluster_keys", desc, fetch_pair(&ov, &a, &b, &err));
    report("cluster_keys", "bits", bits_differ(a, b, ra_tensor_nelem(&ov.c)), 0, "out_v f32 %s", desc);
  done:
    pair_free(&k), pair_free(&v), pair_free(&cen), pair_free(&sz), pair_free(&vs), pair_free(&ok), pair_free(&ov);
    free(hk), free(hv), free(a), free(b), free(pc), free(pg), free(cc), free(cg);
  }
}

/* Per kv head, the group-summed softmax of scale q.c + log(size) (size 0: -inf), in double. */
static void wave_keys_ref(const float *q, const float *c, const float *s, int64_t hq, int64_t hkv, int64_t hd,
                          int64_t cap, int64_t nc, float scale, double *key) {
  int64_t group = hq / hkv;
  double *z = xmalloc(sizeof(double) * (size_t)nc);
  for (int64_t h = 0; h < hkv; h++) {
    for (int64_t j = 0; j < nc; j++) key[h * nc + j] = s[h * cap + j] > 0 ? 0.0 : -INFINITY;
    for (int64_t g = 0; g < group; g++) {
      double m = -INFINITY, l = 0;
      for (int64_t j = 0; j < nc; j++) {
        double dot = 0;
        for (int64_t d = 0; d < hd; d++) dot += (double)q[(h * group + g) * hd + d] * c[(h * cap + j) * hd + d];
        z[j] = s[h * cap + j] > 0 ? scale * dot + log(s[h * cap + j]) : -INFINITY;
        m = z[j] > m ? z[j] : m;
      }
      for (int64_t j = 0; j < nc; j++) l += exp(z[j] - m);
      for (int64_t j = 0; j < nc; j++)
        if (s[h * cap + j] > 0) key[h * nc + j] += exp(z[j] - m) / l;
    }
  }
  free(z);
}

static void test_wave_select_estimate(void) {
  ra_error err;
  const struct {
    int64_t hq, hkv, hd, cap, nc;
    int r, e, same_centroids;
  } cases[] = {{32, 8, 128, 8192, 8000, 100, 2000, 0}, {28, 4, 128, 1000, 1000, 40, 400, 1},
               {12, 4, 64, 300, 250, 200, 100, 0},   {8, 2, 80, 50, 0, 3, 4, 0},
               /* 1M tokens' clusters (many selection blocks), and no estimation zone */
               {32, 8, 128, 65536, 65000, 128, 2048, 0}, {16, 4, 128, 4096, 4000, 64, 0, 0},
               /* ties crowding the threshold bin past the candidate space: the whole-row ranking */
               {32, 8, 128, 8192, 8000, 40, 200, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd, cap = cases[i].cap, nc = cases[i].nc;
    int r = cases[i].r, e = cases[i].e;
    int64_t ld = r + e, k = ld < nc ? ld : nc;
    pair q, cen, sz, vs, o, ml, o2, ml2;
    memset(&q, 0, sizeof q), memset(&cen, 0, sizeof cen), memset(&sz, 0, sizeof sz), memset(&vs, 0, sizeof vs);
    memset(&o, 0, sizeof o), memset(&ml, 0, sizeof ml), memset(&o2, 0, sizeof o2), memset(&ml2, 0, sizeof ml2);
    float *hqv = rand_vec((size_t)(hq * hd), 3.0f), *hc = rand_vec((size_t)(hkv * cap * hd), 1.0f);
    float *hvs = rand_vec((size_t)(hkv * cap * hd), 8.0f), *hs = xmalloc(sizeof(float) * (size_t)(hkv * cap));
    for (int64_t j = 0; j < hkv * cap; j++) hs[j] = j % 11 == 5 ? 0.0f : (float)(1 + rnext() % 40);
    if (cases[i].same_centroids) /* every score equal: the ranking is by size, ties to the lower index */
      for (int64_t j = 1; j < hkv * cap; j++) memcpy(hc + j * hd, hc + (j / cap) * cap * hd, sizeof(float) * (size_t)hd);
    double *key = xmalloc(sizeof(double) * (size_t)(hkv * (nc ? nc : 1)));
    int32_t *ic = xmalloc(sizeof(int32_t) * (size_t)(hkv * ld)), *ig = xmalloc(sizeof(int32_t) * (size_t)(hkv * ld));
    float *oc = NULL, *og = NULL, *mc = NULL, *mg = NULL;
    char desc[112];
    snprintf(desc, sizeof desc, "heads %lld/%lld hd %lld nc %lld r %d e %d%s", (long long)hq, (long long)hkv,
             (long long)hd, (long long)nc, r, e, cases[i].same_centroids ? " ties" : "");
    int64_t qs[2] = {hq, hd}, cl[3] = {hkv, cap, hd}, ms[2] = {hq, 2};
    float scale = 1.0f / sqrtf((float)hd);
    TRY("wave_select", desc, pair_new(&q, RA_DTYPE_F32, 2, qs, hqv, &err));
    TRY("wave_select", desc, pair_new(&cen, RA_DTYPE_F32, 3, cl, hc, &err));
    TRY("wave_select", desc, pair_new(&vs, RA_DTYPE_F32, 3, cl, hvs, &err));
    TRY("wave_select", desc, pair_new(&sz, RA_DTYPE_F32, 2, cl, hs, &err));
    TRY("wave_select", desc, pair_new(&o, RA_DTYPE_F32, 2, qs, NULL, &err));
    TRY("wave_select", desc, pair_new(&ml, RA_DTYPE_F32, 2, ms, NULL, &err));
    TRY("wave_select", desc, pair_new(&o2, RA_DTYPE_F32, 2, qs, NULL, &err));
    TRY("wave_select", desc, pair_new(&ml2, RA_DTYPE_F32, 2, ms, NULL, &err));
    TRY("wave_select", desc, g_cpu->ops->wave_select(g_cpu, &q.c, &cen.c, &sz.c, nc, scale, r, e, ic, &vs.c, &o.c, &ml.c, &err));
    TRY("wave_select", desc, g_gpu->ops->wave_select(g_gpu, &q.g, &cen.g, &sz.g, nc, scale, r, e, ig, &vs.g, &o.g, &ml.g, &err));
    /* near ties (~1e-6 relative) may swap neighbours: compare the keys of the ranked ids */
    wave_keys_ref(hqv, hc, hs, hq, hkv, hd, cap, nc, scale, key);
    double kerr = 0.0, kmax = 0.0;
    size_t bad = 0;
    for (int64_t h = 0; h < hkv; h++)
      for (int64_t j = 0; j < ld; j++) {
        int32_t a = ic[h * ld + j], b = ig[h * ld + j];
        bad += a != b;
        if (j >= k) {
          if (a != -1 || b != -1) kerr = INFINITY;
          continue;
        }
        if (b < 0 || b >= nc) {
          kerr = INFINITY;
          continue;
        }
        double ka = key[h * nc + a], kb = key[h * nc + b];
        if (isinf(ka) || isinf(kb)) {
          if (ka != kb) kerr = INFINITY;
          continue;
        }
        kmax = ka > kmax ? ka : kmax;
        kerr = fabs(ka - kb) > kerr ? fabs(ka - kb) : kerr;
      }
    report("wave_select", "rel", kerr / (kmax > 0 ? kmax : 1.0), 1e-5, "key of rank %s", desc);
    if (cases[i].same_centroids || nc == 0) report("wave_select", "elems", (double)bad, 0, "idx %s", desc);
    /* the fused estimate against the CPU's estimate over the GPU's estimation ids */
    TRY("wave_select", desc, g_cpu->ops->wave_estimate(g_cpu, &q.c, &cen.c, &sz.c, &vs.c, nc, ig + r, e, ld, scale,
                                                       &o2.c, &ml2.c, &err));
    TRY("wave_select", desc, fetch(&o2.c, &oc, &err));
    TRY("wave_select", desc, fetch(&ml2.c, &mc, &err));
    TRY("wave_select", desc, fetch(&o.g, &og, &err));
    TRY("wave_select", desc, fetch(&ml.g, &mg, &err));
    report_partial("wave_select", desc, oc, og, mc, mg, hq, hd);
    free(og), free(mg), og = mg = NULL;
    /* the standalone estimate over the same ids */
    TRY("wave_estimate", desc, g_gpu->ops->wave_estimate(g_gpu, &q.g, &cen.g, &sz.g, &vs.g, nc, ig + r, e, ld, scale,
                                                         &o2.g, &ml2.g, &err));
    TRY("wave_estimate", desc, fetch(&o2.g, &og, &err));
    TRY("wave_estimate", desc, fetch(&ml2.g, &mg, &err));
    report_partial("wave_estimate", desc, oc, og, mc, mg, hq, hd);
  done:
    pair_free(&q), pair_free(&cen), pair_free(&sz), pair_free(&vs);
    pair_free(&o), pair_free(&ml), pair_free(&o2), pair_free(&ml2);
    free(hqv), free(hc), free(hvs), free(hs), free(key), free(ic), free(ig), free(oc), free(og), free(mc), free(mg);
  }
}

/* wave_select_batch on the GPU: several sequences' rankings in one call (one sync) equal each
 * ranked alone by wave_select, which test_wave_select_estimate checks against the CPU: the same
 * ids and estimates to the bit, whatever the other items' shapes. */
static void test_wave_select_batch(void) {
  enum { N = 3 };
  ra_error err;
  const struct {
    int64_t hq, hkv, hd, cap, nc;
    int r, e, est;
  } cases[N] = {{32, 8, 128, 8192, 8000, 147, 1856, 1}, {12, 4, 64, 300, 250, 20, 60, 0}, {32, 8, 128, 4096, 3000, 64, 700, 1}};
  pair q[N], cen[N], sz[N], vs[N], o[N], ml[N], o1[N], ml1[N];
  memset(q, 0, sizeof q), memset(cen, 0, sizeof cen), memset(sz, 0, sizeof sz), memset(vs, 0, sizeof vs);
  memset(o, 0, sizeof o), memset(ml, 0, sizeof ml), memset(o1, 0, sizeof o1), memset(ml1, 0, sizeof ml1);
  int32_t *ib[N] = {0}, *i1[N] = {0};
  ra_wave_select_item items[N];
  const float scale = 0.088f;
  for (int i = 0; i < N; i++) {
    int64_t hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd, cap = cases[i].cap;
    int64_t qs[2] = {hq, hd}, cl[3] = {hkv, cap, hd}, ms[2] = {hq, 2}, ld = cases[i].r + cases[i].e;
    float *hqv = rand_vec((size_t)(hq * hd), 3.0f), *hc = rand_vec((size_t)(hkv * cap * hd), 1.0f);
    float *hvs = rand_vec((size_t)(hkv * cap * hd), 8.0f), *hs = xmalloc(sizeof(float) * (size_t)(hkv * cap));
    for (int64_t j = 0; j < hkv * cap; j++) hs[j] = j % 7 == 3 ? 0.0f : (float)(1 + rnext() % 40);
    ib[i] = xmalloc(sizeof(int32_t) * (size_t)(hkv * ld));
    i1[i] = xmalloc(sizeof(int32_t) * (size_t)(hkv * ld));
    int rc = pair_new(&q[i], RA_DTYPE_F32, 2, qs, hqv, &err);
    if (!rc) rc = pair_new(&cen[i], RA_DTYPE_F32, 3, cl, hc, &err);
    if (!rc) rc = pair_new(&vs[i], RA_DTYPE_F32, 3, cl, hvs, &err);
    if (!rc) rc = pair_new(&sz[i], RA_DTYPE_F32, 2, cl, hs, &err);
    if (!rc) rc = pair_new(&o[i], RA_DTYPE_F32, 2, qs, NULL, &err);
    if (!rc) rc = pair_new(&ml[i], RA_DTYPE_F32, 2, ms, NULL, &err);
    if (!rc) rc = pair_new(&o1[i], RA_DTYPE_F32, 2, qs, NULL, &err);
    if (!rc) rc = pair_new(&ml1[i], RA_DTYPE_F32, 2, ms, NULL, &err);
    free(hqv), free(hc), free(hvs), free(hs);
    TRY("wave_select_batch", "setup", rc);
    const int est = cases[i].est;
    items[i] = (ra_wave_select_item){&q[i].g, &cen[i].g, &sz[i].g, cases[i].nc, cases[i].r, cases[i].e, ib[i],
                                     est ? &vs[i].g : NULL, est ? &o[i].g : NULL, est ? &ml[i].g : NULL};
  }
  TRY("wave_select_batch", "3 items", g_gpu->ops->wave_select_batch(g_gpu, items, N, scale, &err));
  for (int i = 0; i < N; i++) {
    const ra_wave_select_item *it = &items[i];
    const int est = cases[i].est;
    char desc[96];
    snprintf(desc, sizeof desc, "item %d of %d: nc %lld r %d e %d%s", i, N, (long long)it->n_clusters, it->r, it->e,
             est ? "" : ", no estimate");
    TRY("wave_select_batch", desc, g_gpu->ops->wave_select(g_gpu, it->q, it->centroid, it->size, it->n_clusters, scale,
                                                           it->r, it->e, i1[i], est ? &vs[i].g : NULL,
                                                           est ? &o1[i].g : NULL, est ? &ml1[i].g : NULL, &err));
    const size_t n_idx = (size_t)(cases[i].hkv * (cases[i].r + cases[i].e));
    size_t bad = 0;
    for (size_t j = 0; j < n_idx; j++) bad += ib[i][j] != i1[i][j];
    report("wave_select_batch", "elems", (double)bad, 0, "idx %s", desc);
    if (!est) continue;
    float *ob = NULL, *oa = NULL, *mb = NULL, *ma = NULL;
    int rc = fetch(&o[i].g, &ob, &err);
    if (!rc) rc = fetch(&o1[i].g, &oa, &err);
    if (!rc) rc = fetch(&ml[i].g, &mb, &err);
    if (!rc) rc = fetch(&ml1[i].g, &ma, &err);
    if (!rc) {
      report("wave_select_batch", "abs", max_abs(oa, ob, (size_t)(cases[i].hq * cases[i].hd)), 0, "o %s", desc);
      report("wave_select_batch", "abs", max_abs(ma, mb, (size_t)(cases[i].hq * 2)), 0, "ml %s", desc);
    }
    free(ob), free(oa), free(mb), free(ma);
    TRY("wave_select_batch", desc, rc);
  }
  /* a bad item fails the call before any item runs, naming it */
  ra_wave_select_item bad[2] = {items[0], items[1]};
  bad[1].r = -1;
  int rc = g_gpu->ops->wave_select_batch(g_gpu, bad, 2, scale, &err);
  report("wave_select_batch", "elems", rc == RA_EINVAL && strstr(err.msg, "item 1") ? 0 : 1, 0, "bad item 1 refused");
done:
  for (int i = 0; i < N; i++) {
    pair_free(&q[i]), pair_free(&cen[i]), pair_free(&sz[i]), pair_free(&vs[i]);
    pair_free(&o[i]), pair_free(&ml[i]), pair_free(&o1[i]), pair_free(&ml1[i]);
    free(ib[i]), free(i1[i]);
  }
}

/* ---------- whole forward passes ---------- */

static int argmax(const float *v, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

/* Compares the last-token logits of the two states (vocab entries). */
static void compare_logits(const char *what, const char *step, ra_state *sc, ra_state *sg, int vocab, double tol) {
  ra_error err;
  float *c = xmalloc((size_t)vocab * 4), *g = xmalloc((size_t)vocab * 4);
  ra_tensor lc = ra_tensor_rows(&sc->logits, sc->n_logits - 1, 1), lg = ra_tensor_rows(&sg->logits, sg->n_logits - 1, 1);
  TRY("forward", what, g_cpu->ops->download(g_cpu, &lc, 0, c, (size_t)vocab, &err));
  TRY("forward", what, g_gpu->ops->download(g_gpu, &lg, 0, g, (size_t)vocab, &err));
  double e = max_rel(c, g, (size_t)vocab), ea = max_abs(c, g, (size_t)vocab);
  report("forward", "rel", e, tol, "%s %s logits", what, step);
  int ac = argmax(c, vocab), ag = argmax(g, vocab);
  double gap = (double)c[ac] - (double)c[ag];
  report("forward", "argmax", ac != ag && gap > 2.0 * ea ? 1.0 : 0.0, 0.0, "%s %s argmax cpu %d cuda %d", what, step,
         ac, ag);
done:
  free(c);
  free(g);
}

/* Prefill of n_prompt tokens in steps of max_batch, then n_decode single-token steps, on both
 * backends, comparing the logits after the prefill and after every decode step. */
static void run_forward(const char *what, ra_model *mc, ra_model *mg, int n_prompt, int max_batch, int n_decode,
                        ra_dtype kv_dtype, double tol) {
  ra_error err;
  ra_state *sc = NULL, *sg = NULL;
  int vocab = mc->cfg.vocab;
  int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)(n_prompt + n_decode));
  for (int i = 0; i < n_prompt + n_decode; i++) tok[i] = (int32_t)((7 + 131 * (int64_t)i * i) % vocab);
  TRY("forward", what, ra_state_new(mc, n_prompt + n_decode + 8, max_batch, kv_dtype, &sc, &err));
  TRY("forward", what, ra_state_new(mg, n_prompt + n_decode + 8, max_batch, kv_dtype, &sg, &err));
  TRY("forward", what, ra_model_forward(sc, tok, n_prompt, 0, NULL, &err));
  TRY("forward", what, ra_model_forward(sg, tok, n_prompt, 0, NULL, &err));
  char step[48];
  snprintf(step, sizeof step, "prefill %d (batch %d)", n_prompt, max_batch);
  compare_logits(what, step, sc, sg, vocab, tol);
  for (int i = 0; i < n_decode; i++) {
    TRY("forward", what, ra_model_forward(sc, tok + n_prompt + i, 1, 0, NULL, &err));
    TRY("forward", what, ra_model_forward(sg, tok + n_prompt + i, 1, 0, NULL, &err));
    snprintf(step, sizeof step, "decode %d", i + 1);
    compare_logits(what, step, sc, sg, vocab, tol);
  }
done:
  ra_state_free(sc);
  ra_state_free(sg);
  free(tok);
}

static void test_forward_random(void) {
  ra_error err;
  ra_model_config tiny, mid;
  ra_model *mc = NULL, *mg = NULL;
  if (ra_model_config_preset("tiny", &tiny, &err)) {
    report_error("forward", "preset tiny", &err);
    return;
  }
  /* head_dim 64 (tensor-core prefill), GQA 3, q/k/v biases, NEOX rope */
  mid = tiny;
  mid.n_layers = 3;
  mid.dim = 384;
  mid.n_heads = 6;
  mid.n_kv_heads = 2;
  mid.head_dim = 64;
  mid.n_rot = 64;
  mid.ffn_dim = 1024;
  mid.vocab = 1000;
  mid.qkv_bias = 1;
  mid.rope_style = RA_ROPE_NEOX;
  snprintf(mid.name, sizeof mid.name, "random-mid");
  const struct {
    const ra_model_config *cfg;
    const char *name;
    int bf16;
    ra_dtype kv;
    double tol;
  } runs[] = {
      {&tiny, "tiny F32 weights, F32 KV", 0, RA_DTYPE_F32, 1e-3},
      {&mid, "mid F32 weights, F16 KV", 0, RA_DTYPE_F16, 2e-2},
      {&mid, "mid BF16 weights, BF16 KV", 1, RA_DTYPE_BF16, 1e-1},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    mc = mg = NULL;
    TRY("forward", runs[i].name, ra_model_random(g_cpu, runs[i].cfg, 99, &mc, &err));
    TRY("forward", runs[i].name, ra_model_random(g_gpu, runs[i].cfg, 99, &mg, &err));
    if (runs[i].bf16) TRY("forward", runs[i].name, ra_model_convert_weights(mg, RA_DTYPE_BF16, &err));
    run_forward(runs[i].name, mc, mg, 150, 64, 4, runs[i].kv, runs[i].tol);
  done:
    ra_model_free(mc);
    ra_model_free(mg);
  }
}

static void test_forward_smollm2(void) {
  ra_error err;
  const char *src = getenv("RA_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", src ? src : RA_SOURCE_DIR_DEFAULT);
  FILE *f = fopen(path, "rb");
  if (!f) {
    printf("%-12s %-58s skipped (no %s)\n", "forward", "SmolLM2-135M Q4_1", path);
    return;
  }
  fclose(f);
  ra_gguf gg;
  memset(&gg, 0, sizeof gg);
  ra_model *mc = NULL, *mg = NULL;
  const char *what = "SmolLM2-135M Q4_1 (BF16 on CUDA)";
  TRY("forward", what, ra_gguf_open(path, &gg, &err));
  TRY("forward", what, ra_model_load_gguf(g_cpu, &gg, &mc, &err));
  TRY("forward", what, ra_model_load_gguf(g_gpu, &gg, &mg, &err));
  run_forward(what, mc, mg, 100, 64, 8, RA_DTYPE_BF16, 1e-1);
done:
  ra_model_free(mc);
  ra_model_free(mg);
  ra_gguf_close(&gg);
}

/* ---------- main ---------- */

static int write_json(const char *path, double secs) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "{\n  \"test\": \"backend_cross\",\n  \"pass\": %s,\n  \"failed\": %d,\n  \"seconds\": %.1f,\n  \"cases\": [\n",
          g_nfail ? "false" : "true", g_nfail, secs);
  for (int i = 0; i < g_nres; i++)
    fprintf(f, "    {\"op\": \"%s\", \"case\": \"%s\", \"metric\": \"%s\", \"err\": %.6g, \"tol\": %.6g, \"pass\": %s}%s\n",
            g_res[i].op, g_res[i].desc, g_res[i].metric, isinf(g_res[i].err) ? 1e300 : g_res[i].err, g_res[i].tol,
            g_res[i].pass ? "true" : "false", i + 1 < g_nres ? "," : "");
  fprintf(f, "  ]\n}\n");
  return fclose(f);
}

int main(int argc, char **argv) {
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  ra_error err;
  ra_backend_config cfg = {0, 0};
  int rc = ra_backend_cuda_create(&cfg, &g_gpu, &err);
  if (rc == RA_EUNAVAIL) {
    printf("SKIP: no CUDA device (%s)\n", err.msg);
    return 77;
  }
  if (rc != RA_OK) {
    printf("FAIL: cuda backend: %s\n", err.msg);
    return 1;
  }
  /* every row count the tensor-core kernel can take goes to it here, past its default */
  if ((rc = ra_backend_cuda_set_mma_rows(g_gpu, RA_CUDA_MMA_MAX_X, &err)) != RA_OK) {
    printf("FAIL: cuda backend: %s\n", err.msg);
    ra_backend_destroy(g_gpu);
    return 1;
  }
  if ((rc = ra_backend_cpu_create(&cfg, &g_cpu, &err)) != RA_OK) {
    printf("FAIL: cpu backend: %s\n", err.msg);
    ra_backend_destroy(g_gpu);
    return 1;
  }
  char dev[256];
  int n_sm = 0;
  size_t mem = 0;
  ra_backend_cuda_device_info(g_gpu, dev, sizeof dev, &n_sm, &mem, NULL);
  printf("CUDA backend vs CPU backend on %s (%d SMs, %.1f GiB)\n\n", dev, n_sm, (double)mem / (1 << 30));
  printf("%-12s %-58s %-8s %10s %10s\n", "op", "case", "metric", "error", "bound");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  test_upload_download();
  test_copy();
  test_fill_random();
  test_load_weight();
  test_get_rows();
  test_set_rows();
  test_matmul();
  test_rmsnorm();
  test_rope();
  test_swiglu();
  test_norm_matmul();
  test_norm_swiglu();
  test_rope_store();
  test_rope_store_batch();
  test_attn_prefill();
  test_attn_decode();
  test_attn_decode_batch();
  test_attn_merge();
  test_topk();
  test_wave_cluster();
  test_wave_select_estimate();
  test_wave_select_batch();
  test_forward_random();
  test_forward_smollm2();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("\n%d cases, %d failed, %.1f s: %s\n", g_nres, g_nfail, secs, g_nfail ? "FAIL" : "PASS");
  if (json && write_json(json, secs) != 0) {
    fprintf(stderr, "cannot write %s\n", json);
    g_nfail++;
  }
  ra_backend_destroy(g_cpu);
  ra_backend_destroy(g_gpu);
  return g_nfail ? 1 : 0;
}
