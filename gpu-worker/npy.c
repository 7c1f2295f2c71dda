#include "npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ra_npy_writer {
  FILE *f;
  char *path;
  ra_dtype dtype;
  uint64_t n_rows, n_cols, written;
  void *conv; /* one row in the file dtype */
};

static int write_header(FILE *f, ra_dtype dtype, int ndim, const uint64_t *shape) {
  char dict[256];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                   dtype == RA_DTYPE_F16 ? "<f2" : "<f4");
  for (int i = 0; i < ndim; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRIu64 "%s", shape[i], ndim == 1 || i + 1 < ndim ? ", " : "");
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  /* 10 bytes of preamble + dict + padding + '\n' must be a multiple of 64. */
  size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
  size_t hlen = total - 10;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  if (fwrite(pre, 1, 10, f) != 10 || fwrite(dict, 1, (size_t)n, f) != (size_t)n) return RA_EIO;
  for (size_t i = (size_t)n; i + 1 < hlen; i++)
    if (fputc(' ', f) == EOF) return RA_EIO;
  return fputc('\n', f) == EOF ? RA_EIO : RA_OK;
}

/* Opens a writer for any shape: rows are the product of all dims but the last. */
static int writer_open_shape(const char *path, ra_dtype dtype, int ndim, const uint64_t *shape,
                             ra_npy_writer **out, ra_error *err) {
  if (dtype != RA_DTYPE_F32 && dtype != RA_DTYPE_F16)
    return ra_errorf(err, RA_EINVAL, "npy: dtype %s has no NumPy equivalent", ra_dtype_name(dtype));
  if (ndim < 1 || ndim > RA_NPY_MAX_DIMS) return ra_errorf(err, RA_EINVAL, "npy: %d dims", ndim);
  uint64_t rows = 1, cols = shape[ndim - 1];
  for (int i = 0; i + 1 < ndim; i++) rows *= shape[i];
  if (cols == 0 || cols > (1u << 24)) return ra_errorf(err, RA_EINVAL, "npy: bad row length %" PRIu64, cols);
  ra_npy_writer *w = calloc(1, sizeof(*w));
  if (!w) return ra_errorf(err, RA_ENOMEM, "npy: out of memory");
  w->dtype = dtype;
  w->n_rows = rows;
  w->n_cols = cols;
  w->path = strdup(path);
  w->conv = malloc((size_t)cols * ra_dtype_size(dtype));
  w->f = fopen(path, "wb");
  int rc = RA_OK;
  if (!w->path || !w->conv) rc = ra_errorf(err, RA_ENOMEM, "npy: out of memory");
  else if (!w->f) rc = ra_errorf(err, RA_EIO, "npy: cannot create %s: %s", path, strerror(errno));
  else if (write_header(w->f, dtype, ndim, shape)) rc = ra_errorf(err, RA_EIO, "npy: cannot write %s", path);
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

int ra_npy_writer_open(const char *path, ra_dtype dtype, uint64_t n_rows, uint64_t n_cols,
                       ra_npy_writer **out, ra_error *err) {
  uint64_t shape[2] = {n_rows, n_cols};
  return writer_open_shape(path, dtype, 2, shape, out, err);
}

int ra_npy_writer_append(ra_npy_writer *w, const float *rows, uint64_t k, ra_error *err) {
  if (w->written + k > w->n_rows)
    return ra_errorf(err, RA_ESTATE, "npy: %s: appending %" PRIu64 " rows past the declared %" PRIu64, w->path, k, w->n_rows);
  for (uint64_t r = 0; r < k; r++) {
    const float *src = rows + r * w->n_cols;
    const void *out = src;
    if (w->dtype == RA_DTYPE_F16) {
      ra_fp32_to_fp16_n(src, w->conv, (size_t)w->n_cols);
      out = w->conv;
    }
    size_t bytes = (size_t)w->n_cols * ra_dtype_size(w->dtype);
    if (fwrite(out, 1, bytes, w->f) != bytes) return ra_errorf(err, RA_EIO, "npy: write to %s failed", w->path);
  }
  w->written += k;
  return RA_OK;
}

int ra_npy_writer_close(ra_npy_writer *w, ra_error *err) {
  int rc = RA_OK;
  if (fclose(w->f) != 0) rc = ra_errorf(err, RA_EIO, "npy: closing %s failed", w->path);
  else if (w->written != w->n_rows)
    rc = ra_errorf(err, RA_ESTATE, "npy: %s got %" PRIu64 " rows, declared %" PRIu64, w->path, w->written, w->n_rows);
  free(w->conv);
  free(w->path);
  free(w);
  return rc;
}

int ra_npy_write_f32(const char *path, ra_dtype dtype, int ndim, const uint64_t *shape,
                     const float *data, ra_error *err) {
  ra_npy_writer *w;
  int rc = writer_open_shape(path, dtype, ndim, shape, &w, err);
  if (rc) return rc;
  rc = ra_npy_writer_append(w, data, w->n_rows, err);
  int rc2 = ra_npy_writer_close(w, rc ? NULL : err);
  if (rc || rc2) remove(path);
  return rc ? rc : rc2;
}

/* Finds "'key':" in the header dict and returns a pointer just past it, or NULL. */
static const char *dict_find(const char *h, const char *key) {
  const char *p = strstr(h, key);
  if (!p) return NULL;
  p += strlen(key);
  while (*p == ' ') p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ') p++;
  return p;
}

int ra_npy_read_f32(const char *path, ra_npy_array *out, ra_error *err) {
  memset(out, 0, sizeof(*out));
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, errno == ENOENT ? RA_ENOTFOUND : RA_EIO, "npy: cannot open %s: %s", path, strerror(errno));
  unsigned char pre[12];
  char *hdr = NULL;
  void *raw = NULL;
  int rc = RA_OK;
  size_t hlen, pre_len;
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    rc = ra_errorf(err, RA_EFORMAT, "npy: %s is not a .npy file", path);
    goto done;
  }
  if (pre[6] == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s truncated", path); goto done; }
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    pre_len = 10;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 8, 1, 4, f) != 4) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s truncated", path); goto done; }
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
    pre_len = 12;
  } else {
    rc = ra_errorf(err, RA_EFORMAT, "npy: %s has unsupported version %u", path, pre[6]);
    goto done;
  }
  if (hlen > 65536) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s header too long", path); goto done; }
  hdr = malloc(hlen + 1);
  if (!hdr) { rc = ra_errorf(err, RA_ENOMEM, "npy: out of memory"); goto done; }
  if (fread(hdr, 1, hlen, f) != hlen) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s truncated header", path); goto done; }
  hdr[hlen] = 0;
  const char *d = dict_find(hdr, "'descr'");
  const char *fo = dict_find(hdr, "'fortran_order'");
  const char *sh = dict_find(hdr, "'shape'");
  if (!d || !fo || !sh || *sh != '(') { rc = ra_errorf(err, RA_EFORMAT, "npy: %s has a malformed header", path); goto done; }
  if (strncmp(d, "'<f4'", 5) == 0) out->file_dtype = RA_DTYPE_F32;
  else if (strncmp(d, "'<f2'", 5) == 0) out->file_dtype = RA_DTYPE_F16;
  else { rc = ra_errorf(err, RA_EFORMAT, "npy: %s: only '<f4' and '<f2' are supported", path); goto done; }
  if (strncmp(fo, "False", 5) != 0) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s is Fortran-ordered", path); goto done; }
  sh++;
  uint64_t n = 1;
  while (*sh != ')') {
    while (*sh == ' ' || *sh == ',') sh++;
    if (*sh == ')') break;
    if (*sh < '0' || *sh > '9' || out->ndim == RA_NPY_MAX_DIMS) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s bad shape", path); goto done; }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(sh, &end, 10);
    if (errno || (v && n > UINT64_MAX / v / 4)) { rc = ra_errorf(err, RA_EFORMAT, "npy: %s shape overflows", path); goto done; }
    out->shape[out->ndim++] = v;
    n *= v;
    sh = end;
  }
  size_t esz = ra_dtype_size(out->file_dtype);
  if (fseek(f, 0, SEEK_END) != 0) { rc = ra_errorf(err, RA_EIO, "npy: cannot seek %s", path); goto done; }
  long fsz = ftell(f);
  if (fsz < 0 || (uint64_t)fsz != pre_len + hlen + n * esz) {
    rc = ra_errorf(err, RA_EFORMAT, "npy: %s is %ld bytes, its header implies %" PRIu64, path, fsz, (uint64_t)(pre_len + hlen + n * esz));
    goto done;
  }
  fseek(f, (long)(pre_len + hlen), SEEK_SET);
  out->n = (size_t)n;
  out->data = malloc((n ? n : 1) * sizeof(float));
  raw = out->file_dtype == RA_DTYPE_F16 ? malloc((n ? n : 1) * esz) : NULL;
  if (!out->data || (out->file_dtype == RA_DTYPE_F16 && !raw)) { rc = ra_errorf(err, RA_ENOMEM, "npy: out of memory"); goto done; }
  if (fread(raw ? raw : (void *)out->data, esz, (size_t)n, f) != (size_t)n) { rc = ra_errorf(err, RA_EIO, "npy: read %s failed", path); goto done; }
  if (raw) ra_fp16_to_fp32_n(raw, out->data, (size_t)n);
done:
  free(raw);
  free(hdr);
  fclose(f);
  if (rc != RA_OK) ra_npy_array_free(out);
  return rc;
}

void ra_npy_array_free(ra_npy_array *a) {
  free(a->data);
  memset(a, 0, sizeof(*a));
}
