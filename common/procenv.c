#include "procenv.h"

#include "cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *ra_procenv_blas_core(const char *current, int has_avx512, int has_avx2) {
  /* the cores OpenBLAS falls back to when it cannot name the CPU: no AVX kernels at all */
  static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom"};
  int fallback = !current || !*current;
  for (size_t i = 0; !fallback && i < sizeof generic / sizeof *generic; i++)
    fallback = strcmp(current, generic[i]) == 0;
  if (!fallback) return NULL;
  return has_avx512 ? "SkylakeX" : has_avx2 ? "Haswell" : NULL;
}

void ra_procenv_apply_defaults(char **argv) {
  int changed = 0;
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
    changed |= setenv("OMP_WAIT_POLICY", "passive", 1) == 0;
  if (!getenv("OPENBLAS_CORETYPE")) {
    const char *core = ra_procenv_blas_core(openblas_get_corename(), ra_cpu_has_avx512(), ra_cpu_has_avx2());
    if (core) changed |= setenv("OPENBLAS_CORETYPE", core, 1) == 0;
  }
  if (changed) execv("/proc/self/exe", argv);
}
