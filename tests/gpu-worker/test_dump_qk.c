/* dump-qk on a tiny random model: files, shapes and meta.json; prompt dumps do not depend on the
 * decode count (queries, keys and values); the query dumped for decode token 0 equals that token's query when it is part
 * of the prompt; keys are the post-RoPE cache rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dump_qk.h"
#include "json.h"
#include "npy.h"

static ra_backend *be;
static ra_model *m;

static int setup(void **state) {
  (void)state;
  ra_backend_config bc = {2, 0};
  ra_model_config c;
  if (ra_backend_create("cpu", &bc, &be, NULL) || ra_model_config_preset("tiny", &c, NULL)) return -1;
  return ra_model_random(be, &c, 3, &m, NULL);
}

static int teardown(void **state) {
  (void)state;
  ra_model_free(m);
  ra_backend_destroy(be);
  return 0;
}

static const int32_t prompt[12] = {4, 8, 15, 16, 23, 42, 7, 1, 90, 33, 2, 61};

static void dump(const char *dir, const int32_t *p, size_t n, int n_decode, const uint8_t *layers) {
  ra_state *st;
  ra_error err;
  assert_int_equal(ra_state_new(m, (int64_t)n + n_decode, 5, RA_DTYPE_F32, &st, &err), RA_OK);
  ra_dump_config cfg = {dir, n_decode, layers, RA_DTYPE_F32, "tiny"};
  if (ra_dump_qk(st, p, n, &cfg, &err) != RA_OK) fail_msg("%s", err.msg);
  ra_state_free(st);
}

static ra_npy load(const char *dir, const char *name, int l, int h) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s_L%d_H%d.npy", dir, name, l, h);
  ra_npy a;
  ra_error err;
  if (ra_npy_read_f32(path, &a, &err) != RA_OK) fail_msg("%s", err.msg);
  return a;
}

static void rm_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_dump_consistency(void **state) {
  (void)state;
  char d0[] = "/tmp/ra_dump0_XXXXXX", d3[] = "/tmp/ra_dump3_XXXXXX", dp[] = "/tmp/ra_dumpp_XXXXXX";
  assert_non_null(mkdtemp(d0));
  assert_non_null(mkdtemp(d3));
  assert_non_null(mkdtemp(dp));
  const int hd = m->cfg.head_dim;
  dump(d0, prompt, 12, 0, NULL);
  dump(d3, prompt, 12, 3, NULL);
  /* meta.json */
  char path[512];
  snprintf(path, sizeof path, "%s/meta.json", d3);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char buf[4096];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  ra_json *meta;
  assert_int_equal(ra_json_parse(buf, len, &meta, NULL), RA_OK);
  double v;
  int rope;
  assert_int_equal(ra_json_get_num(meta, "n_tokens", &v), RA_OK);
  assert_true(v == 15);
  assert_int_equal(ra_json_get_num(meta, "q_heads", &v), RA_OK);
  assert_true(v == m->cfg.n_heads);
  assert_int_equal(ra_json_get_bool(meta, "rope_applied", &rope), RA_OK);
  assert_true(rope);
  const ra_json *dec = ra_json_get(meta, "decode_tokens");
  assert_non_null(dec);
  assert_int_equal(dec->n, 3);
  int32_t first = (int32_t)dec->items[0].num;
  ra_json_free(meta);
  for (int l = 0; l < m->cfg.n_layers; l++)
    for (int h = 0; h < m->cfg.n_heads; h++) {
      ra_npy a = load(d0, "q", l, h), b = load(d3, "q", l, h), qd = load(d3, "qdec", l, h);
      assert_int_equal(a.rows, 12);
      assert_int_equal(a.cols, hd);
      assert_int_equal(qd.rows, 3);
      assert_memory_equal(a.data, b.data, a.rows * a.cols * sizeof(float));
      ra_npy_free(&a), ra_npy_free(&b), ra_npy_free(&qd);
    }
  /* prompt + the first generated token as a 13-token prompt: its last q row is qdec row 0 */
  int32_t p13[13];
  memcpy(p13, prompt, sizeof prompt);
  p13[12] = first;
  uint8_t only1[2] = {0, 1};
  dump(dp, p13, 13, 0, only1);
  snprintf(path, sizeof path, "%s/q_L0_H0.npy", dp);
  assert_int_equal(access(path, F_OK), -1); /* layer 0 not selected */
  for (int h = 0; h < m->cfg.n_heads; h++) {
    ra_npy q = load(dp, "q", 1, h), qd = load(d3, "qdec", 1, h);
    const float *qv = q.data, *qdv = qd.data;
    for (int d = 0; d < hd; d++) assert_true(fabsf(qv[12 * hd + d] - qdv[d]) < 1e-4f);
    ra_npy_free(&q), ra_npy_free(&qd);
  }
  for (int g = 0; g < m->cfg.n_kv_heads; g++)
    for (int w = 0; w < 2; w++) { /* keys, then values: the prompt's rows equal with or without decode */
      const char *name = w ? "v" : "k";
      ra_npy k = load(dp, name, 1, g), k3 = load(d3, name, 1, g);
      assert_int_equal(k3.rows, 15);
      assert_int_equal(k3.cols, hd);
      const float *kv = k.data, *k3v = k3.data;
      for (int i = 0; i < 13 * hd; i++) assert_true(fabsf(kv[i] - k3v[i]) < 1e-4f);
      ra_npy_free(&k), ra_npy_free(&k3);
    }
  rm_dir(d0);
  rm_dir(d3);
  rm_dir(dp);
}

static void test_parse_layers(void **state) {
  (void)state;
  uint8_t f[8];
  ra_error err;
  assert_int_equal(ra_dump_parse_layers("0,2,5-7", 8, f, &err), RA_OK);
  uint8_t want[8] = {1, 0, 1, 0, 0, 1, 1, 1};
  assert_memory_equal(f, want, 8);
  assert_int_equal(ra_dump_parse_layers("3-9", 8, f, &err), RA_EINVAL);
  assert_int_equal(ra_dump_parse_layers("x", 8, f, &err), RA_EINVAL);
  assert_int_equal(ra_dump_parse_layers("2-1", 8, f, &err), RA_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dump_consistency),
      cmocka_unit_test(test_parse_layers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
