/* Test helper: builds GGUF v3 images in memory (valid ones, which tests then corrupt). */
#ifndef RA_TEST_GGUF_BUILD_H
#define RA_TEST_GGUF_BUILD_H

#include <stddef.h>
#include <stdint.h>

typedef struct gb {
  uint8_t *kv;      /* serialized metadata */
  size_t kv_len, n_kv;
  uint8_t *ti;      /* serialized tensor infos */
  size_t ti_len, n_t;
  uint8_t *data;    /* tensor data, each aligned to 32 */
  size_t data_len;
} gb;

void gb_u32(gb *b, const char *key, uint32_t v);
void gb_f32(gb *b, const char *key, float v);
void gb_bool(gb *b, const char *key, int v);
void gb_str(gb *b, const char *key, const char *v);
void gb_strs(gb *b, const char *key, const char *const *v, size_t n);
void gb_f32s(gb *b, const char *key, const float *v, size_t n);
void gb_i32s(gb *b, const char *key, const int32_t *v, size_t n);
/* A tensor of n_dims dims ne[] (ne[0] contiguous) and ggml type, with nbytes of data. */
void gb_tensor(gb *b, const char *name, int n_dims, const uint64_t *ne, uint32_t type, const void *data, size_t nbytes);
/* The whole file; *len receives its size. Frees the builder's parts. */
uint8_t *gb_finish(gb *b, size_t *len);

#endif
