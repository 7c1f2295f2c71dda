#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>

static int detect(void) {
  __builtin_cpu_init();
  /* __builtin_cpu_supports knows avx2 and fma on gcc and clang, but clang 14 lacks "f16c":
   * read it from CPUID leaf 1, ECX bit 29. AVX2 implies the OS saves the ymm state. */
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int f16c = (c >> 29) & 1;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

static int detect_avx512(void) {
  /* __builtin_cpu_supports checks that the OS saves the zmm state too (XGETBV). */
  return detect() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}
#else
static int detect(void) { return 0; }
static int detect_avx512(void) { return 0; }
#endif

int ra_cpu_has_avx2(void) {
  static int cached = -1;
  if (cached < 0) cached = detect();
  return cached;
}

int ra_cpu_has_avx512(void) {
  static int cached = -1;
  if (cached < 0) cached = detect_avx512();
  return cached;
}
