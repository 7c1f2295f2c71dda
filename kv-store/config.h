/* kv-store command-line flags:
 *   kv-store --listen HOST:PORT [--config FILE] [--memory-budget SIZE] [--threads N]
 *            [--index-threads N] [--max-calls N] [--max-message SIZE] [--grace-ms MS]
 *            [--session-idle-timeout S] [--data-dir DIR] [--fsync-ms MS] [--ready-file PATH]
 *            [--log-level LEVEL] [--max-waiting N] [--first-message-ms MS] [--call-idle-ms MS]
 *            [--keepalive-ms MS] [--tls-cert FILE --tls-key FILE [--tls-ca FILE]] [--auth-token-file FILE]
 * SIZE is bytes with an optional binary suffix: 4096, 512K, 512M, 64G, 1T. --config FILE reads
 * the same options from FILE, one "name value" per line; the command line overrides it. */
#ifndef KVS_CONFIG_H
#define KVS_CONFIG_H

#include "log.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kvs_config {
  const char *listen;         /* required */
  uint64_t memory_budget;     /* default: 80% of physical memory */
  int threads;                /* OpenMP threads per attend; 0: one per core */
  int index_threads;          /* threads inserting written rows into indexes; 0: as threads */
  int max_calls;              /* calls served at once; more are refused (RESOURCE_EXHAUSTED) */
  int max_waiting;            /* calls accepted and waiting for their first message */
  int first_message_ms;       /* a new call's wait for its first message */
  int call_idle_ms;           /* a call's wait for each next message */
  int keepalive_ms;           /* HTTP/2 ping period and ack deadline */
  const char *tls_cert, *tls_key, *tls_ca; /* PEM files; cert + key: TLS, ca too: mutual TLS */
  const char *auth_token_file; /* accepted bearer tokens, one a line; NULL: no authentication */
  size_t max_message_bytes;   /* largest request accepted */
  int grace_ms;               /* how long shutdown lets running calls finish */
  int session_idle_s;         /* a session no request touched this long is closed; 0: never */
  const char *data_dir;       /* sessions kept on disk here and restored at start (journal.h) */
  int fsync_ms;               /* journal sync: 0 every record, > 0 every MS, -1 never */
  const char *ready_file;     /* written with "HOST:PORT\n" once serving; NULL: none */
  enum ra_log_level log_level;
  const char *config;         /* --config FILE, or NULL */
  int help;                   /* --help given: print usage, exit 0 */
  char *config_text;          /* the config file's text: its string options point into it */
} kvs_config;

/* Fills `out` from argv (argv[0] is skipped) and the --config file; strings point into argv or
 * into out->config_text. On success the caller calls kvs_config_free; on failure nothing is
 * left to free. */
int kvs_config_parse(int argc, char **argv, kvs_config *out, ra_error *err);
void kvs_config_free(kvs_config *c);
void kvs_config_usage(FILE *f);

#endif
