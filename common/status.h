/* Status codes and error messages shared by every module.
 *
 * Functions return 0 (RA_OK) on success and a negative RA_E* code on failure, libuv style.
 * Where a caller needs to know *what* was wrong (a gRPC status message, a CLI error), the
 * function also takes an `ra_error *` that it fills with a one-line message; NULL is allowed. */
#ifndef RA_STATUS_H
#define RA_STATUS_H

#include <stddef.h>

enum {
  RA_OK = 0,
  RA_EOF = 1,            /* not an error: the end of a stream */
  RA_EINVAL = -1,        /* the caller's input is wrong */
  RA_ENOTFOUND = -2,     /* no such session, file, key */
  RA_ENOMEM = -3,        /* allocation failed or the memory budget would be exceeded */
  RA_EEXIST = -4,        /* already exists / already done */
  RA_EIO = -5,           /* a file or socket operation failed */
  RA_EFORMAT = -6,       /* malformed file or message */
  RA_EUNAVAIL = -7,      /* a peer is unreachable or went away */
  RA_ETIMEDOUT = -8,     /* a deadline passed */
  RA_ECANCELED = -9,     /* the operation was cancelled (shutdown, peer cancel) */
  RA_EUNSUPPORTED = -10, /* valid but not implemented for this case */
  RA_ESTATE = -11,       /* not valid in the current state (e.g. index not built) */
  RA_EINTERNAL = -12,    /* a bug: an invariant did not hold */
  RA_EAUTH = -13,        /* no valid credential came with the request */
  RA_EPERM = -14,        /* the credential does not allow this (another's session) */
};

#define RA_ERROR_MSG_MAX 320

typedef struct ra_error {
  int code;
  char msg[RA_ERROR_MSG_MAX];
} ra_error;

/* The constant name of a code, e.g. "RA_EINVAL". */
const char *ra_status_name(int code);
/* A short human description of a code, e.g. "invalid argument". */
const char *ra_strerror(int code);

/* Records `code` and a printf-style message in `err` (if not NULL) and returns `code`, so that
 * failures read `return ra_errorf(err, RA_EINVAL, "layer %u out of range", l);`. */
int ra_errorf(ra_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes err->msg with more context ("store 127.0.0.1:5000: ..."); returns err->code. */
int ra_error_wrap(ra_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void ra_error_clear(ra_error *err);

/* The gRPC status code (its wire number: 0 OK, 3 INVALID_ARGUMENT, ...) that stands for an RA
 * code, and back (a status with no RA meaning of its own is RA_EINTERNAL). common/rpc.c ends
 * calls with it; a message that carries several outcomes (proto AttendItemReply) carries it too. */
int ra_status_to_grpc(int code);
int ra_status_from_grpc(int status);

#endif
