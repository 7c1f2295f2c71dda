/* ra_mem_advise_huge: a no-op on ranges without an aligned 2 MiB, and where the kernel offers
 * transparent huge pages (enabled = always or madvise), an advised region is backed by them once
 * touched (AnonHugePages of its mapping in /proc/self/smaps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/mman.h>

#include "hugemem.h"
#include "status.h"

static void test_small_or_empty_ranges_are_no_ops(void **state) {
  (void)state;
  char small[4096];
  assert_int_equal(ra_mem_advise_huge(NULL, 1 << 22), RA_OK);
  assert_int_equal(ra_mem_advise_huge(small, sizeof small), RA_OK);
  assert_int_equal(ra_mem_advise_huge(small, 0), RA_OK);
}

/* 1: THP usable through madvise, 0: disabled or absent. */
static int thp_madvise_enabled(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return 0;
  char line[128] = {0};
  int on = fgets(line, sizeof line, f) && !strstr(line, "[never]");
  fclose(f);
  return on;
}

/* AnonHugePages (kB) of the mapping that contains addr. */
static long anon_huge_kb(const void *addr) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  int inside = 0;
  long kb = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
      continue;
    }
    if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  }
  fclose(f);
  return kb;
}

static void test_advised_region_gets_huge_pages(void **state) {
  (void)state;
  const size_t huge = (size_t)2 << 20, len = 8 * huge;
  char *map = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(map != MAP_FAILED);
  char *p = (char *)(((uintptr_t)map + huge - 1) & ~(uintptr_t)(huge - 1));
  int rc = ra_mem_advise_huge(p, len);
  if (!thp_madvise_enabled()) {
    print_message("transparent huge pages are off here: advice gives %s\n", ra_status_name(rc));
    munmap(map, len + huge);
    skip();
  }
  assert_int_equal(rc, RA_OK);
  memset(p, 1, len);
  long kb = anon_huge_kb(p);
  print_message("advised 16 MiB: AnonHugePages %ld kB\n", kb);
  assert_true(kb >= 2048);
  munmap(map, len + huge);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_or_empty_ranges_are_no_ops),
      cmocka_unit_test(test_advised_region_gets_huge_pages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
