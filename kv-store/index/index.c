/* ra_index: argument checks, defaults, memory estimates, scratch management and dispatch to the
 * per-kind files (flat.c, ivf.c, kgraph.c, roar.c over graph.c). */
#include "index_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM 4096
#define MAX_KEYS 0x7fffffffu /* beam entries keep a flag in the id's top bit */
/* Mapped keys C·key an index's insertion work keeps (graph.h, ra_graph_work_cache): 512 KiB at
 * head_dim 128. An insertion maps ~100 keys, 54 (SmolLM2 16K) to 81 (synthetic 32K) of them
 * distinct; an LRU of 1024 hit 98 % / 77 % of the maps (4096: 98 % / 95 %). */
#define INS_MAP_CACHE 1024u

_Static_assert(RA_INDEX_MAX_DEGREE <= RA_GRAPH_MAX_DEGREE, "graph rows are sized for the degree bound");

static int is_graph(ra_mode k) { return (RA_MODE_BIT(k) & RA_MODES_GRAPH) != 0; }

/* Defaults: each the cheapest setting that held recall@100 0.95 in the sweeps on synthetic and
 * SmolLM2 Q/K (numbers: bench/results/defaults/README.md). */
void ra_index_params_default(ra_mode kind, ra_index_params *p) {
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->degree = 16;
  p->build_ef = 128;
  p->knn_nq = 100;
  p->n_lists = 0;
  p->max_iters = 5;
  p->train_per_list = 64;
  p->query_sample = 1.0f;
  p->pivots = 0; /* roar.c: 64 from lists alone, ROAR_PIVOTS_KEYED with key -> query lists */
  p->keep_queries = 1024;
  p->keep_topk = 32;
  p->seed = 0x5241494E44455831ull;
  p->n_threads = 0;
}

void ra_search_params_default(ra_mode kind, ra_search_params *sp) {
  /* Where roar / ivf reach recall@100 ~0.95 on the 32K synthetic heads. */
  sp->ef = kind == RA_MODE_ROAR ? 320 : 400;
  sp->nprobe = 96;
}

static int check_keys(const ra_keys *keys, ra_error *err) {
  if (!keys) return ra_errorf(err, RA_EINVAL, "index: keys is NULL");
  if (keys->dim <= 0 || keys->dim > MAX_DIM)
    return ra_errorf(err, RA_EINVAL, "index: dim %d out of range [1, %d]", keys->dim, MAX_DIM);
  if (ra_dtype_row_bytes(keys->dtype, 1) == 0)
    return ra_errorf(err, RA_EINVAL, "index: unknown dtype %d", (int)keys->dtype);
  if (keys->n > MAX_KEYS) return ra_errorf(err, RA_EINVAL, "index: %u keys is too many", keys->n);
  if (keys->n && !keys->rows) return ra_errorf(err, RA_EINVAL, "index: keys->rows is NULL");
  return RA_OK;
}

static int check_params(const ra_index_params *p, ra_error *err) {
  if (!p) return ra_errorf(err, RA_EINVAL, "index: params is NULL");
  if (p->kind != RA_MODE_FLAT && !ra_mode_has_index(p->kind))
    return ra_errorf(err, RA_EINVAL, "index: unknown kind %d", (int)p->kind);
  /* The table's rows and bounds, over the fields of the same names. */
  ra_index_spec sp = {.kind = p->kind};
#define SPEC_FIELD_(name, type, lo, hi, modes, zero, flag, help) sp.name = p->name;
  RA_INDEX_BUILD_PARAM_TABLE(SPEC_FIELD_)
#undef SPEC_FIELD_
  int rc = ra_index_spec_check_resolved(&sp, err);
  if (rc) return rc;
  if (p->kind == RA_MODE_IVF && p->max_iters > 1000)
    return ra_errorf(err, RA_EINVAL, "index: max_iters %u > 1000", p->max_iters);
  if (p->kind == RA_MODE_IVF && p->train_per_list > 65536)
    return ra_errorf(err, RA_EINVAL, "index: train_per_list %u > 65536", p->train_per_list);
  return RA_OK;
}

static int threads_of(const ra_index_params *p) {
  return p->n_threads > 0 ? p->n_threads : omp_get_max_threads();
}

size_t ra_index_estimate_bytes(const ra_index_params *p, uint32_t n_keys, int dim,
                               uint32_t n_queries) {
  const size_t n = n_keys, d = dim > 0 ? (size_t)dim : 1, nt = (size_t)threads_of(p);
  /* knn.c: per thread, a [512, 2048] sgemm score block and 512 heaps of k (id, score) pairs. */
  const size_t blocks = nt * (size_t)512 * 2048 * 4, heaps = nt * (size_t)512 * 8;
  size_t total = sizeof(ra_index);
  if (p->kind == RA_MODE_IVF) {
    size_t nl = p->n_lists ? p->n_lists : (size_t)(4.0 * sqrt((double)n)) + 1;
    /* Lists: exactly the ids at build (insertion grows them by doubling, up to twice). */
    total += nl * (d * 4 + 4 + 8 + 8 + 16 * 4) + n * 4 * 2;
    /* kmeans.c: the fp32 training sample and its assignment, the shuffle and every key's
     * assignment (n each), per thread a [256, 512] score block and a [256, d] fp32 key block. */
    size_t m = p->train_per_list && nl * p->train_per_list < n ? nl * p->train_per_list : n;
    total += m * (d * 4 + 4) + n * 4 * 2 + nt * (256 * 512 * 4 + 256 * (d * 4 + 4));
  } else if (is_graph(p->kind)) {
    const size_t M = p->degree, L = p->build_ef;
    size_t graph = n * (M * 4 + 8) + d * d * 4;
    /* Per-thread work: marks and visited (n each, 1/8 headroom), candidates, beam. */
    size_t work = n * 4 * 9 / 4 + 64 + (M + L + 1 + n) * 16 + (L + 1) * 8 + d * 16 + M * d * 4;
    size_t peak;
    if (p->kind == RA_MODE_KGRAPH) {
      size_t lc = L < n ? L : n;
      peak = n * lc * 8 + blocks + heaps * lc; /* knn of the cached fp32 keys */
    } else {
      size_t m = n_queries, nq = p->knn_nq < n ? p->knn_nq : n;
      /* Lists, pivot CSR (queries' top ids), sample, metric: held into the projection. */
      size_t held = m * nq * 4 + n * 4 + m * 4 * (size_t)(p->pivots ? p->pivots : 64) + m * 4 +
                    d * d * 4;
      /* The knn phase: keys fp32, sampled queries, sgemm block + heaps. */
      peak = held + n * d * 4 + m * d * 4 + blocks + heaps * nq;
      /* Key -> query lists (roar.c, link_by_key_queries): inverted, at most RA_INDEX_KEY_TOP_MAX
       * per key, and a sampled row per query (no larger than the knn phase at head_dim >= 64). */
      size_t keyq = held + n * 4 * RA_INDEX_KEY_TOP_MAX + m * 12 + 8;
      if (keyq > peak) peak = keyq;
    }
    size_t reverse = (n + 1) * 8 * 2 + n * M * 4; /* CSR of in-edges */
    size_t connect = n + n * 4 + (size_t)32 * nt * L * 4;
    size_t phase = peak > reverse ? peak : reverse;
    if (connect > phase) phase = connect;
    size_t metric_cache = n * d * 4; /* graph.h's mk, alive for the whole build */
    /* + the index's insertion work with its map cache (a metric needs queries: roar only) */
    size_t ins_cache = p->kind == RA_MODE_ROAR ? (size_t)INS_MAP_CACHE * (d * 4 + 8) : 0;
    total += graph + metric_cache + nt * work + phase + work + ins_cache;
    if (p->kind == RA_MODE_ROAR) {
      total += ra_roar_keep_estimate(p, n_queries, dim); /* the kept queries */
    }
  }
  return total;
}

int ra_index_scratch_reserve(ra_index_scratch *s, uint32_t n, uint32_t pool, uint32_t buf,
                             uint32_t lists) {
  if (n > s->visited_cap) {
    uint32_t cap = n + n / 8 + 64;
    uint32_t *v = calloc(cap, sizeof *v);
    if (!v) return RA_ENOMEM;
    free(s->visited);
    s->visited = v;
    s->visited_cap = cap;
    s->epoch = 0;
  }
  if (pool > s->pool_cap) {
    uint32_t *pi = realloc(s->pool_id, (size_t)pool * sizeof *pi);
    if (!pi) return RA_ENOMEM;
    s->pool_id = pi;
    float *ps = realloc(s->pool_score, (size_t)pool * sizeof *ps);
    if (!ps) return RA_ENOMEM;
    s->pool_score = ps;
    s->pool_cap = pool;
  }
  if (buf < RA_INDEX_SCAN_BLOCK) buf = RA_INDEX_SCAN_BLOCK;
  if (buf > s->buf_cap) {
    uint32_t *bi = realloc(s->nbr_id, (size_t)buf * sizeof *bi);
    if (!bi) return RA_ENOMEM;
    s->nbr_id = bi;
    float *bs = realloc(s->nbr_score, (size_t)buf * sizeof *bs);
    if (!bs) return RA_ENOMEM;
    s->nbr_score = bs;
    s->buf_cap = buf;
  }
  if (lists > s->list_cap) {
    uint32_t *li = realloc(s->list_id, (size_t)lists * sizeof *li);
    if (!li) return RA_ENOMEM;
    s->list_id = li;
    float *ls = realloc(s->list_score, (size_t)lists * sizeof *ls);
    if (!ls) return RA_ENOMEM;
    s->list_score = ls;
    s->list_cap = lists;
  }
  return RA_OK;
}

/* What a search with beam ef and k results needs from a scratch. */
static int scratch_fit(ra_index_scratch *s, const ra_index *ix, uint32_t ef, uint32_t k) {
  uint32_t pool = ef > k ? ef : k, buf = 0, lists = 0;
  if (ix->graph) buf = ix->graph->M;
  if (ix->ivf) buf = lists = ix->ivf->n_lists;
  return ra_index_scratch_reserve(s, ix->n, pool + 1, buf, lists);
}

int ra_index_scratch_init(ra_index_scratch *s, const ra_index *ix, uint32_t max_ef, uint32_t max_k,
                          ra_error *err) {
  memset(s, 0, sizeof *s);
  if (!ix) return ra_errorf(err, RA_EINVAL, "index scratch: index is NULL");
  if (scratch_fit(s, ix, max_ef, max_k)) {
    ra_index_scratch_free(s);
    return ra_errorf(err, RA_ENOMEM, "index scratch: out of memory (%u keys, ef %u)", ix->n,
                     max_ef);
  }
  return RA_OK;
}

void ra_index_scratch_free(ra_index_scratch *s) {
  free(s->visited);
  free(s->pool_id);
  free(s->pool_score);
  free(s->nbr_id);
  free(s->nbr_score);
  free(s->list_id);
  free(s->list_score);
  memset(s, 0, sizeof *s);
}

void ra_index_free(ra_index *ix) {
  if (!ix) return;
  ra_ivf_free(ix->ivf);
  if (ix->graph) {
    ra_graph_free(ix->graph);
    free(ix->graph);
  }
  ra_roar_keep_free(ix->keep);
  if (ix->ins_work) {
    ra_graph_work_free(ix->ins_work);
    free(ix->ins_work);
  }
  free(ix);
}

/* BLAS runs single-threaded: the index's parallelism is OpenMP's (knn.c splits the sgemm by
 * query blocks), and a store runs several builds at once; OpenBLAS's own thread pool would
 * oversubscribe the cores and serializes concurrent callers on its lock. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

int ra_index_build(const ra_index_params *p, const ra_keys *keys, const ra_queries *queries,
                   ra_index **out, ra_error *err) {
  int rc;
  pthread_once(&blas_once, blas_single_thread);
  if (!out) return ra_errorf(err, RA_EINVAL, "index build: out is NULL");
  *out = NULL;
  if ((rc = check_params(p, err)) || (rc = check_keys(keys, err))) return rc;
  if (p->kind == RA_MODE_ROAR && queries && queries->q == NULL && queries->knn == NULL)
    return ra_errorf(err, RA_EINVAL, "roar: queries has neither vectors nor knn lists");
  ra_index *ix = calloc(1, sizeof *ix);
  if (!ix) return ra_errorf(err, RA_ENOMEM, "index build: out of memory");
  ix->kind = p->kind;
  ix->params = *p;
  ix->dim = keys->dim;
  ix->dtype = keys->dtype;
  ix->n = keys->n;
  switch (p->kind) {
    case RA_MODE_FLAT: rc = RA_OK; break;
    case RA_MODE_IVF: rc = ra_ivf_build(ix, keys, err); break;
    case RA_MODE_KGRAPH: rc = ra_kgraph_build(ix, keys, err); break;
    case RA_MODE_ROAR:
      if (keys->n <= 1 && (!queries || queries->n == 0)) {
        /* Nothing to learn from: an empty or single-key graph needs no queries. */
        ra_graph *g = calloc(1, sizeof *g);
        rc = g && ra_graph_init(g, p->degree, keys->n, keys->n) == RA_OK ? RA_OK : RA_ENOMEM;
        if (rc) {
          free(g);
          ra_errorf(err, rc, "roar: out of memory");
        } else {
          ix->graph = g;
        }
      } else {
        rc = ra_roar_build(ix, keys, queries, err);
      }
      break;
    default: rc = ra_errorf(err, RA_EINVAL, "index: unknown kind %d", (int)p->kind); break;
  }
  if (!rc && ix->graph) {
    ix->ins_work = calloc(1, sizeof *ix->ins_work);
    if (!ix->ins_work || ra_graph_work_init(ix->ins_work, ix->dim, p->degree)) {
      free(ix->ins_work);
      ix->ins_work = NULL;
      rc = ra_errorf(err, RA_ENOMEM, "index build: out of memory");
    }
  }
  if (rc) {
    ra_index_free(ix);
    return rc;
  }
  *out = ix;
  return RA_OK;
}

static int check_view(const ra_index *ix, const ra_keys *keys, uint32_t need, ra_error *err) {
  int rc = check_keys(keys, err);
  if (rc) return rc;
  if (keys->dim != ix->dim || keys->dtype != ix->dtype)
    return ra_errorf(err, RA_EINVAL, "index: keys are %s x %d, index is %s x %d",
                     ra_dtype_name(keys->dtype), keys->dim, ra_dtype_name(ix->dtype), ix->dim);
  if (keys->n < need)
    return ra_errorf(err, RA_EINVAL, "index: view has %u keys, index needs %u", keys->n, need);
  return RA_OK;
}

int ra_index_insert(ra_index *ix, const ra_keys *keys, uint32_t id, ra_error *err) {
  if (!ix) return ra_errorf(err, RA_EINVAL, "index insert: index is NULL");
  int rc = check_view(ix, keys, id + 1u, err);
  if (rc) return rc;
  if (id != ix->n)
    return ra_errorf(err, RA_EINVAL, "index insert: id %u, expected the next id %u", id, ix->n);
  if (id >= MAX_KEYS) return ra_errorf(err, RA_EINVAL, "index insert: index is full");
  switch (ix->kind) {
    case RA_MODE_FLAT: break;
    case RA_MODE_IVF:
      if ((rc = ra_ivf_insert(ix, keys, id, err))) return rc;
      break;
    case RA_MODE_KGRAPH:
    case RA_MODE_ROAR: {
      ra_graph *g = ix->graph;
      uint32_t L = ix->params.build_ef;
      if (id >= g->cap) {
        uint64_t cap = (uint64_t)g->cap + g->cap / 2 + 64;
        if (cap > MAX_KEYS) cap = MAX_KEYS;
        if (ra_graph_reserve(g, (uint32_t)cap))
          return ra_errorf(err, RA_ENOMEM, "index insert: out of memory growing the graph");
      }
      uint32_t guide = ix->keep ? ra_roar_keep_guide_max(ix->keep) : 0;
      if (ra_graph_work_reserve(ix->ins_work, g->M + L + 1 + guide, id + 1, L) ||
          (g->qm && !ix->ins_work->mc_n && ra_graph_work_cache(ix->ins_work, INS_MAP_CACHE)))
        return ra_errorf(err, RA_ENOMEM, "index insert: out of memory");
      if (ix->kind == RA_MODE_ROAR)
        ra_roar_insert(ix, keys, id);
      else
        ra_graph_insert(g, keys, id, L, NULL, ix->ins_work);
      break;
    }
    default: return ra_errorf(err, RA_EINTERNAL, "index insert: unknown kind %d", (int)ix->kind);
  }
  ix->n = id + 1;
  return RA_OK;
}

int ra_index_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                    const ra_search_params *sp, ra_index_scratch *s, uint32_t *ids_out,
                    float *scores_out, uint32_t *n_out, uint64_t *n_scanned) {
  if (n_out) *n_out = 0;
  if (n_scanned) *n_scanned = 0;
  if (!ix || !q || !s || !n_out || (k && !ids_out) || check_view(ix, keys, ix->n, NULL))
    return RA_EINVAL;
  if (k == 0 || ix->n == 0) return RA_OK;
  ra_search_params def;
  if (!sp) {
    ra_search_params_default(ix->kind, &def);
    sp = &def;
  }
  uint32_t ef = sp->ef > k ? sp->ef : k;
  if (ix->kind == RA_MODE_FLAT || ix->kind == RA_MODE_IVF) ef = k;
  if (scratch_fit(s, ix, ef, k)) return RA_ENOMEM;
  switch (ix->kind) {
    case RA_MODE_FLAT:
      return ra_flat_search(ix, keys, q, k, s, ids_out, scores_out, n_out, n_scanned);
    case RA_MODE_IVF:
      return ra_ivf_search(ix, keys, q, k, sp->nprobe, s, ids_out, scores_out, n_out, n_scanned);
    case RA_MODE_KGRAPH:
    case RA_MODE_ROAR:
      /* A beam of a quarter of the keys computes nearly every dot anyway (each expansion looks
       * at M neighbors): the exact scan is then cheaper and exact (k = 2000 over a few thousand
       * offloaded keys). */
      if ((uint64_t)ef * 4 >= ix->n)
        return ra_flat_search(ix, keys, q, k, s, ids_out, scores_out, n_out, n_scanned);
      ra_graph_search(ix->graph, keys, q, ef, k, s, ids_out, scores_out, n_out, n_scanned);
      return RA_OK;
    default: break;
  }
  return RA_EINVAL;
}

uint32_t ra_index_count(const ra_index *ix) { return ix ? ix->n : 0; }
ra_mode ra_index_get_kind(const ra_index *ix) { return ix->kind; }

size_t ra_index_bytes(const ra_index *ix) {
  if (!ix) return 0;
  size_t b = sizeof *ix;
  if (ix->ivf) b += ra_ivf_bytes(ix->ivf, ix->dim);
  if (ix->graph) b += ra_graph_bytes(ix->graph);
  b += ra_roar_keep_bytes(ix->keep);
  if (ix->ins_work) {
    const ra_graph_work *w = ix->ins_work;
    b += sizeof *w + (size_t)w->dim * 8 + (size_t)w->M * (4 + 4 * (size_t)w->dim) +
         (size_t)w->cand_cap * 16 +
         (size_t)w->res_cap * 8 + (size_t)w->mark_cap * 4 + (size_t)w->sc.visited_cap * 4 +
         (size_t)w->sc.pool_cap * 8 + (size_t)w->sc.buf_cap * 8 + ra_graph_work_cache_bytes(w);
  }
  return b;
}

int ra_index_check(const ra_index *ix, ra_error *err) {
  if (!ix) return ra_errorf(err, RA_EINVAL, "index check: index is NULL");
  if (ix->graph) {
    if (ix->graph->n != ix->n)
      return ra_errorf(err, RA_EINTERNAL, "index: graph has %u nodes, index %u keys",
                       ix->graph->n, ix->n);
    return ra_graph_check(ix->graph, err);
  }
  if (ix->ivf) return ra_ivf_check(ix, err);
  return RA_OK;
}

void ra_index_get_graph_stats(const ra_index *ix, ra_index_graph_stats *st) {
  memset(st, 0, sizeof *st);
  if (!ix || !ix->graph) return;
  const ra_graph *g = ix->graph;
  uint64_t sum = 0;
  for (uint32_t u = 0; u < g->n; u++) {
    sum += g->deg[u];
    if (g->deg[u] > st->max_degree) st->max_degree = g->deg[u];
  }
  st->entry = g->entry;
  st->mean_degree = g->n ? (double)sum / g->n : 0.0;
  st->n_pivots = ix->n_pivots;
  st->n_repaired = g->n_repaired;
}
