#include "topk.h"

#include "status.h"

#include <math.h>
#include <stdlib.h>

int ra_topk_init(ra_topk *t, size_t k) {
  t->k = k;
  t->n = 0;
  t->score = malloc((k ? k : 1) * sizeof *t->score);
  t->id = malloc((k ? k : 1) * sizeof *t->id);
  if (!t->score || !t->id) {
    ra_topk_free(t);
    return RA_ENOMEM;
  }
  return RA_OK;
}

void ra_topk_free(ra_topk *t) {
  free(t->score);
  free(t->id);
  t->score = NULL;
  t->id = NULL;
  t->k = t->n = 0;
}

void ra_topk_reset(ra_topk *t) { t->n = 0; }

float ra_topk_threshold(const ra_topk *t) {
  return t->n == t->k && t->k > 0 ? t->score[0] : -INFINITY;
}

/* Heap order: a is "worse" than b (belongs nearer the root) if lower score, or equal score and
 * higher id (so that among ties the lower id survives). */
static inline int worse(const ra_topk *t, size_t a, size_t b) {
  return t->score[a] < t->score[b] || (t->score[a] == t->score[b] && t->id[a] > t->id[b]);
}

static inline void swap_at(ra_topk *t, size_t a, size_t b) {
  float s = t->score[a];
  uint32_t i = t->id[a];
  t->score[a] = t->score[b];
  t->id[a] = t->id[b];
  t->score[b] = s;
  t->id[b] = i;
}

static void sift_down(ra_topk *t, size_t i, size_t n) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && worse(t, l, m)) m = l;
    if (r < n && worse(t, r, m)) m = r;
    if (m == i) return;
    swap_at(t, i, m);
    i = m;
  }
}

void ra_topk_push(ra_topk *t, float score, uint32_t id) {
  if (t->n < t->k) {
    size_t i = t->n++;
    t->score[i] = score;
    t->id[i] = id;
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (!worse(t, i, p)) break;
      swap_at(t, i, p);
      i = p;
    }
    return;
  }
  if (t->k == 0) return;
  if (score < t->score[0] || (score == t->score[0] && id > t->id[0])) return;
  if (score == t->score[0] && id == t->id[0]) return;
  t->score[0] = score;
  t->id[0] = id;
  sift_down(t, 0, t->n);
}

void ra_topk_sort(ra_topk *t) {
  /* Heap sort: repeatedly move the worst to the end, leaving best-first order. */
  for (size_t n = t->n; n > 1; n--) {
    swap_at(t, 0, n - 1);
    sift_down(t, 0, n - 1);
  }
}
