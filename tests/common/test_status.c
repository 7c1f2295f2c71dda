/* Status codes and error messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "status.h"

static void test_errorf_fills_message_and_returns_code(void **state) {
  (void)state;
  ra_error err;
  ra_error_clear(&err);
  assert_int_equal(ra_errorf(&err, RA_EINVAL, "layer %u out of range", 40u), RA_EINVAL);
  assert_int_equal(err.code, RA_EINVAL);
  assert_string_equal(err.msg, "layer 40 out of range");
  assert_int_equal(ra_error_wrap(&err, "store %s", "a:1"), RA_EINVAL);
  assert_string_equal(err.msg, "store a:1: layer 40 out of range");
  assert_int_equal(ra_errorf(NULL, RA_ENOMEM, "ignored"), RA_ENOMEM);
}

static void test_names_are_distinct(void **state) {
  (void)state;
  assert_string_equal(ra_status_name(RA_ENOTFOUND), "RA_ENOTFOUND");
  assert_string_equal(ra_strerror(RA_ETIMEDOUT), "timed out");
  assert_string_equal(ra_status_name(-999), "RA_E?");
  for (int a = RA_EPERM; a <= RA_EOF; a++)
    for (int b = a + 1; b <= RA_EOF; b++) assert_string_not_equal(ra_status_name(a), ra_status_name(b));
}

/* Every RA code that names a failure survives the trip through its gRPC status (EFORMAT and
 * EIO have no status of their own), and the numbers are gRPC's. */
static void test_grpc_round_trip(void **state) {
  (void)state;
  const int codes[] = {RA_OK, RA_EINVAL, RA_ENOTFOUND, RA_ENOMEM, RA_EEXIST, RA_EUNAVAIL, RA_ETIMEDOUT,
                       RA_ECANCELED, RA_EUNSUPPORTED, RA_ESTATE, RA_EAUTH, RA_EPERM};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    assert_int_equal(ra_status_from_grpc(ra_status_to_grpc(codes[i])), codes[i]);
  assert_int_equal(ra_status_to_grpc(RA_EFORMAT), 3);
  assert_int_equal(ra_status_to_grpc(RA_ENOTFOUND), 5);
  assert_int_equal(ra_status_to_grpc(RA_EPERM), 7);
  assert_int_equal(ra_status_to_grpc(RA_EIO), 13);
  assert_int_equal(ra_status_from_grpc(11), RA_EINVAL); /* OUT_OF_RANGE */
  assert_int_equal(ra_status_from_grpc(2), RA_EINTERNAL); /* UNKNOWN */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errorf_fills_message_and_returns_code),
      cmocka_unit_test(test_names_are_distinct),
      cmocka_unit_test(test_grpc_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
