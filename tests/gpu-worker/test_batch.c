/* ra_batch_forward: sequences batched together (decode tokens of some beside prefill chunks of
 * others) get the logits each gets from ra_model_forward alone, and the same greedy tokens. */
#include "batch.h"
#include "cpu_fixture.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#define N_SEQ 3
#define N_CTX 48

static float max_abs_diff(const float *a, const float *b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
  return d;
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static void test_batch_matches_alone(void **state) {
  (void)state;
  ra_model_config cfg;
  assert_int_equal(ra_model_config_preset("tiny", &cfg, NULL), RA_OK);
  ra_model *m;
  assert_int_equal(ra_model_random(be, &cfg, 7, &m, NULL), RA_OK);
  int vocab = cfg.vocab;
  int32_t toks[N_SEQ][N_CTX];
  uint64_t s = 3;
  for (int i = 0; i < N_SEQ; i++)
    for (int j = 0; j < N_CTX; j++) toks[i][j] = (int32_t)((frand(&s) + 1.0f) * 0.5f * (float)(vocab - 1));
  /* alone: every prefix's last logits, through ra_model_forward token by token after a prompt */
  const int64_t n_prompt[N_SEQ] = {5, 9, 1};
  const int n_steps = 6;
  float *alone = malloc(sizeof(float) * N_SEQ * (size_t)(n_steps + 1) * (size_t)vocab);
  for (int i = 0; i < N_SEQ; i++) {
    ra_state *st;
    assert_int_equal(ra_state_new(m, N_CTX, N_CTX, RA_DTYPE_F32, &st, NULL), RA_OK);
    assert_int_equal(ra_model_forward(st, toks[i], n_prompt[i], 0, NULL, NULL), RA_OK);
    for (int t = 0; t <= n_steps; t++) {
      if (t) assert_int_equal(ra_model_forward(st, &toks[i][n_prompt[i] + t - 1], 1, 0, NULL, NULL), RA_OK);
      float *dst = alone + ((size_t)i * (size_t)(n_steps + 1) + (size_t)t) * (size_t)vocab;
      assert_int_equal(be->ops->download(be, &st->logits, 0, dst, (size_t)vocab, NULL), RA_OK);
    }
    ra_state_free(st);
  }
  /* batched: sequence 2 starts one step late (its prompt joins while the others decode) */
  ra_batch *b;
  assert_int_equal(ra_batch_new(m, 32, N_SEQ, &b, NULL), RA_OK);
  ra_state *st[N_SEQ];
  for (int i = 0; i < N_SEQ; i++) assert_int_equal(ra_state_new(m, N_CTX, 1, RA_DTYPE_F32, &st[i], NULL), RA_OK);
  int done[N_SEQ] = {0}; /* logits rows of each checked so far */
  float *row = malloc(sizeof(float) * N_SEQ * (size_t)vocab);
  for (int step = 0; step <= n_steps + 1; step++) {
    ra_batch_item items[N_SEQ];
    int idx[N_SEQ], n = 0;
    for (int i = 0; i < N_SEQ; i++) {
      if ((i == 2 && step == 0) || done[i] > n_steps) continue;
      int64_t pos = st[i]->pos;
      items[n] = (ra_batch_item){st[i], &toks[i][pos], pos == 0 ? n_prompt[i] : 1, NULL};
      idx[n++] = i;
    }
    if (!n) break;
    assert_int_equal(ra_batch_forward(b, items, n, NULL), RA_OK);
    assert_int_equal(be->ops->download(be, ra_batch_logits(b), 0, row, (size_t)n * (size_t)vocab, NULL), RA_OK);
    for (int j = 0; j < n; j++) {
      int i = idx[j];
      const float *ref = alone + ((size_t)i * (size_t)(n_steps + 1) + (size_t)done[i]) * (size_t)vocab;
      assert_true(max_abs_diff(ref, row + (size_t)j * (size_t)vocab, (size_t)vocab) < 1e-3f);
      assert_int_equal(argmax(ref, vocab), argmax(row + (size_t)j * (size_t)vocab, vocab));
      done[i]++;
    }
  }
  for (int i = 0; i < N_SEQ; i++) {
    assert_int_equal(done[i], n_steps + 1);
    assert_int_equal(st[i]->pos, n_prompt[i] + n_steps);
  }
  /* a step past a sequence's context is refused and moves nothing */
  st[0]->pos = N_CTX;
  ra_error err;
  ra_batch_item over = {st[0], toks[0], 1, NULL};
  assert_int_equal(ra_batch_forward(b, &over, 1, &err), RA_EINVAL);
  assert_int_equal(st[0]->pos, N_CTX);
  for (int i = 0; i < N_SEQ; i++) ra_state_free(st[i]);
  ra_batch_free(b);
  free(row);
  free(alone);
  ra_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_matches_alone)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
