/* kvstore-bench: one kv-store over loopback with Llama-3-8B attention geometry (32 q heads,
 * 8 kv heads, head_dim 128, fp16): PutKv ingest rate for `tokens` tokens of every kv head of
 * `layers` layers (over `streams` PutKv streams at once, each on its own connection and thread,
 * the (layer, kv head) blocks dealt round-robin), then the attend round trip of one layer (all 32 q heads, one request on a
 * long-lived stream) in full and in flat (k = 100) mode. Then, on an in-process store, the
 * decode's Append against roar indexes (append_roar.h): how long the write takes to return, how
 * long until the rows are indexed, and the attends issued meanwhile.
 *
 *   kvstore-bench [--json FILE] [--tokens 32768] [--layers 1] [--iters 200]
 *                 [--streams 1] [--addr HOST:PORT | --threads N]
 *                 [--append-shards 32] [--append-tokens 4096] [--append-steps 50]
 *                 [--append-only 1]
 * Without --addr it spawns its own store (build/bin/kv-store next to this binary) with
 * --threads N and stops it at the end. --append-only 1 runs the append section alone. Like the
 * kv-store process (kv-store/main.c), it runs itself again with OMP_WAIT_POLICY=passive unless
 * a policy is set, so the in-process store waits as a real one does; the JSON names the policy.
 * Prints JSON (and writes it to FILE). */
#include "clock.h"
#include "append_roar.h"
#include "client.h"
#include "opts.h"
#include "procenv.h"
#include "vec.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define N_Q 32
#define N_KV 8
#define DIM 128
#define MAX_STREAMS 32

typedef struct opts {
  const char *json;
  const char *addr;
  size_t tokens;
  uint32_t layers;
  int iters;
  int threads;
  int streams;
  append_roar_opts append;
  int append_only;
} opts;

static int usage(const char *msg) {
  fprintf(stderr,
          "kvstore-bench: %s\nusage: kvstore-bench [--json FILE] [--tokens N] [--layers N] "
          "[--iters N] [--streams N] [--addr HOST:PORT | --threads N] [--append-shards N] [--append-tokens N] "
          "[--append-steps N] [--append-only 1]\n",
          msg);
  return 2;
}

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.tokens = 32768, .layers = 1, .iters = 200, .streams = 1,
              .append = {.shards = 32, .tokens = 4096, .steps = 50}};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every flag takes a value");
    const char *f = argv[i], *v = argv[++i];
    int64_t n = 0;
    int num = ra_opts_parse_int(v, 1, INT32_MAX, &n, NULL) == RA_OK;
    if (strcmp(f, "--json") == 0) o->json = v;
    else if (strcmp(f, "--addr") == 0) o->addr = v;
    else if (strcmp(f, "--tokens") == 0 && num) o->tokens = (size_t)n;
    else if (strcmp(f, "--layers") == 0 && num && n <= 32) o->layers = (uint32_t)n;
    else if (strcmp(f, "--iters") == 0 && num) o->iters = (int)n;
    else if (strcmp(f, "--threads") == 0 && num) o->threads = (int)n;
    else if (strcmp(f, "--streams") == 0 && num && n <= MAX_STREAMS) o->streams = (int)n;
    else if (strcmp(f, "--append-shards") == 0 && num && n % 8 == 0 && n <= 256)
      o->append.shards = (uint32_t)n;
    else if (strcmp(f, "--append-tokens") == 0 && num && n <= 1 << 20) o->append.tokens = (uint32_t)n;
    else if (strcmp(f, "--append-steps") == 0 && num && n <= 100000) o->append.steps = (int)n;
    else if (strcmp(f, "--append-only") == 0 && num) o->append_only = 1;
    else return usage("unknown flag or bad value");
  }
  return 0;
}

/* Spawns ./kv-store next to this binary on a free loopback port; fills addr. */
static pid_t spawn_store(const opts *o, char *addr, size_t len) {
  char self[PATH_MAX], bin[PATH_MAX + 16], ready[64], threads[16];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  *strrchr(self, '/') = '\0';
  snprintf(bin, sizeof bin, "%s/kv-store", self);
  snprintf(ready, sizeof ready, "/tmp/kvstore-bench-%d.ready", (int)getpid());
  snprintf(threads, sizeof threads, "%d", o->threads);
  unlink(ready);
  const char *argv[16] = {bin, "--listen", "127.0.0.1:0", "--ready-file", ready, "--log-level",
                          "warn", "--memory-budget", "16G"};
  int a = 9;
  if (o->threads > 0) {
    argv[a++] = "--threads";
    argv[a++] = threads;
  }
  argv[a] = NULL;
  pid_t pid;
  if (posix_spawn(&pid, bin, NULL, NULL, (char *const *)argv, environ) != 0) return -1;
  for (int i = 0; i < 1000; i++) {
    FILE *f = fopen(ready, "r");
    if (f) {
      int ok = fgets(addr, (int)len, f) != NULL;
      fclose(f);
      if (ok) {
        addr[strcspn(addr, "\n")] = '\0';
        unlink(ready);
        return pid;
      }
    }
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct lat {
  double p50_us, p99_us, mean_us, compute_p50_us;
} lat;

static lat summarize(double *us, double *compute, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) sum += us[i];
  qsort(us, (size_t)n, sizeof *us, cmp_double);
  qsort(compute, (size_t)n, sizeof *compute, cmp_double);
  return (lat){us[n / 2], us[(int)(0.99 * (n - 1))], sum / n, compute[n / 2]};
}

static int run_attend(ra_kvclient_stream *st, ra_mode mode, int iters, float *q,
                      float (*o)[DIM], lat *out, ra_error *err) {
  uint32_t heads[N_Q];
  ra_head_partial p[N_Q];
  for (uint32_t h = 0; h < N_Q; h++) {
    heads[h] = h;
    p[h] = (ra_head_partial){.part.o = o[h]};
  }
  ra_kvclient_attend_req req = {.layer = 0, .q_heads = heads, .n_heads = N_Q, .q = q,
                                .mode = mode, .top_k = mode == RA_MODE_FLAT ? 100 : 0};
  double *us = malloc((size_t)iters * sizeof *us), *cu = malloc((size_t)iters * sizeof *cu);
  int rc = RA_OK;
  for (int i = -5; i < iters && rc == RA_OK; i++) { /* 5 warm-up requests */
    uint64_t compute = 0;
    q[i & 127] += 1e-3f; /* a different query each time */
    double t0 = ra_clock_now_s();
    rc = ra_kvclient_attend(st, &req, p, 60000, &compute, err);
    double dt = (ra_clock_now_s() - t0) * 1e6;
    if (i >= 0) {
      us[i] = dt;
      cu[i] = (double)compute;
    }
  }
  if (rc == RA_OK) *out = summarize(us, cu, iters);
  free(us);
  free(cu);
  return rc;
}

/* One PutKv stream of the ingest: rows[i] for i = first, first + step, ... on its own connection. */
typedef struct put_lane {
  const char *addr;
  const ra_kvclient_session *sess;
  const ra_kvclient_rows *rows;
  size_t n_rows, first, step;
  int rc;
  ra_error err;
} put_lane;

static void *put_lane_run(void *arg) {
  put_lane *p = arg;
  ra_kvclient *c = NULL;
  ra_kvclient_rows mine[32 * N_KV];
  size_t n = 0;
  for (size_t i = p->first; i < p->n_rows; i += p->step) mine[n++] = p->rows[i];
  p->rc = ra_kvclient_connect(p->addr, NULL, &c, &p->err);
  if (p->rc == RA_OK && n) p->rc = ra_kvclient_put_kv(c, p->sess, mine, n, NULL, &p->err);
  ra_kvclient_close(c);
  return NULL;
}

/* The ingest: every block of rows, over `streams` streams at once. */
static int ingest(const char *addr, const ra_kvclient_session *sess, const ra_kvclient_rows *rows, size_t n_rows,
                  int streams, ra_error *err) {
  put_lane lanes[MAX_STREAMS];
  pthread_t tid[MAX_STREAMS];
  int started = 0, rc = RA_OK;
  for (int i = 0; i < streams; i++) {
    lanes[i] = (put_lane){addr, sess, rows, n_rows, (size_t)i, (size_t)streams, RA_OK, {0}};
    if (pthread_create(&tid[i], NULL, put_lane_run, &lanes[i]) != 0) {
      rc = ra_errorf(err, RA_ENOMEM, "cannot start stream %d's thread", i);
      break;
    }
    started++;
  }
  for (int i = 0; i < started; i++) {
    pthread_join(tid[i], NULL);
    if (rc == RA_OK && lanes[i].rc != RA_OK) {
      *err = lanes[i].err;
      rc = lanes[i].rc;
    }
  }
  return rc;
}

/* What the remote section measured. */
typedef struct remote_result {
  double ingest_bytes, ingest_s;
  lat full, flat;
} remote_result;

/* The remote section: a store over loopback (spawned unless --addr), PutKv ingest, then one
 * layer's attends in full and flat mode. *store_ok: the spawned store exited cleanly. */
static int run_remote(const opts *o, remote_result *res, int *store_ok, ra_error *err) {
  char addr[128];
  pid_t pid = -1;
  *store_ok = 1;
  if (o->addr) {
    snprintf(addr, sizeof addr, "%s", o->addr);
  } else if ((pid = spawn_store(o, addr, sizeof addr)) < 0) {
    return ra_errorf(err, RA_EINTERNAL, "cannot start kv-store");
  }
  ra_kvclient *c = NULL;
  ra_kvclient_stream *st = NULL;
  int rc = ra_kvclient_connect(addr, NULL, &c, err);

  /* One K and one V block [tokens, 128] fp16 per kv head, reused for every layer. */
  size_t n = o->tokens, elems = n * DIM;
  uint16_t *kv = malloc(2 * N_KV * elems * sizeof *kv);
  float *tmp = malloc(elems * sizeof *tmp);
  uint32_t s = 12345;
  for (size_t b = 0; b < 2 * N_KV; b++) {
    for (size_t i = 0; i < elems; i++) {
      s = s * 1664525u + 1013904223u;
      tmp[i] = ((float)(s >> 8) / (float)(1 << 24) - 0.5f) * 4.0f;
    }
    ra_fp32_to_fp16_n(tmp, kv + b * elems, elems);
  }
  free(tmp);

  ra_kvclient_geometry g = {.n_layers = 32, .n_q_heads = N_Q, .n_kv_heads = N_KV,
                            .head_dim = DIM, .dtype = RA_DTYPE_F16};
  ra_kvclient_shard shards[32 * N_KV];
  ra_kvclient_rows rows[32 * N_KV];
  size_t ns = 0;
  for (uint32_t l = 0; l < o->layers; l++)
    for (uint32_t h = 0; h < N_KV; h++) {
      shards[ns] = (ra_kvclient_shard){.layer = l, .kv_head = h, .token_begin = 0,
                                       .token_end = RA_TOKEN_END_OPEN};
      rows[ns++] = (ra_kvclient_rows){.layer = l, .kv_head = h, .token_begin = 0, .n_tokens = n,
                                      .keys = kv + (2 * h) * elems,
                                      .values = kv + (2 * h + 1) * elems};
    }
  ra_kvclient_session sess;
  res->ingest_bytes = (double)ns * (double)elems * 2 * 2;
  if (rc == RA_OK) rc = ra_kvclient_open_session(c, &g, shards, ns, "kvstore-bench", &sess, err);
  if (rc == RA_OK) {
    double t0 = ra_clock_now_s();
    rc = ingest(addr, &sess, rows, ns, o->streams, err);
    res->ingest_s = ra_clock_now_s() - t0;
  }
  float q[N_Q * DIM], o_buf[N_Q][DIM];
  for (int i = 0; i < N_Q * DIM; i++) {
    s = s * 1664525u + 1013904223u;
    q[i] = ((float)(s >> 8) / (float)(1 << 24) - 0.5f) * 2.0f;
  }
  if (rc == RA_OK) rc = ra_kvclient_attend_open(c, &sess, &st, err);
  if (rc == RA_OK) rc = run_attend(st, RA_MODE_FULL, o->iters, q, o_buf, &res->full, err);
  if (rc == RA_OK) rc = run_attend(st, RA_MODE_FLAT, o->iters, q, o_buf, &res->flat, err);
  ra_kvclient_attend_close(st);
  if (rc == RA_OK) rc = ra_kvclient_close_session(c, &sess, NULL, err);
  ra_kvclient_close(c);
  free(kv);
  if (pid > 0) {
    int status = 0;
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    *store_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return rc;
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv); /* as kv-store/main.c */
  opts o;
  if (parse_opts(argc, argv, &o)) return 2;
  ra_error err;
  ra_error_clear(&err);
  remote_result rr = {0};
  append_roar_result ar = {0};
  int store_ok = 1, rc = RA_OK;
  if (!o.append_only) rc = run_remote(&o, &rr, &store_ok, &err);
  if (rc == RA_OK) rc = append_roar_run(&o.append, &ar, &err);
  if (rc != RA_OK) {
    fprintf(stderr, "kvstore-bench: %s: %s\n", ra_status_name(rc), err.msg);
    return 1;
  }

  char json[4096], remote[2048] = "";
  if (!o.append_only)
    snprintf(remote, sizeof remote,
             "  \"geometry\": {\"n_q_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
             "\"dtype\": \"f16\", \"tokens_per_kv_head\": %zu, \"layers_put\": %u},\n"
             "  \"store\": \"%s\",\n"
             "  \"ingest\": {\"streams\": %d, \"bytes\": %.0f, \"seconds\": %.3f, \"gb_per_s\": %.3f},\n"
             "  \"attend_full\": {\"iters\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, "
             "\"mean_us\": %.1f, \"store_compute_p50_us\": %.1f},\n"
             "  \"attend_flat_k100\": {\"iters\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, "
             "\"mean_us\": %.1f, \"store_compute_p50_us\": %.1f},\n",
             N_Q, N_KV, DIM, o.tokens, o.layers, o.addr ? o.addr : "spawned", o.streams, rr.ingest_bytes,
             rr.ingest_s, rr.ingest_bytes / rr.ingest_s / 1e9, o.iters, rr.full.p50_us,
             rr.full.p99_us, rr.full.mean_us, rr.full.compute_p50_us, o.iters, rr.flat.p50_us,
             rr.flat.p99_us, rr.flat.mean_us, rr.flat.compute_p50_us);
  snprintf(json, sizeof json,
           "{\n"
           "  \"machine\": {\"cpus\": %ld, \"vec_kernel\": \"%s\", \"store_threads\": %d, "
           "\"omp_wait_policy\": \"%s\"},\n"
           "%s"
           "  \"append_roar\": {\"shards\": %u, \"tokens_per_shard\": %u, \"steps\": %d, "
           "\"index\": \"roar per kv head, defaults, 1024 build queries\", \"build_s\": %.2f, "
           "\"reply_p50_us\": %.1f, \"reply_p99_us\": %.1f, \"drained_p50_us\": %.1f, "
           "\"drained_p99_us\": %.1f, \"attend_all_layers_while_inserting_p50_us\": %.1f, "
           "\"attend_all_layers_idle_p50_us\": %.1f}\n"
           "}\n",
           sysconf(_SC_NPROCESSORS_ONLN), ra_vec_kernel_name(), o.threads,
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default", remote, o.append.shards,
           o.append.tokens, o.append.steps, ar.build_s, ar.reply_p50_us, ar.reply_p99_us,
           ar.drained_p50_us, ar.drained_p99_us, ar.attend_busy_p50_us, ar.attend_idle_p50_us);
  fputs(json, stdout);
  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f || fputs(json, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "kvstore-bench: cannot write %s: %s\n", o.json, strerror(errno));
      return 1;
    }
  }
  return store_ok ? 0 : 1;
}
