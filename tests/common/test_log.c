/* ra_log_escape: what a peer sent cannot forge log lines. */
#include "log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

static void test_escape_controls_and_backslash(void **state) {
  (void)state;
  char out[64];
  const char in[] = "w0\nI kv-store: forged\\\x01\xff";
  assert_string_equal(ra_log_escape(in, sizeof in - 1, out, sizeof out), "w0\\x0aI kv-store: forged\\x5c\\x01\\xff");
  assert_string_equal(ra_log_escape("plain", 5, out, sizeof out), "plain");
}

static void test_escape_cuts_long_input(void **state) {
  (void)state;
  char out[12];
  ra_log_escape("abcdefghijklmnop", 16, out, sizeof out);
  assert_string_equal(out, "abcdefgh...");
  /* exactly filling: no cut */
  assert_string_equal(ra_log_escape("abcdefghijk", 11, out, sizeof out), "abcdefghijk");
  /* an escape that does not fit whole is left out, never half written */
  ra_log_escape("abcdef\n\n", 8, out, sizeof out);
  assert_string_equal(out, "abcdef...");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_escape_controls_and_backslash),
      cmocka_unit_test(test_escape_cuts_long_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
