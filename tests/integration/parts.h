/* A test program's cmocka tests in named parts, so that ctest runs each part as its own test
 * (its own process, timeout and place in the schedule) while a part's tests share one fixture.
 * `prog PART` runs that part; `prog` runs every part in turn. RA_TEST_FILTER (a cmocka pattern,
 * e.g. "test_int8*") narrows either to the matching tests. */
#ifndef RA_TEST_PARTS_H
#define RA_TEST_PARTS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

typedef struct test_part {
  const char *name;
  const struct CMUnitTest *tests;
  size_t n_tests;
} test_part;

#define TEST_PART(name, tests) {(name), (tests), sizeof(tests) / sizeof((tests)[0])}

/* Runs the part argv[1] names, or every part without one, each with setup / teardown around it.
 * Returns the number of failed tests (cmocka's convention), or 2 with a message naming the parts
 * when argv[1] names none or RA_TEST_PARTS (set by ctest) lists other parts than these. */
int test_parts_run(const test_part *parts, size_t n_parts, int argc, char **argv, CMFixtureFunction setup,
                   CMFixtureFunction teardown);

#endif
