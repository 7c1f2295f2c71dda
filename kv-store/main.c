/* kv-store: the CPU memory tier of offloaded KV, served over gRPC (see config.h for flags).
 * The gRPC server runs its own call threads; the main thread runs a libuv loop that only waits
 * for SIGTERM/SIGINT, then drains calls, frees everything and exits 0. */
#include "config.h"
#include "log.h"
#include "procenv.h"
#include "rpc.h"
#include "server.h"
#include "service.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

typedef struct app {
  uv_signal_t sigterm;
  uv_signal_t sigint;
  uv_timer_t lease;     /* expires idle sessions */
  int lease_running;
  kvs_store *store;
  uint64_t idle_ms;
  int signum;
} app;

static void on_lease(uv_timer_t *t) {
  app *a = t->data;
  kvs_store_expire(a->store, a->idle_ms);
}

static void on_signal(uv_signal_t *h, int signum) {
  app *a = h->data;
  a->signum = signum;
  uv_signal_stop(&a->sigterm);
  uv_signal_stop(&a->sigint);
  uv_close((uv_handle_t *)&a->sigterm, NULL);
  uv_close((uv_handle_t *)&a->sigint, NULL);
  if (a->lease_running) {
    uv_timer_stop(&a->lease);
    uv_close((uv_handle_t *)&a->lease, NULL);
    a->lease_running = 0;
  }
}

/* Writes "HOST:PORT\n" via a temporary file and rename, so a reader never sees half of it. */
static int write_ready_file(const char *path, const char *addr, ra_error *err) {
  size_t n = strlen(path) + 5;
  char *tmp = malloc(n);
  if (!tmp) return ra_errorf(err, RA_ENOMEM, "out of memory");
  snprintf(tmp, n, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int ok = f && fprintf(f, "%s\n", addr) > 0;
  if (f && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    remove(tmp);
    free(tmp);
    return ra_errorf(err, RA_EIO, "cannot write ready file %s", path);
  }
  free(tmp);
  return RA_OK;
}

/* "HOST:PORT" of the listen address with the bound port. */
static void bound_address(const char *listen, int port, char *out, size_t len) {
  const char *colon = strrchr(listen, ':');
  snprintf(out, len, "%.*s:%d", (int)(colon - listen), listen, port);
}

static int serve(const kvs_config *cfg, ra_error *err) {
  kvs_service *svc = NULL;
  ra_rpc_server *srv = NULL;
  uv_loop_t loop;
  app a = {0};
  int loop_ok = 0;
  kvs_service_config scfg = {.memory_budget = cfg->memory_budget, .attend_threads = cfg->threads,
                               .index_threads = cfg->index_threads, .data_dir = cfg->data_dir,
                               .fsync_ms = cfg->fsync_ms};
  int rc = kvs_service_create(&scfg, &svc, err);
  if (rc) goto out;
  ra_rpc_server_config rcfg = {.listen = cfg->listen,
                               .max_calls = cfg->max_calls,
                               .max_message_bytes = cfg->max_message_bytes};
  if ((rc = ra_rpc_server_create(&rcfg, &srv, err))) goto out;
  if ((rc = kvs_server_register(srv, svc, err))) goto out;
  if (uv_loop_init(&loop) != 0) {
    rc = ra_errorf(err, RA_EINTERNAL, "uv_loop_init failed");
    goto out;
  }
  loop_ok = 1;
  /* Signal handlers go in before serving, so a SIGTERM right after "ready" is never lost. */
  uv_signal_init(&loop, &a.sigterm);
  uv_signal_init(&loop, &a.sigint);
  a.sigterm.data = a.sigint.data = &a;
  uv_signal_start(&a.sigterm, on_signal, SIGTERM);
  uv_signal_start(&a.sigint, on_signal, SIGINT);
  if (cfg->session_idle_s > 0) {
    /* Checked four times per lease, at most every 10 s: a session lives idle_s to 1.25 idle_s. */
    uint64_t every = (uint64_t)cfg->session_idle_s * 250u;
    if (every > 10000) every = 10000;
    a.store = kvs_service_store(svc);
    a.idle_ms = (uint64_t)cfg->session_idle_s * 1000u;
    uv_timer_init(&loop, &a.lease);
    a.lease.data = &a;
    uv_timer_start(&a.lease, on_lease, every, every);
    a.lease_running = 1;
  }
  if ((rc = ra_rpc_server_start(srv, err))) {
    on_signal(&a.sigterm, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto out;
  }
  char addr[RA_ADDR_MAX + 16];
  bound_address(cfg->listen, ra_rpc_server_port(srv), addr, sizeof addr);
  ra_log_info("listening on %s (memory budget %llu bytes, max message %zu bytes, %d calls)", addr,
              (unsigned long long)cfg->memory_budget, cfg->max_message_bytes, cfg->max_calls);
  if (cfg->ready_file && (rc = write_ready_file(cfg->ready_file, addr, err))) {
    on_signal(&a.sigterm, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto out;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  ra_log_info("signal %d: draining calls (grace %d ms)", a.signum, cfg->grace_ms);
  kvs_service_set_draining(svc);
  ra_rpc_server_shutdown(srv, cfg->grace_ms);
out:
  ra_rpc_server_destroy(srv);
  kvs_service_destroy(svc);
  if (loop_ok) uv_loop_close(&loop);
  if (rc == RA_OK) ra_log_info("stopped");
  return rc;
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv);
  kvs_config cfg;
  ra_error err;
  ra_error_clear(&err);
  if (kvs_config_parse(argc, argv, &cfg, &err) != RA_OK) {
    fprintf(stderr, "kv-store: %s\n\n", err.msg);
    kvs_config_usage(stderr);
    return 2;
  }
  if (cfg.help) {
    kvs_config_usage(stdout);
    kvs_config_free(&cfg);
    return 0;
  }
  ra_log_set_name("kv-store");
  ra_log_set_level(cfg.log_level);
  int rc = serve(&cfg, &err);
  if (rc != RA_OK) ra_log_error("%s", err.msg);
  kvs_config_free(&cfg);
  return rc == RA_OK ? 0 : 1;
}
