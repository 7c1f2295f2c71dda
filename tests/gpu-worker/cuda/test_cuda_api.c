/* The CUDA backend's host-side calls refuse what is not theirs with a clear error, on any
 * machine: another backend, a bad argument. No device is needed (none is touched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "backend_cuda.h"

static ra_backend *cpu;

static int setup(void **state) {
  (void)state;
  ra_backend_config cfg = {1, 0};
  return ra_backend_cpu_create(&cfg, &cpu, NULL) == RA_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ra_backend_destroy(cpu);
  return 0;
}

static void expect(int rc, const ra_error *err, const char *msg) {
  assert_int_equal(rc, RA_EINVAL);
  if (!strstr(err->msg, msg)) fail_msg("message '%s' lacks '%s'", err->msg, msg);
}

static void test_gemv_rows_refused(void **state) {
  (void)state;
  ra_error err;
  expect(ra_backend_cuda_set_gemv_rows(cpu, 2, &err), &err, "set_gemv_rows: not a cuda backend");
  expect(ra_backend_cuda_set_gemv_rows(NULL, 1, &err), &err, "not a cuda backend");
  expect(ra_backend_cuda_set_gemv_rows(cpu, 0, &err), &err, "0 rows (1 to 3)");
  expect(ra_backend_cuda_set_gemv_rows(cpu, RA_CUDA_GEMV_MAX_X + 1, &err), &err, "4 rows (1 to 3)");
}

static void test_other_calls_refuse_a_cpu_backend(void **state) {
  (void)state;
  ra_error err;
  expect(ra_backend_cuda_set_pdl(cpu, 1, &err), &err, "set_pdl: not a cuda backend");
  char name[64];
  expect(ra_backend_cuda_device_info(cpu, name, sizeof name, NULL, NULL, &err), &err, "not a cuda backend");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemv_rows_refused),
      cmocka_unit_test(test_other_calls_refuse_a_cpu_backend),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
