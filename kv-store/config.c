#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVS_DEFAULT_MAX_CALLS 64
#define KVS_DEFAULT_MAX_MESSAGE (64u << 20)
#define KVS_DEFAULT_GRACE_MS 2000

const char *kvs_config_usage(void) {
  return "usage: kv-store --listen HOST:PORT [options]\n"
         "  --listen HOST:PORT     address to serve on (port 0: any free port)\n"
         "  --memory-budget SIZE   KV bytes the store may hold, e.g. 64G (default 80% of RAM)\n"
         "  --threads N            OpenMP threads per attend (default: one per core)\n"
         "  --index-threads N      threads inserting decoded rows into indexes (default: --threads)\n"
         "  --max-calls N          calls served at once (default 64)\n"
         "  --max-message SIZE     largest request message accepted (default 64M)\n"
         "  --grace-ms MS          shutdown waits this long for running calls (default 2000)\n"
         "  --session-idle-timeout S  close sessions no request touched for S seconds: the lease\n"
         "                         of a worker that went away (default 600; 0: never)\n"
         "  --ready-file PATH      write the bound HOST:PORT here once serving\n"
         "  --log-level LEVEL      debug|info|warn|error (default info)\n";
}

int kvs_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-') return RA_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return RA_EINVAL;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: return RA_EINVAL;
  }
  if (*end && end[1] != '\0' && !((end[1] == 'B' || end[1] == 'b') && end[2] == '\0'))
    return RA_EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return RA_EINVAL;
  *out = (uint64_t)v << shift;
  return RA_OK;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return RA_EINVAL;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return RA_EINVAL;
  *out = v;
  return RA_OK;
}

static uint64_t default_budget(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 1ull << 30;
  return (uint64_t)pages * (uint64_t)page / 10 * 8;
}

int kvs_config_parse(int argc, char **argv, kvs_config *out, ra_error *err) {
  *out = (kvs_config){
      .memory_budget = default_budget(),
      .max_calls = KVS_DEFAULT_MAX_CALLS,
      .max_message_bytes = KVS_DEFAULT_MAX_MESSAGE,
      .grace_ms = KVS_DEFAULT_GRACE_MS,
      .session_idle_s = 600,
      .log_level = RA_LOG_INFO,
  };
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i];
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
      out->help = 1;
      return RA_OK;
    }
    if (strncmp(flag, "--", 2) != 0)
      return ra_errorf(err, RA_EINVAL, "unexpected argument '%s'", flag);
    if (i + 1 >= argc) return ra_errorf(err, RA_EINVAL, "%s needs a value", flag);
    const char *val = argv[++i];
    long n;
    uint64_t size;
    if (strcmp(flag, "--listen") == 0) {
      if (!strchr(val, ':'))
        return ra_errorf(err, RA_EINVAL, "--listen '%s' is not HOST:PORT", val);
      out->listen = val;
    } else if (strcmp(flag, "--memory-budget") == 0) {
      if (kvs_parse_size(val, &size) != RA_OK || size == 0)
        return ra_errorf(err, RA_EINVAL, "--memory-budget '%s' is not a size like 64G or 512M",
                         val);
      out->memory_budget = size;
    } else if (strcmp(flag, "--threads") == 0) {
      if (parse_int(val, 1, 1024, &n) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--threads '%s' is not a number in [1, 1024]", val);
      out->threads = (int)n;
    } else if (strcmp(flag, "--index-threads") == 0) {
      if (parse_int(val, 1, 1024, &n) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--index-threads '%s' is not a number in [1, 1024]", val);
      out->index_threads = (int)n;
    } else if (strcmp(flag, "--max-calls") == 0) {
      if (parse_int(val, 1, 4096, &n) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--max-calls '%s' is not a number in [1, 4096]", val);
      out->max_calls = (int)n;
    } else if (strcmp(flag, "--max-message") == 0) {
      if (kvs_parse_size(val, &size) != RA_OK || size < 1024 || size > INT_MAX)
        return ra_errorf(err, RA_EINVAL, "--max-message '%s' is not a size in [1K, 2G)", val);
      out->max_message_bytes = (size_t)size;
    } else if (strcmp(flag, "--grace-ms") == 0) {
      if (parse_int(val, 0, 3600000, &n) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--grace-ms '%s' is not a number in [0, 3600000]", val);
      out->grace_ms = (int)n;
    } else if (strcmp(flag, "--session-idle-timeout") == 0) {
      if (parse_int(val, 0, 30 * 86400, &n) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--session-idle-timeout '%s' is not seconds in [0, 2592000]", val);
      out->session_idle_s = (int)n;
    } else if (strcmp(flag, "--ready-file") == 0) {
      out->ready_file = val;
    } else if (strcmp(flag, "--log-level") == 0) {
      if (ra_log_parse_level(val, &out->log_level) != RA_OK)
        return ra_errorf(err, RA_EINVAL, "--log-level '%s' is not debug, info, warn or error",
                         val);
    } else {
      return ra_errorf(err, RA_EINVAL, "unknown flag %s", flag);
    }
  }
  if (!out->listen) return ra_errorf(err, RA_EINVAL, "--listen HOST:PORT is required");
  return RA_OK;
}
