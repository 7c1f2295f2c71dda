#include "gguf.h"

#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u

/* A bounds-checked cursor over the file image. */
typedef struct cursor {
  const uint8_t *base;
  size_t size;
  size_t pos;
} cursor;

static int need(cursor *c, uint64_t n, ra_error *err, const char *what) {
  if (n > c->size - c->pos)
    return ra_errorf(err, RA_EFORMAT, "gguf: truncated: %s needs %llu bytes at offset %zu, file has %zu",
                     what, (unsigned long long)n, c->pos, c->size);
  return RA_OK;
}

static int rd_u32(cursor *c, uint32_t *v, ra_error *err, const char *what) {
  int rc = need(c, 4, err, what);
  if (rc) return rc;
  memcpy(v, c->base + c->pos, 4);
  c->pos += 4;
  return RA_OK;
}

static int rd_u64(cursor *c, uint64_t *v, ra_error *err, const char *what) {
  int rc = need(c, 8, err, what);
  if (rc) return rc;
  memcpy(v, c->base + c->pos, 8);
  c->pos += 8;
  return RA_OK;
}

static int rd_str(cursor *c, ra_gguf_str *s, ra_error *err, const char *what) {
  uint64_t len;
  int rc = rd_u64(c, &len, err, what);
  if (rc) return rc;
  if ((rc = need(c, len, err, what))) return rc;
  s->ptr = (const char *)(c->base + c->pos);
  s->len = (size_t)len;
  c->pos += (size_t)len;
  return RA_OK;
}

static size_t scalar_size(uint32_t t) {
  switch (t) {
    case RA_GGUF_U8: case RA_GGUF_I8: case RA_GGUF_BOOL: return 1;
    case RA_GGUF_U16: case RA_GGUF_I16: return 2;
    case RA_GGUF_U32: case RA_GGUF_I32: case RA_GGUF_F32: return 4;
    case RA_GGUF_U64: case RA_GGUF_I64: case RA_GGUF_F64: return 8;
    default: return 0;
  }
}

int ra_gguf_str_eq(ra_gguf_str s, const char *c) {
  size_t n = strlen(c);
  return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Parses one metadata value of type `type` at the cursor into kv (scalars and strings) and
 * checks it lies in the file. Arrays of strings get an index of element offsets. */
static int parse_value(cursor *c, ra_gguf_kv *kv, ra_error *err) {
  kv->data = c->base + c->pos;
  size_t ss = scalar_size(kv->type);
  if (ss) {
    int rc = need(c, ss, err, "metadata value");
    if (rc == RA_OK) c->pos += ss;
    return rc;
  }
  if (kv->type == RA_GGUF_STRING) {
    ra_gguf_str s;
    return rd_str(c, &s, err, "metadata string");
  }
  if (kv->type != RA_GGUF_ARRAY)
    return ra_errorf(err, RA_EFORMAT, "gguf: key '%.*s' has unknown value type %u", (int)kv->key.len,
                     kv->key.ptr, kv->type);
  int rc;
  if ((rc = rd_u32(c, &kv->arr_type, err, "array type"))) return rc;
  if ((rc = rd_u64(c, &kv->arr_n, err, "array length"))) return rc;
  kv->data = c->base + c->pos;
  ss = scalar_size(kv->arr_type);
  if (ss) {
    if (kv->arr_n > (c->size - c->pos) / ss)
      return ra_errorf(err, RA_EFORMAT, "gguf: array '%.*s' of %llu elements runs past the end of the file",
                       (int)kv->key.len, kv->key.ptr, (unsigned long long)kv->arr_n);
    c->pos += (size_t)kv->arr_n * ss;
    return RA_OK;
  }
  if (kv->arr_type != RA_GGUF_STRING)
    return ra_errorf(err, RA_EFORMAT, "gguf: array '%.*s' has unsupported element type %u",
                     (int)kv->key.len, kv->key.ptr, kv->arr_type);
  /* Each string takes at least its 8-byte length, which bounds the count before allocating. */
  if (kv->arr_n > (c->size - c->pos) / 8)
    return ra_errorf(err, RA_EFORMAT, "gguf: string array '%.*s' of %llu elements runs past the end of the file",
                     (int)kv->key.len, kv->key.ptr, (unsigned long long)kv->arr_n);
  kv->str_offs = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof(uint64_t));
  if (!kv->str_offs) return ra_errorf(err, RA_ENOMEM, "gguf: out of memory indexing '%.*s'", (int)kv->key.len, kv->key.ptr);
  size_t start = c->pos;
  for (uint64_t i = 0; i < kv->arr_n; i++) {
    kv->str_offs[i] = c->pos - start;
    ra_gguf_str s;
    if ((rc = rd_str(c, &s, err, "array string"))) return rc;
  }
  return RA_OK;
}

static void free_tables(ra_gguf *g) {
  if (g->kvs)
    for (uint64_t i = 0; i < g->n_kv; i++) free(g->kvs[i].str_offs);
  free(g->kvs);
  free(g->tensors);
  g->kvs = NULL;
  g->tensors = NULL;
}

static int parse_tensor_info(cursor *c, ra_gguf_tensor *t, uint64_t idx, ra_error *err) {
  int rc;
  if ((rc = rd_str(c, &t->name, err, "tensor name"))) return rc;
  if ((rc = rd_u32(c, &t->n_dims, err, "tensor dims"))) return rc;
  if (t->n_dims == 0 || t->n_dims > RA_GGUF_MAX_DIMS)
    return ra_errorf(err, RA_EFORMAT, "gguf: tensor %llu '%.*s' has %u dims (1..%d allowed)",
                     (unsigned long long)idx, (int)t->name.len, t->name.ptr, t->n_dims, RA_GGUF_MAX_DIMS);
  uint64_t n = 1;
  for (int d = 0; d < RA_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < t->n_dims; d++) {
    if ((rc = rd_u64(c, &t->ne[d], err, "tensor dim"))) return rc;
    if (t->ne[d] == 0 || t->ne[d] > INT64_MAX / n)
      return ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s' has an empty or overflowing shape",
                       (int)t->name.len, t->name.ptr);
    n *= t->ne[d];
  }
  t->n_elements = n;
  if ((rc = rd_u32(c, &t->type, err, "tensor type"))) return rc;
  if (!ra_quant_supported(t->type))
    return ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s' has unsupported type %u", (int)t->name.len,
                     t->name.ptr, t->type);
  if (t->ne[0] % ra_quant_block_size(t->type) != 0)
    return ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s': row length %llu is not a multiple of %s's block of %zu",
                     (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0], ra_quant_name(t->type),
                     ra_quant_block_size(t->type));
  if (ra_quant_row_bytes(t->type, n, &t->n_bytes) != RA_OK)
    return ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s' byte size overflows", (int)t->name.len, t->name.ptr);
  uint64_t off;
  if ((rc = rd_u64(c, &off, err, "tensor offset"))) return rc;
  t->data = (const uint8_t *)(uintptr_t)off; /* relative until the data section is known */
  return RA_OK;
}

int ra_gguf_parse(const void *data, size_t size, ra_gguf *g, ra_error *err) {
  memset(g, 0, sizeof(*g));
  g->base = data;
  g->size = size;
  cursor c = {data, size, 0};
  uint32_t magic;
  uint64_t n_tensors, n_kv;
  int rc;
  if ((rc = rd_u32(&c, &magic, err, "magic"))) return rc;
  if (magic != GGUF_MAGIC) return ra_errorf(err, RA_EFORMAT, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
  if ((rc = rd_u32(&c, &g->version, err, "version"))) return rc;
  if (g->version != 2 && g->version != 3)
    return ra_errorf(err, RA_EFORMAT, "gguf: unsupported version %u (2 and 3 are)", g->version);
  if ((rc = rd_u64(&c, &n_tensors, err, "tensor count"))) return rc;
  if ((rc = rd_u64(&c, &n_kv, err, "metadata count"))) return rc;
  /* A kv takes >= 8+4+1 bytes and a tensor info >= 8+4+8+4+8: bound counts by the file size. */
  if (n_kv > (size - c.pos) / 13)
    return ra_errorf(err, RA_EFORMAT, "gguf: metadata count %llu is larger than the file can hold",
                     (unsigned long long)n_kv);
  if (n_tensors > (size - c.pos) / 32)
    return ra_errorf(err, RA_EFORMAT, "gguf: tensor count %llu is larger than the file can hold",
                     (unsigned long long)n_tensors);
  g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof(ra_gguf_kv));
  g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(ra_gguf_tensor));
  if (!g->kvs || !g->tensors) {
    free_tables(g);
    return ra_errorf(err, RA_ENOMEM, "gguf: out of memory for %llu tensors", (unsigned long long)n_tensors);
  }
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  for (uint64_t i = 0; i < n_kv; i++) {
    ra_gguf_kv *kv = &g->kvs[i];
    g->n_kv = i + 1; /* so free_tables sees partially parsed entries */
    if ((rc = rd_str(&c, &kv->key, err, "metadata key"))) goto fail;
    if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY_LEN) {
      rc = ra_errorf(err, RA_EFORMAT, "gguf: metadata key %llu has bad length %zu", (unsigned long long)i, kv->key.len);
      goto fail;
    }
    if ((rc = rd_u32(&c, &kv->type, err, "metadata type"))) goto fail;
    if ((rc = parse_value(&c, kv, err))) goto fail;
    if (ra_gguf_str_eq(kv->key, "general.alignment")) {
      if (kv->type != RA_GGUF_U32) {
        rc = ra_errorf(err, RA_EFORMAT, "gguf: general.alignment must be uint32");
        goto fail;
      }
      memcpy(&g->alignment, kv->data, 4);
      if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) || g->alignment > (1u << 20)) {
        rc = ra_errorf(err, RA_EFORMAT, "gguf: general.alignment %u is not a power of two <= 1 MiB", g->alignment);
        goto fail;
      }
    }
  }
  for (uint64_t i = 0; i < n_tensors; i++) {
    g->n_tensors = i + 1;
    if ((rc = parse_tensor_info(&c, &g->tensors[i], i, err))) goto fail;
  }
  size_t data_start = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
  if (n_tensors > 0 && data_start > size) {
    rc = ra_errorf(err, RA_EFORMAT, "gguf: truncated before the tensor data section");
    goto fail;
  }
  for (uint64_t i = 0; i < n_tensors; i++) {
    ra_gguf_tensor *t = &g->tensors[i];
    uint64_t off = (uint64_t)(uintptr_t)t->data;
    if (off % g->alignment != 0) {
      rc = ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s' offset %llu is not aligned to %u", (int)t->name.len,
                     t->name.ptr, (unsigned long long)off, g->alignment);
      goto fail;
    }
    if (off > size - data_start || t->n_bytes > size - data_start - off) {
      rc = ra_errorf(err, RA_EFORMAT, "gguf: tensor '%.*s' data [%llu, +%zu) lies past the end of the file",
                     (int)t->name.len, t->name.ptr, (unsigned long long)off, t->n_bytes);
      goto fail;
    }
    t->data = g->base + data_start + off;
  }
  return RA_OK;
fail:
  free_tables(g);
  g->n_kv = g->n_tensors = 0;
  return rc;
}

int ra_gguf_open(const char *path, ra_gguf *g, ra_error *err) {
  memset(g, 0, sizeof(*g));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ra_errorf(err, errno == ENOENT ? RA_ENOTFOUND : RA_EIO, "gguf: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return ra_errorf(err, RA_EFORMAT, "gguf: %s is empty or cannot be stat'ed", path);
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ra_errorf(err, RA_EIO, "gguf: cannot mmap %s: %s", path, strerror(errno));
  int rc = ra_gguf_parse(p, (size_t)st.st_size, g, err);
  if (rc != RA_OK) {
    munmap(p, (size_t)st.st_size);
    memset(g, 0, sizeof(*g));
    return ra_error_wrap(err, "%s", path);
  }
  g->mapped = 1;
  return RA_OK;
}

void ra_gguf_close(ra_gguf *g) {
  free_tables(g);
  if (g->mapped) munmap((void *)g->base, g->size);
  memset(g, 0, sizeof(*g));
}

const ra_gguf_kv *ra_gguf_find(const ra_gguf *g, const char *key) {
  for (uint64_t i = 0; i < g->n_kv; i++)
    if (ra_gguf_str_eq(g->kvs[i].key, key)) return &g->kvs[i];
  return NULL;
}

const ra_gguf_tensor *ra_gguf_find_tensor(const ra_gguf *g, const char *name) {
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if (ra_gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
  return NULL;
}

/* Reads a numeric value of metadata type t at p as double, and whether it is an integer type. */
static double num_at(uint32_t t, const uint8_t *p) {
  switch (t) {
    case RA_GGUF_U8: return p[0];
    case RA_GGUF_I8: return (int8_t)p[0];
    case RA_GGUF_BOOL: return p[0] != 0;
    case RA_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case RA_GGUF_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case RA_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case RA_GGUF_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case RA_GGUF_F32: { float v; memcpy(&v, p, 4); return v; }
    case RA_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case RA_GGUF_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case RA_GGUF_F64: { double v; memcpy(&v, p, 8); return v; }
    default: return 0.0;
  }
}

static int is_int_type(uint32_t t) {
  return t == RA_GGUF_U8 || t == RA_GGUF_I8 || t == RA_GGUF_U16 || t == RA_GGUF_I16 || t == RA_GGUF_U32 ||
         t == RA_GGUF_I32 || t == RA_GGUF_U64 || t == RA_GGUF_I64;
}

int ra_gguf_get_u32(const ra_gguf *g, const char *key, uint32_t *out, ra_error *err) {
  const ra_gguf_kv *kv = ra_gguf_find(g, key);
  if (!kv) return ra_errorf(err, RA_ENOTFOUND, "gguf: missing key %s", key);
  if (!is_int_type(kv->type)) return ra_errorf(err, RA_EFORMAT, "gguf: key %s is not an integer", key);
  double v = num_at(kv->type, kv->data);
  if (v < 0 || v > 4294967295.0) return ra_errorf(err, RA_EFORMAT, "gguf: key %s = %g does not fit uint32", key, v);
  *out = (uint32_t)v;
  return RA_OK;
}

int ra_gguf_get_f32(const ra_gguf *g, const char *key, float *out, ra_error *err) {
  const ra_gguf_kv *kv = ra_gguf_find(g, key);
  if (!kv) return ra_errorf(err, RA_ENOTFOUND, "gguf: missing key %s", key);
  if (!scalar_size(kv->type) || kv->type == RA_GGUF_BOOL)
    return ra_errorf(err, RA_EFORMAT, "gguf: key %s is not a number", key);
  *out = (float)num_at(kv->type, kv->data);
  return RA_OK;
}

int ra_gguf_get_bool(const ra_gguf *g, const char *key, int *out, ra_error *err) {
  const ra_gguf_kv *kv = ra_gguf_find(g, key);
  if (!kv) return ra_errorf(err, RA_ENOTFOUND, "gguf: missing key %s", key);
  if (kv->type != RA_GGUF_BOOL) return ra_errorf(err, RA_EFORMAT, "gguf: key %s is not a bool", key);
  *out = kv->data[0] != 0;
  return RA_OK;
}

int ra_gguf_get_str(const ra_gguf *g, const char *key, ra_gguf_str *out, ra_error *err) {
  const ra_gguf_kv *kv = ra_gguf_find(g, key);
  if (!kv) return ra_errorf(err, RA_ENOTFOUND, "gguf: missing key %s", key);
  if (kv->type != RA_GGUF_STRING) return ra_errorf(err, RA_EFORMAT, "gguf: key %s is not a string", key);
  uint64_t len;
  memcpy(&len, kv->data, 8);
  out->ptr = (const char *)kv->data + 8;
  out->len = (size_t)len;
  return RA_OK;
}

ra_gguf_str ra_gguf_arr_str(const ra_gguf_kv *kv, uint64_t i) {
  const uint8_t *p = kv->data + kv->str_offs[i];
  uint64_t len;
  memcpy(&len, p, 8);
  return (ra_gguf_str){(const char *)p + 8, (size_t)len};
}

double ra_gguf_arr_num(const ra_gguf_kv *kv, uint64_t i) {
  return num_at(kv->arr_type, kv->data + i * scalar_size(kv->arr_type));
}
