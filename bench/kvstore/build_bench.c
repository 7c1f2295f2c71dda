/* build-bench: concurrent roar builds on one in-process store, as a layer's BuildIndex calls
 * reach a kv-store during an offloaded prefill (gpu-worker --index-per-kv-head: one graph per kv
 * head, built from the group's sampled prefill queries, their exact top-Nq key lists and every
 * key's top-T queries).
 *
 *   build-bench --qk DIR [--layer 0] [--kv-head 0] [--builds 4] [--threads 2]
 *               [--queries 4096] [--nq 100] [--key-queries 4] [--pivots P] [--repeat 1]
 *               [--cache FILE] [--json FILE]
 *
 * The keys of (layer, kv head) of a Q/K dump (bench/index/qkdump.h: gpu-worker dump-qk or
 * qk-synth) are stored `builds` times, as kv heads 0..builds-1 of one layer; the build queries
 * are --queries evenly spaced prefill positions per q head of the group (the worker's
 * ra_prefill_query_pos), one block of G x queries; their top-nq lists and the keys' top-T
 * queries (by the margin over the query's nq-th score, as the worker's backend ranks them) are
 * computed once here (--cache FILE keeps them for the next run) and sent with every build.
 * Then `builds` threads call kvs_session_build_index at once through one gate of --threads
 * units (the store's --threads), --repeat times. Reported: the wall time until all builds are
 * installed, each build's wall time, and the process CPU time of the builds.
 * Runs itself again with OMP_WAIT_POLICY=passive, as kv-store/main.c does. Prints JSON. */
#include "clock.h"
#include "gate.h"
#include "knn.h"
#include "npy.h"
#include "opts.h"
#include "procenv.h"
#include "qkdump.h"
#include "store.h"
#include "vec.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_BUILDS 64

typedef struct opts {
  const char *qk, *json, *cache;
  int layer, kv_head, builds, threads, repeat;
  uint32_t queries, nq, key_t, pivots;
} opts;

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static int usage(const char *msg) {
  fprintf(stderr,
          "build-bench: %s\nusage: build-bench --qk DIR [--layer L] [--kv-head G] [--builds N] "
          "[--threads T] [--queries N] [--nq NQ] [--key-queries T] [--pivots P] [--repeat R] "
          "[--cache FILE] [--json FILE]\n",
          msg);
  return 2;
}

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.builds = 4, .threads = 2, .repeat = 1, .queries = 4096, .nq = 100, .key_t = 4};
  for (int i = 1; i < argc; i += 2) { /* every option takes a value */
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage("missing value");
    int64_t n = -1;
    int num = ra_opts_parse_int(v, 0, INT32_MAX, &n, NULL) == RA_OK;
    if (!strcmp(f, "--qk")) o->qk = v;
    else if (!strcmp(f, "--json")) o->json = v;
    else if (!strcmp(f, "--cache")) o->cache = v;
    else if (!strcmp(f, "--layer") && num) o->layer = (int)n;
    else if (!strcmp(f, "--kv-head") && num) o->kv_head = (int)n;
    else if (!strcmp(f, "--builds") && num && n >= 1 && n <= MAX_BUILDS) o->builds = (int)n;
    else if (!strcmp(f, "--threads") && num && n >= 1 && n <= 1024) o->threads = (int)n;
    else if (!strcmp(f, "--repeat") && num && n >= 1) o->repeat = (int)n;
    else if (!strcmp(f, "--queries") && num && n >= 1) o->queries = (uint32_t)n;
    else if (!strcmp(f, "--nq") && num && n >= 2 && n <= 1024) o->nq = (uint32_t)n;
    else if (!strcmp(f, "--key-queries") && num && n <= RA_INDEX_KEY_TOP_MAX) o->key_t = (uint32_t)n;
    else if (!strcmp(f, "--pivots") && num) o->pivots = (uint32_t)n;
    else return usage(f);
  }
  return o->qk ? 0 : usage("--qk is required");
}

/* The build inputs shared by every build: the group's sampled queries [m, dim], their top-nq
 * token positions [m, nq] and the keys' top-T query indices [n, T]. */
typedef struct lists {
  uint32_t m, nq, n, T;
  float *q;
  uint64_t *knn;
  uint32_t *ktq;
} lists;

static void lists_free(lists *l) {
  free(l->q);
  free(l->knn);
  free(l->ktq);
}

static int cache_io(const char *path, lists *l, int write) {
  FILE *f = fopen(path, write ? "wb" : "rb");
  if (!f) return -1;
  uint32_t hdr[4] = {l->m, l->nq, l->n, l->T}, got[4];
  size_t nk = (size_t)l->m * l->nq, nt = (size_t)l->n * l->T;
  int ok;
  if (write)
    ok = fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(l->knn, 8, nk, f) == nk &&
         (!nt || fwrite(l->ktq, 4, nt, f) == nt);
  else
    ok = fread(got, sizeof got, 1, f) == 1 && !memcmp(got, hdr, sizeof hdr) &&
         fread(l->knn, 8, nk, f) == nk && (!nt || fread(l->ktq, 4, nt, f) == nt);
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int make_lists(const opts *o, const ra_qk_meta *m, const float *k32, lists *l,
                      ra_error *err) {
  const int G = m->q_heads / m->kv_heads, dim = m->head_dim;
  const uint32_t n = m->n_tokens, per = o->queries < n ? o->queries : n;
  l->m = per * (uint32_t)G;
  l->nq = o->nq < n ? o->nq : n;
  l->n = n;
  l->T = o->key_t < l->m ? o->key_t : l->m;
  l->q = malloc((size_t)l->m * dim * sizeof *l->q);
  l->knn = malloc((size_t)l->m * l->nq * sizeof *l->knn);
  l->ktq = l->T ? malloc((size_t)n * l->T * sizeof *l->ktq) : NULL;
  if (!l->q || !l->knn || (l->T && !l->ktq)) return ra_errorf(err, RA_ENOMEM, "lists");
  for (int j = 0; j < G; j++) {
    char path[4200];
    ra_npy a;
    ra_qk_path(path, sizeof path, o->qk, "q", o->layer, o->kv_head * G + j);
    int rc = ra_npy_read_f32(path, &a, err);
    if (rc) return rc;
    if (a.rows < n || a.cols != (uint64_t)dim) {
      ra_npy_free(&a);
      return ra_errorf(err, RA_EFORMAT, "%s: shape [%llu, %llu]", path,
                       (unsigned long long)a.rows, (unsigned long long)a.cols);
    }
    for (uint32_t i = 0; i < per; i++)
      memcpy(l->q + ((size_t)j * per + i) * dim,
             (const float *)a.data + (size_t)((uint64_t)i * n / per) * dim, (size_t)dim * 4);
    ra_npy_free(&a);
  }
  if (o->cache && cache_io(o->cache, l, 0) == 0) {
    fprintf(stderr, "build-bench: lists from %s\n", o->cache);
    return RA_OK;
  }
  double t0 = ra_clock_now_s();
  uint32_t *ids = malloc((size_t)l->m * l->nq * sizeof *ids);
  float *sc = malloc((size_t)l->m * l->nq * sizeof *sc), *bias = malloc((size_t)l->m * 4);
  if (!ids || !sc || !bias) {
    free(ids);
    free(sc);
    free(bias);
    return ra_errorf(err, RA_ENOMEM, "lists");
  }
  int rc = ra_knn_ip(k32, n, dim, NULL, l->q, l->m, l->nq, 0, 0, ids, sc, err);
  if (rc == RA_OK && l->T) {
    /* Keys as queries over the sampled queries, each biased by minus its nq-th score. */
    for (uint32_t j = 0; j < l->m; j++) bias[j] = -sc[(size_t)j * l->nq + l->nq - 1];
    rc = ra_knn_ip(l->q, l->m, dim, bias, k32, n, l->T, 0, 0, l->ktq, NULL, err);
  }
  for (size_t i = 0; rc == RA_OK && i < (size_t)l->m * l->nq; i++) l->knn[i] = ids[i];
  free(ids);
  free(sc);
  free(bias);
  fprintf(stderr, "build-bench: lists of %u queries over %u keys in %.1f s\n", l->m, n,
          ra_clock_now_s() - t0);
  if (rc == RA_OK && o->cache && cache_io(o->cache, l, 1) != 0)
    fprintf(stderr, "build-bench: cannot write %s\n", o->cache);
  return rc;
}

typedef struct job {
  kvs_session *s;
  kvs_build_args a;
  double t_start, t_end;
  int rc;
  ra_error err;
} job;

static void *run_job(void *p) {
  job *j = p;
  kvs_build_result r;
  j->rc = kvs_session_build_index(j->s, &j->a, &r, &j->err);
  j->t_end = ra_clock_now_s();
  return NULL;
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv); /* as kv-store/main.c */
  opts o;
  if (parse_opts(argc, argv, &o)) return 2;
  ra_error err;
  ra_error_clear(&err);
  ra_qk_meta m;
  ra_npy kn = {0};
  char path[4200];
  if (ra_qk_meta_read(o.qk, &m, &err)) goto fail;
  if (o.layer >= m.layers || o.kv_head >= m.kv_heads) {
    fprintf(stderr, "build-bench: layer %d / kv head %d not in the dump\n", o.layer, o.kv_head);
    return 2;
  }
  ra_qk_path(path, sizeof path, o.qk, "k", o.layer, o.kv_head);
  if (ra_npy_read(path, &kn, &err)) goto fail;
  const uint32_t n = m.n_tokens, dim = (uint32_t)m.head_dim;
  const int G = m.q_heads / m.kv_heads;
  if (kn.rows < n || kn.cols != dim) {
    fprintf(stderr, "build-bench: %s is not [%u, %u]\n", path, n, dim);
    return 1;
  }
  float *k32 = malloc((size_t)n * dim * sizeof *k32);
  uint16_t *k16 = malloc((size_t)n * dim * sizeof *k16), *v16 = calloc((size_t)n * dim, 2);
  if (!k32 || !k16 || !v16) return 1;
  ra_dtype_to_fp32_n(kn.dtype, kn.data, k32, (size_t)n * dim);
  ra_fp32_to_fp16_n(k32, k16, (size_t)n * dim);
  lists l = {0};
  if (make_lists(&o, &m, k32, &l, &err)) goto fail;
  free(k32);

  kvs_store *st = NULL;
  kvs_session *s = NULL;
  if (kvs_store_create(256ull << 30, &st, &err)) goto fail;
  kvs_geometry geo = {.n_layers = 1, .n_q_heads = (uint32_t)(G * o.builds),
                      .n_kv_heads = (uint32_t)o.builds, .head_dim = dim, .dtype = RA_DTYPE_F16};
  kvs_shard_spec specs[MAX_BUILDS];
  kvs_rows rows[MAX_BUILDS];
  for (int b = 0; b < o.builds; b++) {
    specs[b] = (kvs_shard_spec){.layer = 0, .kv_head = (uint32_t)b, .token_begin = 0,
                                .token_end = RA_TOKEN_END_OPEN};
    rows[b] = (kvs_rows){.layer = 0, .kv_head = (uint32_t)b, .token_begin = 0, .n = n,
                         .keys = k16, .values = v16};
  }
  if (kvs_store_open(st, &geo, specs, (size_t)o.builds, NULL, "build-bench", &s, &err) ||
      kvs_session_write(s, rows, (size_t)o.builds, NULL, &err))
    goto fail;
  ra_gate gate;
  if (ra_gate_init(&gate, o.threads)) return 1;
  ra_index_params p;
  ra_index_params_default(RA_MODE_ROAR, &p);
  p.knn_nq = l.nq;
  p.n_threads = o.threads;
  if (o.pivots) p.pivots = o.pivots;

  double *wall = calloc((size_t)o.repeat, sizeof *wall), *cpu = calloc((size_t)o.repeat, 8);
  double *each = calloc((size_t)o.repeat * o.builds, sizeof *each);
  if (!wall || !cpu || !each) return 1;
  for (int r = 0; r < o.repeat; r++) {
    job jobs[MAX_BUILDS];
    pthread_t tid[MAX_BUILDS];
    double c0 = cpu_s(), t0 = ra_clock_now_s();
    for (int b = 0; b < o.builds; b++) {
      jobs[b] = (job){.s = s, .t_start = t0};
      jobs[b].a = (kvs_build_args){.layer = 0, .q_head = (uint32_t)(b * G), .params = p,
                                   .per_kv_head = 1, .queries = l.q, .n_queries = l.m,
                                   .knn = l.knn, .knn_k = l.nq, .key_top_queries = l.ktq,
                                   .key_top_k = l.T, .key_pos_begin = 0,
                                   .n_key_rows = l.T ? n : 0, .gate = &gate};
      if (pthread_create(&tid[b], NULL, run_job, &jobs[b])) return 1;
    }
    for (int b = 0; b < o.builds; b++) pthread_join(tid[b], NULL);
    wall[r] = ra_clock_now_s() - t0;
    cpu[r] = cpu_s() - c0;
    for (int b = 0; b < o.builds; b++) {
      if (jobs[b].rc) {
        err = jobs[b].err;
        goto fail;
      }
      each[(size_t)r * o.builds + b] = jobs[b].t_end - t0;
    }
    fprintf(stderr, "build-bench: round %d: %d builds in %.2f s wall, %.2f CPU-s\n", r, o.builds,
            wall[r], cpu[r]);
  }

  char buf[8192];
  int len = snprintf(
      buf, sizeof buf,
      "{\n  \"qk\": \"%s\", \"model\": \"%s\", \"layer\": %d, \"kv_head\": %d, \"keys\": %u, "
      "\"head_dim\": %u,\n  \"build_queries\": %u, \"nq\": %u, \"key_top_queries\": %u, "
      "\"pivots\": %u, \"degree\": %u,\n  \"machine\": {\"cpus\": %ld, \"vec_kernel\": \"%s\", "
      "\"omp_wait_policy\": \"%s\"},\n  \"store_threads\": %d, \"concurrent_builds\": %d,\n"
      "  \"rounds\": [",
      o.qk, m.model, o.layer, o.kv_head, n, dim, l.m, l.nq, l.T, p.pivots, p.degree,
      sysconf(_SC_NPROCESSORS_ONLN), ra_vec_kernel_name(),
      getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default", o.threads, o.builds);
  for (int r = 0; r < o.repeat && len < (int)sizeof buf - 256; r++) {
    len += snprintf(buf + len, sizeof buf - len, "%s\n    {\"wall_s\": %.3f, \"cpu_s\": %.3f, "
                    "\"each_done_s\": [", r ? "," : "", wall[r], cpu[r]);
    for (int b = 0; b < o.builds && len < (int)sizeof buf - 64; b++)
      len += snprintf(buf + len, sizeof buf - len, "%s%.3f", b ? ", " : "",
                      each[(size_t)r * o.builds + b]);
    len += snprintf(buf + len, sizeof buf - len, "]}");
  }
  if (len < (int)sizeof buf - 8) len += snprintf(buf + len, sizeof buf - len, "\n  ]\n}\n");
  fputs(buf, stdout);
  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f || fputs(buf, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "build-bench: cannot write %s: %s\n", o.json, strerror(errno));
      return 1;
    }
  }
  kvs_session_release(s);
  kvs_store_destroy(st);
  ra_gate_destroy(&gate);
  lists_free(&l);
  ra_npy_free(&kn);
  free(k16);
  free(v16);
  free(wall);
  free(cpu);
  free(each);
  return 0;
fail:
  fprintf(stderr, "build-bench: %s: %s\n", ra_status_name(err.code), err.msg);
  return 1;
}
