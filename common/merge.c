#include "merge.h"

#include <math.h>
#include <string.h>

void ra_partial_reset(ra_partial *p, int head_dim) {
  p->m = -INFINITY;
  p->l = 0.0f;
  memset(p->o, 0, (size_t)head_dim * sizeof(float));
}

void ra_partial_merge(ra_partial *acc, const float *o, float m, float l, int head_dim) {
  if (!(l > 0.0f)) return; /* empty (or NaN-free zero) partial: identity */
  if (!(acc->l > 0.0f)) {
    acc->m = m;
    acc->l = l;
    memcpy(acc->o, o, (size_t)head_dim * sizeof(float));
    return;
  }
  float mx = acc->m > m ? acc->m : m;
  float w1 = acc->l * expf(acc->m - mx);
  float w2 = l * expf(m - mx);
  float inv = 1.0f / (w1 + w2);
  for (int i = 0; i < head_dim; i++) acc->o[i] = (w1 * acc->o[i] + w2 * o[i]) * inv;
  acc->m = mx;
  acc->l = w1 + w2;
}

void ra_partial_attend_f32(const float *q, const float *k, const float *v, size_t n, int head_dim,
                           float scale, ra_partial *out) {
  ra_partial_reset(out, head_dim);
  if (n == 0) return;
  float m = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    float z = 0.0f;
    for (int j = 0; j < head_dim; j++) z += q[j] * k[i * (size_t)head_dim + j];
    z *= scale;
    if (z > m) m = z;
  }
  double l = 0.0;
  for (size_t i = 0; i < n; i++) {
    float z = 0.0f;
    for (int j = 0; j < head_dim; j++) z += q[j] * k[i * (size_t)head_dim + j];
    float w = expf(z * scale - m);
    l += w;
    for (int j = 0; j < head_dim; j++) out->o[j] += w * v[i * (size_t)head_dim + j];
  }
  for (int j = 0; j < head_dim; j++) out->o[j] = (float)(out->o[j] / l);
  out->m = m;
  out->l = (float)l;
}
