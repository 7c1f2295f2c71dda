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
#include <stdint.h>

typedef struct ra_partial {
  float *o; /* [head_dim] */
  float m;
  float l;
} ra_partial;

/* One query head's partial as a kv-store computes it (kv-store/attend.h) and a client of the
 * store receives it (kv-store/client.h); proto HeadPartial is its wire form only, converted in
 * kv-store/wire.c. */
typedef struct ra_head_partial {
  uint32_t q_head;
  ra_partial part;    /* part.o: [head_dim] */
  uint64_t n_scanned; /* keys whose q·k was computed */
  uint64_t n_keys;    /* keys stored for this head's kv head */
  uint64_t *ids;      /* [n_ids] token positions attended over, best first (flat, index modes)
                         or by position (full) */
  size_t ids_cap;     /* a client's room in ids (it keeps the first ids_cap); a store's: n_ids */
  size_t n_ids;       /* positions the store returned */
} ra_head_partial;

/* Makes `p` the empty partial; p->o must hold head_dim floats. */
void ra_partial_reset(ra_partial *p, int head_dim);

/* acc <- merge(acc, (o, m, l)). `o` may be NULL only when l == 0. */
void ra_partial_merge(ra_partial *acc, const float *o, float m, float l, int head_dim);
/* acc <- merge(acc, *p) */
static inline void ra_partial_merge_from(ra_partial *acc, const ra_partial *p, int head_dim) {
  ra_partial_merge(acc, p->o, p->m, p->l, head_dim);
}

/* Exact partial attention of one query over n fp32 keys/values (the reference the optimized
 * kernels are tested against).  q: [head_dim], k, v: [n, head_dim], out->o: [head_dim].
 * Two passes, so n x head_dim scratch is never needed. */
void ra_partial_attend_f32(const float *q, const float *k, const float *v, size_t n, int head_dim,
                           float scale, ra_partial *out);

#endif
