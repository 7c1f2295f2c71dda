/* The mode table (common/modes.h) and the parameter tables (common/index_params.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>

#include "index_params.h"
#include "modes.h"

static void test_mode_names_round_trip(void **state) {
  (void)state;
  for (int m = 0; m < RA_MODE_COUNT; m++) {
    ra_mode back = RA_MODE_COUNT;
    assert_int_equal(ra_mode_parse(ra_mode_name((ra_mode)m), &back), RA_OK);
    assert_int_equal(back, m);
    assert_true(strlen(ra_mode_help((ra_mode)m)) > 0);
  }
  ra_mode out = RA_MODE_FLAT;
  assert_int_equal(ra_mode_parse("hnsw", &out), RA_EINVAL);
  assert_int_equal(ra_mode_parse(NULL, &out), RA_EINVAL);
  assert_int_equal(out, RA_MODE_FLAT);
  assert_string_equal(ra_mode_name((ra_mode)RA_MODE_COUNT), "?");
  assert_string_equal(ra_mode_name((ra_mode)-1), "?");
}

static void test_mode_list(void **state) {
  (void)state;
  char buf[128];
  size_t n = ra_mode_list(buf, sizeof buf, 0);
  assert_string_equal(buf, "full, streaming, flat, ivf, kgraph, roar, wave");
  assert_int_equal(n, strlen(buf));
  ra_mode_list(buf, sizeof buf, RA_MODE_F_STORES);
  assert_string_equal(buf, "flat, ivf, kgraph, roar, wave");
  ra_mode_list(buf, sizeof buf, RA_MODE_F_TOP_K);
  assert_string_equal(buf, "flat, ivf, kgraph, roar");
  ra_mode_list(buf, sizeof buf, RA_MODE_F_RETRO);
  assert_string_equal(buf, "flat, ivf, kgraph, roar, wave");
  /* Truncated like snprintf: the length the whole list needs, the part that fits. */
  char small[8];
  assert_int_equal(ra_mode_list(small, sizeof small, 0), n);
  assert_string_equal(small, "full, s");
  assert_int_equal(ra_mode_list(NULL, 0, 0), n);
}

static void test_mode_properties(void **state) {
  (void)state;
  assert_int_equal(RA_MODE_N_INDEXED, 3);
  static const int slot[RA_MODE_COUNT] = {-1, -1, -1, 0, 1, 2, -1};
  static const int stores[RA_MODE_COUNT] = {0, 0, 1, 1, 1, 1, 1};
  static const int top_k[RA_MODE_COUNT] = {0, 0, 1, 1, 1, 1, 0};
  static const int retro[RA_MODE_COUNT] = {0, 0, 1, 1, 1, 1, 1};
  static const int wire[RA_MODE_COUNT] = {0, RA_MODE_NO_WIRE, 1, 2, 3, 4, 5};
  for (int m = 0; m < RA_MODE_COUNT; m++) {
    assert_int_equal(ra_mode_index_slot((ra_mode)m), slot[m]);
    assert_int_equal(ra_mode_has_index((ra_mode)m), slot[m] >= 0);
    assert_int_equal(ra_mode_uses_stores((ra_mode)m), stores[m]);
    assert_int_equal(ra_mode_takes_top_k((ra_mode)m), top_k[m]);
    assert_int_equal(ra_mode_takes_retro((ra_mode)m), retro[m]);
    assert_int_equal(ra_mode_to_wire((ra_mode)m), wire[m]);
    ra_mode back;
    if (wire[m] != RA_MODE_NO_WIRE) {
      assert_int_equal(ra_mode_from_wire(wire[m], &back), RA_OK);
      assert_int_equal(back, m);
    }
  }
  ra_mode back;
  assert_int_equal(ra_mode_from_wire(6, &back), RA_EINVAL);
  assert_int_equal(ra_mode_from_wire(RA_MODE_NO_WIRE, &back), RA_EINVAL);
  assert_int_equal(ra_mode_index_slot((ra_mode)99), -1);
  assert_int_equal(ra_mode_to_wire((ra_mode)99), RA_MODE_NO_WIRE);
}

static void test_param_rows(void **state) {
  (void)state;
  size_t n;
  const ra_param *rows = ra_index_param_rows(&n);
  assert_int_equal(n, 10);
  for (size_t i = 0; i < n; i++) {
    assert_ptr_equal(ra_index_param_find(rows[i].flag), &rows[i]);
    assert_true(rows[i].lo <= rows[i].hi);
    assert_true(strlen(rows[i].help) > 0);
  }
  const ra_param *p = ra_index_param_find("knn-nq");
  assert_non_null(p);
  assert_string_equal(p->name, "knn_nq");
  assert_int_equal(p->offset, offsetof(ra_index_spec, knn_nq));
  assert_true(p->build);
  assert_int_equal(p->modes, RA_MODE_BIT(RA_MODE_ROAR));
  assert_false(ra_index_param_find("index-per-kv-head")->build);
  assert_null(ra_index_param_find("ef"));
  assert_null(ra_index_param_find(NULL));
  rows = ra_search_param_rows(&n);
  assert_int_equal(n, 2);
  assert_ptr_equal(ra_search_param_find("nprobe"), &rows[1]);
  assert_int_equal(rows[1].offset, offsetof(ra_search_spec, nprobe));
}

static void test_param_parse(void **state) {
  (void)state;
  ra_index_spec s = {0};
  ra_error err;
  const ra_param *nq = ra_index_param_find("knn-nq");
  assert_int_equal(ra_param_parse(nq, "200", &s, &err), RA_OK);
  assert_int_equal(s.knn_nq, 200);
  assert_true(ra_param_get(nq, &s) == 200.0);
  assert_int_equal(ra_param_parse(nq, "0", &s, &err), RA_OK);
  assert_int_equal(s.knn_nq, 0);
  assert_int_equal(ra_param_parse(nq, "1", &s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "--knn-nq '1' is not 0 (unset) or in [2, 65536]");
  assert_int_equal(ra_param_parse(nq, "-3", &s, &err), RA_EINVAL);
  assert_int_equal(ra_param_parse(nq, "12x", &s, &err), RA_EINVAL);
  assert_int_equal(ra_param_parse(nq, "", &s, &err), RA_EINVAL);
  assert_int_equal(s.knn_nq, 0);
  const ra_param *qs = ra_index_param_find("query-sample");
  assert_int_equal(ra_param_parse(qs, "0.5", &s, &err), RA_OK);
  assert_true(s.query_sample == 0.5f);
  assert_int_equal(ra_param_parse(qs, "1.5", &s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "--query-sample '1.5' is not 0 (unset) or in (0, 1]");
  assert_int_equal(ra_param_parse(qs, "nan", &s, &err), RA_EINVAL);
  const ra_param *seed = ra_index_param_find("index-seed");
  assert_int_equal(ra_param_parse(seed, "18446744073709551615", &s, &err), RA_OK);
  assert_true(s.seed == UINT64_MAX);
  const ra_param *per = ra_index_param_find("index-per-kv-head");
  assert_int_equal(ra_param_parse(per, "1", &s, &err), RA_OK);
  assert_int_equal(s.per_kv_head, 1);
  assert_int_equal(ra_param_parse(per, "2", &s, &err), RA_EINVAL);
  ra_search_spec sp = {0};
  assert_int_equal(ra_param_parse(ra_search_param_find("ef"), "320", &sp, &err), RA_OK);
  assert_int_equal(sp.ef, 320);
  assert_int_equal(sp.nprobe, 0);
}

static void test_spec_check(void **state) {
  (void)state;
  ra_error err;
  ra_index_spec s = {0};
  assert_int_equal(ra_index_spec_check(&s, &err), RA_OK); /* every field unset */
  s.kind = RA_MODE_FLAT;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "index kind flat: mode flat scans every key, it has no index");
  s.kind = RA_MODE_STREAMING;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "index kind streaming has no index");
  s.kind = RA_MODE_ROAR;
  s.degree = 1024;
  s.keep_topk = 2;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_OK);
  s.degree = 1025;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "index degree 1025 out of range [2, 1024]");
  s.degree = 0;
  s.query_sample = NAN;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "index query_sample nan not in (0, 1]");
  s.query_sample = -0.5f;
  assert_int_equal(ra_index_spec_check(&s, &err), RA_EINVAL);
  s.query_sample = 0;
  ra_search_spec sp = {.ef = 65536, .nprobe = 0};
  assert_int_equal(ra_search_spec_check(&sp, &err), RA_OK);
  sp.nprobe = 65537;
  assert_int_equal(ra_search_spec_check(&sp, &err), RA_EINVAL);
  assert_string_equal(err.msg, "search nprobe 65537 out of range [1, 65536]");
}

static void test_spec_check_resolved(void **state) {
  (void)state;
  ra_error err;
  /* Resolved: the rows the kind uses must hold values; 0 only where it means auto / none. */
  ra_index_spec s = {.kind = RA_MODE_ROAR, .degree = 16, .build_ef = 128, .knn_nq = 100,
                     .query_sample = 1.0f};
  assert_int_equal(ra_index_spec_check_resolved(&s, &err), RA_OK); /* pivots, keep_*: 0 ok */
  s.degree = 0;
  assert_int_equal(ra_index_spec_check_resolved(&s, &err), RA_EINVAL);
  assert_string_equal(err.msg, "index: degree 0 out of range [2, 1024]");
  /* ivf uses neither degree nor knn_nq */
  s.kind = RA_MODE_IVF;
  s.knn_nq = 0;
  assert_int_equal(ra_index_spec_check_resolved(&s, &err), RA_OK);
  s.n_lists = 65537;
  assert_int_equal(ra_index_spec_check_resolved(&s, &err), RA_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mode_names_round_trip), cmocka_unit_test(test_mode_list),
      cmocka_unit_test(test_mode_properties),       cmocka_unit_test(test_param_rows),
      cmocka_unit_test(test_param_parse),           cmocka_unit_test(test_spec_check),
      cmocka_unit_test(test_spec_check_resolved),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
