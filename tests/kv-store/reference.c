#include "reference.h"

#include "status.h"

#include <math.h>
#include <stdlib.h>

uint64_t ref_rng_next(ref_rng *r) {
  /* splitmix64: good enough for test data and seeded from any value. */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float ref_rng_normal(ref_rng *r) {
  double u1 = ((double)(ref_rng_next(r) >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(ref_rng_next(r) >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void ref_fill_normal(ref_rng *r, float *x, size_t n, float sigma) {
  for (size_t i = 0; i < n; i++) x[i] = sigma * ref_rng_normal(r);
}

void ref_pack(ra_dtype t, float *x, void *dst, size_t n_rows, size_t dim) {
  if (ra_dtype_rows_from_fp32(t, x, dst, n_rows, dim, NULL) != RA_OK) abort(); /* finite test data */
  ra_dtype_rows_to_fp32(t, dst, x, n_rows, dim);
}

void ref_scores(const float *q, const float *k, size_t n, int dim, double *scores) {
  for (size_t i = 0; i < n; i++) {
    double s = 0.0;
    for (int j = 0; j < dim; j++) s += (double)q[j] * k[i * (size_t)dim + j];
    scores[i] = s;
  }
}

void ref_attention(const float *q, const float *k, const float *v, const uint32_t *ids, size_t n,
                   int dim, double *o) {
  double scale = 1.0 / sqrt((double)dim);
  double *z = malloc((n ? n : 1) * sizeof *z);
  double m = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    size_t row = ids ? ids[i] : i;
    double s = 0.0;
    for (int j = 0; j < dim; j++) s += (double)q[j] * k[row * (size_t)dim + j];
    z[i] = s * scale;
    if (z[i] > m) m = z[i];
  }
  double l = 0.0;
  for (int j = 0; j < dim; j++) o[j] = 0.0;
  for (size_t i = 0; i < n; i++) {
    size_t row = ids ? ids[i] : i;
    double w = exp(z[i] - m);
    l += w;
    for (int j = 0; j < dim; j++) o[j] += w * v[row * (size_t)dim + j];
  }
  for (int j = 0; j < dim && n > 0; j++) o[j] /= l;
  free(z);
}

void ref_topk(const double *scores, size_t n, size_t k, uint32_t *ids) {
  /* Selection by repeated scan: O(n k), fine for test sizes and obviously correct. */
  unsigned char *taken = calloc(n ? n : 1, 1);
  for (size_t r = 0; r < k && r < n; r++) {
    size_t best = n;
    for (size_t i = 0; i < n; i++)
      if (!taken[i] && (best == n || scores[i] > scores[best])) best = i;
    taken[best] = 1;
    ids[r] = (uint32_t)best;
  }
  free(taken);
}

double ref_max_abs_diff(const float *a, const double *b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
  }
  return m;
}

void ref_shuffle(ref_rng *r, uint32_t *perm, size_t n) {
  for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
  for (size_t i = n; i > 1; i--) {
    size_t j = ref_rng_next(r) % i;
    uint32_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
}
