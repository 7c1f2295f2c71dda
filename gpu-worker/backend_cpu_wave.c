/* CPU wave ops (backend.h): segmented spherical k-means per (kv head, segment) as one OpenMP work
 * item with an sgemm for the row x centroid scores, and the decode-time zone selection and
 * estimate. Sums run in row order inside an item, so results do not depend on the thread count. */
#include "backend_cpu_wave.h"

#include "backend_check_wave.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---------- cluster_keys ---------- */

/* Segments of n rows: stride L (= min(seg_len, n)), S of them, KS clusters in a full one. */
typedef struct wave_geom {
  int64_t L, S, KS;
} wave_geom;

static wave_geom geom_of(int64_t n, const ra_wave_cluster_params *p) {
  wave_geom g;
  g.L = p->seg_len < n ? p->seg_len : n;
  g.S = (n + g.L - 1) / g.L;
  g.KS = (g.L + p->cluster_size - 1) / p->cluster_size;
  return g;
}

/* Per-thread scratch of one work item (capacity L rows, KS clusters, head_dim hd). */
typedef struct km_scratch {
  float *keys, *vals, *x, *c, *scores, *sums;
  int32_t *assign, *count, *start, *order;
} km_scratch;

static void scratch_free(km_scratch *s) {
  free(s->keys);
  free(s->vals);
  free(s->x);
  free(s->c);
  free(s->scores);
  free(s->sums);
  free(s->assign);
  free(s->count);
  free(s->start);
  free(s->order);
}

static int scratch_alloc(km_scratch *s, int64_t L, int64_t KS, int64_t hd) {
  size_t rows = (size_t)L * (size_t)hd, cl = (size_t)KS * (size_t)hd;
  memset(s, 0, sizeof(*s));
  s->keys = malloc(rows * sizeof(float));
  s->vals = malloc(rows * sizeof(float));
  s->x = malloc(rows * sizeof(float));
  s->c = malloc(cl * sizeof(float));
  s->sums = malloc(cl * sizeof(float));
  s->scores = malloc((size_t)L * (size_t)KS * sizeof(float));
  s->assign = malloc((size_t)L * sizeof(int32_t));
  s->order = malloc((size_t)L * sizeof(int32_t));
  s->count = malloc((size_t)KS * sizeof(int32_t));
  s->start = malloc((size_t)KS * sizeof(int32_t));
  if (s->keys && s->vals && s->x && s->c && s->sums && s->scores && s->assign && s->order && s->count && s->start)
    return RA_OK;
  scratch_free(s);
  return RA_ENOMEM;
}

/* Stable counting sort of assign[len] over k clusters: count[j], start[j], order[pos] = row. */
static void group_rows(const int32_t *assign, int64_t len, int64_t k, int32_t *count, int32_t *start, int32_t *order) {
  memset(count, 0, (size_t)k * sizeof(int32_t));
  for (int64_t t = 0; t < len; t++) count[assign[t]]++;
  int32_t acc = 0;
  for (int64_t j = 0; j < k; j++) {
    start[j] = acc;
    acc += count[j];
  }
  for (int64_t j = 0; j < k; j++) count[j] = 0; /* reused as the fill cursor */
  for (int64_t t = 0; t < len; t++) {
    int32_t j = assign[t];
    order[start[j] + count[j]++] = (int32_t)t;
  }
}

/* Loads rows [r0, r0 + len) of kv head h of a cache as f32 [len, hd]. */
static void load_rows(const ra_tensor *c, int64_t r0, int64_t len, int64_t h, float *dst) {
  int64_t hkv = c->shape[1], hd = c->shape[2];
  size_t es = ra_dtype_size(c->dtype);
  for (int64_t t = 0; t < len; t++)
    ra_dtype_to_fp32_n(c->dtype, (const char *)c->data + (size_t)(((r0 + t) * hkv + h) * hd) * es, dst + t * hd,
                       (size_t)hd);
}

/* Unit mean-centred keys x [len, hd] of keys [len, hd] (0 where a key equals the mean). */
static void centre_normalise(const float *keys, int64_t len, int64_t hd, float *x) {
  for (int64_t d = 0; d < hd; d++) {
    double s = 0.0;
    for (int64_t t = 0; t < len; t++) s += keys[t * hd + d];
    float mu = (float)(s / (double)len);
    for (int64_t t = 0; t < len; t++) x[t * hd + d] = keys[t * hd + d] - mu;
  }
  for (int64_t t = 0; t < len; t++) {
    float ss = 0.0f;
    for (int64_t d = 0; d < hd; d++) ss += x[t * hd + d] * x[t * hd + d];
    float inv = ss > 0.0f ? 1.0f / sqrtf(ss) : 0.0f;
    for (int64_t d = 0; d < hd; d++) x[t * hd + d] *= inv;
  }
}

/* Spherical k-means of x [len, hd] into k clusters (see backend.h); leaves the last
 * assignment in s->assign. */
static void kmeans(km_scratch *s, int64_t len, int64_t k, int64_t hd, int iters) {
  for (int64_t j = 0; j < k; j++) memcpy(s->c + j * hd, s->x + (j * len / k) * hd, (size_t)hd * sizeof(float));
  for (int64_t t = 0; t < len; t++) s->assign[t] = -1;
  for (int it = 0; it < iters; it++) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)len, (int)k, (int)hd, 1.0f, s->x, (int)hd, s->c,
                (int)hd, 0.0f, s->scores, (int)k);
    int changed = 0;
    for (int64_t t = 0; t < len; t++) {
      const float *row = s->scores + t * k;
      int32_t best = 0;
      for (int64_t j = 1; j < k; j++)
        if (row[j] > row[best]) best = (int32_t)j;
      changed |= best != s->assign[t];
      s->assign[t] = best;
    }
    if (!changed || it == iters - 1) break; /* the centroids of a repeated (or the last) assignment are unused */
    memset(s->sums, 0, (size_t)(k * hd) * sizeof(float));
    memset(s->count, 0, (size_t)k * sizeof(int32_t));
    for (int64_t t = 0; t < len; t++) {
      float *sum = s->sums + (int64_t)s->assign[t] * hd;
      const float *xr = s->x + t * hd;
      for (int64_t d = 0; d < hd; d++) sum[d] += xr[d];
      s->count[s->assign[t]]++;
    }
    for (int64_t j = 0; j < k; j++) {
      if (!s->count[j]) continue;
      const float *sum = s->sums + j * hd;
      float ss = 0.0f;
      for (int64_t d = 0; d < hd; d++) ss += sum[d] * sum[d];
      if (ss <= 0.0f) continue;
      float inv = 1.0f / sqrtf(ss);
      for (int64_t d = 0; d < hd; d++) s->c[j * hd + d] = sum[d] * inv;
    }
  }
}

int ra_cpu_cluster_keys(ra_backend *be, const ra_tensor *kc, const ra_tensor *vc, int64_t row0, int64_t n,
                        const ra_wave_cluster_params *p, ra_tensor *centroid, ra_tensor *size, ra_tensor *vsum,
                        int64_t c0, ra_tensor *out_k, ra_tensor *out_v, int32_t *perm, int32_t *counts,
                        ra_error *err) {
  int64_t K;
  int rc = ra_backend_check_wave_cluster("cpu", kc, vc, row0, n, p, centroid, size, vsum, c0, out_k, out_v, perm,
                                         counts, &K, err);
  if (rc) return rc;
  const int64_t hkv = kc->shape[1], hd = kc->shape[2], cap = centroid->shape[1];
  const wave_geom g = geom_of(n, p);
  const int64_t items = hkv * g.S;
  int nt = omp_get_max_threads();
  if (nt > items) nt = (int)items;
  km_scratch *sc = calloc((size_t)nt, sizeof(km_scratch));
  if (!sc) return ra_errorf(err, RA_ENOMEM, "cpu cluster_keys: out of memory");
  for (int i = 0; i < nt; i++)
    if (scratch_alloc(&sc[i], g.L, g.KS, hd) != RA_OK) {
      for (int j = 0; j < i; j++) scratch_free(&sc[j]);
      free(sc);
      return ra_errorf(err, RA_ENOMEM, "cpu cluster_keys: out of memory for %d scratches of %lld rows", nt,
                       (long long)g.L);
    }
  float *cd = centroid->data, *sd = size->data, *vd = vsum->data;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t item = 0; item < items; item++) {
    km_scratch *s = &sc[omp_get_thread_num()];
    const int64_t h = item / g.S, seg = item % g.S, t0 = seg * g.L;
    const int64_t len = n - t0 < g.L ? n - t0 : g.L, k = (len + p->cluster_size - 1) / p->cluster_size;
    const int64_t cbase = seg * g.KS;
    load_rows(kc, row0 + t0, len, h, s->keys);
    load_rows(vc, row0 + t0, len, h, s->vals);
    centre_normalise(s->keys, len, hd, s->x);
    kmeans(s, len, k, hd, p->iters);
    group_rows(s->assign, len, k, s->count, s->start, s->order);
    for (int64_t pos = 0; pos < len; pos++) perm[h * n + t0 + pos] = (int32_t)(t0 + s->order[pos]);
    for (int64_t j = 0; j < k; j++) {
      const int64_t cnt = s->count[j], slot = (h * cap + c0 + cbase + j);
      float *cr = cd + slot * hd, *vr = vd + slot * hd;
      memset(cr, 0, (size_t)hd * sizeof(float));
      memset(vr, 0, (size_t)hd * sizeof(float));
      for (int64_t i = 0; i < cnt; i++) {
        const int64_t t = s->order[s->start[j] + i];
        for (int64_t d = 0; d < hd; d++) {
          cr[d] += s->keys[t * hd + d];
          vr[d] += s->vals[t * hd + d];
        }
      }
      if (cnt)
        for (int64_t d = 0; d < hd; d++) cr[d] /= (float)cnt;
      sd[slot] = (float)cnt;
      counts[h * K + cbase + j] = (int32_t)cnt;
    }
    ra_tensor *outs[2] = {out_k, out_v};
    const float *rows[2] = {s->keys, s->vals};
    for (int o = 0; o < 2; o++) {
      if (!outs[o]) continue;
      size_t es = ra_dtype_size(outs[o]->dtype);
      for (int64_t pos = 0; pos < len; pos++)
        ra_dtype_from_fp32_n(outs[o]->dtype, rows[o] + (int64_t)s->order[pos] * hd,
                             (char *)outs[o]->data + (size_t)((h * n + t0 + pos) * hd) * es, (size_t)hd);
    }
  }
  for (int i = 0; i < nt; i++) scratch_free(&sc[i]);
  free(sc);
  return RA_OK;
}

/* ---------- wave_select / wave_estimate ---------- */

static float dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static void estimate_heads(const float *q, int64_t hq, int64_t hkv, int64_t hd, const float *cd, const float *sd,
                           const float *vd, int64_t cap, const int32_t *ids, int n_ids, int64_t ld, float scale,
                           float *o, float *ml) {
  const int64_t group = hq / hkv;
#pragma omp parallel for schedule(static) if (hq * (int64_t)n_ids * hd > 100000)
  for (int64_t h = 0; h < hq; h++) {
    const int64_t kvh = h / group;
    const float *qh = q + h * hd;
    float *oh = o + h * hd;
    memset(oh, 0, (size_t)hd * sizeof(float));
    float m = -INFINITY, l = 0.0f;
    for (int pass = 0; pass < 2; pass++)
      for (int j = 0; j < n_ids; j++) {
        const int32_t c = ids[kvh * ld + j];
        if (c < 0 || !(sd[kvh * cap + c] > 0.0f)) continue;
        const float z = scale * dot(qh, cd + (kvh * cap + c) * hd, hd);
        if (pass == 0) {
          m = z > m ? z : m;
          continue;
        }
        const float w = expf(z - m);
        const float *vr = vd + (kvh * cap + c) * hd;
        l += sd[kvh * cap + c] * w;
        for (int64_t d = 0; d < hd; d++) oh[d] += w * vr[d];
      }
    if (l > 0.0f)
      for (int64_t d = 0; d < hd; d++) oh[d] /= l;
    ml[2 * h] = m;
    ml[2 * h + 1] = l;
  }
}

int ra_cpu_wave_estimate(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                         const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids, int n_ids, int64_t ld,
                         float scale, ra_tensor *o, ra_tensor *ml, ra_error *err) {
  int rc = ra_backend_check_wave_estimate("cpu", q, centroid, size, vsum, n_clusters, ids, n_ids, ld, o, ml, err);
  if (rc) return rc;
  const int64_t hd = centroid->shape[2], hkv = centroid->shape[0];
  const int64_t hq = (int64_t)(ra_tensor_nelem(q) / (size_t)hd);
  estimate_heads(q->data, hq, hkv, hd, centroid->data, size->data, vsum->data, centroid->shape[1], ids, n_ids, ld,
                 scale, o->data, ml->data);
  return RA_OK;
}

int ra_cpu_wave_select(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                       int64_t n_clusters, float scale, int r, int e, int32_t *idx, const ra_tensor *vsum,
                       ra_tensor *o, ra_tensor *ml, ra_error *err) {
  int rc = ra_backend_check_wave_select("cpu", q, centroid, size, n_clusters, r, e, idx, vsum, o, ml, err);
  if (rc) return rc;
  const int64_t hd = centroid->shape[2], hkv = centroid->shape[0], cap = centroid->shape[1];
  const int64_t hq = (int64_t)(ra_tensor_nelem(q) / (size_t)hd), group = hq / hkv, nc = n_clusters;
  const int64_t ld = (int64_t)r + e, k = ld < nc ? ld : nc;
  for (int64_t i = 0; i < hkv * ld; i++) idx[i] = -1;
  if (k > 0) {
    float *z = malloc(sizeof(float) * (size_t)(group * nc)), *key = malloc(sizeof(float) * (size_t)(hkv * nc));
    int32_t *top = malloc(sizeof(int32_t) * (size_t)(hkv * k));
    float *val = malloc(sizeof(float) * (size_t)(hkv * k));
    if (!z || !key || !top || !val) {
      free(z), free(key), free(top), free(val);
      return ra_errorf(err, RA_ENOMEM, "cpu wave_select: out of memory for %lld clusters", (long long)nc);
    }
    const float *cd = centroid->data, *sd = size->data, *qd = q->data;
    for (int64_t h = 0; h < hkv; h++) {
      /* z [group, nc] = scale q_group C_h^T, a plain loop: equal centroids give equal scores */
#pragma omp parallel for schedule(static) if (nc * group * hd > 100000)
      for (int64_t c = 0; c < nc; c++)
        for (int64_t gi = 0; gi < group; gi++)
          z[gi * nc + c] = scale * dot(qd + (h * group + gi) * hd, cd + (h * cap + c) * hd, hd);
      const float *sh = sd + h * cap;
      float *kh = key + h * nc;
      for (int64_t c = 0; c < nc; c++) kh[c] = sh[c] > 0.0f ? 0.0f : -INFINITY;
      for (int64_t gi = 0; gi < group; gi++) {
        float *zg = z + gi * nc, m = -INFINITY, l = 0.0f;
        for (int64_t c = 0; c < nc; c++) {
          zg[c] = sh[c] > 0.0f ? zg[c] + logf(sh[c]) : -INFINITY;
          m = zg[c] > m ? zg[c] : m;
        }
        if (m == -INFINITY) continue; /* every cluster empty */
        for (int64_t c = 0; c < nc; c++) l += (zg[c] = expf(zg[c] - m));
        for (int64_t c = 0; c < nc; c++)
          if (sh[c] > 0.0f) kh[c] += zg[c] / l;
      }
    }
    ra_tensor kt = {.be = be, .dtype = RA_DTYPE_F32, .ndim = 2, .shape = {hkv, nc}, .data = key};
    kt.nbytes = (size_t)(hkv * nc) * sizeof(float);
    rc = be->ops->topk_rows(be, &kt, (int)k, top, val, err);
    if (rc == RA_OK)
      for (int64_t h = 0; h < hkv; h++) memcpy(idx + h * ld, top + h * k, (size_t)k * sizeof(int32_t));
    free(z), free(key), free(top), free(val);
    if (rc) return rc;
  }
  if (o)
    estimate_heads(q->data, hq, hkv, hd, centroid->data, size->data, vsum->data, cap, idx + r, e, ld, scale, o->data,
                   ml->data);
  return RA_OK;
}
