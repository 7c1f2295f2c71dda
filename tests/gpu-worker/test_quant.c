/* Block dequantizers: hand-made blocks with known values, sizes, and (when RA_QUANT_REF names
 * the file gen_quant_ref.py wrote) random blocks of every type against gguf-py's dequantizers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf.h"
#include "half.h"
#include "quant.h"

static void put_f16(uint8_t *p, float v) {
  uint16_t h = ra_fp32_to_fp16(v);
  memcpy(p, &h, 2);
}

static void test_legacy_blocks_known_values(void **state) {
  (void)state;
  uint8_t b[40] = {0};
  float y[32];
  /* Q4_0: d = 0.5, byte j = (j & 15) | ((15 - (j & 15)) << 4): low nibbles 0..15, high 15..0 */
  put_f16(b, 0.5f);
  for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
  ra_quant_dequantize(RA_GGML_Q4_0, b, y, 32);
  for (int j = 0; j < 16; j++) {
    assert_true(y[j] == (float)(j - 8) * 0.5f);
    assert_true(y[16 + j] == (float)(7 - j) * 0.5f);
  }
  /* Q4_1: d = 2, m = -1 */
  put_f16(b, 2.0f);
  put_f16(b + 2, -1.0f);
  for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
  ra_quant_dequantize(RA_GGML_Q4_1, b, y, 32);
  assert_true(y[0] == -1.0f && y[15] == 29.0f && y[16] == 29.0f && y[31] == -1.0f);
  /* Q8_0: d = 0.25, q = -128..: */
  put_f16(b, 0.25f);
  for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
  ra_quant_dequantize(RA_GGML_Q8_0, b, y, 32);
  assert_true(y[0] == -32.0f && y[31] == (float)(31 * 8 - 128) * 0.25f);
  /* Q5_0: d = 1, all nibbles 0, fifth bit set for value 0 and 31 */
  memset(b, 0, sizeof b);
  put_f16(b, 1.0f);
  uint32_t qh = 1u | (1u << 31);
  memcpy(b + 2, &qh, 4);
  ra_quant_dequantize(RA_GGML_Q5_0, b, y, 32);
  assert_true(y[0] == 0.0f && y[1] == -16.0f && y[31] == 0.0f);
}

static void test_q6_k_known_values(void **state) {
  (void)state;
  uint8_t b[210] = {0};
  float y[256];
  /* all 6-bit values 32 -> 0 except: ql low nibble 1 -> q = 1 - 32 + ... keep it simple:
   * ql = 0x00, qh = 0xAA (bits 2 in every pair -> high bits 2 -> q6 = 32 -> 0) */
  memset(b + 128, 0xaa, 64);
  for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i + 1);
  put_f16(b + 208, 0.5f);
  ra_quant_dequantize(RA_GGML_Q6_K, b, y, 256);
  for (int i = 0; i < 256; i++) assert_true(y[i] == 0.0f);
  /* value 0: low nibble 5 -> q6 = 37 - 32 = 5, scale[0] = 1 -> 2.5 */
  b[0] = 5;
  ra_quant_dequantize(RA_GGML_Q6_K, b, y, 256);
  assert_true(y[0] == 2.5f);
  assert_true(y[1] == 0.0f);
}

static void test_sizes_and_errors(void **state) {
  (void)state;
  size_t n;
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q4_1, 576, &n), RA_OK);
  assert_int_equal(n, 576 / 32 * 20);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q6_K, 512, &n), RA_OK);
  assert_int_equal(n, 2 * 210);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q4_K, 256, &n), RA_OK);
  assert_int_equal(n, 144);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q5_K, 256, &n), RA_OK);
  assert_int_equal(n, 176);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q3_K, 256, &n), RA_OK);
  assert_int_equal(n, 110);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q2_K, 256, &n), RA_OK);
  assert_int_equal(n, 84);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_Q8_0, 33, &n), RA_EINVAL);
  assert_int_equal(ra_quant_row_bytes(99, 32, &n), RA_EINVAL);
  assert_int_equal(ra_quant_row_bytes(RA_GGML_F32, UINT64_MAX / 2, &n), RA_EFORMAT);
  assert_string_equal(ra_quant_name(RA_GGML_Q6_K), "Q6_K");
}

static void test_all_types_match_gguf_py(void **state) {
  (void)state;
  const char *path = getenv("RA_QUANT_REF");
  if (!path) fail_msg("RA_QUANT_REF is not set (ctest runs gen_quant_ref.py first)");
  ra_gguf g;
  ra_error err;
  if (ra_gguf_open(path, &g, &err) != RA_OK) fail_msg("%s", err.msg);
  int checked = 0;
  for (uint64_t i = 0; i < g.n_tensors; i++) {
    const ra_gguf_tensor *t = &g.tensors[i];
    if (t->name.len > 4 && memcmp(t->name.ptr + t->name.len - 4, ".ref", 4) == 0) continue;
    char refname[64];
    snprintf(refname, sizeof refname, "%.*s.ref", (int)t->name.len, t->name.ptr);
    const ra_gguf_tensor *r = ra_gguf_find_tensor(&g, refname);
    assert_non_null(r);
    assert_int_equal(r->n_elements, t->n_elements);
    float *got = malloc(t->n_elements * sizeof(float)), *want = malloc(t->n_elements * sizeof(float));
    ra_quant_dequantize(t->type, t->data, got, t->n_elements);
    ra_quant_dequantize(r->type, r->data, want, r->n_elements);
    for (uint64_t j = 0; j < t->n_elements; j++)
      if (!(fabsf(got[j] - want[j]) <= 1e-6f * (1.0f + fabsf(want[j]))))
        fail_msg("%s element %llu: %g, gguf-py %g", ra_quant_name(t->type), (unsigned long long)j, got[j], want[j]);
    free(got);
    free(want);
    checked++;
  }
  assert_int_equal(checked, 12);
  ra_gguf_close(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_legacy_blocks_known_values),
      cmocka_unit_test(test_q6_k_known_values),
      cmocka_unit_test(test_sizes_and_errors),
      cmocka_unit_test(test_all_types_match_gguf_py),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
