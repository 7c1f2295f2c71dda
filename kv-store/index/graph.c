#include "graph.h"

#include "cpu.h"
#include "hugemem.h"
#include "index_internal.h"
#include "vec.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef __x86_64__
#include <immintrin.h>
#endif

/* A beam entry's id carries "already expanded" in its top bit (ids stay below 2^31). */
#define EXPANDED 0x80000000u
#define ID_MASK 0x7fffffffu

static inline uint32_t pin_cap(const ra_graph *g) { return g->M / 2 ? g->M / 2 : 1; }
static inline uint32_t *row_of(const ra_graph *g, uint32_t u) { return g->adj + (size_t)u * g->M; }

int ra_graph_init(ra_graph *g, uint32_t M, uint32_t n, uint32_t cap) {
  memset(g, 0, sizeof *g);
  g->M = M;
  if (cap < n) cap = n;
  if (cap == 0) cap = 1;
  /* a walk reads a row per expansion, anywhere in the graph (8 MiB at 131K keys, a store holds
   * a hundred): huge pages, as for the keys (hugemem.h) */
  g->adj = ra_huge_alloc((size_t)cap * M * sizeof *g->adj);
  g->deg = calloc(cap, sizeof *g->deg);
  g->npin = calloc(cap, sizeof *g->npin);
  g->hn = calloc(cap, sizeof *g->hn);
  g->cap = cap; /* before a failure's ra_graph_free: the size adj was allocated with */
  if (!g->adj || !g->deg || !g->npin || !g->hn) {
    ra_graph_free(g);
    return RA_ENOMEM;
  }
  g->n = n;
  return RA_OK;
}

void ra_graph_free(ra_graph *g) {
  ra_huge_free(g->adj, (size_t)g->cap * g->M * sizeof *g->adj);
  free(g->deg);
  free(g->npin);
  free(g->hn);
  free(g->qm);
  free(g->mk);
  memset(g, 0, sizeof *g);
}

int ra_graph_reserve(ra_graph *g, uint32_t cap) {
  if (cap <= g->cap) return RA_OK;
  /* The malloc'd arrays first: left larger on a later failure they stay valid, whereas adj's
   * size must match g->cap (ra_graph_free passes it back). */
  uint16_t *deg = realloc(g->deg, (size_t)cap * sizeof *deg);
  if (!deg) return RA_ENOMEM;
  g->deg = deg;
  uint16_t *npin = realloc(g->npin, (size_t)cap * sizeof *npin);
  if (!npin) return RA_ENOMEM;
  g->npin = npin;
  float *hn = realloc(g->hn, (size_t)cap * sizeof *hn);
  if (!hn) return RA_ENOMEM;
  g->hn = hn;
  uint32_t *adj = ra_huge_realloc(g->adj, (size_t)g->cap * g->M * sizeof *adj,
                                  (size_t)cap * g->M * sizeof *adj);
  if (!adj) return RA_ENOMEM;
  g->adj = adj;
  memset(g->deg + g->cap, 0, (size_t)(cap - g->cap) * sizeof *deg);
  memset(g->npin + g->cap, 0, (size_t)(cap - g->cap) * sizeof *npin);
  g->cap = cap;
  return RA_OK;
}

size_t ra_graph_bytes(const ra_graph *g) {
  return sizeof *g + (size_t)g->cap * (g->M * sizeof *g->adj + sizeof *g->deg + sizeof *g->npin +
                                       sizeof *g->hn) +
         (g->qm ? (size_t)g->dim * g->dim * sizeof *g->qm : 0);
}

/* Metric ids: one per metric ever set in this process, so that a work's map cache cannot take a
 * metric (or another graph's) for the one it was filled under, even at a reused address. */
static _Atomic uint64_t metric_ids;

int ra_graph_set_metric(ra_graph *g, const float *C, int dim) {
  g->dim = dim;
  free(g->qm);
  g->qm = NULL;
  g->metric_id = 0;
  if (!C) return RA_OK;
  g->qm = malloc((size_t)dim * dim * sizeof *g->qm);
  if (!g->qm) return RA_ENOMEM;
  memcpy(g->qm, C, (size_t)dim * dim * sizeof *g->qm);
  g->metric_id = atomic_fetch_add(&metric_ids, 1) + 1;
  return RA_OK;
}

static void map_cache_clear(ra_graph_work *w) {
  for (uint32_t i = 0; i < w->mc_n; i++) w->mc_id[i] = UINT32_MAX;
}

void ra_graph_work_bind(ra_graph_work *w, const ra_graph *g) {
  w->hn = g->hn;
  w->qm = g->qm;
  w->mk = g->mk;
  if (w->mc_metric != g->metric_id) {
    map_cache_clear(w);
    w->mc_metric = g->metric_id;
  }
}

int ra_graph_work_cache(ra_graph_work *w, uint32_t entries) {
  uint32_t n = 4;
  while (n < entries && n < (1u << 30)) n *= 2;
  if (n == w->mc_n) return RA_OK;
  float *mc = malloc((size_t)n * w->dim * sizeof *mc);
  uint32_t *id = malloc((size_t)n * sizeof *id), *used = calloc(n, sizeof *used);
  if (!mc || !id || !used) {
    free(mc);
    free(id);
    free(used);
    return RA_ENOMEM;
  }
  free(w->mc);
  free(w->mc_id);
  free(w->mc_used);
  w->mc = mc;
  w->mc_id = id;
  w->mc_used = used;
  w->mc_n = n;
  map_cache_clear(w);
  return RA_OK;
}

size_t ra_graph_work_cache_bytes(const ra_graph_work *w) {
  return (size_t)w->mc_n * ((size_t)w->dim * sizeof *w->mc + sizeof *w->mc_id +
                            sizeof *w->mc_used);
}

/* The 4-way set of key id: a multiplicative hash, as consecutive ids (recent tokens) are mapped
 * together. */
static inline uint32_t map_cache_set(const ra_graph_work *w, uint32_t id) {
  return (uint32_t)(((uint64_t)(id * 0x9e3779b1u) * (w->mc_n / 4)) >> 32) * 4;
}

int ra_graph_cache_metric(ra_graph *g, const ra_keys *keys) {
  const size_t d = (size_t)keys->dim, n = g->n, block = 4096;
  free(g->mk);
  g->mk = malloc((n ? n : 1) * d * sizeof *g->mk);
  float *x = g->qm ? malloc(block * d * sizeof *x) : NULL;
  if (!g->mk || (g->qm && !x)) {
    free(g->mk);
    free(x);
    g->mk = NULL;
    return RA_ENOMEM;
  }
  /* Pruning reads a row per accepted key, anywhere in it (64 MiB at 131K keys, dim 128): huge
   * pages, as for the graph's rows (with 4 KiB pages, the prefetches of those rows waited on
   * page walks: 15 % of the pruning's own time, 2-core EPYC). Advice, so its result is not
   * needed. */
  (void)ra_mem_advise_huge(g->mk, (n ? n : 1) * d * sizeof *g->mk);
  size_t rb = ra_dtype_row_bytes(keys->dtype, d);
  for (size_t r0 = 0; r0 < n; r0 += block) {
    size_t nb = n - r0 < block ? n - r0 : block;
    const char *src = (const char *)keys->rows + r0 * rb;
    if (!g->qm) {
      ra_dtype_rows_to_fp32(keys->dtype, src, g->mk + r0 * d, nb, d);
      continue;
    }
    /* mk[r0:r0+nb] = x C^T (C is symmetric: rows of mk are C·key). */
    ra_dtype_rows_to_fp32(keys->dtype, src, x, nb, d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)d, (int)d, 1.0f, x,
                (int)d, g->qm, (int)d, 0.0f, g->mk + r0 * d, (int)d);
  }
  free(x);
  return RA_OK;
}

void ra_graph_uncache_metric(ra_graph *g) {
  free(g->mk);
  g->mk = NULL;
}

void ra_graph_key_to_metric(const ra_keys *keys, uint32_t id, ra_graph_work *w, float *out) {
  const size_t d = (size_t)keys->dim;
  if (w->mk) {
    memcpy(out, w->mk + (size_t)id * d, d * sizeof *out);
    return;
  }
  if (!w->qm) {
    ra_graph_key_to_f32(keys, id, out);
    return;
  }
  uint32_t slot = UINT32_MAX;
  if (w->mc_n) {
    const uint32_t set = map_cache_set(w, id);
    w->mc_clock++;
    for (uint32_t j = set; j < set + 4; j++)
      if (w->mc_id[j] == id) {
        w->mc_used[j] = w->mc_clock;
        w->mc_hits++;
        memcpy(out, w->mc + (size_t)j * d, d * sizeof *out);
        return;
      }
    /* An empty way, else the least recently used (by clock distance: a wrapped clock only
     * misguides a few evictions). */
    slot = set;
    for (uint32_t j = set; j < set + 4; j++) {
      if (w->mc_id[j] == UINT32_MAX) {
        slot = j;
        break;
      }
      if (w->mc_clock - w->mc_used[j] > w->mc_clock - w->mc_used[slot]) slot = j;
    }
    w->mc_misses++;
  }
  /* C is symmetric: C key = key^T C, the rows of C scaled and summed (a dot per row of C, with
   * its horizontal sum, cost twice as much: 1.74 against 0.94 us at dim 128 on a 2-core EPYC). */
  ra_graph_key_to_f32(keys, id, w->tmp);
  ra_vec_vecmat(w->tmp, w->qm, keys->dim, keys->dim, out);
  if (slot != UINT32_MAX) {
    memcpy(w->mc + (size_t)slot * d, out, d * sizeof *out);
    w->mc_id[slot] = id;
    w->mc_used[slot] = w->mc_clock;
  }
}

void ra_graph_set_norms(ra_graph *g, const ra_keys *keys, uint32_t from, uint32_t to) {
  ra_graph_work w;
  memset(&w, 0, sizeof w);
  ra_graph_work_bind(&w, g);
  size_t rb = ra_dtype_row_bytes(keys->dtype, (size_t)keys->dim);
  float tmp[4096], v[4096]; /* dim <= 4096 (index.c's bound) */
  w.tmp = tmp;
  for (uint32_t u = from; u < to; u++) {
    ra_graph_key_to_metric(keys, u, &w, v);
    g->hn[u] = 0.5f * ra_vec_dot(v, (const char *)keys->rows + (size_t)u * rb, keys->dtype,
                                 keys->dim);
  }
}

int ra_graph_work_init(ra_graph_work *w, int dim, uint32_t M) {
  memset(w, 0, sizeof *w);
  w->dim = dim;
  w->M = M;
  w->vec = malloc((size_t)dim * sizeof *w->vec);
  w->qvec = malloc((size_t)dim * sizeof *w->qvec);
  w->tmp = malloc((size_t)dim * sizeof *w->tmp);
  w->sel = malloc((size_t)M * sizeof *w->sel);
  w->selm = malloc((size_t)M * dim * sizeof *w->selm);
  w->selh = malloc((size_t)M * sizeof *w->selh);
  w->selpos = malloc((size_t)M * sizeof *w->selpos);
  if (!w->vec || !w->qvec || !w->tmp || !w->sel || !w->selm || !w->selh || !w->selpos) {
    ra_graph_work_free(w);
    return RA_ENOMEM;
  }
  return RA_OK;
}

void ra_graph_work_free(ra_graph_work *w) {
  ra_index_scratch_free(&w->sc);
  free(w->vec);
  free(w->qvec);
  free(w->tmp);
  free(w->sel);
  free(w->selm);
  free(w->selh);
  free(w->selpos);
  free(w->cand);
  free(w->ids);
  free(w->dots);
  free(w->res_id);
  free(w->co_id);
  free(w->mark);
  free(w->mc);
  free(w->mc_id);
  free(w->mc_used);
  memset(w, 0, sizeof *w);
}

/* realloc that leaves *p untouched on failure. */
static int grow(void **p, size_t bytes) {
  void *q = realloc(*p, bytes ? bytes : 1);
  if (!q) return RA_ENOMEM;
  *p = q;
  return RA_OK;
}

int ra_graph_work_reserve(ra_graph_work *w, uint32_t cand_cap, uint32_t n, uint32_t L) {
  if (cand_cap < w->M + 1) cand_cap = w->M + 1;
  if (cand_cap > w->cand_cap) {
    if (grow((void **)&w->cand, (size_t)cand_cap * sizeof *w->cand) ||
        grow((void **)&w->ids, (size_t)cand_cap * sizeof *w->ids) ||
        grow((void **)&w->dots, (size_t)cand_cap * sizeof *w->dots))
      return RA_ENOMEM;
    w->cand_cap = cand_cap;
  }
  if (n > w->mark_cap) {
    uint32_t cap = n + n / 8 + 16;
    if (grow((void **)&w->mark, (size_t)cap * sizeof *w->mark)) return RA_ENOMEM;
    memset(w->mark, 0, (size_t)cap * sizeof *w->mark);
    w->mark_cap = cap;
    w->mark_epoch = 0;
  }
  if (L > w->res_cap) {
    if (grow((void **)&w->res_id, (size_t)L * sizeof *w->res_id) ||
        grow((void **)&w->co_id, (size_t)L * sizeof *w->co_id))
      return RA_ENOMEM;
    w->res_cap = L;
  }
  return ra_index_scratch_reserve(&w->sc, n, L + 1, w->M, 0);
}

/* A fresh de-duplication round over w->mark. */
static uint32_t mark_begin(ra_graph_work *w) {
  if (++w->mark_epoch == 0) {
    memset(w->mark, 0, (size_t)w->mark_cap * sizeof *w->mark);
    w->mark_epoch = 1;
  }
  return w->mark_epoch;
}

void ra_graph_key_to_f32(const ra_keys *keys, uint32_t id, float *out) {
  size_t bytes = ra_dtype_row_bytes(keys->dtype, (size_t)keys->dim);
  ra_dtype_rows_to_fp32(keys->dtype, (const char *)keys->rows + (size_t)id * bytes, out, 1,
                        (size_t)keys->dim);
}

/* ---- beam search ---- */

/* Beam order: a before b (descending score, ties by ascending id; beam ids carry EXPANDED). */
static inline int beam_before(float sa, uint32_t ia, float sb, uint32_t ib) {
  return sa > sb || (sa == sb && (ia & ID_MASK) < (ib & ID_MASK));
}

/* Merges the m expansion results (nid, nsc; sorted here) into the beam pid/psc [*pn <= L], keeping
 * its first L entries; returns the position of the best new entry, or L when none made it. The
 * beam is the same as inserting them one by one (the first L of the union in a total order), but
 * each old entry moves once per expansion, a segment at a time, instead of once per insertion
 * (the shifting was 23 % of a 134K-key roar build's profile with the beam-search repair). */
static uint32_t beam_merge(uint32_t *pid, float *psc, uint32_t *pn, uint32_t L, uint32_t *nid,
                           float *nsc, uint32_t m) {
  for (uint32_t i = 1; i < m; i++) {
    uint32_t id = nid[i], j = i;
    float sc = nsc[i];
    for (; j > 0 && beam_before(sc, id, nsc[j - 1], nid[j - 1]); j--) {
      nid[j] = nid[j - 1];
      nsc[j] = nsc[j - 1];
    }
    nid[j] = id;
    nsc[j] = sc;
  }
  const uint32_t total = *pn + m, len = total < L ? total : L;
  /* From the worst new entry up: the old entries after its place move right by the new ones at or
   * before it (k + 1), then it goes just before them; moves and places past len are dropped. */
  uint32_t end = *pn, pos = 0;
  for (uint32_t k = m; k-- > 0;) {
    uint32_t lo = 0, hi = end;
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      if (beam_before(psc[mid], pid[mid], nsc[k], nid[k]))
        lo = mid + 1;
      else
        hi = mid;
    }
    pos = lo;
    uint32_t dst = pos + k + 1;
    if (dst < len) {
      uint32_t cnt = end - pos < len - dst ? end - pos : len - dst;
      memmove(pid + dst, pid + pos, (size_t)cnt * sizeof *pid);
      memmove(psc + dst, psc + pos, (size_t)cnt * sizeof *psc);
    }
    if (pos + k < len) {
      pid[pos + k] = nid[k];
      psc[pos + k] = nsc[k];
    }
    end = pos;
  }
  *pn = len;
  return pos < len ? pos : L; /* the best new entry's place: pos + 0 */
}

/* The beam search, scoring q·key - bias[key] (bias NULL: 0). */
static void search_biased(const ra_graph *g, const ra_keys *keys, const float *q, const float *bias,
                          uint32_t L, uint32_t k, ra_index_scratch *s, uint32_t *ids,
                          float *scores, uint32_t *n_out, uint64_t *n_scanned) {
  uint64_t scanned = 0;
  uint32_t pn = 0;
  if (g->n == 0 || L == 0) {
    *n_out = 0;
    if (n_scanned) *n_scanned = 0;
    return;
  }
  if (++s->epoch == 0) { /* wrapped: old marks could alias the new epoch */
    memset(s->visited, 0, (size_t)s->visited_cap * sizeof *s->visited);
    s->epoch = 1;
  }
  const uint32_t ep = s->epoch;
  uint32_t *vis = s->visited, *pid = s->pool_id, *nbr = s->nbr_id;
  float *psc = s->pool_score, *nsc = s->nbr_score;
  const uint32_t M = g->M;

  vis[g->entry] = ep;
  pid[0] = g->entry;
  psc[0] = ra_vec_dot(q, (const char *)keys->rows +
                             (size_t)g->entry * ra_dtype_row_bytes(keys->dtype, (size_t)keys->dim),
                      keys->dtype, keys->dim) -
           (bias ? bias[g->entry] : 0.0f);
  pn = 1;
  scanned = 1;
  uint32_t cur = 0;
  while (cur < pn) {
    if (pid[cur] & EXPANDED) {
      cur++;
      continue;
    }
    uint32_t u = pid[cur];
    pid[cur] |= EXPANDED;
    const uint32_t *row = g->adj + (size_t)u * M;
    uint32_t d = g->deg[u], m = 0;
    for (uint32_t j = 0; j < d; j++) {
      uint32_t v = row[j];
      if (vis[v] != ep) {
        vis[v] = ep;
        nbr[m++] = v;
      }
    }
    if (m == 0) {
      cur++;
      continue;
    }
    /* One gather over all unvisited neighbors: their rows are prefetched ahead of the dots. */
    ra_vec_dot_rows(q, keys->rows, keys->dtype, keys->dim, nbr, m, nsc);
    if (bias)
      for (uint32_t i = 0; i < m; i++) nsc[i] -= bias[nbr[i]];
    scanned += m;
    /* Only those that can make a full beam are merged; their rows are fetched now, as they may
     * be expanded next (the row and degree loads of the next expansion were a third of this
     * function's time; bench/results/defaults/README.md). */
    uint32_t mk = 0;
    for (uint32_t i = 0; i < m; i++)
      if (pn < L || !beam_before(psc[L - 1], pid[L - 1], nsc[i], nbr[i])) {
        __builtin_prefetch(g->adj + (size_t)nbr[i] * M, 0, 3);
        __builtin_prefetch(g->deg + nbr[i], 0, 3);
        nbr[mk] = nbr[i];
        nsc[mk++] = nsc[i];
      }
    uint32_t best = mk ? beam_merge(pid, psc, &pn, L, nbr, nsc, mk) : L;
    /* Resume at the best new entry if it landed above the one just expanded. */
    cur = best <= cur ? best : cur + 1;
  }
  uint32_t n = pn < k ? pn : k;
  for (uint32_t i = 0; i < n; i++) {
    ids[i] = pid[i] & ID_MASK;
    if (scores) scores[i] = psc[i];
  }
  *n_out = n;
  if (n_scanned) *n_scanned = scanned;
}

void ra_graph_search(const ra_graph *g, const ra_keys *keys, const float *q, uint32_t L, uint32_t k,
                     ra_index_scratch *s, uint32_t *ids, float *scores, uint32_t *n_out,
                     uint64_t *n_scanned) {
  search_biased(g, keys, q, NULL, L, k, s, ids, scores, n_out, n_scanned);
}

/* The nodes to link key u with, from two beam searches with C u as the query:
 *  - the nearest in the graph's metric: -|u - r|_C^2 / 2 = (C u)·r - hn[r] - hn[u], so scored
 *    (C u)·r - hn[r]. They give u its local structure.
 *  - the largest (C u)·r = E[(q·u)(q·r)]: the keys that queries rate along with u, which their
 *    walks expand. Metric neighbors alone hang runs of similar keys off the graph by edges no
 *    walk takes (bench/results/defaults/README.md).
 * Returns up to L / 2 of the first (nearest first: the parent comes from there), then the second
 * (best first) up to L in all, without repeats. Costs two searches per linked key. */
static void search_near_key(const ra_graph *g, const ra_keys *keys, uint32_t u, uint32_t L,
                            ra_graph_work *w, uint32_t *ids, uint32_t *n_out) {
  uint32_t n_near = 0, n_co = 0;
  ra_graph_key_to_metric(keys, u, w, w->vec);
  search_biased(g, keys, w->vec, g->hn, L, L, &w->sc, ids, NULL, &n_near, NULL);
  search_biased(g, keys, w->vec, NULL, L, L, &w->sc, w->co_id, NULL, &n_co, NULL);
  uint32_t n = n_near < L / 2 ? n_near : L / 2, ep = mark_begin(w);
  for (uint32_t i = 0; i < n; i++) w->mark[ids[i]] = ep;
  for (uint32_t i = 0; i < n_co && n < L; i++)
    if (w->mark[w->co_id[i]] != ep) {
      w->mark[w->co_id[i]] = ep;
      ids[n++] = w->co_id[i];
    }
  *n_out = n;
}

/* ---- pruning ---- */

/* Candidate order: descending similarity, ties by ascending id (a total order: the graph does not
 * depend on how the sort proceeds). */
static inline int cand_before(ra_cand a, ra_cand b) {
  return a.sim > b.sim || (a.sim == b.sim && a.id < b.id);
}

static inline void cand_swap(ra_cand *a, ra_cand *b) {
  ra_cand t = *a;
  *a = *b;
  *b = t;
}

/* Hoare-style partition of c[0..n) (n >= 2) around the median of three; returns p with
 * c[0..p) before-or-equal and c[p..n) after-or-equal the pivot, 0 < p < n. */
static uint32_t cand_partition(ra_cand *c, uint32_t n) {
  uint32_t mid = n / 2;
  if (cand_before(c[mid], c[0])) cand_swap(&c[mid], &c[0]);
  if (cand_before(c[n - 1], c[0])) cand_swap(&c[n - 1], &c[0]);
  if (cand_before(c[n - 1], c[mid])) cand_swap(&c[n - 1], &c[mid]);
  ra_cand piv = c[mid];
  uint32_t i = 0, j = n - 1;
  for (;;) {
    while (cand_before(c[i], piv)) i++;
    while (cand_before(piv, c[j])) j--;
    if (i >= j) return j + 1 < n ? j + 1 : n - 1;
    cand_swap(&c[i], &c[j]);
    i++;
    j--;
  }
}

static void cand_insertion_sort(ra_cand *c, uint32_t n) {
  for (uint32_t i = 1; i < n; i++) {
    ra_cand x = c[i];
    uint32_t j = i;
    for (; j > 0 && cand_before(x, c[j - 1]); j--) c[j] = c[j - 1];
    c[j] = x;
  }
}

static void cand_quicksort(ra_cand *cand, uint32_t n) {
  while (n > 16) {
    uint32_t p = cand_partition(cand, n);
    /* Recurse into the smaller side, loop on the larger: O(log n) stack. */
    if (p < n - p) {
      cand_quicksort(cand, p);
      cand += p;
      n -= p;
    } else {
      cand_quicksort(cand + p, n - p);
      n = p;
    }
  }
  cand_insertion_sort(cand, n);
}

/* Descending similarity as an ascending unsigned key (the float's bits made orderable, then
 * flipped; -0 taken as +0, which compares equal to it), and back. */
static inline uint32_t sim_key(float s) {
  uint32_t b;
  memcpy(&b, &s, sizeof b);
  if (b == 0x80000000u) b = 0;
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ~b;
}

static inline float key_sim(uint32_t k) {
  uint32_t b = ~k;
  b = (b & 0x80000000u) ? (b & 0x7fffffffu) : ~b;
  float s;
  memcpy(&s, &b, sizeof s);
  return s;
}

/* Up to this many candidates are sorted by radix, above by quicksort. A pivot ranks up to ~355
 * and its pruning walks nearly all of them (131K synthetic keys, 64 pivots per list: 239 of 247
 * on average), so they are sorted whole; quicksort's comparisons, mispredicted about half the
 * time, were 22 % of a roar build's profile. */
#define RADIX_MAX 1024u

/* LSD radix sort of (key << 32 | id) on the key's 4 bytes (stable; a byte every entry shares is
 * skipped), then runs of equal keys by id. */
static void cand_radix_sort(ra_cand *cand, uint32_t n) {
  uint64_t a[RADIX_MAX], b[RADIX_MAX], *src = a, *dst = b;
  uint32_t cnt[4][256];
  memset(cnt, 0, sizeof cnt);
  for (uint32_t i = 0; i < n; i++) { /* the four bytes' histograms in one pass */
    uint32_t k = sim_key(cand[i].sim);
    a[i] = (uint64_t)k << 32 | cand[i].id;
    cnt[0][k & 0xff]++;
    cnt[1][(k >> 8) & 0xff]++;
    cnt[2][(k >> 16) & 0xff]++;
    cnt[3][k >> 24]++;
  }
  for (int pass = 0; pass < 4; pass++) {
    const int shift = 32 + 8 * pass;
    uint32_t *c = cnt[pass];
    if (c[(src[0] >> shift) & 0xff] == n) continue;
    for (uint32_t d = 0, sum = 0; d < 256; d++) {
      uint32_t x = c[d];
      c[d] = sum;
      sum += x;
    }
    for (uint32_t i = 0; i < n; i++) dst[c[(src[i] >> shift) & 0xff]++] = src[i];
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i + 1;
    while (j < n && src[j] >> 32 == src[i] >> 32) j++;
    for (uint32_t x = i + 1; x < j; x++) { /* a tie: by id (rare but for equal keys) */
      uint64_t v = src[x];
      uint32_t y = x;
      for (; y > i && (uint32_t)src[y - 1] > (uint32_t)v; y--) src[y] = src[y - 1];
      src[y] = v;
    }
    i = j;
  }
  for (uint32_t i = 0; i < n; i++)
    cand[i] = (ra_cand){.sim = key_sim((uint32_t)(src[i] >> 32)), .id = (uint32_t)src[i]};
}

/* Up to this many candidates are sorted by counting ranks: a rank is the number of keys below
 * one's own, n^2 / 4 compares four at a time with no branch to mispredict. Most sorts of a roar
 * build are small (the reverse edges' re-prunings hold M + a few, the key -> query rows <= 64:
 * 131K synthetic keys, median 61 candidates), where the radix sort's four 256-bucket passes
 * cost more than the keys; measured per sort on the build's own candidates (2-core EPYC): 17-32
 * keys 217 ns against 791, 33-64 406 against 1285, 65-128 1062 against 2593. */
#define RANK_MAX 128u

/* (sim_key, id) as one 64-bit key: ids are distinct, so the keys are. */
static inline uint64_t cand_key(ra_cand c) { return (uint64_t)sim_key(c.sim) << 32 | c.id; }

static inline ra_cand key_cand(uint64_t k) {
  return (ra_cand){.sim = key_sim((uint32_t)(k >> 32)), .id = (uint32_t)k};
}

#ifdef __x86_64__
/* out[rank of k[i]] = k[i] for n <= RANK_MAX distinct keys, compared signed after flipping the
 * top bit. (k is not const: with it, gcc 12 takes a caller's array filled in a loop as maybe
 * uninitialized.) */
__attribute__((target("avx2"))) static void rank_sort_u64(uint64_t *k, uint32_t n, uint64_t *out) {
  int64_t s[RANK_MAX + 3];
  const uint32_t n4 = (n + 3) & ~3u;
  for (uint32_t i = 0; i < n; i++) s[i] = (int64_t)(k[i] ^ 0x8000000000000000ull);
  for (uint32_t i = n; i < n4; i++) s[i] = INT64_MAX; /* below no key */
  for (uint32_t i = 0; i < n; i++) {
    const __m256i x = _mm256_set1_epi64x(s[i]);
    __m256i below = _mm256_setzero_si256();
    for (uint32_t j = 0; j < n4; j += 4) /* a true compare is -1: subtracting counts it */
      below = _mm256_sub_epi64(below,
                               _mm256_cmpgt_epi64(x, _mm256_loadu_si256((const __m256i *)(s + j))));
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(below), _mm256_extracti128_si256(below, 1));
    out[_mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1)] = k[i];
  }
}

static void cand_rank_sort(ra_cand *cand, uint32_t n) {
  uint64_t k[RANK_MAX], out[RANK_MAX];
  for (uint32_t i = 0; i < n; i++) k[i] = cand_key(cand[i]);
  rank_sort_u64(k, n, out);
  for (uint32_t i = 0; i < n; i++) cand[i] = key_cand(out[i]);
}

/* A pivot's candidates (~250-300, 131K keys): one pass into buckets by the top bits of
 * sim_key - the smallest sim_key, one per 4 to 8 keys, then each bucket by ranks (by insertion
 * up to 8). 3.0 us a sort on the build's own candidates, the radix sort 4.3. Returns 0, the
 * candidates untouched, if a bucket holds more than RANK_MAX (similarities bunched into a few
 * values). */
static int cand_bucket_sort(ra_cand *cand, uint32_t n) {
  uint64_t a[RADIX_MAX], b[RADIX_MAX];
  uint32_t lo = UINT32_MAX, hi = 0, cnt[RADIX_MAX / 4 + 2], pos[RADIX_MAX / 4 + 2];
  for (uint32_t i = 0; i < n; i++) {
    a[i] = cand_key(cand[i]);
    uint32_t k = (uint32_t)(a[i] >> 32);
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
  }
  if (lo == hi) return 0;
  /* 2^lb >= n / 8 buckets; keys spanning fewer bits go one value per bucket. */
  const uint32_t bits = 32 - (uint32_t)__builtin_clz(hi - lo), lb = 29 - (uint32_t)__builtin_clz(n);
  const uint32_t sh = bits > lb ? bits - lb : 0, nb = ((hi - lo) >> sh) + 1;
  memset(cnt, 0, (nb + 1) * sizeof *cnt);
  for (uint32_t i = 0; i < n; i++) cnt[(((uint32_t)(a[i] >> 32) - lo) >> sh) + 1]++;
  for (uint32_t d = 0; d < nb; d++) {
    if (cnt[d + 1] > RANK_MAX) return 0;
    cnt[d + 1] += cnt[d];
  }
  memcpy(pos, cnt, (nb + 1) * sizeof *pos);
  for (uint32_t i = 0; i < n; i++) b[pos[((uint32_t)(a[i] >> 32) - lo) >> sh]++] = a[i];
  for (uint32_t d = 0; d < nb; d++) {
    uint64_t *s = b + cnt[d];
    const uint32_t m = cnt[d + 1] - cnt[d];
    if (m > 8) {
      rank_sort_u64(s, m, a);
      memcpy(s, a, (size_t)m * sizeof *s);
      continue;
    }
    for (uint32_t x = 1; x < m; x++) {
      uint64_t v = s[x];
      uint32_t y = x;
      for (; y > 0 && s[y - 1] > v; y--) s[y] = s[y - 1];
      s[y] = v;
    }
  }
  for (uint32_t i = 0; i < n; i++) cand[i] = key_cand(b[i]);
  return 1;
}
#endif

void ra_graph_sort_cands(ra_cand *cand, uint32_t n) {
  if (n <= 16) {
    cand_insertion_sort(cand, n);
    return;
  }
#ifdef __x86_64__
  if (n <= RADIX_MAX && ra_cpu_has_avx2()) {
    if (n <= RANK_MAX) {
      cand_rank_sort(cand, n);
      return;
    }
    if (cand_bucket_sort(cand, n)) return;
  }
#endif
  if (n <= RADIX_MAX)
    cand_radix_sort(cand, n);
  else
    cand_quicksort(cand, n);
}

/* Moves the k best of c[0..n) to the front, in order; the rest stay after them, unsorted. */
static void cand_sort_prefix(ra_cand *c, uint32_t n, uint32_t k) {
  if (k >= n) {
    ra_graph_sort_cands(c, n);
    return;
  }
  ra_cand *lo = c;
  uint32_t m = n, want = k;
  while (m > 16) {
    uint32_t p = cand_partition(lo, m);
    if (p == want) break;
    if (p > want) {
      m = p;
    } else {
      lo += p;
      m -= p;
      want -= p;
    }
  }
  if (m <= 16) cand_insertion_sort(lo, m);
  ra_graph_sort_cands(c, k);
}

/* Candidates from i on are read next: sorts the rest of w->cand if rank_cands left it unsorted. */
static inline void need_sorted(const ra_cand *cand, uint32_t i, uint32_t n_cand, ra_graph_work *w) {
  if (cand == w->cand && i == w->n_sorted && i < n_cand) {
    ra_graph_sort_cands(w->cand + i, n_cand - i);
    w->n_sorted = n_cand;
  }
}

/* Fetches key id's row of the build's metric cache (w->mk set). */
static inline void prefetch_map(const ra_graph_work *w, uint32_t id) {
  const char *row = (const char *)(w->mk + (size_t)id * w->dim);
  for (size_t o = 0; o < (size_t)w->dim * sizeof *w->mk; o += 64) __builtin_prefetch(row + o, 0, 3);
}

uint32_t ra_graph_prune(const ra_keys *keys, const ra_cand *cand, uint32_t n_cand, uint32_t budget,
                        int fill, ra_graph_work *w) {
  uint32_t ns = 0;
  if (budget > w->M) budget = w->M;
  const int d = keys->dim;
  const size_t rb = ra_dtype_row_bytes(keys->dtype, (size_t)d);
  /* s(r, p) = (C r)·p - hn[r] - hn[p]: C r of each accepted r (at most M of them) is mapped once
   * into w->selm, and a candidate costs one dot per accepted key, not a dim x dim product (the
   * map comes from the build's metric cache, or at insertion mostly from the work's map cache). */
  uint32_t n_mapped = 0; /* selm holds the maps of sel[0..n_mapped) */
  for (uint32_t i = 0; i < n_cand && ns < budget; i++) {
    need_sorted(cand, i, n_cand, w);
    const uint32_t p = cand[i].id;
    const float hp = w->hn[p], sim = cand[i].sim;
    const char *kp = (const char *)keys->rows + (size_t)p * rb;
    int keep = 1;
    /* Four accepted keys at a time (the first occluder is mostly among the first three: 2.5
     * dots per candidate at 131K keys); the scores are ra_vec_dot's bit for bit. A block's four
     * tests are or-ed, one branch per block, not an early exit per test, whose branches
     * mispredict (this function's own samples in a 131K-key build: 15.3 -> 11.4 %, with the
     * fill below). */
    for (uint32_t j = 0; j < ns && keep; j += 4) {
      uint32_t b = ns - j < 4 ? ns - j : 4;
      float dot[4];
      int occ = 0;
      for (; n_mapped < j + b; n_mapped++)
        memcpy(w->selm + (size_t)n_mapped * d, w->mk + (size_t)w->sel[n_mapped] * d,
               (size_t)d * sizeof *w->selm);
      ra_vec_dot_queries(w->selm + (size_t)j * d, b, kp, keys->dtype, d, dot);
      for (uint32_t x = 0; x < b; x++) occ |= dot[x] - w->selh[j + x] - hp > sim;
      keep = !occ;
    }
    if (keep) {
      /* From the build's metric cache the map is copied when a candidate first reaches it, its
       * lines fetched meanwhile (copied at once, the copies' cache misses were 10 % of a
       * 131K-key build's samples; so, 3.6 %); otherwise mapped now. */
      if (w->mk) {
        prefetch_map(w, p);
      } else {
        ra_graph_key_to_metric(keys, p, w, w->selm + (size_t)ns * d);
        n_mapped = ns + 1;
      }
      w->selh[ns] = hp;
      w->selpos[ns] = i;
      w->sel[ns++] = p;
    }
  }
  if (fill) {
    /* The candidates are distinct: the accepted ones are those at selpos (ascending). */
    const uint32_t na = ns;
    for (uint32_t i = 0, a = 0; i < n_cand && ns < budget; i++) {
      need_sorted(cand, i, n_cand, w);
      if (a < na && w->selpos[a] == i)
        a++;
      else
        w->sel[ns++] = cand[i].id;
    }
  }
  return ns;
}

void ra_graph_set_row(ra_graph *g, uint32_t u, const uint32_t *sel, uint32_t n_sel) {
  uint32_t np = g->npin[u];
  memcpy(row_of(g, u) + np, sel, (size_t)n_sel * sizeof *sel);
  g->deg[u] = (uint16_t)(np + n_sel);
}

void ra_graph_rank_cands(const ra_keys *keys, uint32_t pivot, uint32_t n, ra_graph_work *w) {
  ra_graph_key_to_metric(keys, pivot, w, w->qvec);
  ra_vec_dot_rows4(w->qvec, keys->rows, keys->dtype, keys->dim, w->ids, n, w->dots);
  for (uint32_t i = 0; i < n; i++) {
    w->cand[i].id = w->ids[i];
    w->cand[i].sim = w->dots[i] - w->hn[pivot] - w->hn[w->ids[i]];
  }
  /* Pruning stops once M are kept, mostly within the first few M candidates: sort those now and
   * the rest only if it gets there (need_sorted). */
  if (n <= RADIX_MAX) {
    ra_graph_sort_cands(w->cand, n);
    w->n_sorted = n;
    return;
  }
  uint32_t prefix = 4 * w->M < 64 ? 64 : 4 * w->M;
  w->n_sorted = prefix < n ? prefix : n;
  cand_sort_prefix(w->cand, n, w->n_sorted);
}

/* Adds the edges v -> src[0..n) at once: appended while the row has room, else one re-pruning of
 * v's unpinned edges plus the new ones; the pinned edges and the `keep` unpinned ones after them
 * stay (an inserted row's guided prefix, link_guided). Writes row v only. */
static void add_edges_keep(ra_graph *g, const ra_keys *keys, uint32_t v, const uint32_t *src,
                           uint32_t n, uint32_t keep, ra_graph_work *w) {
  uint32_t *row = row_of(g, v), d = g->deg[v], np = g->npin[v];
  uint32_t ep = mark_begin(w), m = 0;
  w->mark[v] = ep;
  for (uint32_t j = 0; j < d; j++) w->mark[row[j]] = ep;
  for (uint32_t i = 0; i < n; i++)
    if (w->mark[src[i]] != ep) {
      w->mark[src[i]] = ep;
      w->ids[m++] = src[i];
    }
  if (d + m <= g->M) {
    memcpy(row + d, w->ids, (size_t)m * sizeof *row);
    g->deg[v] = (uint16_t)(d + m);
    return;
  }
  if (keep > d - np) keep = d - np;
  np += keep;
  memmove(w->ids + (d - np), w->ids, (size_t)m * sizeof *w->ids);
  memcpy(w->ids, row + np, (size_t)(d - np) * sizeof *w->ids);
  ra_graph_rank_cands(keys, v, d - np + m, w);
  uint32_t ns = ra_graph_prune(keys, w->cand, d - np + m, g->M - np, 1, w);
  memcpy(row + np, w->sel, (size_t)ns * sizeof *row);
  g->deg[v] = (uint16_t)(np + ns);
}

static void add_edges(ra_graph *g, const ra_keys *keys, uint32_t v, const uint32_t *src,
                      uint32_t n, ra_graph_work *w) {
  add_edges_keep(g, keys, v, src, n, 0, w);
}

void ra_graph_add_edge(ra_graph *g, const ra_keys *keys, uint32_t u, uint32_t v, ra_graph_work *w) {
  add_edges(g, keys, u, &v, 1, w);
}

int ra_graph_add_reverse_edges(ra_graph *g, const ra_keys *keys, int n_threads, ra_error *err) {
  const uint32_t n = g->n;
  int rc = RA_OK;
  size_t *off = calloc((size_t)n + 1, sizeof *off);
  uint32_t *src = NULL;
  ra_graph_work *works = NULL;
  int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  if (!off) goto nomem;
  /* In-edge lists in CSR form, sources ascending (the fill loop walks u in order). */
  for (uint32_t u = 0; u < n; u++)
    for (uint32_t j = 0; j < g->deg[u]; j++) off[row_of(g, u)[j] + 1]++;
  uint32_t max_in = 0;
  for (uint32_t v = 0; v < n; v++) {
    if (off[v + 1] > max_in) max_in = (uint32_t)off[v + 1];
    off[v + 1] += off[v];
  }
  src = malloc((off[n] ? off[n] : 1) * sizeof *src);
  works = calloc((size_t)nt, sizeof *works);
  if (!src || !works) goto nomem;
  {
    size_t *fillp = malloc((size_t)n * sizeof *fillp);
    if (!fillp) goto nomem;
    memcpy(fillp, off, (size_t)n * sizeof *fillp);
    for (uint32_t u = 0; u < n; u++)
      for (uint32_t j = 0; j < g->deg[u]; j++) src[fillp[row_of(g, u)[j]]++] = u;
    free(fillp);
  }
  for (int t = 0; t < nt; t++)
    if (ra_graph_work_init(&works[t], keys->dim, g->M) ||
        ra_graph_work_reserve(&works[t], g->M + max_in, n, 1))
      goto nomem;
    else
      ra_graph_work_bind(&works[t], g);

#pragma omp parallel for num_threads(nt) schedule(dynamic, 64)
  for (uint32_t v = 0; v < n; v++) {
    add_edges(g, keys, v, src + off[v], (uint32_t)(off[v + 1] - off[v]),
              &works[omp_get_thread_num()]);
  }
  goto done;
nomem:
  rc = ra_errorf(err, RA_ENOMEM, "graph: out of memory adding reverse edges (%u nodes)", n);
done:
  if (works)
    for (int t = 0; t < nt; t++) ra_graph_work_free(&works[t]);
  free(works);
  free(src);
  free(off);
  return rc;
}

/* ---- connectivity ---- */

/* Makes u's j-th edge pinned: it moves to the end of the pinned prefix. */
static void pin_edge(ra_graph *g, uint32_t u, uint32_t j) {
  uint32_t *row = row_of(g, u), np = g->npin[u];
  uint32_t t = row[np];
  row[np] = row[j];
  row[j] = t;
  g->npin[u] = (uint16_t)(np + 1);
}

/* Adds the pinned edge p -> u (p has pin room; u is not in the tree, so not pinned anywhere). A
 * full row drops its unpinned neighbor least similar to p. */
static void attach_pinned(ra_graph *g, const ra_keys *keys, uint32_t p, uint32_t u,
                          ra_graph_work *w) {
  uint32_t *row = row_of(g, p), d = g->deg[p], np = g->npin[p];
  for (uint32_t j = np; j < d; j++)
    if (row[j] == u) {
      pin_edge(g, p, j);
      return;
    }
  if (d < g->M) {
    row[d] = u;
    g->deg[p] = (uint16_t)(d + 1);
    pin_edge(g, p, d);
    return;
  }
  ra_graph_key_to_metric(keys, p, w, w->vec);
  ra_vec_dot_rows(w->vec, keys->rows, keys->dtype, keys->dim, row + np, d - np, w->dots);
  uint32_t worst = 0;
  for (uint32_t j = 0; j < d - np; j++) w->dots[j] -= w->hn[row[np + j]];
  for (uint32_t j = 1; j < d - np; j++)
    if (w->dots[j] < w->dots[worst]) worst = j;
  row[np + worst] = u;
  pin_edge(g, p, np + worst);
}

/* Pins an edge to u from the first result that is in the tree and has pin room (any tree node
 * with room if none does: a tree of t nodes holds t - 1 pinned edges in t * pc >= t slots, so
 * one always has room). in_tree NULL = every node other than u is in the tree. Returns 0 once u
 * is attached, -1 if no node could take it (an empty tree). */
static int attach_parent(ra_graph *g, const ra_keys *keys, uint32_t u, const uint32_t *res,
                          uint32_t n_res, const uint8_t *in_tree, ra_graph_work *w) {
  const uint32_t pc = pin_cap(g);
  uint32_t parent = UINT32_MAX;
  for (uint32_t i = 0; i < n_res && parent == UINT32_MAX; i++) {
    uint32_t v = res[i];
    if (v != u && (!in_tree || in_tree[v]) && g->npin[v] < pc) parent = v;
  }
  for (uint32_t v = 0; v < g->n && parent == UINT32_MAX; v++)
    if (v != u && (!in_tree || in_tree[v]) && g->npin[v] < pc) parent = v;
  if (parent == UINT32_MAX) return -1;
  attach_pinned(g, keys, parent, u, w);
  return 0;
}

/* u's unpinned out-edges re-chosen from its current ones plus res (pruned, filled). Writes row u
 * only. */
static void relink_row(ra_graph *g, const ra_keys *keys, uint32_t u, const uint32_t *res,
                       uint32_t n_res, ra_graph_work *w) {
  uint32_t ep = mark_begin(w), m = 0, *row = row_of(g, u), np = g->npin[u];
  w->mark[u] = ep;
  for (uint32_t j = 0; j < np; j++) w->mark[row[j]] = ep;
  for (uint32_t j = np; j < g->deg[u]; j++)
    if (w->mark[row[j]] != ep) {
      w->mark[row[j]] = ep;
      w->ids[m++] = row[j];
    }
  for (uint32_t i = 0; i < n_res; i++)
    if (w->mark[res[i]] != ep) {
      w->mark[res[i]] = ep;
      w->ids[m++] = res[i];
    }
  ra_graph_rank_cands(keys, u, m, w);
  uint32_t ns = ra_graph_prune(keys, w->cand, m, g->M - np, 1, w);
  ra_graph_set_row(g, u, w->sel, ns);
}

/* Links u given its beam-search results res (reachable nodes, best first): pinned parent, pruned
 * out-edges (u's current unpinned edges plus res), reverse edges. */
static void link_node(ra_graph *g, const ra_keys *keys, uint32_t u, const uint32_t *res,
                      uint32_t n_res, ra_graph_work *w) {
  (void)attach_parent(g, keys, u, res, n_res, NULL, w); /* u > 0 has the other nodes as tree */
  relink_row(g, keys, u, res, n_res, w);
  /* add_edge reuses w->sel: walk a copy of the new row. */
  uint32_t d = g->deg[u], *row = row_of(g, u);
  memcpy(w->res_id, row, (size_t)d * sizeof *row);
  for (uint32_t j = 0; j < d; j++) ra_graph_add_edge(g, keys, w->res_id[j], u, w);
}

/* Reverse-edge requests (target row v gets an edge to u), ordered by v then u. */
typedef struct rev_pair {
  uint32_t v, u;
} rev_pair;

static int rev_cmp(const void *a, const void *b) {
  const rev_pair *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? -1 : 1;
  return x->u < y->u ? -1 : x->u > y->u;
}

int ra_graph_connect(ra_graph *g, const ra_keys *keys, uint32_t L, int n_threads, ra_error *err) {
  const uint32_t n = g->n, pc = pin_cap(g);
  int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  int rc = RA_OK;
  uint8_t *in_tree = calloc(n ? n : 1, 1);
  uint32_t *queue = malloc((size_t)(n ? n : 1) * sizeof *queue);
  ra_graph_work *works = calloc((size_t)nt, sizeof *works);
  /* A fixed batch (not per thread) keeps the graph independent of the thread count. */
  const uint32_t batch = 64;
  if (L < g->M) L = g->M;
  uint32_t *res = malloc((size_t)batch * L * sizeof *res);
  uint32_t *res_n = malloc((size_t)batch * sizeof *res_n);
  rev_pair *pairs = malloc((size_t)batch * g->M * sizeof *pairs);
  uint32_t *grp = malloc(((size_t)batch * g->M + 1) * sizeof *grp);
  uint32_t *src = malloc((size_t)batch * g->M * sizeof *src);
  if (!in_tree || !queue || !works || !res || !res_n || !pairs || !grp || !src) goto nomem;
  for (int t = 0; t < nt; t++)
    if (ra_graph_work_init(&works[t], keys->dim, g->M) ||
        ra_graph_work_reserve(&works[t], g->M + (L > batch ? L : batch) + 1, n, L))
      goto nomem;
    else
      ra_graph_work_bind(&works[t], g);
  if (n == 0) goto done;

  /* BFS from the entry pins a spanning tree of what the edges already reach. */
  memset(g->npin, 0, (size_t)n * sizeof *g->npin);
  uint32_t head = 0, tail = 0;
  in_tree[g->entry] = 1;
  queue[tail++] = g->entry;
  while (head < tail) {
    uint32_t u = queue[head++];
    uint32_t *row = row_of(g, u);
    for (uint32_t j = 0; j < g->deg[u] && g->npin[u] < pc; j++) {
      uint32_t v = row[j];
      if (in_tree[v]) continue;
      pin_edge(g, u, j);
      in_tree[v] = 1;
      queue[tail++] = v;
    }
  }
  /* The rest: queue[] now lists them (the tree nodes are no longer needed there), in a seeded
   * random order. In id order, a batch held consecutive tokens, which are each other's nearest
   * keys and cannot link to each other within a batch: runs of recent tokens hung from the tree
   * one by one, and walks could not get into them (bench/results/defaults/README.md). */
  uint32_t n_un = 0;
  for (uint32_t u = 0; u < n; u++)
    if (!in_tree[u]) queue[n_un++] = u;
  g->n_repaired = n_un;
  uint64_t rng = 0x9e3779b97f4a7c15ull ^ n;
  for (uint32_t i = 0; i + 1 < n_un; i++) {
    uint32_t j = i + ra_index_rng_below(&rng, n_un - i), t = queue[i];
    queue[i] = queue[j];
    queue[j] = t;
  }

  /* A batch is searched in parallel against the graph as the previous batches left it (a search
   * may meet a batch mate that edges reach but the tree does not yet hold), then linked in
   * phases that each write disjoint rows: parents pinned (serially: pin room is shared), each
   * node's own row (in parallel), and the reverse edges grouped by target row (in parallel, one
   * re-pruning per row). Every phase's result is independent of the thread count. */
  for (uint32_t b0 = 0; b0 < n_un; b0 += batch) {
    uint32_t nb = n_un - b0 < batch ? n_un - b0 : batch;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
    for (uint32_t i = 0; i < nb; i++) {
      ra_graph_work *w = &works[omp_get_thread_num()];
      search_near_key(g, keys, queue[b0 + i], L, w, res + (size_t)i * L, &res_n[i]);
    }
    /* Each node joins the tree as soon as it hangs from it, so that its batch mates can hang
     * from it too: when the tree is small (an entry with few edges), its pin room runs out
     * within one batch. */
    for (uint32_t i = 0; i < nb; i++) {
      uint32_t u = queue[b0 + i];
      if (attach_parent(g, keys, u, res + (size_t)i * L, res_n[i], in_tree, &works[0])) {
        rc = ra_errorf(err, RA_EINTERNAL, "graph: no tree node can take unreachable node %u", u);
        goto done;
      }
      in_tree[u] = 1;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
    for (uint32_t i = 0; i < nb; i++)
      relink_row(g, keys, queue[b0 + i], res + (size_t)i * L, res_n[i],
                 &works[omp_get_thread_num()]);
    uint32_t np = 0;
    for (uint32_t i = 0; i < nb; i++) {
      uint32_t u = queue[b0 + i], *row = row_of(g, u);
      for (uint32_t j = 0; j < g->deg[u]; j++) pairs[np++] = (rev_pair){row[j], u};
    }
    qsort(pairs, np, sizeof *pairs, rev_cmp);
    uint32_t ng = 0;
    for (uint32_t i = 0; i < np; i++) {
      src[i] = pairs[i].u;
      if (i == 0 || pairs[i].v != pairs[i - 1].v) grp[ng++] = i;
    }
    grp[ng] = np;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
    for (uint32_t e = 0; e < ng; e++)
      add_edges(g, keys, pairs[grp[e]].v, src + grp[e], grp[e + 1] - grp[e],
                &works[omp_get_thread_num()]);
  }
  goto done;
nomem:
  rc = ra_errorf(err, RA_ENOMEM, "graph: out of memory linking unreachable nodes (%u nodes)", n);
done:
  if (works)
    for (int t = 0; t < nt; t++) ra_graph_work_free(&works[t]);
  free(works);
  free(pairs);
  free(grp);
  free(src);
  free(res);
  free(res_n);
  free(queue);
  free(in_tree);
  return rc;
}

/* Edges an old (built) row whose degree is full may give to inserted keys through the search's
 * reverse edges. Each such re-pruning swaps one of its edges for a recent token, and the recent
 * tokens are many and alike: with all of them re-pruned (the unguided insertion), walks on SmolLM2
 * 34K L3 H4 found the old top keys behind ~300 recent ones and recall@100 at ef 320 fell from 0.905
 * (rebuild) to 0.733. None: 0.908 there, but 8K heads then needed up to 1.5 points more scan for
 * recall 0.95 (the recent keys lacked ways in); 2 keeps both (0.931; 8K within 0.6 points). */
#define OLD_ROW_NEW_EDGES 2u

/* Links u (inserted) with the search's results res and the guide's keys. Its row is
 * [guided keys | metric / co-rated neighbors]: the first out_slots go to the guide's keys pruned
 * among themselves, because pruned by key distance alongside the search's results they lost
 * (an inserted key kept ~11 % old keys): they are the way from the run of recent keys back to the
 * old keys that the same queries rank high. Reverse edges: from the search's neighbors (appended
 * where a row has room; an inserted full row is re-pruned with its own guided prefix held; an
 * old full row is re-pruned while it has fewer than OLD_ROW_NEW_EDGES edges to inserted keys),
 * and from guide->in (re-pruned like the others, but old rows without the cap: those edges are
 * what a query's walk that reaches its top keys takes to the new key). */
static void link_guided(ra_graph *g, const ra_keys *keys, uint32_t u, const uint32_t *res,
                        uint32_t n_res, const ra_graph_guide *gd, ra_graph_work *w) {
  uint32_t sel1[RA_GRAPH_MAX_DEGREE], sel2[RA_GRAPH_MAX_DEGREE];
  (void)attach_parent(g, keys, u, res, n_res, NULL, w);
  uint32_t np = g->npin[u], budget = g->M - np, *row = row_of(g, u);
  uint32_t slots = gd->out_slots < budget ? gd->out_slots : budget;
  /* The search's results, pruned to what the guide leaves. */
  uint32_t ep = mark_begin(w), m = 0, n1 = 0, n2 = 0;
  w->mark[u] = ep;
  for (uint32_t j = 0; j < np; j++) w->mark[row[j]] = ep;
  for (uint32_t i = 0; i < n_res; i++)
    if (w->mark[res[i]] != ep) {
      w->mark[res[i]] = ep;
      w->ids[m++] = res[i];
    }
  if (m) {
    ra_graph_rank_cands(keys, u, m, w);
    n1 = ra_graph_prune(keys, w->cand, m, budget - slots, 1, w);
    memcpy(sel1, w->sel, (size_t)n1 * sizeof *sel1);
  }
  /* The guide's keys not linked yet, pruned among themselves into the rest. */
  ep = mark_begin(w);
  w->mark[u] = ep;
  for (uint32_t j = 0; j < np; j++) w->mark[row[j]] = ep;
  for (uint32_t i = 0; i < n1; i++) w->mark[sel1[i]] = ep;
  m = 0;
  for (uint32_t i = 0; i < gd->n_out; i++)
    if (w->mark[gd->out[i]] != ep) {
      w->mark[gd->out[i]] = ep;
      w->ids[m++] = gd->out[i];
    }
  if (m && budget > n1) {
    ra_graph_rank_cands(keys, u, m, w);
    n2 = ra_graph_prune(keys, w->cand, m, budget - n1, 1, w);
    memcpy(sel2, w->sel, (size_t)n2 * sizeof *sel2);
  }
  /* Few guide keys: the rest of the search's results, in order, fill the row. */
  for (uint32_t i = 0; i < n_res && n1 + n2 < budget; i++)
    if (w->mark[res[i]] != ep) {
      w->mark[res[i]] = ep;
      sel1[n1++] = res[i];
    }
  memcpy(sel2 + n2, sel1, (size_t)n1 * sizeof *sel2);
  ra_graph_set_row(g, u, sel2, n2 + n1);
  /* Reverse edges from the search's neighbors (sel1; add_edges reuses w's buffers). */
  for (uint32_t j = 0; j < n1; j++) {
    uint32_t v = sel1[j], keep = 0;
    if (g->deg[v] >= g->M) {
      if (v >= gd->n_built) {
        keep = gd->out_slots;
      } else {
        const uint32_t *rv = row_of(g, v);
        uint32_t recent = 0;
        for (uint32_t i = 0; i < g->deg[v]; i++) recent += rv[i] >= gd->n_built;
        if (recent >= OLD_ROW_NEW_EDGES) continue;
      }
    }
    add_edges_keep(g, keys, v, &u, 1, keep, w);
  }
  for (uint32_t i = 0; i < gd->n_in; i++) {
    uint32_t v = gd->in[i];
    add_edges_keep(g, keys, v, &u, 1, v >= gd->n_built ? gd->out_slots : 0, w);
  }
}

void ra_graph_insert(ra_graph *g, const ra_keys *keys, uint32_t id, uint32_t L,
                     const ra_graph_guide *guide, ra_graph_work *w) {
  g->deg[id] = 0;
  g->npin[id] = 0;
  g->n = id + 1;
  ra_graph_work_bind(w, g);
  /* hn[id] as ra_graph_set_norms computes it, through w's map cache: the searches and the
   * ranking map the key again. */
  ra_graph_key_to_metric(keys, id, w, w->qvec);
  g->hn[id] = 0.5f * ra_vec_dot(w->qvec,
                                (const char *)keys->rows +
                                    (size_t)id * ra_dtype_row_bytes(keys->dtype, (size_t)keys->dim),
                                keys->dtype, keys->dim);
  if (id == 0) {
    g->entry = 0;
    return;
  }
  uint32_t n_res = 0;
  search_near_key(g, keys, id, L, w, w->res_id, &n_res);
  /* link_node reads res_id before it reuses that buffer for the new row. */
  if (guide)
    link_guided(g, keys, id, w->res_id, n_res, guide, w);
  else
    link_node(g, keys, id, w->res_id, n_res, w);
}

int ra_graph_check(const ra_graph *g, ra_error *err) {
  const uint32_t n = g->n;
  int rc = RA_OK;
  uint32_t *seen = calloc(n ? n : 1, sizeof *seen);
  uint32_t *pin_in = calloc(n ? n : 1, sizeof *pin_in);
  uint32_t *queue = malloc((size_t)(n ? n : 1) * sizeof *queue);
  if (!seen || !pin_in || !queue) {
    rc = ra_errorf(err, RA_ENOMEM, "graph check: out of memory");
    goto out;
  }
  if (n == 0) goto out;
  if (g->entry >= n) {
    rc = ra_errorf(err, RA_EINTERNAL, "graph: entry %u >= n %u", g->entry, n);
    goto out;
  }
  for (uint32_t u = 0; u < n; u++) {
    const uint32_t *row = row_of(g, u);
    if (g->deg[u] > g->M || g->npin[u] > g->deg[u] || g->npin[u] > pin_cap(g)) {
      rc = ra_errorf(err, RA_EINTERNAL, "graph: node %u degree %u pinned %u (M %u)", u, g->deg[u],
                     g->npin[u], g->M);
      goto out;
    }
    for (uint32_t j = 0; j < g->deg[u]; j++) {
      uint32_t v = row[j];
      if (v >= n || v == u || seen[v] == u + 1) {
        rc = ra_errorf(err, RA_EINTERNAL, "graph: node %u edge %u -> %u is %s", u, j, v,
                       v >= n ? "out of range" : v == u ? "a self loop" : "a duplicate");
        goto out;
      }
      seen[v] = u + 1;
      if (j < g->npin[u]) pin_in[v]++;
    }
  }
  for (uint32_t u = 0; u < n; u++)
    if (pin_in[u] != (u == g->entry ? 0u : 1u)) {
      rc = ra_errorf(err, RA_EINTERNAL, "graph: node %u has %u pinned in-edges", u, pin_in[u]);
      goto out;
    }
  /* Pinned edges alone must reach everything from the entry (so any walk can). */
  memset(seen, 0, (size_t)n * sizeof *seen);
  uint32_t head = 0, tail = 0;
  seen[g->entry] = 1;
  queue[tail++] = g->entry;
  while (head < tail) {
    uint32_t u = queue[head++];
    for (uint32_t j = 0; j < g->npin[u]; j++) {
      uint32_t v = row_of(g, u)[j];
      if (!seen[v]) {
        seen[v] = 1;
        queue[tail++] = v;
      }
    }
  }
  if (tail != n)
    rc = ra_errorf(err, RA_EINTERNAL, "graph: %u of %u nodes unreachable from entry %u", n - tail,
                   n, g->entry);
out:
  free(seen);
  free(pin_in);
  free(queue);
  return rc;
}
