/* ra_opts: every kind of row through the command-line parser and the config-file reader, their
 * bounds and errors, scopes, several tables in one set, and the usage generated from the rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { COLOR_RED, COLOR_GREEN, COLOR_BLUE } color;

typedef struct conf {
  int verbose;
  int window;
  uint32_t big;
  long neg;
  uint64_t seed;
  uint64_t budget;
  size_t message;
  float ratio;
  double temp;
  const char *path;
  color color;
  const char *addr;
  const char *config;
} conf;

static const char *color_name(int c) {
  static const char *n[] = {"red", "green", "blue"};
  return n[c];
}

static int addr_parse(const char *v, void *field, ra_error *err) {
  if (!strchr(v, ':')) return ra_errorf(err, RA_EINVAL, "not HOST:PORT");
  memcpy(field, &v, sizeof v);
  return RA_OK;
}

static const char *addr_show(const void *field) {
  const char *v;
  memcpy(&v, field, sizeof v);
  return v;
}

enum { S_RUN = 1u << 0, S_DUMP = 1u << 1 };
static const char *const scopes[] = {"run", "dump"};

static const ra_opt rows[] = {
    {"verbose", RA_OPT_FLAG, RA_OPT_AT(conf, verbose), .help = "say more"},
    {"window", RA_OPT_INT, RA_OPT_AT(conf, window), .lo = 1, .hi = 1 << 20, .meta = "N",
     .help = "recent tokens"},
    {"big", RA_OPT_INT, RA_OPT_AT(conf, big), .lo = 0, .hi = UINT32_MAX, .meta = "N", .help = "a uint32"},
    {"neg", RA_OPT_INT, RA_OPT_AT(conf, neg), .lo = -5, .hi = INT64_MAX, .meta = "N", .help = "from -5 up"},
    {"seed", RA_OPT_U64, RA_OPT_AT(conf, seed), .ulo = 0, .uhi = UINT64_MAX, .meta = "N", .help = "any u64"},
    {"budget", RA_OPT_SIZE, RA_OPT_AT(conf, budget), .ulo = 1, .uhi = UINT64_MAX, .meta = "SIZE",
     .help = "bytes", .dflt = "80% of RAM"},
    {"message", RA_OPT_SIZE, RA_OPT_AT(conf, message), .ulo = 1024, .uhi = 1u << 30, .meta = "SIZE",
     .help = "largest message"},
    {"ratio", RA_OPT_FLOAT, RA_OPT_AT(conf, ratio), .flo = 0, .fhi = 1, .flags = RA_OPT_OPEN_LO, .meta = "P",
     .help = "a fraction", .scope = S_RUN},
    {"temp", RA_OPT_FLOAT, RA_OPT_AT(conf, temp), .flo = 0, .fhi = HUGE_VAL, .meta = "T", .help = "temperature",
     .scope = S_RUN},
    {"path", RA_OPT_STRING, RA_OPT_AT(conf, path), .meta = "PATH", .help = "a file", .scope = S_DUMP},
    {"color", RA_OPT_ENUM, RA_OPT_AT(conf, color), .lo = COLOR_RED, .hi = COLOR_BLUE, .name_of = color_name,
     .help = "paint", .scope = S_RUN | S_DUMP},
    {"addr", RA_OPT_CUSTOM, RA_OPT_AT(conf, addr), .parse = addr_parse, .show = addr_show, .meta = "HOST:PORT",
     .help = "where"},
    {"config", RA_OPT_STRING, RA_OPT_AT(conf, config), .meta = "FILE", .help = "options from FILE",
     .flags = RA_OPT_ARGV_ONLY},
};

static conf defaults(void) {
  return (conf){.window = 512, .message = 64u << 20, .ratio = 0.95f, .color = COLOR_GREEN, .addr = "h:1",
                .neg = -10};
}

typedef struct fixture {
  conf c;
  unsigned char given[RA_OPTS_COUNT(rows)];
  ra_opts_table t;
  ra_opts_set s;
  ra_error err;
} fixture;

static void fixture_init(fixture *f, unsigned scope) {
  memset(f, 0, sizeof *f);
  f->c = defaults();
  f->t = (ra_opts_table){rows, RA_OPTS_COUNT(rows), &f->c, f->given};
  f->s = (ra_opts_set){&f->t, 1, scopes, scope};
  ra_error_clear(&f->err);
}

/* Parses the NULL-terminated argument list. */
static int parse_list(fixture *f, ...) {
  char *argv[32];
  int argc = 0;
  va_list ap;
  va_start(ap, f);
  for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 32;) argv[argc++] = a;
  va_end(ap);
  return ra_opts_parse_args(&f->s, argc, argv, &f->err);
}

#define PARSE(f, ...) parse_list(f, __VA_ARGS__, (char *)NULL)

/* The call fails with RA_EINVAL and a message holding `want`. */
#define EXPECT_ERROR(f, want, ...)                                  \
  do {                                                              \
    assert_int_equal(PARSE(f, __VA_ARGS__), RA_EINVAL);             \
    if (!strstr((f)->err.msg, want)) fail_msg("'%s' not in '%s'", want, (f)->err.msg); \
  } while (0)

static void test_every_kind(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, S_RUN);
  assert_int_equal(PARSE(&f, "--verbose", "--window", "7", "--big", "4000000000", "--neg", "-5", "--seed",
                         "18446744073709551615", "--budget", "64G", "--message", "2M", "--ratio", "1", "--temp",
                         "0.5", "--color", "blue", "--addr", "x:2"),
                   RA_OK);
  assert_int_equal(f.c.verbose, 1);
  assert_int_equal(f.c.window, 7);
  assert_true(f.c.big == 4000000000u);
  assert_true(f.c.neg == -5);
  assert_true(f.c.seed == UINT64_MAX);
  assert_true(f.c.budget == 64ull << 30);
  assert_true(f.c.message == 2u << 20);
  assert_true(f.c.ratio == 1.0f);
  assert_true(f.c.temp == 0.5);
  assert_int_equal(f.c.color, COLOR_BLUE);
  assert_string_equal(f.c.addr, "x:2");
  assert_true(ra_opts_given(&f.s, "window"));
  assert_false(ra_opts_given(&f.s, "path"));
  assert_false(ra_opts_given(&f.s, "nonesuch"));
  /* a later value overrides an earlier one; a value may look like a flag */
  fixture_init(&f, S_DUMP);
  assert_int_equal(PARSE(&f, "--window", "3", "--window", "4", "--path", "--verbose"), RA_OK);
  assert_int_equal(f.c.window, 4);
  assert_string_equal(f.c.path, "--verbose");
  assert_int_equal(f.c.verbose, 0);
}

static void test_bounds_and_errors(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, S_RUN);
  EXPECT_ERROR(&f, "bad --window 0: must be 1 to 1048576", "--window", "0");
  EXPECT_ERROR(&f, "bad --window 1048577: must be 1 to 1048576", "--window", "1048577");
  EXPECT_ERROR(&f, "bad --window 99999999999999999999: must be 1 to 1048576", "--window", "99999999999999999999");
  EXPECT_ERROR(&f, "bad --window 7x: not an integer", "--window", "7x");
  EXPECT_ERROR(&f, "bad --window : not an integer", "--window", "");
  EXPECT_ERROR(&f, "bad --window  7: not an integer", "--window", " 7");
  EXPECT_ERROR(&f, "bad --neg -6: must be at least -5", "--neg", "-6");
  EXPECT_ERROR(&f, "bad --big -1: must be 0 to 4294967295", "--big", "-1");
  EXPECT_ERROR(&f, "bad --seed -1: must be at least 0", "--seed", "-1");
  EXPECT_ERROR(&f, "bad --seed 18446744073709551616: must be at least 0", "--seed", "18446744073709551616");
  EXPECT_ERROR(&f, "bad --seed 1K: not an integer", "--seed", "1K");
  EXPECT_ERROR(&f, "bad --budget lots: not a size like 64G or 512M", "--budget", "lots");
  EXPECT_ERROR(&f, "bad --budget 0: must be at least 1", "--budget", "0");
  EXPECT_ERROR(&f, "bad --budget 17179869184T: must be at least 1", "--budget", "17179869184T");
  EXPECT_ERROR(&f, "bad --budget 5Q: not a size", "--budget", "5Q");
  EXPECT_ERROR(&f, "bad --budget 5KBB: not a size", "--budget", "5KBB");
  EXPECT_ERROR(&f, "bad --message 1023: must be 1K to 1G", "--message", "1023");
  EXPECT_ERROR(&f, "bad --message 2G: must be 1K to 1G", "--message", "2G");
  EXPECT_ERROR(&f, "bad --ratio 0: must be > 0 and <= 1", "--ratio", "0");
  EXPECT_ERROR(&f, "bad --ratio 1.5: must be > 0 and <= 1", "--ratio", "1.5");
  EXPECT_ERROR(&f, "bad --ratio nan: not a number", "--ratio", "nan");
  EXPECT_ERROR(&f, "bad --temp -1: must be >= 0", "--temp", "-1");
  EXPECT_ERROR(&f, "bad --temp inf: not a number", "--temp", "inf");
  EXPECT_ERROR(&f, "bad --color pink: must be red, green or blue", "--color", "pink");
  EXPECT_ERROR(&f, "bad --addr nowhere: not HOST:PORT", "--addr", "nowhere");
  EXPECT_ERROR(&f, "unknown option --bogus", "--bogus", "1");
  EXPECT_ERROR(&f, "unexpected argument 'stray'", "stray");
  EXPECT_ERROR(&f, "unexpected argument '--'", "--");
  EXPECT_ERROR(&f, "--window needs a value", "--window");
  EXPECT_ERROR(&f, "--path is a dump option, not run", "--path", "p");
  /* sizes take K/M/G/T in either case, with an optional B */
  assert_int_equal(PARSE(&f, "--budget", "3k", "--message", "1KB"), RA_OK);
  assert_true(f.c.budget == 3072 && f.c.message == 1024);
  assert_int_equal(PARSE(&f, "--budget", "1tb"), RA_OK);
  assert_true(f.c.budget == 1ull << 40);
}

static void test_parse_int(void **state) {
  (void)state;
  int64_t v = 42;
  ra_error err;
  assert_int_equal(ra_opts_parse_int("-9223372036854775808", INT64_MIN, INT64_MAX, &v, &err), RA_OK);
  assert_true(v == INT64_MIN);
  assert_int_equal(ra_opts_parse_int("+8", 0, 8, &v, NULL), RA_OK);
  assert_true(v == 8);
  assert_int_equal(ra_opts_parse_int("9", 0, 8, &v, &err), RA_EINVAL);
  assert_string_equal(err.msg, "must be 0 to 8");
  assert_true(v == 8); /* untouched on failure */
  assert_int_equal(ra_opts_parse_int(NULL, 0, 8, &v, &err), RA_EINVAL);
  assert_string_equal(err.msg, "not an integer");
  uint64_t u;
  assert_int_equal(ra_opts_parse_u64("16E", 1, 0, UINT64_MAX, &u, &err), RA_EINVAL);
  assert_int_equal(ra_opts_parse_u64("16777215T", 1, 0, UINT64_MAX, &u, &err), RA_OK);
  assert_true(u == 16777215ull << 40);
}

static void test_parse_int_list(void **state) {
  (void)state;
  int64_t v[3] = {0};
  int n = -1;
  ra_error err;
  assert_int_equal(ra_opts_parse_int_list("1,4,16", 1, 32, v, 3, &n, &err), RA_OK);
  assert_true(n == 3 && v[0] == 1 && v[1] == 4 && v[2] == 16);
  assert_int_equal(ra_opts_parse_int_list("7", 1, 32, v, 3, &n, &err), RA_OK);
  assert_true(n == 1 && v[0] == 7);
  assert_int_equal(ra_opts_parse_int_list("1,2,3,4", 1, 32, v, 3, &n, &err), RA_EINVAL);
  assert_string_equal(err.msg, "at most 3 values");
  const char *bad[] = {"", ",", "1,", ",1", "1,,2", "1,x", NULL};
  for (int i = 0; i < 6; i++) {
    n = -1;
    assert_int_equal(ra_opts_parse_int_list(bad[i], 1, 32, v, 3, &n, &err), RA_EINVAL);
    assert_int_equal(n, -1); /* untouched on failure */
  }
  assert_int_equal(ra_opts_parse_int_list(bad[6], 1, 32, v, 3, &n, &err), RA_EINVAL);
  assert_int_equal(ra_opts_parse_int_list("1,33", 1, 32, v, 3, &n, &err), RA_EINVAL);
  assert_string_equal(err.msg, "must be 1 to 32");
}

/* Rows of a second table with their own target, as a program builds them from another table. */
static void test_several_tables(void **state) {
  (void)state;
  typedef struct extra {
    uint32_t ef;
  } extra;
  extra e = {0};
  ra_opt built[1];
  built[0] = (ra_opt){"ef", RA_OPT_INT, RA_OPT_AT(extra, ef), .lo = 1, .hi = 100, .meta = "N", .help = "beam"};
  conf c = defaults();
  ra_opts_table t[2] = {{rows, RA_OPTS_COUNT(rows), &c, NULL}, {built, 1, &e, NULL}};
  ra_opts_set s = {t, 2, scopes, 0};
  char *argv[] = {"--ef", "9", "--window", "5", "--path", "p", "--temp", "1"};
  ra_error err;
  assert_int_equal(ra_opts_parse_args(&s, 8, argv, &err), RA_OK);
  assert_int_equal(e.ef, 9);
  assert_int_equal(c.window, 5);
  assert_false(ra_opts_given(&s, "ef")); /* no `given` array */
  char *bad[] = {"--ef", "0"};
  assert_int_equal(ra_opts_parse_args(&s, 2, bad, &err), RA_EINVAL);
  assert_string_equal(err.msg, "bad --ef 0: must be 1 to 100");
}

/* A row whose field its kind cannot write is a program's bug, reported as such. */
static void test_bad_row(void **state) {
  (void)state;
  typedef struct small {
    uint8_t level;
  } small;
  small c = {0};
  ra_opt r[] = {{"level", RA_OPT_ENUM, RA_OPT_AT(small, level), .lo = 0, .hi = 2, .name_of = color_name}};
  ra_opts_table t = {r, 1, &c, NULL};
  ra_opts_set s = {&t, 1, NULL, 0};
  char *argv[] = {"--level", "red"};
  ra_error err;
  assert_int_equal(ra_opts_parse_args(&s, 2, argv, &err), RA_EINTERNAL);
  assert_non_null(strstr(err.msg, "--level: bad option row"));
}

static char *usage_of(const ra_opts_set *s) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  ra_opts_usage(s, f);
  fclose(f);
  return buf;
}

static void test_usage(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, 0);
  char *u = usage_of(&f.s);
  /* defaults come from the target; a sentinel outside the bounds or an unset string shows none */
  assert_non_null(strstr(u, "options:\n  --verbose                 say more\n"));
  assert_non_null(strstr(u, "  --window N                recent tokens (default 512)\n"));
  assert_non_null(strstr(u, "  --big N                   a uint32 (default 0)\n"));
  assert_non_null(strstr(u, "  --budget SIZE             bytes (default 80% of RAM)\n"));
  assert_non_null(strstr(u, "  --message SIZE            largest message (default 64M)\n"));
  assert_non_null(strstr(u, "options of run:\n  --ratio P                 a fraction (default 0.95)\n"));
  assert_non_null(strstr(u, "options of dump:\n  --path PATH               a file\n"));
  assert_non_null(strstr(u, "options of run, dump:\n  --color red|green|blue    paint (default green)\n"));
  assert_non_null(strstr(u, "  --addr HOST:PORT          where (default h:1)\n"));
  assert_null(strstr(u, "--neg N                   from -5 up (default"));
  free(u);
  /* a changed target changes the defaults shown */
  f.c.window = 9;
  u = usage_of(&f.s);
  assert_non_null(strstr(u, "recent tokens (default 9)\n"));
  free(u);
  /* one scope: the others' rows are left out */
  fixture_init(&f, S_RUN);
  u = usage_of(&f.s);
  assert_non_null(strstr(u, "--ratio"));
  assert_null(strstr(u, "--path"));
  free(u);
}

static void test_usage_wraps_long_help(void **state) {
  (void)state;
  conf c = defaults();
  static const char long_help[] =
      "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen\n"
      "second line";
  ra_opt r[] = {{"a-very-long-option-name", RA_OPT_INT, RA_OPT_AT(conf, window), .lo = 1, .hi = 1000,
                 .meta = "COUNT", .help = long_help}};
  ra_opts_table t = {r, 1, &c, NULL};
  ra_opts_set s = {&t, 1, NULL, 0};
  char *u = usage_of(&s);
  assert_string_equal(u,
                      "options:\n"
                      "  --a-very-long-option-name COUNT\n"
                      "                            one two three four five six seven eight nine ten eleven twelve thirteen\n"
                      "                            fourteen fifteen sixteen\n"
                      "                            second line (default 512)\n");
  for (char *line = u; line; line = strchr(line + 1, '\n')) assert_true(strcspn(line + 1, "\n") < 100);
  free(u);
}

static char *write_tmp(const char *text) {
  char *path = strdup("/tmp/test_opts_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

/* Parses the file `text` in scope S_RUN; returns the rc with the message in f->err. */
static int parse_file(fixture *f, const char *text, char **path_out) {
  char *path = write_tmp(text), *buf = NULL;
  int rc = ra_opts_parse_file(&f->s, path, &buf, &f->err);
  if (path_out) *path_out = path;
  else {
    unlink(path);
    free(path);
  }
  free(buf);
  return rc;
}

static void test_config_file(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, S_RUN);
  char *path = write_tmp("# a comment\n\n   \nwindow 33\n  verbose  \r\n\tbudget\t 2G \ncolor red\r\n"
                         "addr a b:1\n  # indented comment\nwindow 34");
  char *text = NULL;
  assert_int_equal(ra_opts_parse_file(&f.s, path, &text, &f.err), RA_OK);
  assert_int_equal(f.c.window, 34); /* the last line without a newline counts */
  assert_int_equal(f.c.verbose, 1);
  assert_true(f.c.budget == 2ull << 30);
  assert_int_equal(f.c.color, COLOR_RED);
  assert_string_equal(f.c.addr, "a b:1"); /* the value is the rest of the line */
  assert_true(ra_opts_given(&f.s, "budget"));
  /* the command line, parsed after the file, overrides it */
  assert_int_equal(PARSE(&f, "--window", "5"), RA_OK);
  assert_int_equal(f.c.window, 5);
  assert_true(f.c.budget == 2ull << 30);
  free(text);
  unlink(path);
  free(path);
}

static void test_config_file_errors(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, S_RUN);
  char *path;
  assert_int_equal(parse_file(&f, "window 3\n\n# c\nwindow zero\n", &path), RA_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "%s:4: bad window zero: not an integer", path);
  assert_string_equal(f.err.msg, want);
  unlink(path);
  free(path);
  struct {
    const char *text, *want;
  } cases[] = {
      {"bogus 1\n", ":1: unknown option bogus"},
      {"--window 3\n", ":1: unknown option --window"},
      {"verbose yes\n", ":1: verbose takes no value"},
      {"\nwindow\n", ":2: window needs a value"},
      {"window 0\n", ":1: bad window 0: must be 1 to 1048576"},
      {"path p\n", ":1: path is a dump option, not run"},
      {"config other.conf\n", ":1: config cannot be set in a config file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture_init(&f, S_RUN);
    assert_int_equal(parse_file(&f, cases[i].text, NULL), RA_EINVAL);
    if (!strstr(f.err.msg, cases[i].want)) fail_msg("'%s' not in '%s'", cases[i].want, f.err.msg);
  }
  char *text = (char *)1;
  assert_int_equal(ra_opts_parse_file(&f.s, "/nonexistent/x.conf", &text, &f.err), RA_EIO);
  assert_null(text);
  assert_non_null(strstr(f.err.msg, "config file: cannot open /nonexistent/x.conf"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_kind),
      cmocka_unit_test(test_bounds_and_errors),
      cmocka_unit_test(test_parse_int),
      cmocka_unit_test(test_several_tables),
      cmocka_unit_test(test_bad_row),
      cmocka_unit_test(test_usage),
      cmocka_unit_test(test_usage_wraps_long_help),
      cmocka_unit_test(test_config_file),
      cmocka_unit_test(test_config_file_errors),
      cmocka_unit_test(test_parse_int_list),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
