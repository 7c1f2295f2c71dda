/* rpc-bench: round-trip latency of the RPC layer on loopback, unary call vs one message on a
 * long-lived bidirectional stream, for a given payload size each way. The decode path sends
 * one attend request per layer per token, so this is its fixed cost before any work.
 *
 *   rpc-bench [--bytes N] [--iters N] [--json FILE]
 * Prints JSON: p50/p99/mean in microseconds for each mode, and their ratio. */
#include "rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static int h_echo(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  int rc;
  while ((rc = ra_rpc_call_recv(call, &m, -1, err)) == RA_OK)
    if ((rc = ra_rpc_call_send(call, m.data, m.len, err)) != RA_OK) break;
  ra_buf_free(&m);
  return rc == RA_EOF ? RA_OK : rc;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct { double p50, p99, mean; } stats;

static stats summarize(double *us, int n) {
  qsort(us, (size_t)n, sizeof *us, cmp_double);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += us[i];
  return (stats){us[n / 2], us[(int)(0.99 * (n - 1))], sum / n};
}

int main(int argc, char **argv) {
  size_t bytes = 16384;
  int iters = 2000;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bytes") && i + 1 < argc) bytes = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: rpc-bench [--bytes N] [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  if (iters < 10 || bytes > (32u << 20)) {
    fprintf(stderr, "rpc-bench: --iters must be >= 10 and --bytes <= 32 MiB\n");
    return 2;
  }
  ra_error err;
  ra_rpc_server *srv;
  ra_rpc_server_config cfg = {.listen = "127.0.0.1:0", .max_calls = 4};
  if (ra_rpc_server_create(&cfg, &srv, &err) || ra_rpc_server_add_method(srv, "/b.B/Echo", h_echo, NULL) ||
      ra_rpc_server_start(srv, &err)) {
    fprintf(stderr, "rpc-bench: server: %s\n", err.msg);
    return 1;
  }
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", ra_rpc_server_port(srv));
  ra_rpc_channel *ch;
  ra_rpc_call *stream;
  if (ra_rpc_channel_open(target, NULL, &ch, &err) || ra_rpc_call_start(ch, "/b.B/Echo", 0, &stream, &err)) {
    fprintf(stderr, "rpc-bench: client: %s\n", err.msg);
    return 1;
  }
  unsigned char *payload = calloc(1, bytes ? bytes : 1);
  double *unary_us = malloc(sizeof(double) * (size_t)iters), *stream_us = malloc(sizeof(double) * (size_t)iters);
  ra_buf reply = {0};
  int rc = RA_OK;
  /* Interleave the two modes so that machine noise hits both alike. */
  for (int i = 0; i < iters + 20 && rc == RA_OK; i++) {
    uint64_t t0 = uv_hrtime();
    rc = ra_rpc_unary(ch, "/b.B/Echo", payload, bytes, &reply, 5000, &err);
    uint64_t t1 = uv_hrtime();
    if (rc == RA_OK) rc = ra_rpc_call_send(stream, payload, bytes, &err);
    if (rc == RA_OK) rc = ra_rpc_call_recv(stream, &reply, 5000, &err);
    uint64_t t2 = uv_hrtime();
    if (i >= 20) { /* warm-up excluded */
      unary_us[i - 20] = (double)(t1 - t0) / 1e3;
      stream_us[i - 20] = (double)(t2 - t1) / 1e3;
    }
  }
  if (rc != RA_OK) {
    fprintf(stderr, "rpc-bench: %s\n", err.msg);
    return 1;
  }
  stats u = summarize(unary_us, iters), s = summarize(stream_us, iters);
  char out[1024];
  snprintf(out, sizeof out,
           "{\"bench\": \"rpc\", \"payload_bytes\": %zu, \"iters\": %d,\n"
           " \"unary_us\": {\"p50\": %.1f, \"p99\": %.1f, \"mean\": %.1f},\n"
           " \"stream_us\": {\"p50\": %.1f, \"p99\": %.1f, \"mean\": %.1f},\n"
           " \"unary_over_stream_p50\": %.2f}\n",
           bytes, iters, u.p50, u.p99, u.mean, s.p50, s.p99, s.mean, u.p50 / s.p50);
  fputs(out, stdout);
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f || fputs(out, f) < 0) {
      fprintf(stderr, "rpc-bench: cannot write %s\n", json);
      return 1;
    }
    fclose(f);
  }
  ra_rpc_call_close_send(stream, &err);
  ra_rpc_call_destroy(stream);
  ra_rpc_channel_close(ch);
  ra_rpc_server_shutdown(srv, 1000);
  ra_rpc_server_destroy(srv);
  free(payload);
  free(unary_us);
  free(stream_us);
  ra_buf_free(&reply);
  return 0;
}
