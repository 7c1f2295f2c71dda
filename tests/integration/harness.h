/* Runs real kv-store processes for integration tests: each listens on a loopback port the
 * kernel picks (--listen 127.0.0.1:0) and reports it through --ready-file. Stopping sends
 * SIGTERM and reports the exit status, since a clean shutdown is part of what is tested. */
#ifndef RA_HARNESS_H
#define RA_HARNESS_H

#include <sys/types.h>

typedef struct harness_store {
  pid_t pid;
  char addr[64];       /* "127.0.0.1:PORT" once started */
  char ready_file[256];
} harness_store;

/* Spawns $RA_BIN_DIR/kv-store with extra_args (NULL-terminated, may be NULL) and waits up to
 * 10 s for its ready file. 0 on success; -1 (and the process reaped) otherwise. */
int harness_store_start(harness_store *s, const char *const *extra_args);

/* SIGTERM, then waits up to timeout_ms for the exit: returns the exit code (0: clean), 128 +
 * signal when it died of a signal, or -1 when it had to be SIGKILLed. */
int harness_store_stop(harness_store *s, int timeout_ms);

#endif
