/* Partial attention and its exact log-sum-exp merge.
 *
 * Attention of one query q over a token set S is split among owners of disjoint subsets
 * S = S1 ∪ S2 ∪ ...; each owner returns a partial over its subset:
 *   m = max_i z_i,  l = sum_i exp(z_i - m),  o = sum_i exp(z_i - m) v_i / l    (z_i = scale q·k_i)
 * Two partials merge exactly:  m = max(m1, m2),  w_j = l_j exp(m_j - m),
 *   l = w1 + w2,  o = (w1 o1 + w2 o2) / l.
 * An empty partial (no tokens) has m = -inf, l = 0 and o = 0 and is the identity of the merge. */
#ifndef RA_MERGE_H
#define RA_MERGE_H

#include <stddef.h>

typedef struct ra_partial {
  float *o; /* [head_dim] */
  float m;
  float l;
} ra_partial;

/* Makes `p` the empty partial; p->o must hold head_dim floats. */
void ra_partial_reset(ra_partial *p, int head_dim);

/* acc <- merge(acc, (o, m, l)). `o` may be NULL only when l == 0. */
void ra_partial_merge(ra_partial *acc, const float *o, float m, float l, int head_dim);

/* Exact partial attention of one query over n fp32 keys/values (the reference the optimized
 * kernels are tested against).  q: [head_dim], k, v: [n, head_dim], out->o: [head_dim].
 * Two passes, so n x head_dim scratch is never needed. */
void ra_partial_attend_f32(const float *q, const float *k, const float *v, size_t n, int head_dim,
                           float scale, ra_partial *out);

#endif
