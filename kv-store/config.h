/* kv-store command-line flags:
 *   kv-store --listen HOST:PORT [--memory-budget SIZE] [--threads N] [--index-threads N]
 *            [--max-calls N]
 *            [--max-message SIZE] [--grace-ms MS] [--session-idle-timeout S] [--ready-file PATH]
 *            [--log-level LEVEL]
 * SIZE is bytes with an optional binary suffix: 4096, 512K, 512M, 64G, 1T. */
#ifndef KVS_CONFIG_H
#define KVS_CONFIG_H

#include "log.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_config {
  const char *listen;         /* required */
  uint64_t memory_budget;     /* default: 80% of physical memory */
  int threads;                /* OpenMP threads per attend; 0: one per core */
  int index_threads;          /* threads inserting written rows into indexes; 0: as threads */
  int max_calls;              /* calls served at once */
  size_t max_message_bytes;   /* largest request accepted */
  int grace_ms;               /* how long shutdown lets running calls finish */
  int session_idle_s;         /* a session no request touched this long is closed; 0: never */
  const char *ready_file;     /* written with "HOST:PORT\n" once serving; NULL: none */
  enum ra_log_level log_level;
  int help;                   /* --help given: print usage, exit 0 */
} kvs_config;

/* Fills `out` from argv (argv[0] is skipped); strings point into argv. */
int kvs_config_parse(int argc, char **argv, kvs_config *out, ra_error *err);
/* "512M" -> 536870912; RA_EINVAL when not a size. */
int kvs_parse_size(const char *s, uint64_t *out);
const char *kvs_config_usage(void);

#endif
