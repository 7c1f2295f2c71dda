/* ra_procenv_blas_core: OpenBLAS's own choice stands unless it fell back to a core without AVX
 * kernels; then the CPU's features name the kernels (and a CPU without AVX2 keeps the fallback). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "procenv.h"

static void test_known_cores_are_kept(void **state) {
  (void)state;
  assert_null(ra_procenv_blas_core("Haswell", 1, 1));
  assert_null(ra_procenv_blas_core("SkylakeX", 1, 1));
  assert_null(ra_procenv_blas_core("Zen", 0, 1));
  assert_null(ra_procenv_blas_core("Cooperlake", 1, 1));
}

static void test_fallback_cores_get_the_cpus_kernels(void **state) {
  (void)state;
  assert_string_equal(ra_procenv_blas_core("Prescott", 1, 1), "SkylakeX");
  assert_string_equal(ra_procenv_blas_core("Prescott", 0, 1), "Haswell");
  assert_string_equal(ra_procenv_blas_core("Nehalem", 0, 1), "Haswell");
  assert_string_equal(ra_procenv_blas_core("", 1, 1), "SkylakeX");
  assert_string_equal(ra_procenv_blas_core(NULL, 0, 1), "Haswell");
  assert_null(ra_procenv_blas_core("Prescott", 0, 0)); /* nothing better to offer */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_cores_are_kept),
      cmocka_unit_test(test_fallback_cores_get_the_cpus_kernels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
