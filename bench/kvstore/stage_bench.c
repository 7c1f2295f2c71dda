/* stage-bench: a store's own part of PutKv, in process: `streams` threads stage a session's
 * K/V rows into their own shards (as PutKv streams of one session do, without the transport:
 * kvs_session_stage, then commit), each layer a fresh session so that the shards' pages are
 * first touched as in a prefill.
 *
 *   stage-bench [--tokens 65536] [--layers 4] [--kv-heads 8] [--dim 128] [--chunk 4096]
 *               [--streams 4] [--json FILE]
 *
 * Reported: the median over layers of the K/V bytes staged per second. Prints JSON. */
#include "clock.h"
#include "opts.h"
#include "store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
  int64_t tokens, layers, kv_heads, dim, chunk, streams;
  const char *json;
} opts;

#define AT(m) RA_OPT_AT(opts, m)
static const ra_opt opt_rows[] = {
    {"tokens", RA_OPT_INT, AT(tokens), .lo = 1024, .hi = 1 << 24, .meta = "N", .help = "rows per kv head"},
    {"layers", RA_OPT_INT, AT(layers), .lo = 1, .hi = 1024, .meta = "N", .help = "layers, each a fresh session"},
    {"kv-heads", RA_OPT_INT, AT(kv_heads), .lo = 1, .hi = 64, .meta = "N", .help = "kv heads (one shard each)"},
    {"dim", RA_OPT_INT, AT(dim), .lo = 16, .hi = 512, .meta = "N", .help = "head_dim"},
    {"chunk", RA_OPT_INT, AT(chunk), .lo = 1, .hi = 1 << 20, .meta = "N", .help = "rows per staged chunk"},
    {"streams", RA_OPT_INT, AT(streams), .lo = 1, .hi = 64, .meta = "N", .help = "staging threads"},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "write the JSON there instead of stdout"},
};
#undef AT

typedef struct worker {
  kvs_session *s;
  const opts *o;
  const void *k, *v; /* [chunk, dim] f16 */
  int64_t first, step; /* the kv heads first, first + step, ... */
  int rc;
  ra_error err;
} worker;

static void *stage_heads(void *arg) {
  worker *w = arg;
  kvs_stage st = {0};
  for (int64_t h = w->first; h < w->o->kv_heads && w->rc == RA_OK; h += w->step)
    for (int64_t r = 0; r < w->o->tokens && w->rc == RA_OK; r += w->o->chunk) {
      const int64_t n = w->o->tokens - r < w->o->chunk ? w->o->tokens - r : w->o->chunk;
      kvs_rows rows = {.layer = 0, .kv_head = (uint32_t)h, .token_begin = (uint64_t)r, .n = (size_t)n, .keys = w->k,
                       .values = w->v};
      w->rc = kvs_session_stage(w->s, &st, &rows, 1, NULL, &w->err);
    }
  if (w->rc == RA_OK) kvs_stage_commit(&st);
  else kvs_stage_abort(&st);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  opts o = {.tokens = 65536, .layers = 4, .kv_heads = 8, .dim = 128, .chunk = 4096, .streams = 4};
  ra_opts_table t = {opt_rows, RA_OPTS_COUNT(opt_rows), &o, NULL};
  ra_opts_set set = {&t, 1, NULL, 0};
  ra_error err = {0};
  if (ra_opts_parse_args(&set, argc - 1, argv + 1, &err)) {
    fprintf(stderr, "stage-bench: %s\nusage: stage-bench [options]\n", err.msg);
    ra_opts_usage(&set, stderr);
    return 2;
  }
  const size_t row = (size_t)o.dim * ra_dtype_size(RA_DTYPE_F16);
  void *k = calloc((size_t)o.chunk, row), *v = calloc((size_t)o.chunk, row);
  kvs_shard_spec *sh = calloc((size_t)o.kv_heads, sizeof *sh);
  double *gbs = calloc((size_t)o.layers, sizeof *gbs);
  worker *w = calloc((size_t)o.streams, sizeof *w);
  pthread_t *th = calloc((size_t)o.streams, sizeof *th);
  kvs_store *st = NULL;
  int rc = k && v && sh && gbs && w && th ? RA_OK : ra_errorf(&err, RA_ENOMEM, "out of memory");
  if (rc == RA_OK) rc = kvs_store_create(UINT64_MAX / 2, &st, &err);
  const kvs_geometry g = {.n_layers = 1, .n_q_heads = (uint32_t)o.kv_heads, .n_kv_heads = (uint32_t)o.kv_heads,
                          .head_dim = (uint32_t)o.dim, .dtype = RA_DTYPE_F16};
  for (int64_t h = 0; sh && h < o.kv_heads; h++)
    sh[h] = (kvs_shard_spec){.layer = 0, .kv_head = (uint32_t)h, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  for (int64_t l = 0; l < o.layers && rc == RA_OK; l++) {
    kvs_session *s = NULL;
    if ((rc = kvs_store_open(st, &g, sh, (size_t)o.kv_heads, NULL, "stage-bench", &s, &err))) break;
    const uint64_t t0 = ra_clock_now_ns();
    for (int64_t i = 0; i < o.streams; i++) {
      w[i] = (worker){.s = s, .o = &o, .k = k, .v = v, .first = i, .step = o.streams};
      pthread_create(&th[i], NULL, stage_heads, &w[i]);
    }
    for (int64_t i = 0; i < o.streams; i++) pthread_join(th[i], NULL);
    const double sec = (double)(ra_clock_now_ns() - t0) / 1e9;
    for (int64_t i = 0; i < o.streams && rc == RA_OK; i++)
      if (w[i].rc) {
        rc = w[i].rc;
        err = w[i].err;
      }
    gbs[l] = 2.0 * (double)o.kv_heads * (double)o.tokens * (double)row / sec / 1e9;
    uint8_t id[KVS_SESSION_ID_BYTES];
    memcpy(id, s->id, sizeof id);
    kvs_session_release(s);
    if (rc == RA_OK) rc = kvs_store_close(st, id, sizeof id, NULL, &err);
  }
  if (rc == RA_OK) {
    qsort(gbs, (size_t)o.layers, sizeof *gbs, cmp_double);
    FILE *f = o.json ? fopen(o.json, "w") : stdout;
    if (!f) rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
    if (rc == RA_OK) {
      fprintf(f,
              "{\"bench\": \"stage\", \"tokens\": %lld, \"layers\": %lld, \"kv_heads\": %lld, \"dim\": %lld, "
              "\"dtype\": \"f16\", \"chunk\": %lld, \"streams\": %lld, \"median_gb_per_s\": %.2f, "
              "\"min_gb_per_s\": %.2f, \"max_gb_per_s\": %.2f}\n",
              (long long)o.tokens, (long long)o.layers, (long long)o.kv_heads, (long long)o.dim, (long long)o.chunk,
              (long long)o.streams, gbs[o.layers / 2], gbs[0], gbs[o.layers - 1]);
      if (f != stdout) fclose(f);
    }
  }
  if (st) kvs_store_destroy(st);
  free(k);
  free(v);
  free(sh);
  free(gbs);
  free(w);
  free(th);
  if (rc) {
    fprintf(stderr, "stage-bench: %s\n", err.msg);
    return 1;
  }
  return 0;
}
