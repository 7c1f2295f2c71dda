/* flat: the exact answer, every key scanned. Also the reference the other kinds are measured
 * against. */
#include "index_internal.h"
#include "topk.h"
#include "vec.h"

int ra_flat_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                   ra_index_scratch *s, uint32_t *ids, float *scores, uint32_t *n_out,
                   uint64_t *n_scanned) {
  /* The heap borrows the scratch's beam arrays (sized >= k by the caller). */
  ra_topk t = {.score = s->pool_score, .id = s->pool_id, .k = k, .n = 0};
  size_t row_bytes = ra_dtype_row_bytes(keys->dtype, (size_t)keys->dim);
  for (uint32_t b = 0; b < ix->n; b += RA_INDEX_SCAN_BLOCK) {
    uint32_t nb = ix->n - b < RA_INDEX_SCAN_BLOCK ? ix->n - b : RA_INDEX_SCAN_BLOCK;
    ra_vec_dot_rows(q, (const char *)keys->rows + (size_t)b * row_bytes, keys->dtype, keys->dim,
                    NULL, nb, s->nbr_score);
    float thr = ra_topk_threshold(&t);
    for (uint32_t i = 0; i < nb; i++)
      if (s->nbr_score[i] >= thr) {
        ra_topk_push(&t, s->nbr_score[i], b + i);
        thr = ra_topk_threshold(&t);
      }
  }
  ra_topk_sort(&t);
  for (uint32_t i = 0; i < t.n; i++) {
    ids[i] = t.id[i];
    if (scores) scores[i] = t.score[i];
  }
  *n_out = (uint32_t)t.n;
  if (n_scanned) *n_scanned = ix->n;
  return RA_OK;
}
