/* wave-scan-bench: the store's side of a wave decode step for one layer, in process: the exact
 * partials of every q head of `kv-heads` kv heads over `select` clusters per kv head (picked at
 * random each step, as a decode's picks scatter over the context) plus `lag` unclustered rows,
 * through kvs_attend as the service calls it.
 *
 *   wave-scan-bench [--tokens 130000] [--layers 8] [--kv-heads 4] [--group 4] [--dim 128] [--dtype bf16|f16|f32|int8]
 *                   [--cluster 16] [--select 147] [--lag 512] [--threads 7] [--steps 64]
 *                   [--seed 1] [--gap-us 0] [--kernels avx512|avx2|portable] [--json FILE]
 *
 * Each step attends the next layer (rows of `layers` layers stored, so that they come from
 * memory, not cache, as in a decode); --gap-us idles before each attend as a store does while
 * the device computes the rest of a layer, so that the attend's threads have gone to sleep.
 * Defaults: one of two stores of Llama-3-8B at 128K (8 kv heads dealt over two stores, 4 q heads
 * each, RetroInfer's 1.8 % of 16-token clusters). Reported: the median / p10 / p90 wall
 * time of one attend, the rows it read and the K/V bytes per second. Runs itself again with
 * OMP_WAIT_POLICY=passive, as kv-store/main.c does. Prints JSON. */
#include "attend.h"
#include "clock.h"
#include "clusters.h"
#include "opts.h"
#include "procenv.h"
#include "store.h"
#include "vec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
  int64_t tokens, layers, kv_heads, group, dim, cluster, select, lag, threads, steps, seed, gap_us;
  ra_dtype dtype;
  const char *json, *kernels;
} opts;

static const char *dtype_name(int v) { return ra_dtype_name((ra_dtype)v); }

#define AT(m) RA_OPT_AT(opts, m)
static const ra_opt opt_rows[] = {
    {"tokens", RA_OPT_INT, AT(tokens), .lo = 1024, .hi = 1 << 26, .meta = "N", .help = "rows per kv head and layer"},
    {"layers", RA_OPT_INT, AT(layers), .lo = 1, .hi = 1024, .meta = "N", .help = "layers stored (steps cycle them)"},
    {"kv-heads", RA_OPT_INT, AT(kv_heads), .lo = 1, .hi = 64, .meta = "N", .help = "kv heads of the store"},
    {"group", RA_OPT_INT, AT(group), .lo = 1, .hi = 16, .meta = "N", .help = "q heads per kv head"},
    {"dim", RA_OPT_INT, AT(dim), .lo = 64, .hi = 128, .meta = "N", .help = "head_dim (a multiple of 16)"},
    {"dtype", RA_OPT_ENUM, AT(dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_I8, .name_of = dtype_name,
     .help = "K/V dtype"},
    {"cluster", RA_OPT_INT, AT(cluster), .lo = 1, .hi = 4096, .meta = "N", .help = "rows per cluster"},
    {"select", RA_OPT_INT, AT(select), .lo = 0, .hi = 1 << 24, .meta = "N", .help = "clusters per kv head a step"},
    {"lag", RA_OPT_INT, AT(lag), .lo = 0, .hi = 1 << 20, .meta = "N", .help = "unclustered rows per kv head"},
    {"threads", RA_OPT_INT, AT(threads), .lo = 1, .hi = 1024, .meta = "N", .help = "the attend's threads"},
    {"steps", RA_OPT_INT, AT(steps), .lo = 1, .hi = 100000, .meta = "N", .help = "timed attends"},
    {"gap-us", RA_OPT_INT, AT(gap_us), .lo = 0, .hi = 1000000, .meta = "N", .help = "idle microseconds between attends"},
    {"seed", RA_OPT_INT, AT(seed), .lo = 0, .hi = INT32_MAX, .meta = "N", .help = "rows, queries and picks"},
    {"kernels", RA_OPT_STRING, AT(kernels), .meta = "SET",
     .help = "vector kernels: avx512, avx2 or portable (default: the best this CPU has)"},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "write the JSON there instead of stdout"},
};
#undef AT

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.tokens = 130000, .layers = 8, .kv_heads = 4, .group = 4, .dim = 128, .cluster = 16, .select = 147,
              .lag = 512, .threads = 7, .steps = 64, .seed = 1, .dtype = RA_DTYPE_BF16};
  ra_opts_table t = {opt_rows, RA_OPTS_COUNT(opt_rows), o, NULL};
  ra_opts_set set = {&t, 1, NULL, 0};
  ra_error err;
  const char *why = NULL;
  if (ra_opts_parse_args(&set, argc - 1, argv + 1, &err)) why = err.msg;
  else if (o->dim % 16) why = "--dim must be a multiple of 16";
  else if (o->lag >= o->tokens) why = "--lag must be below --tokens";
  else if (o->kernels && ra_vec_use_kernels(o->kernels) != RA_OK)
    why = "--kernels: not a kernel set this CPU has (avx512, avx2, portable)";
  if (!why) return 0;
  fprintf(stderr, "wave-scan-bench: %s\nusage: wave-scan-bench [options]\n", why);
  ra_opts_usage(&set, stderr);
  return 2;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Writes rows [0, n) of every kv head (uniform noise) and clusters all but the last `lag` in
 * runs of `cluster`; the cluster count per kv head into *n_clusters. */
static int fill(kvs_session *s, const opts *o, uint64_t *rng, uint32_t *n_clusters, ra_error *err) {
  const size_t row = ra_dtype_row_bytes(o->dtype, (size_t)o->dim), chunk = 4096;
  float *f = malloc(chunk * (size_t)o->dim * sizeof *f);
  void *k = malloc(chunk * row), *v = malloc(chunk * row);
  int rc = f && k && v ? RA_OK : ra_errorf(err, RA_ENOMEM, "out of memory for the rows");
  for (int64_t lh = 0; lh < o->layers * o->kv_heads && rc == RA_OK; lh++)
    for (int64_t r0 = 0; r0 < o->tokens && rc == RA_OK; r0 += (int64_t)chunk) {
      const size_t n = (size_t)(o->tokens - r0 < (int64_t)chunk ? o->tokens - r0 : (int64_t)chunk);
      for (size_t i = 0; i < n * (size_t)o->dim; i++)
        f[i] = (float)((double)(rng_next(rng) >> 11) / 9007199254740992.0 - 0.5);
      rc = ra_dtype_rows_from_fp32(o->dtype, f, k, n, (size_t)o->dim, NULL);
      if (rc == RA_OK) rc = ra_dtype_rows_from_fp32(o->dtype, f, v, n, (size_t)o->dim, NULL);
      if (rc) {
        rc = ra_errorf(err, rc, "rows of layer %lld kv head %lld have no %s form", (long long)(lh / o->kv_heads),
                       (long long)(lh % o->kv_heads), ra_dtype_name(o->dtype));
        break;
      }
      kvs_rows r = {.layer = (uint32_t)(lh / o->kv_heads), .kv_head = (uint32_t)(lh % o->kv_heads), .token_begin = (uint64_t)r0, .n = n, .keys = k, .values = v};
      rc = kvs_session_write(s, &r, 1, NULL, err);
    }
  const int64_t clustered = o->tokens - o->lag, nc = clustered / o->cluster;
  uint32_t *counts = malloc((size_t)(nc ? nc : 1) * sizeof *counts);
  if (rc == RA_OK && !counts) rc = ra_errorf(err, RA_ENOMEM, "out of memory for the clusters");
  for (int64_t c = 0; rc == RA_OK && c < nc; c++) counts[c] = (uint32_t)o->cluster;
  for (int64_t lh = 0; lh < o->layers * o->kv_heads && rc == RA_OK && nc > 0; lh++) {
    kvs_cluster_put p = {.layer = (uint32_t)(lh / o->kv_heads), .kv_head = (uint32_t)(lh % o->kv_heads), .first_cluster = 0, .row_begin = 0, .counts = counts,
                         .n_clusters = (size_t)nc};
    rc = kvs_session_put_clusters(s, &p, NULL, err);
  }
  *n_clusters = (uint32_t)nc;
  free(counts);
  free(f);
  free(k);
  free(v);
  return rc;
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv);
  opts o;
  if (parse_opts(argc, argv, &o)) return 2;
  ra_error err = {0};
  const uint32_t hq = (uint32_t)(o.kv_heads * o.group);
  kvs_geometry g = {.n_layers = (uint32_t)o.layers, .n_q_heads = hq, .n_kv_heads = (uint32_t)o.kv_heads,
                    .head_dim = (uint32_t)o.dim, .dtype = o.dtype};
  const size_t n_shards = (size_t)(o.layers * o.kv_heads);
  kvs_shard_spec *sh = calloc(n_shards, sizeof *sh);
  for (size_t i = 0; sh && i < n_shards; i++)
    sh[i] = (kvs_shard_spec){.layer = (uint32_t)(i / (size_t)o.kv_heads), .kv_head = (uint32_t)(i % (size_t)o.kv_heads),
                             .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  kvs_store *st = NULL;
  kvs_session *s = NULL;
  uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)o.seed;
  uint32_t nc = 0;
  int rc = sh ? RA_OK : ra_errorf(&err, RA_ENOMEM, "out of memory");
  if (rc == RA_OK) rc = kvs_store_create(UINT64_MAX / 2, &st, &err);
  if (rc == RA_OK) rc = kvs_store_open(st, &g, sh, n_shards, NULL, "wave-scan-bench", &s, &err);
  if (rc == RA_OK) rc = fill(s, &o, &rng, &nc, &err);
  if (rc == RA_OK && o.select > nc) rc = ra_errorf(&err, RA_EINVAL, "--select %lld above the %u clusters a head holds",
                                                   (long long)o.select, nc);
  const size_t n_sel = (size_t)o.select * (size_t)o.kv_heads;
  uint32_t *heads = malloc(hq * sizeof *heads), *kvh = malloc((size_t)o.kv_heads * sizeof *kvh),
           *counts = malloc((size_t)o.kv_heads * sizeof *counts), *ids = malloc((n_sel ? n_sel : 1) * sizeof *ids);
  uint8_t *taken = calloc(nc ? nc : 1, 1);
  float *q = malloc((size_t)hq * (size_t)o.dim * sizeof *q);
  uint64_t *us = malloc((size_t)o.steps * sizeof *us);
  if (rc == RA_OK && (!heads || !kvh || !counts || !ids || !taken || !q || !us))
    rc = ra_errorf(&err, RA_ENOMEM, "out of memory");
  uint64_t rows = 0;
  for (int64_t step = 0; rc == RA_OK && step < o.steps; step++) {
    for (uint32_t i = 0; i < hq; i++) heads[i] = i;
    for (size_t i = 0; i < (size_t)hq * (size_t)o.dim; i++)
      q[i] = (float)((double)(rng_next(&rng) >> 11) / 9007199254740992.0 - 0.5) * 8.0f;
    for (int64_t h = 0; h < o.kv_heads; h++) {
      kvh[h] = (uint32_t)h;
      counts[h] = (uint32_t)o.select;
      memset(taken, 0, nc);
      for (int64_t j = 0; j < o.select; j++) {
        uint32_t c;
        do c = (uint32_t)(rng_next(&rng) % nc);
        while (taken[c]);
        taken[c] = 1;
        ids[h * o.select + j] = c;
      }
    }
    kvs_attend_args a = {.layer = (uint32_t)(step % o.layers), .q_heads = heads, .n_heads = hq, .q = q, .mode = RA_MODE_WAVE,
                         .n_threads = (int)o.threads,
                         .wave = {.kv_heads = kvh, .counts = counts, .n_heads = (size_t)o.kv_heads, .ids = ids,
                                  .n_ids = n_sel}};
    kvs_attend_result res;
    if (o.gap_us) {
      struct timespec gap = {(time_t)(o.gap_us / 1000000), (long)(o.gap_us % 1000000) * 1000};
      nanosleep(&gap, NULL);
    }
    const uint64_t t0 = ra_clock_now_us();
    rc = kvs_attend(s, &a, &res, &err);
    us[step] = ra_clock_now_us() - t0;
    if (rc == RA_OK) {
      rows = 0;
      for (size_t i = 0; i < res.n_heads; i += (size_t)o.group) rows += res.heads[i].n_scanned;
      kvs_attend_result_free(&res);
    }
  }
  if (rc == RA_OK) {
    qsort(us, (size_t)o.steps, sizeof *us, cmp_u64);
    const double med = (double)us[o.steps / 2], p10 = (double)us[o.steps / 10], p90 = (double)us[o.steps * 9 / 10];
    const double bytes = (double)rows * 2.0 * (double)ra_dtype_row_bytes(o.dtype, (size_t)o.dim);
    FILE *f = o.json ? fopen(o.json, "w") : stdout;
    if (!f) rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
    if (rc == RA_OK) {
      fprintf(f,
              "{\"bench\": \"wave-scan\", \"tokens\": %lld, \"layers\": %lld, \"kv_heads\": %lld, \"group\": %lld, \"dim\": %lld, "
              "\"dtype\": \"%s\", \"cluster\": %lld, \"clusters_per_head\": %u, \"select\": %lld, \"lag\": %lld, "
              "\"threads\": %lld, \"gap_us\": %lld, \"kernels\": \"%s\", \"steps\": %lld, \"rows_per_attend\": %llu, \"median_us\": %.0f, "
              "\"p10_us\": %.0f, \"p90_us\": %.0f, \"kv_gb_per_s\": %.2f, \"ns_per_row\": %.1f}\n",
              (long long)o.tokens, (long long)o.layers, (long long)o.kv_heads, (long long)o.group, (long long)o.dim,
              ra_dtype_name(o.dtype), (long long)o.cluster, nc, (long long)o.select, (long long)o.lag,
              (long long)o.threads, (long long)o.gap_us, ra_vec_kernel_name(), (long long)o.steps, (unsigned long long)rows, med, p10, p90,
              bytes / (med * 1e3), med * 1e3 / (double)(rows ? rows : 1));
      if (f != stdout) fclose(f);
    }
  }
  free(heads);
  free(kvh);
  free(counts);
  free(ids);
  free(taken);
  free(q);
  free(us);
  if (s) kvs_session_release(s);
  if (st) kvs_store_destroy(st);
  free(sh);
  if (rc) {
    fprintf(stderr, "wave-scan-bench: %s\n", err.msg);
    return 1;
  }
  return 0;
}
