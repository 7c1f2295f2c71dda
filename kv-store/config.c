#include "config.h"

#include "opts.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t default_budget(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 1ull << 30;
  return (uint64_t)pages * (uint64_t)page / 10 * 8;
}

static void config_default(kvs_config *c) {
  *c = (kvs_config){
      .memory_budget = default_budget(),
      .max_calls = 256,
      .max_waiting = 256,
      .first_message_ms = 10000,
      .call_idle_ms = 600000,
      .keepalive_ms = 10000,
      .max_message_bytes = 64u << 20,
      .grace_ms = 2000,
      .session_idle_s = 600,
      .fsync_ms = 100,
      .log_level = RA_LOG_INFO,
  };
}

static int listen_parse(const char *v, void *field, ra_error *err) {
  if (!strchr(v, ':')) return ra_errorf(err, RA_EINVAL, "not HOST:PORT");
  memcpy(field, &v, sizeof v);
  return RA_OK;
}

static const char *level_name(int l) { return ra_log_level_name((enum ra_log_level)l); }

#define AT(member) RA_OPT_AT(kvs_config, member)
static const ra_opt rows[] = {
    {"listen", RA_OPT_CUSTOM, AT(listen), .parse = listen_parse, .meta = "HOST:PORT",
     .help = "address to serve on (port 0: any free port)"},
    {"config", RA_OPT_STRING, AT(config), .meta = "FILE", .flags = RA_OPT_ARGV_ONLY,
     .help = "read these options from FILE, one per line: \"name value\" (\"memory-budget 64G\"), '#' "
             "comments; the command line overrides it"},
    {"memory-budget", RA_OPT_SIZE, AT(memory_budget), .ulo = 1, .uhi = UINT64_MAX, .meta = "SIZE",
     .help = "KV bytes the store may hold, e.g. 64G", .dflt = "80% of RAM"},
    {"threads", RA_OPT_INT, AT(threads), .lo = 1, .hi = 1024, .meta = "N", .help = "OpenMP threads per attend",
     .dflt = "one per core"},
    {"index-threads", RA_OPT_INT, AT(index_threads), .lo = 1, .hi = 1024, .meta = "N",
     .help = "threads inserting decoded rows into indexes", .dflt = "--threads"},
    {"max-calls", RA_OPT_INT, AT(max_calls), .lo = 1, .hi = 4096, .meta = "N",
     .help = "calls served at once (a worker keeps its index builds in flight: n_q_heads x --build-layers); more are "
             "refused with RESOURCE_EXHAUSTED"},
    {"max-waiting", RA_OPT_INT, AT(max_waiting), .lo = 1, .hi = 65536, .meta = "N",
     .help = "calls accepted and waiting for their first message (a thread each)"},
    {"first-message-ms", RA_OPT_INT, AT(first_message_ms), .lo = 1, .hi = 3600000, .meta = "MS",
     .help = "a new call that sends no message within MS loses its slot (DEADLINE_EXCEEDED)"},
    {"call-idle-ms", RA_OPT_INT, AT(call_idle_ms), .lo = 1, .hi = 86400000, .meta = "MS",
     .help = "a call waiting longer than MS for its next message (an idle Attend stream, a stalled PutKv) loses its "
             "slot"},
    {"keepalive-ms", RA_OPT_INT, AT(keepalive_ms), .lo = 100, .hi = 3600000, .meta = "MS",
     .help = "ping every connection this often; one whose ack does not come within as long loses its calls"},
    {"tls-cert", RA_OPT_STRING, AT(tls_cert), .meta = "FILE", .help = "serve TLS with this PEM certificate chain"},
    {"tls-key", RA_OPT_STRING, AT(tls_key), .meta = "FILE", .help = "the PEM private key of --tls-cert"},
    {"tls-ca", RA_OPT_STRING, AT(tls_ca), .meta = "FILE",
     .help = "mutual TLS: require client certificates signed by this PEM CA"},
    {"auth-token-file", RA_OPT_STRING, AT(auth_token_file), .meta = "FILE",
     .help = "accept only calls bearing one of these tokens (one a line, '#' comments); others: UNAUTHENTICATED"},
    {"max-message", RA_OPT_SIZE, AT(max_message_bytes), .ulo = 1024, .uhi = INT_MAX, .meta = "SIZE",
     .help = "largest request message accepted"},
    {"grace-ms", RA_OPT_INT, AT(grace_ms), .lo = 0, .hi = 3600000, .meta = "MS",
     .help = "shutdown waits this long for running calls"},
    {"session-idle-timeout", RA_OPT_INT, AT(session_idle_s), .lo = 0, .hi = 30 * 86400, .meta = "S",
     .help = "close sessions no request touched for S seconds: the lease of a worker that went away; 0: never"},
    {"data-dir", RA_OPT_STRING, AT(data_dir), .meta = "DIR",
     .help = "keep every session's K/V, index and cluster state in DIR (checksummed segment files) and restore "
             "the sessions found there at start, so a restarted store (kill -9 included) has them back"},
    {"fsync-ms", RA_OPT_INT, AT(fsync_ms), .lo = -1, .hi = 3600000, .meta = "MS",
     .help = "--data-dir: sync the journals every MS in the background (a machine crash loses at most that "
             "window; a killed process nothing); 0: each write before its reply; -1: never"},
    {"ready-file", RA_OPT_STRING, AT(ready_file), .meta = "PATH", .help = "write the bound HOST:PORT here once serving"},
    {"log-level", RA_OPT_ENUM, AT(log_level), .lo = RA_LOG_DEBUG, .hi = RA_LOG_ERROR, .name_of = level_name,
     .help = "log messages of this level and above"},
    {"help", RA_OPT_FLAG, AT(help), .help = "print this help"},
};
#undef AT

void kvs_config_usage(FILE *f) {
  kvs_config d;
  config_default(&d);
  ra_opts_table t = {rows, RA_OPTS_COUNT(rows), &d, NULL};
  ra_opts_set s = {&t, 1, NULL, 0};
  fputs("usage: kv-store --listen HOST:PORT [options]\n", f);
  ra_opts_usage(&s, f);
}

void kvs_config_free(kvs_config *c) {
  free(c->config_text);
  c->config_text = NULL;
}

int kvs_config_parse(int argc, char **argv, kvs_config *out, ra_error *err) {
  config_default(out);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      out->help = 1;
      return RA_OK;
    }
  }
  ra_opts_table t = {rows, RA_OPTS_COUNT(rows), out, NULL};
  ra_opts_set s = {&t, 1, NULL, 0};
  int rc = ra_opts_parse_args(&s, argc - 1, argv + 1, err);
  if (rc == RA_OK && out->config) {
    /* the file first, then the command line again over it */
    const char *path = out->config;
    config_default(out);
    char *text = NULL;
    rc = ra_opts_parse_file(&s, path, &text, err);
    out->config_text = text;
    if (rc == RA_OK) rc = ra_opts_parse_args(&s, argc - 1, argv + 1, err);
  }
  if (rc == RA_OK && !out->listen) rc = ra_errorf(err, RA_EINVAL, "--listen HOST:PORT is required");
  if (rc == RA_OK && (!out->tls_cert) != (!out->tls_key))
    rc = ra_errorf(err, RA_EINVAL, "--tls-cert and --tls-key go together");
  if (rc == RA_OK && out->tls_ca && !out->tls_cert)
    rc = ra_errorf(err, RA_EINVAL, "--tls-ca (mutual TLS) needs --tls-cert and --tls-key");
  if (rc != RA_OK) kvs_config_free(out);
  return rc;
}
