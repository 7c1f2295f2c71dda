/* The session store: lifecycle, in-order filling, atomic writes, the memory budget, refcounts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store.h"

#define DIM 8
#define ROW_BYTES (DIM * 4) /* f32 */

static const kvs_geometry geo = {
    .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = DIM, .dtype = RA_DTYPE_F32};

/* Rows whose every element is the token position, so a stored row names its own position. */
static float *rows_for(uint64_t begin, uint64_t n) {
  float *x = malloc(n * ROW_BYTES);
  for (uint64_t i = 0; i < n; i++)
    for (int j = 0; j < DIM; j++) x[i * DIM + j] = (float)(begin + i);
  return x;
}

static int write_range(kvs_session *s, uint32_t layer, uint32_t head, uint64_t begin, uint64_t n,
                       ra_error *err) {
  float *x = rows_for(begin, n);
  kvs_rows r = {.layer = layer, .kv_head = head, .token_begin = begin, .n = n, .keys = x,
                .values = x};
  int rc = kvs_session_write(s, &r, 1, NULL, err);
  free(x);
  return rc;
}

static void test_open_get_close(void **state) {
  (void)state;
  kvs_store *st;
  ra_error err;
  assert_int_equal(kvs_store_create(1 << 20, &st, &err), RA_OK);
  kvs_shard_spec sh = {.layer = 1, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  kvs_session *a, *b, *got;
  assert_int_equal(kvs_store_open(st, &geo, &sh, 1, NULL, "t", &a, &err), RA_OK);
  assert_int_equal(kvs_store_open(st, &geo, &sh, 1, NULL, "t", &b, &err), RA_OK);
  assert_memory_not_equal(a->id, b->id, KVS_SESSION_ID_BYTES);
  assert_int_equal(kvs_store_sessions(st), 2);
  assert_true(kvs_store_bytes_used(st) > 0);

  assert_int_equal(kvs_store_get(st, a->id, KVS_SESSION_ID_BYTES, &got, &err), RA_OK);
  assert_ptr_equal(got, a);
  kvs_session_release(got);
  assert_int_equal(kvs_store_get(st, a->id, 15, &got, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "15 bytes"));
  uint8_t unknown[KVS_SESSION_ID_BYTES] = {0};
  assert_int_equal(kvs_store_get(st, unknown, sizeof unknown, &got, &err), RA_ENOTFOUND);

  uint8_t id[KVS_SESSION_ID_BYTES];
  memcpy(id, a->id, sizeof id);
  kvs_session_release(a);
  kvs_session_release(b);
  uint64_t freed = 0;
  assert_int_equal(kvs_store_close(st, id, sizeof id, &freed, &err), RA_OK);
  assert_true(freed > 0);
  assert_int_equal(kvs_store_close(st, id, sizeof id, &freed, &err), RA_ENOTFOUND);
  assert_int_equal(kvs_store_get(st, id, sizeof id, &got, &err), RA_ENOTFOUND);
  assert_int_equal(kvs_store_sessions(st), 1);
  kvs_store_destroy(st);
}

static void test_geometry_and_shards_checked(void **state) {
  (void)state;
  ra_error err;
  kvs_geometry g = geo;
  g.n_layers = 0;
  assert_int_equal(kvs_geometry_check(&g, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "n_layers 0"));
  g = geo;
  g.n_q_heads = 3;
  assert_int_equal(kvs_geometry_check(&g, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "not a multiple"));
  g = geo;
  g.head_dim = KVS_MAX_HEAD_DIM + 1;
  assert_int_equal(kvs_geometry_check(&g, &err), RA_EINVAL);
  g = geo;
  g.dtype = (ra_dtype)7;
  assert_int_equal(kvs_geometry_check(&g, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "dtype 7"));

  kvs_shard_spec bad_layer = {.layer = 2, .kv_head = 0, .token_begin = 0, .token_end = 10};
  assert_int_equal(kvs_shards_check(&geo, &bad_layer, 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "layer 2 out of range [0, 2)"));
  kvs_shard_spec empty = {.layer = 0, .kv_head = 0, .token_begin = 5, .token_end = 5};
  assert_int_equal(kvs_shards_check(&geo, &empty, 1, &err), RA_EINVAL);
  kvs_shard_spec overlap[2] = {
      {.layer = 0, .kv_head = 1, .token_begin = 100, .token_end = RA_TOKEN_END_OPEN},
      {.layer = 0, .kv_head = 1, .token_begin = 0, .token_end = 101}};
  assert_int_equal(kvs_shards_check(&geo, overlap, 2, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "overlap"));
  overlap[1].token_end = 100; /* adjacent is fine */
  assert_int_equal(kvs_shards_check(&geo, overlap, 2, &err), RA_OK);
  assert_int_equal(kvs_shards_check(&geo, overlap, 0, &err), RA_EINVAL);
}

static void test_fill_in_order(void **state) {
  (void)state;
  kvs_store *st;
  ra_error err;
  assert_int_equal(kvs_store_create(1 << 24, &st, &err), RA_OK);
  kvs_shard_spec sh[2] = {
      {.layer = 0, .kv_head = 1, .token_begin = 0, .token_end = 100},
      {.layer = 0, .kv_head = 1, .token_begin = 500, .token_end = RA_TOKEN_END_OPEN}};
  kvs_session *s;
  assert_int_equal(kvs_store_open(st, &geo, sh, 2, NULL, "t", &s, &err), RA_OK);

  assert_int_equal(write_range(s, 0, 1, 0, 60, &err), RA_OK);
  assert_int_equal(write_range(s, 0, 1, 50, 20, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "overlap: tokens [50, 70)"));
  assert_int_equal(write_range(s, 0, 1, 61, 5, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "hole: tokens [61, 66)"));
  assert_non_null(strstr(err.msg, "filled up to 60"));
  assert_int_equal(write_range(s, 0, 1, 60, 41, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "past the shard's end 100"));
  assert_int_equal(write_range(s, 0, 1, 200, 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "not in a shard"));
  assert_int_equal(write_range(s, 0, 0, 0, 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "has no shard"));
  assert_int_equal(write_range(s, 2, 0, 0, 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "layer 2 out of range"));
  assert_int_equal(write_range(s, 0, 1, 60, 40, &err), RA_OK);
  /* The open shard takes many small appends (capacity grows past its first allocation). */
  for (uint64_t t = 500; t < 1500; t++) assert_int_equal(write_range(s, 0, 1, t, 1, &err), RA_OK);
  assert_int_equal(kvs_store_tokens(st), 1100);

  size_t count;
  const kvs_shard *h = kvs_session_head(s, 0, 1, &count);
  assert_int_equal(count, 2);
  assert_int_equal(h[0].n, 100);
  assert_int_equal(h[1].n, 1000);
  for (uint64_t i = 0; i < h[1].n; i++)
    assert_true(((const float *)h[1].keys)[i * DIM + DIM - 1] == (float)(500 + i));
  assert_true(h[1].cap >= h[1].n && h[1].cap <= h[1].n + h[1].n / 8 + 64);
  kvs_session_release(s);
  kvs_store_destroy(st);
}

static void test_multi_block_write_is_atomic(void **state) {
  (void)state;
  kvs_store *st;
  ra_error err;
  assert_int_equal(kvs_store_create(1 << 24, &st, &err), RA_OK);
  kvs_shard_spec sh[2] = {
      {.layer = 0, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN},
      {.layer = 1, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN}};
  kvs_session *s;
  assert_int_equal(kvs_store_open(st, &geo, sh, 2, NULL, "t", &s, &err), RA_OK);
  float *x = rows_for(0, 10);
  kvs_rows rows[3] = {
      {.layer = 0, .kv_head = 0, .token_begin = 0, .n = 5, .keys = x, .values = x},
      {.layer = 0, .kv_head = 0, .token_begin = 5, .n = 5, .keys = x, .values = x},
      {.layer = 1, .kv_head = 0, .token_begin = 3, .n = 5, .keys = x, .values = x}};
  assert_int_equal(kvs_session_write(s, rows, 3, NULL, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "chunk 2: hole"));
  assert_int_equal(kvs_store_tokens(st), 0);
  size_t count;
  assert_int_equal(kvs_session_head(s, 0, 0, &count)->n, 0);
  /* Blocks of one call chain: the second starts where the first ends. */
  rows[2].token_begin = 0;
  uint64_t bytes = 0;
  assert_int_equal(kvs_session_write(s, rows, 3, &bytes, &err), RA_OK);
  assert_int_equal(bytes, 15 * ROW_BYTES * 2);
  assert_int_equal(kvs_session_head(s, 0, 0, &count)->n, 10);
  assert_int_equal(kvs_session_head(s, 1, 0, &count)->n, 5);
  free(x);
  kvs_session_release(s);
  kvs_store_destroy(st);
}

static void test_budget_refusal_leaves_session_usable(void **state) {
  (void)state;
  kvs_store *st;
  ra_error err;
  uint64_t budget = 64 * 1024;
  assert_int_equal(kvs_store_create(budget, &st, &err), RA_OK);
  kvs_shard_spec sh = {.layer = 0, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  kvs_session *s;
  assert_int_equal(kvs_store_open(st, &geo, &sh, 1, NULL, "t", &s, &err), RA_OK);
  uint64_t meta = kvs_store_bytes_used(st);
  /* 2000 rows x 32 bytes x (keys + values) = 128000 bytes > 64 KiB. */
  assert_int_equal(write_range(s, 0, 0, 0, 2000, &err), RA_ENOMEM);
  assert_non_null(strstr(err.msg, "of budget 65536"));
  assert_int_equal(kvs_store_bytes_used(st), meta);
  assert_int_equal(kvs_store_tokens(st), 0);
  assert_int_equal(write_range(s, 0, 0, 0, 100, &err), RA_OK);
  assert_int_equal(write_range(s, 0, 0, 100, 100, &err), RA_OK);
  assert_true(kvs_store_bytes_used(st) <= budget);
  assert_int_equal(kvs_store_tokens(st), 200);

  /* Budget also bounds sessions themselves. */
  kvs_geometry big = geo;
  big.n_layers = KVS_MAX_LAYERS;
  big.n_kv_heads = 64;
  big.n_q_heads = 64;
  kvs_session *t;
  assert_int_equal(kvs_store_open(st, &big, &sh, 1, NULL, "t", &t, &err), RA_ENOMEM);
  assert_non_null(strstr(err.msg, "opening a session"));

  uint8_t id[KVS_SESSION_ID_BYTES];
  memcpy(id, s->id, sizeof id);
  kvs_session_release(s);
  assert_int_equal(kvs_store_close(st, id, sizeof id, NULL, &err), RA_OK);
  assert_int_equal(kvs_store_bytes_used(st), 0);
  assert_int_equal(kvs_store_tokens(st), 0);
  kvs_store_destroy(st);
}

static void test_close_while_in_use(void **state) {
  (void)state;
  kvs_store *st;
  ra_error err;
  assert_int_equal(kvs_store_create(1 << 20, &st, &err), RA_OK);
  kvs_shard_spec sh = {.layer = 0, .kv_head = 0, .token_begin = 0, .token_end = RA_TOKEN_END_OPEN};
  kvs_session *s, *held;
  assert_int_equal(kvs_store_open(st, &geo, &sh, 1, NULL, "t", &s, &err), RA_OK);
  assert_int_equal(kvs_store_get(st, s->id, KVS_SESSION_ID_BYTES, &held, &err), RA_OK);
  kvs_session_release(s);
  assert_int_equal(write_range(held, 0, 0, 0, 10, &err), RA_OK);
  assert_int_equal(kvs_store_close(st, held->id, KVS_SESSION_ID_BYTES, NULL, &err), RA_OK);
  /* Closed but still referenced: memory stays charged and the data stays readable. */
  assert_true(kvs_store_bytes_used(st) > 0);
  size_t count;
  assert_int_equal(kvs_session_head(held, 0, 0, &count)->n, 10);
  kvs_session_release(held);
  assert_int_equal(kvs_store_bytes_used(st), 0);
  kvs_store_destroy(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_get_close),
      cmocka_unit_test(test_geometry_and_shards_checked),
      cmocka_unit_test(test_fill_in_order),
      cmocka_unit_test(test_multi_block_write_is_atomic),
      cmocka_unit_test(test_budget_refusal_leaves_session_usable),
      cmocka_unit_test(test_close_while_in_use),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
