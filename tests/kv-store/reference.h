/* Ground truth for kv-store tests: a seeded generator, dtype rounding, and attention computed
 * directly in double precision, independent of the store's kernels. */
#ifndef KVS_TEST_REFERENCE_H
#define KVS_TEST_REFERENCE_H

#include "half.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ref_rng {
  uint64_t s;
} ref_rng;

uint64_t ref_rng_next(ref_rng *r);
/* Standard normal (Box-Muller). */
float ref_rng_normal(ref_rng *r);
/* x[i] ~ N(0, sigma^2). */
void ref_fill_normal(ref_rng *r, float *x, size_t n, float sigma);

/* perm = a uniformly random permutation of [0, n) (Fisher-Yates). */
void ref_shuffle(ref_rng *r, uint32_t *perm, size_t n);

/* Packs fp32 rows x [n_rows, dim] into dtype t (dst: n_rows rows of ra_dtype_row_bytes(t, dim))
 * and rewrites x with the rounded (int8: dequantized) values, so x is exactly what a store
 * holding dst holds. */
void ref_pack(ra_dtype t, float *x, void *dst, size_t n_rows, size_t dim);

/* Full softmax attention of q over rows [0, n) of k, v ([n, dim]) in double, scale
 * 1/sqrt(dim); o: [dim]. ids (optional) restricts it to rows ids[0..n). */
void ref_attention(const float *q, const float *k, const float *v, const uint32_t *ids, size_t n,
                   int dim, double *o);

/* q·k_i in double for every row. scores: [n]. */
void ref_scores(const float *q, const float *k, size_t n, int dim, double *scores);

/* The k best rows by score (descending, ties by lower row), into ids[0..k). */
void ref_topk(const double *scores, size_t n, size_t k, uint32_t *ids);

/* max_i |a_i - b_i|. */
double ref_max_abs_diff(const float *a, const double *b, size_t n);

#endif
