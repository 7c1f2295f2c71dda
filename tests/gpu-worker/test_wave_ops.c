/* The CPU backend's wave ops (cluster_keys, wave_select, wave_estimate) against references
 * written here from backend.h's definitions, in double precision; and how many clusters the
 * zones' budgets take (wave.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "half.h"
#include "wave.h"

#include "cpu_fixture.h"

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  assert_non_null(p);
  return p;
}

/* A tensor holding host values h (read back, so h holds exactly what a 16-bit tensor stores). */
static void tensor_from(ra_tensor *t, ra_dtype dt, int ndim, const int64_t *shape, float *h) {
  assert_int_equal(ra_tensor_new(be, t, dt, ndim, shape, NULL), RA_OK);
  size_t n = ra_tensor_nelem(t);
  assert_int_equal(be->ops->upload(be, t, 0, h, n, NULL), RA_OK);
  assert_int_equal(be->ops->download(be, t, 0, h, n, NULL), RA_OK);
}

static float *fetch(const ra_tensor *t) {
  size_t n = ra_tensor_nelem(t);
  float *h = xcalloc(n, sizeof(float));
  assert_int_equal(be->ops->download(be, t, 0, h, n, NULL), RA_OK);
  return h;
}

/* ---------- reference clustering (backend.h's definition, in double) ---------- */

static void ref_cluster(const float *keys, int64_t hkv, int64_t hd, int64_t row0, int64_t n,
                        const ra_wave_cluster_params *p, int32_t *perm, int32_t *counts) {
  int64_t L = p->seg_len < n ? p->seg_len : n, KS = (L + p->cluster_size - 1) / p->cluster_size;
  int64_t K = ra_wave_n_clusters(n, p->seg_len, p->cluster_size);
  double *x = xcalloc((size_t)(L * hd), sizeof(double)), *c = xcalloc((size_t)(KS * hd), sizeof(double));
  double *sum = xcalloc((size_t)(KS * hd), sizeof(double));
  int32_t *a = xcalloc((size_t)L, sizeof(int32_t)), *cnt = xcalloc((size_t)KS, sizeof(int32_t));
  for (int64_t h = 0; h < hkv; h++)
    for (int64_t t0 = 0, seg = 0; t0 < n; t0 += L, seg++) {
      int64_t len = n - t0 < L ? n - t0 : L, k = (len + p->cluster_size - 1) / p->cluster_size;
      for (int64_t d = 0; d < hd; d++) {
        double mu = 0;
        for (int64_t t = 0; t < len; t++) mu += keys[((row0 + t0 + t) * hkv + h) * hd + d];
        mu /= (double)len;
        for (int64_t t = 0; t < len; t++) x[t * hd + d] = keys[((row0 + t0 + t) * hkv + h) * hd + d] - mu;
      }
      for (int64_t t = 0; t < len; t++) {
        double ss = 0;
        for (int64_t d = 0; d < hd; d++) ss += x[t * hd + d] * x[t * hd + d];
        for (int64_t d = 0; d < hd; d++) x[t * hd + d] = ss > 0 ? x[t * hd + d] / sqrt(ss) : 0.0;
      }
      for (int64_t j = 0; j < k; j++) memcpy(c + j * hd, x + (j * len / k) * hd, sizeof(double) * (size_t)hd);
      for (int64_t t = 0; t < len; t++) a[t] = -1;
      for (int it = 0; it < p->iters; it++) {
        int changed = 0;
        for (int64_t t = 0; t < len; t++) {
          int32_t best = 0;
          double bs = -1e300;
          for (int64_t j = 0; j < k; j++) {
            double s = 0;
            for (int64_t d = 0; d < hd; d++) s += x[t * hd + d] * c[j * hd + d];
            if (s > bs) bs = s, best = (int32_t)j;
          }
          changed |= a[t] != best;
          a[t] = best;
        }
        if (!changed) break;
        memset(sum, 0, sizeof(double) * (size_t)(k * hd));
        memset(cnt, 0, sizeof(int32_t) * (size_t)k);
        for (int64_t t = 0; t < len; t++) {
          cnt[a[t]]++;
          for (int64_t d = 0; d < hd; d++) sum[a[t] * hd + d] += x[t * hd + d];
        }
        for (int64_t j = 0; j < k; j++) {
          double ss = 0;
          for (int64_t d = 0; d < hd; d++) ss += sum[j * hd + d] * sum[j * hd + d];
          if (cnt[j] && ss > 0)
            for (int64_t d = 0; d < hd; d++) c[j * hd + d] = sum[j * hd + d] / sqrt(ss);
        }
      }
      int64_t pos = t0;
      for (int64_t j = 0; j < k; j++) {
        int32_t m = 0;
        for (int64_t t = 0; t < len; t++)
          if (a[t] == j) perm[h * n + pos++] = (int32_t)(t0 + t), m++;
        counts[h * K + seg * KS + j] = m;
      }
    }
  free(x), free(c), free(sum), free(a), free(cnt);
}

/* ---------- clustering checks ---------- */

typedef struct wave_case {
  int64_t hkv, hd, n_ctx, row0, n, c0, cap;
  ra_wave_cluster_params p;
  ra_dtype kv_dtype, out_dtype;
} wave_case;

typedef struct wave_out {
  int64_t K;
  int32_t *perm, *counts;
  float *centroid, *size, *vsum, *out_k, *out_v;
} wave_out;

static void wave_out_free(wave_out *o) {
  free(o->perm), free(o->counts), free(o->centroid), free(o->size), free(o->vsum), free(o->out_k), free(o->out_v);
}

#define SENTINEL 7.5f

/* Runs cluster_keys on host keys/vals [n_ctx, hkv, hd] (rounded to the case's dtype in place). */
static wave_out run_cluster(const wave_case *wc, float *keys, float *vals) {
  wave_out o;
  memset(&o, 0, sizeof o);
  int64_t hkv = wc->hkv, hd = wc->hd;
  ra_tensor kc, vc, cen, sz, vs, ok, ov;
  int64_t cs[3] = {wc->n_ctx, hkv, hd}, cl[3] = {hkv, wc->cap, hd}, os[3] = {hkv, wc->n, hd};
  tensor_from(&kc, wc->kv_dtype, 3, cs, keys);
  tensor_from(&vc, wc->kv_dtype, 3, cs, vals);
  float *fill = xcalloc((size_t)(hkv * wc->cap * hd), sizeof(float));
  for (int64_t i = 0; i < hkv * wc->cap * hd; i++) fill[i] = SENTINEL;
  tensor_from(&cen, RA_DTYPE_F32, 3, cl, fill);
  tensor_from(&vs, RA_DTYPE_F32, 3, cl, fill);
  tensor_from(&sz, RA_DTYPE_F32, 2, cl, fill);
  free(fill);
  assert_int_equal(ra_tensor_new(be, &ok, wc->out_dtype, 3, os, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ov, wc->out_dtype, 3, os, NULL), RA_OK);
  o.K = ra_wave_n_clusters(wc->n, wc->p.seg_len, wc->p.cluster_size);
  o.perm = xcalloc((size_t)(hkv * wc->n), sizeof(int32_t));
  o.counts = xcalloc((size_t)(hkv * o.K), sizeof(int32_t));
  ra_error err;
  int rc = be->ops->cluster_keys(be, &kc, &vc, wc->row0, wc->n, &wc->p, &cen, &sz, &vs, wc->c0, &ok, &ov, o.perm,
                                 o.counts, &err);
  if (rc) fail_msg("cluster_keys: %s", err.msg);
  o.centroid = fetch(&cen), o.size = fetch(&sz), o.vsum = fetch(&vs), o.out_k = fetch(&ok), o.out_v = fetch(&ov);
  ra_tensor_free(&kc), ra_tensor_free(&vc), ra_tensor_free(&cen), ra_tensor_free(&sz), ra_tensor_free(&vs);
  ra_tensor_free(&ok), ra_tensor_free(&ov);
  return o;
}

static float round_to(ra_dtype dt, float v) {
  if (dt == RA_DTYPE_F16) return ra_fp16_to_fp32(ra_fp32_to_fp16(v));
  if (dt == RA_DTYPE_BF16) return ra_bf16_to_fp32(ra_fp32_to_bf16(v));
  return v;
}

/* The structure of a clustering and every quantity recomputed from its assignment; with
 * check_best, also that every row's cluster scores best (to 1e-5) among the non-empty clusters'
 * spherical centroids recomputed from the assignment (a converged k-means). */
static void check_clustering(const wave_case *wc, const float *keys, const float *vals, const wave_out *o,
                             int check_best) {
  int64_t hkv = wc->hkv, hd = wc->hd, n = wc->n, cap = wc->cap;
  int64_t L = wc->p.seg_len < n ? wc->p.seg_len : n, KS = (L + wc->p.cluster_size - 1) / wc->p.cluster_size;
  char *seen = xcalloc((size_t)n, 1);
  double *x = xcalloc((size_t)(L * hd), sizeof(double)), *sc = xcalloc((size_t)(KS * hd), sizeof(double));
  int32_t *own = xcalloc((size_t)L, sizeof(int32_t));
  for (int64_t h = 0; h < hkv; h++) {
    memset(seen, 0, (size_t)n);
    for (int64_t c = 0; c < cap; c++)
      if (c < wc->c0 || c >= wc->c0 + o->K) {
        assert_true(o->size[h * cap + c] == SENTINEL);
        assert_true(o->centroid[(h * cap + c) * hd] == SENTINEL && o->vsum[(h * cap + c) * hd + hd - 1] == SENTINEL);
      }
    for (int64_t t0 = 0, seg = 0; t0 < n; t0 += L, seg++) {
      int64_t len = n - t0 < L ? n - t0 : L, k = (len + wc->p.cluster_size - 1) / wc->p.cluster_size, pos = t0;
      for (int64_t j = 0; j < k; j++) {
        int64_t cnt = o->counts[h * o->K + seg * KS + j], slot = h * cap + wc->c0 + seg * KS + j;
        assert_true(cnt >= 0 && pos + cnt <= t0 + len);
        assert_true(o->size[slot] == (float)cnt);
        for (int64_t d = 0; d < hd; d++) {
          double ks = 0, vsm = 0;
          for (int64_t i = 0; i < cnt; i++) {
            int64_t r = o->perm[h * n + pos + i];
            if (d == 0) {
              assert_true(r >= t0 && r < t0 + len && !seen[r]);
              assert_true(i == 0 || r > o->perm[h * n + pos + i - 1]); /* ascending inside a cluster */
              seen[r] = 1;
              own[r - t0] = (int32_t)j;
            }
            ks += keys[((wc->row0 + r) * hkv + h) * hd + d];
            vsm += vals[((wc->row0 + r) * hkv + h) * hd + d];
          }
          double mean = cnt ? ks / (double)cnt : 0.0;
          float gc = o->centroid[slot * hd + d], gv = o->vsum[slot * hd + d];
          if (!(fabs(gc - mean) <= 1e-5 * (1 + fabs(mean)))) fail_msg("centroid %g vs %g", gc, mean);
          if (!(fabs(gv - vsm) <= 1e-5 * (1 + fabs(vsm)))) fail_msg("vsum %g vs %g", gv, vsm);
        }
        pos += cnt;
      }
      assert_int_equal(pos, t0 + len); /* the segment's rows, all of them */
      if (!check_best) continue;
      for (int64_t d = 0; d < hd; d++) {
        double mu = 0;
        for (int64_t t = 0; t < len; t++) mu += keys[((wc->row0 + t0 + t) * hkv + h) * hd + d];
        mu /= (double)len;
        for (int64_t t = 0; t < len; t++) x[t * hd + d] = keys[((wc->row0 + t0 + t) * hkv + h) * hd + d] - mu;
      }
      for (int64_t t = 0; t < len; t++) {
        double ss = 0;
        for (int64_t d = 0; d < hd; d++) ss += x[t * hd + d] * x[t * hd + d];
        for (int64_t d = 0; d < hd; d++) x[t * hd + d] = ss > 0 ? x[t * hd + d] / sqrt(ss) : 0.0;
      }
      memset(sc, 0, sizeof(double) * (size_t)(k * hd));
      for (int64_t t = 0; t < len; t++)
        for (int64_t d = 0; d < hd; d++) sc[own[t] * hd + d] += x[t * hd + d];
      for (int64_t j = 0; j < k; j++) {
        double ss = 0;
        for (int64_t d = 0; d < hd; d++) ss += sc[j * hd + d] * sc[j * hd + d];
        for (int64_t d = 0; d < hd; d++) sc[j * hd + d] = ss > 0 ? sc[j * hd + d] / sqrt(ss) : NAN;
      }
      for (int64_t t = 0; t < len; t++) {
        double mine = 0, best = -1e300;
        for (int64_t j = 0; j < k; j++) {
          if (isnan(sc[j * hd])) continue; /* empty: its kept centroid is not recomputable */
          double s = 0;
          for (int64_t d = 0; d < hd; d++) s += x[t * hd + d] * sc[j * hd + d];
          if (j == own[t]) mine = s;
          best = s > best ? s : best;
        }
        if (!isnan(sc[own[t] * hd]) && mine < best - 1e-5) fail_msg("row %lld: score %g, best %g", (long long)t, mine, best);
      }
    }
    for (int64_t i = 0; i < n; i++) {
      int64_t r = o->perm[h * n + i];
      for (int64_t d = 0; d < hd; d++) {
        float k = keys[((wc->row0 + r) * hkv + h) * hd + d], v = vals[((wc->row0 + r) * hkv + h) * hd + d];
        assert_true(o->out_k[(h * n + i) * hd + d] == round_to(wc->out_dtype, k));
        assert_true(o->out_v[(h * n + i) * hd + d] == round_to(wc->out_dtype, v));
      }
    }
  }
  free(seen), free(x), free(sc), free(own);
}

/* Keys in well-separated clusters per (kv head, segment): row t of a segment is centre[label]
 * + small noise + an offset per head (removed by the centring), with the init rows (floor(j *
 * len / k)) forced to label j so that every cluster has its seed. Values uniform. */
static void make_clustered(const wave_case *wc, uint64_t seed, float noise, float *keys, float *vals) {
  int64_t hkv = wc->hkv, hd = wc->hd, n = wc->n, L = wc->p.seg_len < n ? wc->p.seg_len : n;
  int64_t KS = (L + wc->p.cluster_size - 1) / wc->p.cluster_size;
  float *centre = xcalloc((size_t)(KS * hd), sizeof(float)), *off = xcalloc((size_t)hd, sizeof(float));
  int32_t *label = xcalloc((size_t)L, sizeof(int32_t));
  for (int64_t i = 0; i < wc->n_ctx * hkv * hd; i++) keys[i] = frand(&seed), vals[i] = frand(&seed);
  for (int64_t h = 0; h < hkv; h++) {
    for (int64_t d = 0; d < hd; d++) off[d] = 2.0f * frand(&seed);
    for (int64_t t0 = 0; t0 < n; t0 += L) {
      int64_t len = n - t0 < L ? n - t0 : L, k = (len + wc->p.cluster_size - 1) / wc->p.cluster_size;
      for (int64_t i = 0; i < k * hd; i++) centre[i] = frand(&seed);
      for (int64_t t = 0; t < len; t++) label[t] = (int32_t)(((seed = seed * 6364136223846793005ull + 1) >> 33) % (uint64_t)k);
      for (int64_t j = 0; j < k; j++) label[j * len / k] = (int32_t)j;
      for (int64_t t = 0; t < len; t++)
        for (int64_t d = 0; d < hd; d++)
          keys[((wc->row0 + t0 + t) * hkv + h) * hd + d] = off[d] + centre[label[t] * hd + d] + noise * frand(&seed);
    }
  }
  free(centre), free(off), free(label);
}

static void test_n_clusters(void **state) {
  (void)state;
  assert_int_equal(ra_wave_n_clusters(300, 128, 16), 8 + 8 + 3);
  assert_int_equal(ra_wave_n_clusters(256, 128, 16), 16);
  assert_int_equal(ra_wave_n_clusters(1, 8192, 16), 1);
  assert_int_equal(ra_wave_n_clusters(100, 1000, 16), 7);
  assert_int_equal(ra_wave_n_clusters(0, 8, 2), 0);
  assert_int_equal(ra_wave_n_clusters(10, 0, 2), -1);
  assert_int_equal(ra_wave_n_clusters(10, 4, 0), -1);
}

static void test_cluster_separated(void **state) {
  (void)state;
  const ra_dtype dts[3] = {RA_DTYPE_F32, RA_DTYPE_F16, RA_DTYPE_BF16};
  for (int i = 0; i < 3; i++) {
    /* 300 rows: segments of 128, 128, 44 (8, 8, 3 clusters) at rows [5, 305), clusters from 3 */
    wave_case wc = {2, 16, 310, 5, 300, 3, 27, {128, 16, 10}, dts[i], i == 2 ? RA_DTYPE_F32 : RA_DTYPE_BF16};
    size_t nel = (size_t)(wc.n_ctx * wc.hkv * wc.hd);
    float *keys = xcalloc(nel, sizeof(float)), *vals = xcalloc(nel, sizeof(float));
    make_clustered(&wc, 11 + (uint64_t)i, 0.05f, keys, vals);
    wave_out o = run_cluster(&wc, keys, vals);
    check_clustering(&wc, keys, vals, &o, 1);
    int32_t *perm = xcalloc((size_t)(wc.hkv * wc.n), sizeof(int32_t)), *cnt = xcalloc((size_t)(wc.hkv * o.K), 4);
    ref_cluster(keys, wc.hkv, wc.hd, wc.row0, wc.n, &wc.p, perm, cnt);
    assert_memory_equal(perm, o.perm, sizeof(int32_t) * (size_t)(wc.hkv * wc.n));
    assert_memory_equal(cnt, o.counts, sizeof(int32_t) * (size_t)(wc.hkv * o.K));
    free(perm), free(cnt), free(keys), free(vals);
    wave_out_free(&o);
  }
}

static void test_cluster_random(void **state) {
  (void)state;
  const struct {
    int64_t n, seg, cs;
    int iters, converge;
  } cases[] = {{200, 64, 8, 1, 0}, {200, 64, 8, 3, 0}, {200, 64, 8, 500, 1}, {50, 64, 8, 500, 1}, {77, 20, 3, 500, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    wave_case wc = {3, 8, cases[i].n + 9, 9, cases[i].n, 0, 0, {cases[i].seg, cases[i].cs, cases[i].iters},
                    RA_DTYPE_F32, RA_DTYPE_F32};
    wc.cap = ra_wave_n_clusters(wc.n, wc.p.seg_len, wc.p.cluster_size);
    size_t nel = (size_t)(wc.n_ctx * wc.hkv * wc.hd);
    float *keys = xcalloc(nel, sizeof(float)), *vals = xcalloc(nel, sizeof(float));
    uint64_t seed = 100 + i;
    for (size_t j = 0; j < nel; j++) keys[j] = frand(&seed), vals[j] = frand(&seed);
    wave_out o = run_cluster(&wc, keys, vals);
    check_clustering(&wc, keys, vals, &o, cases[i].converge);
    if (!cases[i].converge) { /* few iterations: the very assignment of the definition */
      int32_t *perm = xcalloc((size_t)(wc.hkv * wc.n), 4), *cnt = xcalloc((size_t)(wc.hkv * o.K), 4);
      ref_cluster(keys, wc.hkv, wc.hd, wc.row0, wc.n, &wc.p, perm, cnt);
      assert_memory_equal(perm, o.perm, sizeof(int32_t) * (size_t)(wc.hkv * wc.n));
      assert_memory_equal(cnt, o.counts, sizeof(int32_t) * (size_t)(wc.hkv * o.K));
      free(perm), free(cnt);
    }
    free(keys), free(vals);
    wave_out_free(&o);
  }
}

/* Identical keys in a head: every x is 0, all rows tie into cluster 0, the others stay empty
 * (size 0, centroid and vsum 0, no NaN). Two distinct keys (seeds of both among the init
 * rows): two clusters, the rest empty. */
static void test_cluster_degenerate(void **state) {
  (void)state;
  wave_case wc = {2, 4, 40, 0, 40, 1, 12, {40, 4, 5}, RA_DTYPE_F32, RA_DTYPE_F32};
  size_t nel = (size_t)(wc.n_ctx * wc.hkv * wc.hd);
  float *keys = xcalloc(nel, sizeof(float)), *vals = xcalloc(nel, sizeof(float));
  uint64_t seed = 5;
  for (int64_t t = 0; t < wc.n; t++)
    for (int64_t d = 0; d < wc.hd; d++) {
      keys[(t * 2 + 0) * wc.hd + d] = 0.5f + (float)d;
      keys[(t * 2 + 1) * wc.hd + d] = (t % 3 == 0 ? 1.0f : -1.0f) * (float)(d + 1);
      vals[(t * 2) * wc.hd + d] = frand(&seed), vals[(t * 2 + 1) * wc.hd + d] = frand(&seed);
    }
  wave_out o = run_cluster(&wc, keys, vals);
  check_clustering(&wc, keys, vals, &o, 0);
  assert_int_equal(o.K, 10);
  assert_int_equal(o.counts[0], 40);
  int nonempty = 0;
  for (int j = 0; j < 10; j++) nonempty += o.counts[10 + j] > 0;
  assert_int_equal(nonempty, 2);
  for (int64_t i = 0; i < wc.hkv * wc.cap * wc.hd; i++) assert_false(isnan(o.centroid[i]) || isnan(o.vsum[i]));
  for (int j = 1; j < 10; j++) assert_true(o.size[1 + j] == 0.0f && o.centroid[(1 + j) * wc.hd] == 0.0f);
  free(keys), free(vals);
  wave_out_free(&o);
}

/* ---------- select / estimate ---------- */

typedef struct sel_case {
  int64_t hq, hkv, hd, cap, nc;
  int r, e;
} sel_case;

typedef struct sel_data {
  float *q, *c, *s, *v;
  ra_tensor tq, tc, ts, tv;
} sel_data;

/* Random q [hq, hd], centroids and value sums [hkv, cap, hd], sizes in {0..20} (every 7th 0). */
static sel_data make_sel(const sel_case *sc, uint64_t seed, int tie_pairs) {
  sel_data d;
  int64_t cl = sc->hkv * sc->cap;
  d.q = xcalloc((size_t)(sc->hq * sc->hd), sizeof(float));
  d.c = xcalloc((size_t)(cl * sc->hd), sizeof(float));
  d.v = xcalloc((size_t)(cl * sc->hd), sizeof(float));
  d.s = xcalloc((size_t)cl, sizeof(float));
  for (int64_t i = 0; i < sc->hq * sc->hd; i++) d.q[i] = 3.0f * frand(&seed);
  for (int64_t i = 0; i < cl * sc->hd; i++) d.c[i] = frand(&seed), d.v[i] = 5.0f * frand(&seed);
  for (int64_t i = 0; i < cl; i++) d.s[i] = i % 7 == 3 ? 0.0f : (float)(1 + (int)((frand(&seed) + 1.0f) * 10.0f));
  if (tie_pairs) /* cluster 2j + 1 duplicates cluster 2j: equal scores, the lower index first */
    for (int64_t i = 0; i + 1 < cl; i += 2) {
      memcpy(d.c + (i + 1) * sc->hd, d.c + i * sc->hd, sizeof(float) * (size_t)sc->hd);
      d.s[i + 1] = d.s[i];
    }
  int64_t qs[2] = {sc->hq, sc->hd}, cs[3] = {sc->hkv, sc->cap, sc->hd}, ss[2] = {sc->hkv, sc->cap};
  tensor_from(&d.tq, RA_DTYPE_F32, 2, qs, d.q);
  tensor_from(&d.tc, RA_DTYPE_F32, 3, cs, d.c);
  tensor_from(&d.tv, RA_DTYPE_F32, 3, cs, d.v);
  tensor_from(&d.ts, RA_DTYPE_F32, 2, ss, d.s);
  return d;
}

static void free_sel(sel_data *d) {
  free(d->q), free(d->c), free(d->s), free(d->v);
  ra_tensor_free(&d->tq), ra_tensor_free(&d->tc), ra_tensor_free(&d->ts), ra_tensor_free(&d->tv);
}

/* Brute-force ranking: the group-summed softmax of scale q.c + log(size), size 0 last. */
static void ref_select(const sel_case *sc, const sel_data *d, float scale, int32_t *idx) {
  int64_t group = sc->hq / sc->hkv, nc = sc->nc, ld = sc->r + sc->e;
  double *key = xcalloc((size_t)(nc ? nc : 1), sizeof(double)), *z = xcalloc((size_t)(nc ? nc : 1), sizeof(double));
  char *used = xcalloc((size_t)(nc ? nc : 1), 1);
  for (int64_t h = 0; h < sc->hkv; h++) {
    for (int64_t c = 0; c < nc; c++) key[c] = d->s[h * sc->cap + c] > 0 ? 0.0 : -INFINITY;
    for (int64_t g = 0; g < group; g++) {
      double m = -INFINITY, l = 0;
      for (int64_t c = 0; c < nc; c++) {
        double dot = 0, sz = d->s[h * sc->cap + c];
        for (int64_t i = 0; i < sc->hd; i++) dot += (double)d->q[(h * group + g) * sc->hd + i] * d->c[(h * sc->cap + c) * sc->hd + i];
        z[c] = sz > 0 ? scale * dot + log(sz) : -INFINITY;
        m = z[c] > m ? z[c] : m;
      }
      for (int64_t c = 0; c < nc; c++) l += exp(z[c] - m);
      for (int64_t c = 0; c < nc; c++)
        if (d->s[h * sc->cap + c] > 0) key[c] += exp(z[c] - m) / l;
    }
    memset(used, 0, (size_t)(nc ? nc : 1));
    for (int64_t i = 0; i < ld; i++) {
      int64_t best = -1;
      for (int64_t c = 0; c < nc; c++)
        if (!used[c] && (best < 0 || key[c] > key[best])) best = c;
      idx[h * ld + i] = (int32_t)best;
      if (best >= 0) used[best] = 1;
    }
  }
  free(key), free(z), free(used);
}

/* Brute-force estimate from the definition, per q head. */
static void ref_estimate(const sel_case *sc, const sel_data *d, const int32_t *ids, int n_ids, int64_t ld, float scale,
                         float *o, float *ml) {
  int64_t group = sc->hq / sc->hkv, hd = sc->hd;
  for (int64_t h = 0; h < sc->hq; h++) {
    int64_t kvh = h / group;
    double m = -INFINITY, l = 0, acc[256] = {0};
    for (int pass = 0; pass < 2; pass++)
      for (int j = 0; j < n_ids; j++) {
        int32_t c = ids[kvh * ld + j];
        if (c < 0 || d->s[kvh * sc->cap + c] <= 0) continue;
        double z = 0;
        for (int64_t i = 0; i < hd; i++) z += (double)d->q[h * hd + i] * d->c[(kvh * sc->cap + c) * hd + i];
        z *= scale;
        if (pass == 0) {
          m = z > m ? z : m;
          continue;
        }
        l += d->s[kvh * sc->cap + c] * exp(z - m);
        for (int64_t i = 0; i < hd; i++) acc[i] += exp(z - m) * d->v[(kvh * sc->cap + c) * hd + i];
      }
    for (int64_t i = 0; i < hd; i++) o[h * hd + i] = l > 0 ? (float)(acc[i] / l) : 0.0f;
    ml[2 * h] = (float)m;
    ml[2 * h + 1] = (float)l;
  }
}

static void assert_partial(const float *o, const float *ml, const float *ro, const float *rml, int64_t hq, int64_t hd) {
  for (int64_t h = 0; h < hq; h++) {
    if (isinf(rml[2 * h])) {
      assert_true(isinf(ml[2 * h]) && ml[2 * h] < 0 && ml[2 * h + 1] == 0.0f);
    } else {
      if (!(fabsf(ml[2 * h] - rml[2 * h]) <= 1e-5f * (1 + fabsf(rml[2 * h])))) fail_msg("m %g vs %g", ml[2 * h], rml[2 * h]);
      if (!(fabsf(ml[2 * h + 1] - rml[2 * h + 1]) <= 1e-5f * rml[2 * h + 1])) fail_msg("l %g vs %g", ml[2 * h + 1], rml[2 * h + 1]);
    }
    for (int64_t i = 0; i < hd; i++)
      if (!(fabsf(o[h * hd + i] - ro[h * hd + i]) <= 1e-5f * (1 + fabsf(ro[h * hd + i]))))
        fail_msg("o[%lld][%lld] %g vs %g", (long long)h, (long long)i, o[h * hd + i], ro[h * hd + i]);
  }
}

static void test_select_and_fused_estimate(void **state) {
  (void)state;
  const struct {
    sel_case sc;
    int ties;
  } cases[] = {
      {{8, 2, 16, 60, 50, 5, 10}, 0},  {{8, 2, 16, 60, 50, 5, 10}, 1}, /* duplicated clusters */
      {{6, 3, 8, 20, 7, 5, 10}, 0},                                   /* r + e > n_clusters: -1 */
      {{4, 4, 8, 20, 20, 0, 6}, 0},    {{4, 1, 32, 300, 257, 9, 0}, 0}, /* no retrieval / no estimation zone */
      {{4, 2, 8, 10, 0, 2, 3}, 0},                                    /* no clusters at all */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const sel_case *sc = &cases[i].sc;
    sel_data d = make_sel(sc, 300 + i, cases[i].ties);
    float scale = 1.0f / sqrtf((float)sc->hd);
    int64_t ld = sc->r + sc->e;
    int32_t *idx = xcalloc((size_t)(sc->hkv * ld), 4), *ref = xcalloc((size_t)(sc->hkv * ld), 4);
    ra_tensor o, ml;
    int64_t os[2] = {sc->hq, sc->hd}, ms[2] = {sc->hq, 2};
    assert_int_equal(ra_tensor_new(be, &o, RA_DTYPE_F32, 2, os, NULL), RA_OK);
    assert_int_equal(ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, ms, NULL), RA_OK);
    ra_error err;
    int rc = be->ops->wave_select(be, &d.tq, &d.tc, &d.ts, sc->nc, scale, sc->r, sc->e, idx, &d.tv, &o, &ml, &err);
    if (rc) fail_msg("wave_select: %s", err.msg);
    ref_select(sc, &d, scale, ref);
    assert_memory_equal(idx, ref, sizeof(int32_t) * (size_t)(sc->hkv * ld));
    if (cases[i].ties) /* the pair (2j, 2j + 1) is adjacent, 2j first */
      for (int64_t j = 0; j + 1 < ld; j++)
        if (idx[j] % 2 == 0 && d.s[idx[j]] > 0) assert_int_equal(idx[j + 1], idx[j] + 1);
    float *go = fetch(&o), *gml = fetch(&ml), *ro = xcalloc((size_t)(sc->hq * sc->hd), 4), *rml = xcalloc((size_t)sc->hq * 2, 4);
    ref_estimate(sc, &d, ref + sc->r, sc->e, ld, scale, ro, rml);
    assert_partial(go, gml, ro, rml, sc->hq, sc->hd);
    /* without o/ml: the same ranking */
    memset(idx, 0x7f, sizeof(int32_t) * (size_t)(sc->hkv * ld));
    assert_int_equal(be->ops->wave_select(be, &d.tq, &d.tc, &d.ts, sc->nc, scale, sc->r, sc->e, idx, NULL, NULL, NULL, &err), RA_OK);
    assert_memory_equal(idx, ref, sizeof(int32_t) * (size_t)(sc->hkv * ld));
    free(idx), free(ref), free(go), free(gml), free(ro), free(rml);
    ra_tensor_free(&o), ra_tensor_free(&ml);
    free_sel(&d);
  }
}

/* wave_select_batch: every item as its own wave_select (the reference ranking and estimate);
 * a bad item anywhere fails the call, naming it, before any item is ranked. */
static void test_select_batch(void **state) {
  (void)state;
  enum { N = 3 };
  const sel_case cases[N] = {{8, 2, 16, 60, 50, 5, 10}, {4, 1, 32, 300, 257, 9, 0}, {6, 3, 8, 20, 7, 5, 10}};
  sel_data d[N];
  ra_tensor o[N], ml[N];
  int32_t *idx[N], *ref[N];
  ra_wave_select_item items[N];
  const float scale = 0.25f;
  for (int i = 0; i < N; i++) {
    const sel_case *sc = &cases[i];
    d[i] = make_sel(sc, 500 + (uint64_t)i, 0);
    int64_t ld = sc->r + sc->e, os[2] = {sc->hq, sc->hd}, ms[2] = {sc->hq, 2};
    idx[i] = xcalloc((size_t)(sc->hkv * ld), 4);
    ref[i] = xcalloc((size_t)(sc->hkv * ld), 4);
    assert_int_equal(ra_tensor_new(be, &o[i], RA_DTYPE_F32, 2, os, NULL), RA_OK);
    assert_int_equal(ra_tensor_new(be, &ml[i], RA_DTYPE_F32, 2, ms, NULL), RA_OK);
    const int est = i != 1; /* item 1 asks for no estimate */
    items[i] = (ra_wave_select_item){&d[i].tq, &d[i].tc, &d[i].ts, sc->nc, (int)sc->r, (int)sc->e, idx[i],
                                     est ? &d[i].tv : NULL, est ? &o[i] : NULL, est ? &ml[i] : NULL};
  }
  ra_error err;
  ra_wave_select_item bad[N] = {items[0], items[1], items[2]};
  bad[2].idx = NULL;
  assert_int_equal(be->ops->wave_select_batch(be, bad, N, scale, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "item 2"));
  for (int i = 0; i < N; i++) /* nothing ran: the first items' ids are untouched */
    for (int64_t j = 0; j < cases[i].hkv * (cases[i].r + cases[i].e); j++) assert_int_equal(idx[i][j], 0);
  assert_int_equal(be->ops->wave_select_batch(be, items, 0, scale, &err), RA_EINVAL);
  int rc = be->ops->wave_select_batch(be, items, N, scale, &err);
  if (rc) fail_msg("wave_select_batch: %s", err.msg);
  for (int i = 0; i < N; i++) {
    const sel_case *sc = &cases[i];
    int64_t ld = sc->r + sc->e;
    ref_select(sc, &d[i], scale, ref[i]);
    assert_memory_equal(idx[i], ref[i], sizeof(int32_t) * (size_t)(sc->hkv * ld));
    if (items[i].o) {
      float *go = fetch(&o[i]), *gml = fetch(&ml[i]), *ro = xcalloc((size_t)(sc->hq * sc->hd), 4),
            *rml = xcalloc((size_t)sc->hq * 2, 4);
      ref_estimate(sc, &d[i], ref[i] + sc->r, sc->e, ld, scale, ro, rml);
      assert_partial(go, gml, ro, rml, sc->hq, sc->hd);
      free(go), free(gml), free(ro), free(rml);
    }
    free(idx[i]), free(ref[i]);
    ra_tensor_free(&o[i]), ra_tensor_free(&ml[i]);
    free_sel(&d[i]);
  }
}

static void test_estimate(void **state) {
  (void)state;
  sel_case sc = {6, 2, 16, 40, 33, 0, 0};
  sel_data d = make_sel(&sc, 77, 0);
  float scale = 0.3f;
  /* kv head 0: a mix with -1 and size-0 (3, 10, 17) clusters; kv head 1: nothing valid (-1 or size 0) */
  int32_t ids[2 * 9] = {0, 3, -1, 12, 30, 10, 5, 32, 17, /* */ -1, 5, 12, -1, 19, 26, -1, -1, -1};
  float *ro = xcalloc((size_t)(sc.hq * sc.hd), 4), rml[12];
  ra_tensor o, ml;
  int64_t os[2] = {sc.hq, sc.hd}, ms[2] = {sc.hq, 2};
  assert_int_equal(ra_tensor_new(be, &o, RA_DTYPE_F32, 2, os, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, ms, NULL), RA_OK);
  assert_true(d.s[3] == 0 && d.s[10] == 0 && d.s[17] == 0);
  for (int j = 0; j < 9; j++) assert_true(ids[9 + j] < 0 || d.s[40 + ids[9 + j]] == 0);
  ra_error err;
  for (int n_ids = 9; n_ids >= 0; n_ids -= 9) {
    int rc = be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, sc.nc, ids, n_ids, 9, scale, &o, &ml, &err);
    if (rc) fail_msg("wave_estimate: %s", err.msg);
    float *go = fetch(&o), *gml = fetch(&ml);
    ref_estimate(&sc, &d, ids, n_ids, 9, scale, ro, rml);
    assert_partial(go, gml, ro, rml, sc.hq, sc.hd);
    for (int64_t h = 3; h < 6; h++) assert_true(isinf(gml[2 * h]) && gml[2 * h + 1] == 0.0f && go[h * sc.hd] == 0.0f);
    free(go), free(gml);
  }
  /* bad arguments */
  ids[4] = 33;
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, sc.nc, ids, 9, 9, scale, &o, &ml, &err), RA_EINVAL);
  ids[4] = -2;
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, sc.nc, ids, 9, 9, scale, &o, &ml, &err), RA_EINVAL);
  ids[4] = 30;
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, sc.nc, ids, 9, 8, scale, &o, &ml, &err), RA_EINVAL);
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, NULL, sc.nc, ids, 9, 9, scale, &o, &ml, &err), RA_EINVAL);
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, 41, ids, 9, 9, scale, &o, &ml, &err), RA_EINVAL);
  assert_int_equal(be->ops->wave_estimate(be, &d.tq, &d.tc, &d.ts, &d.tv, sc.nc, ids, 9, 9, scale, &ml, &o, &err), RA_EINVAL);
  free(ro);
  ra_tensor_free(&o), ra_tensor_free(&ml);
  free_sel(&d);
}

/* Rows of a cluster sharing one key: the estimate over every cluster is exact attention over
 * the rows (what "a key is approximated by its centroid" costs is zero there). */
static void test_estimate_exact_on_identical_keys(void **state) {
  (void)state;
  wave_case wc = {2, 16, 130, 2, 128, 0, 16, {64, 8, 10}, RA_DTYPE_F32, RA_DTYPE_F32};
  size_t nel = (size_t)(wc.n_ctx * wc.hkv * wc.hd);
  float *keys = xcalloc(nel, sizeof(float)), *vals = xcalloc(nel, sizeof(float));
  make_clustered(&wc, 21, 0.0f, keys, vals);
  int64_t cs[3] = {wc.n_ctx, wc.hkv, wc.hd}, cl[3] = {wc.hkv, wc.cap, wc.hd}, qs[2] = {4, wc.hd}, ms[2] = {4, 2};
  ra_tensor kc, vc, cen, sz, vs, q, o, ml, o2, ml2;
  tensor_from(&kc, RA_DTYPE_F32, 3, cs, keys);
  tensor_from(&vc, RA_DTYPE_F32, 3, cs, vals);
  assert_int_equal(ra_tensor_new(be, &cen, RA_DTYPE_F32, 3, cl, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &vs, RA_DTYPE_F32, 3, cl, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &sz, RA_DTYPE_F32, 2, cl, NULL), RA_OK);
  int32_t perm[2 * 128], counts[2 * 16], ids[2 * 16];
  assert_int_equal(be->ops->cluster_keys(be, &kc, &vc, wc.row0, wc.n, &wc.p, &cen, &sz, &vs, 0, NULL, NULL, perm, counts, NULL), RA_OK);
  for (int j = 0; j < 32; j++) assert_true(counts[j] > 0), ids[j] = j % 16;
  float hq_[4 * 16];
  uint64_t seed = 9;
  for (int i = 0; i < 64; i++) hq_[i] = 2.0f * frand(&seed);
  tensor_from(&q, RA_DTYPE_F32, 2, qs, hq_);
  ra_tensor *outs[4] = {&o, &ml, &o2, &ml2};
  for (int i = 0; i < 4; i++) assert_int_equal(ra_tensor_new(be, outs[i], RA_DTYPE_F32, 2, i % 2 ? ms : qs, NULL), RA_OK);
  assert_int_equal(be->ops->wave_estimate(be, &q, &cen, &sz, &vs, 16, ids, 16, 16, 0.25f, &o, &ml, NULL), RA_OK);
  ra_token_range all = {wc.row0, wc.row0 + wc.n};
  assert_int_equal(be->ops->attn_decode(be, &q, &kc, &vc, &all, 1, 0.25f, &o2, &ml2, NULL), RA_OK);
  float *a = fetch(&o), *b = fetch(&o2), *ma = fetch(&ml), *mb = fetch(&ml2);
  for (int i = 0; i < 64; i++) assert_true(fabsf(a[i] - b[i]) < 1e-4f);
  for (int h = 0; h < 4; h++) assert_true(fabsf(ma[2 * h] - mb[2 * h]) < 1e-4f && fabsf(ma[2 * h + 1] / mb[2 * h + 1] - 1) < 1e-4f);
  free(a), free(b), free(ma), free(mb), free(keys), free(vals);
  ra_tensor *all_t[8] = {&kc, &vc, &cen, &sz, &vs, &q, &o, &ml};
  for (int i = 0; i < 8; i++) ra_tensor_free(all_t[i]);
  ra_tensor_free(&o2), ra_tensor_free(&ml2);
}

static void test_bad_args(void **state) {
  (void)state;
  int64_t cs[3] = {50, 2, 8}, cl[3] = {2, 10, 8}, ss[2] = {2, 10}, ss9[2] = {2, 9}, os[3] = {2, 40, 8};
  ra_tensor kc, vc, vh, cen, sz, vs, ok, bad;
  assert_int_equal(ra_tensor_new(be, &kc, RA_DTYPE_F16, 3, cs, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &vc, RA_DTYPE_F16, 3, cs, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &vh, RA_DTYPE_BF16, 3, cs, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &cen, RA_DTYPE_F32, 3, cl, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &vs, RA_DTYPE_F32, 3, cl, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &sz, RA_DTYPE_F32, 2, ss, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ok, RA_DTYPE_F32, 3, os, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &bad, RA_DTYPE_F32, 2, ss9, NULL), RA_OK);
  ra_wave_cluster_params p = {20, 8, 3}, p0 = {20, 8, 0}; /* 40 rows: 3 + 3 = 6 clusters */
  int32_t perm[80], counts[12];
  ra_error err;
#define CK(...) be->ops->cluster_keys(be, __VA_ARGS__, &err)
  assert_int_equal(CK(&kc, &vc, 5, 40, &p, &cen, &sz, &vs, 4, &ok, NULL, perm, counts), RA_OK);
  assert_int_equal(CK(&kc, &vc, 5, 40, &p, &cen, &sz, &vs, 5, &ok, NULL, perm, counts), RA_EINVAL); /* c0 + K > cap */
  assert_int_equal(CK(&kc, &vc, 11, 40, &p, &cen, &sz, &vs, 0, NULL, NULL, perm, counts), RA_EINVAL); /* rows */
  assert_int_equal(CK(&kc, &vc, 0, 0, &p, &cen, &sz, &vs, 0, NULL, NULL, perm, counts), RA_EINVAL);
  assert_int_equal(CK(&kc, &vc, 0, 40, &p0, &cen, &sz, &vs, 0, NULL, NULL, perm, counts), RA_EINVAL);
  assert_int_equal(CK(&kc, &vh, 0, 40, &p, &cen, &sz, &vs, 0, NULL, NULL, perm, counts), RA_EINVAL); /* dtypes */
  assert_int_equal(CK(&kc, &vc, 0, 40, &p, &cen, &bad, &vs, 0, NULL, NULL, perm, counts), RA_EINVAL); /* size shape */
  assert_int_equal(CK(&kc, &vc, 0, 40, &p, &cen, &sz, NULL, 0, NULL, NULL, perm, counts), RA_EINVAL);
  assert_int_equal(CK(&kc, &vc, 0, 30, &p, &cen, &sz, &vs, 0, NULL, &ok, perm, counts), RA_EINVAL); /* out rows */
  assert_int_equal(CK(&kc, &vc, 0, 40, &p, &cen, &sz, &vs, 0, NULL, NULL, NULL, counts), RA_EINVAL);
  assert_int_equal(CK(&kc, &vc, 0, 40, &p, &vs, &sz, &kc, 0, NULL, NULL, perm, counts), RA_EINVAL); /* vsum dtype */
#undef CK
  ra_tensor q, o, ml;
  int64_t qs[2] = {4, 8}, q3[2] = {3, 8}, ms[2] = {4, 2};
  assert_int_equal(ra_tensor_new(be, &q, RA_DTYPE_F32, 2, qs, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &o, RA_DTYPE_F32, 2, qs, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, ms, NULL), RA_OK);
  int32_t idx[20];
#define SEL(...) be->ops->wave_select(be, __VA_ARGS__, &err)
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, 2, 3, idx, &vs, &o, &ml), RA_OK);
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, 0, 0, idx, NULL, NULL, NULL), RA_EINVAL);
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, -1, 3, idx, NULL, NULL, NULL), RA_EINVAL);
  assert_int_equal(SEL(&q, &cen, &sz, 11, 0.3f, 2, 3, idx, NULL, NULL, NULL), RA_EINVAL);
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, 2, 3, NULL, NULL, NULL, NULL), RA_EINVAL);
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, 2, 3, idx, &vs, &o, NULL), RA_EINVAL);
  assert_int_equal(SEL(&q, &cen, &sz, 6, 0.3f, 2, 3, idx, NULL, &o, &ml), RA_EINVAL);
  assert_int_equal(SEL(&kc, &cen, &sz, 6, 0.3f, 2, 3, idx, NULL, NULL, NULL), RA_EINVAL);  /* q dtype */
  ra_tensor q_odd;
  assert_int_equal(ra_tensor_new(be, &q_odd, RA_DTYPE_F32, 2, q3, NULL), RA_OK);
  assert_int_equal(SEL(&q_odd, &cen, &sz, 6, 0.3f, 2, 3, idx, NULL, NULL, NULL), RA_EINVAL); /* 3 q over 2 kv */
#undef SEL
  ra_tensor *ts[12] = {&kc, &vc, &vh, &cen, &sz, &vs, &ok, &bad, &q, &o, &ml, &q_odd};
  for (int i = 0; i < 12; i++) ra_tensor_free(ts[i]);
}

/* A fraction of the clusters or a token count, clamped; the retrieval zone at least its floor. */
static void test_budget_clusters(void **state) {
  (void)state;
  assert_int_equal(ra_wave_budget_clusters(0.018, 8000, 16), 144);
  assert_int_equal(ra_wave_budget_clusters(0.018, 200, 16), 4);
  assert_int_equal(ra_wave_budget_clusters(2400, 8000, 16), 150);
  assert_int_equal(ra_wave_budget_clusters(2400, 100, 16), 100);
  assert_int_equal(ra_wave_budget_clusters(0, 100, 16), 0);
  ra_wave_config c;
  ra_wave_config_default(&c);
  assert_int_equal(c.retrieve_min, 1024);
  assert_int_equal(ra_wave_retrieve_clusters(&c, 8000), 144); /* 1.8 % is above the floor */
  assert_int_equal(ra_wave_retrieve_clusters(&c, 200), 64);   /* the floor: 1024 tokens of 16 */
  assert_int_equal(ra_wave_retrieve_clusters(&c, 10), 10);    /* never more than there are */
  c.retrieve_min = 0;
  assert_int_equal(ra_wave_retrieve_clusters(&c, 200), 4);
  c.retrieve_min = 100;
  assert_int_equal(ra_wave_retrieve_clusters(&c, 200), 7); /* ceil(100 / 16) */
  c.cluster = 8;
  assert_int_equal(ra_wave_retrieve_clusters(&c, 200), 13); /* ceil(100 / 8) */
  c.retrieve_min = -1;
  ra_error err;
  assert_int_equal(ra_wave_config_check(&c, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "retrieval floor"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_clusters),
      cmocka_unit_test(test_n_clusters),
      cmocka_unit_test(test_cluster_separated),
      cmocka_unit_test(test_cluster_random),
      cmocka_unit_test(test_cluster_degenerate),
      cmocka_unit_test(test_select_and_fused_estimate),
      cmocka_unit_test(test_select_batch),
      cmocka_unit_test(test_estimate),
      cmocka_unit_test(test_estimate_exact_on_identical_keys),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
