/* common/npy: round trips (whole and streamed), headers as numpy writes them (1.0 and 2.0), and
 * refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/ra_npy_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* A v1.0 file from a header dict text (padded as numpy pads) plus `data_bytes` zero bytes. */
static size_t make_v1(unsigned char *buf, const char *dict, size_t data_bytes) {
  size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)((total - 10) & 0xff);
  buf[9] = (unsigned char)((total - 10) >> 8);
  memcpy(buf + 10, dict, dl);
  memset(buf + 10 + dl, ' ', total - 10 - dl - 1);
  buf[total - 1] = '\n';
  memset(buf + total, 0, data_bytes);
  return total + data_bytes;
}

static void test_roundtrip_f32_f16(void **state) {
  (void)state;
  char p[128];
  float a[3 * 5];
  for (int i = 0; i < 15; i++) a[i] = (float)i * 0.25f - 1.0f;
  path_of(p, sizeof p, "a.npy");
  ra_error err;
  assert_int_equal(ra_npy_write_f32(p, RA_DTYPE_F32, 3, 5, a, &err), RA_OK);
  ra_npy r;
  assert_int_equal(ra_npy_read(p, &r, &err), RA_OK);
  assert_int_equal(r.dtype, RA_DTYPE_F32);
  assert_int_equal(r.rows, 3);
  assert_int_equal(r.cols, 5);
  assert_memory_equal(r.data, a, sizeof a);
  ra_npy_free(&r);

  ra_fp16 h[4 * 2];
  ra_fp32_to_fp16_n(a, h, 8);
  assert_int_equal(ra_npy_write_f32(p, RA_DTYPE_F16, 4, 2, a, &err), RA_OK);
  assert_int_equal(ra_npy_read(p, &r, &err), RA_OK);
  assert_int_equal(r.dtype, RA_DTYPE_F16);
  assert_int_equal(r.rows, 4);
  assert_memory_equal(r.data, h, sizeof h);
  ra_npy_free(&r);

  /* The header is what numpy writes: dict text, space padding, newline, data 64-byte aligned. */
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  unsigned char buf[128];
  assert_int_equal(fread(buf, 1, 128, f), 128);
  fclose(f);
  assert_memory_equal(buf, "\x93NUMPY\x01\x00\x76\x00", 10);
  assert_memory_equal(buf + 10, "{'descr': '<f2', 'fortran_order': False, 'shape': (4, 2), }", 59);
  assert_int_equal(buf[69], ' ');
  assert_int_equal(buf[127], '\n');
  assert_int_equal(ra_npy_write_f32(p, RA_DTYPE_BF16, 1, 1, a, &err), RA_EINVAL);
}

static void test_writer_streams_rows(void **state) {
  (void)state;
  char p[128];
  path_of(p, sizeof p, "stream.npy");
  float rows[6] = {1.5f, -2.0f, 3.25f, 0.0f, 65504.0f, -0.125f};
  for (int dt = 0; dt < 2; dt++) {
    ra_npy_writer *w;
    ra_error err;
    assert_int_equal(ra_npy_writer_open(p, dt ? RA_DTYPE_F16 : RA_DTYPE_F32, 3, 2, &w, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows, 1, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows + 2, 2, &err), RA_OK);
    assert_int_equal(ra_npy_writer_append(w, rows, 1, &err), RA_ESTATE);
    assert_int_equal(ra_npy_writer_close(w, &err), RA_OK);
    ra_npy a;
    assert_int_equal(ra_npy_read_f32(p, &a, &err), RA_OK);
    assert_int_equal(a.dtype, RA_DTYPE_F32);
    assert_int_equal(a.rows, 3);
    assert_int_equal(a.cols, 2);
    assert_memory_equal(a.data, rows, sizeof rows); /* all exactly representable in f16 */
    ra_npy_free(&a);
  }
  /* a closed writer with missing rows, and a truncated file, are errors */
  ra_npy_writer *w;
  ra_error err;
  ra_npy a;
  assert_int_equal(ra_npy_writer_open(p, RA_DTYPE_F32, 3, 2, &w, NULL), RA_OK);
  assert_int_equal(ra_npy_writer_close(w, &err), RA_ESTATE);
  assert_int_equal(ra_npy_read_f32(p, &a, &err), RA_EFORMAT);
}

static void test_parses_numpy_variants(void **state) {
  (void)state;
  unsigned char buf[512];
  ra_dtype dt;
  uint64_t r, c;
  size_t off;
  ra_error err;
  /* Key order and spacing are free; v2.0 has a 4-byte length. */
  size_t n = make_v1(buf, "{\"shape\":(7,3),\"fortran_order\":False,\"descr\":\"<f4\"}", 0);
  assert_int_equal(ra_npy_parse_header(buf, n, &dt, &r, &c, &off, &err), RA_OK);
  assert_int_equal(r, 7);
  assert_int_equal(c, 3);
  assert_int_equal(off, 64);
  unsigned char v2[128];
  memcpy(v2, "\x93NUMPY\x02\x00", 8);
  const char *dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 64), }";
  size_t dl = strlen(dict), total = (12 + dl + 1 + 63) / 64 * 64, hl = total - 12;
  v2[8] = (unsigned char)hl;
  v2[9] = v2[10] = v2[11] = 0;
  memcpy(v2 + 12, dict, dl);
  memset(v2 + 12 + dl, ' ', hl - dl - 1);
  v2[total - 1] = '\n';
  assert_int_equal(ra_npy_parse_header(v2, total, &dt, &r, &c, &off, &err), RA_OK);
  assert_int_equal(dt, RA_DTYPE_F16);
  assert_int_equal(c, 64);
  assert_int_equal(off, total);
}

static void expect_refused(const char *dict, int code, const char *needle) {
  unsigned char buf[512];
  size_t n = make_v1(buf, dict, 0);
  ra_dtype dt;
  uint64_t r, c;
  size_t off;
  ra_error err;
  ra_error_clear(&err);
  assert_int_equal(ra_npy_parse_header(buf, n, &dt, &r, &c, &off, &err), code);
  if (!strstr(err.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", dict, err.msg, needle);
}

static void test_refuses_what_it_does_not_read(void **state) {
  (void)state;
  expect_refused("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", RA_EUNSUPPORTED, ">f4");
  expect_refused("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", RA_EUNSUPPORTED, "<f8");
  expect_refused("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", RA_EUNSUPPORTED, "Fortran");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2), }", RA_EUNSUPPORTED, "3-D");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", RA_EUNSUPPORTED, "1-D");
  expect_refused("{'descr': '<f4', 'fortran_order': False}", RA_EFORMAT, "shape");
  expect_refused("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)}", RA_EFORMAT, "twice");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), 'x': 1}", RA_EFORMAT, "unknown");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 1)}", RA_EFORMAT, "shape");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", RA_EFORMAT, "overflows");
  expect_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)} x", RA_EFORMAT, "trailing");
  expect_refused("['descr']", RA_EFORMAT, "dict");

  ra_dtype dt;
  uint64_t r, c;
  size_t off;
  ra_error err;
  unsigned char buf[512];
  assert_int_equal(ra_npy_parse_header("GIF89a....", 10, &dt, &r, &c, &off, &err), RA_EFORMAT);
  size_t n = make_v1(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }", 0);
  assert_int_equal(ra_npy_parse_header(buf, n - 5, &dt, &r, &c, &off, &err), RA_EFORMAT);
  assert_non_null(strstr(err.msg, "truncated"));
  buf[6] = 3;
  assert_int_equal(ra_npy_parse_header(buf, n, &dt, &r, &c, &off, &err), RA_EUNSUPPORTED);
  /* A 2.0 header length beyond the bound is refused before anything is read. */
  memcpy(buf, "\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
  assert_int_equal(ra_npy_parse_header(buf, 12, &dt, &r, &c, &off, &err), RA_EUNSUPPORTED);
}

static void test_file_size_must_match(void **state) {
  (void)state;
  unsigned char buf[512];
  char p[128];
  path_of(p, sizeof p, "short.npy");
  size_t n = make_v1(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
  ra_npy r;
  ra_error err;
  assert_int_equal(ra_npy_read(p, &r, &err), RA_EFORMAT);
  assert_null(r.data);
  assert_non_null(strstr(err.msg, "needing 24"));
  path_of(p, sizeof p, "missing.npy");
  assert_int_equal(ra_npy_read(p, &r, &err), RA_ENOTFOUND);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_f32_f16),
      cmocka_unit_test(test_writer_streams_rows),
      cmocka_unit_test(test_parses_numpy_variants),
      cmocka_unit_test(test_refuses_what_it_does_not_read),
      cmocka_unit_test(test_file_size_must_match),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
