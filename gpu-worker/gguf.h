/* GGUF (v2/v3) reader: maps a file, parses and validates the header, metadata and tensor table.
 *
 * Every count, length, offset and size is checked against the bytes actually present before
 * it is used or allocated for, so a truncated or malicious file gives RA_EFORMAT with a message
 * saying what is wrong, never a crash or a huge allocation. After a successful open:
 *   - every metadata string/array lies inside the file; string arrays are indexed;
 *   - every tensor has 1..4 dims, a supported type, a row length that is a multiple of its block
 *     size, a byte size that does not overflow, and data aligned and inside the file. */
#ifndef RA_GGUF_H
#define RA_GGUF_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, numbered as in the spec. */
enum {
  RA_GGUF_U8 = 0, RA_GGUF_I8 = 1, RA_GGUF_U16 = 2, RA_GGUF_I16 = 3, RA_GGUF_U32 = 4,
  RA_GGUF_I32 = 5, RA_GGUF_F32 = 6, RA_GGUF_BOOL = 7, RA_GGUF_STRING = 8, RA_GGUF_ARRAY = 9,
  RA_GGUF_U64 = 10, RA_GGUF_I64 = 11, RA_GGUF_F64 = 12,
};

#define RA_GGUF_MAX_DIMS 4

typedef struct ra_gguf_str {
  const char *ptr; /* not NUL-terminated; points into the file */
  size_t len;
} ra_gguf_str;

typedef struct ra_gguf_kv {
  ra_gguf_str key;
  uint32_t type;       /* RA_GGUF_* */
  uint32_t arr_type;   /* element type when type == RA_GGUF_ARRAY */
  uint64_t arr_n;      /* element count when type == RA_GGUF_ARRAY */
  const uint8_t *data; /* the value (scalar, string length prefix, or first array element) */
  uint64_t *str_offs;  /* for string arrays: offset of element i's length prefix from data */
} ra_gguf_kv;

typedef struct ra_gguf_tensor {
  ra_gguf_str name;
  uint32_t n_dims;
  uint64_t ne[RA_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
  uint32_t type;                 /* ra_ggml_type */
  uint64_t n_elements;
  size_t n_bytes;
  const uint8_t *data;
} ra_gguf_tensor;

typedef struct ra_gguf {
  const uint8_t *base; /* the whole file */
  size_t size;
  int mapped; /* base came from mmap (closed with munmap) */
  uint32_t version;
  uint32_t alignment;
  ra_gguf_kv *kvs;
  uint64_t n_kv;
  ra_gguf_tensor *tensors;
  uint64_t n_tensors;
} ra_gguf;

/* Maps and parses `path`. */
int ra_gguf_open(const char *path, ra_gguf *out, ra_error *err);
/* Parses a file image in memory; the caller keeps `data` alive until ra_gguf_close. */
int ra_gguf_parse(const void *data, size_t size, ra_gguf *out, ra_error *err);
void ra_gguf_close(ra_gguf *g);

/* NULL when absent. */
const ra_gguf_kv *ra_gguf_find(const ra_gguf *g, const char *key);
const ra_gguf_tensor *ra_gguf_find_tensor(const ra_gguf *g, const char *name);

/* Typed getters: RA_ENOTFOUND when the key is absent, RA_EFORMAT (with message) when it has an
 * incompatible type. Integers of any width convert when the value fits. */
int ra_gguf_get_u32(const ra_gguf *g, const char *key, uint32_t *out, ra_error *err);
int ra_gguf_get_f32(const ra_gguf *g, const char *key, float *out, ra_error *err);
int ra_gguf_get_bool(const ra_gguf *g, const char *key, int *out, ra_error *err);
int ra_gguf_get_str(const ra_gguf *g, const char *key, ra_gguf_str *out, ra_error *err);
/* Element i of a string array. */
ra_gguf_str ra_gguf_arr_str(const ra_gguf_kv *kv, uint64_t i);
/* Element i of a numeric array as double (ints, floats, bools). */
double ra_gguf_arr_num(const ra_gguf_kv *kv, uint64_t i);

/* True when s equals the NUL-terminated c. */
int ra_gguf_str_eq(ra_gguf_str s, const char *c);

#endif
