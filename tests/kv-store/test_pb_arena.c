/* The unpack allocator of PutKv chunks: a chunk's fields land in the reused block, the block is
 * not regrown for messages it holds, an allocation it cannot hold falls back to malloc (and is
 * freed), and the unpacked message equals what was packed. Under ASan a leak or a stray free
 * fails the run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvstore.pb-c.h"
#include "pb_arena.h"

static uint8_t *pack_chunk(size_t n_bytes, uint8_t fill, size_t *len) {
  Rakv__KvChunk c = RAKV__KV_CHUNK__INIT;
  uint8_t *k = malloc(n_bytes), *v = malloc(n_bytes);
  memset(k, fill, n_bytes);
  memset(v, (uint8_t)(fill + 1), n_bytes);
  c.layer = 3;
  c.n_tokens = 7;
  c.keys = (ProtobufCBinaryData){n_bytes, k};
  c.values = (ProtobufCBinaryData){n_bytes, v};
  *len = rakv__kv_chunk__get_packed_size(&c);
  uint8_t *out = malloc(*len);
  rakv__kv_chunk__pack(&c, out);
  free(k);
  free(v);
  return out;
}

static int in_block(const pb_arena *a, const void *p) {
  return (const unsigned char *)p >= a->block && (const unsigned char *)p < a->block + a->cap;
}

static void test_fields_land_in_the_reused_block(void **state) {
  (void)state;
  pb_arena a = {0};
  unsigned char *first = NULL;
  for (int round = 0; round < 3; round++) {
    size_t len;
    uint8_t *msg = pack_chunk(1 << 20, (uint8_t)round, &len);
    pb_arena_reset(&a, len);
    if (!first) first = a.block;
    assert_ptr_equal(a.block, first); /* a message of the same size reuses the block */
    Rakv__KvChunk *c = rakv__kv_chunk__unpack(pb_arena_allocator(&a), len, msg);
    assert_non_null(c);
    assert_true(in_block(&a, c));
    assert_true(in_block(&a, c->keys.data));
    assert_true(in_block(&a, c->values.data));
    assert_int_equal(c->layer, 3);
    assert_int_equal(c->n_tokens, 7);
    assert_int_equal(c->keys.len, 1 << 20);
    assert_int_equal(c->keys.data[12345], (uint8_t)round);
    assert_int_equal(c->values.data[(1 << 20) - 1], (uint8_t)(round + 1));
    rakv__kv_chunk__free_unpacked(c, pb_arena_allocator(&a));
    free(msg);
  }
  pb_arena_free(&a);
  assert_null(a.block);
}

static void test_what_the_block_cannot_hold_is_malloced_and_freed(void **state) {
  (void)state;
  pb_arena a = {0};
  size_t len;
  uint8_t *msg = pack_chunk(1 << 16, 9, &len);
  pb_arena_reset(&a, 0); /* a block sized for an empty message: the fields do not fit */
  Rakv__KvChunk *c = rakv__kv_chunk__unpack(pb_arena_allocator(&a), len, msg);
  assert_non_null(c);
  assert_false(in_block(&a, c->keys.data) && in_block(&a, c->values.data));
  assert_int_equal(c->keys.data[100], 9);
  rakv__kv_chunk__free_unpacked(c, pb_arena_allocator(&a));
  free(msg);
  pb_arena_free(&a);
}

static void test_a_malformed_message_is_refused(void **state) {
  (void)state;
  pb_arena a = {0};
  size_t len;
  uint8_t *msg = pack_chunk(4096, 1, &len);
  pb_arena_reset(&a, len);
  assert_null(rakv__kv_chunk__unpack(pb_arena_allocator(&a), len - 100, msg)); /* truncated */
  free(msg);
  pb_arena_free(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fields_land_in_the_reused_block),
      cmocka_unit_test(test_what_the_block_cannot_hold_is_malloced_and_freed),
      cmocka_unit_test(test_a_malformed_message_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
