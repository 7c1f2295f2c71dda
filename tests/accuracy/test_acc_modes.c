/* The accuracy runner's mode entries (bench/accuracy/runner.h): NAME and NAME+retroW parse to a
 * mode and its retro window and print back as the same label; the config check refuses full
 * with retro or not first, retro on a mode without retrieval, an entry given twice, and store
 * modes without stores. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "runner.h"

static void test_entries_parse_and_print_back(void **state) {
  static const char *const ok[] = {"full", "flat", "flat+retro2", "roar+retro16", "wave", "ivf+retro1", "wave+retro2"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ra_mode m;
    uint32_t w = 99;
    assert_int_equal(ra_acc_mode_parse(ok[i], &m, &w), RA_OK);
    char label[RA_ACC_LABEL_MAX];
    assert_string_equal(ra_acc_mode_label(m, w, label), ok[i]);
  }
  ra_mode m;
  uint32_t w;
  assert_int_equal(ra_acc_mode_parse("roar+retro2", &m, &w), RA_OK);
  assert_int_equal(m, RA_MODE_ROAR);
  assert_int_equal(w, 2);
  assert_int_equal(ra_acc_mode_parse("flat", &m, &w), RA_OK);
  assert_int_equal(w, 0);
  static const char *const bad[] = {"flat+retro", "flat+retro0", "flat+retro17", "flat+retro2x", "flat+retro-1",
                                    "nope+retro2", "flat+retro 2", "+retro2", "averyveryveryverylongmodename+retro2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (ra_acc_mode_parse(bad[i], &m, &w) != RA_EINVAL) fail_msg("accepted %s", bad[i]);
}

static int check(const char *csv, int with_plan, ra_error *err) {
  ra_acc_config cfg = {0};
  ra_offload_config_default(&cfg.off);
  ra_offload_plan plan = {.n_sink = cfg.off.n_sink, .n_window = cfg.off.n_window};
  cfg.plan = with_plan ? &plan : NULL;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", csv);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    assert_int_equal(ra_acc_mode_parse(t, &cfg.modes[cfg.n_modes], &cfg.retro[cfg.n_modes]), RA_OK);
    cfg.n_modes++;
  }
  return ra_acc_config_check(&cfg, err);
}

static void test_config_check(void **state) {
  ra_error err;
  assert_int_equal(check("full,flat,flat+retro2,flat+retro8,roar+retro2,wave,wave+retro2", 1, &err), RA_OK);
  assert_int_equal(check("full,streaming", 0, &err), RA_OK);
  assert_int_equal(check("flat,full", 1, &err), RA_EINVAL);
  assert_int_equal(check("full,flat+retro2,flat+retro2", 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "flat+retro2 given twice"));
  assert_int_equal(check("full,streaming+retro2", 1, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "no retrieval to correct"));
  assert_int_equal(check("full,flat+retro2", 0, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "needs kv-stores"));
  /* full carries no retro: it is the reference */
  ra_acc_config cfg = {0};
  cfg.modes[cfg.n_modes] = RA_MODE_FULL;
  cfg.retro[cfg.n_modes++] = 2;
  assert_int_equal(ra_acc_config_check(&cfg, &err), RA_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entries_parse_and_print_back),
      cmocka_unit_test(test_config_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
