/* What the gpu-worker unit tests share: the CPU backend (2 threads) as a cmocka group fixture
 * (setup / teardown around `be`) and seeded uniform values in [-1, 1). Included by one source
 * file of each test program. */
#ifndef RA_TEST_CPU_FIXTURE_H
#define RA_TEST_CPU_FIXTURE_H

#include "backend.h"

#include <stdint.h>

static ra_backend *be;

static int setup(void **state) {
  (void)state;
  ra_backend_config cfg = {2, 0};
  return ra_backend_create("cpu", &cfg, &be, NULL);
}

static int teardown(void **state) {
  (void)state;
  ra_backend_destroy(be);
  return 0;
}

static inline float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) * 0x1p-23f - 1.0f;
}

#endif
