/* Shard map: parsing (ranges, comments, errors naming the line), validation of exact coverage
 * (gaps and double owners), lookup and the round-robin spread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shardmap.h"

static const char *example =
    "# store            layers   kv_heads   tokens\n"
    "127.0.0.1:7001     0-15     *          0-\n"
    "127.0.0.1:7002     16-31    0-3        *      # trailing comment\n"
    "\n"
    "10.0.0.7:7000      16-31    4-7        0-65535\n"
    "10.0.0.8:7000      16-31    4-7        65536-\n";

static void test_parse_example(void **state) {
  (void)state;
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_parse(example, &m, &err), RA_OK);
  assert_int_equal(m.n_stores, 4);
  assert_int_equal(m.n_rules, 4);
  assert_string_equal(m.stores[2], "10.0.0.7:7000");
  assert_int_equal(m.rules[2].token_begin, 0);
  assert_int_equal(m.rules[2].token_end, 65536);
  assert_int_equal(m.rules[3].token_end, RA_TOKEN_END_OPEN);
  assert_int_equal(ra_shard_map_validate(&m, 32, 8, &err), RA_OK);

  const ra_shard_rule *r = ra_shard_map_find(&m, 20, 5, 65535);
  assert_non_null(r);
  assert_string_equal(m.stores[r->store], "10.0.0.7:7000");
  r = ra_shard_map_find(&m, 20, 5, 65536);
  assert_string_equal(m.stores[r->store], "10.0.0.8:7000");
  r = ra_shard_map_find(&m, 3, 7, 1u << 30);
  assert_string_equal(m.stores[r->store], "127.0.0.1:7001");
  assert_null(ra_shard_map_find(&m, 32, 0, 0));
  /* The geometry must fit the map: 8 kv heads named, 4 in the model. */
  assert_int_equal(ra_shard_map_validate(&m, 32, 4, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "kv heads 4-7 outside [0, 4)"));
  ra_shard_map_free(&m);
}

static void expect_parse_error(const char *text, const char *what) {
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_parse(text, &m, &err), RA_EINVAL);
  if (!strstr(err.msg, what)) fail_msg("message '%s' lacks '%s'", err.msg, what);
}

static void test_parse_errors(void **state) {
  (void)state;
  expect_parse_error("a:1 0 0\n", "line 1: want 'STORE LAYERS KV_HEADS TOKENS', got 3 fields");
  expect_parse_error("# ok\nnoport 0 0 0\n", "line 2: store 'noport' is not HOST:PORT");
  expect_parse_error("a:1 x 0 0\n", "line 1: bad layer range 'x'");
  expect_parse_error("a:1 0 3-1 0\n", "line 1: bad kv head range '3-1'");
  expect_parse_error("a:1 0 0 -5\n", "line 1: bad token range '-5'");
}

static void expect_invalid(const char *text, const char *what) {
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_parse(text, &m, &err), RA_OK);
  assert_int_equal(ra_shard_map_validate(&m, 2, 2, &err), RA_EINVAL);
  if (!strstr(err.msg, what)) fail_msg("message '%s' lacks '%s'", err.msg, what);
  ra_shard_map_free(&m);
}

static void test_validate_gaps_and_overlaps(void **state) {
  (void)state;
  expect_invalid("a:1 0 * *\n", "layer 1 kv head 0: tokens from 0 on have no owner");
  expect_invalid("a:1 * * 0-99\nb:1 * * 101-\n", "layer 0 kv head 0: tokens 100-100 have no owner");
  expect_invalid("a:1 * * 0-100\nb:1 * * 100-\n", "token 100 has two owners");
  expect_invalid("a:1 * * 0-99\n", "tokens from 100 on have no owner");
  expect_invalid("a:1 0-2 * *\n", "layers 0-2 outside [0, 2)");
}

static void test_spread(void **state) {
  (void)state;
  const char *stores[] = {"a:1", "b:2", "c:3"};
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_spread(stores, 3, 4, 2, &m, &err), RA_OK);
  assert_int_equal(m.n_stores, 3);
  assert_int_equal(m.n_rules, 8);
  assert_int_equal(ra_shard_map_validate(&m, 4, 2, &err), RA_OK);
  size_t per_store[3] = {0};
  for (size_t i = 0; i < m.n_rules; i++) per_store[m.rules[i].store]++;
  assert_int_equal(per_store[0], 3);
  assert_int_equal(per_store[1], 3);
  assert_int_equal(per_store[2], 2);
  ra_shard_map_free(&m);
  const char *bad[] = {"nope"};
  assert_int_equal(ra_shard_map_spread(bad, 1, 1, 1, &m, &err), RA_EINVAL);
  assert_int_equal(ra_shard_map_spread(stores, 0, 1, 1, &m, &err), RA_EINVAL);
}

static void test_spread_list(void **state) {
  (void)state;
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_spread_list("a:1,b:2,c:3", 2, 3, &m, &err), RA_OK);
  assert_int_equal(m.n_stores, 3);
  assert_int_equal(m.n_rules, 6);
  assert_string_equal(m.stores[2], "c:3");
  assert_int_equal(ra_shard_map_validate(&m, 2, 3, &err), RA_OK);
  ra_shard_map_free(&m);
  assert_int_equal(ra_shard_map_spread_list("a:1,,b:2", 2, 3, &m, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "entry 2 is empty"));
  assert_int_equal(ra_shard_map_spread_list("a:1,", 2, 3, &m, &err), RA_EINVAL);
  assert_int_equal(ra_shard_map_spread_list("nohostport", 2, 3, &m, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "not HOST:PORT"));
}

/* Replicas: owners lists parsed, spread maps replicated round-robin, and the rule that an owner
 * of a replicated kv head holds one token range of it. */
static void test_replicas(void **state) {
  (void)state;
  ra_shard_map m;
  ra_error err;
  assert_int_equal(ra_shard_map_parse("a:1,b:2 0 * 0-99\nb:2,c:3 0 * 100-\n", &m, &err), RA_OK);
  assert_int_equal(m.n_stores, 3);
  assert_int_equal(m.rules[0].n_owners, 2);
  assert_int_equal(m.rules[0].store, 0);
  assert_int_equal(m.rules[1].owners[1], 2);
  /* b owns both ranges of a replicated kv head */
  assert_int_equal(ra_shard_map_validate(&m, 1, 2, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "store b:2 owns rules 1 and 2"));
  ra_shard_map_free(&m);
  assert_int_equal(ra_shard_map_parse("a:1,b:2 0 * 0-99\nc:3,d:4 0 * 100-\n", &m, &err), RA_OK);
  assert_int_equal(ra_shard_map_validate(&m, 1, 2, &err), RA_OK);
  ra_shard_map_free(&m);
  expect_parse_error("a:1,a:1 0 0 0-\n", "store 'a:1' named twice");
  expect_parse_error("a:1,x 0 0 0-\n", "store 'x' is not HOST:PORT");

  assert_int_equal(ra_shard_map_spread_list("a:1,b:2,c:3", 2, 3, &m, &err), RA_OK);
  assert_int_equal(ra_shard_map_replicate(&m, 4, &err), RA_EINVAL);
  assert_int_equal(ra_shard_map_replicate(&m, 2, &err), RA_OK);
  for (size_t i = 0; i < m.n_rules; i++) {
    assert_int_equal(m.rules[i].n_owners, 2);
    assert_int_equal(m.rules[i].owners[0], m.rules[i].store);
    assert_int_equal(m.rules[i].owners[1], (m.rules[i].store + 1) % 3);
  }
  assert_int_equal(ra_shard_map_validate(&m, 2, 3, &err), RA_OK);
  ra_shard_map_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spread_list),
      cmocka_unit_test(test_parse_example),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_validate_gaps_and_overlaps),
      cmocka_unit_test(test_spread),
      cmocka_unit_test(test_replicas),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
