#include "log.h"

#include "status.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int ra_log_level_now = -1; /* -1: not yet read from the environment */
static char ra_log_name[32] = "ra";
static pthread_mutex_t ra_log_lock = PTHREAD_MUTEX_INITIALIZER;

const char *ra_log_level_name(enum ra_log_level level) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  return (unsigned)level < 4 ? names[level] : "?";
}

int ra_log_parse_level(const char *name, enum ra_log_level *out) {
  for (int i = RA_LOG_DEBUG; i <= RA_LOG_ERROR; i++) {
    if (strcmp(name, ra_log_level_name((enum ra_log_level)i)) == 0) {
      *out = (enum ra_log_level)i;
      return RA_OK;
    }
  }
  return RA_EINVAL;
}

void ra_log_set_level(enum ra_log_level level) { ra_log_level_now = (int)level; }

void ra_log_set_name(const char *name) {
  pthread_mutex_lock(&ra_log_lock);
  snprintf(ra_log_name, sizeof ra_log_name, "%s", name);
  pthread_mutex_unlock(&ra_log_lock);
}

void ra_log(enum ra_log_level level, const char *fmt, ...) {
  if (ra_log_level_now < 0) {
    enum ra_log_level l = RA_LOG_INFO;
    const char *env = getenv("RA_LOG_LEVEL");
    if (env) ra_log_parse_level(env, &l);
    ra_log_level_now = (int)l;
  }
  if ((int)level < ra_log_level_now) return;

  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  char line[1024];
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s: ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, "DIWE"[level], ra_log_name);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&ra_log_lock);
  fprintf(stderr, "%s\n", line);
  pthread_mutex_unlock(&ra_log_lock);
}

static int escape_plain(unsigned char ch) { return ch >= 0x20 && ch < 0x7f && ch != '\\'; }

char *ra_log_escape(const char *s, size_t len, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  if (cap == 0) return out;
  size_t whole = 0;
  for (size_t i = 0; i < len; i++) whole += escape_plain((unsigned char)s[i]) ? 1 : 4;
  /* what does not fit whole is cut, with room kept for "..." */
  size_t room = whole < cap ? cap - 1 : (cap > 4 ? cap - 4 : 0), o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (o + (escape_plain(ch) ? 1 : 4) > room) break;
    if (escape_plain(ch)) {
      out[o++] = (char)ch;
    } else {
      out[o++] = '\\';
      out[o++] = 'x';
      out[o++] = hex[ch >> 4];
      out[o++] = hex[ch & 15];
    }
  }
  if (whole >= cap && cap > 4) {
    memcpy(out + o, "...", 3);
    o += 3;
  }
  out[o] = '\0';
  return out;
}
