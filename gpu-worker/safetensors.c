#include "safetensors.h"

#include "json.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20)

static int parse_header(ra_st_file *f, const ra_json *h, size_t data_off, const char *path, ra_error *err) {
  if (h->type != RA_JSON_OBJECT) return ra_errorf(err, RA_EFORMAT, "safetensors: %s: header is not an object", path);
  f->tensors = calloc(h->n ? h->n : 1, sizeof(ra_st_tensor));
  if (!f->tensors) return ra_errorf(err, RA_ENOMEM, "safetensors: out of memory");
  size_t data_size = f->size - data_off;
  for (size_t i = 0; i < h->n; i++) {
    if (strcmp(h->keys[i], "__metadata__") == 0) continue;
    const ra_json *t = &h->items[i];
    const char *dt;
    const ra_json *shape = ra_json_get(t, "shape"), *offs = ra_json_get(t, "data_offsets");
    if (ra_json_get_str(t, "dtype", &dt) != RA_OK || !shape || shape->type != RA_JSON_ARRAY || !offs ||
        offs->type != RA_JSON_ARRAY || offs->n != 2 || shape->n > RA_ST_MAX_DIMS)
      return ra_errorf(err, RA_EFORMAT, "safetensors: %s: tensor '%s' has a malformed entry", path, h->keys[i]);
    ra_st_tensor *st = &f->tensors[f->n_tensors];
    if (strcmp(dt, "F32") == 0) st->ggml_type = RA_GGML_F32;
    else if (strcmp(dt, "F16") == 0) st->ggml_type = RA_GGML_F16;
    else if (strcmp(dt, "BF16") == 0) st->ggml_type = RA_GGML_BF16;
    else return ra_errorf(err, RA_EUNSUPPORTED, "safetensors: %s: tensor '%s' has dtype %s (F32/F16/BF16 supported)", path, h->keys[i], dt);
    uint64_t n = 1;
    st->ndim = (int)shape->n;
    for (size_t d = 0; d < shape->n; d++) {
      double v = shape->items[d].num;
      if (shape->items[d].type != RA_JSON_NUMBER || v < 1 || v > 1e12 || v != (double)(uint64_t)v || n > (UINT64_MAX >> 4) / (uint64_t)v)
        return ra_errorf(err, RA_EFORMAT, "safetensors: %s: tensor '%s' has a bad shape", path, h->keys[i]);
      st->shape[d] = (int64_t)v;
      n *= (uint64_t)v;
    }
    double b = offs->items[0].num, e = offs->items[1].num;
    if (offs->items[0].type != RA_JSON_NUMBER || offs->items[1].type != RA_JSON_NUMBER || b < 0 || e < b ||
        e > (double)data_size || b != (double)(uint64_t)b || e != (double)(uint64_t)e)
      return ra_errorf(err, RA_EFORMAT, "safetensors: %s: tensor '%s' data_offsets lie outside the file", path, h->keys[i]);
    size_t nb;
    if (ra_quant_row_bytes(st->ggml_type, n, &nb) != RA_OK || nb != (size_t)(e - b))
      return ra_errorf(err, RA_EFORMAT, "safetensors: %s: tensor '%s' holds %.0f bytes, its shape needs %zu", path,
                       h->keys[i], e - b, nb);
    st->name = strdup(h->keys[i]);
    if (!st->name) return ra_errorf(err, RA_ENOMEM, "safetensors: out of memory");
    st->data = f->base + data_off + (size_t)b;
    st->n_bytes = nb;
    f->n_tensors++;
  }
  return RA_OK;
}

int ra_st_open(const char *path, ra_st_file *f, ra_error *err) {
  memset(f, 0, sizeof(*f));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ra_errorf(err, errno == ENOENT ? RA_ENOTFOUND : RA_EIO, "safetensors: cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
    close(fd);
    return ra_errorf(err, RA_EFORMAT, "safetensors: %s is too short", path);
  }
  void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ra_errorf(err, RA_EIO, "safetensors: cannot mmap %s", path);
  f->base = p;
  f->size = (size_t)sb.st_size;
  uint64_t hlen;
  memcpy(&hlen, f->base, 8);
  int rc;
  if (hlen > ST_MAX_HEADER || hlen > f->size - 8) {
    rc = ra_errorf(err, RA_EFORMAT, "safetensors: %s: header length %llu exceeds the file", path, (unsigned long long)hlen);
  } else {
    ra_json *h = NULL;
    rc = ra_json_parse((const char *)f->base + 8, (size_t)hlen, &h, err);
    if (rc == RA_OK) rc = parse_header(f, h, 8 + (size_t)hlen, path, err);
    else ra_error_wrap(err, "safetensors: %s header", path);
    ra_json_free(h);
  }
  if (rc != RA_OK) ra_st_close(f);
  return rc;
}

void ra_st_close(ra_st_file *f) {
  for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
  free(f->tensors);
  if (f->base) munmap((void *)f->base, f->size);
  memset(f, 0, sizeof(*f));
}

const ra_st_tensor *ra_st_find(const ra_st_file *f, const char *name) {
  for (size_t i = 0; i < f->n_tensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}
