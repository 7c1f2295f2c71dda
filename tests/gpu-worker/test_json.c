/* The strict JSON reader, and the string writer whose output it must accept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"

static void test_json_valid(void **state) {
  (void)state;
  const char *s = " {\"a\": [1, -2.5e2, true, null], \"b\": {\"c\": \"x\\u00e9\\ud83d\\ude00\\n\"}, \"a\": 7} ";
  ra_json *v;
  ra_error err;
  assert_int_equal(ra_json_parse(s, strlen(s), &v, &err), RA_OK);
  double d;
  assert_int_equal(ra_json_get_num(v, "a", &d), RA_OK); /* the last duplicate wins */
  assert_true(d == 7.0);
  const ra_json *b = ra_json_get(v, "b");
  const char *c;
  assert_int_equal(ra_json_get_str(b, "c", &c), RA_OK);
  assert_string_equal(c, "x\xc3\xa9\xf0\x9f\x98\x80\n");
  assert_int_equal(v->items[0].n, 4);
  assert_true(v->items[0].items[1].num == -250.0);
  assert_int_equal(ra_json_get_num(v, "b", &d), RA_EFORMAT);
  assert_int_equal(ra_json_get_num(v, "zz", &d), RA_ENOTFOUND);
  ra_json_free(v);
}

static void test_json_rejects(void **state) {
  (void)state;
  const char *bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", "-", "NaN", "\"a", "\"\\x\"", "\"\\ud800\"",
                       "[1] 2", "{'a': 1}", "\"\x01\"", "\"\xff\"", "tru", "1e999", "{\"a\" 1}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ra_json *v = NULL;
    ra_error err;
    ra_error_clear(&err);
    if (ra_json_parse(bad[i], strlen(bad[i]), &v, &err) != RA_EFORMAT) fail_msg("accepted '%s'", bad[i]);
    assert_true(err.msg[0] != 0);
  }
  /* nesting is bounded */
  char deep[200];
  memset(deep, '[', sizeof deep);
  ra_json *v;
  ra_error err;
  assert_int_equal(ra_json_parse(deep, sizeof deep, &v, &err), RA_EFORMAT);
  assert_non_null(strstr(err.msg, "deep"));
}

/* Generated text can end inside a character (byte-level BPE) or be arbitrary bytes: the writer
 * keeps well-formed UTF-8 and replaces the rest, so that the strict reader takes the file back. */
static void test_json_write_str_round_trip(void **state) {
  (void)state;
  const char *in[] = {"plain \"q\" \\ \n\t\x01", "caf\xc3\xa9 \xf0\x9f\x98\x80", "cut \xe2\x82", "\xff\xfe",
                      "\xc0\xaf overlong", "\xed\xa0\x80 surrogate", "\xf4\x90\x80\x80 > U+10FFFF"};
  const char *want[] = {"plain \"q\" \\ \n\t\x01", "caf\xc3\xa9 \xf0\x9f\x98\x80", "cut \xef\xbf\xbd\xef\xbf\xbd",
                        "\xef\xbf\xbd\xef\xbf\xbd", "\xef\xbf\xbd\xef\xbf\xbd overlong",
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd surrogate",
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd > U+10FFFF"};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ra_json_write_str(f, in[i]);
    fclose(f);
    ra_json *v;
    ra_error err;
    if (ra_json_parse(buf, len, &v, &err) != RA_OK) fail_msg("case %zu: %s: %s", i, buf, err.msg);
    assert_int_equal(v->type, RA_JSON_STRING);
    assert_string_equal(v->str, want[i]);
    ra_json_free(v);
    free(buf);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_valid),
      cmocka_unit_test(test_json_write_str_round_trip),
      cmocka_unit_test(test_json_rejects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
