/* index-bench: recall versus keys scanned for flat / ivf / kgraph / roar on a Q/K dump.
 *
 * For each (layer, query head): the indexed keys are the kv head's keys minus the sink (first
 * 128) and the GPU window (last 512), as the system offloads them. Indexes are built from the
 * earlier prefill queries; evaluation uses held-out queries: the last --eval prefill queries
 * (not used for building) plus the decode queries when the dump has them. Reported per head, for a
 * sweep of L_search (graphs) / nprobe (ivf): recall@100 and recall@2000 against the exact top-k
 * and the fraction of indexed keys whose dot product was computed; the same for keys as queries
 * (K->K, the in-distribution case); build time; bytes of index per key. Variants:
 *   roar     one graph per query head, from that head's prefill queries (the paper's layout);
 *   roar-kv  one graph per kv head from all its query heads' queries (G x less graph memory);
 *   roar-ins roar built on the first (1 - f) of the indexed keys, the last f inserted one by one
 *            (--insert-frac f, default 0.1): online insertion against a full rebuild.
 * roar's build queries: by default the build samples them (--sample) and computes their lists
 * itself; with --lists the bench samples them and computes their top-Nq lists as the worker's
 * GPU step does (outside the build's time, printed apart), and with --key-queries T also each
 * key's top-T queries (ra_queries.key_top_queries), which replace the build's beam-search
 * repair. Build times are wall and CPU seconds of the whole process (build_s, build_cpu_s).
 * Output: --json FILE, a gnuplot script and data next to it, and the PNG when gnuplot exists, all
 * rewritten after each head, so a run cut short keeps what it finished. */
#include "clock.h"
#include "hugemem.h"
#include "index.h"
#include "knn.h"
#include "npy.h"
#include "qkdump.h"
#include "vec.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SINK 128u
#define WINDOW 512u
#define MAX_LIST 256

enum { K_FLAT, K_IVF, K_KGRAPH, K_ROAR, K_ROARKV, K_ROARINS, N_KINDS };
static const char *const kind_names[N_KINDS] = {"flat", "ivf", "kgraph", "roar", "roar-kv",
                                                "roar-ins"};

/* Curves: Q->K recall@100, Q->K recall@2000, K->K recall@100. */
enum { C_Q100, C_Q2000, C_K100, N_CURVES };
static const char *const curve_names[N_CURVES] = {"q2k_at100", "q2k_at2000", "k2k_at100"};

static const uint32_t graph_ef_small[] = {100, 128, 160, 200, 256, 320, 400, 512, 640, 800, 1024, 1536, 2048};
static const uint32_t graph_ef_large[] = {2000, 2500, 3000, 4000, 6000, 8000};
static const uint32_t ivf_probes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};
#define MAX_POINTS 20
#define MAX_GROUP 64 /* q heads per kv head */

typedef struct {
  uint32_t n;
  uint32_t param[MAX_POINTS];
  double recall[MAX_POINTS], scanned[MAX_POINTS]; /* means over queries; scanned as a fraction */
} curve;

typedef struct {
  int present;
  double build_s, build_cpu_s, lists_s;
  size_t bytes;
  double bytes_per_key;
  curve c[N_CURVES];
  double lat_p50_us, lat_p99_us, lat_cold_p50_us, lat_scanned, lat_recall;
  uint32_t lat_ef;
  ra_index_graph_stats gs;
  /* roar-ins: keys inserted, wall us per insertion, and the inserting thread's CPU us per
   * insertion (median and mean over the insertions): what a store pays per graph per row. */
  uint32_t ins_n;
  double ins_wall_us, ins_cpu_us_median, ins_cpu_us_mean;
  /* roar-kv with --group-overlap: keys the group's q heads' walks at ef overlap_ef score per
   * held-out position, summed over the heads and as a union (what one joint walk would fetch) */
  uint32_t overlap_ef;
  double overlap_sum, overlap_union;
} result;

typedef struct {
  int layer, qhead, kvhead;
  uint32_t n_keys, n_build, n_eval;
  result r[N_KINDS];
} head_result;

typedef struct {
  const char *qk, *json;
  int layers[MAX_LIST], n_layers, heads[MAX_LIST], n_heads;
  int kinds[N_KINDS];
  uint32_t n_eval, n_kk, lat_ef, overlap_ef;
  int threads, latency, small_pages;
  float insert_frac;
  int M, nq, build_ef, n_lists, pivots;
  int keep_queries, keep_topk; /* -1: the library's default */
  float sample;
  int lists;       /* the bench computes the build queries' lists, as the GPU does */
  int key_queries; /* t > 0: and each key's top-t queries (ra_queries.key_top_queries) */
  int key_rank_raw; /* rank a key's queries by raw q·k instead of the margin */
} opts;

static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  while (*s && n < max) {
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (end == s) return -1;
    if (*end == '-') {
      s = end + 1;
      b = strtol(s, &end, 10);
      if (end == s) return -1;
    }
    for (long v = a; v <= b && n < max; v++) out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

static void usage(void) {
  fprintf(stderr,
          "usage: index-bench --qk DIR --json FILE [--layers 0,2-4] [--heads 0-8]\n"
          "  [--kinds flat,ivf,kgraph,roar,roar-kv,roar-ins] [--eval N (200)] [--kk N (200)]\n"
          "  [--threads N] [--latency] [--latency-ef L (default: smallest ef reaching recall 0.95)]\n"
          "  [--insert-frac F (0.1)] [--M M] [--nq NQ] [--build-ef L] [--sample F] [--n-lists N]\n"
          "  [--pivots P] [--keep-queries N] [--keep-topk T]\n"
          "  [--lists] [--key-queries T] [--key-rank margin|raw] [--small-pages] [--group-overlap EF]\n"
          "--lists: the bench samples the build queries and computes their top-Nq lists (as the\n"
          "  GPU does; roar and roar-ins), outside the build's time. --key-queries T: also each\n"
          "  key's top-T sampled queries (by margin over the query's Nq-th score, or raw q.k),\n"
          "  the build's key -> query lists. --small-pages: the keys on 4 KiB pages (a store puts\n"
          "  them on huge pages). --group-overlap EF: roar-kv, the keys the kv group's q heads'\n"
          "  walks at ef EF score at the same positions, summed and as a union.\n");
}

static int parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->n_eval = 200;
  o->n_kk = 200;
  o->insert_frac = 0.1f;
  o->n_layers = o->n_heads = -1;
  o->keep_queries = o->keep_topk = -1;
  for (int k = 0; k < N_KINDS; k++) o->kinds[k] = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--latency")) {
      o->latency = 1;
      continue;
    }
    if (!strcmp(a, "--lists")) {
      o->lists = 1;
      continue;
    }
    if (!strcmp(a, "--small-pages")) {
      o->small_pages = 1;
      continue;
    }
    if (!v) return -1;
    i++;
    if (!strcmp(a, "--qk")) o->qk = v;
    else if (!strcmp(a, "--json")) o->json = v;
    else if (!strcmp(a, "--layers")) { if ((o->n_layers = parse_list(v, o->layers, MAX_LIST)) <= 0) return -1; }
    else if (!strcmp(a, "--heads")) { if ((o->n_heads = parse_list(v, o->heads, MAX_LIST)) <= 0) return -1; }
    else if (!strcmp(a, "--eval")) o->n_eval = (uint32_t)atoi(v);
    else if (!strcmp(a, "--kk")) o->n_kk = (uint32_t)atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--latency-ef")) o->lat_ef = (uint32_t)atoi(v);
    else if (!strcmp(a, "--group-overlap")) { if ((o->overlap_ef = (uint32_t)atoi(v)) == 0) return -1; }
    else if (!strcmp(a, "--insert-frac")) o->insert_frac = (float)atof(v);
    else if (!strcmp(a, "--M")) o->M = atoi(v);
    else if (!strcmp(a, "--nq")) o->nq = atoi(v);
    else if (!strcmp(a, "--build-ef")) o->build_ef = atoi(v);
    else if (!strcmp(a, "--sample")) o->sample = (float)atof(v);
    else if (!strcmp(a, "--n-lists")) o->n_lists = atoi(v);
    else if (!strcmp(a, "--pivots")) o->pivots = atoi(v);
    else if (!strcmp(a, "--keep-queries")) o->keep_queries = atoi(v);
    else if (!strcmp(a, "--keep-topk")) o->keep_topk = atoi(v);
    else if (!strcmp(a, "--key-queries")) o->key_queries = atoi(v);
    else if (!strcmp(a, "--key-rank")) {
      if (strcmp(v, "margin") && strcmp(v, "raw")) return -1;
      o->key_rank_raw = !strcmp(v, "raw");
    }
    else if (!strcmp(a, "--kinds")) {
      for (int k = 0; k < N_KINDS; k++) o->kinds[k] = 0;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int found = 0;
        for (int k = 0; k < N_KINDS; k++)
          if (!strcmp(t, kind_names[k])) o->kinds[k] = found = 1;
        if (!found) return -1;
      }
    } else return -1;
  }
  if (!o->qk || !o->json || o->n_eval == 0 || o->insert_frac <= 0 || o->insert_frac >= 1 ||
      o->key_queries < 0 || o->key_queries > 1024)
    return -1;
  if (o->key_queries) o->lists = 1;
  return 0;
}

/* An .npy as fp32 rows. */
static float *load_f32(const char *path, uint32_t rows_min, int dim, uint32_t *rows) {
  ra_npy a;
  ra_error err;
  if (ra_npy_read_f32(path, &a, &err)) {
    fprintf(stderr, "index-bench: %s\n", err.msg);
    return NULL;
  }
  if (a.cols != (uint64_t)dim || a.rows < rows_min || a.rows > 0xffffffffu) {
    fprintf(stderr, "index-bench: %s: shape (%llu, %llu), expected (>= %u, %d)\n", path,
            (unsigned long long)a.rows, (unsigned long long)a.cols, rows_min, dim);
    ra_npy_free(&a);
    return NULL;
  }
  *rows = (uint32_t)a.rows;
  return a.data;
}

/* A dump's keys keep their stored dtype, as the store would hold them. */
static int load_keys(const char *path, int dim, uint32_t rows_min, ra_npy *a) {
  ra_error err;
  if (ra_npy_read(path, a, &err)) {
    fprintf(stderr, "index-bench: %s\n", err.msg);
    return -1;
  }
  if (a->cols != (uint64_t)dim || a->rows < rows_min) {
    fprintf(stderr, "index-bench: %s: shape (%llu, %llu)\n", path, (unsigned long long)a->rows,
            (unsigned long long)a->cols);
    ra_npy_free(a);
    return -1;
  }
  return 0;
}

typedef struct {
  const float *q; /* [nq, dim] */
  uint32_t nq;
  const uint32_t *gt; /* [nq, gt_k] exact ids */
  uint32_t gt_k;
} qset;

/* One sweep point: mean recall@k and scanned fraction of qs, searches parallel over queries. */
static void eval_point(const ra_index *ix, const ra_keys *keys, const qset *qs, uint32_t k,
                       const ra_search_params *sp, int threads, double *recall, double *scanned) {
  double rs = 0, ss = 0;
  uint32_t n_idx = ra_index_count(ix);
#pragma omp parallel num_threads(threads) reduction(+ : rs, ss)
  {
    ra_index_scratch s;
    uint32_t *ids = malloc((size_t)k * sizeof *ids);
    uint8_t *in = calloc(n_idx, 1);
    int ok = ids && in && ra_index_scratch_init(&s, ix, sp->ef, k, NULL) == RA_OK;
#pragma omp for schedule(dynamic, 4)
    for (uint32_t i = 0; i < qs->nq; i++) {
      if (!ok) continue;
      uint32_t n = 0;
      uint64_t sc = 0;
      if (ra_index_search(ix, keys, qs->q + (size_t)i * keys->dim, k, sp, &s, ids, NULL, &n, &sc))
        continue;
      for (uint32_t j = 0; j < n; j++) in[ids[j]] = 1;
      uint32_t hit = 0;
      for (uint32_t j = 0; j < k; j++) hit += in[qs->gt[(size_t)i * qs->gt_k + j]];
      for (uint32_t j = 0; j < n; j++) in[ids[j]] = 0;
      rs += (double)hit / k;
      ss += (double)sc / n_idx;
    }
    if (ok) ra_index_scratch_free(&s);
    free(ids);
    free(in);
  }
  *recall = rs / qs->nq;
  *scanned = ss / qs->nq;
}

static void sweep(const ra_index *ix, ra_mode kind, const ra_keys *keys, const qset *qs,
                  uint32_t k, int threads, curve *c) {
  memset(c, 0, sizeof *c);
  const uint32_t *list;
  uint32_t n;
  if (kind == RA_MODE_FLAT) {
    static const uint32_t one[] = {0};
    list = one;
    n = 1;
  } else if (kind == RA_MODE_IVF) {
    list = ivf_probes;
    n = sizeof ivf_probes / sizeof *ivf_probes;
  } else if (k > 1000) {
    list = graph_ef_large;
    n = sizeof graph_ef_large / sizeof *graph_ef_large;
  } else {
    list = graph_ef_small;
    n = sizeof graph_ef_small / sizeof *graph_ef_small;
  }
  for (uint32_t i = 0; i < n && c->n < MAX_POINTS; i++) {
    ra_search_params sp = {.ef = list[i], .nprobe = list[i]};
    eval_point(ix, keys, qs, k, &sp, threads, &c->recall[c->n], &c->scanned[c->n]);
    c->param[c->n++] = list[i];
    if (c->recall[c->n - 1] >= 0.9999 || c->scanned[c->n - 1] >= 0.999) break;
  }
}

/* Scanned fraction needed for recall R, interpolated along the sweep; -1 if never reached. */
static double scan_at(const curve *c, double R) {
  for (uint32_t i = 0; i < c->n; i++)
    if (c->recall[i] >= R) {
      if (i == 0) return c->scanned[0];
      double t = (R - c->recall[i - 1]) / (c->recall[i] - c->recall[i - 1]);
      return c->scanned[i - 1] + t * (c->scanned[i] - c->scanned[i - 1]);
    }
  return -1;
}

/* Recall at scanned fraction S, interpolated; -1 if the sweep starts above S. */
static double recall_at(const curve *c, double S) {
  if (c->n == 0 || S < c->scanned[0]) return -1;
  for (uint32_t i = 1; i < c->n; i++)
    if (c->scanned[i] >= S) {
      double t = (S - c->scanned[i - 1]) / (c->scanned[i] - c->scanned[i - 1]);
      return c->recall[i - 1] + t * (c->recall[i] - c->recall[i - 1]);
    }
  return c->recall[c->n - 1];
}

static void params_for(const opts *o, ra_mode kind, ra_index_params *p) {
  ra_index_params_default(kind, p);
  p->n_threads = o->threads;
  if (o->M) p->degree = (uint32_t)o->M;
  if (o->nq) p->knn_nq = (uint32_t)o->nq;
  if (o->build_ef) p->build_ef = (uint32_t)o->build_ef;
  if (o->sample > 0) p->query_sample = o->sample;
  if (o->n_lists) p->n_lists = (uint32_t)o->n_lists;
  if (o->pivots) p->pivots = (uint32_t)o->pivots;
  if (o->keep_queries >= 0) p->keep_queries = (uint32_t)o->keep_queries;
  if (o->keep_topk >= 0) p->keep_topk = (uint32_t)o->keep_topk;
}

static ra_index *build_timed(const ra_index_params *p, const ra_keys *keys, const ra_queries *qs,
                             result *r) {
  ra_index *ix = NULL;
  ra_error err;
  double t0 = ra_clock_now_s(), c0 = ra_clock_process_cpu_s();
  if (ra_index_build(p, keys, qs, &ix, &err)) {
    fprintf(stderr, "index-bench: build %s: %s\n", ra_mode_name(p->kind), err.msg);
    return NULL;
  }
  r->build_s = ra_clock_now_s() - t0;
  r->build_cpu_s = ra_clock_process_cpu_s() - c0;
  r->bytes = ra_index_bytes(ix);
  r->bytes_per_key = (double)r->bytes / (keys->n ? keys->n : 1);
  ra_index_get_graph_stats(ix, &r->gs);
  return ix;
}

/* The build queries' lists as the worker's GPU step computes them: the sampled queries (seeded,
 * ascending) of q [n_q, dim], their exact top-nq keys over k32 [n_keys, dim], and with key_t > 0
 * each key's top-key_t sampled queries: by the margin q_j·k - s_j (s_j: query j's nq-th score)
 * or raw q_j·k. Fills bq (query_sample 1 then: the sample is taken here); *secs = wall time. */
typedef struct {
  float *q;
  uint32_t *knn, *ktq;
} bench_lists;

static void bench_lists_free(bench_lists *b) {
  free(b->q);
  free(b->knn);
  free(b->ktq);
  memset(b, 0, sizeof *b);
}

static int bench_lists_make(const float *k32, uint32_t n_keys, int dim, const float *q,
                            uint32_t n_q, float sample, uint32_t nq, uint32_t key_t, int raw,
                            int threads, bench_lists *b, ra_queries *bq, double *secs) {
  memset(b, 0, sizeof *b);
  double t0 = ra_clock_now_s();
  uint32_t m = (uint32_t)lround((double)sample * n_q);
  if (m < 1) m = 1;
  if (m > n_q) m = n_q;
  if (nq > n_keys) nq = n_keys;
  uint32_t *idx = malloc((size_t)n_q * sizeof *idx);
  uint8_t *take = calloc(n_q, 1);
  float *sc = malloc((size_t)m * nq * sizeof *sc), *bias = malloc((size_t)m * sizeof *bias);
  b->q = malloc((size_t)m * dim * sizeof *b->q);
  b->knn = malloc((size_t)m * nq * sizeof *b->knn);
  b->ktq = key_t ? malloc((size_t)n_keys * key_t * sizeof *b->ktq) : NULL;
  ra_error err;
  int rc = -1;
  if (!idx || !take || !sc || !bias || !b->q || !b->knn || (key_t && !b->ktq)) goto out;
  uint64_t rng = 0x5EEDF00Dull;
  for (uint32_t i = 0; i < n_q; i++) idx[i] = i;
  for (uint32_t i = 0; i < m; i++) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint32_t j = i + (uint32_t)(((z >> 32) * (uint64_t)(n_q - i)) >> 32);
    uint32_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
    take[idx[i]] = 1;
  }
  for (uint32_t i = 0, c = 0; i < n_q; i++)
    if (take[i]) memcpy(b->q + (size_t)c++ * dim, q + (size_t)i * dim, (size_t)dim * sizeof *b->q);
  if (ra_knn_ip(k32, n_keys, dim, NULL, b->q, m, nq, 0, threads, b->knn, sc, &err)) goto fail;
  if (key_t) {
    /* Keys as the queries of a search over the sampled queries, each biased by -s_j. */
    for (uint32_t j = 0; j < m; j++) bias[j] = raw ? 0.0f : -sc[(size_t)j * nq + nq - 1];
    uint32_t kt = key_t < m ? key_t : m;
    if (ra_knn_ip(b->q, m, dim, bias, k32, n_keys, kt, 0, threads, b->ktq, NULL, &err)) goto fail;
    if (kt < key_t) { /* fewer queries than T: repack rows, pad with "none" */
      for (uint32_t u = n_keys; u-- > 0;)
        for (uint32_t r = key_t; r-- > 0;)
          b->ktq[(size_t)u * key_t + r] = r < kt ? b->ktq[(size_t)u * kt + r] : RA_INDEX_NO_QUERY;
    }
  }
  *bq = (ra_queries){.q = b->q, .n = m, .knn = b->knn, .knn_k = nq,
                     .key_top_queries = b->ktq, .key_top_k = key_t};
  *secs = ra_clock_now_s() - t0;
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "index-bench: lists: %s\n", err.msg);
out:
  if (rc) bench_lists_free(b);
  free(idx);
  free(take);
  free(sc);
  free(bias);
  return rc;
}

/* Head h's held-out queries [*n_ev, D]: the last n_eval prefill queries of its q [N, D], then
 * its decode queries when the dump has them. NULL on a read or memory failure. */
static float *eval_queries(const opts *o, const ra_qk_meta *m, int L, int h, const float *q, uint32_t n_build,
                           uint32_t *n_ev) {
  const int D = m->head_dim;
  uint32_t drows = 0;
  float *qdec = NULL;
  char path[4200];
  if (m->n_decode) {
    ra_qk_path(path, sizeof path, o->qk, "qdec", L, h);
    if (!(qdec = load_f32(path, 1, D, &drows))) return NULL;
  }
  *n_ev = o->n_eval + drows;
  float *evq = malloc((size_t)*n_ev * D * sizeof *evq);
  if (evq) {
    memcpy(evq, q + (size_t)n_build * D, (size_t)o->n_eval * D * sizeof *evq);
    if (drows) memcpy(evq + (size_t)o->n_eval * D, qdec, (size_t)drows * D * sizeof *evq);
  }
  free(qdec);
  return evq;
}

/* How much of their work the G q heads of kv group g share on its graph ix: at each held-out
 * position, each head's walk at ef (k 100) marks the keys it scores; r gets their count summed
 * over the heads and the size of their union, per position (means). A walk per kv head that
 * scored every fetched key for all G queries would fetch the union once; separate walks fetch
 * the sum. */
static int group_overlap(const opts *o, const ra_qk_meta *m, int L, int g, const ra_index *ix,
                         const ra_keys *keys, uint32_t n_build, uint32_t ef, int threads, result *r) {
  const int D = m->head_dim, G = m->q_heads / m->kv_heads;
  const uint32_t n = ra_index_count(ix), k = ef < 100 ? ef : 100;
  float *evq[MAX_GROUP];
  uint32_t n_ev = 0;
  int rc = 0;
  if (G > MAX_GROUP) return -1;
  for (int j = 0; j < G; j++) {
    char path[4200];
    uint32_t rows;
    ra_qk_path(path, sizeof path, o->qk, "q", L, g * G + j);
    float *q = load_f32(path, m->n_tokens, D, &rows);
    evq[j] = q ? eval_queries(o, m, L, g * G + j, q, n_build, &n_ev) : NULL;
    free(q);
    if (!evq[j]) rc = -1;
  }
  double sum = 0, uni = 0;
  ra_search_params sp = {.ef = ef};
#pragma omp parallel num_threads(threads) reduction(+ : sum, uni) if (rc == 0)
  {
    ra_index_scratch s;
    uint32_t *ids = malloc((size_t)k * sizeof *ids), *in = calloc(n, sizeof *in);
    int ok = rc == 0 && ids && in && ra_index_scratch_init(&s, ix, ef, k, NULL) == RA_OK;
#pragma omp for schedule(dynamic, 4)
    for (uint32_t i = 0; i < n_ev; i++) {
      for (int j = 0; ok && j < G; j++) {
        uint32_t got = 0;
        uint64_t sc = 0;
        if (ra_index_search(ix, keys, evq[j] + (size_t)i * D, k, &sp, &s, ids, NULL, &got, &sc)) continue;
        sum += (double)sc;
        /* the scored keys are the ones the walk marked visited in this search's epoch */
        for (uint32_t v = 0; v < n; v++)
          if (s.visited[v] == s.epoch && in[v] != i + 1) {
            in[v] = i + 1;
            uni += 1;
          }
      }
    }
    if (ok) ra_index_scratch_free(&s);
    free(ids);
    free(in);
  }
  for (int j = 0; j < G; j++) free(evq[j]);
  if (rc) return rc;
  r->overlap_ef = ef;
  r->overlap_sum = sum / n_ev;
  r->overlap_union = uni / n_ev;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One-core search latency of ix at ef over qs (each query 5 times, after a warm-up pass). */
static void measure_latency(const ra_index *ix, const ra_keys *keys, const qset *qs, uint32_t ef,
                            result *r) {
  enum { REPS = 5, K = 100 };
  ra_index_scratch s;
  uint32_t ids[K], n;
  ra_search_params sp = {.ef = ef, .nprobe = 0};
  size_t ns = (size_t)qs->nq * REPS;
  double *t = malloc(ns * sizeof *t);
  if (!t || ra_index_scratch_init(&s, ix, ef, K, NULL)) {
    free(t);
    return;
  }
  uint64_t scanned, total = 0;
  double rec = 0;
  for (uint32_t i = 0; i < qs->nq; i++) {
    ra_index_search(ix, keys, qs->q + (size_t)i * keys->dim, K, &sp, &s, ids, NULL, &n, &scanned);
    uint32_t hit = 0;
    for (uint32_t a = 0; a < n; a++)
      for (uint32_t b = 0; b < K; b++) hit += ids[a] == qs->gt[(size_t)i * qs->gt_k + b];
    rec += (double)hit / K;
    total += scanned;
  }
  for (size_t j = 0; j < ns; j++) {
    uint32_t i = (uint32_t)(j % qs->nq);
    double t0 = ra_clock_now_s();
    ra_index_search(ix, keys, qs->q + (size_t)i * keys->dim, K, &sp, &s, ids, NULL, &n, &scanned);
    t[j] = (ra_clock_now_s() - t0) * 1e6;
  }
  qsort(t, ns, sizeof *t, cmp_double);
  r->lat_p50_us = t[ns / 2];
  r->lat_p99_us = t[(size_t)((double)ns * 0.99)];
  /* Cold: as in a store, where a head's keys and graph were last touched a decode step ago and
   * gigabytes of other shards since: each search after reading a buffer well past the caches
   * (and the TLB's reach). */
  enum { EVICT_BYTES = 256 << 20 };
  volatile uint64_t *ev = malloc(EVICT_BYTES);
  if (ev) {
    for (size_t w = 0; w < EVICT_BYTES / 8; w++) ev[w] = w;
    uint32_t nc = qs->nq < 200 ? qs->nq : 200;
    for (uint32_t j = 0; j < nc; j++) {
      uint64_t sink = 0;
      for (size_t w = 0; w < EVICT_BYTES / 8; w += 8) sink += ev[w];
      ev[0] = sink;
      double t0 = ra_clock_now_s();
      ra_index_search(ix, keys, qs->q + (size_t)j * keys->dim, K, &sp, &s, ids, NULL, &n, &scanned);
      t[j] = (ra_clock_now_s() - t0) * 1e6;
    }
    qsort(t, nc, sizeof *t, cmp_double);
    r->lat_cold_p50_us = t[nc / 2];
    free((void *)ev);
  }
  r->lat_scanned = (double)total / qs->nq / ra_index_count(ix);
  r->lat_recall = rec / qs->nq;
  ra_index_scratch_free(&s);
  free(t);
}

static void print_curve_json(FILE *f, const curve *c) {
  fprintf(f, "{\"param\": [");
  for (uint32_t i = 0; i < c->n; i++) fprintf(f, "%s%u", i ? ", " : "", c->param[i]);
  fprintf(f, "], \"recall\": [");
  for (uint32_t i = 0; i < c->n; i++) fprintf(f, "%s%.4f", i ? ", " : "", c->recall[i]);
  fprintf(f, "], \"scanned_frac\": [");
  for (uint32_t i = 0; i < c->n; i++) fprintf(f, "%s%.5f", i ? ", " : "", c->scanned[i]);
  fprintf(f, "], \"scan_at_recall_0.95\": %.5f, \"recall_at_scan_0.01\": %.4f, "
             "\"recall_at_scan_0.03\": %.4f}",
          scan_at(c, 0.95), recall_at(c, 0.01), recall_at(c, 0.03));
}

static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n == 0 ? -1 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Scan needed for recall 0.95 with "never" as +inf, so medians and worsts rank it last. */
static double scan95(const curve *c) {
  double s = scan_at(c, 0.95);
  return s < 0 ? INFINITY : s;
}

static void write_json(const opts *o, const ra_qk_meta *m, head_result *hr, int n_heads,
                       const char *png_note) {
  FILE *f = fopen(o->json, "w");
  if (!f) {
    fprintf(stderr, "index-bench: cannot write %s\n", o->json);
    return;
  }
  ra_index_params pr;
  params_for(o, RA_MODE_ROAR, &pr);
  fprintf(f, "{\n  \"dump\": {\"dir\": \"%s\", \"model\": \"%s\", \"n_tokens\": %u, \"n_decode\": %u, "
             "\"head_dim\": %d, \"q_heads\": %d, \"kv_heads\": %d},\n",
          o->qk, m->model, m->n_tokens, m->n_decode, m->head_dim, m->q_heads, m->kv_heads);
  fprintf(f, "  \"setup\": {\"sink\": %u, \"window\": %u, \"eval_prefill_queries\": %u, "
             "\"kk_queries\": %u, \"threads\": %d, \"kernel\": \"%s\", \"insert_frac\": %.3f,\n"
             "    \"graph_params\": {\"degree\": %u, \"build_ef\": %u, \"knn_nq\": %u, "
             "\"query_sample\": %.3f, \"pivots\": %u, \"keep_queries\": %u, \"keep_topk\": %u}, "
             "\"latency_ef\": %u, \"bench_lists\": %d, \"key_queries\": %d, "
             "\"key_rank\": \"%s\"},\n",
          SINK, WINDOW, o->n_eval, o->n_kk, o->threads ? o->threads : omp_get_max_threads(),
          ra_vec_kernel_name(), (double)o->insert_frac, pr.degree, pr.build_ef, pr.knn_nq,
          (double)pr.query_sample, pr.pivots, pr.keep_queries, pr.keep_topk, o->lat_ef, o->lists,
          o->key_queries, o->key_rank_raw ? "raw" : "margin");
  /* Summary: per kind, median and worst head of the scan needed for recall@100 >= 0.95. */
  fprintf(f, "  \"summary\": {\n");
  int first = 1;
  double med_roar = -1, med_ivf = -1;
  for (int k = 0; k < N_KINDS; k++) {
    if (!o->kinds[k]) continue;
    double v[MAX_LIST * 16], r1[MAX_LIST * 16], r3[MAX_LIST * 16], k95[MAX_LIST * 16],
        ins[MAX_LIST * 16];
    int n = 0, worst = -1;
    for (int h = 0; h < n_heads; h++) {
      if (!hr[h].r[k].present) continue;
      v[n] = scan95(&hr[h].r[k].c[C_Q100]);
      r1[n] = recall_at(&hr[h].r[k].c[C_Q100], 0.01);
      r3[n] = recall_at(&hr[h].r[k].c[C_Q100], 0.03);
      k95[n] = scan95(&hr[h].r[k].c[C_K100]);
      ins[n] = hr[h].r[k].ins_cpu_us_median;
      if (worst < 0 || v[n] > scan95(&hr[worst].r[k].c[C_Q100])) worst = h;
      n++;
    }
    if (!n) continue;
    double med = median_of(v, n), mr1 = median_of(r1, n), mr3 = median_of(r3, n),
           mk = median_of(k95, n);
    if (k == K_ROAR) med_roar = med;
    if (k == K_IVF) med_ivf = med;
    fprintf(f, "%s    \"%s\": {\"heads\": %d, \"median_scan_for_recall100_0.95\": %.5f, "
               "\"worst_head\": \"L%d_H%d\", \"worst_scan_for_recall100_0.95\": %.5f, "
               "\"median_recall100_at_scan_0.01\": %.4f, \"median_recall100_at_scan_0.03\": %.4f, "
               "\"median_k2k_scan_for_recall100_0.95\": %.5f",
            first ? "" : ",\n", kind_names[k], n, isinf(med) ? -1.0 : med, hr[worst].layer,
            hr[worst].qhead, isinf(scan95(&hr[worst].r[k].c[C_Q100])) ? -1.0 : scan95(&hr[worst].r[k].c[C_Q100]),
            mr1, mr3, isinf(mk) ? -1.0 : mk);
    if (hr[worst].r[k].ins_n)
      fprintf(f, ", \"median_insert_cpu_us\": %.1f", median_of(ins, n));
    fprintf(f, "}");
    first = 0;
  }
  fprintf(f, "%s    \"ivf_over_roar_scan_at_recall100_0.95\": %.2f\n  },\n", first ? "" : ",\n",
          med_roar > 0 && med_ivf > 0 && !isinf(med_roar) && !isinf(med_ivf) ? med_ivf / med_roar : -1.0);
  fprintf(f, "  \"plot\": \"%s\",\n  \"heads\": [\n", png_note);
  for (int h = 0; h < n_heads; h++) {
    fprintf(f, "    {\"layer\": %d, \"qhead\": %d, \"kvhead\": %d, \"n_keys\": %u, \"n_build_queries\": %u, "
               "\"n_eval_queries\": %u, \"indexes\": {\n",
            hr[h].layer, hr[h].qhead, hr[h].kvhead, hr[h].n_keys, hr[h].n_build, hr[h].n_eval);
    int f1 = 1;
    for (int k = 0; k < N_KINDS; k++) {
      const result *r = &hr[h].r[k];
      if (!r->present) continue;
      fprintf(f, "%s      \"%s\": {\"build_s\": %.3f, \"build_cpu_s\": %.3f, \"lists_s\": %.3f, "
                 "\"bytes\": %zu, \"bytes_per_key\": %.1f, "
                 "\"mean_degree\": %.2f, \"n_pivots\": %u, \"n_repaired\": %u",
              f1 ? "" : ",\n", kind_names[k], r->build_s, r->build_cpu_s, r->lists_s, r->bytes,
              r->bytes_per_key, r->gs.mean_degree, r->gs.n_pivots, r->gs.n_repaired);
      if (r->ins_n)
        fprintf(f, ", \"inserted\": %u, \"insert_wall_us\": %.1f, \"insert_cpu_us_median\": %.1f, "
                   "\"insert_cpu_us_mean\": %.1f",
                r->ins_n, r->ins_wall_us, r->ins_cpu_us_median, r->ins_cpu_us_mean);
      if (r->lat_p50_us > 0)
        fprintf(f, ", \"latency_ef\": %u, \"latency_us_p50\": %.1f, \"latency_us_p99\": %.1f, "
                   "\"latency_cold_us_p50\": %.1f, \"latency_scanned_frac\": %.5f, "
                   "\"latency_recall100\": %.4f",
                r->lat_ef, r->lat_p50_us, r->lat_p99_us, r->lat_cold_p50_us, r->lat_scanned,
                r->lat_recall);
      if (r->overlap_ef)
        fprintf(f, ", \"group_overlap_ef\": %u, \"group_scored_sum\": %.1f, \"group_scored_union\": %.1f",
                r->overlap_ef, r->overlap_sum, r->overlap_union);
      for (int c = 0; c < N_CURVES; c++) {
        if (!r->c[c].n) continue;
        fprintf(f, ",\n        \"%s\": ", curve_names[c]);
        print_curve_json(f, &r->c[c]);
      }
      fprintf(f, "}");
      f1 = 0;
    }
    fprintf(f, "\n    }}%s\n", h + 1 < n_heads ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

/* Mean curve over heads (by sweep position; heads share the sweep lists) for the plot. */
static void write_plot(const opts *o, head_result *hr, int n_heads, char *note, size_t note_cap) {
  char base[4096], path[4200];
  snprintf(base, sizeof base, "%s", o->json);
  char *dot = strrchr(base, '.');
  if (dot && !strcmp(dot, ".json")) *dot = '\0';
  for (int c = 0; c < N_CURVES; c++) {
    snprintf(path, sizeof path, "%s-%s.dat", base, curve_names[c]);
    FILE *f = fopen(path, "w");
    if (!f) continue;
    for (int k = 0; k < N_KINDS; k++) {
      if (!o->kinds[k]) continue;
      fprintf(f, "# %s\n", kind_names[k]);
      for (uint32_t i = 0; i < MAX_POINTS; i++) {
        double rs = 0, ss = 0;
        int n = 0;
        uint32_t param = 0;
        for (int h = 0; h < n_heads; h++) {
          const curve *cv = &hr[h].r[k].c[c];
          if (!hr[h].r[k].present || i >= cv->n) continue;
          rs += cv->recall[i];
          ss += cv->scanned[i];
          param = cv->param[i];
          n++;
        }
        if (n == n_heads && n > 0) fprintf(f, "%u %.5f %.4f\n", param, 100.0 * ss / n, rs / n);
      }
      fprintf(f, "\n\n");
    }
    fclose(f);
  }
  snprintf(path, sizeof path, "%s.gp", base);
  FILE *g = fopen(path, "w");
  if (!g) {
    snprintf(note, note_cap, "not written: cannot create %s", path);
    return;
  }
  const char *slash = strrchr(base, '/');
  fprintf(g, "# index-bench plot: mean over heads of recall vs %% of indexed keys scanned.\n"
             "set terminal pngcairo size 1800,560 font ',10' noenhanced\nset output '%s.png'\n"
             "set multiplot layout 1,3 title '%s (mean over %d heads)'\n"
             "set logscale x\nset xlabel '%% of indexed keys scanned'\nset ylabel 'recall'\n"
             "set yrange [0:1.02]\nset grid\nset key bottom right\n",
          base, slash ? slash + 1 : base, n_heads);
  static const char *const titles[N_CURVES] = {"Q->K recall@100", "Q->K recall@2000",
                                               "K->K recall@100 (keys as queries)"};
  for (int c = 0; c < N_CURVES; c++) {
    fprintf(g, "set title '%s'\nplot ", titles[c]);
    int idx = 0, firstp = 1;
    for (int k = 0; k < N_KINDS; k++) {
      if (!o->kinds[k]) continue;
      fprintf(g, "%s'%s-%s.dat' index %d using 2:3 with linespoints title '%s'", firstp ? "" : ", ",
              base, curve_names[c], idx, kind_names[k]);
      idx++;
      firstp = 0;
    }
    fprintf(g, "\n");
  }
  fprintf(g, "unset multiplot\n");
  fclose(g);
  char cmd[8600];
  snprintf(cmd, sizeof cmd, "command -v gnuplot >/dev/null 2>&1 && gnuplot '%s'", path);
  if (system(cmd) == 0)
    snprintf(note, note_cap, "%s.png", base);
  else
    snprintf(note, note_cap, "not rendered (gnuplot missing or failed); script %s", path);
}

int main(int argc, char **argv) {
  opts o;
  if (parse_args(argc, argv, &o)) {
    usage();
    return 2;
  }
  ra_qk_meta m;
  ra_error err;
  if (ra_qk_meta_read(o.qk, &m, &err)) {
    fprintf(stderr, "index-bench: %s\n", err.msg);
    return 1;
  }
  const int D = m.head_dim, G = m.q_heads / m.kv_heads;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  if (m.n_tokens < SINK + WINDOW + 2 * o.n_eval + 100) {
    fprintf(stderr, "index-bench: %u tokens is too few (sink %u + window %u + eval)\n", m.n_tokens,
            SINK, WINDOW);
    return 1;
  }
  if (o.n_layers < 0) {
    o.n_layers = m.layers < MAX_LIST ? m.layers : MAX_LIST;
    for (int i = 0; i < o.n_layers; i++) o.layers[i] = i;
  }
  if (o.n_heads < 0) {
    o.n_heads = m.q_heads < MAX_LIST ? m.q_heads : MAX_LIST;
    for (int i = 0; i < o.n_heads; i++) o.heads[i] = i;
  }
  const uint32_t N = m.n_tokens, n_idx = N - SINK - WINDOW, n_build = N - o.n_eval;
  const uint32_t k_large = n_idx < 2000 ? n_idx : 2000;
  head_result *hr = calloc((size_t)o.n_layers * o.n_heads, sizeof *hr);
  if (!hr) return 1;
  int n_hr = 0;
  printf("index-bench: %s (%s), %u tokens, %u indexed keys per head, kernel %s, %d threads\n", o.qk,
         m.model, N, n_idx, ra_vec_kernel_name(), threads);

  for (int li = 0; li < o.n_layers; li++) {
    int L = o.layers[li];
    if (L < 0 || L >= m.layers) {
      fprintf(stderr, "index-bench: layer %d out of range\n", L);
      return 1;
    }
    int cur_g = -1;
    ra_npy kn = {0};
    char *krows = NULL; /* the indexed keys: kn's rows after the sink, copied (huge pages) */
    float *k32 = NULL, *group_q = NULL;
    ra_index *roar_kv = NULL;
    result roar_kv_res;
    memset(&roar_kv_res, 0, sizeof roar_kv_res);
    for (int hi = 0; hi < o.n_heads; hi++) {
      int h = o.heads[hi];
      if (h < 0 || h >= m.q_heads) {
        fprintf(stderr, "index-bench: head %d out of range\n", h);
        return 1;
      }
      int g = h / G;
      char path[4200];
      if (g != cur_g) {
        ra_npy_free(&kn);
        free(krows);
        krows = NULL;
        free(k32);
        ra_index_free(roar_kv);
        roar_kv = NULL;
        free(group_q);
        group_q = NULL;
        ra_qk_path(path, sizeof path, o.qk, "k", L, g);
        if (load_keys(path, D, N, &kn)) return 1;
        /* The indexed rows where a store keeps them: on huge pages (store.c), unless --small-pages. */
        const size_t kb = (size_t)n_idx * D * ra_dtype_size(kn.dtype);
        if (!(krows = aligned_alloc((size_t)2 << 20, (kb + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1))))
          return 1;
        if (!o.small_pages) (void)ra_mem_advise_huge(krows, kb);
        memcpy(krows, (const char *)kn.data + (size_t)SINK * D * ra_dtype_size(kn.dtype), kb);
        k32 = malloc((size_t)n_idx * D * sizeof *k32);
        if (!k32) return 1;
        ra_dtype_to_fp32_n(kn.dtype, (const char *)kn.data + (size_t)SINK * D * ra_dtype_size(kn.dtype),
                           k32, (size_t)n_idx * D);
        cur_g = g;
      }
      ra_keys keys = {.rows = krows, .dtype = kn.dtype, .dim = D, .n = n_idx};
      uint32_t rows, n_ev;
      ra_qk_path(path, sizeof path, o.qk, "q", L, h);
      float *q = load_f32(path, N, D, &rows);
      if (!q) return 1;
      float *evq = eval_queries(&o, &m, L, h, q, n_build, &n_ev);
      uint32_t *gt = malloc((size_t)n_ev * k_large * sizeof *gt);
      uint32_t n_kk = o.n_kk < n_idx ? o.n_kk : n_idx;
      float *kkq = malloc((size_t)(n_kk ? n_kk : 1) * D * sizeof *kkq);
      uint32_t *kkgt = malloc((size_t)(n_kk ? n_kk : 1) * 100 * sizeof *kkgt);
      if (!evq || !gt || !kkq || !kkgt) return 1;
      for (uint32_t i = 0; i < n_kk; i++)
        memcpy(kkq + (size_t)i * D, k32 + (size_t)((uint64_t)i * n_idx / n_kk) * D, (size_t)D * sizeof *kkq);
      if (ra_knn_ip(k32, n_idx, D, NULL, evq, n_ev, k_large, 0, threads, gt, NULL, &err) ||
          ra_knn_ip(k32, n_idx, D, NULL, kkq, n_kk, 100, 0, threads, kkgt, NULL, &err)) {
        fprintf(stderr, "index-bench: ground truth: %s\n", err.msg);
        return 1;
      }
      qset qs100 = {evq, n_ev, gt, k_large}, kks = {kkq, n_kk, kkgt, 100};
      head_result *H = &hr[n_hr++];
      H->layer = L;
      H->qhead = h;
      H->kvhead = g;
      H->n_keys = n_idx;
      H->n_build = n_build;
      H->n_eval = n_ev;
      ra_queries bq = {.q = q, .n = n_build};

      for (int k = 0; k < N_KINDS; k++) {
        if (!o.kinds[k]) continue;
        result *r = &H->r[k];
        ra_mode kind = k == K_FLAT ? RA_MODE_FLAT : k == K_IVF ? RA_MODE_IVF
                             : k == K_KGRAPH ? RA_MODE_KGRAPH : RA_MODE_ROAR;
        ra_index_params p;
        params_for(&o, kind, &p);
        ra_index *ix = NULL;
        if (k == K_ROARKV) {
          if (!roar_kv) {
            /* All of the group's query heads' build queries, present or not in --heads. */
            group_q = malloc((size_t)G * n_build * D * sizeof *group_q);
            if (!group_q) return 1;
            for (int j = 0; j < G; j++) {
              uint32_t rr;
              ra_qk_path(path, sizeof path, o.qk, "q", L, g * G + j);
              float *qj = load_f32(path, N, D, &rr);
              if (!qj) return 1;
              memcpy(group_q + (size_t)j * n_build * D, qj, (size_t)n_build * D * sizeof *qj);
              free(qj);
            }
            ra_queries gq = {.q = group_q, .n = (uint32_t)G * n_build};
            /* With --lists, the group's queries as one block, as the worker sends them. */
            bench_lists bl = {0};
            if (o.lists) {
              if (bench_lists_make(k32, n_idx, D, group_q, (uint32_t)G * n_build, p.query_sample,
                                   p.knn_nq, (uint32_t)o.key_queries, o.key_rank_raw, threads,
                                   &bl, &gq, &roar_kv_res.lists_s))
                return 1;
              p.query_sample = 1.0f;
            }
            roar_kv = build_timed(&p, &keys, &gq, &roar_kv_res);
            bench_lists_free(&bl);
            if (!roar_kv) return 1;
            if (o.overlap_ef &&
                group_overlap(&o, &m, L, g, roar_kv, &keys, n_build, o.overlap_ef, threads, &roar_kv_res)) {
              fprintf(stderr, "index-bench: group overlap of layer %d kv head %d failed\n", L, g);
              return 1;
            }
          }
          ix = roar_kv;
          r->build_s = roar_kv_res.build_s;
          r->build_cpu_s = roar_kv_res.build_cpu_s;
          r->lists_s = roar_kv_res.lists_s;
          r->bytes = roar_kv_res.bytes;
          r->bytes_per_key = roar_kv_res.bytes_per_key;
          r->gs = roar_kv_res.gs;
          r->overlap_ef = roar_kv_res.overlap_ef;
          r->overlap_sum = roar_kv_res.overlap_sum;
          r->overlap_union = roar_kv_res.overlap_union;
        } else if (k == K_ROARINS) {
          uint32_t n0 = (uint32_t)((1.0 - o.insert_frac) * n_idx);
          ra_keys k0 = keys;
          k0.n = n0;
          /* The prefix index learns from the same queries, with knn over the keys it has. */
          bench_lists bl = {0};
          ra_queries pq = bq;
          if (o.lists) {
            if (bench_lists_make(k32, n0, D, q, n_build, p.query_sample, p.knn_nq,
                                 (uint32_t)o.key_queries, o.key_rank_raw, threads, &bl, &pq,
                                 &r->lists_s))
              return 1;
            p.query_sample = 1.0f;
          }
          ix = build_timed(&p, &k0, &pq, r);
          bench_lists_free(&bl);
          if (!ix) return 1;
          const uint32_t n_ins = n_idx - n0;
          double *ins_cpu = malloc((size_t)(n_ins ? n_ins : 1) * sizeof *ins_cpu);
          if (!ins_cpu) return 1;
          double t0 = ra_clock_now_s(), cpu_sum = 0;
          for (uint32_t id = n0; id < n_idx; id++) {
            double c0 = ra_clock_thread_cpu_s();
            if (ra_index_insert(ix, &keys, id, &err)) {
              fprintf(stderr, "index-bench: insert: %s\n", err.msg);
              return 1;
            }
            ins_cpu[id - n0] = 1e6 * (ra_clock_thread_cpu_s() - c0);
            cpu_sum += ins_cpu[id - n0];
          }
          double dt = ra_clock_now_s() - t0;
          r->ins_n = n_ins;
          r->ins_wall_us = n_ins ? 1e6 * dt / n_ins : 0;
          r->ins_cpu_us_mean = n_ins ? cpu_sum / n_ins : 0;
          r->ins_cpu_us_median = median_of(ins_cpu, (int)n_ins);
          free(ins_cpu);
          if (ra_index_check(ix, &err)) {
            fprintf(stderr, "index-bench: after insertion: %s\n", err.msg);
            return 1;
          }
          r->bytes = ra_index_bytes(ix);
          r->bytes_per_key = (double)r->bytes / n_idx;
          printf("  L%d H%d roar-ins: %u inserts, %.1f us each (wall), CPU per insertion median "
                 "%.1f us, mean %.1f us\n",
                 L, h, n_ins, r->ins_wall_us, r->ins_cpu_us_median, r->ins_cpu_us_mean);
        } else if (kind == RA_MODE_ROAR && o.lists) {
          bench_lists bl;
          ra_queries lq;
          if (bench_lists_make(k32, n_idx, D, q, n_build, p.query_sample, p.knn_nq,
                               (uint32_t)o.key_queries, o.key_rank_raw, threads, &bl, &lq,
                               &r->lists_s))
            return 1;
          p.query_sample = 1.0f;
          ix = build_timed(&p, &keys, &lq, r);
          bench_lists_free(&bl);
          if (!ix) return 1;
        } else {
          if (!(ix = build_timed(&p, &keys, kind == RA_MODE_ROAR ? &bq : NULL, r))) return 1;
        }
        r->present = 1;
        sweep(ix, kind, &keys, &qs100, 100, threads, &r->c[C_Q100]);
        sweep(ix, kind, &keys, &qs100, k_large, threads, &r->c[C_Q2000]);
        sweep(ix, kind, &keys, &kks, 100, threads, &r->c[C_K100]);
        if (o.latency && (k == K_ROAR || k == K_ROARKV)) {
          /* The operating point: the smallest swept ef with recall@100 >= 0.95 (the store's
           * default ef if none reaches it), unless --latency-ef names one. */
          ra_search_params sd;
          ra_search_params_default(RA_MODE_ROAR, &sd);
          uint32_t ef = sd.ef;
          const curve *c = &r->c[C_Q100];
          for (uint32_t i = c->n; i-- > 0;)
            if (c->recall[i] >= 0.95) ef = c->param[i];
          r->lat_ef = o.lat_ef ? o.lat_ef : ef;
          measure_latency(ix, &keys, &qs100, r->lat_ef, r);
        }
        if (r->lists_s > 0)
          printf("  L%d H%d %-8s lists (bench, as the GPU would) %.2fs\n", L, h, kind_names[k],
                 r->lists_s);
        printf("  L%d H%d %-8s build %6.2fs (cpu %6.2fs) %6.1f B/key  Q->K@100 95%%: %7.3f%% "
               "scanned, r@1%%=%.3f r@3%%=%.3f | @2000 95%%: %7.3f%% | K->K@100 95%%: %7.3f%%",
               L, h, kind_names[k], r->build_s, r->build_cpu_s,
               r->bytes_per_key, 100 * scan_at(&r->c[C_Q100], 0.95),
               recall_at(&r->c[C_Q100], 0.01), recall_at(&r->c[C_Q100], 0.03),
               100 * scan_at(&r->c[C_Q2000], 0.95), 100 * scan_at(&r->c[C_K100], 0.95));
        if (r->lat_p50_us > 0)
          printf("  latency ef %u p50 %.0fus p99 %.0fus cold p50 %.0fus (recall %.3f, %.2f%% "
                 "scanned)", r->lat_ef, r->lat_p50_us, r->lat_p99_us, r->lat_cold_p50_us,
                 r->lat_recall, 100 * r->lat_scanned);
        if (r->overlap_ef)
          printf("  group walks at ef %u: %.0f keys scored in all, %.0f distinct (%.2f)", r->overlap_ef,
                 r->overlap_sum, r->overlap_union, r->overlap_union / r->overlap_sum);
        printf("\n");
        fflush(stdout);
        if (k != K_ROARKV) ra_index_free(ix);
      }
      /* A run cut short by a time limit still leaves every finished head on disk, plot too. */
      char part[4400];
      write_plot(&o, hr, n_hr, part, sizeof part);
      write_json(&o, &m, hr, n_hr, part);
      free(q);
      free(evq);
      free(gt);
      free(kkq);
      free(kkgt);
    }
    ra_npy_free(&kn);
    free(krows);
    free(k32);
    free(group_q);
    ra_index_free(roar_kv);
  }
  char note[4400];
  write_plot(&o, hr, n_hr, note, sizeof note);
  write_json(&o, &m, hr, n_hr, note);
  printf("index-bench: wrote %s; plot: %s\n", o.json, note);
  free(hr);
  return 0;
}
