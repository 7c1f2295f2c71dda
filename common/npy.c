#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* A cursor over the header dict text. */
typedef struct {
  const char *p, *end;
} cur;

static void skip_ws(cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cur *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

/* A Python string literal in ' or " without escapes, into out[cap]. */
static int parse_str(cur *c, char *out, size_t cap) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
  char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || n + 1 >= cap) return 0;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end) return 0;
  c->p++;
  out[n] = '\0';
  return 1;
}

static int parse_u64(cur *c, uint64_t *v) {
  skip_ws(c);
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
  uint64_t x = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    unsigned d = (unsigned)(*c->p - '0');
    if (x > (UINT64_MAX - d) / 10) return 0;
    x = x * 10 + d;
    c->p++;
  }
  if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs, as old numpy wrote */
  *v = x;
  return 1;
}

static int parse_word(cur *c, const char *w) {
  skip_ws(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return 0;
  c->p += n;
  return 1;
}

int ra_npy_parse_header(const void *buf, size_t len, ra_dtype *dtype, uint64_t *rows,
                        uint64_t *cols, size_t *data_offset, ra_error *err) {
  const unsigned char *b = buf;
  if (len < 10 || memcmp(b, MAGIC, sizeof MAGIC) != 0)
    return ra_errorf(err, RA_EFORMAT, "npy: not a .npy file (bad magic)");
  unsigned major = b[6], minor = b[7];
  size_t pre, hlen;
  if (major == 1 && minor == 0) {
    pre = 10;
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
  } else if (major == 2 && minor == 0) {
    if (len < 12) return ra_errorf(err, RA_EFORMAT, "npy: truncated preamble");
    pre = 12;
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
  } else {
    return ra_errorf(err, RA_EUNSUPPORTED, "npy: format version %u.%u (only 1.0 and 2.0)", major,
                     minor);
  }
  if (hlen > RA_NPY_MAX_HEADER)
    return ra_errorf(err, RA_EUNSUPPORTED, "npy: header of %zu bytes (max %u)", hlen,
                     RA_NPY_MAX_HEADER);
  if (len < pre + hlen)
    return ra_errorf(err, RA_EFORMAT, "npy: truncated header (%zu of %zu bytes)", len - pre, hlen);
  cur c = {(const char *)b + pre, (const char *)b + pre + hlen};
  if (hlen == 0 || c.end[-1] != '\n')
    return ra_errorf(err, RA_EFORMAT, "npy: header does not end with a newline");
  if (!eat(&c, '{')) return ra_errorf(err, RA_EFORMAT, "npy: header is not a dict");
  int have_descr = 0, have_order = 0, have_shape = 0;
  uint64_t shape[2] = {0, 0};
  ra_dtype dt = RA_DTYPE_F32;
  for (;;) {
    char key[32];
    skip_ws(&c);
    if (eat(&c, '}')) break;
    size_t at = (size_t)(c.p - (const char *)b);
    if (!parse_str(&c, key, sizeof key) || !eat(&c, ':'))
      return ra_errorf(err, RA_EFORMAT, "npy: bad dict key at byte %zu", at);
    if (strcmp(key, "descr") == 0) {
      char d[16];
      if (have_descr++) return ra_errorf(err, RA_EFORMAT, "npy: 'descr' given twice");
      if (!parse_str(&c, d, sizeof d))
        return ra_errorf(err, RA_EFORMAT, "npy: 'descr' is not a simple string");
      if (strcmp(d, "<f4") == 0)
        dt = RA_DTYPE_F32;
      else if (strcmp(d, "<f2") == 0)
        dt = RA_DTYPE_F16;
      else
        return ra_errorf(err, RA_EUNSUPPORTED, "npy: dtype '%s' (only '<f2' and '<f4')", d);
    } else if (strcmp(key, "fortran_order") == 0) {
      if (have_order++) return ra_errorf(err, RA_EFORMAT, "npy: 'fortran_order' given twice");
      if (parse_word(&c, "True"))
        return ra_errorf(err, RA_EUNSUPPORTED, "npy: Fortran-order arrays are not supported");
      if (!parse_word(&c, "False"))
        return ra_errorf(err, RA_EFORMAT, "npy: 'fortran_order' is not True or False");
    } else if (strcmp(key, "shape") == 0) {
      if (have_shape++) return ra_errorf(err, RA_EFORMAT, "npy: 'shape' given twice");
      if (!eat(&c, '(')) return ra_errorf(err, RA_EFORMAT, "npy: 'shape' is not a tuple");
      int rank = 0;
      while (!eat(&c, ')')) {
        uint64_t v;
        if (!parse_u64(&c, &v)) return ra_errorf(err, RA_EFORMAT, "npy: bad 'shape' entry");
        if (rank < 2) shape[rank] = v;
        rank++;
        if (!eat(&c, ',')) {
          if (!eat(&c, ')')) return ra_errorf(err, RA_EFORMAT, "npy: bad 'shape' tuple");
          break;
        }
      }
      if (rank != 2) return ra_errorf(err, RA_EUNSUPPORTED, "npy: %d-D array (only 2-D)", rank);
    } else {
      return ra_errorf(err, RA_EFORMAT, "npy: unknown header key '%s'", key);
    }
    if (!eat(&c, ',')) {
      if (!eat(&c, '}')) return ra_errorf(err, RA_EFORMAT, "npy: expected ',' or '}' in header");
      break;
    }
  }
  skip_ws(&c);
  if (c.p != c.end) return ra_errorf(err, RA_EFORMAT, "npy: trailing bytes after the header dict");
  if (!have_descr || !have_order || !have_shape)
    return ra_errorf(err, RA_EFORMAT, "npy: header lacks '%s'",
                     !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
  uint64_t es = ra_dtype_size(dt);
  if (shape[1] && shape[0] > UINT64_MAX / shape[1] / es)
    return ra_errorf(err, RA_EFORMAT, "npy: shape (%llu, %llu) overflows",
                     (unsigned long long)shape[0], (unsigned long long)shape[1]);
  *dtype = dt;
  *rows = shape[0];
  *cols = shape[1];
  *data_offset = pre + hlen;
  return RA_OK;
}

int ra_npy_read(const char *path, ra_npy *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, errno == ENOENT ? RA_ENOTFOUND : RA_EIO, "%s: %s", path,
                           strerror(errno));
  int rc = RA_OK;
  unsigned char *hdr = malloc(12 + RA_NPY_MAX_HEADER);
  void *data = NULL;
  if (!hdr) {
    rc = ra_errorf(err, RA_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  size_t got = fread(hdr, 1, 12 + RA_NPY_MAX_HEADER, f);
  ra_dtype dt;
  uint64_t rows, cols;
  size_t off;
  if ((rc = ra_npy_parse_header(hdr, got, &dt, &rows, &cols, &off, err))) {
    ra_error_wrap(err, "%s", path);
    goto out;
  }
  uint64_t bytes = rows * cols * ra_dtype_size(dt);
  if (fseeko(f, 0, SEEK_END) != 0) {
    rc = ra_errorf(err, RA_EIO, "%s: %s", path, strerror(errno));
    goto out;
  }
  off_t size = ftello(f);
  if (size < 0 || (uint64_t)size != off + bytes) {
    rc = ra_errorf(err, RA_EFORMAT, "%s: %lld bytes of data for shape (%llu, %llu) needing %llu",
                   path, (long long)size - (long long)off, (unsigned long long)rows,
                   (unsigned long long)cols, (unsigned long long)bytes);
    goto out;
  }
  if (bytes > SIZE_MAX || !(data = malloc(bytes ? (size_t)bytes : 1))) {
    rc = ra_errorf(err, RA_ENOMEM, "%s: out of memory for %llu bytes", path,
                   (unsigned long long)bytes);
    goto out;
  }
  if (fseeko(f, (off_t)off, SEEK_SET) != 0 || fread(data, 1, (size_t)bytes, f) != bytes) {
    rc = ra_errorf(err, RA_EIO, "%s: short read", path);
    goto out;
  }
  out->dtype = dt;
  out->rows = rows;
  out->cols = cols;
  out->data = data;
  data = NULL;
out:
  free(data);
  free(hdr);
  fclose(f);
  return rc;
}

int ra_npy_read_f32(const char *path, ra_npy *out, ra_error *err) {
  int rc = ra_npy_read(path, out, err);
  if (rc || out->dtype == RA_DTYPE_F32) return rc;
  size_t n = (size_t)(out->rows * out->cols);
  float *f = n <= SIZE_MAX / sizeof *f ? malloc(n ? n * sizeof *f : 1) : NULL;
  if (!f) {
    ra_npy_free(out);
    return ra_errorf(err, RA_ENOMEM, "%s: out of memory for %zu floats", path, n);
  }
  ra_dtype_to_fp32_n(out->dtype, out->data, f, n);
  free(out->data);
  out->data = f;
  out->dtype = RA_DTYPE_F32;
  return RA_OK;
}

void ra_npy_free(ra_npy *a) {
  free(a->data);
  memset(a, 0, sizeof *a);
}

struct ra_npy_writer {
  FILE *f;
  char *path;
  ra_dtype dtype;
  uint64_t n_rows, n_cols, written;
  void *conv; /* one row in the file dtype */
};

/* The format 1.0 preamble and header dict for a 2-D array, padded as numpy pads it. */
static int write_header(FILE *f, ra_dtype dtype, uint64_t rows, uint64_t cols) {
  char dict[160];
  int dl = snprintf(dict, sizeof dict,
                    "{'descr': '%s', 'fortran_order': False, 'shape': (%llu, %llu), }",
                    dtype == RA_DTYPE_F16 ? "<f2" : "<f4", (unsigned long long)rows,
                    (unsigned long long)cols);
  /* Preamble + dict + space padding + '\n' is a multiple of 64. */
  size_t pre = 10, total = (pre + (size_t)dl + 1 + 63) / 64 * 64;
  unsigned char head[256];
  memcpy(head, MAGIC, sizeof MAGIC);
  head[6] = 1;
  head[7] = 0;
  size_t hlen = total - pre;
  head[8] = (unsigned char)(hlen & 0xff);
  head[9] = (unsigned char)(hlen >> 8);
  memcpy(head + pre, dict, (size_t)dl);
  memset(head + pre + dl, ' ', total - pre - (size_t)dl - 1);
  head[total - 1] = '\n';
  return fwrite(head, 1, total, f) == total ? RA_OK : RA_EIO;
}

int ra_npy_writer_open(const char *path, ra_dtype dtype, uint64_t n_rows, uint64_t n_cols,
                       ra_npy_writer **out, ra_error *err) {
  if (dtype != RA_DTYPE_F32 && dtype != RA_DTYPE_F16)
    return ra_errorf(err, RA_EINVAL, "npy: cannot write dtype %s", ra_dtype_name(dtype));
  /* The bound keeps the one-row conversion buffer small; no dump row comes near it. */
  if (n_cols == 0 || n_cols > (1u << 24))
    return ra_errorf(err, RA_EINVAL, "npy: bad row length %llu", (unsigned long long)n_cols);
  if (n_rows > UINT64_MAX / n_cols / ra_dtype_size(dtype))
    return ra_errorf(err, RA_EINVAL, "npy: shape overflows");
  ra_npy_writer *w = calloc(1, sizeof *w);
  if (!w) return ra_errorf(err, RA_ENOMEM, "npy: out of memory");
  w->dtype = dtype;
  w->n_rows = n_rows;
  w->n_cols = n_cols;
  w->path = strdup(path);
  w->conv = malloc((size_t)n_cols * ra_dtype_size(dtype));
  w->f = fopen(path, "wb");
  int rc = RA_OK;
  if (!w->path || !w->conv)
    rc = ra_errorf(err, RA_ENOMEM, "npy: out of memory");
  else if (!w->f)
    rc = ra_errorf(err, RA_EIO, "%s: %s", path, strerror(errno));
  else if (write_header(w->f, dtype, n_rows, n_cols))
    rc = ra_errorf(err, RA_EIO, "%s: write failed", path);
  if (rc != RA_OK) {
    if (w->f) {
      fclose(w->f);
      remove(path);
    }
    free(w->conv);
    free(w->path);
    free(w);
    return rc;
  }
  *out = w;
  return RA_OK;
}

int ra_npy_writer_append(ra_npy_writer *w, const float *rows, uint64_t k, ra_error *err) {
  if (k > w->n_rows - w->written)
    return ra_errorf(err, RA_ESTATE, "%s: appending %llu rows past the declared %llu", w->path,
                     (unsigned long long)k, (unsigned long long)w->n_rows);
  size_t bytes = (size_t)w->n_cols * ra_dtype_size(w->dtype);
  for (uint64_t r = 0; r < k; r++) {
    const float *src = rows + r * w->n_cols;
    const void *row = src;
    if (w->dtype == RA_DTYPE_F16) {
      ra_fp32_to_fp16_n(src, w->conv, (size_t)w->n_cols);
      row = w->conv;
    }
    if (fwrite(row, 1, bytes, w->f) != bytes)
      return ra_errorf(err, RA_EIO, "%s: write failed", w->path);
  }
  w->written += k;
  return RA_OK;
}

int ra_npy_writer_close(ra_npy_writer *w, ra_error *err) {
  int rc = RA_OK;
  if (fclose(w->f) != 0)
    rc = ra_errorf(err, RA_EIO, "%s: write failed", w->path);
  else if (w->written != w->n_rows)
    rc = ra_errorf(err, RA_ESTATE, "%s: got %llu rows, declared %llu", w->path,
                   (unsigned long long)w->written, (unsigned long long)w->n_rows);
  free(w->conv);
  free(w->path);
  free(w);
  return rc;
}

int ra_npy_write_f32(const char *path, ra_dtype dtype, uint64_t rows, uint64_t cols,
                     const float *data, ra_error *err) {
  ra_npy_writer *w = NULL;
  int rc = ra_npy_writer_open(path, dtype, rows, cols, &w, err);
  if (rc) return rc;
  rc = ra_npy_writer_append(w, data, rows, err);
  int rc2 = ra_npy_writer_close(w, rc ? NULL : err);
  if (rc || rc2) remove(path);
  return rc ? rc : rc2;
}
