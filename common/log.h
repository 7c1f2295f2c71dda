/* Leveled logging to stderr: "2026-11-29T09:00:00.123Z I kv-store: listening on 127.0.0.1:5000".
 * The level comes from RA_LOG_LEVEL (debug|info|warn|error, default info) or ra_log_set_level. */
#ifndef RA_LOG_H
#define RA_LOG_H

#include <stddef.h>

enum ra_log_level { RA_LOG_DEBUG = 0, RA_LOG_INFO = 1, RA_LOG_WARN = 2, RA_LOG_ERROR = 3 };

void ra_log_set_level(enum ra_log_level level);
/* Parses "debug", "info", "warn" or "error"; returns 0 or RA_EINVAL. */
int ra_log_parse_level(const char *name, enum ra_log_level *out);
const char *ra_log_level_name(enum ra_log_level level); /* "?" for no level */
/* The name printed after the level letter, e.g. "kv-store". */
void ra_log_set_name(const char *name);
void ra_log(enum ra_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies len bytes of a string a peer sent (a client name, a method path) into out ([cap],
 * NUL-terminated, cut with "..." when longer) with every byte that is not printable ASCII, and
 * the backslash, written as \xNN: a newline in it cannot forge a log line. Returns out. */
char *ra_log_escape(const char *s, size_t len, char *out, size_t cap);

#define ra_log_debug(...) ra_log(RA_LOG_DEBUG, __VA_ARGS__)
#define ra_log_info(...) ra_log(RA_LOG_INFO, __VA_ARGS__)
#define ra_log_warn(...) ra_log(RA_LOG_WARN, __VA_ARGS__)
#define ra_log_error(...) ra_log(RA_LOG_ERROR, __VA_ARGS__)

#endif
