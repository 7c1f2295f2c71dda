/* wave-select-bench: the device's share of a wave decode step for one layer — the zone selection
 * (centroid scores, the group softmax, the ranking) with its fused estimate — alone, on a
 * backend, over random centroids.
 *
 *   wave-select-bench [--backend cuda|cpu] [--kv-heads 8] [--group 4] [--dim 128]
 *                     [--clusters 8192,65536] [--retrieve 147] [--estimate 1878] [--reps 50]
 *                     [--json FILE]
 *
 * For every cluster count: the median / p90 wall time of wave_select (it returns after the host
 * has the ids) with the estimate, and without it (e = 0, retrieval only). Prints JSON. */
#include "backend.h"
#include "clock.h"
#include "opts.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COUNTS 8

typedef struct opts {
  const char *backend, *json;
  int64_t kv_heads, group, dim, retrieve, estimate, reps;
  int64_t clusters[MAX_COUNTS];
  int n_counts;
} opts;

/* --clusters N[,N...] */
static int counts_parse(const char *v, void *field, ra_error *err) {
  opts *o = (opts *)((char *)field - offsetof(opts, clusters));
  return ra_opts_parse_int_list(v, 1, 1 << 24, o->clusters, MAX_COUNTS, &o->n_counts, err);
}

#define AT(m) RA_OPT_AT(opts, m)
static const ra_opt opt_rows[] = {
    {"backend", RA_OPT_STRING, AT(backend), .meta = "cuda|cpu", .help = "the backend timed"},
    {"kv-heads", RA_OPT_INT, AT(kv_heads), .lo = 1, .hi = 64, .meta = "N", .help = "kv heads"},
    {"group", RA_OPT_INT, AT(group), .lo = 1, .hi = 16, .meta = "N", .help = "q heads per kv head"},
    {"dim", RA_OPT_INT, AT(dim), .lo = 16, .hi = 256, .meta = "N", .help = "head_dim"},
    {"clusters", RA_OPT_CUSTOM, AT(clusters), .parse = counts_parse, .meta = "N[,N...]",
     .help = "cluster counts per kv head, each timed", .dflt = "8192,65536"},
    {"retrieve", RA_OPT_INT, AT(retrieve), .lo = 0, .hi = 1 << 20, .meta = "N", .help = "retrieval clusters"},
    {"estimate", RA_OPT_INT, AT(estimate), .lo = 0, .hi = 1 << 20, .meta = "N", .help = "estimation clusters"},
    {"reps", RA_OPT_INT, AT(reps), .lo = 1, .hi = 100000, .meta = "N", .help = "timed calls"},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "write the JSON there instead of stdout"},
};
#undef AT

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.backend = "cuda", .kv_heads = 8, .group = 4, .dim = 128, .retrieve = 147, .estimate = 1878,
              .reps = 50, .clusters = {8192, 65536}, .n_counts = 2};
  ra_opts_table t = {opt_rows, RA_OPTS_COUNT(opt_rows), o, NULL};
  ra_opts_set set = {&t, 1, NULL, 0};
  ra_error err;
  const char *why = NULL;
  if (ra_opts_parse_args(&set, argc - 1, argv + 1, &err)) why = err.msg;
  else if (o->retrieve + o->estimate < 1) why = "--retrieve + --estimate must be at least 1";
  if (!why) return 0;
  fprintf(stderr, "wave-select-bench: %s\nusage: wave-select-bench [options]\n", why);
  ra_opts_usage(&set, stderr);
  return 2;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static float rng_unit(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0) - 0.5f; }

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct timing {
  double med_us, p90_us;
} timing;

/* reps calls of wave_select with (r, e); the median and p90 of their wall times. */
static int time_select(ra_backend *be, const ra_tensor *q, const ra_tensor *cen, const ra_tensor *size,
                       const ra_tensor *vsum, ra_tensor *o, ra_tensor *ml, int64_t nc, int r, int e, int32_t *idx,
                       int reps, timing *t, ra_error *err) {
  double *us = malloc((size_t)reps * sizeof *us);
  if (!us) return ra_errorf(err, RA_ENOMEM, "out of memory");
  int rc = RA_OK;
  for (int i = -2; i < reps && rc == RA_OK; i++) { /* two warm-up calls */
    const uint64_t t0 = ra_clock_now_us();
    rc = be->ops->wave_select(be, q, cen, size, nc, 0.088f, r, e, idx, e ? vsum : NULL, e ? o : NULL,
                              e ? ml : NULL, err);
    if (i >= 0) us[i] = (double)(ra_clock_now_us() - t0);
  }
  if (rc == RA_OK) {
    qsort(us, (size_t)reps, sizeof *us, cmp_double);
    t->med_us = us[reps / 2];
    t->p90_us = us[reps * 9 / 10];
  }
  free(us);
  return rc;
}

int main(int argc, char **argv) {
  opts o;
  if (parse_opts(argc, argv, &o)) return 2;
  ra_error err = {0};
  ra_backend *be = NULL;
  ra_backend_config bc = {0};
  int rc = ra_backend_create(o.backend, &bc, &be, &err);
  if (rc == RA_EUNAVAIL) {
    printf("SKIP: %s\n", err.msg);
    return 77;
  }
  FILE *f = stdout;
  if (rc == RA_OK && o.json && !(f = fopen(o.json, "w"))) rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
  if (rc == RA_OK)
    fprintf(f,
            "{\"bench\": \"wave-select\", \"backend\": \"%s\", \"kv_heads\": %lld, \"group\": %lld, \"dim\": %lld, "
            "\"retrieve\": %lld, \"estimate\": %lld, \"reps\": %lld, \"runs\": [",
            o.backend, (long long)o.kv_heads, (long long)o.group, (long long)o.dim, (long long)o.retrieve,
            (long long)o.estimate, (long long)o.reps);
  uint64_t rng = 0x2545f4914f6cdd1dull;
  const int64_t hq = o.kv_heads * o.group;
  for (int ci = 0; ci < o.n_counts && rc == RA_OK; ci++) {
    const int64_t nc = o.clusters[ci];
    ra_tensor q = {0}, cen = {0}, size = {0}, vsum = {0}, out = {0}, ml = {0};
    const int64_t sq[2] = {hq, o.dim}, sc[3] = {o.kv_heads, nc, o.dim}, ss[2] = {o.kv_heads, nc},
                  sml[2] = {hq, 2};
    rc = ra_tensor_new(be, &q, RA_DTYPE_F32, 2, sq, &err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &cen, RA_DTYPE_F32, 3, sc, &err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &size, RA_DTYPE_F32, 2, ss, &err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &vsum, RA_DTYPE_F32, 3, sc, &err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &out, RA_DTYPE_F32, 2, sq, &err);
    if (rc == RA_OK) rc = ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, sml, &err);
    const size_t n_cen = (size_t)(o.kv_heads * nc * o.dim);
    float *h = rc == RA_OK ? malloc(n_cen * sizeof *h) : NULL;
    int32_t *idx = rc == RA_OK ? malloc((size_t)(o.kv_heads * (o.retrieve + o.estimate)) * sizeof *idx) : NULL;
    if (rc == RA_OK && (!h || !idx)) rc = ra_errorf(&err, RA_ENOMEM, "out of memory");
    if (rc == RA_OK) {
      for (size_t i = 0; i < (size_t)(hq * o.dim); i++) h[i] = 8.0f * rng_unit(&rng);
      rc = be->ops->upload(be, &q, 0, h, (size_t)(hq * o.dim), &err);
    }
    if (rc == RA_OK) {
      for (size_t i = 0; i < n_cen; i++) h[i] = rng_unit(&rng);
      rc = be->ops->upload(be, &cen, 0, h, n_cen, &err);
    }
    if (rc == RA_OK) rc = be->ops->upload(be, &vsum, 0, h, n_cen, &err);
    if (rc == RA_OK) {
      for (size_t i = 0; i < (size_t)(o.kv_heads * nc); i++) h[i] = (float)(8 + rng_next(&rng) % 40);
      rc = be->ops->upload(be, &size, 0, h, (size_t)(o.kv_heads * nc), &err);
    }
    timing with = {0}, without = {0};
    const int r = (int)o.retrieve, e = (int)o.estimate;
    if (rc == RA_OK) rc = time_select(be, &q, &cen, &size, &vsum, &out, &ml, nc, r, e, idx, (int)o.reps, &with, &err);
    if (rc == RA_OK)
      rc = time_select(be, &q, &cen, &size, &vsum, &out, &ml, nc, r + e, 0, idx, (int)o.reps, &without, &err);
    if (rc == RA_OK)
      fprintf(f,
              "%s\n  {\"clusters\": %lld, \"select_estimate_med_us\": %.1f, \"select_estimate_p90_us\": %.1f, "
              "\"select_only_med_us\": %.1f, \"select_only_p90_us\": %.1f}",
              ci ? "," : "", (long long)nc, with.med_us, with.p90_us, without.med_us, without.p90_us);
    free(h);
    free(idx);
    ra_tensor_free(&q);
    ra_tensor_free(&cen);
    ra_tensor_free(&size);
    ra_tensor_free(&vsum);
    ra_tensor_free(&out);
    ra_tensor_free(&ml);
  }
  if (rc == RA_OK) fprintf(f, "\n]}\n");
  if (f && f != stdout) fclose(f);
  if (be) ra_backend_destroy(be);
  if (rc) {
    fprintf(stderr, "wave-select-bench: %s\n", err.msg);
    return 1;
  }
  return 0;
}
