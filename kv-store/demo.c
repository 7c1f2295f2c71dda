/* kvstore-demo: drives one or more running kv-stores the way the gpu-worker does, on random KV,
 * and checks the result against attention computed directly.
 *
 *   kvstore-demo --stores HOST:PORT[,HOST:PORT...] [--layers 4] [--q-heads 8] [--kv-heads 2]
 *                [--head-dim 64] [--tokens 4096] [--sink 128] [--window 512] [--dtype f16]
 *                [--top-k 100] [--seed 1] [--store-tls-ca FILE [--store-tls-cert FILE --store-tls-key FILE]]
 *                [--auth-token-file FILE]
 *
 * For every (layer, kv head) the tokens [S, n - W) go to the stores (kv heads dealt round-robin
 * over them); the demo keeps the sink [0, S) and window [n - W, n) itself, as the worker does on
 * its device. Per layer it sends one attend request per store, merges the stores' partials with
 * its own sink + window partial, and compares with softmax attention over all n tokens:
 * `full` must match to rounding, `flat` (exact top-k) shows what retrieval keeps. */
#include "client.h"
#include "half.h"
#include "merge.h"
#include "offload_plan.h"
#include "opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct demo_opts {
  char *stores;
  const char *tls_ca, *tls_cert, *tls_key, *token_file; /* the worker's flags of the same names */
  uint32_t n_layers, n_q_heads, n_kv_heads, head_dim, n_tokens, n_sink, n_window, top_k;
  ra_dtype dtype;
  uint64_t seed;
} demo_opts;

static int usage(const char *msg) {
  if (msg) fprintf(stderr, "kvstore-demo: %s\n", msg);
  fprintf(stderr,
          "usage: kvstore-demo --stores HOST:PORT[,HOST:PORT...] [--layers N] [--q-heads N]\n"
          "                    [--kv-heads N] [--head-dim N] [--tokens N] [--sink N] [--window N]\n"
          "                    [--dtype f32|f16|bf16|int8] [--top-k N] [--seed N]\n"
          "                    [--store-tls-ca FILE [--store-tls-cert FILE --store-tls-key FILE]]\n"
          "                    [--auth-token-file FILE]\n");
  return 2;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
  int64_t v;
  if (ra_opts_parse_int(s, lo, hi, &v, NULL) != RA_OK) return -1;
  *out = (uint32_t)v;
  return 0;
}

static int parse_args(int argc, char **argv, demo_opts *o) {
  *o = (demo_opts){.n_layers = 4, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64, .n_tokens = 4096,
                   .n_sink = 128, .n_window = 512, .top_k = 100, .dtype = RA_DTYPE_F16, .seed = 1};
  static const struct {
    const char *flag;
    size_t off;
    uint32_t lo, hi;
  } nums[] = {
      {"--layers", offsetof(demo_opts, n_layers), 1, 256},
      {"--q-heads", offsetof(demo_opts, n_q_heads), 1, 256},
      {"--kv-heads", offsetof(demo_opts, n_kv_heads), 1, 256},
      {"--head-dim", offsetof(demo_opts, head_dim), 1, 1024},
      {"--tokens", offsetof(demo_opts, n_tokens), 1, 1u << 22},
      {"--sink", offsetof(demo_opts, n_sink), 0, 1u << 20},
      {"--window", offsetof(demo_opts, n_window), 0, 1u << 20},
      {"--top-k", offsetof(demo_opts, top_k), 1, 1u << 20},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int matched = 0;
    for (size_t j = 0; j < sizeof nums / sizeof nums[0] && !matched; j++) {
      if (strcmp(a, nums[j].flag) != 0) continue;
      matched = 1;
      if (!v || parse_u32(v, nums[j].lo, nums[j].hi, (uint32_t *)((char *)o + nums[j].off))) {
        fprintf(stderr, "kvstore-demo: %s wants an integer in [%u, %u]\n", a, nums[j].lo, nums[j].hi);
        return -1;
      }
    }
    if (matched) {
      i++;
    } else if (!strcmp(a, "--stores") && v) {
      o->stores = argv[++i];
    } else if (!strcmp(a, "--dtype") && v) {
      if (ra_dtype_parse(argv[++i], &o->dtype)) return usage("--dtype wants f32, f16, bf16 or int8"), -1;
    } else if (!strcmp(a, "--seed") && v) {
      o->seed = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(a, "--store-tls-ca") && v) {
      o->tls_ca = argv[++i];
    } else if (!strcmp(a, "--store-tls-cert") && v) {
      o->tls_cert = argv[++i];
    } else if (!strcmp(a, "--store-tls-key") && v) {
      o->tls_key = argv[++i];
    } else if (!strcmp(a, "--auth-token-file") && v) {
      o->token_file = argv[++i];
    } else {
      char msg[160];
      snprintf(msg, sizeof msg, "unknown or incomplete argument '%s'", a);
      return usage(msg), -1;
    }
  }
  if (!o->stores) return usage("--stores is required"), -1;
  if (o->n_q_heads % o->n_kv_heads) return usage("--q-heads must be a multiple of --kv-heads"), -1;
  if ((uint64_t)o->n_sink + o->n_window >= o->n_tokens)
    return usage("--tokens must exceed --sink + --window, or nothing is offloaded"), -1;
  return 0;
}

/* Deterministic N(0,1)-ish values (sum of uniforms) from a splitmix64 stream. */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill_normal(float *x, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++) {
    double u = 0;
    for (int j = 0; j < 4; j++) u += (double)(splitmix64(s) >> 11) * 0x1p-53;
    x[i] = (float)((u - 2.0) * 1.7320508);
  }
}

/* The demo's copy of one (layer, kv head): fp32 values rounded to the dtype (so the reference
 * sees what the store stores) and the packed bytes that are sent. */
typedef struct head_kv {
  float *k, *v;      /* [n, head_dim] */
  void *pk, *pv;     /* [n, head_dim] dtype */
} head_kv;

static int head_kv_make(head_kv *h, const demo_opts *o, uint64_t seed) {
  size_t n = (size_t)o->n_tokens * o->head_dim;
  size_t bytes = (size_t)o->n_tokens * ra_dtype_row_bytes(o->dtype, o->head_dim);
  h->k = malloc(n * sizeof(float));
  h->v = malloc(n * sizeof(float));
  h->pk = malloc(bytes);
  h->pv = malloc(bytes);
  if (!h->k || !h->v || !h->pk || !h->pv) return RA_ENOMEM;
  uint64_t s = seed;
  fill_normal(h->k, n, &s);
  fill_normal(h->v, n, &s);
  if (ra_dtype_rows_from_fp32(o->dtype, h->k, h->pk, o->n_tokens, o->head_dim, NULL) ||
      ra_dtype_rows_from_fp32(o->dtype, h->v, h->pv, o->n_tokens, o->head_dim, NULL))
    return RA_EINTERNAL; /* finite normal samples always quantize */
  ra_dtype_rows_to_fp32(o->dtype, h->pk, h->k, o->n_tokens, o->head_dim);
  ra_dtype_rows_to_fp32(o->dtype, h->pv, h->v, o->n_tokens, o->head_dim);
  return RA_OK;
}

static void head_kv_free(head_kv *h) {
  free(h->k);
  free(h->v);
  free(h->pk);
  free(h->pv);
}

typedef struct demo {
  demo_opts o;
  ra_shard_map map;
  ra_offload_plan plan;
  ra_kvclient **clients;
  ra_kvclient_session *sessions;
  ra_kvclient_stream **streams;
  head_kv *kv; /* [n_layers * n_kv_heads] */
} demo;

static int demo_connect_and_fill(demo *d, ra_error *err) {
  const demo_opts *o = &d->o;
  ra_kvclient_geometry geo = {o->n_layers, o->n_q_heads, o->n_kv_heads, o->head_dim, o->dtype};
  size_t n_stores = d->plan.n_stores;
  uint64_t off_begin, off_end;
  ra_offload_plan_range(&d->plan, o->n_tokens, &off_begin, &off_end);
  ra_kvclient_options copt = {0};
  ra_kvclient_secrets secrets;
  int lrc = ra_kvclient_options_load(&copt, o->tls_ca, o->tls_cert, o->tls_key, o->token_file, &secrets, err);
  if (lrc) return lrc;
  /* the channels copy what they need of the secrets */
  for (size_t s = 0; s < n_stores && lrc == RA_OK; s++)
    lrc = ra_kvclient_connect(d->plan.stores[s].addr, &copt, &d->clients[s], err);
  ra_kvclient_secrets_free(&secrets);
  if (lrc) return lrc;
  for (size_t s = 0; s < n_stores; s++) {
    const ra_plan_store *ps = &d->plan.stores[s];
    int serving = 0;
    int rc = ra_kvclient_health(d->clients[s], &serving, err);
    if (rc != RA_OK) return rc;
    ra_kvclient_shard *shards = calloc(ps->n_shards ? ps->n_shards : 1, sizeof *shards);
    ra_kvclient_rows *rows = calloc(ps->n_shards ? ps->n_shards : 1, sizeof *rows);
    if (!shards || !rows) {
      free(shards);
      free(rows);
      return ra_errorf(err, RA_ENOMEM, "out of memory");
    }
    size_t n_rows = 0;
    size_t row_bytes = ra_dtype_row_bytes(o->dtype, o->head_dim);
    for (size_t i = 0; i < ps->n_shards; i++) {
      const ra_plan_shard *sh = &ps->shards[i];
      shards[i] = (ra_kvclient_shard){sh->layer, sh->kv_head, sh->token_begin, sh->token_end};
      uint64_t b = sh->token_begin, e = sh->token_end < off_end ? sh->token_end : off_end;
      if (b >= e) continue;
      const head_kv *h = &d->kv[(size_t)sh->layer * o->n_kv_heads + sh->kv_head];
      rows[n_rows++] = (ra_kvclient_rows){sh->layer, sh->kv_head, b, e - b,
                                          (const char *)h->pk + b * row_bytes,
                                          (const char *)h->pv + b * row_bytes};
    }
    uint64_t t0 = uv_hrtime(), stored = 0;
    rc = ra_kvclient_open_session(d->clients[s], &geo, shards, ps->n_shards, "kvstore-demo",
                                  &d->sessions[s], err);
    if (rc == RA_OK) rc = ra_kvclient_put_kv(d->clients[s], &d->sessions[s], rows, n_rows, &stored, err);
    if (rc == RA_OK) rc = ra_kvclient_attend_open(d->clients[s], &d->sessions[s], &d->streams[s], err);
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    free(shards);
    free(rows);
    if (rc != RA_OK) return rc;
    printf("store %-21s %zu shards, %llu tokens stored in %.3f s (%.2f GB/s)\n", ps->addr,
           ps->n_shards, (unsigned long long)stored, secs,
           (double)stored * 2.0 * (double)row_bytes / secs / 1e9);
  }
  return RA_OK;
}

/* Attends one layer in `mode` through every store, merges with the local sink + window partial,
 * and compares with direct attention over all tokens: *max_err gets the largest |merged - direct|
 * over all heads, *min_mass the smallest share of a head's softmax mass that the attended tokens
 * carry (1 for full; what retrieval kept for flat), *us the slowest store's round trip and
 * *scanned the keys the stores scored. */
static int demo_attend_layer(demo *d, uint32_t layer, ra_mode mode, const float *q,
                             float *max_err, float *min_mass, double *us, uint64_t *scanned,
                             ra_error *err) {
  const demo_opts *o = &d->o;
  uint32_t hd = o->head_dim, group = o->n_q_heads / o->n_kv_heads;
  float scale = 1.0f / sqrtf((float)hd);
  uint64_t off_begin, off_end;
  ra_offload_plan_range(&d->plan, o->n_tokens, &off_begin, &off_end);
  size_t nq = o->n_q_heads;
  float *o_acc = calloc(nq * hd, sizeof(float)), *o_in = calloc(nq * hd, sizeof(float));
  float *o_ref = calloc(hd, sizeof(float));
  uint32_t *heads = calloc(nq, sizeof *heads);
  float *qs = calloc(nq * hd, sizeof(float));
  ra_head_partial *parts = calloc(nq, sizeof *parts);
  ra_partial *acc = calloc(nq, sizeof *acc);
  int rc = RA_OK;
  if (!o_acc || !o_in || !o_ref || !heads || !qs || !parts || !acc) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
  /* The local part: sink [0, S) and window [off_end, n) of each head. */
  for (size_t h = 0; h < nq && rc == RA_OK; h++) {
    const head_kv *kv = &d->kv[(size_t)layer * o->n_kv_heads + h / group];
    acc[h].o = o_acc + h * hd;
    ra_partial sink = {.o = o_in + h * hd}, win = {.o = o_ref};
    ra_partial_attend_f32(q + h * hd, kv->k, kv->v, o->n_sink, (int)hd, scale, &sink);
    ra_partial_attend_f32(q + h * hd, kv->k + off_end * hd, kv->v + off_end * hd, o->n_tokens - off_end,
                          (int)hd, scale, &win);
    ra_partial_reset(&acc[h], (int)hd);
    ra_partial_merge(&acc[h], sink.o, sink.m, sink.l, (int)hd);
    ra_partial_merge(&acc[h], win.o, win.m, win.l, (int)hd);
  }
  *us = 0;
  *scanned = 0;
  for (size_t s = 0; s < d->plan.n_stores && rc == RA_OK; s++) {
    size_t n = 0;
    for (uint32_t h = 0; h < nq; h++) {
      if (!ra_offload_plan_asks(&d->plan, s, layer, h)) continue;
      heads[n] = h;
      memcpy(qs + n * hd, q + (size_t)h * hd, hd * sizeof(float));
      parts[n] = (ra_head_partial){.part.o = o_in + n * hd};
      n++;
    }
    if (n == 0) continue;
    ra_kvclient_attend_req req = {.layer = layer, .q_heads = heads, .n_heads = n, .q = qs,
                                  .mode = mode, .top_k = o->top_k};
    uint64_t t0 = uv_hrtime();
    rc = ra_kvclient_attend(d->streams[s], &req, parts, 10000, NULL, err);
    double t = (double)(uv_hrtime() - t0) / 1e3;
    if (t > *us) *us = t;
    for (size_t i = 0; i < n && rc == RA_OK; i++) {
      ra_partial_merge_from(&acc[heads[i]], &parts[i].part, (int)hd);
      *scanned += parts[i].n_scanned;
    }
  }
  *max_err = 0;
  *min_mass = 1;
  for (size_t h = 0; h < nq && rc == RA_OK; h++) {
    const head_kv *kv = &d->kv[(size_t)layer * o->n_kv_heads + h / group];
    ra_partial full = {.o = o_ref};
    ra_partial_attend_f32(q + h * hd, kv->k, kv->v, o->n_tokens, (int)hd, scale, &full);
    for (uint32_t j = 0; j < hd; j++) *max_err = fmaxf(*max_err, fabsf(acc[h].o[j] - full.o[j]));
    /* mass = l exp(m): the share is exact even when the exponents are large */
    *min_mass = fminf(*min_mass, acc[h].l * expf(acc[h].m - full.m) / full.l);
  }
  free(o_acc);
  free(o_in);
  free(o_ref);
  free(heads);
  free(qs);
  free(parts);
  free(acc);
  return rc;
}

/* Queries of one layer, q: [n_q_heads, head_dim]. Real attention is peaked: a query points at a
 * few keys. Each head's query is 2.5 x the sum of 2 of its kv head's keys, anywhere in the
 * context, plus a little noise, so most of the softmax mass sits on those keys. */
static void demo_make_queries(const demo *d, uint32_t layer, float *q, uint64_t *s) {
  const demo_opts *o = &d->o;
  uint32_t hd = o->head_dim, group = o->n_q_heads / o->n_kv_heads;
  fill_normal(q, (size_t)o->n_q_heads * hd, s);
  for (size_t i = 0; i < (size_t)o->n_q_heads * hd; i++) q[i] *= 0.1f;
  for (uint32_t h = 0; h < o->n_q_heads; h++) {
    const head_kv *kv = &d->kv[(size_t)layer * o->n_kv_heads + h / group];
    for (int j = 0; j < 2; j++) {
      uint64_t t = splitmix64(s) % o->n_tokens;
      for (uint32_t x = 0; x < hd; x++) q[(size_t)h * hd + x] += 2.5f * kv->k[t * hd + x];
    }
  }
}

static int demo_run(demo *d, ra_error *err) {
  const demo_opts *o = &d->o;
  size_t n_heads_kv = (size_t)o->n_layers * o->n_kv_heads;
  d->kv = calloc(n_heads_kv, sizeof *d->kv);
  if (!d->kv) return ra_errorf(err, RA_ENOMEM, "out of memory");
  for (size_t i = 0; i < n_heads_kv; i++)
    if (head_kv_make(&d->kv[i], o, o->seed * 1000003u + i) != RA_OK)
      return ra_errorf(err, RA_ENOMEM, "out of memory for %u tokens of KV", o->n_tokens);

  int rc = ra_shard_map_spread_list(o->stores, o->n_layers, o->n_kv_heads, &d->map, err);
  if (rc == RA_OK)
    rc = ra_offload_plan_build(&d->map, o->n_layers, o->n_q_heads, o->n_kv_heads, o->n_sink,
                               o->n_window, &d->plan, err);
  if (rc != RA_OK) return rc;
  d->clients = calloc(d->plan.n_stores, sizeof *d->clients);
  d->sessions = calloc(d->plan.n_stores, sizeof *d->sessions);
  d->streams = calloc(d->plan.n_stores, sizeof *d->streams);
  if (!d->clients || !d->sessions || !d->streams) return ra_errorf(err, RA_ENOMEM, "out of memory");

  uint64_t off_begin, off_end;
  ra_offload_plan_range(&d->plan, o->n_tokens, &off_begin, &off_end);
  printf("geometry: %u layers, %u q heads, %u kv heads, head_dim %u, %s; %u tokens: sink [0, %u), "
         "offloaded [%llu, %llu) over %zu stores, window [%llu, %u)\n",
         o->n_layers, o->n_q_heads, o->n_kv_heads, o->head_dim, ra_dtype_name(o->dtype), o->n_tokens,
         o->n_sink, (unsigned long long)off_begin, (unsigned long long)off_end, d->plan.n_stores,
         (unsigned long long)off_end, o->n_tokens);
  if ((rc = demo_connect_and_fill(d, err)) != RA_OK) return rc;

  float *q = malloc((size_t)o->n_q_heads * o->head_dim * sizeof(float));
  if (!q) return ra_errorf(err, RA_ENOMEM, "out of memory");
  uint64_t s = o->seed ^ 0x5eed;
  float worst_full = 0;
  printf("%-6s %-5s %12s %11s %14s %12s\n", "layer", "mode", "max|err|", "mass kept", "keys scanned",
         "round trip");
  for (uint32_t l = 0; l < o->n_layers && rc == RA_OK; l++) {
    demo_make_queries(d, l, q, &s);
    for (int m = 0; m < 2 && rc == RA_OK; m++) {
      ra_mode mode = m ? RA_MODE_FLAT : RA_MODE_FULL;
      float e, mass;
      double us;
      uint64_t scanned;
      rc = demo_attend_layer(d, l, mode, q, &e, &mass, &us, &scanned, err);
      if (rc != RA_OK) break;
      if (!m && e > worst_full) worst_full = e;
      printf("%-6u %-5s %12.2e %10.1f%% %14llu %9.0f us\n", l, m ? "flat" : "full", e, 100.0 * mass,
             (unsigned long long)scanned, us);
    }
  }
  free(q);
  if (rc != RA_OK) return rc;
  float tol = o->dtype == RA_DTYPE_F32 ? 1e-5f : 2e-3f;
  printf("full mode: largest error %.2e against direct attention (tolerance %.0e): %s\n", worst_full, tol,
         worst_full <= tol ? "exact" : "MISMATCH");
  return worst_full <= tol ? RA_OK : ra_errorf(err, RA_EINTERNAL, "merged attention differs from direct attention");
}

static void demo_free(demo *d) {
  for (size_t s = 0; s < d->plan.n_stores; s++) {
    ra_error err;
    if (d->streams && d->streams[s]) ra_kvclient_attend_close(d->streams[s]);
    if (d->clients && d->clients[s]) {
      if (d->sessions[s].geo.n_layers) ra_kvclient_close_session(d->clients[s], &d->sessions[s], NULL, &err);
      ra_kvclient_close(d->clients[s]);
    }
  }
  for (size_t i = 0; d->kv && i < (size_t)d->o.n_layers * d->o.n_kv_heads; i++) head_kv_free(&d->kv[i]);
  free(d->kv);
  free(d->clients);
  free(d->sessions);
  free(d->streams);
  ra_offload_plan_free(&d->plan);
  ra_shard_map_free(&d->map);
}

int main(int argc, char **argv) {
  demo d;
  memset(&d, 0, sizeof d);
  if (parse_args(argc, argv, &d.o)) return 2;
  ra_error err;
  ra_error_clear(&err);
  int rc = demo_run(&d, &err);
  demo_free(&d);
  if (rc != RA_OK) {
    fprintf(stderr, "kvstore-demo: %s\n", err.msg);
    return 1;
  }
  return 0;
}
