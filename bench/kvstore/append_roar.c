/* The append section of kvstore-bench (append_roar.h). Llama-3-8B attention geometry (32 q, 8 kv
 * heads, head_dim 128, f16), random keys, one roar graph per kv head built from 1024 random
 * queries (as many as roar keeps for query-aware insertion), default index parameters. */
#include "append_roar.h"

#include "clock.h"
#include "attend.h"
#include "store.h"
#include "vec.h"

#include <stdlib.h>
#include <string.h>

#define N_Q 32
#define N_KV 8
#define DIM 128
#define N_QUERIES 1024
#define WARMUP 3

static float uniform(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / (float)(1 << 24) - 0.5f;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[(int)(p * (n - 1))];
}

/* Attends every layer of the session with all 32 q heads, roar, k = 100: a decode step's reads. */
static int attend_layers(kvs_session *s, uint32_t layers, const float *q, int threads,
                         ra_error *err) {
  uint32_t heads[N_Q];
  for (uint32_t h = 0; h < N_Q; h++) heads[h] = h;
  for (uint32_t l = 0; l < layers; l++) {
    kvs_attend_args a = {.layer = l, .q_heads = heads, .n_heads = N_Q, .q = q,
                         .mode = RA_MODE_ROAR, .top_k = 100, .n_threads = threads};
    kvs_attend_result r;
    int rc = kvs_attend(s, &a, &r, err);
    if (rc) return rc;
    kvs_attend_result_free(&r);
  }
  return RA_OK;
}

int append_roar_run(const append_roar_opts *o, append_roar_result *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if (o->shards == 0 || o->shards % N_KV != 0 || o->shards > 32 * N_KV)
    return ra_errorf(err, RA_EINVAL, "append shards %u: want a multiple of %d up to %d", o->shards,
                     N_KV, 32 * N_KV);
  const uint32_t layers = o->shards / N_KV;
  const size_t rows = (size_t)o->tokens + 2 * (WARMUP + (size_t)o->steps);
  kvs_store *st = NULL;
  kvs_session *s = NULL;
  uint16_t *keys = malloc((size_t)o->shards * rows * DIM * sizeof *keys);
  uint16_t *values = malloc(rows * DIM * sizeof *values); /* shared: values do not matter here */
  float *tmp = malloc(rows * DIM * sizeof *tmp);
  float *queries = malloc((size_t)N_QUERIES * DIM * sizeof *queries);
  float *q = malloc((size_t)N_Q * DIM * sizeof *q);
  kvs_shard_spec *specs = malloc(o->shards * sizeof *specs);
  kvs_rows *blocks = malloc(o->shards * sizeof *blocks);
  int n = o->steps;
  double *reply = malloc((size_t)n * sizeof *reply), *drained = malloc((size_t)n * sizeof *drained);
  double *busy = malloc((size_t)n * sizeof *busy), *idle = malloc((size_t)n * sizeof *idle);
  int rc = RA_OK;
  if (!keys || !values || !tmp || !queries || !q || !specs || !blocks || !reply || !drained ||
      !busy || !idle) {
    rc = ra_errorf(err, RA_ENOMEM, "out of memory for the append benchmark");
    goto done;
  }
  uint32_t seed = 777;
  for (size_t i = 0; i < rows * DIM; i++) tmp[i] = uniform(&seed) * 2.0f;
  ra_fp32_to_fp16_n(tmp, values, rows * DIM);
  for (uint32_t i = 0; i < o->shards; i++) {
    for (size_t j = 0; j < rows * DIM; j++) tmp[j] = uniform(&seed) * 4.0f;
    ra_fp32_to_fp16_n(tmp, keys + (size_t)i * rows * DIM, rows * DIM);
    specs[i] = (kvs_shard_spec){.layer = i / N_KV, .kv_head = i % N_KV, .token_begin = 0,
                                .token_end = RA_TOKEN_END_OPEN};
  }
  for (size_t i = 0; i < (size_t)N_QUERIES * DIM; i++) queries[i] = uniform(&seed) * 2.0f;

  if ((rc = kvs_store_create(64ull << 30, &st, err))) goto done;
  kvs_store_set_index_threads(st, o->threads);
  kvs_geometry g = {.n_layers = 32, .n_q_heads = N_Q, .n_kv_heads = N_KV, .head_dim = DIM,
                    .dtype = RA_DTYPE_F16};
  if ((rc = kvs_store_open(st, &g, specs, o->shards, NULL, "kvstore-bench", &s, err))) goto done;
  for (uint32_t i = 0; i < o->shards; i++)
    blocks[i] = (kvs_rows){.layer = i / N_KV, .kv_head = i % N_KV, .token_begin = 0,
                           .n = o->tokens, .keys = keys + (size_t)i * rows * DIM,
                           .values = values};
  if ((rc = kvs_session_write(s, blocks, o->shards, NULL, err))) goto done;
  double t0 = (1e6 * ra_clock_now_s());
  for (uint32_t i = 0; i < o->shards && rc == RA_OK; i++) {
    kvs_build_args b = {.layer = i / N_KV, .q_head = (i % N_KV) * (N_Q / N_KV), .per_kv_head = 1,
                        .queries = queries, .n_queries = N_QUERIES};
    ra_index_params_default(RA_MODE_ROAR, &b.params);
    b.params.n_threads = o->threads;
    kvs_build_result br;
    rc = kvs_session_build_index(s, &b, &br, err);
  }
  if (rc) goto done;
  out->build_s = ((1e6 * ra_clock_now_s()) - t0) * 1e-6;

  /* Phase 0: steps of an Append alone, waiting for its rows to be indexed. Phase 1: steps as a
   * decode makes them, the Append followed at once by every layer's attend, then the same
   * attends again once drained. Each step appends the next token to every shard. */
  uint64_t pos = o->tokens;
  for (int phase = 0; phase < 2; phase++) {
    for (int step = -WARMUP; step < n; step++, pos++) {
      for (uint32_t i = 0; i < o->shards; i++)
        blocks[i] = (kvs_rows){.layer = i / N_KV, .kv_head = i % N_KV, .token_begin = pos,
                               .n = 1, .keys = keys + ((size_t)i * rows + pos) * DIM,
                               .values = values + pos * DIM};
      for (size_t i = 0; i < (size_t)N_Q * DIM; i++) q[i] = uniform(&seed) * 2.0f;
      double a = (1e6 * ra_clock_now_s());
      if ((rc = kvs_session_write(s, blocks, o->shards, NULL, err))) goto done;
      double b = (1e6 * ra_clock_now_s());
      if (phase == 1 && (rc = attend_layers(s, layers, q, o->threads, err))) goto done;
      double c = (1e6 * ra_clock_now_s());
      kvs_session_index_drain(s);
      double d = (1e6 * ra_clock_now_s());
      if (phase == 1 && (rc = attend_layers(s, layers, q, o->threads, err))) goto done;
      double e = (1e6 * ra_clock_now_s());
      if (step < 0) continue;
      if (phase == 0) {
        reply[step] = b - a;
        drained[step] = d - a;
      } else {
        busy[step] = c - b;
        idle[step] = e - d;
      }
    }
  }
  out->reply_p50_us = pct(reply, n, 0.5);
  out->reply_p99_us = pct(reply, n, 0.99);
  out->drained_p50_us = pct(drained, n, 0.5);
  out->drained_p99_us = pct(drained, n, 0.99);
  out->attend_busy_p50_us = pct(busy, n, 0.5);
  out->attend_idle_p50_us = pct(idle, n, 0.5);
done:
  kvs_session_release(s);
  kvs_store_destroy(st);
  free(keys);
  free(values);
  free(tmp);
  free(queries);
  free(q);
  free(specs);
  free(blocks);
  free(reply);
  free(drained);
  free(busy);
  free(idle);
  return rc;
}
