/* GGUF parser: a valid synthetic file, and truncated / corrupt variants that must fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_build.h"
#include "quant.h"

/* A small valid file: metadata of every kind and two tensors (F32 [4, 2], Q8_0 [32]). */
static uint8_t *valid_file(size_t *len) {
  gb b = {0};
  gb_str(&b, "general.architecture", "llama");
  gb_u32(&b, "llama.block_count", 2);
  gb_f32(&b, "llama.rope.freq_base", 10000.0f);
  gb_bool(&b, "tokenizer.ggml.add_bos_token", 1);
  const char *toks[] = {"a", "bc", ""};
  gb_strs(&b, "tokenizer.ggml.tokens", toks, 3);
  float sc[] = {0.5f, -1.0f, 2.0f};
  gb_f32s(&b, "tokenizer.ggml.scores", sc, 3);
  float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t ne[2] = {4, 2};
  gb_tensor(&b, "w", 2, ne, RA_GGML_F32, w, sizeof w);
  uint8_t q8[34] = {0x00, 0x3c}; /* d = 1.0 in fp16 */
  for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
  uint64_t ne1 = 32;
  gb_tensor(&b, "q", 1, &ne1, RA_GGML_Q8_0, q8, sizeof q8);
  return gb_finish(&b, len);
}

static void test_valid_file_parses(void **state) {
  (void)state;
  size_t len;
  uint8_t *f = valid_file(&len);
  ra_gguf g;
  ra_error err;
  assert_int_equal(ra_gguf_parse(f, len, &g, &err), RA_OK);
  assert_int_equal(g.version, 3);
  assert_int_equal(g.n_kv, 6);
  assert_int_equal(g.n_tensors, 2);
  uint32_t u;
  float x;
  int bl;
  ra_gguf_str s;
  assert_int_equal(ra_gguf_get_u32(&g, "llama.block_count", &u, &err), RA_OK);
  assert_int_equal(u, 2);
  assert_int_equal(ra_gguf_get_f32(&g, "llama.rope.freq_base", &x, &err), RA_OK);
  assert_true(x == 10000.0f);
  assert_int_equal(ra_gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &bl, &err), RA_OK);
  assert_int_equal(bl, 1);
  assert_int_equal(ra_gguf_get_str(&g, "general.architecture", &s, &err), RA_OK);
  assert_true(ra_gguf_str_eq(s, "llama"));
  assert_int_equal(ra_gguf_get_u32(&g, "general.architecture", &u, &err), RA_EFORMAT);
  assert_int_equal(ra_gguf_get_u32(&g, "missing", &u, &err), RA_ENOTFOUND);
  const ra_gguf_kv *tk = ra_gguf_find(&g, "tokenizer.ggml.tokens");
  assert_non_null(tk);
  assert_int_equal(tk->arr_n, 3);
  assert_true(ra_gguf_str_eq(ra_gguf_arr_str(tk, 1), "bc"));
  assert_true(ra_gguf_str_eq(ra_gguf_arr_str(tk, 2), ""));
  assert_true(ra_gguf_arr_num(ra_gguf_find(&g, "tokenizer.ggml.scores"), 1) == -1.0);
  const ra_gguf_tensor *w = ra_gguf_find_tensor(&g, "w");
  assert_non_null(w);
  assert_int_equal(w->ne[0], 4);
  assert_int_equal(w->ne[1], 2);
  assert_int_equal(w->n_bytes, 32);
  float wv[8];
  ra_quant_dequantize(w->type, w->data, wv, 8);
  assert_true(wv[7] == 8.0f);
  const ra_gguf_tensor *q = ra_gguf_find_tensor(&g, "q");
  float qv[32];
  ra_quant_dequantize(q->type, q->data, qv, 32);
  assert_true(qv[0] == -16.0f && qv[31] == 15.0f);
  ra_gguf_close(&g);
  free(f);
}

/* Every proper prefix of a valid file is truncated somewhere and must be rejected. */
static void test_every_truncation_fails(void **state) {
  (void)state;
  size_t len;
  uint8_t *f = valid_file(&len);
  for (size_t n = 0; n < len; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches any read past n */
    memcpy(copy, f, n);
    ra_gguf g;
    ra_error err;
    ra_error_clear(&err);
    int rc = ra_gguf_parse(copy, n, &g, &err);
    if (rc == RA_OK) fail_msg("prefix of %zu/%zu bytes parsed", n, len);
    assert_int_equal(rc, RA_EFORMAT);
    assert_true(err.msg[0] != 0);
    free(copy);
  }
  free(f);
}

static void expect_format_error(uint8_t *f, size_t len, const char *needle) {
  ra_gguf g;
  ra_error err;
  ra_error_clear(&err);
  assert_int_equal(ra_gguf_parse(f, len, &g, &err), RA_EFORMAT);
  if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_corruptions_fail_with_reason(void **state) {
  (void)state;
  size_t len;
  uint8_t *f = valid_file(&len);
  uint8_t *c = malloc(len);
  uint64_t huge = UINT64_MAX / 2;

  memcpy(c, f, len);
  c[0] = 'X';
  expect_format_error(c, len, "bad magic");

  memcpy(c, f, len);
  c[4] = 9;
  expect_format_error(c, len, "version");

  memcpy(c, f, len);
  memcpy(c + 8, &huge, 8); /* tensor count */
  expect_format_error(c, len, "tensor count");

  memcpy(c, f, len);
  memcpy(c + 16, &huge, 8); /* kv count */
  expect_format_error(c, len, "metadata count");

  memcpy(c, f, len);
  memcpy(c + 24, &huge, 8); /* first key's length */
  expect_format_error(c, len, "truncated");

  /* locate tensor "q"'s info: name len 1 'q', n_dims, ne, type, offset */
  size_t qi = 0;
  for (size_t i = 24; i + 9 < len; i++)
    if (memcmp(c + i, "\x01\0\0\0\0\0\0\0q", 9) == 0) qi = i;
  assert_true(qi > 0);
  size_t dims = qi + 9, ne0 = dims + 4, type = ne0 + 8, off = type + 4;

  memcpy(c, f, len);
  memcpy(c + off, &(uint64_t){1u << 30}, 8);
  expect_format_error(c, len, "past the end");

  memcpy(c, f, len);
  memcpy(c + off, &(uint64_t){UINT64_MAX - 16}, 8);
  expect_format_error(c, len, "aligned");

  memcpy(c, f, len);
  memcpy(c + off, &(uint64_t){UINT64_MAX & ~(uint64_t)31}, 8);
  expect_format_error(c, len, "past the end");

  memcpy(c, f, len);
  memcpy(c + ne0, &(uint64_t){33}, 8); /* not a multiple of Q8_0's block */
  expect_format_error(c, len, "multiple");

  memcpy(c, f, len);
  memcpy(c + dims, &(uint32_t){7}, 4);
  expect_format_error(c, len, "dims");

  memcpy(c, f, len);
  memcpy(c + type, &(uint32_t){99}, 4);
  expect_format_error(c, len, "unsupported type");

  /* the "w" tensor is 2-D: make its dims multiply past int64 */
  size_t wi = 0;
  for (size_t i = 24; i + 9 < len; i++)
    if (memcmp(c + i, "\x01\0\0\0\0\0\0\0w", 9) == 0) wi = i;
  memcpy(c, f, len);
  memcpy(c + wi + 13, &(uint64_t){(uint64_t)1 << 40}, 8);
  memcpy(c + wi + 21, &(uint64_t){(uint64_t)1 << 40}, 8);
  expect_format_error(c, len, "overflowing");

  memcpy(c, f, len);
  memcpy(c + wi + 13, &(uint64_t){(uint64_t)1 << 61}, 8); /* 2^62 F32 values: 2^64 bytes */
  expect_format_error(c, len, "byte size overflows");

  /* the string array's count */
  size_t ai = 0;
  const char *k = "tokenizer.ggml.tokens";
  for (size_t i = 0; i + strlen(k) < len; i++)
    if (memcmp(c + i, k, strlen(k)) == 0) ai = i + strlen(k);
  memcpy(c, f, len);
  memcpy(c + ai + 8, &huge, 8);
  expect_format_error(c, len, "past the end");

  memcpy(c, f, len);
  memcpy(c + ai, &(uint32_t){77}, 4); /* value type */
  expect_format_error(c, len, "unknown value type");

  free(c);
  free(f);
}

static void test_open_missing_and_empty(void **state) {
  (void)state;
  ra_gguf g;
  ra_error err;
  assert_int_equal(ra_gguf_open("/nonexistent/x.gguf", &g, &err), RA_ENOTFOUND);
  char path[] = "/tmp/ra_gguf_emptyXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(ra_gguf_open(path, &g, &err), RA_EFORMAT);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_file_parses),
      cmocka_unit_test(test_every_truncation_fails),
      cmocka_unit_test(test_corruptions_fail_with_reason),
      cmocka_unit_test(test_open_missing_and_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
