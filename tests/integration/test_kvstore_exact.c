/* Real kv-store processes over loopback: a store's partial merged with a locally computed one
 * equals full softmax attention (f32, f16, bf16), flat returns the exact top-k, and three stores
 * owning different shards, one kv head split across two of them by token range, merge to the
 * same result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "client.h"
#include "harness.h"
#include "kvdata.h"
#include "merge.h"
#include "reference.h"
#include "shardmap.h"

#define TIMEOUT_MS 10000

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static ra_kvclient *connect_to(const harness_store *st) {
  ra_kvclient *c;
  ra_error err;
  ok(ra_kvclient_connect(st->addr, NULL, &c, &err), &err);
  return c;
}

/* One store owns tokens [split, n) of every (layer, kv head); the test holds [0, split). */
static void check_split(ra_dtype t, double tol) {
  harness_store st;
  assert_int_equal(harness_store_start(&st, NULL), 0);
  ra_kvclient *c = connect_to(&st);
  ra_error err;
  ra_kvclient_geometry g = {.n_layers = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 128,
                            .dtype = t};
  const size_t n = 3000, split = 800;
  kvdata d;
  kvdata_make(&d, &g, n, 100 + (uint64_t)t);
  ra_kvclient_shard shards[4];
  ra_kvclient_rows rows[4];
  for (uint32_t i = 0; i < 4; i++) {
    shards[i] = (ra_kvclient_shard){.layer = i / 2, .kv_head = i % 2, .token_begin = split,
                                    .token_end = RA_TOKEN_END_OPEN};
    rows[i] = kvdata_rows(&d, i / 2, i % 2, split, n);
  }
  ra_kvclient_session s;
  ok(ra_kvclient_open_session(c, &g, shards, 4, "exact", &s, &err), &err);
  uint64_t stored = 0;
  ok(ra_kvclient_put_kv(c, &s, rows, 4, &stored, &err), &err);
  assert_int_equal(stored, 4 * (n - split));

  ra_kvclient_stream *stream;
  ok(ra_kvclient_attend_open(c, &s, &stream, &err), &err);
  uint32_t heads[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  float q[8 * 128], o[8][128], local_o[128];
  double want[128];
  ra_head_partial parts[8];
  ref_rng rng = {5};
  float scale = 1.0f / sqrtf(128.0f);
  for (uint32_t layer = 0; layer < 2; layer++) {
    ref_fill_normal(&rng, q, 8 * 128, 1.0f);
    for (int h = 0; h < 8; h++) parts[h] = (ra_head_partial){.part.o = o[h]};
    ra_kvclient_attend_req req = {.layer = layer, .q_heads = heads, .n_heads = 8, .q = q,
                                  .mode = RA_MODE_FULL};
    ok(ra_kvclient_attend(stream, &req, parts, TIMEOUT_MS, NULL, &err), &err);
    for (int h = 0; h < 8; h++) {
      uint32_t kv = (uint32_t)h / 4;
      const float *k = kvdata_k(&d, layer, kv), *v = kvdata_v(&d, layer, kv);
      assert_int_equal(parts[h].n_keys, n - split);
      ra_partial local = {.o = local_o};
      ra_partial_attend_f32(q + h * 128, k, v, split, 128, scale, &local);
      ra_partial_merge_from(&local, &parts[h].part, 128);
      ref_attention(q + h * 128, k, v, NULL, n, 128, want);
      double e = ref_max_abs_diff(local.o, want, 128);
      if (e > tol) fail_msg("%s layer %u head %d: max abs error %g > %g", ra_dtype_name(t), layer, h, e, tol);
    }
  }

  /* flat k=100 on layer 1: the exact top-k of the stored tokens and the partial over them. */
  uint64_t ids[100];
  parts[0] = (ra_head_partial){.part.o = o[0], .ids = ids, .ids_cap = 100};
  uint32_t head = 6;
  ra_kvclient_attend_req req = {.layer = 1, .q_heads = &head, .n_heads = 1, .q = q,
                                .mode = RA_MODE_FLAT, .top_k = 100, .want_ids = 1};
  ok(ra_kvclient_attend(stream, &req, parts, TIMEOUT_MS, NULL, &err), &err);
  assert_int_equal(parts[0].n_ids, 100);
  const float *k = kvdata_k(&d, 1, 1), *v = kvdata_v(&d, 1, 1);
  size_t m = n - split;
  double *scores = malloc(m * sizeof *scores);
  uint32_t want_ids[100], got[100];
  ref_scores(q, k + split * 128, m, 128, scores);
  ref_topk(scores, m, 100, want_ids);
  for (int i = 0; i < 100; i++) {
    got[i] = (uint32_t)(ids[i] - split);
    if (got[i] != want_ids[i]) assert_true(fabs(scores[got[i]] - scores[want_ids[i]]) < 1e-3);
  }
  ref_attention(q, k + split * 128, v + split * 128, got, 100, 128, want);
  assert_true(ref_max_abs_diff(parts[0].part.o, want, 128) <= 1e-5);
  free(scores);

  ra_kvclient_attend_close(stream);
  ok(ra_kvclient_close_session(c, &s, NULL, &err), &err);
  ra_kvclient_close(c);
  kvdata_free(&d);
  assert_int_equal(harness_store_stop(&st, 10000), 0);
}

static void test_exact_f32(void **state) {
  (void)state;
  check_split(RA_DTYPE_F32, 1e-5);
}
static void test_exact_f16(void **state) {
  (void)state;
  check_split(RA_DTYPE_F16, 2e-3);
}
static void test_exact_bf16(void **state) {
  (void)state;
  check_split(RA_DTYPE_BF16, 2e-3);
}

/* Three stores, routed by a shard map: A has layer 0; B has layer 1 kv heads 0-1 and tokens
 * from 1200 on of kv heads 2-3; C has tokens [0, 1200) of layer 1 kv heads 2-3. */
static void test_three_stores(void **state) {
  (void)state;
  harness_store st[3];
  ra_kvclient *c[3];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(harness_store_start(&st[i], NULL), 0);
    c[i] = connect_to(&st[i]);
  }
  char text[1024];
  snprintf(text, sizeof text,
           "# store  layers  kv_heads  tokens\n"
           "%s 0 * *\n%s 1 0-1 *\n%s 1 2-3 0-1199\n%s 1 2-3 1200-\n",
           st[0].addr, st[1].addr, st[2].addr, st[1].addr);
  ra_shard_map map;
  ra_error err;
  ok(ra_shard_map_parse(text, &map, &err), &err);
  ra_kvclient_geometry g = {.n_layers = 2, .n_q_heads = 8, .n_kv_heads = 4, .head_dim = 64,
                            .dtype = RA_DTYPE_F16};
  ok(ra_shard_map_validate(&map, g.n_layers, g.n_kv_heads, &err), &err);
  assert_int_equal(map.n_stores, 3);
  const size_t n = 2500;
  kvdata d;
  kvdata_make(&d, &g, n, 31);

  /* Each store's shards and data, from the map's rules. */
  ra_kvclient_session sess[3];
  ra_kvclient_stream *stream[3];
  for (uint32_t si = 0; si < 3; si++) {
    ra_kvclient_shard shards[16];
    ra_kvclient_rows rows[16];
    size_t ns = 0;
    for (size_t r = 0; r < map.n_rules; r++) {
      const ra_shard_rule *rule = &map.rules[r];
      if (rule->store != si) continue;
      for (uint32_t l = rule->layer_lo; l <= rule->layer_hi; l++)
        for (uint32_t h = rule->head_lo; h <= rule->head_hi && h < g.n_kv_heads; h++) {
          shards[ns] = (ra_kvclient_shard){.layer = l, .kv_head = h,
                                           .token_begin = rule->token_begin,
                                           .token_end = rule->token_end};
          uint64_t end = rule->token_end < n ? rule->token_end : n;
          rows[ns++] = kvdata_rows(&d, l, h, rule->token_begin, end);
        }
    }
    ok(ra_kvclient_open_session(c[si], &g, shards, ns, "three", &sess[si], &err), &err);
    ok(ra_kvclient_put_kv(c[si], &sess[si], rows, ns, NULL, &err), &err);
    ok(ra_kvclient_attend_open(c[si], &sess[si], &stream[si], &err), &err);
  }

  ref_rng rng = {77};
  float q[8 * 64], o[8][64], acc_o[8][64];
  double want[64];
  for (uint32_t layer = 0; layer < 2; layer++) {
    ref_fill_normal(&rng, q, 8 * 64, 1.0f);
    ra_partial acc[8];
    for (int h = 0; h < 8; h++) {
      acc[h].o = acc_o[h];
      ra_partial_reset(&acc[h], 64);
    }
    uint64_t keys_seen[8] = {0};
    for (uint32_t si = 0; si < 3; si++) {
      /* The q heads whose kv head this store owns at this layer (any token range). */
      uint32_t heads[8];
      float sq[8 * 64];
      size_t nh = 0;
      for (uint32_t h = 0; h < 8; h++) {
        uint32_t kv = h / 2;
        int owns = 0;
        for (size_t r = 0; r < map.n_rules; r++) {
          const ra_shard_rule *rule = &map.rules[r];
          owns |= rule->store == si && layer >= rule->layer_lo && layer <= rule->layer_hi &&
                  kv >= rule->head_lo && kv <= rule->head_hi;
        }
        if (!owns) continue;
        memcpy(sq + nh * 64, q + h * 64, 64 * sizeof(float));
        heads[nh++] = h;
      }
      if (nh == 0) continue;
      ra_head_partial parts[8];
      for (size_t i = 0; i < nh; i++) parts[i] = (ra_head_partial){.part.o = o[i]};
      ra_kvclient_attend_req req = {.layer = layer, .q_heads = heads, .n_heads = nh, .q = sq,
                                    .mode = RA_MODE_FULL};
      ok(ra_kvclient_attend(stream[si], &req, parts, TIMEOUT_MS, NULL, &err), &err);
      for (size_t i = 0; i < nh; i++) {
        ra_partial_merge_from(&acc[heads[i]], &parts[i].part, 64);
        keys_seen[heads[i]] += parts[i].n_keys;
      }
    }
    for (uint32_t h = 0; h < 8; h++) {
      assert_int_equal(keys_seen[h], n);
      ref_attention(q + h * 64, kvdata_k(&d, layer, h / 2), kvdata_v(&d, layer, h / 2), NULL, n,
                    64, want);
      double e = ref_max_abs_diff(acc[h].o, want, 64);
      if (e > 2e-3) fail_msg("layer %u head %u: max abs error %g", layer, h, e);
    }
  }
  for (int i = 0; i < 3; i++) {
    ra_kvclient_attend_close(stream[i]);
    ra_kvclient_close(c[i]);
    assert_int_equal(harness_store_stop(&st[i], 10000), 0);
  }
  ra_shard_map_free(&map);
  kvdata_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_f32),
      cmocka_unit_test(test_exact_f16),
      cmocka_unit_test(test_exact_bf16),
      cmocka_unit_test(test_three_stores),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
