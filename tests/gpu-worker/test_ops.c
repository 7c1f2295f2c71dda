/* CPU backend ops against naive reference implementations written here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "half.h"
#include "merge.h"

#include "cpu_fixture.h"

/* Allocates a tensor and fills it with random values; returns the host copy. */
static float *rand_tensor(ra_tensor *t, ra_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
  assert_int_equal(ra_tensor_new(be, t, dt, ndim, shape, NULL), RA_OK);
  size_t n = ra_tensor_nelem(t);
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = frand(&seed);
  assert_int_equal(be->ops->upload(be, t, 0, h, n, NULL), RA_OK);
  /* read back so the host copy holds exactly what the (possibly f16) tensor stores */
  assert_int_equal(be->ops->download(be, t, 0, h, n, NULL), RA_OK);
  return h;
}

static float *fetch(const ra_tensor *t) {
  size_t n = ra_tensor_nelem(t);
  float *h = malloc(n * sizeof(float));
  assert_int_equal(be->ops->download(be, t, 0, h, n, NULL), RA_OK);
  return h;
}

static void assert_close(const float *a, const float *b, size_t n, float tol) {
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i])))) fail_msg("element %zu: %g vs %g", i, a[i], b[i]);
}

/* host_alloc's memory takes downloads like any other, and host_free(NULL) is a no-op. */
static void test_host_alloc(void **state) {
  (void)state;
  ra_tensor t;
  float *h = rand_tensor(&t, RA_DTYPE_F16, 1, (int64_t[]){37}, 9);
  void *p = NULL;
  assert_int_equal(be->ops->host_alloc(be, 40 * sizeof(float), &p, NULL), RA_OK);
  assert_non_null(p);
  assert_int_equal(be->ops->download(be, &t, 0, (float *)p + 3, 37, NULL), RA_OK);
  assert_memory_equal((float *)p + 3, h, 37 * sizeof(float));
  be->ops->host_free(be, p);
  be->ops->host_free(be, NULL);
  ra_tensor_free(&t);
  free(h);
}

/* download_raw hands the stored bytes over unconverted, and refuses a range past the tensor. */
static void test_download_raw(void **state) {
  (void)state;
  ra_tensor t;
  float *h = rand_tensor(&t, RA_DTYPE_BF16, 1, (int64_t[]){29}, 11);
  uint16_t got[26];
  assert_int_equal(be->ops->download_raw(be, &t, 3, got, 26, NULL), RA_OK);
  assert_memory_equal(got, (const uint16_t *)t.data + 3, sizeof got);
  for (int i = 0; i < 26; i++) assert_float_equal(ra_bf16_to_fp32(got[i]), h[3 + i], 0.0f);
  ra_error err;
  assert_int_equal(be->ops->download_raw(be, &t, 4, got, 26, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "outside"));
  ra_tensor_free(&t);
  free(h);
}

/* y = x w^T + bias + y against a double-precision reference from the stored values of w and
 * bias, which may be f16 / bf16 (the keys / queries of a half-precision cache in roar's kNN). */
static void check_matmul(ra_dtype wdt, int64_t n) {
  int64_t k = 48, m = 70;
  ra_tensor x, w, b, y;
  float *hx = rand_tensor(&x, RA_DTYPE_F32, 2, (int64_t[]){n, k}, 1);
  float *hw = rand_tensor(&w, wdt, 2, (int64_t[]){m, k}, 2);
  float *hb = rand_tensor(&b, wdt, 1, (int64_t[]){m}, 3);
  float *hy = rand_tensor(&y, RA_DTYPE_F32, 2, (int64_t[]){n, m}, 4);
  assert_int_equal(be->ops->matmul(be, &x, &w, &b, &y, 1, NULL), RA_OK);
  float *got = fetch(&y), *want = malloc(sizeof(float) * (size_t)(n * m));
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) {
      double s = hy[i * m + j] + hb[j];
      for (int64_t q = 0; q < k; q++) s += (double)hx[i * k + q] * hw[j * k + q];
      want[i * m + j] = (float)s;
    }
  assert_close(got, want, (size_t)(n * m), 1e-5f);
  ra_error err;
  ra_tensor bad;
  float *hbad = rand_tensor(&bad, RA_DTYPE_F32, 2, (int64_t[]){n, m + 1}, 5);
  assert_int_equal(be->ops->matmul(be, &x, &w, NULL, &bad, 0, &err), RA_EINVAL);
  free(hbad);
  ra_tensor_free(&bad);
  free(hx), free(hw), free(hb), free(hy), free(got), free(want);
  ra_tensor_free(&x), ra_tensor_free(&w), ra_tensor_free(&b), ra_tensor_free(&y);
}

static void test_matmul(void **state) {
  (void)state;
  const ra_dtype dts[3] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  for (int d = 0; d < 3; d++)
    for (int64_t n = 1; n <= 37; n += 36) check_matmul(dts[d], n);
}

static void test_rmsnorm_swiglu_get_rows(void **state) {
  (void)state;
  int64_t n = 5, d = 40;
  ra_tensor x, w, y, g, u;
  float *hx = rand_tensor(&x, RA_DTYPE_F32, 2, (int64_t[]){n, d}, 11);
  float *hw = rand_tensor(&w, RA_DTYPE_F32, 1, (int64_t[]){d}, 12);
  float *hy = rand_tensor(&y, RA_DTYPE_F32, 2, (int64_t[]){n, d}, 13);
  assert_int_equal(be->ops->rmsnorm(be, &x, &w, 1e-5f, &y, NULL), RA_OK);
  float *got = fetch(&y);
  for (int64_t i = 0; i < n; i++) {
    double ss = 0;
    for (int64_t j = 0; j < d; j++) ss += hx[i * d + j] * hx[i * d + j];
    for (int64_t j = 0; j < d; j++) hy[i * d + j] = (float)(hx[i * d + j] / sqrt(ss / d + 1e-5) * hw[j]);
  }
  assert_close(got, hy, (size_t)(n * d), 1e-5f);
  free(got);
  float *hg = rand_tensor(&g, RA_DTYPE_F32, 2, (int64_t[]){n, d}, 14);
  float *hu = rand_tensor(&u, RA_DTYPE_F32, 2, (int64_t[]){n, d}, 15);
  assert_int_equal(be->ops->swiglu(be, &g, &u, &y, NULL), RA_OK);
  got = fetch(&y);
  for (int64_t i = 0; i < n * d; i++) hy[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
  assert_close(got, hy, (size_t)(n * d), 1e-6f);
  free(got);
  /* get_rows: rows 3, 0, 4 of x */
  int32_t ids[3] = {3, 0, 4};
  ra_tensor out;
  assert_int_equal(ra_tensor_new(be, &out, RA_DTYPE_F32, 2, (int64_t[]){3, d}, NULL), RA_OK);
  assert_int_equal(be->ops->get_rows(be, &x, ids, 3, &out, NULL), RA_OK);
  got = fetch(&out);
  for (int r = 0; r < 3; r++) assert_memory_equal(got + r * d, hx + ids[r] * d, (size_t)d * sizeof(float));
  /* x [5, 40] as a matrix of 10 rows of 20 (a cache [n, kv heads, head_dim] as n * kv heads
   * rows): rows 9 and 3 are the second halves of x's rows 4 and 1 */
  const ra_tensor halves = ra_tensor_matrix(&x, d / 2);
  assert_int_equal(halves.ndim, 2);
  assert_int_equal(halves.shape[0], 2 * n);
  assert_int_equal(halves.shape[1], d / 2);
  int32_t hids[2] = {9, 3};
  ra_tensor hout;
  assert_int_equal(ra_tensor_new(be, &hout, RA_DTYPE_F32, 2, (int64_t[]){2, d / 2}, NULL), RA_OK);
  assert_int_equal(be->ops->get_rows(be, &halves, hids, 2, &hout, NULL), RA_OK);
  float *hgot = fetch(&hout);
  assert_memory_equal(hgot, hx + 4 * d + d / 2, (size_t)(d / 2) * sizeof(float));
  assert_memory_equal(hgot + d / 2, hx + 1 * d + d / 2, (size_t)(d / 2) * sizeof(float));
  free(hgot);
  ra_tensor_free(&hout);
  int32_t bad = 5;
  ra_error err;
  assert_int_equal(be->ops->get_rows(be, &x, &bad, 1, &out, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "outside"));
  free(got);
  free(hx), free(hw), free(hy), free(hg), free(hu);
  ra_tensor_free(&x), ra_tensor_free(&w), ra_tensor_free(&y), ra_tensor_free(&g), ra_tensor_free(&u), ra_tensor_free(&out);
}

/* set_rows scatters fp32 rows into a table of any dtype (converted as upload converts), leaves
 * the other rows alone, and refuses ids outside the table and a short src. */
static void test_set_rows(void **state) {
  (void)state;
  const ra_dtype dts[3] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  for (int t = 0; t < 3; t++) {
    ra_tensor tab, src;
    assert_int_equal(ra_tensor_new(be, &tab, dts[t], 3, (int64_t[]){6, 1, 16}, NULL), RA_OK);
    assert_int_equal(ra_tensor_new(be, &src, RA_DTYPE_F32, 2, (int64_t[]){3, 16}, NULL), RA_OK);
    float hs[3 * 16], want[6 * 16] = {0}, got[6 * 16];
    for (int i = 0; i < 3 * 16; i++) hs[i] = 0.37f * (float)i - 5.0f;
    assert_int_equal(be->ops->upload(be, &src, 0, hs, 3 * 16, NULL), RA_OK);
    const int32_t ids[3] = {4, 0, 2};
    ra_tensor m = ra_tensor_matrix(&tab, 16);
    assert_int_equal(be->ops->set_rows(be, &m, ids, 3, &src, NULL), RA_OK);
    for (int r = 0; r < 3; r++)
      for (int d = 0; d < 16; d++) {
        float v = hs[r * 16 + d];
        if (dts[t] == RA_DTYPE_F16) v = ra_fp16_to_fp32(ra_fp32_to_fp16(v));
        if (dts[t] == RA_DTYPE_BF16) v = ra_bf16_to_fp32(ra_fp32_to_bf16(v));
        want[ids[r] * 16 + d] = v;
      }
    assert_int_equal(be->ops->download(be, &tab, 0, got, 6 * 16, NULL), RA_OK);
    assert_memory_equal(got, want, sizeof want);
    ra_error err;
    const int32_t bad[1] = {6};
    assert_int_equal(be->ops->set_rows(be, &m, bad, 1, &src, &err), RA_EINVAL);
    assert_non_null(strstr(err.msg, "outside"));
    assert_int_equal(be->ops->set_rows(be, &m, ids, 4, &src, &err), RA_EINVAL);
    ra_tensor_free(&tab);
    ra_tensor_free(&src);
  }
}

/* get_rows of an f32, f16 and bf16 table: a cache [n, kv heads, head_dim] as n * kv heads rows,
 * as roar's kNN gathers one kv head's keys. Half-precision values widen to fp32 exactly, so the
 * rows equal the table's stored values bit for bit. */
static void test_get_rows_dtypes(void **state) {
  (void)state;
  const ra_dtype dts[3] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  const int64_t n_ctx = 9, n_kv = 3, hd = 16;
  for (int d = 0; d < 3; d++) {
    ra_tensor kc, out;
    float *hk = rand_tensor(&kc, dts[d], 3, (int64_t[]){n_ctx, n_kv, hd}, 40 + (uint64_t)d);
    const ra_tensor table = ra_tensor_matrix(&kc, hd);
    int32_t ids[4] = {1 * 3 + 2, 8 * 3 + 2, 0, 4 * 3 + 2}; /* kv head 2 of positions 1, 8, 4; row 0 */
    assert_int_equal(ra_tensor_new(be, &out, RA_DTYPE_F32, 2, (int64_t[]){4, hd}, NULL), RA_OK);
    ra_error err;
    if (be->ops->get_rows(be, &table, ids, 4, &out, &err) != RA_OK)
      fail_msg("%s: %s", ra_dtype_name(dts[d]), err.msg);
    float *got = fetch(&out);
    for (int r = 0; r < 4; r++) assert_memory_equal(got + r * hd, hk + ids[r] * hd, (size_t)hd * sizeof(float));
    /* a bad id is refused before anything is written */
    float before = got[0];
    int32_t bad[2] = {0, (int32_t)(n_ctx * n_kv)};
    assert_int_equal(be->ops->get_rows(be, &table, bad, 2, &out, &err), RA_EINVAL);
    assert_non_null(strstr(err.msg, "outside"));
    free(got);
    got = fetch(&out);
    assert_true(got[0] == before);
    free(got);
    free(hk);
    ra_tensor_free(&kc);
    ra_tensor_free(&out);
  }
  /* the output stays fp32 whatever the table */
  ra_tensor t, o;
  free(rand_tensor(&t, RA_DTYPE_BF16, 2, (int64_t[]){4, 8}, 50));
  assert_int_equal(ra_tensor_new(be, &o, RA_DTYPE_BF16, 2, (int64_t[]){1, 8}, NULL), RA_OK);
  ra_error err;
  int32_t id = 1;
  assert_int_equal(be->ops->get_rows(be, &t, &id, 1, &o, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "want f32"));
  ra_tensor_free(&t);
  ra_tensor_free(&o);
}

static void test_rope_styles(void **state) {
  (void)state;
  int64_t n = 3, h = 2, hd = 8;
  int64_t pos0 = 1000;
  for (int style = 0; style < 2; style++) {
    ra_tensor x;
    float *hx = rand_tensor(&x, RA_DTYPE_F32, 3, (int64_t[]){n, h, hd}, 21);
    assert_int_equal(be->ops->rope(be, &x, pos0, (int)hd, 10000.0f, (ra_rope_style)style, NULL), RA_OK);
    float *got = fetch(&x);
    for (int64_t t = 0; t < n; t++)
      for (int64_t hh = 0; hh < h; hh++)
        for (int64_t j = 0; j < hd / 2; j++) {
          double ang = (double)(pos0 + t) / pow(10000.0, 2.0 * (double)j / (double)hd);
          int64_t a = style == RA_ROPE_NORM ? 2 * j : j, b = style == RA_ROPE_NORM ? 2 * j + 1 : j + hd / 2;
          const float *v = hx + (t * h + hh) * hd;
          float ra = (float)(v[a] * cos(ang) - v[b] * sin(ang)), rb = (float)(v[a] * sin(ang) + v[b] * cos(ang));
          const float *gv = got + (t * h + hh) * hd;
          assert_true(fabsf(gv[a] - ra) < 1e-5f && fabsf(gv[b] - rb) < 1e-5f);
        }
    free(hx);
    free(got);
    ra_tensor_free(&x);
  }
}

/* rope_store_batch writes what rope_store does item by item: q, k rotated at each item's
 * positions, each item's rows in its own caches; a bad item is refused with its index. */
static void test_rope_store_batch(void **state) {
  (void)state;
  const int64_t T = 6, hq = 4, hkv = 2, hd = 8, n_ctx = 20;
  const ra_rope_store_item shape[3] = {{0, 1, 7, 3, NULL, NULL}, {1, 4, 100, 10, NULL, NULL}, {5, 1, 0, 0, NULL, NULL}};
  float *in[3], *got[3][2], *want[3][2], *rows[2][3]; /* [item][k, v cache], [pass][q, k, v] */
  ra_tensor qkv[2][3], kc[2][3], vc[2][3];
  for (int pass = 0; pass < 2; pass++) { /* 0: batched, 1: item by item */
    for (int j = 0; j < 3; j++) {
      in[j] = rand_tensor(&qkv[pass][j], RA_DTYPE_F32, 3, (int64_t[]){T, j == 0 ? hq : hkv, hd}, 40 + (uint64_t)j);
      free(in[j]);
    }
    ra_rope_store_item items[3];
    for (int i = 0; i < 3; i++) {
      assert_int_equal(ra_tensor_new(be, &kc[pass][i], RA_DTYPE_F16, 3, (int64_t[]){n_ctx, hkv, hd}, NULL), RA_OK);
      assert_int_equal(ra_tensor_new(be, &vc[pass][i], RA_DTYPE_F16, 3, (int64_t[]){n_ctx, hkv, hd}, NULL), RA_OK);
      items[i] = shape[i];
      items[i].k_cache = &kc[pass][i];
      items[i].v_cache = &vc[pass][i];
    }
    if (pass == 0)
      assert_int_equal(be->ops->rope_store_batch(be, &qkv[0][0], &qkv[0][1], &qkv[0][2], items, 3, (int)hd, 5e5f,
                                                 RA_ROPE_NEOX, NULL),
                       RA_OK);
    for (int i = 0; pass == 1 && i < 3; i++) {
      ra_tensor q = ra_tensor_rows(&qkv[1][0], items[i].r0, items[i].n),
                k = ra_tensor_rows(&qkv[1][1], items[i].r0, items[i].n),
                v = ra_tensor_rows(&qkv[1][2], items[i].r0, items[i].n);
      assert_int_equal(be->ops->rope_store(be, &q, &k, &v, items[i].pos, (int)hd, 5e5f, RA_ROPE_NEOX, items[i].k_cache,
                                           items[i].v_cache, items[i].row, NULL),
                       RA_OK);
    }
    for (int i = 0; i < 3; i++) {
      float **dst = pass == 0 ? got[i] : want[i];
      dst[0] = fetch(&kc[pass][i]);
      dst[1] = fetch(&vc[pass][i]);
      rows[pass][i] = fetch(&qkv[pass][i]); /* q, k, v after the op: q and k rotated */
    }
  }
  for (int i = 0; i < 3; i++) {
    assert_memory_equal(got[i][0], want[i][0], (size_t)(n_ctx * hkv * hd) * sizeof(float));
    assert_memory_equal(got[i][1], want[i][1], (size_t)(n_ctx * hkv * hd) * sizeof(float));
    assert_memory_equal(rows[0][i], rows[1][i], ra_tensor_nelem(&qkv[0][i]) * sizeof(float));
  }
  /* the middle item's rows 10..13 hold its tokens; row 14 is untouched */
  assert_true(got[1][1][10 * hkv * hd] != 0.0f && got[1][1][14 * hkv * hd] == 0.0f);
  ra_error err;
  ra_rope_store_item bad[2] = {shape[0], {4, 3, 0, 0, NULL, NULL}};
  bad[0].k_cache = bad[1].k_cache = &kc[0][0];
  bad[0].v_cache = bad[1].v_cache = &vc[0][0];
  assert_int_equal(be->ops->rope_store_batch(be, &qkv[0][0], &qkv[0][1], &qkv[0][2], bad, 2, (int)hd, 5e5f,
                                             RA_ROPE_NEOX, &err),
                   RA_EINVAL);
  assert_non_null(strstr(err.msg, "item 1: rows [4, 7) of 6"));
  bad[1] = (ra_rope_store_item){4, 1, 0, n_ctx, &kc[0][0], &vc[0][0]};
  assert_int_equal(be->ops->rope_store_batch(be, &qkv[0][0], &qkv[0][1], &qkv[0][2], bad, 2, (int)hd, 5e5f,
                                             RA_ROPE_NEOX, &err),
                   RA_EINVAL);
  assert_non_null(strstr(err.msg, "item 1"));
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < 3; i++) {
      ra_tensor_free(&qkv[pass][i]);
      ra_tensor_free(&kc[pass][i]);
      ra_tensor_free(&vc[pass][i]);
      free(pass == 0 ? got[i][0] : want[i][0]);
      free(pass == 0 ? got[i][1] : want[i][1]);
      free(rows[pass][i]);
    }
}

static void test_copy_convert_and_fill(void **state) {
  (void)state;
  ra_tensor a, b, c;
  float *ha = rand_tensor(&a, RA_DTYPE_F32, 1, (int64_t[]){300}, 31);
  assert_int_equal(ra_tensor_new(be, &b, RA_DTYPE_F16, 1, (int64_t[]){400}, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &c, RA_DTYPE_BF16, 1, (int64_t[]){300}, NULL), RA_OK);
  assert_int_equal(be->ops->copy(be, &b, 100, &a, 0, 300, NULL), RA_OK);
  assert_int_equal(be->ops->copy(be, &c, 0, &b, 100, 300, NULL), RA_OK); /* f16 -> bf16 */
  float *hb = fetch(&b), *hc = fetch(&c);
  for (int i = 0; i < 100; i++) assert_true(hb[i] == 0.0f); /* alloc zero-fills */
  assert_close(hb + 100, ha, 300, 1e-3f);
  assert_close(hc, ha, 300, 1e-2f);
  ra_error err;
  assert_int_equal(be->ops->copy(be, &b, 200, &a, 0, 300, &err), RA_EINVAL);
  /* fill_random: deterministic, in range, not constant */
  assert_int_equal(be->ops->fill_random(be, &a, 7, 1.0f, 0.5f, NULL), RA_OK);
  float *r1 = fetch(&a);
  assert_int_equal(be->ops->fill_random(be, &a, 7, 1.0f, 0.5f, NULL), RA_OK);
  float *r2 = fetch(&a);
  assert_memory_equal(r1, r2, 300 * sizeof(float));
  float lo = 9, hi = -9;
  for (int i = 0; i < 300; i++) lo = fminf(lo, r1[i]), hi = fmaxf(hi, r1[i]);
  assert_true(lo >= 0.5f && hi < 1.5f && hi - lo > 0.8f);
  free(ha), free(hb), free(hc), free(r1), free(r2);
  ra_tensor_free(&a), ra_tensor_free(&b), ra_tensor_free(&c);
}

static void test_topk_rows(void **state) {
  (void)state;
  float h[2 * 6] = {1, 5, 3, 5, -2, 4, /* row 1 */ 0, 0, 0, 0, 0, 1};
  ra_tensor x;
  assert_int_equal(ra_tensor_new(be, &x, RA_DTYPE_F32, 2, (int64_t[]){2, 6}, NULL), RA_OK);
  be->ops->upload(be, &x, 0, h, 12, NULL);
  int32_t idx[6];
  float val[6];
  assert_int_equal(be->ops->topk_rows(be, &x, 3, idx, val, NULL), RA_OK);
  int32_t want_idx[6] = {1, 3, 5, 5, 0, 1};
  float want_val[6] = {5, 5, 4, 1, 0, 0};
  assert_memory_equal(idx, want_idx, sizeof want_idx);
  assert_memory_equal(val, want_val, sizeof want_val);
  assert_int_equal(be->ops->topk_rows(be, &x, 7, idx, val, NULL), RA_EINVAL);
  ra_tensor_free(&x);
}

/* Naive causal attention of query i (absolute position pos0 + i) over cache rows [0, pos0+i]. */
static void naive_attention(const float *q, const float *k, const float *v, int64_t n, int64_t pos0, int64_t hq,
                            int64_t hkv, int64_t hd, float scale, float *out) {
  double *s = malloc(sizeof(double) * (size_t)(pos0 + n));
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < hq; h++) {
      int64_t g = h / (hq / hkv), nk = pos0 + i + 1;
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < nk; j++) {
        double z = 0;
        for (int64_t d = 0; d < hd; d++) z += (double)q[(i * hq + h) * hd + d] * k[(j * hkv + g) * hd + d];
        s[j] = z * scale;
        mx = s[j] > mx ? s[j] : mx;
      }
      for (int64_t j = 0; j < nk; j++) sum += (s[j] = exp(s[j] - mx));
      for (int64_t d = 0; d < hd; d++) {
        double o = 0;
        for (int64_t j = 0; j < nk; j++) o += s[j] * v[(j * hkv + g) * hd + d];
        out[(i * hq + h) * hd + d] = (float)(o / sum);
      }
    }
  free(s);
}

static void check_prefill(ra_dtype kv_dtype, int64_t n, int64_t pos0, float tol) {
  int64_t hq = 4, hkv = 2, hd = 16, ctx = pos0 + n + 3;
  float scale = 0.25f;
  ra_tensor q, kc, vc, out;
  float *hq_ = rand_tensor(&q, RA_DTYPE_F32, 3, (int64_t[]){n, hq, hd}, 41);
  float *hk = rand_tensor(&kc, kv_dtype, 3, (int64_t[]){ctx, hkv, hd}, 42);
  float *hv = rand_tensor(&vc, kv_dtype, 3, (int64_t[]){ctx, hkv, hd}, 43);
  for (size_t i = 0; i < ra_tensor_nelem(&q); i++) hq_[i] *= 4.0f; /* peaky softmax */
  be->ops->upload(be, &q, 0, hq_, ra_tensor_nelem(&q), NULL);
  assert_int_equal(ra_tensor_new(be, &out, RA_DTYPE_F32, 3, (int64_t[]){n, hq, hd}, NULL), RA_OK);
  assert_int_equal(be->ops->attn_prefill(be, &q, &kc, &vc, pos0, scale, &out, NULL), RA_OK);
  float *got = fetch(&out), *want = malloc(ra_tensor_nelem(&out) * sizeof(float));
  naive_attention(hq_, hk, hv, n, pos0, hq, hkv, hd, scale, want);
  assert_close(got, want, ra_tensor_nelem(&out), tol);
  ra_error err;
  assert_int_equal(be->ops->attn_prefill(be, &q, &kc, &vc, ctx - n + 1, scale, &out, &err), RA_EINVAL);
  free(hq_), free(hk), free(hv), free(got), free(want);
  ra_tensor_free(&q), ra_tensor_free(&kc), ra_tensor_free(&vc), ra_tensor_free(&out);
}

static void test_attn_prefill_matches_naive(void **state) {
  (void)state;
  check_prefill(RA_DTYPE_F32, 1, 0, 1e-5f);
  check_prefill(RA_DTYPE_F32, 150, 0, 1e-5f);  /* several query blocks and key tiles */
  check_prefill(RA_DTYPE_F32, 37, 90, 1e-5f);  /* a later chunk of a chunked prefill */
  check_prefill(RA_DTYPE_F16, 70, 10, 1e-5f);  /* f16 cache: same values (host copy read back) */
}

static void test_attn_decode_partials_merge(void **state) {
  (void)state;
  int64_t hq = 6, hkv = 2, hd = 32, ctx = 700;
  float scale = 0.2f;
  ra_tensor q, kc, vc, o1, ml1, o2, ml2;
  float *hqv = rand_tensor(&q, RA_DTYPE_F32, 2, (int64_t[]){hq, hd}, 51);
  float *hk = rand_tensor(&kc, RA_DTYPE_F32, 3, (int64_t[]){ctx, hkv, hd}, 52);
  float *hv = rand_tensor(&vc, RA_DTYPE_F32, 3, (int64_t[]){ctx, hkv, hd}, 53);
  ra_tensor *outs[4] = {&o1, &ml1, &o2, &ml2};
  for (int i = 0; i < 4; i++)
    assert_int_equal(ra_tensor_new(be, outs[i], RA_DTYPE_F32, 2, (int64_t[]){hq, i % 2 ? 2 : hd}, NULL), RA_OK);
  /* sink [0, 4) + window [600, 700) in one call, and the middle [4, 600) in another */
  ra_token_range sw[2] = {{0, 4}, {600, 700}}, mid = {4, 600};
  assert_int_equal(be->ops->attn_decode(be, &q, &kc, &vc, sw, 2, scale, &o1, &ml1, NULL), RA_OK);
  assert_int_equal(be->ops->attn_decode(be, &q, &kc, &vc, &mid, 1, scale, &o2, &ml2, NULL), RA_OK);
  float *m1 = fetch(&ml1), *po1 = fetch(&o1);
  /* per-head reference partial of the sink+window set, gathered contiguously */
  float *gk = malloc(sizeof(float) * 104 * (size_t)hd), *gv = malloc(sizeof(float) * 104 * (size_t)hd);
  float ref_o[32];
  for (int64_t h = 0; h < hq; h++) {
    int64_t g = h / (hq / hkv), r = 0;
    for (int s = 0; s < 2; s++)
      for (int64_t t = sw[s].begin; t < sw[s].end; t++, r++) {
        memcpy(gk + r * hd, hk + (t * hkv + g) * hd, (size_t)hd * sizeof(float));
        memcpy(gv + r * hd, hv + (t * hkv + g) * hd, (size_t)hd * sizeof(float));
      }
    ra_partial p = {ref_o, 0, 0};
    ra_partial_attend_f32(hqv + h * hd, gk, gv, 104, (int)hd, scale, &p);
    assert_true(fabsf(m1[2 * h] - p.m) < 1e-5f);
    assert_true(fabsf(m1[2 * h + 1] - p.l) < 1e-4f * p.l);
    assert_close(po1 + h * hd, ref_o, (size_t)hd, 1e-5f);
  }
  /* merging the two partials equals attention over the whole cache */
  assert_int_equal(be->ops->attn_merge(be, &o1, &ml1, &o2, &ml2, NULL), RA_OK);
  float *merged = fetch(&o1), *want = malloc(sizeof(float) * (size_t)(hq * hd));
  naive_attention(hqv, hk, hv, 1, ctx - 1, hq, hkv, hd, scale, want);
  assert_close(merged, want, (size_t)(hq * hd), 1e-5f);
  /* an empty range set is the merge identity */
  assert_int_equal(be->ops->attn_decode(be, &q, &kc, &vc, NULL, 0, scale, &o2, &ml2, NULL), RA_OK);
  float *e = fetch(&ml2);
  assert_true(isinf(e[0]) && e[0] < 0 && e[1] == 0.0f);
  ra_error err;
  ra_token_range bad = {650, 701};
  assert_int_equal(be->ops->attn_decode(be, &q, &kc, &vc, &bad, 1, scale, &o2, &ml2, &err), RA_EINVAL);
  free(hqv), free(hk), free(hv), free(m1), free(po1), free(gk), free(gv), free(merged), free(want), free(e);
  ra_tensor_free(&q), ra_tensor_free(&kc), ra_tensor_free(&vc);
  for (int i = 0; i < 4; i++) ra_tensor_free(outs[i]);
}

/* attn_decode_batch: each sequence's partial is its own attn_decode over [0, n); sequences of
 * another geometry, or past their cache, are refused. */
static void test_attn_decode_batch(void **state) {
  (void)state;
  int64_t hq = 8, hkv = 2, hd = 16, ctx = 300, lens[3] = {1, 77, 300};
  float scale = 0.25f;
  ra_tensor q[3], kc[3], vc[3], o[3], ml[3], o1, ml1;
  float *host[9];
  ra_attn_decode_item it[3];
  for (int i = 0; i < 3; i++) {
    host[3 * i] = rand_tensor(&q[i], RA_DTYPE_F32, 2, (int64_t[]){hq, hd}, 60 + (uint64_t)i);
    host[3 * i + 1] = rand_tensor(&kc[i], RA_DTYPE_F16, 3, (int64_t[]){ctx, hkv, hd}, 70 + (uint64_t)i);
    host[3 * i + 2] = rand_tensor(&vc[i], RA_DTYPE_F16, 3, (int64_t[]){ctx, hkv, hd}, 80 + (uint64_t)i);
    assert_int_equal(ra_tensor_new(be, &o[i], RA_DTYPE_F32, 2, (int64_t[]){hq, hd}, NULL), RA_OK);
    assert_int_equal(ra_tensor_new(be, &ml[i], RA_DTYPE_F32, 2, (int64_t[]){hq, 2}, NULL), RA_OK);
    it[i] = (ra_attn_decode_item){&q[i], &kc[i], &vc[i], lens[i], &o[i], &ml[i]};
  }
  assert_int_equal(ra_tensor_new(be, &o1, RA_DTYPE_F32, 2, (int64_t[]){hq, hd}, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ml1, RA_DTYPE_F32, 2, (int64_t[]){hq, 2}, NULL), RA_OK);
  assert_int_equal(be->ops->attn_decode_batch(be, it, 3, scale, NULL), RA_OK);
  for (int i = 0; i < 3; i++) {
    ra_token_range all = {0, lens[i]};
    assert_int_equal(be->ops->attn_decode(be, &q[i], &kc[i], &vc[i], &all, 1, scale, &o1, &ml1, NULL), RA_OK);
    float *a = fetch(&o[i]), *b = fetch(&o1), *am = fetch(&ml[i]), *bm = fetch(&ml1);
    assert_memory_equal(a, b, sizeof(float) * (size_t)(hq * hd));
    assert_memory_equal(am, bm, sizeof(float) * (size_t)(hq * 2));
    free(a), free(b), free(am), free(bm);
  }
  ra_error err;
  it[1].n = ctx + 1;
  assert_int_equal(be->ops->attn_decode_batch(be, it, 3, scale, &err), RA_EINVAL);
  it[1].n = lens[1];
  it[2].k_cache = &q[0]; /* not a cache */
  assert_int_equal(be->ops->attn_decode_batch(be, it, 3, scale, &err), RA_EINVAL);
  assert_int_equal(be->ops->attn_decode_batch(be, it, 0, scale, &err), RA_EINVAL);
  for (int i = 0; i < 9; i++) free(host[i]);
  for (int i = 0; i < 3; i++) {
    ra_tensor_free(&q[i]), ra_tensor_free(&kc[i]), ra_tensor_free(&vc[i]);
    ra_tensor_free(&o[i]), ra_tensor_free(&ml[i]);
  }
  ra_tensor_free(&o1), ra_tensor_free(&ml1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_alloc),
      cmocka_unit_test(test_download_raw),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_rmsnorm_swiglu_get_rows),
      cmocka_unit_test(test_set_rows),
      cmocka_unit_test(test_get_rows_dtypes),
      cmocka_unit_test(test_rope_styles),
      cmocka_unit_test(test_rope_store_batch),
      cmocka_unit_test(test_copy_convert_and_fill),
      cmocka_unit_test(test_topk_rows),
      cmocka_unit_test(test_attn_prefill_matches_naive),
      cmocka_unit_test(test_attn_decode_partials_merge),
      cmocka_unit_test(test_attn_decode_batch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
