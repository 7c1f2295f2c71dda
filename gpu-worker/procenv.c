#include "procenv.h"

#include <stdlib.h>
#include <unistd.h>

void ra_procenv_prefer_passive_omp(char **argv) {
  if (getenv("OMP_WAIT_POLICY")) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
  execv("/proc/self/exe", argv);
  /* exec failed (no /proc): carry on with the default policy */
}
