/* The offload plan: shard assignment per store, q heads asked per layer, and the
 * sink / window / offloaded partition as the context grows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "offload_plan.h"

/* 4 layers, 8 q heads, 2 kv heads (group 4). Store A: layers 0-1; B: layers 2-3 kv head 0;
 * C and D split layers 2-3 kv head 1 at token 1000. */
static const char *MAP =
    "a:1 0-1 * 0-\n"
    "b:2 2-3 0 *\n"
    "c:3 2-3 1 0-999\n"
    "d:4 2-3 1 1000-\n";

static void test_stores_get_their_shards_clipped_to_the_sink(void **state) {
  ra_shard_map map;
  ra_offload_plan p;
  ra_error err;
  assert_int_equal(ra_shard_map_parse(MAP, &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 4, 8, 2, 128, 512, &p, &err), RA_OK);
  assert_int_equal(p.n_stores, 4);
  /* A: 2 layers x 2 kv heads, all open-ended from the sink on. */
  assert_int_equal(p.stores[0].n_shards, 4);
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(p.stores[0].shards[i].token_begin, 128);
    assert_true(p.stores[0].shards[i].token_end == RA_TOKEN_END_OPEN);
  }
  /* C: [128, 1000) of kv head 1 on layers 2 and 3; D: [1000, open). */
  assert_int_equal(p.stores[2].n_shards, 2);
  assert_int_equal(p.stores[2].shards[0].layer, 2);
  assert_int_equal(p.stores[2].shards[0].kv_head, 1);
  assert_int_equal(p.stores[2].shards[0].token_begin, 128);
  assert_int_equal(p.stores[2].shards[0].token_end, 1000);
  assert_int_equal(p.stores[3].shards[1].token_begin, 1000);
  /* Asked heads: A all 8 on layers 0-1, none on 2-3; B q heads 0-3; C and D q heads 4-7. */
  assert_int_equal(p.stores[0].n_asked[0], 8);
  assert_int_equal(p.stores[0].n_asked[2], 0);
  assert_int_equal(p.stores[1].n_asked[3], 4);
  assert_true(ra_offload_plan_asks(&p, 1, 3, 3));
  assert_false(ra_offload_plan_asks(&p, 1, 3, 4));
  assert_true(ra_offload_plan_asks(&p, 2, 2, 4) && ra_offload_plan_asks(&p, 3, 2, 7));
  assert_int_equal(ra_offload_plan_owner(&p, 3, 1, 999), 2);
  assert_int_equal(ra_offload_plan_owner(&p, 3, 1, 1000), 3);
  ra_offload_plan_free(&p);
  ra_shard_map_free(&map);
}

/* A shard lying wholly inside the sink holds nothing offloaded and is not opened. */
static void test_shard_inside_sink_is_dropped(void **state) {
  ra_shard_map map;
  ra_offload_plan p;
  ra_error err;
  assert_int_equal(ra_shard_map_parse("a:1 * * 0-99\nb:2 * * 100-\n", &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 2, 2, 1, 128, 16, &p, &err), RA_OK);
  assert_int_equal(p.stores[0].n_shards, 0);
  assert_int_equal(p.stores[0].n_asked[0], 0);
  assert_int_equal(p.stores[1].n_shards, 2);
  assert_int_equal(p.stores[1].shards[0].token_begin, 128);
  ra_offload_plan_free(&p);
  ra_shard_map_free(&map);
}

/* Sink, window and offloaded sets partition [0, n) at every length, and each decode step
 * evicts exactly the position that joins the offloaded set. */
static void test_partition_and_eviction(void **state) {
  ra_shard_map map;
  ra_offload_plan p;
  ra_error err;
  assert_int_equal(ra_shard_map_parse("a:1 * * *\n", &map, &err), RA_OK);
  const uint32_t S = 4, W = 8;
  assert_int_equal(ra_offload_plan_build(&map, 1, 1, 1, S, W, &p, &err), RA_OK);
  for (uint64_t n = 0; n < 64; n++) {
    uint64_t b, e, b2, e2;
    ra_offload_plan_range(&p, n, &b, &e);
    assert_int_equal(b, S);
    assert_true(e >= b);
    /* what is neither sink nor offloaded is the window: min(W, n - sink) tokens */
    uint64_t sink = n < S ? n : S, offloaded = e - b, window = n - sink - offloaded;
    assert_int_equal(window, n - sink < W ? n - sink : W);
    ra_offload_plan_range(&p, n + 1, &b2, &e2);
    int64_t ev = ra_offload_plan_evicted(&p, n);
    if (e2 > e) {
      assert_int_equal(e2, e + 1);
      assert_int_equal(ev, (int64_t)e);
    } else {
      assert_int_equal(ev, -1);
    }
  }
  ra_offload_plan_free(&p);
  ra_shard_map_free(&map);
}

static void test_bad_maps_are_refused_before_anything_starts(void **state) {
  ra_shard_map map;
  ra_offload_plan p;
  ra_error err;
  /* gap: tokens 100-199 of every head have no owner */
  assert_int_equal(ra_shard_map_parse("a:1 * * 0-99\nb:2 * * 200-\n", &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 2, 4, 2, 128, 512, &p, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "100-199 have no owner"));
  ra_shard_map_free(&map);
  /* overlap */
  assert_int_equal(ra_shard_map_parse("a:1 * * 0-\nb:2 1 * 50-\n", &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 2, 4, 2, 128, 512, &p, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "two owners"));
  ra_shard_map_free(&map);
  /* layer outside the model */
  assert_int_equal(ra_shard_map_parse("a:1 0-5 * *\n", &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 2, 4, 2, 128, 512, &p, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "outside [0, 2)"));
  /* not a GQA geometry */
  assert_int_equal(ra_offload_plan_build(&map, 2, 5, 2, 128, 512, &p, &err), RA_EINVAL);
  ra_shard_map_free(&map);
}

/* Replicas: every owner holds the shards, an attend asks one per rule, the next when one is down. */
static void test_replicas_choose_a_live_owner(void **state) {
  (void)state;
  ra_shard_map map;
  ra_offload_plan p;
  ra_error err;
  /* 1 layer, 4 q heads, 2 kv heads; kv head 0 on a and b, kv head 1 split: c,d below 1000, e above */
  assert_int_equal(ra_shard_map_parse("a:1,b:2 0 0 *\nc:3,d:4 0 1 0-999\ne:5 0 1 1000-\n", &map, &err), RA_OK);
  assert_int_equal(ra_offload_plan_build(&map, 1, 4, 2, 4, 8, &p, &err), RA_OK);
  assert_int_equal(p.max_owners, 2);
  for (size_t s = 0; s < 4; s++) assert_int_equal(p.stores[s].n_shards, 1);
  assert_true(ra_offload_plan_asks(&p, 1, 0, 0)); /* b holds kv head 0: it builds its indexes */
  uint8_t down[5] = {0}, asked[5 * 4];
  assert_int_equal(ra_offload_plan_choose(&p, 0, down, asked, &err), RA_OK);
  const uint8_t first[5 * 4] = {1, 1, 0, 0, /* a */ 0, 0, 0, 0, /* b */ 0, 0, 1, 1, /* c */ 0, 0, 0, 0, 0, 0, 1, 1};
  assert_memory_equal(asked, first, sizeof first);
  down[0] = down[2] = 1;
  assert_int_equal(ra_offload_plan_choose(&p, 0, down, asked, &err), RA_OK);
  const uint8_t failover[5 * 4] = {0, 0, 0, 0, 1, 1, 0, 0, /* b */ 0, 0, 0, 0, 0, 0, 1, 1, /* d */ 0, 0, 1, 1};
  assert_memory_equal(asked, failover, sizeof failover);
  assert_int_equal(ra_offload_plan_covered(&p, down, &err), RA_OK);
  down[4] = 1;
  assert_int_equal(ra_offload_plan_choose(&p, 0, down, asked, &err), RA_EUNAVAIL);
  assert_non_null(strstr(err.msg, "layer 0 kv head 1"));
  assert_int_equal(ra_offload_plan_covered(&p, down, &err), RA_EUNAVAIL);
  ra_offload_plan_free(&p);
  ra_shard_map_free(&map);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stores_get_their_shards_clipped_to_the_sink),
      cmocka_unit_test(test_shard_inside_sink_is_dropped),
      cmocka_unit_test(test_partition_and_eviction),
      cmocka_unit_test(test_bad_maps_are_refused_before_anything_starts),
      cmocka_unit_test(test_replicas_choose_a_live_owner),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
