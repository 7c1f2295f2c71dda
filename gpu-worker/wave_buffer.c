#include "wave_buffer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Per (layer, kv head) lg, over its n_pages pages: a held cluster is named by its first page
 * (so entry tables are per page), its pages chained by page_next; an LRU list of held clusters,
 * most recent at head. Arrays are [n_lg, n_pages] unless said. */
struct ra_wave_buffer {
  ra_backend *be;
  int n_layers, n_heads, n_kv, hd;
  int64_t n_ids, n_pages, rows; /* rows = n_pages * page: R */
  ra_tensor *k, *v;             /* [n_layers] x [n_kv * R, 1, hd] */
  int32_t *slot;                /* [n_lg, n_ids]: first page of cluster c, -1 when not held */
  int32_t *ent_c, *ent_rows;    /* per first page: the cluster, its rows */
  int32_t *prev, *next;         /* per first page: LRU neighbours (-1: none) */
  int32_t *head, *tail;         /* [n_lg] */
  int32_t *page_next;           /* the cluster's next page, -1 at its last */
  int32_t *free_pages;          /* a stack of free pages */
  int64_t *n_free;              /* [n_lg] */
  /* the step's hit lists of the current layer, per kv head: ranges of its view */
  ra_token_range *ranges;       /* [n_kv, n_pages] */
  int *n_ranges;                /* [n_kv] */
  int64_t *hit_rows;            /* [n_kv] */
  ra_tensor o, ml;              /* [n_heads, hd], [n_heads, 2] */
  float empty_ml[2];
  float *zeros;                 /* [group * hd] */
  /* installs of one layer staged until ra_wave_buffer_commit writes them in one scatter: the
   * rows (host fp32), the rows of the layer's tensors they go to, and the clusters staged */
  int stage_layer;              /* -1: nothing staged */
  float *stage_k, *stage_v;     /* [stage_cap, hd] */
  int32_t *stage_dst;           /* [stage_cap] */
  int64_t stage_n, stage_cap;
  struct staged {
    size_t lg;
    int32_t first;
    int64_t row0, n;
    int live;                   /* 0 once evicted by a later install of the same batch */
  } *staged;
  size_t n_staged, cap_staged;
  int32_t *staged_of;           /* [n_lg, n_pages]: 1 + index into staged per first page, 0 if not staged */
  ra_tensor dev_k, dev_v;       /* F32 [dev_cap, hd]: the staged rows on the device */
  int64_t dev_cap;
};

static size_t lg_of(const ra_wave_buffer *b, int l, int g) { return (size_t)l * (size_t)b->n_kv + (size_t)g; }

void ra_wave_buffer_free(ra_wave_buffer *b) {
  if (!b) return;
  for (int l = 0; b->k && l < b->n_layers; l++) {
    ra_tensor_free(&b->k[l]);
    ra_tensor_free(&b->v[l]);
  }
  free(b->k);
  free(b->v);
  free(b->slot);
  free(b->ent_c);
  free(b->ent_rows);
  free(b->prev);
  free(b->next);
  free(b->head);
  free(b->tail);
  free(b->page_next);
  free(b->free_pages);
  free(b->n_free);
  free(b->ranges);
  free(b->n_ranges);
  free(b->hit_rows);
  ra_tensor_free(&b->o);
  ra_tensor_free(&b->ml);
  free(b->zeros);
  free(b->stage_k);
  free(b->stage_v);
  free(b->stage_dst);
  free(b->staged);
  free(b->staged_of);
  ra_tensor_free(&b->dev_k);
  ra_tensor_free(&b->dev_v);
  free(b);
}

int ra_wave_buffer_new(ra_backend *be, int n_layers, int n_heads, int n_kv_heads, int head_dim, ra_dtype dtype,
                       int64_t n_ids, int64_t clusters, int64_t cluster_rows, ra_wave_buffer **out, ra_error *err) {
  *out = NULL;
  if (clusters < 1 || cluster_rows < 1 || n_ids < 1 || n_ids > INT32_MAX || n_kv_heads < 1 || n_heads % n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "wave buffer: %lld clusters of %lld rows over %lld ids", (long long)clusters,
                     (long long)cluster_rows, (long long)n_ids);
  const int64_t per = (cluster_rows + RA_WAVE_BUFFER_PAGE - 1) / RA_WAVE_BUFFER_PAGE;
  if (clusters > INT32_MAX / per / RA_WAVE_BUFFER_PAGE / n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "wave buffer: %lld clusters of %lld rows per kv head do not fit a tensor",
                     (long long)clusters, (long long)cluster_rows);
  ra_wave_buffer *b = calloc(1, sizeof *b);
  if (!b) return ra_errorf(err, RA_ENOMEM, "wave buffer: out of memory");
  *b = (ra_wave_buffer){.be = be, .n_layers = n_layers, .n_heads = n_heads, .n_kv = n_kv_heads, .hd = head_dim,
                        .n_ids = n_ids, .n_pages = clusters * per};
  b->rows = b->n_pages * RA_WAVE_BUFFER_PAGE;
  b->empty_ml[0] = -INFINITY;
  b->stage_layer = -1;
  const size_t n_lg = (size_t)n_layers * (size_t)n_kv_heads, np = (size_t)b->n_pages, group = (size_t)(n_heads / n_kv_heads);
  b->k = calloc((size_t)n_layers, sizeof *b->k);
  b->v = calloc((size_t)n_layers, sizeof *b->v);
  b->slot = malloc(n_lg * (size_t)n_ids * sizeof *b->slot);
  b->ent_c = malloc(n_lg * np * sizeof *b->ent_c);
  b->ent_rows = malloc(n_lg * np * sizeof *b->ent_rows);
  b->prev = malloc(n_lg * np * sizeof *b->prev);
  b->next = malloc(n_lg * np * sizeof *b->next);
  b->page_next = malloc(n_lg * np * sizeof *b->page_next);
  b->free_pages = malloc(n_lg * np * sizeof *b->free_pages);
  b->head = malloc(n_lg * sizeof *b->head);
  b->tail = malloc(n_lg * sizeof *b->tail);
  b->n_free = malloc(n_lg * sizeof *b->n_free);
  b->ranges = malloc((size_t)n_kv_heads * np * sizeof *b->ranges);
  b->n_ranges = calloc((size_t)n_kv_heads, sizeof *b->n_ranges);
  b->hit_rows = calloc((size_t)n_kv_heads, sizeof *b->hit_rows);
  b->zeros = calloc(group * (size_t)head_dim, sizeof *b->zeros);
  b->staged_of = calloc(n_lg * np, sizeof *b->staged_of);
  int rc = RA_OK;
  if (!b->k || !b->v || !b->slot || !b->ent_c || !b->ent_rows || !b->prev || !b->next || !b->page_next ||
      !b->free_pages || !b->head || !b->tail || !b->n_free || !b->ranges || !b->n_ranges || !b->hit_rows ||
      !b->zeros || !b->staged_of)
    rc = ra_errorf(err, RA_ENOMEM, "wave buffer: out of memory for %lld pages per kv head", (long long)b->n_pages);
  if (rc == RA_OK) {
    memset(b->slot, 0xff, n_lg * (size_t)n_ids * sizeof *b->slot);
    for (size_t lg = 0; lg < n_lg; lg++) {
      b->head[lg] = b->tail[lg] = -1;
      b->n_free[lg] = b->n_pages;
      /* popped from the top: pages in increasing order, so a cluster's pages are mostly adjacent */
      for (size_t p = 0; p < np; p++) b->free_pages[lg * np + p] = (int32_t)(np - 1 - p);
    }
  }
  int64_t shape[3] = {(int64_t)n_kv_heads * b->rows, 1, head_dim}, os[2] = {n_heads, head_dim}, ms[2] = {n_heads, 2};
  for (int l = 0; l < n_layers && rc == RA_OK; l++) {
    rc = ra_tensor_new(be, &b->k[l], dtype, 3, shape, err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &b->v[l], dtype, 3, shape, err);
  }
  if (rc == RA_OK) rc = ra_tensor_new(be, &b->o, RA_DTYPE_F32, 2, os, err);
  if (rc == RA_OK) rc = ra_tensor_new(be, &b->ml, RA_DTYPE_F32, 2, ms, err);
  if (rc) {
    ra_wave_buffer_free(b);
    return rc;
  }
  *out = b;
  return RA_OK;
}

int64_t ra_wave_buffer_rows(const ra_wave_buffer *b) { return b->rows; }

/* LRU list of lg: unlink entry e / push it at the head. */
static void lru_unlink(ra_wave_buffer *b, size_t lg, int32_t e) {
  const size_t base = lg * (size_t)b->n_pages;
  int32_t p = b->prev[base + e], n = b->next[base + e];
  if (p >= 0) b->next[base + p] = n;
  else b->head[lg] = n;
  if (n >= 0) b->prev[base + n] = p;
  else b->tail[lg] = p;
}

static void lru_push(ra_wave_buffer *b, size_t lg, int32_t e) {
  const size_t base = lg * (size_t)b->n_pages;
  b->prev[base + e] = -1;
  b->next[base + e] = b->head[lg];
  if (b->head[lg] >= 0) b->prev[base + b->head[lg]] = e;
  else b->tail[lg] = e;
  b->head[lg] = e;
}

int ra_wave_buffer_hit(ra_wave_buffer *b, int l, int g, int64_t c) {
  const size_t lg = lg_of(b, l, g), base = lg * (size_t)b->n_pages;
  if (c < 0 || c >= b->n_ids) return 0;
  const int32_t e = b->slot[lg * (size_t)b->n_ids + (size_t)c];
  if (e < 0 || b->staged_of[base + e]) return 0; /* rows not written yet */
  lru_unlink(b, lg, e);
  lru_push(b, lg, e);
  ra_token_range *r = b->ranges + (size_t)g * (size_t)b->n_pages;
  int *nr = &b->n_ranges[g];
  int64_t left = b->ent_rows[base + e];
  b->hit_rows[g] += left;
  for (int32_t p = e; p >= 0 && left > 0; p = b->page_next[base + p]) {
    const int64_t r0 = (int64_t)p * RA_WAVE_BUFFER_PAGE, n = left < RA_WAVE_BUFFER_PAGE ? left : RA_WAVE_BUFFER_PAGE;
    if (*nr > 0 && r[*nr - 1].end == r0) r[*nr - 1].end = r0 + n;
    else r[(*nr)++] = (ra_token_range){r0, r0 + n};
    left -= n;
  }
  return 1;
}

/* Frees held cluster e (its first page) of lg; a staged one's rows are dropped from the batch. */
static void evict_entry(ra_wave_buffer *b, size_t lg, int32_t e) {
  const size_t base = lg * (size_t)b->n_pages;
  if (b->staged_of[base + e]) {
    b->staged[b->staged_of[base + e] - 1].live = 0;
    b->staged_of[base + e] = 0;
  }
  lru_unlink(b, lg, e);
  b->slot[lg * (size_t)b->n_ids + (size_t)b->ent_c[base + e]] = -1;
  /* pushed so that they pop in chain order again: a cluster's pages stay ascending runs */
  const int64_t n = (b->ent_rows[base + e] + RA_WAVE_BUFFER_PAGE - 1) / RA_WAVE_BUFFER_PAGE;
  int64_t i = 0;
  for (int32_t p = e; p >= 0; p = b->page_next[base + p], i++)
    b->free_pages[base + (size_t)(b->n_free[lg] + n - 1 - i)] = p;
  b->n_free[lg] += n;
}

static void evict_one(ra_wave_buffer *b, size_t lg) { evict_entry(b, lg, b->tail[lg]); }

/* Room for `more` staged rows and one more staged cluster. */
static int stage_reserve(ra_wave_buffer *b, int64_t more, ra_error *err) {
  if (b->stage_n + more > b->stage_cap) {
    int64_t cap = b->stage_cap ? b->stage_cap : 1024;
    while (cap < b->stage_n + more) cap *= 2;
    const size_t bytes = (size_t)cap * (size_t)b->hd * sizeof(float);
    float *k = realloc(b->stage_k, bytes);
    if (k) b->stage_k = k;
    float *v = k ? realloc(b->stage_v, bytes) : NULL;
    if (v) b->stage_v = v;
    int32_t *d = v ? realloc(b->stage_dst, (size_t)cap * sizeof *d) : NULL;
    if (d) b->stage_dst = d;
    if (!d) return ra_errorf(err, RA_ENOMEM, "wave buffer: out of memory staging %lld rows", (long long)cap);
    b->stage_cap = cap;
  }
  if (b->n_staged == b->cap_staged) {
    const size_t cap = b->cap_staged ? 2 * b->cap_staged : 256;
    struct staged *s = realloc(b->staged, cap * sizeof *s);
    if (!s) return ra_errorf(err, RA_ENOMEM, "wave buffer: out of memory staging clusters");
    b->staged = s;
    b->cap_staged = cap;
  }
  return RA_OK;
}

/* Forgets the batch; with drop, its clusters are evicted again (their rows never written). */
static void stage_clear(ra_wave_buffer *b, int drop) {
  for (size_t i = 0; i < b->n_staged; i++) {
    struct staged *s = &b->staged[i];
    if (!s->live) continue;
    const size_t base = s->lg * (size_t)b->n_pages;
    b->staged_of[base + s->first] = 0;
    if (drop) evict_entry(b, s->lg, s->first);
  }
  b->n_staged = 0;
  b->stage_n = 0;
  b->stage_layer = -1;
}

int ra_wave_buffer_install(ra_wave_buffer *b, int l, int g, int64_t c, const float *k, const float *v, int64_t n,
                           ra_error *err) {
  const size_t lg = lg_of(b, l, g), base = lg * (size_t)b->n_pages;
  if (c < 0 || c >= b->n_ids || n < 1)
    return ra_errorf(err, RA_EINVAL, "wave buffer: cluster %lld of %lld rows", (long long)c, (long long)n);
  if (b->stage_layer >= 0 && b->stage_layer != l)
    return ra_errorf(err, RA_ESTATE, "wave buffer: layer %d installs while layer %d's are staged", l, b->stage_layer);
  if (b->slot[lg * (size_t)b->n_ids + (size_t)c] >= 0 || n > b->rows) return RA_OK;
  int rc = stage_reserve(b, n, err);
  if (rc) return rc;
  const int64_t need = (n + RA_WAVE_BUFFER_PAGE - 1) / RA_WAVE_BUFFER_PAGE;
  while (b->n_free[lg] < need) evict_one(b, lg);
  const size_t hd = (size_t)b->hd;
  const int64_t row0 = (int64_t)g * b->rows, at = b->stage_n;
  int32_t first = -1, last = -1;
  for (int64_t i = 0; i < need; i++) {
    const int32_t p = b->free_pages[base + (size_t)--b->n_free[lg]];
    if (last >= 0) b->page_next[base + last] = p;
    else first = p;
    b->page_next[base + p] = -1;
    last = p;
    for (int64_t r = i * RA_WAVE_BUFFER_PAGE; r < n && r < (i + 1) * RA_WAVE_BUFFER_PAGE; r++)
      b->stage_dst[at + r] = (int32_t)(row0 + (int64_t)p * RA_WAVE_BUFFER_PAGE + r % RA_WAVE_BUFFER_PAGE);
  }
  memcpy(b->stage_k + (size_t)at * hd, k, (size_t)n * hd * sizeof *k);
  memcpy(b->stage_v + (size_t)at * hd, v, (size_t)n * hd * sizeof *v);
  b->stage_n += n;
  b->stage_layer = l;
  b->staged[b->n_staged] = (struct staged){.lg = lg, .first = first, .row0 = at, .n = n, .live = 1};
  b->staged_of[base + first] = (int32_t)(++b->n_staged);
  b->ent_c[base + first] = (int32_t)c;
  b->ent_rows[base + first] = (int32_t)n;
  b->slot[lg * (size_t)b->n_ids + (size_t)c] = first;
  lru_push(b, lg, first);
  return RA_OK;
}

void ra_wave_buffer_discard(ra_wave_buffer *b) { stage_clear(b, 1); }

int ra_wave_buffer_commit(ra_wave_buffer *b, ra_error *err) {
  if (b->stage_layer < 0) return RA_OK;
  const int l = b->stage_layer;
  const size_t hd = (size_t)b->hd;
  /* rows of clusters a later install of the batch evicted are dropped */
  int64_t n = 0;
  for (size_t i = 0; i < b->n_staged; i++) {
    struct staged *s = &b->staged[i];
    if (!s->live) continue;
    if (s->row0 != n) {
      memmove(b->stage_k + (size_t)n * hd, b->stage_k + (size_t)s->row0 * hd, (size_t)s->n * hd * sizeof(float));
      memmove(b->stage_v + (size_t)n * hd, b->stage_v + (size_t)s->row0 * hd, (size_t)s->n * hd * sizeof(float));
      memmove(b->stage_dst + n, b->stage_dst + s->row0, (size_t)s->n * sizeof *b->stage_dst);
    }
    n += s->n;
  }
  ra_backend *be = b->be;
  int rc = RA_OK;
  if (n > b->dev_cap) {
    ra_tensor_free(&b->dev_k);
    ra_tensor_free(&b->dev_v);
    b->dev_cap = 0;
    const int64_t shape[2] = {n + n / 2, (int64_t)hd};
    rc = ra_tensor_new(be, &b->dev_k, RA_DTYPE_F32, 2, shape, err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &b->dev_v, RA_DTYPE_F32, 2, shape, err);
    if (rc == RA_OK) b->dev_cap = shape[0];
  }
  if (rc == RA_OK && n > 0) {
    ra_tensor tk = ra_tensor_matrix(&b->k[l], (int64_t)hd), tv = ra_tensor_matrix(&b->v[l], (int64_t)hd);
    rc = be->ops->upload(be, &b->dev_k, 0, b->stage_k, (size_t)n * hd, err);
    if (rc == RA_OK) rc = be->ops->upload(be, &b->dev_v, 0, b->stage_v, (size_t)n * hd, err);
    if (rc == RA_OK) rc = be->ops->set_rows(be, &tk, b->stage_dst, n, &b->dev_k, err);
    if (rc == RA_OK) rc = be->ops->set_rows(be, &tv, b->stage_dst, n, &b->dev_v, err);
  }
  stage_clear(b, rc != RA_OK);
  return rc;
}

int ra_wave_buffer_attend(ra_wave_buffer *b, int l, const ra_tensor *q, float scale, const ra_tensor **o,
                          const ra_tensor **ml, uint64_t *rows, ra_error *err) {
  *o = *ml = NULL;
  *rows = 0;
  int any = 0;
  for (int g = 0; g < b->n_kv; g++) any |= b->n_ranges[g] > 0;
  if (!any) return RA_OK;
  ra_backend *be = b->be;
  const int64_t group = b->n_heads / b->n_kv;
  const ra_tensor qm = ra_tensor_matrix(q, b->hd);
  int rc = RA_OK;
  for (int g = 0; g < b->n_kv && rc == RA_OK; g++) {
    ra_tensor qg = ra_tensor_rows(&qm, g * group, group), og = ra_tensor_rows(&b->o, g * group, group);
    ra_tensor mg = ra_tensor_rows(&b->ml, g * group, group);
    if (b->n_ranges[g] == 0) {
      /* the empty partial (m = -inf, l = 0, o = 0): the merge weighs it 0 */
      for (int64_t h = 0; h < group && rc == RA_OK; h++)
        rc = be->ops->upload(be, &mg, (size_t)h * 2, b->empty_ml, 2, err);
      if (rc == RA_OK) rc = be->ops->upload(be, &og, 0, b->zeros, (size_t)group * (size_t)b->hd, err);
      continue;
    }
    ra_tensor kg = ra_tensor_rows(&b->k[l], g * b->rows, b->rows), vg = ra_tensor_rows(&b->v[l], g * b->rows, b->rows);
    rc = be->ops->attn_decode(be, &qg, &kg, &vg, b->ranges + (size_t)g * (size_t)b->n_pages, b->n_ranges[g], scale,
                              &og, &mg, err);
    *rows += (uint64_t)b->hit_rows[g];
  }
  for (int g = 0; g < b->n_kv; g++) {
    b->n_ranges[g] = 0;
    b->hit_rows[g] = 0;
  }
  if (rc) return rc;
  *o = &b->o;
  *ml = &b->ml;
  return RA_OK;
}
