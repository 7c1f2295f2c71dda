#include "attend_wave.h"

#include "clock.h"
#include "clusters.h"
#include "merge.h"
#include "retro.h"
#include "vec.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Rows per strip: 64 keys of head_dim 128 in fp16 are 16 KiB, in L1 while every q head of the
 * group scores them and their values are accumulated. */
#define WAVE_STRIP 64
/* Rows per task: enough to amortize scheduling and the per-task merge of [G, head_dim]. */
#define WAVE_TASK_MIN 256
#define WAVE_TASK_MAX 16384
/* Query sets of one pass: the request's queries (set 0), then each past step's (retro). */
#define WAVE_MAX_SETS (KVS_RETRO_MAX_WINDOW + 1)

int kvs_attend_is_wave(const kvs_attend_args *a) {
  return a->mode == RA_MODE_WAVE || a->wave.n_heads > 0 || a->wave.n_ids > 0 || a->wave.n_retro_counts > 0 ||
         a->wave.n_retro_ids > 0;
}

/* Consecutive rows [r0, r1) of one shard, attended by the query sets of mask (bit s: set s). */
typedef struct piece {
  const kvs_shard *shard;
  uint64_t r0, r1;
  uint32_t mask;
} piece;

/* The asked q heads of one kv head and the rows they attend: set s's over its clusters sel[s]
 * (NULL: the kv head is not named for set s). */
typedef struct wgroup {
  uint32_t kv_head;
  size_t first, count;  /* into members */
  const uint32_t *sel[WAVE_MAX_SETS];
  size_t n_sel[WAVE_MAX_SETS];
  size_t piece0, n_pieces;
  uint64_t n_rows[WAVE_MAX_SETS]; /* rows set s attends */
  uint64_t n_union;               /* rows any set attends: the rows loaded */
  uint64_t n_keys;
} wgroup;

/* Pieces [piece0, piece0 + n_pieces) of one group; partial slots [slot, slot + n_sets * G),
 * set s's at slot + s * G. */
typedef struct wtask {
  uint32_t group;
  size_t piece0, n_pieces;
  size_t slot;
} wtask;

/* The request's pass: set 0 (the request's q over its selected clusters and the lag) and sets
 * 1..n_retro (past step s's q over the clusters named for it), every row loaded once. */
typedef struct wplan {
  const kvs_session *s;
  const kvs_attend_args *a;
  size_t n_sets;
  int dim;
  size_t rb;
  size_t *members; /* [n_heads] request head indices, grouped by kv head */
  float *qs;       /* [n_sets, n_heads, dim] the members' queries times 1/sqrt(dim), in member order */
  int16_t *q16;    /* int8 rows: qs in int16 halves for Q K^T [n_sets, n_heads, 2, dim]; else NULL */
  float *qscale;   /* [n_sets, n_heads] their scales */
  wgroup *groups;
  size_t n_groups, max_group;
  piece *pieces;
  size_t n_pieces, cap_pieces;
  wtask *tasks;
  size_t n_tasks, n_slots;
} wplan;

static void plan_free(wplan *p) {
  free(p->members);
  free(p->qs);
  free(p->q16);
  free(p->qscale);
  free(p->groups);
  free(p->pieces);
  free(p->tasks);
}

/* Names set `set`'s clusters (selection w) to the groups. */
static int plan_select(wplan *p, size_t set, const kvs_wave_select *w, ra_error *err) {
  const kvs_attend_args *a = p->a;
  size_t off = 0;
  for (size_t i = 0; i < w->n_heads; i++) {
    const uint32_t kv = w->kv_heads[i];
    size_t gi = 0;
    while (gi < p->n_groups && p->groups[gi].kv_head != kv) gi++;
    if (gi == p->n_groups)
      return ra_errorf(err, RA_EINVAL,
                       "clusters selected for kv head %u, which no asked q head of layer %u reads",
                       kv, a->layer);
    if (p->groups[gi].sel[set])
      return ra_errorf(err, RA_EINVAL, "clusters of kv head %u selected twice", kv);
    static const uint32_t no_ids[1];
    /* sel also marks the kv head as named: never NULL, and no arithmetic on a NULL ids */
    p->groups[gi].sel[set] = w->ids ? w->ids + off : no_ids;
    p->groups[gi].n_sel[set] = w->counts[i];
    off += w->counts[i];
  }
  return RA_OK;
}

/* Groups the asked heads by kv head (in order of first appearance), scales every set's queries
 * into member order, and gives each group its clusters of every set; checks the selection's
 * shape (the retro lists' is retro_check's). */
static int plan_groups(wplan *p, ra_error *err) {
  const kvs_attend_args *a = p->a;
  const kvs_wave_select *w = &a->wave;
  const kvs_geometry *g = &p->s->geo;
  const uint32_t group_size = g->n_q_heads / g->n_kv_heads;
  const size_t nh = a->n_heads, dim = (size_t)p->dim;
  for (size_t i = 0; i < nh; i++) {
    uint32_t kv = a->q_heads[i] / group_size;
    size_t gi = 0;
    while (gi < p->n_groups && p->groups[gi].kv_head != kv) gi++;
    if (gi == p->n_groups) p->groups[p->n_groups++] = (wgroup){.kv_head = kv};
    p->groups[gi].count++;
  }
  size_t at = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    p->groups[gi].first = at;
    at += p->groups[gi].count;
    if (p->groups[gi].count > p->max_group) p->max_group = p->groups[gi].count;
    p->groups[gi].count = 0;
  }
  const float scale = 1.0f / sqrtf((float)p->dim);
  for (size_t i = 0; i < nh; i++) {
    size_t gi = 0;
    while (p->groups[gi].kv_head != a->q_heads[i] / group_size) gi++;
    wgroup *gr = &p->groups[gi];
    size_t j = gr->first + gr->count++;
    p->members[j] = i;
    for (size_t set = 0; set < p->n_sets; set++) {
      const float *q = set == 0 ? a->q + i * dim : a->retro_q + ((set - 1) * nh + i) * dim;
      for (size_t d = 0; d < dim; d++) p->qs[(set * nh + j) * dim + d] = q[d] * scale;
    }
  }
  uint64_t total = 0;
  for (size_t i = 0; i < w->n_heads; i++) total += w->counts[i];
  if (total != w->n_ids)
    return ra_errorf(err, RA_EINVAL, "cluster_counts sum to %llu, but %zu cluster ids came",
                     (unsigned long long)total, w->n_ids);
  int rc = plan_select(p, 0, w, err);
  size_t off = 0;
  for (size_t set = 1; rc == RA_OK && set < p->n_sets; set++) {
    const uint32_t *counts = w->retro_counts + (set - 1) * w->n_heads;
    size_t n = 0;
    for (size_t i = 0; i < w->n_heads; i++) n += counts[i];
    kvs_wave_select ws = {.kv_heads = w->kv_heads, .counts = counts, .n_heads = w->n_heads,
                          .ids = w->retro_ids ? w->retro_ids + off : NULL, .n_ids = n};
    off += n;
    rc = plan_select(p, set, &ws, err);
  }
  return rc;
}

typedef struct chosen {
  kvs_cluster_span span;
  uint32_t id;
  uint32_t mask;
} chosen;

/* A chosen cluster's place: shard, then first row (rows are 32-bit; clusters of a shard never
 * share a row). */
static inline uint64_t chosen_key(const chosen *c) { return (uint64_t)c->span.shard << 40 | c->span.row; }

/* Sorts c[0..n) by chosen_key, stably: LSD radix through tmp [n] over the key bytes that differ
 * between keys. A step's picks are hundreds of clusters per kv head; glibc's qsort through a
 * comparator made the plan a tenth of a one-thread scan (bench/results/wave-scan/). */
static void chosen_sort(chosen *c, chosen *tmp, size_t n) {
  uint64_t any = 0, every = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    any |= chosen_key(&c[i]);
    every &= chosen_key(&c[i]);
  }
  const uint64_t differ = any ^ every;
  chosen *src = c, *dst = tmp;
  for (int shift = 0; shift < 64; shift += 8) {
    if (!(differ >> shift & 255)) continue;
    size_t at[256] = {0};
    for (size_t i = 0; i < n; i++) at[chosen_key(&src[i]) >> shift & 255]++;
    for (size_t b = 0, sum = 0; b < 256; b++) {
      const size_t k = at[b];
      at[b] = sum;
      sum += k;
    }
    for (size_t i = 0; i < n; i++) dst[at[chosen_key(&src[i]) >> shift & 255]++] = src[i];
    chosen *t = src;
    src = dst;
    dst = t;
  }
  if (src != c) memcpy(c, src, n * sizeof *c);
}

/* Appends rows [r0, r1) of sh for the sets of mask, extending the last piece when it continues
 * it for the same sets. */
static int push_rows(wplan *p, size_t piece0, const kvs_shard *sh, uint64_t r0, uint64_t r1, uint32_t mask) {
  if (r0 == r1) return RA_OK;
  if (p->n_pieces > piece0) {
    piece *last = &p->pieces[p->n_pieces - 1];
    if (last->shard == sh && last->r1 == r0 && last->mask == mask) {
      last->r1 = r1;
      return RA_OK;
    }
  }
  if (p->n_pieces == p->cap_pieces) {
    size_t cap = p->cap_pieces ? p->cap_pieces * 2 : 64;
    piece *np = realloc(p->pieces, cap * sizeof *np);
    if (!np) return RA_ENOMEM;
    p->pieces = np;
    p->cap_pieces = cap;
  }
  p->pieces[p->n_pieces++] = (piece){.shard = sh, .r0 = r0, .r1 = r1, .mask = mask};
  return RA_OK;
}

/* A group's rows as pieces, in row order per shard: the clusters any set names (each once, with
 * the sets naming it), then the shard's lag (rows no cluster covers) for set 0. */
static int plan_rows(wplan *p, wgroup *gr, ra_error *err) {
  const kvs_attend_args *a = p->a;
  size_t count;
  const kvs_shard *sh = kvs_session_head(p->s, a->layer, gr->kv_head, &count);
  const kvs_cluster_dir *d = kvs_session_clusters(p->s, a->layer, gr->kv_head);
  size_t n_all = 0;
  for (size_t set = 0; set < p->n_sets; set++) n_all += gr->n_sel[set];
  chosen *c = malloc((n_all ? n_all : 1) * 2 * sizeof *c);
  if (!c) return ra_errorf(err, RA_ENOMEM, "out of memory for %zu selected clusters", n_all);
  for (size_t set = 0; set < p->n_sets; set++)
    for (size_t i = 0; i < gr->n_sel[set]; i++) kvs_cluster_dir_prefetch(d, gr->sel[set][i]);
  size_t n = 0;
  for (size_t set = 0; set < p->n_sets; set++)
    for (size_t i = 0; i < gr->n_sel[set]; i++, n++) {
      c[n].id = gr->sel[set][i];
      c[n].mask = 1u << set;
      if (!kvs_cluster_dir_find(d, c[n].id, &c[n].span)) {
        const uint32_t id = c[n].id;
        free(c);
        ra_errorf(err, RA_EINVAL, "cluster %u of layer %u kv head %u is not held by this store", id, a->layer,
                  gr->kv_head);
        if (set) ra_error_wrap(err, "retro clusters of past step %zu", set);
        return RA_EINVAL;
      }
    }
  chosen_sort(c, c + n_all, n);
  /* one entry per cluster, with every set that names it */
  size_t u = 0;
  for (size_t i = 0; i < n; i++) {
    if (u > 0 && chosen_key(&c[u - 1]) == chosen_key(&c[i])) {
      if (c[u - 1].mask & c[i].mask) {
        const uint32_t id = c[i].id;
        const int set = __builtin_ctz(c[u - 1].mask & c[i].mask);
        free(c);
        ra_errorf(err, RA_EINVAL, "cluster %u of layer %u kv head %u selected twice", id, a->layer, gr->kv_head);
        if (set) ra_error_wrap(err, "retro clusters of past step %d", set);
        return RA_EINVAL;
      }
      c[u - 1].mask |= c[i].mask;
    } else {
      c[u++] = c[i];
    }
  }
  gr->piece0 = p->n_pieces;
  int rc = RA_OK;
  size_t i = 0;
  for (size_t k = 0; k < count && rc == RA_OK; k++) {
    gr->n_keys += sh[k].n;
    for (; i < u && c[i].span.shard == k && rc == RA_OK; i++)
      rc = push_rows(p, gr->piece0, &sh[k], c[i].span.row, (uint64_t)c[i].span.row + c[i].span.count, c[i].mask);
    if (rc == RA_OK) rc = push_rows(p, gr->piece0, &sh[k], kvs_cluster_dir_clustered(d, (uint32_t)k), sh[k].n, 1u);
  }
  free(c);
  if (rc) return ra_errorf(err, RA_ENOMEM, "out of memory planning a wave attend");
  gr->n_pieces = p->n_pieces - gr->piece0;
  for (size_t j = gr->piece0; j < p->n_pieces; j++) {
    const uint64_t rows = p->pieces[j].r1 - p->pieces[j].r0;
    gr->n_union += rows;
    for (size_t set = 0; set < p->n_sets; set++)
      if (p->pieces[j].mask >> set & 1u) gr->n_rows[set] += rows;
  }
  return RA_OK;
}

/* Cuts each group's pieces into tasks of about `block` rows (a long piece, such as a lag that
 * was never clustered, is split). */
static int plan_tasks(wplan *p, int n_threads, ra_error *err) {
  uint64_t total = 0;
  for (size_t gi = 0; gi < p->n_groups; gi++) total += p->groups[gi].n_union;
  uint64_t block = total / ((uint64_t)n_threads * 4 + 1);
  if (block < WAVE_TASK_MIN) block = WAVE_TASK_MIN;
  if (block > WAVE_TASK_MAX) block = WAVE_TASK_MAX;
  /* Split pieces longer than a block, in place from the back. */
  size_t extra = 0;
  for (size_t i = 0; i < p->n_pieces; i++)
    extra += (size_t)((p->pieces[i].r1 - p->pieces[i].r0 - 1) / block);
  if (extra) {
    piece *np = malloc((p->n_pieces + extra) * sizeof *np);
    if (!np) return ra_errorf(err, RA_ENOMEM, "out of memory planning a wave attend");
    size_t at = 0;
    for (size_t gi = 0; gi < p->n_groups; gi++) {
      wgroup *gr = &p->groups[gi];
      size_t first = at;
      for (size_t i = gr->piece0; i < gr->piece0 + gr->n_pieces; i++)
        for (uint64_t r = p->pieces[i].r0; r < p->pieces[i].r1; r += block)
          np[at++] = (piece){.shard = p->pieces[i].shard, .r0 = r,
                             .r1 = r + block < p->pieces[i].r1 ? r + block : p->pieces[i].r1,
                             .mask = p->pieces[i].mask};
      gr->piece0 = first;
      gr->n_pieces = at - first;
    }
    free(p->pieces);
    p->pieces = np;
    p->n_pieces = p->cap_pieces = at;
  }
  p->tasks = malloc((p->n_pieces ? p->n_pieces : 1) * sizeof *p->tasks);
  if (!p->tasks) return ra_errorf(err, RA_ENOMEM, "out of memory planning a wave attend");
  for (size_t gi = 0; gi < p->n_groups; gi++) {
    const wgroup *gr = &p->groups[gi];
    size_t i = gr->piece0, end = gr->piece0 + gr->n_pieces;
    while (i < end) {
      wtask *t = &p->tasks[p->n_tasks++];
      *t = (wtask){.group = (uint32_t)gi, .piece0 = i, .slot = p->n_slots};
      uint64_t rows = 0;
      while (i < end && (rows == 0 || rows + (p->pieces[i].r1 - p->pieces[i].r0) <= block)) {
        rows += p->pieces[i].r1 - p->pieces[i].r0;
        i++;
      }
      t->n_pieces = i - t->piece0;
      p->n_slots += p->n_sets * gr->count;
    }
  }
  return RA_OK;
}

/* Scratch of one thread: the task's row addresses and sets, and one set's scores of a strip. */
typedef struct scratch {
  const char **k, **v; /* [WAVE_TASK_MAX] */
  uint32_t *mask;      /* [WAVE_TASK_MAX] */
  float *scores;       /* [G, WAVE_STRIP] */
  uint64_t past_ns;    /* time in the past sets' arithmetic */
} scratch;

/* Rows ahead of the ones being scored whose K and V are prefetched: a task's rows are runs of a
 * few cache lines scattered over the shard, so the scan waits on memory unless enough misses
 * are in flight (bench/results/wave-scan/). */
#define WAVE_PREFETCH_AHEAD 8

/* Prefetches the K and V of the task's rows [r0, r1). */
static void strip_prefetch(const wplan *p, const scratch *sc, size_t r0, size_t r1) {
  for (size_t r = r0; r < r1; r++)
    for (size_t off = 0; off < p->rb; off += 64) {
      __builtin_prefetch(sc->k[r] + off, 0, 3);
      __builtin_prefetch(sc->v[r] + off, 0, 3);
    }
}

/* Folds the rows of strip [r0, r0 + nb) that set `set` attends into its G running partials
 * (o: [G, dim], m, l: [G]): the rows' keys scored against the set's queries (Q K^T; queries q0..
 * q0 + G of the plan; int8 keys in integer arithmetic, bench/results/wave-scan/), the
 * partials rescaled to the strip's new maxima, then the values accumulated (P V), the strip in
 * L1 throughout. Set 0 comes first and, between its dots, prefetches the task's rows (of n)
 * WAVE_PREFETCH_AHEAD beyond those it scores; the past sets find the rows cached. */
static void strip_fold(const wplan *p, size_t q0, size_t G, scratch *sc, size_t set, size_t r0, size_t nb,
                       size_t n, float *o, float *m, float *l) {
  const ra_dtype dt = p->s->geo.dtype;
  const int dim = p->dim;
  const void *krows[WAVE_STRIP], *vrows[WAVE_STRIP];
  size_t c = 0;
  for (size_t r = r0; r < r0 + nb; r++)
    if (sc->mask[r] >> set & 1u) {
      krows[c] = sc->k[r];
      vrows[c++] = sc->v[r];
    }
  for (size_t b = 0; b < c; b += WAVE_PREFETCH_AHEAD) {
    const size_t e = b + WAVE_PREFETCH_AHEAD < c ? b + WAVE_PREFETCH_AHEAD : c;
    if (set == 0) {
      const size_t a0 = r0 + b + WAVE_PREFETCH_AHEAD, a1 = a0 + WAVE_PREFETCH_AHEAD;
      strip_prefetch(p, sc, a0 < n ? a0 : n, a1 < n ? a1 : n);
    }
    if (p->q16)
      ra_vec_dot_queries_rows_i8(p->q16 + 2 * q0 * (size_t)dim, p->qscale + q0, G, krows + b, e - b, dim, sc->scores + b,
                                 WAVE_STRIP);
    else
      ra_vec_dot_queries_rows(p->qs + q0 * (size_t)dim, G, krows + b, e - b, dt, dim, sc->scores + b, WAVE_STRIP);
  }
  if (c == 0) return;
  for (size_t j = 0; j < G; j++) {
    float *z = sc->scores + j * WAVE_STRIP;
    const float mx = ra_vec_max(z, c);
    if (mx > m[j]) {
      if (l[j] > 0.0f) {
        const float f = expf(m[j] - mx);
        l[j] *= f;
        for (int d = 0; d < dim; d++) o[j * (size_t)dim + d] *= f;
      }
      m[j] = mx;
    }
    l[j] += ra_vec_exp_sum(z, c, m[j]);
  }
  ra_vec_accumulate_rows(o, G, sc->scores, WAVE_STRIP, vrows, c, dt, dim);
}

/* The task's partials of every set: o [n_sets, G, dim], m and l [n_sets, G] (empty: m -inf, l 0). */
static void task_run(const wplan *p, const wtask *t, scratch *sc, float *o, float *m, float *l) {
  const wgroup *gr = &p->groups[t->group];
  const size_t G = gr->count, nh = p->a->n_heads, dim = (size_t)p->dim;
  memset(o, 0, p->n_sets * G * dim * sizeof *o);
  for (size_t j = 0; j < p->n_sets * G; j++) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
  }
  size_t n = 0;
  for (size_t i = t->piece0; i < t->piece0 + t->n_pieces; i++) {
    const piece *pc = &p->pieces[i];
    const char *k = (const char *)pc->shard->keys, *v = (const char *)pc->shard->values;
    for (uint64_t r = pc->r0; r < pc->r1; r++, n++) {
      sc->k[n] = k + r * p->rb;
      sc->v[n] = v + r * p->rb;
      sc->mask[n] = pc->mask;
    }
  }
  strip_prefetch(p, sc, 0, n < WAVE_PREFETCH_AHEAD ? n : WAVE_PREFETCH_AHEAD);
  for (size_t r0 = 0; r0 < n; r0 += WAVE_STRIP) {
    const size_t nb = n - r0 < WAVE_STRIP ? n - r0 : WAVE_STRIP;
    uint32_t any = 0;
    for (size_t r = 0; r < nb; r++) any |= sc->mask[r0 + r];
    strip_fold(p, gr->first, G, sc, 0, r0, nb, n, o, m, l);
    if (!(any >> 1)) continue;
    const uint64_t t0 = ra_clock_now_ns();
    for (size_t set = 1; set < p->n_sets; set++)
      if (any >> set & 1u)
        strip_fold(p, set * nh + gr->first, G, sc, set, r0, nb, n, o + set * G * dim, m + set * G,
                   l + set * G);
    sc->past_ns += ra_clock_now_ns() - t0;
  }
  for (size_t j = 0; j < p->n_sets * G; j++) {
    if (!(l[j] > 0.0f)) continue;
    const float inv = 1.0f / l[j];
    for (size_t d = 0; d < dim; d++) o[j * dim + d] *= inv;
  }
}

/* Runs the tasks on nt threads; *past_ns: the threads' time in the past sets, summed. */
static int run(const wplan *p, int nt, float *o, float *ml, uint64_t *past_ns, ra_error *err) {
  atomic_int failed = 0;
  atomic_uint_fast64_t past = 0;
#pragma omp parallel num_threads(nt) if (p->n_tasks > 1)
  {
    scratch sc = {0};
    sc.k = malloc(2 * WAVE_TASK_MAX * sizeof *sc.k);
    sc.v = sc.k ? sc.k + WAVE_TASK_MAX : NULL;
    sc.mask = malloc(WAVE_TASK_MAX * sizeof *sc.mask);
    sc.scores = malloc((p->max_group * WAVE_STRIP + 1) * sizeof *sc.scores);
    const int ok = sc.k && sc.mask && sc.scores;
    if (!ok) atomic_store(&failed, 1);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < p->n_tasks; ti++) {
      if (!ok) continue;
      const wtask *t = &p->tasks[ti];
      task_run(p, t, &sc, o + t->slot * (size_t)p->dim, ml + t->slot, ml + p->n_slots + t->slot);
    }
    atomic_fetch_add(&past, sc.past_ns);
    free(sc.k);
    free(sc.mask);
    free(sc.scores);
  }
  *past_ns = atomic_load(&past);
  if (atomic_load(&failed)) return ra_errorf(err, RA_ENOMEM, "out of memory for attention scratch");
  return RA_OK;
}

/* The result: every head's partial of every set merged over its group's tasks in task order,
 * and the row positions set 0 attends per group (shared by its heads). */
static int result_fill(const wplan *p, const float *o, const float *ml, kvs_attend_result *out,
                       ra_error *err) {
  const kvs_attend_args *a = p->a;
  const size_t dim = (size_t)p->dim, nh = a->n_heads, np = p->n_sets - 1;
  out->n_heads = nh;
  out->heads = calloc(nh, sizeof *out->heads);
  out->o = calloc(nh * dim, sizeof *out->o);
  if (np) {
    out->retro = calloc(np * nh, sizeof *out->retro);
    out->retro_o = calloc(np * nh * dim, sizeof *out->retro_o);
  }
  uint64_t n_ids = 0;
  for (size_t gi = 0; a->want_ids && gi < p->n_groups; gi++) n_ids += p->groups[gi].n_rows[0];
  if (a->want_ids) out->ids = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *out->ids);
  if (!out->heads || !out->o || (a->want_ids && !out->ids) || (np && (!out->retro || !out->retro_o)))
    return ra_errorf(err, RA_ENOMEM, "out of memory for the attend result");
  for (size_t set = 0; set < p->n_sets; set++)
    for (size_t gi = 0; gi < p->n_groups; gi++) {
      const wgroup *gr = &p->groups[gi];
      for (size_t j = 0; j < gr->count; j++) {
        const size_t i = p->members[gr->first + j];
        ra_head_partial *h = set == 0 ? &out->heads[i] : &out->retro[(set - 1) * nh + i];
        float *ho = set == 0 ? out->o + i * dim : out->retro_o + ((set - 1) * nh + i) * dim;
        *h = (ra_head_partial){.q_head = a->q_heads[i], .part = {.o = ho, .m = -INFINITY},
                               .n_scanned = gr->n_rows[set], .n_keys = gr->n_keys};
      }
    }
  for (size_t ti = 0; ti < p->n_tasks; ti++) {
    const wtask *t = &p->tasks[ti];
    const wgroup *gr = &p->groups[t->group];
    for (size_t set = 0; set < p->n_sets; set++)
      for (size_t j = 0; j < gr->count; j++) {
        const size_t i = p->members[gr->first + j];
        ra_head_partial *h = set == 0 ? &out->heads[i] : &out->retro[(set - 1) * nh + i];
        const size_t slot = t->slot + set * gr->count + j;
        ra_partial_merge(&h->part, o + slot * dim, ml[slot], ml[p->n_slots + slot], (int)dim);
      }
  }
  uint64_t *ids = out->ids;
  for (size_t gi = 0; ids && gi < p->n_groups; gi++) {
    const wgroup *gr = &p->groups[gi];
    uint64_t *at = ids;
    for (size_t i = gr->piece0; i < gr->piece0 + gr->n_pieces; i++)
      if (p->pieces[i].mask & 1u)
        for (uint64_t r = p->pieces[i].r0; r < p->pieces[i].r1; r++) *at++ = p->pieces[i].shard->spec.token_begin + r;
    for (size_t j = 0; j < gr->count; j++) {
      ra_head_partial *h = &out->heads[p->members[gr->first + j]];
      h->ids = ids;
      h->n_ids = (size_t)gr->n_rows[0];
    }
    ids += gr->n_rows[0];
  }
  return RA_OK;
}

/* The retro lists' shape: [n_retro, n_heads] counts summing to the ids, none without past
 * queries. */
static int retro_check(const kvs_attend_args *a, ra_error *err) {
  const kvs_wave_select *w = &a->wave;
  if (a->n_retro == 0 && (w->n_retro_counts || w->n_retro_ids))
    return ra_errorf(err, RA_EINVAL, "retro clusters (%zu counts, %zu ids) without past queries (n_retro 0)",
                     w->n_retro_counts, w->n_retro_ids);
  if (w->n_retro_counts != (size_t)a->n_retro * w->n_heads)
    return ra_errorf(err, RA_EINVAL, "retro_cluster_counts has %zu entries, want %u past steps x %zu cluster_kv_heads",
                     w->n_retro_counts, a->n_retro, w->n_heads);
  uint64_t total = 0;
  for (size_t i = 0; i < w->n_retro_counts; i++) total += w->retro_counts[i];
  if (total != w->n_retro_ids)
    return ra_errorf(err, RA_EINVAL, "retro_cluster_counts sum to %llu, but %zu retro cluster ids came",
                     (unsigned long long)total, w->n_retro_ids);
  return RA_OK;
}

int kvs_attend_wave(const kvs_session *s, const kvs_attend_args *a, int n_threads,
                    kvs_attend_result *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if (a->mode != RA_MODE_WAVE)
    return ra_errorf(err, RA_EINVAL, "clusters are selected in mode wave only, not in mode %s",
                     ra_mode_name(a->mode));
  int rc = retro_check(a, err);
  if (rc) return rc;
  wplan p = {.s = s, .a = a, .n_sets = 1 + (size_t)a->n_retro, .dim = (int)s->geo.head_dim,
             .rb = kvs_row_bytes(&s->geo)};
  p.members = malloc(a->n_heads * sizeof *p.members);
  p.qs = malloc(p.n_sets * a->n_heads * (size_t)p.dim * sizeof *p.qs);
  p.groups = malloc(a->n_heads * sizeof *p.groups);
  if (!p.members || !p.qs || !p.groups) rc = ra_errorf(err, RA_ENOMEM, "out of memory planning a wave attend");
  if (rc == RA_OK) rc = plan_groups(&p, err);
  if (rc == RA_OK && s->geo.dtype == RA_DTYPE_I8 && p.dim <= RA_VEC_I8_MAX_DIM) {
    const size_t nq = p.n_sets * a->n_heads;
    p.q16 = malloc(nq * 2 * (size_t)p.dim * sizeof *p.q16);
    p.qscale = malloc(nq * sizeof *p.qscale);
    if (!p.q16 || !p.qscale) rc = ra_errorf(err, RA_ENOMEM, "out of memory planning a wave attend");
    else ra_vec_queries_to_i16(p.qs, nq, p.dim, p.q16, p.qscale);
  }
  for (size_t gi = 0; rc == RA_OK && gi < p.n_groups; gi++) rc = plan_rows(&p, &p.groups[gi], err);
  if (rc == RA_OK) rc = plan_tasks(&p, n_threads, err);
  float *o = NULL, *ml = NULL;
  if (rc == RA_OK) {
    o = malloc((p.n_slots ? p.n_slots : 1) * (size_t)p.dim * sizeof *o);
    ml = malloc((p.n_slots ? p.n_slots : 1) * 2 * sizeof *ml);
    if (!o || !ml) rc = ra_errorf(err, RA_ENOMEM, "out of memory for %zu partials", p.n_slots);
  }
  uint64_t past_ns = 0;
  if (rc == RA_OK) rc = run(&p, n_threads, o, ml, &past_ns, err);
  if (rc == RA_OK) rc = result_fill(&p, o, ml, out, err);
  /* a wall-time share: the pass's threads split the past sets' arithmetic */
  const size_t nt = p.n_tasks < (size_t)n_threads ? p.n_tasks : (size_t)n_threads;
  out->retro_us = past_ns / 1000 / (nt ? nt : 1);
  free(o);
  free(ml);
  plan_free(&p);
  if (rc) kvs_attend_result_free(out);
  return rc;
}
