#include "parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 0 when the comma-separated list names exactly parts[0..n), in order. */
static int parts_listed(const char *list, const test_part *parts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(parts[i].name);
    if (strncmp(list, parts[i].name, len) != 0 || (list[len] != ',' && list[len] != 0)) return -1;
    list += len;
    if (*list == ',') list++;
  }
  return *list == 0 ? 0 : -1;
}

int test_parts_run(const test_part *parts, size_t n_parts, int argc, char **argv, CMFixtureFunction setup,
                   CMFixtureFunction teardown) {
  if (argc > 2) {
    fprintf(stderr, "usage: %s [PART]\n", argv[0]);
    return 2;
  }
  const char *listed = getenv("RA_TEST_PARTS");
  if (listed && parts_listed(listed, parts, n_parts) != 0) {
    fprintf(stderr, "%s: ctest lists the parts '%s' but the program has:", argv[0], listed);
    for (size_t i = 0; i < n_parts; i++) fprintf(stderr, " %s", parts[i].name);
    fprintf(stderr, " (tests/CMakeLists.txt's PARTS must name them all)\n");
    return 2;
  }
  const char *filter = getenv("RA_TEST_FILTER");
  if (filter) cmocka_set_test_filter(filter);
  int failed = 0, ran = 0;
  for (size_t i = 0; i < n_parts; i++) {
    if (argc == 2 && strcmp(argv[1], parts[i].name) != 0) continue;
    failed += _cmocka_run_group_tests(parts[i].name, parts[i].tests, parts[i].n_tests, setup, teardown);
    ran++;
  }
  if (ran == 0 && argc == 2) {
    fprintf(stderr, "%s: no part named '%s'; the parts are:", argv[0], argv[1]);
    for (size_t i = 0; i < n_parts; i++) fprintf(stderr, " %s", parts[i].name);
    fprintf(stderr, "\n");
    return 2;
  }
  return failed;
}
