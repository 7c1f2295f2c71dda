/* The k largest (score, id) pairs of a stream: a min-heap of size k whose root is the current
 * k-th best, so a push that cannot enter costs one compare. Used by exact search (flat), by
 * every index, and by tests computing ground truth. */
#ifndef RA_TOPK_H
#define RA_TOPK_H

#include <stddef.h>
#include <stdint.h>

typedef struct ra_topk {
  float *score;
  uint32_t *id;
  size_t k; /* capacity */
  size_t n; /* pairs held, <= k */
} ra_topk;

/* 0 or RA_ENOMEM; k may be 0 (keeps nothing). */
int ra_topk_init(ra_topk *t, size_t k);
void ra_topk_free(ra_topk *t);
void ra_topk_reset(ra_topk *t);

/* Offers one pair; ties with the k-th best keep the earlier one. */
void ra_topk_push(ra_topk *t, float score, uint32_t id);

/* The smallest score held when full, -inf otherwise: a candidate must beat it to enter. */
float ra_topk_threshold(const ra_topk *t);

/* Sorts the held pairs by descending score (ties by ascending id); the heap is consumed, so
 * call reset before pushing again. */
void ra_topk_sort(ra_topk *t);

#endif
