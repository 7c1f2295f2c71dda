#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
  int code;
  const char *name;
  const char *text;
} ra_codes[] = {
    {RA_OK, "RA_OK", "ok"},
    {RA_EOF, "RA_EOF", "end of stream"},
    {RA_EINVAL, "RA_EINVAL", "invalid argument"},
    {RA_ENOTFOUND, "RA_ENOTFOUND", "not found"},
    {RA_ENOMEM, "RA_ENOMEM", "out of memory or over budget"},
    {RA_EEXIST, "RA_EEXIST", "already exists"},
    {RA_EIO, "RA_EIO", "i/o error"},
    {RA_EFORMAT, "RA_EFORMAT", "malformed data"},
    {RA_EUNAVAIL, "RA_EUNAVAIL", "unavailable"},
    {RA_ETIMEDOUT, "RA_ETIMEDOUT", "timed out"},
    {RA_ECANCELED, "RA_ECANCELED", "cancelled"},
    {RA_EUNSUPPORTED, "RA_EUNSUPPORTED", "not supported"},
    {RA_ESTATE, "RA_ESTATE", "invalid state"},
    {RA_EINTERNAL, "RA_EINTERNAL", "internal error"},
    {RA_EAUTH, "RA_EAUTH", "unauthenticated"},
    {RA_EPERM, "RA_EPERM", "permission denied"},
};

static int ra_code_index(int code) {
  for (size_t i = 0; i < sizeof ra_codes / sizeof ra_codes[0]; i++)
    if (ra_codes[i].code == code) return (int)i;
  return -1;
}

const char *ra_status_name(int code) {
  int i = ra_code_index(code);
  return i < 0 ? "RA_E?" : ra_codes[i].name;
}

const char *ra_strerror(int code) {
  int i = ra_code_index(code);
  return i < 0 ? "unknown error" : ra_codes[i].text;
}

int ra_errorf(ra_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int ra_error_wrap(ra_error *err, const char *fmt, ...) {
  if (!err) return RA_EINTERNAL;
  char old[RA_ERROR_MSG_MAX];
  memcpy(old, err->msg, sizeof old);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  /* Truncation is acceptable here: a message is for people, and the code stays exact. */
  if (n < 0) n = 0;
  size_t used = (size_t)n < sizeof err->msg ? (size_t)n : sizeof err->msg - 1;
  const char *parts[2] = {": ", old};
  for (int p = 0; p < 2; p++) {
    size_t len = strlen(parts[p]), room = sizeof err->msg - 1 - used;
    if (len > room) len = room;
    memcpy(err->msg + used, parts[p], len);
    used += len;
  }
  err->msg[used] = '\0';
  return err->code;
}

void ra_error_clear(ra_error *err) {
  if (err) {
    err->code = RA_OK;
    err->msg[0] = '\0';
  }
}

/* gRPC's status codes by wire number (grpc/status.h; fixed by the gRPC protocol). */
enum {
  G_OK = 0, G_CANCELLED = 1, G_INVALID_ARGUMENT = 3, G_DEADLINE_EXCEEDED = 4, G_NOT_FOUND = 5,
  G_ALREADY_EXISTS = 6, G_PERMISSION_DENIED = 7, G_RESOURCE_EXHAUSTED = 8, G_FAILED_PRECONDITION = 9,
  G_OUT_OF_RANGE = 11, G_UNIMPLEMENTED = 12, G_INTERNAL = 13, G_UNAVAILABLE = 14, G_UNAUTHENTICATED = 16,
};

int ra_status_to_grpc(int code) {
  switch (code) {
    case RA_OK: return G_OK;
    case RA_EINVAL:
    case RA_EFORMAT: return G_INVALID_ARGUMENT;
    case RA_ENOTFOUND: return G_NOT_FOUND;
    case RA_ENOMEM: return G_RESOURCE_EXHAUSTED;
    case RA_EEXIST: return G_ALREADY_EXISTS;
    case RA_ESTATE: return G_FAILED_PRECONDITION;
    case RA_EUNSUPPORTED: return G_UNIMPLEMENTED;
    case RA_ETIMEDOUT: return G_DEADLINE_EXCEEDED;
    case RA_EUNAVAIL: return G_UNAVAILABLE;
    case RA_ECANCELED: return G_CANCELLED;
    case RA_EAUTH: return G_UNAUTHENTICATED;
    case RA_EPERM: return G_PERMISSION_DENIED;
    default: return G_INTERNAL;
  }
}

int ra_status_from_grpc(int status) {
  switch (status) {
    case G_OK: return RA_OK;
    case G_INVALID_ARGUMENT:
    case G_OUT_OF_RANGE: return RA_EINVAL;
    case G_NOT_FOUND: return RA_ENOTFOUND;
    case G_RESOURCE_EXHAUSTED: return RA_ENOMEM;
    case G_ALREADY_EXISTS: return RA_EEXIST;
    case G_FAILED_PRECONDITION: return RA_ESTATE;
    case G_UNIMPLEMENTED: return RA_EUNSUPPORTED;
    case G_DEADLINE_EXCEEDED: return RA_ETIMEDOUT;
    case G_UNAVAILABLE: return RA_EUNAVAIL;
    case G_CANCELLED: return RA_ECANCELED;
    case G_UNAUTHENTICATED: return RA_EAUTH;
    case G_PERMISSION_DENIED: return RA_EPERM;
    default: return RA_EINTERNAL;
  }
}
