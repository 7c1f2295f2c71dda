#include "gguf_build.h"

#include <stdlib.h>
#include <string.h>

static void put(uint8_t **buf, size_t *len, const void *p, size_t n) {
  if (n == 0) return;
  *buf = realloc(*buf, *len + n);
  memcpy(*buf + *len, p, n);
  *len += n;
}

static void put_u32(uint8_t **b, size_t *l, uint32_t v) { put(b, l, &v, 4); }
static void put_u64(uint8_t **b, size_t *l, uint64_t v) { put(b, l, &v, 8); }
static void put_s(uint8_t **b, size_t *l, const char *s) {
  put_u64(b, l, strlen(s));
  put(b, l, s, strlen(s));
}

static void key(gb *b, const char *k, uint32_t type) {
  put_s(&b->kv, &b->kv_len, k);
  put_u32(&b->kv, &b->kv_len, type);
  b->n_kv++;
}

void gb_u32(gb *b, const char *k, uint32_t v) { key(b, k, 4); put_u32(&b->kv, &b->kv_len, v); }
void gb_f32(gb *b, const char *k, float v) { key(b, k, 6); put(&b->kv, &b->kv_len, &v, 4); }
void gb_bool(gb *b, const char *k, int v) { uint8_t x = (uint8_t)v; key(b, k, 7); put(&b->kv, &b->kv_len, &x, 1); }
void gb_str(gb *b, const char *k, const char *v) { key(b, k, 8); put_s(&b->kv, &b->kv_len, v); }

void gb_strs(gb *b, const char *k, const char *const *v, size_t n) {
  key(b, k, 9);
  put_u32(&b->kv, &b->kv_len, 8);
  put_u64(&b->kv, &b->kv_len, n);
  for (size_t i = 0; i < n; i++) put_s(&b->kv, &b->kv_len, v[i]);
}

void gb_f32s(gb *b, const char *k, const float *v, size_t n) {
  key(b, k, 9);
  put_u32(&b->kv, &b->kv_len, 6);
  put_u64(&b->kv, &b->kv_len, n);
  put(&b->kv, &b->kv_len, v, 4 * n);
}

void gb_i32s(gb *b, const char *k, const int32_t *v, size_t n) {
  key(b, k, 9);
  put_u32(&b->kv, &b->kv_len, 5);
  put_u64(&b->kv, &b->kv_len, n);
  put(&b->kv, &b->kv_len, v, 4 * n);
}

void gb_tensor(gb *b, const char *name, int n_dims, const uint64_t *ne, uint32_t type, const void *data, size_t nbytes) {
  put_s(&b->ti, &b->ti_len, name);
  put_u32(&b->ti, &b->ti_len, (uint32_t)n_dims);
  for (int d = 0; d < n_dims; d++) put_u64(&b->ti, &b->ti_len, ne[d]);
  put_u32(&b->ti, &b->ti_len, type);
  size_t off = (b->data_len + 31) / 32 * 32;
  put_u64(&b->ti, &b->ti_len, off);
  static const uint8_t zeros[32];
  put(&b->data, &b->data_len, zeros, off - b->data_len);
  put(&b->data, &b->data_len, data, nbytes);
  b->n_t++;
}

uint8_t *gb_finish(gb *b, size_t *len) {
  uint8_t *f = NULL;
  size_t n = 0;
  put_u32(&f, &n, 0x46554747u);
  put_u32(&f, &n, 3);
  put_u64(&f, &n, b->n_t);
  put_u64(&f, &n, b->n_kv);
  put(&f, &n, b->kv, b->kv_len);
  put(&f, &n, b->ti, b->ti_len);
  static const uint8_t zeros[32];
  put(&f, &n, zeros, (n + 31) / 32 * 32 - n);
  put(&f, &n, b->data, b->data_len);
  free(b->kv);
  free(b->ti);
  free(b->data);
  memset(b, 0, sizeof(*b));
  *len = n;
  return f;
}
