/* ra_mem_advise_huge: a no-op on ranges without an aligned 2 MiB, and where the kernel offers
 * transparent huge pages (enabled = always or madvise), an advised region is backed by them once
 * touched (AnonHugePages of its mapping in /proc/self/smaps). ra_huge_*: blocks keep their
 * contents through every resize, large ones start on a 2 MiB boundary, and a large block moved
 * by growing stays on huge pages (a realloc'd one did not). */
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

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31u + seed);
}

static void assert_filled(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 31u + seed)) fail_msg("byte %zu of %zu changed", i, n);
}

static void test_blocks_resize_and_keep_contents(void **state) {
  (void)state;
  const size_t MiB = (size_t)1 << 20;
  /* small, small, huge, huge (grown), huge (shrunk), small again, empty, small */
  const size_t sizes[] = {100, MiB, 3 * MiB, 9 * MiB, 5 * MiB, 1000, 0, 64};
  size_t have = 0;
  unsigned char *p = NULL;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *q = ra_huge_realloc(p, have, sizes[i]);
    assert_non_null(q);
    assert_filled(q, have < sizes[i] ? have : sizes[i], (unsigned)i);
    if (sizes[i] >= RA_HUGE_MIN) assert_int_equal((uintptr_t)q % ((uintptr_t)2 << 20), 0);
    fill(q, sizes[i], (unsigned)i + 1);
    p = q;
    have = sizes[i];
  }
  ra_huge_free(p, have);
  unsigned char *a = ra_huge_alloc(RA_HUGE_MIN);
  assert_non_null(a);
  assert_int_equal((uintptr_t)a % ((uintptr_t)2 << 20), 0);
  ra_huge_free(a, RA_HUGE_MIN);
  ra_huge_free(NULL, 123);
}

/* Sizes no mapping can hold are refused (they must not wrap when rounded up to huge pages), and a
 * refused resize leaves the block and its contents as they were. */
static void test_impossible_sizes_are_refused(void **state) {
  (void)state;
  assert_null(ra_huge_alloc(SIZE_MAX));
  assert_null(ra_huge_alloc(SIZE_MAX / 2));
  const size_t len = 2 * RA_HUGE_MIN;
  unsigned char *p = ra_huge_alloc(len);
  assert_non_null(p);
  fill(p, len, 3);
  assert_null(ra_huge_realloc(p, len, SIZE_MAX));
  assert_null(ra_huge_realloc(p, len, SIZE_MAX / 2));
  assert_filled(p, len, 3);
  unsigned char *small = ra_huge_alloc(100);
  assert_non_null(small);
  fill(small, 100, 4);
  assert_null(ra_huge_realloc(small, 100, SIZE_MAX - 1));
  assert_filled(small, 100, 4);
  ra_huge_free(small, 100);
  ra_huge_free(p, len);
}

/* Growing a block whose next 2 MiB are taken moves it; its pages must stay huge. */
static void test_moved_block_stays_huge(void **state) {
  (void)state;
  const size_t huge = (size_t)2 << 20, len = 8 * huge;
  if (!thp_madvise_enabled()) skip();
  unsigned char *p = ra_huge_alloc(len);
  assert_non_null(p);
  fill(p, len, 7);
  void *blocker = mmap(p + len, huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                       -1, 0);
  assert_true(blocker == (void *)(p + len));
  long before = anon_huge_kb(p);
  unsigned char *q = ra_huge_realloc(p, len, 2 * len);
  assert_non_null(q);
  assert_true(q != p);
  assert_filled(q, len, 7);
  long after = anon_huge_kb(q);
  print_message("8 huge pages filled: AnonHugePages %ld kB, after the move %ld kB\n", before,
                after);
  assert_true(before >= 4096);
  assert_true(after >= before);
  ra_huge_free(q, 2 * len);
  munmap(blocker, huge);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_or_empty_ranges_are_no_ops),
      cmocka_unit_test(test_advised_region_gets_huge_pages),
      cmocka_unit_test(test_blocks_resize_and_keep_contents),
      cmocka_unit_test(test_moved_block_stays_huge),
      cmocka_unit_test(test_impossible_sizes_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
