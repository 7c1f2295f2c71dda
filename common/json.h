/* A small, strict, bounded JSON reader (RFC 8259) for config.json and safetensors headers,
 * plus a string escaper for the JSON this module writes.
 *
 * Strict: no comments, trailing commas, NaN, leading zeros or unescaped control characters;
 * strings must be valid UTF-8 after unescaping (\uXXXX surrogate pairs combined). Bounded:
 * nesting deeper than RA_JSON_MAX_DEPTH is rejected, so hostile input cannot exhaust the stack. */
#ifndef RA_JSON_H
#define RA_JSON_H

#include "status.h"

#include <stddef.h>
#include <stdio.h>

#define RA_JSON_MAX_DEPTH 64

typedef enum ra_json_type {
  RA_JSON_NULL, RA_JSON_BOOL, RA_JSON_NUMBER, RA_JSON_STRING, RA_JSON_ARRAY, RA_JSON_OBJECT
} ra_json_type;

typedef struct ra_json {
  ra_json_type type;
  int boolean;
  double num;
  char *str;             /* RA_JSON_STRING: decoded, NUL-terminated (may hold NULs: see str_len) */
  size_t str_len;
  struct ra_json *items; /* RA_JSON_ARRAY elements / RA_JSON_OBJECT values, n of them */
  char **keys;           /* RA_JSON_OBJECT keys, parallel to items */
  size_t n;
} ra_json;

/* Parses exactly one value (surrounding whitespace allowed) from text[0..len). */
int ra_json_parse(const char *text, size_t len, ra_json **out, ra_error *err);
void ra_json_free(ra_json *v);

/* The value of `key` in an object (the last one if repeated), or NULL. */
const ra_json *ra_json_get(const ra_json *obj, const char *key);
/* Typed lookups: RA_ENOTFOUND when absent, RA_EFORMAT when of another type. */
int ra_json_get_num(const ra_json *obj, const char *key, double *out);
int ra_json_get_str(const ra_json *obj, const char *key, const char **out);
int ra_json_get_bool(const ra_json *obj, const char *key, int *out);

/* Writes s as a quoted JSON string, escaping quotes, backslashes and control characters; bytes
 * that are not well-formed UTF-8 are written as U+FFFD. */
void ra_json_write_str(FILE *f, const char *s);

#endif
