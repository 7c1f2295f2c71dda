/* wave-bench: how much of the attention the wave index's zones capture on a Q/K/V dump, against
 * flat / ivf / roar at the same number of keys read.
 *
 * Per layer: the offloaded keys of each kv head are the prompt's rows [sink, n_prompt - window)
 * (as the worker offloads them); the CPU backend's cluster_keys clusters them for each swept
 * (cluster size, segment length, iterations). Each evaluation query (the dump's decode queries,
 * else the last --eval prompt queries) goes through wave_select at each retrieval budget r and
 * estimation budget e (fractions of the clusters); per q head, against exact attention over the
 * offloaded keys (p = softmax(scale q.k), o = sum p v):
 *   keys read     rows of the r retrieved clusters (shared by the kv group's q heads);
 *   recall@100    fraction of the exact top-100 keys (by q.k) inside the retrieved clusters;
 *   mass          sum of p over the retrieved rows;
 *   o error       |o~ - o| / |o|, o~ = the retrieval zone's exact partial (per cluster, from
 *                 cluster_keys' reordered rows) merged with wave_select's estimation partial of
 *                 the next e clusters; e = 0 is retrieval alone. Clusters past r + e are dropped;
 *   est weight    the estimation partial's share of o~'s softmax denominator, and est mass, the
 *                 exact p its clusters hold (what the estimate stands in for).
 * Baselines at the same keys read (B = the mean keys read of the kv head at that r):
 *   flat          exact top-B per query and q head: the upper bound of mass at that budget, and
 *                 o's error of exact attention over those B keys;
 *   ivf, roar     (kv-store/index) swept over nprobe / ef; "read" = the keys whose q.k the search
 *                 computed (a store reads those; it attends over its top_k of them, so their mass
 *                 here is an upper bound), interpolated at B (null when the sweep starts above B).
 * Output: --json FILE, and a table of the means over layers on stdout. */
#include "backend.h"
#include "clock.h"
#include "index.h"
#include "merge.h"
#include "npy.h"
#include "opts.h"
#include "qkdump.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 32
#define TOPK 100

enum { X_IVF, X_ROAR, N_IX };
static const char *const ix_names[N_IX] = {"ivf", "roar"};
static const uint32_t ivf_probes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
static const uint32_t roar_efs[] = {8, 16, 24, 32, 48, 64, 100, 128, 160, 200, 256, 320, 400, 512};
#define MAX_POINTS 16

typedef struct {
  const char *qk, *json;
  int layers[MAX_LIST], n_layers;
  int sink, window, n_eval, threads;
  double cs[MAX_LIST], seg[MAX_LIST], iters[MAX_LIST], rfrac[MAX_LIST], efrac[MAX_LIST];
  int n_cs, n_seg, n_iters, n_r, n_e;
  int use[N_IX];
} opts;

/* A comma list of numbers within [lo, hi]; its count, or -1. */
static int parse_nums(const char *s, double lo, double hi, double *out) {
  int n = 0;
  while (*s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < lo || v > hi || n == MAX_LIST) return -1;
    out[n++] = v;
    if (*end == ',') end++;
    else if (*end) return -1;
    s = end;
  }
  return n ? n : -1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: wave-bench --qk DIR --json FILE [--layers 3,15,27] [--sink 128] [--window 512]\n"
          "  [--eval N (64; prompt queries, when the dump has no decode queries)]\n"
          "  [--cluster-size 8,16,32] [--seg-len 1024,2048,8192] [--iters 2,5,10]\n"
          "  [--retrieval 0.9,1.8,3.6,7] [--estimation 0,5,11.6,23.2] (%% of the clusters)\n"
          "  [--kinds ivf,roar | none] [--threads N]\n"
          "The dump needs values (v_L*_H*.npy: gpu-worker dump-qk, qk-synth write them).\n");
}

/* An integer flag value in [lo, hi] into *out: 0, or -1 (a usage error) when it is not one. */
static int int_arg(const char *v, int lo, int hi, int *out) {
  int64_t x;
  if (ra_opts_parse_int(v, lo, hi, &x, NULL) != RA_OK) return -1;
  *out = (int)x;
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->sink = 128;
  o->window = 512;
  o->n_eval = 64;
  o->use[X_IVF] = o->use[X_ROAR] = 1;
  double layers[MAX_LIST];
  static const double cs[] = {16}, seg[] = {8192}, it[] = {5}, rf[] = {0.9, 1.8, 3.6, 7},
                      ef[] = {0, 5, 11.6, 23.2};
  o->n_cs = o->n_seg = o->n_iters = 1;
  o->cs[0] = cs[0], o->seg[0] = seg[0], o->iters[0] = it[0];
  o->n_r = 4, o->n_e = 4;
  memcpy(o->rfrac, rf, sizeof rf);
  memcpy(o->efrac, ef, sizeof ef);
  o->n_layers = -1;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return -1;
    int n = 0;
    if (!strcmp(a, "--qk")) o->qk = v;
    else if (!strcmp(a, "--json")) o->json = v;
    else if (!strcmp(a, "--layers")) {
      if ((n = o->n_layers = parse_nums(v, 0, 1 << 20, layers)) < 0) return -1;
      for (int j = 0; j < n; j++) o->layers[j] = (int)layers[j];
    }
    else if (!strcmp(a, "--sink")) n = int_arg(v, 0, 1 << 20, &o->sink);
    else if (!strcmp(a, "--window")) n = int_arg(v, 0, 1 << 20, &o->window);
    else if (!strcmp(a, "--eval")) n = int_arg(v, 1, 1 << 20, &o->n_eval);
    else if (!strcmp(a, "--threads")) n = int_arg(v, 0, 4096, &o->threads);
    else if (!strcmp(a, "--cluster-size")) n = o->n_cs = parse_nums(v, 1, 1 << 20, o->cs);
    else if (!strcmp(a, "--seg-len")) n = o->n_seg = parse_nums(v, 1, 1 << 30, o->seg);
    else if (!strcmp(a, "--iters")) n = o->n_iters = parse_nums(v, 1, 1000, o->iters);
    else if (!strcmp(a, "--retrieval")) n = o->n_r = parse_nums(v, 0.001, 100, o->rfrac);
    else if (!strcmp(a, "--estimation")) n = o->n_e = parse_nums(v, 0, 100, o->efrac);
    else if (!strcmp(a, "--kinds")) {
      o->use[X_IVF] = o->use[X_ROAR] = 0;
      if (strcmp(v, "none")) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
          int found = 0;
          for (int k = 0; k < N_IX; k++)
            if (!strcmp(t, ix_names[k])) o->use[k] = found = 1;
          if (!found) return -1;
        }
      }
    } else return -1;
    if (n < 0) return -1;
  }
  if (!o->qk || !o->json || o->sink < 0 || o->window < 0 || o->n_eval < 1 || o->threads < 0) return -1;
  return 0;
}

typedef struct { /* one index sweep of one q head: means over the evaluation queries */
  int n;
  uint32_t param[MAX_POINTS];
  double keys[MAX_POINTS], recall[MAX_POINTS], mass[MAX_POINTS];
} curve;

/* Recall and mass of c at B keys read, interpolated; 0 when the sweep starts above B. */
static int curve_at(const curve *c, double B, double *recall, double *mass) {
  if (c->n == 0 || B < c->keys[0]) return 0;
  for (int i = 1; i < c->n; i++)
    if (c->keys[i] >= B) {
      double t = c->keys[i] > c->keys[i - 1] ? (B - c->keys[i - 1]) / (c->keys[i] - c->keys[i - 1]) : 1;
      *recall = c->recall[i - 1] + t * (c->recall[i] - c->recall[i - 1]);
      *mass = c->mass[i - 1] + t * (c->mass[i] - c->mass[i - 1]);
      return 1;
    }
  *recall = c->recall[c->n - 1];
  *mass = c->mass[c->n - 1];
  return 1;
}

/* The exact reference of one layer: per q head h and evaluation query i (row h * n_ev + i),
 * p [n_off] (softmax over the offloaded keys), order [n_off] (the keys by descending p), cum
 * [n_off] (the mass of the top-(j+1) keys), thr (the 100th largest p), o [hd]. */
typedef struct {
  uint32_t n_off, n_ev;
  int hq, hd;
  float *p, *cum, *thr, *o;
  int32_t *order;
} exact_ref;

static const float *sort_p; /* qsort's comparator reads the row being sorted (one per thread) */
#pragma omp threadprivate(sort_p)

static int cmp_desc(const void *a, const void *b) {
  float x = sort_p[*(const int32_t *)a], y = sort_p[*(const int32_t *)b];
  return x < y ? 1 : x > y ? -1 : *(const int32_t *)a - *(const int32_t *)b;
}

static int exact_make(exact_ref *x, const float *const *koff, const float *const *voff, const float *qev,
                      int hq, int G, int hd, uint32_t n_off, uint32_t n_ev, float scale, int threads) {
  x->n_off = n_off, x->n_ev = n_ev, x->hq = hq, x->hd = hd;
  size_t rows = (size_t)hq * n_ev;
  x->p = malloc(rows * n_off * sizeof(float));
  x->cum = malloc(rows * n_off * sizeof(float));
  x->thr = malloc(rows * sizeof(float));
  x->o = malloc(rows * hd * sizeof(float));
  x->order = malloc(rows * n_off * sizeof(int32_t));
  if (!x->p || !x->cum || !x->thr || !x->o || !x->order) return -1;
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
  for (size_t row = 0; row < rows; row++) {
    const int h = (int)(row / n_ev);
    const uint32_t i = (uint32_t)(row % n_ev);
    const float *q = qev + ((size_t)i * hq + h) * hd, *k = koff[h / G];
    float *p = x->p + row * n_off, *cum = x->cum + row * n_off;
    float m = -INFINITY;
    for (uint32_t t = 0; t < n_off; t++) {
      float s = 0;
      for (int d = 0; d < hd; d++) s += q[d] * k[(size_t)t * hd + d];
      p[t] = scale * s;
      m = p[t] > m ? p[t] : m;
    }
    double l = 0;
    for (uint32_t t = 0; t < n_off; t++) l += exp((double)p[t] - m);
    for (uint32_t t = 0; t < n_off; t++) p[t] = (float)(exp((double)p[t] - m) / l);
    int32_t *ord = x->order + row * n_off;
    for (uint32_t t = 0; t < n_off; t++) ord[t] = (int32_t)t;
    sort_p = p;
    qsort(ord, n_off, sizeof(int32_t), cmp_desc);
    x->thr[row] = p[ord[(n_off < TOPK ? n_off : TOPK) - 1]];
    double acc = 0;
    for (uint32_t t = 0; t < n_off; t++) cum[t] = (float)(acc += p[ord[t]]);
    ra_partial part = {.o = x->o + row * hd};
    ra_partial_attend_f32(q, k, voff[h / G], n_off, hd, scale, &part);
  }
  return 0;
}

static void exact_free(exact_ref *x) {
  free(x->p);
  free(x->cum);
  free(x->thr);
  free(x->o);
  free(x->order);
}

/* Sweeps an index of q head h's kv head keys over the evaluation queries: per point the mean
 * keys whose q.k was computed, and the recall@100 and mass of that set. */
static int sweep_index(const ra_index *ix, int kind, const ra_keys *keys, const exact_ref *x, const float *qev,
                       int h, int threads, curve *c) {
  const uint32_t n = keys->n;
  const uint32_t *list = kind == X_IVF ? ivf_probes : roar_efs;
  const int np = kind == X_IVF ? (int)(sizeof ivf_probes / sizeof *ivf_probes)
                               : (int)(sizeof roar_efs / sizeof *roar_efs);
  memset(c, 0, sizeof *c);
  int fail = 0;
  for (int pi = 0; pi < np && c->n < MAX_POINTS; pi++) {
    double ks = 0, rs = 0, ms = 0;
    const uint32_t k = kind == X_IVF ? n : list[pi] < TOPK ? list[pi] : TOPK;
#pragma omp parallel num_threads(threads) reduction(+ : ks, rs, ms, fail)
    {
      ra_index_scratch s;
      uint32_t *ids = malloc((size_t)k * sizeof *ids);
      int ok = ids && ra_index_scratch_init(&s, ix, list[pi], k, NULL) == RA_OK;
      fail += !ok;
#pragma omp for schedule(dynamic, 4)
      for (uint32_t i = 0; i < x->n_ev; i++) {
        uint32_t got = 0;
        uint64_t sc = 0;
        ra_search_params sp = {.ef = list[pi], .nprobe = list[pi]};
        if (!ok || ra_index_search(ix, keys, qev + ((size_t)i * x->hq + h) * x->hd, k, &sp, &s, ids, NULL, &got,
                                   &sc)) {
          fail += ok;
          continue;
        }
        const float *p = x->p + ((size_t)h * x->n_ev + i) * n, thr = x->thr[(size_t)h * x->n_ev + i];
        double mass = 0;
        uint32_t hit = 0;
        if (kind == X_IVF) /* k = n: every scanned key comes back */
          for (uint32_t j = 0; j < got; j++) mass += p[ids[j]], hit += p[ids[j]] >= thr;
        else /* the keys the walk scored carry this search's epoch */
          for (uint32_t v = 0; v < n; v++)
            if (s.visited[v] == s.epoch) mass += p[v], hit += p[v] >= thr;
        ks += (double)sc;
        rs += (double)hit / TOPK;
        ms += mass;
      }
      if (ok) ra_index_scratch_free(&s);
      free(ids);
    }
    if (fail) return -1;
    c->param[c->n] = list[pi];
    c->keys[c->n] = ks / x->n_ev;
    c->recall[c->n] = rs / x->n_ev;
    c->mass[c->n] = ms / x->n_ev;
    if (c->keys[c->n++] >= 0.999 * n) break;
  }
  return 0;
}

/* Sums over one config's evaluation queries, per (layer, r, q head); the e-indexed ones per e. */
typedef struct {
  double keys, recall, mass, flat_mass, flat_recall, flat_oerr;
  double oerr[MAX_LIST], estw[MAX_LIST], estm[MAX_LIST];
} head_sums;

typedef struct {
  int cs, seg, iters;
  int64_t n_clusters;
  double cluster_s[MAX_LIST]; /* per layer: cluster_keys wall seconds */
  int r[MAX_LIST], e[MAX_LIST];
  head_sums *hs; /* [n_layers][n_r][hq] */
} config_res;

static head_sums *hs_at(const config_res *c, const opts *o, int hq, int li, int ri, int h) {
  return c->hs + ((size_t)li * o->n_r + ri) * hq + h;
}

/* Layer-level means of a config at r index ri (li = -1: the mean over layers), the index
 * baselines at each head's B, and the worst head's mass. */
typedef struct {
  double keys, recall, mass, mass_worst, flat_mass, flat_recall, flat_oerr;
  double ix_recall[N_IX], ix_mass[N_IX];
  int ix_n[N_IX];
  double oerr[MAX_LIST], estw[MAX_LIST], estm[MAX_LIST];
} point;

static void point_of(const config_res *c, const opts *o, int hq, int G, uint32_t n_ev, const curve *curves,
                     int li, int ri, point *pt) {
  memset(pt, 0, sizeof *pt);
  pt->mass_worst = INFINITY;
  int l0 = li < 0 ? 0 : li, l1 = li < 0 ? o->n_layers : li + 1, nh = 0;
  for (int l = l0; l < l1; l++)
    for (int h = 0; h < hq; h++) {
      const head_sums *s = hs_at(c, o, hq, l, ri, h);
      pt->keys += s->keys / n_ev;
      pt->recall += s->recall / n_ev;
      pt->mass += s->mass / n_ev;
      pt->mass_worst = s->mass / n_ev < pt->mass_worst ? s->mass / n_ev : pt->mass_worst;
      pt->flat_mass += s->flat_mass / n_ev;
      pt->flat_recall += s->flat_recall / n_ev;
      pt->flat_oerr += s->flat_oerr / n_ev;
      for (int ei = 0; ei < o->n_e; ei++) {
        pt->oerr[ei] += s->oerr[ei] / n_ev;
        pt->estw[ei] += s->estw[ei] / n_ev;
        pt->estm[ei] += s->estm[ei] / n_ev;
      }
      /* B: the mean keys read of the head's kv head (its q heads share the zones) */
      const double B = s->keys / n_ev;
      for (int k = 0; k < N_IX; k++) {
        double rr, mm;
        if (!o->use[k] || !curve_at(&curves[((size_t)l * hq + h) * N_IX + k], B, &rr, &mm)) continue;
        pt->ix_recall[k] += rr;
        pt->ix_mass[k] += mm;
        pt->ix_n[k]++;
      }
      nh++;
    }
  pt->keys /= nh, pt->recall /= nh, pt->mass /= nh, pt->flat_mass /= nh, pt->flat_recall /= nh, pt->flat_oerr /= nh;
  for (int ei = 0; ei < o->n_e; ei++) pt->oerr[ei] /= nh, pt->estw[ei] /= nh, pt->estm[ei] /= nh;
  for (int k = 0; k < N_IX; k++)
    if (pt->ix_n[k]) pt->ix_recall[k] /= pt->ix_n[k], pt->ix_mass[k] /= pt->ix_n[k];
}

static void json_point(FILE *f, const opts *o, const config_res *c, const point *pt, int ri, uint32_t n_off,
                       int nh_total) {
  fprintf(f, "{\"retrieval_pct\": %g, \"r\": %d, \"keys_read\": %.1f, \"keys_read_frac\": %.5f, "
             "\"recall100\": %.4f, \"mass\": %.4f, \"mass_worst_head\": %.4f, "
             "\"flat\": {\"recall100\": %.4f, \"mass\": %.4f, \"o_rel_err\": %.5f}",
          o->rfrac[ri], c->r[ri], pt->keys, pt->keys / n_off, pt->recall, pt->mass, pt->mass_worst,
          pt->flat_recall, pt->flat_mass, pt->flat_oerr);
  for (int k = 0; k < N_IX; k++) {
    if (!o->use[k]) continue;
    if (pt->ix_n[k] == nh_total)
      fprintf(f, ", \"%s\": {\"recall100\": %.4f, \"mass\": %.4f}", ix_names[k], pt->ix_recall[k], pt->ix_mass[k]);
    else if (pt->ix_n[k])
      fprintf(f, ", \"%s\": {\"recall100\": %.4f, \"mass\": %.4f, \"heads\": %d}", ix_names[k], pt->ix_recall[k],
              pt->ix_mass[k], pt->ix_n[k]);
    else
      fprintf(f, ", \"%s\": null", ix_names[k]);
  }
  fprintf(f, ", \"estimation\": [");
  for (int ei = 0; ei < o->n_e; ei++)
    fprintf(f, "%s{\"estimation_pct\": %g, \"e\": %d, \"o_rel_err\": %.5f, \"est_weight\": %.4f, \"est_mass\": %.4f}",
            ei ? ", " : "", o->efrac[ei], c->e[ei], pt->oerr[ei], pt->estw[ei], pt->estm[ei]);
  fprintf(f, "]}");
}

static int write_json(const opts *o, const ra_qk_meta *m, uint32_t n_off, uint32_t n_ev, const char *eval_kind,
                      const config_res *cfgs, int n_cfg, const curve *curves) {
  FILE *f = fopen(o->json, "w");
  if (!f) {
    fprintf(stderr, "wave-bench: cannot write %s\n", o->json);
    return -1;
  }
  const int hq = m->q_heads, G = m->q_heads / m->kv_heads;
  fprintf(f, "{\n  \"dump\": {\"dir\": \"%s\", \"model\": \"%s\", \"n_prompt\": %u, \"n_decode\": %u, "
             "\"head_dim\": %d, \"q_heads\": %d, \"kv_heads\": %d},\n",
          o->qk, m->model, m->n_tokens, m->n_decode, m->head_dim, m->q_heads, m->kv_heads);
  fprintf(f, "  \"setup\": {\"sink\": %d, \"window\": %d, \"offloaded_keys\": %u, \"eval_queries\": %u, "
             "\"eval_kind\": \"%s\", \"topk\": %d, \"layers\": [",
          o->sink, o->window, n_off, n_ev, eval_kind, TOPK);
  for (int i = 0; i < o->n_layers; i++) fprintf(f, "%s%d", i ? ", " : "", o->layers[i]);
  fprintf(f, "]},\n  \"configs\": [\n");
  for (int ci = 0; ci < n_cfg; ci++) {
    const config_res *c = &cfgs[ci];
    fprintf(f, "    {\"cluster_size\": %d, \"seg_len\": %d, \"iters\": %d, \"n_clusters\": %lld, \"cluster_s\": [",
            c->cs, c->seg, c->iters, (long long)c->n_clusters);
    for (int li = 0; li < o->n_layers; li++) fprintf(f, "%s%.3f", li ? ", " : "", c->cluster_s[li]);
    fprintf(f, "],\n      \"all\": [");
    for (int ri = 0; ri < o->n_r; ri++) {
      point pt;
      point_of(c, o, hq, G, n_ev, curves, -1, ri, &pt);
      fprintf(f, "%s\n        ", ri ? "," : "");
      json_point(f, o, c, &pt, ri, n_off, hq * o->n_layers);
    }
    fprintf(f, "],\n      \"layers\": [");
    for (int li = 0; li < o->n_layers; li++) {
      fprintf(f, "%s\n        {\"layer\": %d, \"points\": [", li ? "," : "", o->layers[li]);
      for (int ri = 0; ri < o->n_r; ri++) {
        point pt;
        point_of(c, o, hq, G, n_ev, curves, li, ri, &pt);
        fprintf(f, "%s\n          ", ri ? "," : "");
        json_point(f, o, c, &pt, ri, n_off, hq);
      }
      fprintf(f, "]}");
    }
    fprintf(f, "]}%s\n", ci + 1 < n_cfg ? "," : "");
  }
  fprintf(f, "  ],\n  \"index_curves\": [");
  int first = 1;
  for (int li = 0; li < o->n_layers; li++)
    for (int h = 0; h < hq; h++) {
      fprintf(f, "%s\n    {\"layer\": %d, \"qhead\": %d", first ? "" : ",", o->layers[li], h);
      first = 0;
      for (int k = 0; k < N_IX; k++) {
        if (!o->use[k]) continue;
        const curve *cv = &curves[((size_t)li * hq + h) * N_IX + k];
        fprintf(f, ", \"%s\": {\"param\": [", ix_names[k]);
        for (int i = 0; i < cv->n; i++) fprintf(f, "%s%u", i ? ", " : "", cv->param[i]);
        fprintf(f, "], \"keys\": [");
        for (int i = 0; i < cv->n; i++) fprintf(f, "%s%.1f", i ? ", " : "", cv->keys[i]);
        fprintf(f, "], \"recall100\": [");
        for (int i = 0; i < cv->n; i++) fprintf(f, "%s%.4f", i ? ", " : "", cv->recall[i]);
        fprintf(f, "], \"mass\": [");
        for (int i = 0; i < cv->n; i++) fprintf(f, "%s%.4f", i ? ", " : "", cv->mass[i]);
        fprintf(f, "]}");
      }
      fprintf(f, "}");
    }
  fprintf(f, "\n  ]\n}\n");
  return fclose(f) ? -1 : 0;
}

/* The backend tensors of one layer: caches [n_prompt, hkv, hd] and the query [hq, hd]. */
typedef struct {
  ra_tensor kc, vc, q, o, ml;
} layer_tensors;

/* Per cluster j of kv head h: start[h * K + j], the offset of its rows in the cluster order. */
static void cluster_starts(const int32_t *counts, int hkv, int64_t K, int64_t *start) {
  for (int h = 0; h < hkv; h++) {
    int64_t acc = 0;
    for (int64_t j = 0; j < K; j++) {
      start[h * K + j] = acc;
      acc += counts[h * K + j];
    }
  }
}

static double rel_err(const float *a, const float *ref, int hd) {
  double dn = 0, dd = 0;
  for (int d = 0; d < hd; d++) dn += (a[d] - ref[d]) * (a[d] - ref[d]), dd += ref[d] * ref[d];
  return dd > 0 ? sqrt(dn / dd) : 0;
}

/* o's relative error of exact attention over the top-B keys of reference row `row` (flat at B).
 * k, v: the offloaded keys [n_off, hd]; fk, fv: room for B rows; ob: [hd]. */
static double flat_err(const exact_ref *x, size_t row, const float *q, uint32_t B, float scale, const float *k,
                       const float *v, float *fk, float *fv, float *ob) {
  const int hd = x->hd;
  const int32_t *ord = x->order + row * x->n_off;
  for (uint32_t j = 0; j < B; j++) {
    memcpy(fk + (size_t)j * hd, k + (size_t)ord[j] * hd, sizeof(float) * hd);
    memcpy(fv + (size_t)j * hd, v + (size_t)ord[j] * hd, sizeof(float) * hd);
  }
  ra_partial part = {.o = ob};
  ra_partial_attend_f32(q, fk, fv, B, hd, scale, &part);
  return rel_err(ob, x->o + row * hd, hd);
}

/* One config on one layer: cluster, then every evaluation query through wave_select at every
 * (r, e); adds into c's sums of layer li. */
static int run_config(ra_backend *be, const opts *o, const ra_qk_meta *m, layer_tensors *T, const exact_ref *x,
                      const float *const *koff, const float *const *voff, const float *qev, int li, config_res *c,
                      ra_error *err) {
  const int hq = m->q_heads, hkv = m->kv_heads, G = hq / hkv, hd = m->head_dim;
  const uint32_t n_off = x->n_off, n_ev = x->n_ev;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t K = c->n_clusters;
  ra_wave_cluster_params p = {.seg_len = c->seg, .cluster_size = c->cs, .iters = c->iters};
  ra_tensor cen = {0}, size = {0}, vsum = {0}, ok_ = {0}, ov = {0};
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)hkv * n_off), *counts = malloc(sizeof(int32_t) * (size_t)(hkv * K));
  int64_t *start = malloc(sizeof(int64_t) * (size_t)(hkv * K));
  float *hk = malloc(sizeof(float) * (size_t)hkv * n_off * hd), *hv = malloc(sizeof(float) * (size_t)hkv * n_off * hd);
  float *ho = malloc(sizeof(float) * (size_t)hq * hd), *hml = malloc(sizeof(float) * (size_t)hq * 2);
  float *ret_o = malloc(sizeof(float) * (size_t)hq * hd), *mo = malloc(sizeof(float) * (size_t)hd);
  float *fk = malloc(sizeof(float) * (size_t)n_off * hd), *fv = malloc(sizeof(float) * (size_t)n_off * hd);
  float ret_m[64], ret_l[64];
  int rmax = 0, emax = 0;
  for (int ri = 0; ri < o->n_r; ri++) rmax = c->r[ri] > rmax ? c->r[ri] : rmax;
  for (int ei = 0; ei < o->n_e; ei++) emax = c->e[ei] > emax ? c->e[ei] : emax;
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)hkv * (rmax + emax));
  int rc = RA_ENOMEM;
  if (hq > 64 || !perm || !counts || !start || !hk || !hv || !ho || !hml || !ret_o || !mo || !fk || !fv || !idx) {
    ra_errorf(err, RA_ENOMEM, "wave-bench: out of memory");
    goto out;
  }
  const int64_t cs3[3] = {hkv, K, hd}, cs2[2] = {hkv, K}, os3[3] = {hkv, n_off, hd};
  if ((rc = ra_tensor_new(be, &cen, RA_DTYPE_F32, 3, cs3, err)) || (rc = ra_tensor_new(be, &vsum, RA_DTYPE_F32, 3, cs3, err)) ||
      (rc = ra_tensor_new(be, &size, RA_DTYPE_F32, 2, cs2, err)) || (rc = ra_tensor_new(be, &ok_, RA_DTYPE_F32, 3, os3, err)) ||
      (rc = ra_tensor_new(be, &ov, RA_DTYPE_F32, 3, os3, err)))
    goto out;
  double t0 = ra_clock_now_s();
  if ((rc = be->ops->cluster_keys(be, &T->kc, &T->vc, o->sink, n_off, &p, &cen, &size, &vsum, 0, &ok_, &ov, perm,
                                  counts, err)))
    goto out;
  c->cluster_s[li] = ra_clock_now_s() - t0;
  if ((rc = be->ops->download(be, &ok_, 0, hk, (size_t)hkv * n_off * hd, err)) ||
      (rc = be->ops->download(be, &ov, 0, hv, (size_t)hkv * n_off * hd, err)))
    goto out;
  cluster_starts(counts, hkv, K, start);
  for (uint32_t i = 0; i < n_ev; i++) {
    if ((rc = be->ops->upload(be, &T->q, 0, qev + (size_t)i * hq * hd, (size_t)hq * hd, err))) goto out;
    for (int ri = 0; ri < o->n_r; ri++) {
      const int r = c->r[ri];
      for (int ei = 0; ei < o->n_e; ei++) {
        const int e = c->e[ei], ld = r + e;
        if ((rc = be->ops->wave_select(be, &T->q, &cen, &size, K, scale, r, e, idx, &vsum, &T->o, &T->ml, err)) ||
            (rc = be->ops->download(be, &T->o, 0, ho, (size_t)hq * hd, err)) ||
            (rc = be->ops->download(be, &T->ml, 0, hml, (size_t)hq * 2, err)))
          goto out;
        for (int h = 0; h < hq; h++) {
          const int g = h / G;
          const size_t row = (size_t)h * n_ev + i;
          const float *pr = x->p + row * n_off, *q = qev + ((size_t)i * hq + h) * hd;
          head_sums *s = hs_at(c, o, hq, li, ri, h);
          if (ei == 0) { /* the retrieval zone: the first r entries, the same for every e */
            ra_partial acc = {.o = ret_o + (size_t)h * hd};
            ra_partial_reset(&acc, hd);
            double mass = 0;
            uint32_t keys = 0, hit = 0;
            for (int j = 0; j < r; j++) {
              const int32_t cl = idx[g * ld + j];
              if (cl < 0) continue;
              const int64_t s0 = start[g * K + cl], cnt = counts[g * K + cl];
              for (int64_t t = 0; t < cnt; t++) {
                const float pt = pr[perm[(size_t)g * n_off + s0 + t]];
                mass += pt;
                hit += pt >= x->thr[row];
              }
              keys += (uint32_t)cnt;
              ra_partial part = {.o = mo};
              ra_partial_attend_f32(q, hk + ((size_t)g * n_off + s0) * hd, hv + ((size_t)g * n_off + s0) * hd,
                                    (size_t)cnt, hd, scale, &part);
              ra_partial_merge_from(&acc, &part, hd);
            }
            ret_m[h] = acc.m, ret_l[h] = acc.l;
            s->keys += keys;
            s->mass += mass;
            s->recall += (double)hit / TOPK;
            s->flat_mass += keys ? x->cum[row * n_off + keys - 1] : 0;
            s->flat_recall += (keys < TOPK ? keys : TOPK) / (double)TOPK;
            s->flat_oerr += flat_err(x, row, q, keys, scale, koff[g], voff[g], fk, fv, mo);
          }
          /* the estimation zone's exact mass, and o~ = retrieval (+) estimation */
          double em = 0;
          for (int j = r; j < ld; j++) {
            const int32_t cl = idx[g * ld + j];
            if (cl < 0) continue;
            const int64_t s0 = start[g * K + cl], cnt = counts[g * K + cl];
            for (int64_t t = 0; t < cnt; t++) em += pr[perm[(size_t)g * n_off + s0 + t]];
          }
          ra_partial acc = {.o = mo, .m = ret_m[h], .l = ret_l[h]};
          memcpy(mo, ret_o + (size_t)h * hd, sizeof(float) * (size_t)hd);
          const float em_ = hml[2 * h], el = hml[2 * h + 1];
          ra_partial_merge(&acc, ho + (size_t)h * hd, em_, el, hd);
          double w_est = el > 0 ? el * exp((double)em_ - acc.m) : 0;
          s->oerr[ei] += rel_err(mo, x->o + row * hd, hd);
          s->estw[ei] += acc.l > 0 ? w_est / acc.l : 0;
          s->estm[ei] += em;
        }
      }
    }
  }
  rc = RA_OK;
out:
  ra_tensor_free(&cen), ra_tensor_free(&size), ra_tensor_free(&vsum), ra_tensor_free(&ok_), ra_tensor_free(&ov);
  free(perm), free(counts), free(start), free(hk), free(hv), free(ho), free(hml), free(ret_o), free(mo), free(fk), free(fv), free(idx);
  return rc;
}

static void print_table(const opts *o, const ra_qk_meta *m, uint32_t n_off, uint32_t n_ev, const config_res *cfgs,
                        int n_cfg, const curve *curves) {
  const int hq = m->q_heads, G = hq / m->kv_heads;
  printf("\nmeans over %d layers x %d q heads x %u queries; mass = share of the exact softmax over the %u "
         "offloaded keys; flat/ivf/roar at wave's keys read\n",
         o->n_layers, hq, n_ev, n_off);
  printf("%4s %5s %4s %6s %5s %6s %6s %6s %6s %6s %6s %7s", "cs", "seg", "it", "r%", "keys", "keys%", "rec", "mass",
         "flat", "ivf", "roar", "flaterr");
  for (int ei = 0; ei < o->n_e; ei++) printf("  err@e%-5g", o->efrac[ei]);
  printf("\n");
  for (int ci = 0; ci < n_cfg; ci++)
    for (int ri = 0; ri < o->n_r; ri++) {
      const config_res *c = &cfgs[ci];
      point pt;
      point_of(c, o, hq, G, n_ev, curves, -1, ri, &pt);
      printf("%4d %5d %4d %6g %5.0f %5.2f%% %6.3f %6.3f %6.3f", c->cs, c->seg, c->iters, o->rfrac[ri], pt.keys,
             100 * pt.keys / n_off, pt.recall, pt.mass, pt.flat_mass);
      for (int k = 0; k < N_IX; k++)
        if (o->use[k] && pt.ix_n[k] == hq * o->n_layers) printf(" %6.3f", pt.ix_mass[k]);
        else printf(" %6s", "-");
      printf(" %7.4f", pt.flat_oerr);
      for (int ei = 0; ei < o->n_e; ei++) printf("  %6.4f(%2.0f)", pt.oerr[ei], 100 * pt.estw[ei]);
      printf("\n");
    }
  printf("err@eX: |o~ - o| / |o| with the estimation zone at X %% of the clusters (its weight in o~, %%); "
         "flaterr: the same for exact attention over flat's top keys\n");
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
    fprintf(stderr, "wave-bench: %s\n", err.msg);
    return 1;
  }
  const int hq = m.q_heads, hkv = m.kv_heads, G = hq / hkv, hd = m.head_dim;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const int use_dec = m.n_decode > 0;
  const uint32_t Np = m.n_tokens, n_ev = use_dec ? m.n_decode : (uint32_t)o.n_eval;
  /* prompt queries before the evaluation ones build roar */
  const uint32_t n_build = use_dec ? Np : Np > n_ev ? Np - n_ev : 0;
  if (hq > 64 || (uint64_t)o.sink + o.window + 2 * TOPK > Np || n_build < 2 * TOPK) {
    fprintf(stderr, "wave-bench: %u prompt tokens is too few for sink %d + window %d, %u evaluation queries\n", Np,
            o.sink, o.window, n_ev);
    return 1;
  }
  const uint32_t n_off = Np - (uint32_t)o.sink - (uint32_t)o.window;
  if (o.n_layers < 0) {
    o.n_layers = m.layers < MAX_LIST ? m.layers : MAX_LIST;
    for (int i = 0; i < o.n_layers; i++) o.layers[i] = i;
  }
  for (int i = 0; i < o.n_layers; i++)
    if (o.layers[i] >= m.layers) {
      fprintf(stderr, "wave-bench: layer %d out of range (the dump has %d)\n", o.layers[i], m.layers);
      return 1;
    }
  ra_backend *be;
  ra_backend_config bc = {threads, 0};
  if (ra_backend_create("cpu", &bc, &be, &err)) {
    fprintf(stderr, "wave-bench: %s\n", err.msg);
    return 1;
  }
  const int n_cfg = o.n_cs * o.n_seg * o.n_iters;
  config_res *cfgs = calloc((size_t)n_cfg, sizeof *cfgs);
  curve *curves = calloc((size_t)o.n_layers * hq * N_IX, sizeof *curves);
  if (!cfgs || !curves) return 1;
  for (int ci = 0; ci < n_cfg; ci++) {
    config_res *c = &cfgs[ci];
    c->cs = (int)o.cs[ci / (o.n_seg * o.n_iters)];
    c->seg = (int)o.seg[ci / o.n_iters % o.n_seg];
    c->iters = (int)o.iters[ci % o.n_iters];
    c->n_clusters = ra_wave_n_clusters(n_off, c->seg, c->cs);
    for (int ri = 0; ri < o.n_r; ri++) {
      long r = lround(o.rfrac[ri] / 100 * (double)c->n_clusters);
      c->r[ri] = (int)(r < 1 ? 1 : r > c->n_clusters ? c->n_clusters : r);
    }
    for (int ei = 0; ei < o.n_e; ei++) c->e[ei] = (int)lround(o.efrac[ei] / 100 * (double)c->n_clusters);
    if (!(c->hs = calloc((size_t)o.n_layers * o.n_r * hq, sizeof *c->hs))) return 1;
  }
  printf("wave-bench: %s (%s), %u prompt tokens, %u offloaded keys per kv head, %u %s queries, %d configs, "
         "%d threads\n",
         o.qk, m.model, Np, n_off, n_ev, use_dec ? "decode" : "prompt", n_cfg, threads);

  for (int li = 0; li < o.n_layers; li++) {
    const int L = o.layers[li];
    ra_npy kn[64] = {{0}}, vn[64] = {{0}};
    const float *koff[64], *voff[64];
    float *qev = malloc(sizeof(float) * (size_t)n_ev * hq * hd), *qbuild[64] = {0};
    layer_tensors T = {0};
    exact_ref x = {0};
    if (!qev) return 1;
    for (int g = 0; g < hkv; g++) {
      if (ra_qk_read_f32(o.qk, "k", L, g, hd, Np, &kn[g], &err) || ra_qk_read_f32(o.qk, "v", L, g, hd, Np, &vn[g], &err)) {
        fprintf(stderr, "wave-bench: %s\n", err.msg);
        return 1;
      }
      koff[g] = (const float *)kn[g].data + (size_t)o.sink * hd;
      voff[g] = (const float *)vn[g].data + (size_t)o.sink * hd;
    }
    for (int h = 0; h < hq; h++) { /* qev [n_ev, hq, hd], as the backend takes a step's query */
      ra_npy qn;
      if (ra_qk_read_f32(o.qk, use_dec ? "qdec" : "q", L, h, hd, use_dec ? n_ev : Np, &qn, &err)) {
        fprintf(stderr, "wave-bench: %s\n", err.msg);
        return 1;
      }
      const uint32_t first = use_dec ? 0 : Np - n_ev;
      for (uint32_t i = 0; i < n_ev; i++)
        memcpy(qev + ((size_t)i * hq + h) * hd, (const float *)qn.data + (size_t)(first + i) * hd, sizeof(float) * hd);
      if (use_dec) {
        ra_npy_free(&qn);
        if (o.use[X_ROAR] && ra_qk_read_f32(o.qk, "q", L, h, hd, Np, &qn, &err)) {
          fprintf(stderr, "wave-bench: %s\n", err.msg);
          return 1;
        }
      }
      qbuild[h] = use_dec && !o.use[X_ROAR] ? NULL : qn.data;
    }
    /* the caches [Np, hkv, hd] as the worker holds them */
    const int64_t shp[3] = {Np, hkv, hd}, qs[2] = {hq, hd}, mls[2] = {hq, 2};
    float *row = malloc(sizeof(float) * (size_t)Np * hkv * hd);
    if (!row || ra_tensor_new(be, &T.kc, RA_DTYPE_F32, 3, shp, &err) || ra_tensor_new(be, &T.vc, RA_DTYPE_F32, 3, shp, &err) ||
        ra_tensor_new(be, &T.q, RA_DTYPE_F32, 2, qs, &err) || ra_tensor_new(be, &T.o, RA_DTYPE_F32, 2, qs, &err) ||
        ra_tensor_new(be, &T.ml, RA_DTYPE_F32, 2, mls, &err)) {
      fprintf(stderr, "wave-bench: tensors: %s\n", row ? err.msg : "out of memory");
      return 1;
    }
    for (int w = 0; w < 2; w++) {
      for (uint32_t t = 0; t < Np; t++)
        for (int g = 0; g < hkv; g++)
          memcpy(row + ((size_t)t * hkv + g) * hd, (const float *)(w ? vn : kn)[g].data + (size_t)t * hd,
                 sizeof(float) * hd);
      if (be->ops->upload(be, w ? &T.vc : &T.kc, 0, row, (size_t)Np * hkv * hd, &err)) {
        fprintf(stderr, "wave-bench: %s\n", err.msg);
        return 1;
      }
    }
    free(row);
    double t0 = ra_clock_now_s();
    if (exact_make(&x, koff, voff, qev, hq, G, hd, n_off, n_ev, 1.0f / sqrtf((float)hd), threads)) {
      fprintf(stderr, "wave-bench: out of memory for the exact reference\n");
      return 1;
    }
    printf("  L%d exact reference %.2fs\n", L, ra_clock_now_s() - t0);
    fflush(stdout);
    /* the baselines: ivf per kv head, roar per q head (from its prompt queries) */
    for (int g = 0; g < hkv; g++) {
      ra_keys keys = {.rows = koff[g], .dtype = RA_DTYPE_F32, .dim = hd, .n = n_off};
      for (int k = 0; k < N_IX; k++) {
        if (!o.use[k]) continue;
        ra_index *ix = NULL;
        for (int h = g * G; h < (g + 1) * G; h++) {
          ra_index_params p;
          ra_index_params_default(k == X_IVF ? RA_MODE_IVF : RA_MODE_ROAR, &p);
          p.n_threads = threads;
          ra_queries bq = {.q = qbuild[h], .n = n_build};
          t0 = ra_clock_now_s();
          if (!ix && ra_index_build(&p, &keys, k == X_ROAR ? &bq : NULL, &ix, &err)) {
            fprintf(stderr, "wave-bench: build %s: %s\n", ix_names[k], err.msg);
            return 1;
          }
          double tb = ra_clock_now_s() - t0;
          if (sweep_index(ix, k, &keys, &x, qev, h, threads, &curves[((size_t)li * hq + h) * N_IX + k])) {
            fprintf(stderr, "wave-bench: %s search failed\n", ix_names[k]);
            return 1;
          }
          if (k == X_ROAR || h == g * G) printf("  L%d H%d %s build %.2fs\n", L, h, ix_names[k], tb);
          if (k == X_ROAR) ra_index_free(ix), ix = NULL;
        }
        ra_index_free(ix);
      }
    }
    for (int ci = 0; ci < n_cfg; ci++) {
      if (run_config(be, &o, &m, &T, &x, koff, voff, qev, li, &cfgs[ci], &err)) {
        fprintf(stderr, "wave-bench: cs %d seg %d iters %d: %s\n", cfgs[ci].cs, cfgs[ci].seg, cfgs[ci].iters, err.msg);
        return 1;
      }
    }
    printf("  L%d: %d configs done, cluster_keys %.3fs (first)\n", L, n_cfg, cfgs[0].cluster_s[li]);
    fflush(stdout);
    exact_free(&x);
    ra_tensor_free(&T.kc), ra_tensor_free(&T.vc), ra_tensor_free(&T.q), ra_tensor_free(&T.o), ra_tensor_free(&T.ml);
    for (int g = 0; g < hkv; g++) ra_npy_free(&kn[g]), ra_npy_free(&vn[g]);
    for (int h = 0; h < hq; h++) free(qbuild[h]);
    free(qev);
  }
  int rc = write_json(&o, &m, n_off, n_ev, use_dec ? "decode" : "prompt", cfgs, n_cfg, curves);
  print_table(&o, &m, n_off, n_ev, cfgs, n_cfg, curves);
  printf("wave-bench: %s %s\n", rc ? "could not write" : "wrote", o.json);
  for (int ci = 0; ci < n_cfg; ci++) free(cfgs[ci].hs);
  free(cfgs);
  free(curves);
  ra_backend_destroy(be);
  return rc ? 1 : 0;
}
