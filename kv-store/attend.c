#include "attend.h"

#include "attend_wave.h"
#include "clock.h"
#include "merge.h"
#include "retro.h"
#include "topk.h"
#include "vec.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows per dot-product strip: a strip of keys (64 x head_dim x 2 bytes = 16 KiB for head_dim
 * 128, fp16) stays in L1 while every q head of the group reads it. */
#define KVS_STRIP_ROWS 64
/* Row-block bounds of one task: large enough to amortize scheduling, small enough that a
 * single head over 32K tokens still spreads over 16 threads. */
#define KVS_BLOCK_MIN 1024
#define KVS_BLOCK_MAX 16384

/* The request heads reading one kv head. */
typedef struct group {
  uint32_t kv_head;
  size_t first; /* into the members array (request head indices) */
  size_t count;
  uint64_t n_keys;
} group;

/* Rows [r0, r1) of one shard for one group; `row_base` numbers r0 within the kv head. */
typedef struct task {
  uint32_t group;
  const kvs_shard *shard;
  uint64_t r0, r1;
  uint64_t row_base;
  size_t slot; /* first per-(task, member) result slot */
} task;

typedef struct plan {
  const kvs_session *s;
  const kvs_attend_args *a;
  int dim;
  size_t rb; /* bytes per stored row */
  float scale;
  size_t *members; /* [n_heads] request head indices, grouped by kv head */
  group *groups;
  size_t n_groups;
  task *tasks;
  size_t n_tasks;
  size_t n_slots;
  size_t max_block;
  size_t max_group;
} plan;

static int check_args(const kvs_session *s, const kvs_attend_args *a, ra_error *err) {
  const kvs_geometry *g = &s->geo;
  if (a->layer >= g->n_layers)
    return ra_errorf(err, RA_EINVAL, "layer %u out of range [0, %u)", a->layer, g->n_layers);
  if (a->n_heads == 0) return ra_errorf(err, RA_EINVAL, "no q heads asked for");
  if (a->n_heads > g->n_q_heads)
    return ra_errorf(err, RA_EINVAL, "%zu q heads asked for, the model has %u", a->n_heads,
                     g->n_q_heads);
  if ((unsigned)a->mode >= RA_MODE_COUNT)
    return ra_errorf(err, RA_EINVAL, "attend mode %d is unknown", (int)a->mode);
  if (ra_mode_to_wire(a->mode) == RA_MODE_NO_WIRE)
    return ra_errorf(err, RA_EINVAL, "mode %s is not one a kv-store answers", ra_mode_name(a->mode));
  if (ra_mode_takes_top_k(a->mode) && a->top_k == 0)
    return ra_errorf(err, RA_EINVAL, "mode %s needs top_k > 0", ra_mode_name(a->mode));
  if (ra_mode_takes_top_k(a->mode) && a->top_k > RA_ATTEND_MAX_TOP_K)
    return ra_errorf(err, RA_EINVAL, "top_k %u out of range [1, %u]", a->top_k, RA_ATTEND_MAX_TOP_K);
  if (a->retro_window > 0 && !ra_mode_takes_retro(a->mode))
    return ra_errorf(err, RA_EINVAL, "retro: mode %s has no retrieval to correct (flat, ivf, kgraph, roar and wave do)",
                     ra_mode_name(a->mode));
  if (a->retro_window > KVS_RETRO_MAX_WINDOW || a->n_retro > a->retro_window)
    return ra_errorf(err, RA_EINVAL, "retro: window %u with %u past queries (window at most %d, queries at most the window)",
                     a->retro_window, a->n_retro, KVS_RETRO_MAX_WINDOW);
  if (a->retro_window > 0 && (a->retro_step == 0 || (a->n_retro > 0 && !a->retro_q)))
    return ra_errorf(err, RA_EINVAL, "retro: step %llu (steps count from 1) with %u past queries",
                     (unsigned long long)a->retro_step, a->n_retro);
  uint32_t group_size = g->n_q_heads / g->n_kv_heads;
  uint8_t seen[KVS_MAX_Q_HEADS / 8] = {0};
  for (size_t i = 0; i < a->n_heads; i++) {
    uint32_t h = a->q_heads[i];
    if (h >= g->n_q_heads)
      return ra_errorf(err, RA_EINVAL, "q head %u out of range [0, %u)", h, g->n_q_heads);
    size_t count;
    kvs_session_head(s, a->layer, h / group_size, &count);
    if (count == 0)
      return ra_errorf(err, RA_EINVAL, "q head %u (kv head %u) of layer %u is not stored here", h,
                       h / group_size, a->layer);
    if (seen[h / 8] & (1u << (h % 8)))
      return ra_errorf(err, RA_EINVAL, "q head %u asked for twice", h);
    seen[h / 8] |= (uint8_t)(1u << (h % 8));
  }
  return RA_OK;
}

static uint64_t kv_head_rows(const kvs_session *s, uint32_t layer, uint32_t kv_head) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(s, layer, kv_head, &count);
  uint64_t n = 0;
  for (size_t i = 0; i < count; i++) n += sh[i].n;
  return n;
}

static void plan_free(plan *p) {
  free(p->members);
  free(p->groups);
  free(p->tasks);
}

/* Groups the request heads by kv head and cuts every group's rows into tasks. */
static int plan_build(const kvs_session *s, const kvs_attend_args *a, int n_threads, plan *p,
                      ra_error *err) {
  memset(p, 0, sizeof *p);
  p->s = s;
  p->a = a;
  p->dim = (int)s->geo.head_dim;
  p->rb = kvs_row_bytes(&s->geo);
  p->scale = 1.0f / sqrtf((float)s->geo.head_dim);
  uint32_t group_size = s->geo.n_q_heads / s->geo.n_kv_heads;
  p->members = malloc(a->n_heads * sizeof *p->members);
  p->groups = malloc(a->n_heads * sizeof *p->groups);
  if (!p->members || !p->groups) goto oom;

  /* Groups in order of first appearance; members of a group in request order. */
  for (size_t i = 0; i < a->n_heads; i++) {
    uint32_t kv = a->q_heads[i] / group_size;
    size_t gi = 0;
    while (gi < p->n_groups && p->groups[gi].kv_head != kv) gi++;
    if (gi == p->n_groups) {
      p->groups[gi] = (group){.kv_head = kv, .n_keys = kv_head_rows(s, a->layer, kv)};
      p->n_groups++;
    }
    p->groups[gi].count++;
  }
  size_t at = 0;
  uint64_t total_rows = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    p->groups[gi].first = at;
    at += p->groups[gi].count;
    p->groups[gi].count = 0;
    total_rows += p->groups[gi].n_keys;
  }
  /* Second pass: place each head in its group's range (counts refilled as we go). */
  for (size_t i = 0; i < a->n_heads; i++) {
    uint32_t kv = a->q_heads[i] / group_size;
    size_t gi = 0;
    while (p->groups[gi].kv_head != kv) gi++;
    group *g = &p->groups[gi];
    p->members[g->first + g->count++] = i;
    if (g->count > p->max_group) p->max_group = g->count;
  }

  uint64_t block = total_rows / ((uint64_t)n_threads * 4 + 1);
  if (block < KVS_BLOCK_MIN) block = KVS_BLOCK_MIN;
  if (block > KVS_BLOCK_MAX) block = KVS_BLOCK_MAX;
  size_t n_tasks = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    size_t count;
    const kvs_shard *sh = kvs_session_head(s, a->layer, p->groups[gi].kv_head, &count);
    for (size_t k = 0; k < count; k++) n_tasks += (size_t)((sh[k].n + block - 1) / block);
  }
  p->tasks = malloc((n_tasks ? n_tasks : 1) * sizeof *p->tasks);
  if (!p->tasks) goto oom;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    size_t count;
    const kvs_shard *sh = kvs_session_head(s, a->layer, p->groups[gi].kv_head, &count);
    uint64_t base = 0;
    for (size_t k = 0; k < count; k++) {
      for (uint64_t r0 = 0; r0 < sh[k].n; r0 += block) {
        uint64_t r1 = r0 + block < sh[k].n ? r0 + block : sh[k].n;
        p->tasks[p->n_tasks++] = (task){.group = (uint32_t)gi, .shard = &sh[k], .r0 = r0,
                                        .r1 = r1, .row_base = base + r0, .slot = p->n_slots};
        p->n_slots += p->groups[gi].count;
        if (r1 - r0 > p->max_block) p->max_block = (size_t)(r1 - r0);
      }
      base += sh[k].n;
    }
  }
  return RA_OK;
oom:
  plan_free(p);
  return ra_errorf(err, RA_ENOMEM, "out of memory planning an attend over %zu heads", a->n_heads);
}

/* scores[j * rows + r] = q_j · k_(r0 + r) for every member j of the task's group.
 * scores: [G, rows]. */
static void task_scores(const plan *p, const task *t, float *scores) {
  const group *g = &p->groups[t->group];
  size_t rows = (size_t)(t->r1 - t->r0);
  const char *keys = (const char *)t->shard->keys + t->r0 * p->rb;
  ra_dtype dt = p->s->geo.dtype;
  for (size_t r = 0; r < rows; r += KVS_STRIP_ROWS) {
    size_t nb = rows - r < KVS_STRIP_ROWS ? rows - r : KVS_STRIP_ROWS;
    for (size_t j = 0; j < g->count; j++) {
      const float *q = p->a->q + p->members[g->first + j] * (size_t)p->dim;
      ra_vec_dot_rows(q, keys + r * p->rb, dt, p->dim, NULL, nb, scores + j * rows + r);
    }
  }
}

/* The exact partial of each member over the task's rows. o: [G, dim], m, l: [G]. */
static void task_full(const plan *p, const task *t, float *scores, float *o, float *m, float *l) {
  const group *g = &p->groups[t->group];
  size_t rows = (size_t)(t->r1 - t->r0);
  int dim = p->dim;
  task_scores(p, t, scores);
  for (size_t j = 0; j < g->count; j++) {
    float *sc = scores + j * rows;
    float mx = -INFINITY;
    for (size_t r = 0; r < rows; r++) {
      sc[r] *= p->scale;
      if (sc[r] > mx) mx = sc[r];
    }
    m[j] = mx;
    l[j] = 0.0f;
    memset(o + j * (size_t)dim, 0, (size_t)dim * sizeof(float));
  }
  const char *values = (const char *)t->shard->values + t->r0 * p->rb;
  ra_dtype dt = p->s->geo.dtype;
  for (size_t r = 0; r < rows; r++) {
    const void *v = values + r * p->rb;
    for (size_t j = 0; j < g->count; j++) {
      float w = expf(scores[j * rows + r] - m[j]);
      l[j] += w;
      ra_vec_axpy(o + j * (size_t)dim, w, v, dt, dim);
    }
  }
  for (size_t j = 0; j < g->count; j++) {
    float inv = 1.0f / l[j];
    for (int d = 0; d < dim; d++) o[j * (size_t)dim + d] *= inv;
  }
}

/* Pushes each member's scores for the task's rows into its own heap. */
static void task_flat(const plan *p, const task *t, float *scores, ra_topk *heaps) {
  const group *g = &p->groups[t->group];
  size_t rows = (size_t)(t->r1 - t->r0);
  task_scores(p, t, scores);
  for (size_t j = 0; j < g->count; j++) {
    ra_topk *h = &heaps[j];
    const float *sc = scores + j * rows;
    for (size_t r = 0; r < rows; r++) ra_topk_push(h, sc[r], (uint32_t)(t->row_base + r));
  }
}

/* Resolves a row number of (layer, kv head) to its shard and row within it. */
static const kvs_shard *row_locate(const kvs_shard *sh, size_t count, uint32_t row,
                                   uint64_t *local) {
  uint64_t base = 0;
  for (size_t k = 0; k < count; k++) {
    if (row < base + sh[k].n) {
      *local = row - base;
      return &sh[k];
    }
    base += sh[k].n;
  }
  return NULL;
}

/* Exact partial of q over the selected rows ids[0..n) of (layer, kv head); the step every
 * selecting mode (flat, and the index modes) ends with. dots: [n] the q·k already known for
 * each id (flat has them from the scan). Also turns ids into token positions when pos != NULL. */
static void partial_over_rows(const plan *p, uint32_t kv_head, const uint32_t *ids,
                              const float *dots, size_t n, ra_partial *out, uint64_t *pos) {
  float *o = out->o;
  size_t count;
  const kvs_shard *sh = kvs_session_head(p->s, p->a->layer, kv_head, &count);
  ra_dtype dt = p->s->geo.dtype;
  float mx = -INFINITY;
  for (size_t i = 0; i < n; i++)
    if (dots[i] * p->scale > mx) mx = dots[i] * p->scale;
  memset(o, 0, (size_t)p->dim * sizeof(float));
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) {
    uint64_t local = 0;
    const kvs_shard *k = row_locate(sh, count, ids[i], &local);
    float w = expf(dots[i] * p->scale - mx);
    sum += w;
    ra_vec_axpy(o, w, (const char *)k->values + local * p->rb, dt, p->dim);
    if (pos) pos[i] = k->spec.token_begin + local;
  }
  if (n > 0) {
    for (int d = 0; d < p->dim; d++) o[d] /= sum;
  }
  out->m = mx;
  out->l = sum;
}

static int result_alloc(const plan *p, kvs_attend_result *out) {
  const kvs_attend_args *a = p->a;
  memset(out, 0, sizeof *out);
  out->n_heads = a->n_heads;
  out->heads = calloc(a->n_heads, sizeof *out->heads);
  out->o = calloc(a->n_heads * (size_t)p->dim, sizeof *out->o);
  if (!out->heads || !out->o) return RA_ENOMEM;
  size_t n_ids = 0;
  if (a->want_ids || a->retro_window) {
    for (size_t gi = 0; gi < p->n_groups; gi++) {
      uint64_t per = p->groups[gi].n_keys;
      if (a->mode != RA_MODE_FULL && per > a->top_k) per = a->top_k;
      n_ids += (size_t)per * p->groups[gi].count;
    }
    out->ids = malloc((n_ids ? n_ids : 1) * sizeof *out->ids);
    if (!out->ids) return RA_ENOMEM;
  }
  for (size_t i = 0; i < a->n_heads; i++) {
    out->heads[i].q_head = a->q_heads[i];
    out->heads[i].part = (ra_partial){.o = out->o + i * (size_t)p->dim, .m = -INFINITY};
  }
  return RA_OK;
}

/* Token positions of every row of (layer, kv head), in row order. */
static void all_positions(const plan *p, uint32_t kv_head, uint64_t *pos) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(p->s, p->a->layer, kv_head, &count);
  for (size_t k = 0; k < count; k++)
    for (uint64_t r = 0; r < sh[k].n; r++) *pos++ = sh[k].spec.token_begin + r;
}

static int run_full(const plan *p, int nt, kvs_attend_result *out, ra_error *err) {
  int dim = p->dim;
  float *o = malloc((p->n_slots ? p->n_slots : 1) * (size_t)dim * sizeof *o);
  float *ml = malloc((p->n_slots ? p->n_slots : 1) * 2 * sizeof *ml);
  if (!o || !ml) {
    free(o);
    free(ml);
    return ra_errorf(err, RA_ENOMEM, "out of memory for %zu partials", p->n_slots);
  }
  atomic_int failed = 0;
#pragma omp parallel num_threads(nt) if (p->n_tasks > 1)
  {
    float *scores = malloc((p->max_block * p->max_group + 1) * sizeof *scores);
    if (!scores) atomic_store(&failed, 1);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < p->n_tasks; ti++) {
      if (!scores) continue;
      const task *t = &p->tasks[ti];
      task_full(p, t, scores, o + t->slot * (size_t)dim, ml + t->slot, ml + p->n_slots + t->slot);
    }
    free(scores);
  }
  if (atomic_load(&failed)) {
    free(o);
    free(ml);
    return ra_errorf(err, RA_ENOMEM, "out of memory for attention scratch");
  }
  /* Merge each head's block partials in task order (deterministic). */
  for (size_t ti = 0; ti < p->n_tasks; ti++) {
    const task *t = &p->tasks[ti];
    const group *g = &p->groups[t->group];
    for (size_t j = 0; j < g->count; j++) {
      ra_head_partial *h = &out->heads[p->members[g->first + j]];
      size_t slot = t->slot + j;
      ra_partial_merge(&h->part, o + slot * (size_t)dim, ml[slot], ml[p->n_slots + slot], dim);
    }
  }
  uint64_t *ids = out->ids;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    const group *g = &p->groups[gi];
    for (size_t j = 0; j < g->count; j++) {
      ra_head_partial *h = &out->heads[p->members[g->first + j]];
      h->n_scanned = h->n_keys = g->n_keys;
      if (ids) {
        h->ids = ids;
        h->n_ids = h->ids_cap = (size_t)g->n_keys;
        all_positions(p, g->kv_head, ids);
        ids += g->n_keys;
      }
    }
  }
  free(o);
  free(ml);
  return RA_OK;
}

/* The step every selecting mode ends with: each head's selection (final, by request head) sorted
 * best first, its token positions into out->ids when asked, and the exact partial over it. */
static void finish_selected(const plan *p, ra_topk *final, kvs_attend_result *out) {
  uint64_t *pos = out->ids;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    const group *g = &p->groups[gi];
    for (size_t j = 0; j < g->count; j++) {
      size_t hi = p->members[g->first + j];
      ra_head_partial *h = &out->heads[hi];
      ra_topk *sel = &final[hi];
      ra_topk_sort(sel);
      h->n_keys = g->n_keys;
      if (pos) {
        h->ids = pos;
        h->n_ids = h->ids_cap = sel->n;
        pos += sel->n;
      }
      partial_over_rows(p, g->kv_head, sel->id, sel->score, sel->n, &h->part, h->ids);
    }
  }
}

static int run_flat(const plan *p, int nt, kvs_attend_result *out, ra_error *err) {
  uint32_t k = p->a->top_k;
  ra_topk *heaps = calloc(p->n_slots ? p->n_slots : 1, sizeof *heaps);
  ra_topk *final = calloc(p->a->n_heads, sizeof *final);
  int rc = RA_OK;
  if (!heaps || !final) {
    rc = RA_ENOMEM;
    goto done;
  }
  for (size_t ti = 0; ti < p->n_tasks && rc == RA_OK; ti++) {
    const task *t = &p->tasks[ti];
    size_t cap = t->r1 - t->r0 < k ? (size_t)(t->r1 - t->r0) : k;
    for (size_t j = 0; j < p->groups[t->group].count && rc == RA_OK; j++)
      rc = ra_topk_init(&heaps[t->slot + j], cap);
  }
  for (size_t gi = 0; gi < p->n_groups && rc == RA_OK; gi++) {
    const group *g = &p->groups[gi];
    size_t cap = g->n_keys < k ? (size_t)g->n_keys : k;
    for (size_t j = 0; j < g->count && rc == RA_OK; j++)
      rc = ra_topk_init(&final[p->members[g->first + j]], cap);
  }
  if (rc) goto done;

  atomic_int failed = 0;
#pragma omp parallel num_threads(nt) if (p->n_tasks > 1)
  {
    float *scores = malloc((p->max_block * p->max_group + 1) * sizeof *scores);
    if (!scores) atomic_store(&failed, 1);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < p->n_tasks; ti++) {
      if (scores) task_flat(p, &p->tasks[ti], scores, &heaps[p->tasks[ti].slot]);
    }
    free(scores);
  }
  if (atomic_load(&failed)) {
    rc = RA_ENOMEM;
    goto done;
  }
  for (size_t ti = 0; ti < p->n_tasks; ti++) {
    const task *t = &p->tasks[ti];
    const group *g = &p->groups[t->group];
    for (size_t j = 0; j < g->count; j++) {
      ra_topk *src = &heaps[t->slot + j];
      ra_topk *dst = &final[p->members[g->first + j]];
      for (size_t i = 0; i < src->n; i++) ra_topk_push(dst, src->score[i], src->id[i]);
    }
  }
  finish_selected(p, final, out);
  for (size_t i = 0; i < p->a->n_heads; i++) out->heads[i].n_scanned = out->heads[i].n_keys; /* an exact scan */
done:
  for (size_t i = 0; heaps && i < p->n_slots; i++) ra_topk_free(&heaps[i]);
  for (size_t i = 0; final && i < p->a->n_heads; i++) ra_topk_free(&final[i]);
  free(heaps);
  free(final);
  if (rc) return ra_errorf(err, rc, "out of memory for top-%u heaps", k);
  return RA_OK;
}

/* One search of an index mode: request head `head` over one shard of its kv head. */
typedef struct search_task {
  size_t head;       /* request head index */
  const kvs_shard *shard;
  const ra_index *ix;
  uint64_t row_base; /* the shard's first row within the kv head */
} search_task;

/* One task per (asked head, shard of its kv head), each with the index it searches; RA_ESTATE
 * when a shard has none of the mode's kind (even an empty one: BuildIndex builds on every shard
 * of the kv head, so a missing index means the client skipped it). */
static int index_tasks(const plan *p, ra_mode kind, search_task **out, size_t *n_out,
                       ra_error *err) {
  const kvs_attend_args *a = p->a;
  size_t n = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    size_t count;
    kvs_session_head(p->s, a->layer, p->groups[gi].kv_head, &count);
    n += count * p->groups[gi].count;
  }
  search_task *t = malloc((n ? n : 1) * sizeof *t);
  if (!t) return ra_errorf(err, RA_ENOMEM, "out of memory planning %zu index searches", n);
  size_t at = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    const group *g = &p->groups[gi];
    size_t count;
    const kvs_shard *sh = kvs_session_head(p->s, a->layer, g->kv_head, &count);
    for (size_t j = 0; j < g->count; j++) {
      size_t hi = p->members[g->first + j];
      uint64_t base = 0;
      for (size_t k = 0; k < count; k++) {
        const ra_index *ix = kvs_shard_index(p->s, &sh[k], kind, a->q_heads[hi]);
        if (!ix) {
          free(t);
          char range[64];
          if (sh[k].spec.token_end == RA_TOKEN_END_OPEN)
            snprintf(range, sizeof range, "%llu-open", (unsigned long long)sh[k].spec.token_begin);
          else
            snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)sh[k].spec.token_begin,
                     (unsigned long long)sh[k].spec.token_end);
          return ra_errorf(err, RA_ESTATE,
                           "mode %s needs an index: none built for layer %u q head %u (shard "
                           "tokens %s)",
                           ra_mode_name(a->mode), a->layer, a->q_heads[hi], range);
        }
        t[at++] = (search_task){.head = hi, .shard = &sh[k], .ix = ix, .row_base = base};
        base += sh[k].n;
      }
    }
  }
  *out = t;
  *n_out = n;
  return RA_OK;
}

/* Rows per block of the exact scan of an index's lag. */
#define KVS_TAIL_BLOCK 256

/* The exact scan of rows [from, shard n) that the index does not hold yet, merged with the
 * search's n results in ids/scores (room for k); returns the new count. *heap is created on
 * first use (a lag is rare) and kept for the thread. */
static uint32_t scan_tail(const plan *p, const search_task *t, const float *q, uint32_t from,
                          uint32_t k, uint32_t n, uint32_t *ids, float *scores, ra_topk *heap,
                          uint64_t *scanned) {
  const kvs_shard *sh = t->shard;
  float buf[KVS_TAIL_BLOCK];
  if (!heap->score && ra_topk_init(heap, k) != RA_OK) return UINT32_MAX;
  ra_topk_reset(heap);
  for (uint32_t i = 0; i < n; i++) ra_topk_push(heap, scores[i], ids[i]);
  for (uint64_t r = from; r < sh->n; r += KVS_TAIL_BLOCK) {
    size_t nb = sh->n - r < KVS_TAIL_BLOCK ? (size_t)(sh->n - r) : KVS_TAIL_BLOCK;
    ra_vec_dot_rows(q, (const char *)sh->keys + r * p->rb, p->s->geo.dtype, p->dim, NULL, nb,
                    buf);
    for (size_t i = 0; i < nb; i++) ra_topk_push(heap, buf[i], (uint32_t)(r + i));
    *scanned += nb;
  }
  memcpy(ids, heap->id, heap->n * sizeof *ids);
  memcpy(scores, heap->score, heap->n * sizeof *scores);
  return (uint32_t)heap->n;
}

static int run_index(const plan *p, int nt, kvs_attend_result *out, ra_error *err) {
  const kvs_attend_args *a = p->a;
  const ra_mode kind = a->mode;
  /* No head can use more candidates than its kv head has keys. */
  uint64_t most = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++)
    if (p->groups[gi].n_keys > most) most = p->groups[gi].n_keys;
  const uint32_t k = a->top_k < most ? a->top_k : (uint32_t)most;
  search_task *tasks = NULL;
  size_t n_tasks = 0;
  int rc = index_tasks(p, kind, &tasks, &n_tasks, err);
  if (rc) return rc;
  ra_search_params sp;
  ra_search_params_default(kind, &sp);
#define PICK_(name, type, lo, hi, modes, zero, flag, help) \
  if (a->search.name) sp.name = a->search.name;
  RA_SEARCH_PARAM_TABLE(PICK_)
#undef PICK_
  /* Per task: up to k candidates (shard rows, q·k) and the dot products computed. */
  uint32_t *cid = malloc((n_tasks * k + 1) * sizeof *cid);
  float *csc = malloc((n_tasks * k + 1) * sizeof *csc);
  uint32_t *cn = calloc(n_tasks + 1, sizeof *cn);
  uint64_t *cscan = calloc(n_tasks + 1, sizeof *cscan);
  ra_topk *final = calloc(a->n_heads, sizeof *final);
  if (!cid || !csc || !cn || !cscan || !final) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for %zu index searches of top %u", n_tasks, k);
    goto done;
  }
  kvs_store *st = p->s->store;
  atomic_int failed = RA_OK;
#pragma omp parallel num_threads(nt) if (n_tasks > 1)
  {
    ra_index_scratch *sc = kvs_store_scratch_get(st);
    ra_topk heap = {0};
    uint64_t n_search = 0, n_exact = 0, wait_us = 0, search_us = 0, search_cpu_us = 0;
    if (!sc) atomic_store(&failed, RA_ENOMEM);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < n_tasks; ti++) {
      const search_task *t = &tasks[ti];
      if (!sc || atomic_load(&failed) != RA_OK) continue;
      const float *q = a->q + t->head * (size_t)p->dim;
      uint32_t *ids = cid + ti * k;
      float *scores = csc + ti * k;
      uint32_t n = 0;
      uint64_t scanned = 0;
      ra_keys keys = {.rows = t->shard->keys, .dtype = p->s->geo.dtype, .dim = p->dim,
                      .n = (uint32_t)t->shard->n};
      int src = RA_OK;
      /* how long an exact scan of the shard takes (~8 GB/s of keys on one core), at most 2 ms */
      uint64_t scan_us = (uint64_t)t->shard->n * kvs_row_bytes(&p->s->geo) / 8000u;
      const uint64_t w0 = ra_clock_now_us();
      const int locked = kvs_shard_index_timed_read_lock(t->shard, scan_us < 2000 ? scan_us : 2000);
      const uint64_t w1 = ra_clock_now_us(), c1 = ra_clock_thread_cpu_us();
      wait_us += w1 - w0;
      n_search++;
      if (locked) {
        /* The search and the lag scan see one state of the index: the background indexer cannot
         * insert in between (which would drop a row from both) nor during the search. */
        src = ra_index_search(t->ix, &keys, q, k, &sp, sc, ids, scores, &n, &scanned);
        uint32_t from = ra_index_count(t->ix);
        if (src == RA_OK && from < t->shard->n)
          n = scan_tail(p, t, q, from, k, n, ids, scores, &heap, &scanned);
        kvs_shard_index_read_unlock(t->shard);
      } else {
        /* The indexer kept this shard for longer than an exact scan of it takes: scan it, which is
         * exact, so the result is at least as good (why bounded: bench/results/defaults). */
        n = scan_tail(p, t, q, 0, k, 0, ids, scores, &heap, &scanned);
        n_exact++;
      }
      search_us += ra_clock_now_us() - w1;
      search_cpu_us += ra_clock_thread_cpu_us() - c1;
      if (src != RA_OK || n == UINT32_MAX) {
        atomic_store(&failed, src != RA_OK ? src : RA_ENOMEM);
        continue;
      }
      cn[ti] = n;
      cscan[ti] = scanned;
    }
    ra_topk_free(&heap);
    kvs_store_scratch_put(st, sc);
#pragma omp atomic
    out->n_searches += n_search;
#pragma omp atomic
    out->n_searches_exact += n_exact;
#pragma omp atomic
    out->lock_wait_us += wait_us;
#pragma omp atomic
    out->search_us += search_us;
#pragma omp atomic
    out->search_cpu_us += search_cpu_us;
  }
  if ((rc = atomic_load(&failed)) != RA_OK) {
    rc = ra_errorf(err, rc, "%s search failed: %s", ra_mode_name(a->mode), ra_strerror(rc));
    goto done;
  }
  /* The global top-k of each head over its shards' candidates, in kv-head row numbers. */
  for (size_t gi = 0; gi < p->n_groups && rc == RA_OK; gi++) {
    const group *g = &p->groups[gi];
    size_t cap = g->n_keys < k ? (size_t)g->n_keys : k;
    for (size_t j = 0; j < g->count && rc == RA_OK; j++)
      if (ra_topk_init(&final[p->members[g->first + j]], cap) != RA_OK)
        rc = ra_errorf(err, RA_ENOMEM, "out of memory for top-%u heaps", k);
  }
  if (rc) goto done;
  for (size_t ti = 0; ti < n_tasks; ti++) {
    const search_task *t = &tasks[ti];
    ra_head_partial *h = &out->heads[t->head];
    h->n_scanned += cscan[ti];
    for (uint32_t i = 0; i < cn[ti]; i++)
      ra_topk_push(&final[t->head], csc[ti * k + i], (uint32_t)(t->row_base + cid[ti * k + i]));
  }
  finish_selected(p, final, out);
done:
  for (size_t i = 0; final && i < a->n_heads; i++) ra_topk_free(&final[i]);
  free(final);
  free(tasks);
  free(cid);
  free(csc);
  free(cn);
  free(cscan);
  return rc;
}

/* Exact partial of q [dim] over the rows of (layer, kv head) at token positions pos [n] (each
 * stored here). dots, vals: [n] scratch. */
static void partial_over_positions(const plan *p, uint32_t kv_head, const float *q, const uint64_t *pos, size_t n,
                                   float *dots, const void **vals, ra_partial *out) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(p->s, p->a->layer, kv_head, &count);
  const ra_dtype dt = p->s->geo.dtype;
  float mx = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    while (k + 1 < count && pos[i] >= sh[k].spec.token_begin + sh[k].n) k++;
    const uint64_t local = pos[i] - sh[k].spec.token_begin;
    ra_vec_dot_rows(q, (const char *)sh[k].keys + local * p->rb, dt, p->dim, NULL, 1, &dots[i]);
    dots[i] *= p->scale;
    vals[i] = (const char *)sh[k].values + local * p->rb;
    if (dots[i] > mx) mx = dots[i];
  }
  memset(out->o, 0, (size_t)p->dim * sizeof(float));
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float w = expf(dots[i] - mx);
    sum += w;
    ra_vec_axpy(out->o, w, vals[i], dt, p->dim);
  }
  if (n > 0)
    for (int d = 0; d < p->dim; d++) out->o[d] /= sum;
  out->m = n > 0 ? mx : -INFINITY;
  out->l = sum;
}

/* Positions below this are stored here for (layer, kv head): its shards fill in token order. */
static uint64_t stored_horizon(const plan *p, uint32_t kv_head) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(p->s, p->a->layer, kv_head, &count);
  uint64_t h = 0;
  for (size_t k = 0; k < count; k++)
    if (sh[k].n && sh[k].spec.token_begin + sh[k].n > h) h = sh[k].spec.token_begin + sh[k].n;
  return h;
}

/* After the selection: each past query's partial over the positions it has not seen (retro.h),
 * then this step's record. The heads' ids hold the positions attended over. */
static int run_retro(const plan *p, kvs_attend_result *out, ra_error *err) {
  const kvs_attend_args *a = p->a;
  const uint64_t t0 = ra_clock_now_us();
  const size_t nh = a->n_heads, np = a->n_retro, dim = (size_t)p->dim;
  size_t most = 1;
  for (size_t i = 0; i < nh; i++)
    if (out->heads[i].n_ids > most) most = out->heads[i].n_ids;
  out->retro = calloc(np * nh + 1, sizeof *out->retro);
  out->retro_o = calloc(np * nh * dim + 1, sizeof *out->retro_o);
  uint64_t *diff = malloc(most * sizeof *diff);
  float *dots = malloc(most * sizeof *dots);
  const void **vals = malloc(most * sizeof *vals);
  int rc = (!out->retro || !out->retro_o || !diff || !dots || !vals)
               ? ra_errorf(err, RA_ENOMEM, "out of memory for %zu retro partials", np * nh)
               : RA_OK;
  kvs_retro *rt = p->s->retro;
  for (size_t gi = 0; gi < p->n_groups && rc == RA_OK; gi++) {
    const group *g = &p->groups[gi];
    const uint64_t horizon = stored_horizon(p, g->kv_head);
    for (size_t j = 0; j < g->count && rc == RA_OK; j++) {
      const size_t hi = p->members[g->first + j];
      const ra_head_partial *h = &out->heads[hi];
      for (size_t k = 1; k <= np; k++) {
        ra_head_partial *rp = &out->retro[(k - 1) * nh + hi];
        *rp = (ra_head_partial){.q_head = a->q_heads[hi], .n_keys = g->n_keys,
                                .part = {.o = out->retro_o + ((k - 1) * nh + hi) * dim, .m = -INFINITY}};
        if (a->retro_step <= k) continue;
        long nd = kvs_retro_unseen(rt, a->layer, a->q_heads[hi], a->retro_step, a->retro_step - k, h->ids, h->n_ids,
                                   diff);
        if (nd <= 0) continue;
        partial_over_positions(p, g->kv_head, a->retro_q + ((k - 1) * nh + hi) * dim, diff, (size_t)nd, dots,
                               vals, &rp->part);
        rp->n_scanned = (uint64_t)nd;
      }
      rc = kvs_retro_record(rt, a->layer, a->q_heads[hi], a->retro_step, horizon, h->ids, h->n_ids, err);
    }
  }
  free(diff);
  free(dots);
  free(vals);
  out->retro_us = ra_clock_now_us() - t0;
  return rc;
}

/* A bound of the bytes an attend allocates besides the shared search scratches: the top-k heaps
 * or candidate lists per task slot and per head, the per-thread score strips, the result's
 * partials and ids. Above KVS_ATTEND_UNCHARGED_BYTES it is charged to the store's budget for the
 * attend's duration, so a huge top_k over many heads and shards is RESOURCE_EXHAUSTED rather
 * than memory the budget never saw; below it (every decode step's attend: top_k 100 x 32 heads
 * is ~60 KB) it is not, so a store filled to its budget still serves its sessions. */
#define KVS_ATTEND_UNCHARGED_BYTES (1u << 20)
static uint64_t attend_work_bytes(const plan *p, int nt) {
  uint64_t most = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++)
    if (p->groups[gi].n_keys > most) most = p->groups[gi].n_keys;
  uint64_t k = p->a->mode == RA_MODE_FULL ? 0 : (p->a->top_k < most ? p->a->top_k : most);
  uint64_t heads = p->a->n_heads, dim = (uint64_t)p->dim;
  uint64_t ids = p->a->want_ids ? heads * (p->a->mode == RA_MODE_FULL ? most : k) * sizeof(uint64_t) : 0;
  return ((uint64_t)p->n_slots + 2 * heads) * k * (sizeof(float) + sizeof(uint32_t)) +
         (uint64_t)nt * p->max_block * p->max_group * sizeof(float) + heads * dim * sizeof(float) * 2 + ids;
}

int kvs_attend(kvs_session *s, const kvs_attend_args *a, kvs_attend_result *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  int nt = a->n_threads > 0 ? a->n_threads : omp_get_max_threads();
  pthread_rwlock_rdlock(&s->lock);
  int rc = check_args(s, a, err);
  if (rc == RA_OK && kvs_attend_is_wave(a)) rc = kvs_attend_wave(s, a, nt, out, err);
  if (rc || kvs_attend_is_wave(a)) {
    pthread_rwlock_unlock(&s->lock);
    return rc;
  }
  plan p;
  rc = plan_build(s, a, nt, &p, err);
  if (rc) {
    pthread_rwlock_unlock(&s->lock);
    return rc;
  }
  const uint64_t bound = attend_work_bytes(&p, nt), work = bound > KVS_ATTEND_UNCHARGED_BYTES ? bound : 0;
  if (work && (rc = kvs_store_charge(s->store, work, err)) != RA_OK) {
    pthread_rwlock_unlock(&s->lock);
    plan_free(&p);
    return ra_error_wrap(err, "attend working memory (%zu heads, top_k %u)", a->n_heads, a->top_k);
  }
  if (result_alloc(&p, out) != RA_OK) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for the attend result");
  } else if (a->mode == RA_MODE_FULL) {
    rc = run_full(&p, nt, out, err);
  } else if (a->mode == RA_MODE_FLAT) {
    rc = run_flat(&p, nt, out, err);
  } else {
    rc = run_index(&p, nt, out, err);
  }
  if (rc == RA_OK && a->retro_window) rc = run_retro(&p, out, err);
  if (rc == RA_OK && !a->want_ids)
    for (size_t i = 0; i < out->n_heads; i++) out->heads[i].n_ids = out->heads[i].ids_cap = 0;
  pthread_rwlock_unlock(&s->lock);
  plan_free(&p);
  kvs_store_uncharge(s->store, work);
  if (rc) {
    kvs_attend_result_free(out);
    return rc;
  }
  atomic_fetch_add(&s->n_searches, out->n_searches);
  atomic_fetch_add(&s->n_searches_exact, out->n_searches_exact);
  atomic_fetch_add(&s->lock_wait_us, out->lock_wait_us);
  atomic_fetch_add(&s->search_us, out->search_us);
  atomic_fetch_add(&s->search_cpu_us, out->search_cpu_us);
  return RA_OK;
}

void kvs_attend_result_free(kvs_attend_result *r) {
  if (!r) return;
  free(r->heads);
  free(r->o);
  free(r->ids);
  free(r->retro);
  free(r->retro_o);
  memset(r, 0, sizeof *r);
}
