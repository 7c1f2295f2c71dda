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
#include "textfile.h"

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

/* What the server's security is read from: PEM texts and the accepted tokens. */
typedef struct secrets {
  char *cert, *key, *ca, *tokens_text;
  const char **tokens;
  size_t n_tokens;
} secrets;

static void secrets_free(secrets *x) {
  free(x->cert);
  free(x->key);
  free(x->ca);
  free(x->tokens_text);
  free(x->tokens);
}

/* Reads the TLS files and the token file: one token a line, blank lines and '#' comments
 * skipped, surrounding blanks trimmed. */
static int secrets_load(const kvs_config *cfg, secrets *x, ra_error *err) {
  memset(x, 0, sizeof *x);
  const size_t max = 1u << 20;
  int rc = RA_OK;
  if (cfg->tls_cert) rc = ra_textfile_read(cfg->tls_cert, max, &x->cert, NULL, err);
  if (rc == RA_OK && cfg->tls_key) rc = ra_textfile_read(cfg->tls_key, max, &x->key, NULL, err);
  if (rc == RA_OK && cfg->tls_ca) rc = ra_textfile_read(cfg->tls_ca, max, &x->ca, NULL, err);
  if (rc == RA_OK && cfg->auth_token_file) rc = ra_textfile_read(cfg->auth_token_file, max, &x->tokens_text, NULL, err);
  if (rc == RA_OK && x->tokens_text) {
    size_t lines = 1;
    for (const char *p = x->tokens_text; *p; p++) lines += *p == '\n';
    if (!(x->tokens = calloc(lines, sizeof *x->tokens))) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
    for (char *line = x->tokens_text, *next; rc == RA_OK && line; line = next) {
      next = strchr(line, '\n');
      if (next) *next++ = '\0';
      line += strspn(line, " \t\r");
      size_t n = strlen(line);
      while (n && strchr(" \t\r", line[n - 1])) line[--n] = '\0';
      if (n && line[0] != '#') x->tokens[x->n_tokens++] = line;
    }
    if (rc == RA_OK && x->n_tokens == 0)
      rc = ra_errorf(err, RA_EINVAL, "%s holds no token", cfg->auth_token_file);
  }
  if (rc) secrets_free(x);
  return rc;
}

static int serve(const kvs_config *cfg, ra_error *err) {
  kvs_service *svc = NULL;
  ra_rpc_server *srv = NULL;
  uv_loop_t loop;
  app a = {0};
  int loop_ok = 0;
  secrets sec;
  int rc_sec = secrets_load(cfg, &sec, err);
  if (rc_sec) return rc_sec;
  kvs_service_config scfg = {.memory_budget = cfg->memory_budget, .attend_threads = cfg->threads,
                               .index_threads = cfg->index_threads, .data_dir = cfg->data_dir,
                               .fsync_ms = cfg->fsync_ms};
  int rc = kvs_service_create(&scfg, &svc, err);
  if (rc) goto out;
  ra_rpc_tls tls = {.cert_pem = sec.cert, .key_pem = sec.key, .ca_pem = sec.ca};
  ra_rpc_server_config rcfg = {.listen = cfg->listen,
                               .max_calls = cfg->max_calls,
                               .max_waiting = cfg->max_waiting,
                               .max_message_bytes = cfg->max_message_bytes,
                               .first_message_ms = cfg->first_message_ms,
                               .idle_ms = cfg->call_idle_ms,
                               .keepalive_ms = cfg->keepalive_ms,
                               .tls = sec.cert ? &tls : NULL,
                               .tokens = sec.tokens,
                               .n_tokens = sec.n_tokens};
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
  ra_log_info("listening on %s (%s%s; memory budget %llu bytes, max message %zu bytes, %d calls)", addr,
              sec.ca ? "mutual TLS" : sec.cert ? "TLS" : "plaintext",
              sec.n_tokens ? ", bearer tokens" : "", (unsigned long long)cfg->memory_budget, cfg->max_message_bytes,
              cfg->max_calls);
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
  secrets_free(&sec);
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
