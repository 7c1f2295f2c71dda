/* ra_textfile_read: a whole file NUL-terminated; missing, oversized and binary files refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "textfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[] = "/tmp/test_textfile_XXXXXX";

static void write_bytes(const char *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
}

static void test_reads_whole_file(void **state) {
  (void)state;
  /* larger than one read chunk, so that the buffer grows */
  size_t n = 20000;
  char *want = malloc(n);
  for (size_t i = 0; i < n; i++) want[i] = (char)('a' + i % 26);
  write_bytes(want, n);
  char *text;
  size_t len;
  assert_int_equal(ra_textfile_read(path, n, &text, &len, NULL), RA_OK);
  assert_int_equal(len, n);
  assert_memory_equal(text, want, n);
  assert_int_equal(text[n], '\0');
  free(text);
  free(want);
  write_bytes("", 0);
  assert_int_equal(ra_textfile_read(path, 10, &text, NULL, NULL), RA_OK);
  assert_string_equal(text, "");
  free(text);
}

static void test_refusals(void **state) {
  (void)state;
  char *text = (char *)1;
  ra_error err;
  write_bytes("0123456789", 10);
  assert_int_equal(ra_textfile_read(path, 9, &text, NULL, &err), RA_EINVAL);
  assert_null(text);
  assert_non_null(strstr(err.msg, "larger than 9 bytes"));
  write_bytes("ab\0cd", 5);
  assert_int_equal(ra_textfile_read(path, 100, &text, NULL, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "contains NUL bytes"));
  assert_int_equal(ra_textfile_read("/nonexistent/f", 100, &text, NULL, &err), RA_EIO);
  assert_non_null(strstr(err.msg, "cannot open /nonexistent/f"));
}

int main(void) {
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  close(fd);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reads_whole_file),
      cmocka_unit_test(test_refusals),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(path);
  return rc;
}
