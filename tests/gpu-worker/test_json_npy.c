/* The strict JSON reader and the .npy writer/reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "json.h"
#include "npy.h"

static void test_json_valid(void **state) {
  (void)state;
  const char *s = " {\"a\": [1, -2.5e2, true, null], \"b\": {\"c\": \"x\\u00e9\\ud83d\\ude00\\n\"}, \"a\": 7} ";
  ra_json *v;
  ra_error err;
  assert_int_equal(ra_json_parse(s, strlen(s), &v, &err), RA_OK);
  double d;
  assert_int_equal(ra_json_get_num(v, "a", &d), RA_OK); /* the last duplicate wins */
  assert_true(d == 7.0);
  const ra_json *b = ra_json_get(v, "b");
  const char *c;
  assert_int_equal(ra_json_get_str(b, "c", &c), RA_OK);
  assert_string_equal(c, "x\xc3\xa9\xf0\x9f\x98\x80\n");
  assert_int_equal(v->items[0].n, 4);
  assert_true(v->items[0].items[1].num == -250.0);
  assert_int_equal(ra_json_get_num(v, "b", &d), RA_EFORMAT);
  assert_int_equal(ra_json_get_num(v, "zz", &d), RA_ENOTFOUND);
  ra_json_free(v);
}

static void test_json_rejects(void **state) {
  (void)state;
  const char *bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", "-", "NaN", "\"a", "\"\\x\"", "\"\\ud800\"",
                       "[1] 2", "{'a': 1}", "\"\x01\"", "\"\xff\"", "tru", "1e999", "{\"a\" 1}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ra_json *v = NULL;
    ra_error err;
    ra_error_clear(&err);
    if (ra_json_parse(bad[i], strlen(bad[i]), &v, &err) != RA_EFORMAT) fail_msg("accepted '%s'", bad[i]);
    assert_true(err.msg[0] != 0);
  }
  /* nesting is bounded */
  char deep[200];
  memset(deep, '[', sizeof deep);
  ra_json *v;
  ra_error err;
  assert_int_equal(ra_json_parse(deep, sizeof deep, &v, &err), RA_EFORMAT);
  assert_non_null(strstr(err.msg, "deep"));
}

static void test_npy_roundtrip(void **state) {
  (void)state;
  char path[] = "/tmp/ra_npy_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  float rows[6] = {1.5f, -2.0f, 3.25f, 0.0f, 65504.0f, -0.125f};
  for (int dt = 0; dt < 2; dt++) {
    ra_npy_writer *w;
    ra_error err;
    assert_int_equal(ra_npy_writer_open(path, dt ? RA_DTYPE_F16 : RA_DTYPE_F32, 3, 2, &w, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows, 1, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows + 2, 2, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows, 1, &err), RA_ESTATE);
    assert_int_equal(ra_npy_writer_close(w, &err), RA_OK);
    ra_npy_array a;
    assert_int_equal(ra_npy_read_f32(path, &a, &err), RA_OK);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0], 3);
    assert_int_equal(a.shape[1], 2);
    assert_memory_equal(a.data, rows, sizeof rows); /* all exactly representable in f16 */
    ra_npy_array_free(&a);
  }
  /* 3-D and 1-D whole-array writes */
  uint64_t s3[3] = {1, 3, 2}, s1[1] = {6};
  ra_npy_array a;
  assert_int_equal(ra_npy_write_f32(path, RA_DTYPE_F32, 3, s3, rows, NULL), RA_OK);
  assert_int_equal(ra_npy_read_f32(path, &a, NULL), RA_OK);
  assert_int_equal(a.ndim, 3);
  ra_npy_array_free(&a);
  assert_int_equal(ra_npy_write_f32(path, RA_DTYPE_F32, 1, s1, rows, NULL), RA_OK);
  assert_int_equal(ra_npy_read_f32(path, &a, NULL), RA_OK);
  assert_int_equal(a.ndim, 1);
  assert_int_equal(a.shape[0], 6);
  ra_npy_array_free(&a);
  /* a closed writer with missing rows, and a truncated file, are errors */
  ra_npy_writer *w;
  ra_error err;
  assert_int_equal(ra_npy_writer_open(path, RA_DTYPE_F32, 3, 2, &w, NULL), RA_OK);
  assert_int_equal(ra_npy_writer_close(w, &err), RA_ESTATE);
  assert_int_equal(ra_npy_read_f32(path, &a, &err), RA_EFORMAT);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_valid),
      cmocka_unit_test(test_json_rejects),
      cmocka_unit_test(test_npy_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
