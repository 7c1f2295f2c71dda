/* Greedy generation on SmolLM2: the answer to a fixed chat prompt starts with known tokens; a
 * model whose output is wider than its tokenizer only emits ids the tokenizer can decode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "generate.h"
#include "loader.h"
#include "model_path.h"

static void test_greedy_first_tokens(void **state) {
  (void)state;
  const char *path = smollm2_path();
  if (!path) fail_msg("model missing: run deploy/fetch-model.sh");
  ra_backend *be;
  ra_model *m;
  ra_tokenizer *tok;
  ra_error err;
  ra_backend_config bc = {2, 0};
  assert_int_equal(ra_backend_create("cpu", &bc, &be, &err), RA_OK);
  if (ra_load_model(be, path, NULL, 1, &m, &tok, &err) != RA_OK) fail_msg("%s", err.msg);
  char *chat;
  assert_int_equal(ra_tok_chat_format(tok, NULL, "What is the capital of France?", &chat, &err), RA_OK);
  int32_t *ids;
  size_t n;
  assert_int_equal(ra_tok_encode(tok, chat, strlen(chat), 0, 1, &ids, &n, &err), RA_OK);
  ra_state *st;
  assert_int_equal(ra_state_new(m, (int64_t)n + 16, 32, RA_DTYPE_F32, &st, &err), RA_OK);
  ra_gen_config gc = {.max_new_tokens = 16, .top_p = 1.0f, .top_k = 1, .seed = 1, .stop_at_eos = 1};
  ra_gen_result res;
  if (ra_generate(st, tok, ids, n, &gc, NULL, NULL, &res, &err) != RA_OK) fail_msg("%s", err.msg);
  char *text;
  size_t len;
  assert_int_equal(ra_tok_decode(tok, res.tokens, res.n_tokens, &text, &len, &err), RA_OK);
  fprintf(stderr, "generated: '%s' (%zu tokens, stop token: %d)\n", text, res.n_tokens, res.stopped);
  /* "The capital of France is Paris." then <|im_end|> */
  int32_t want[] = {504, 3575, 282, 4649, 314, 7042, 30};
  assert_true(res.n_tokens >= 7);
  assert_memory_equal(res.tokens, want, sizeof want);
  assert_string_equal(text, "The capital of France is Paris.");
  assert_true(res.stopped);
  /* a wall time per decode step, together within the decode's */
  double sum = 0;
  for (size_t i = 0; i < res.n_decode_steps; i++) {
    assert_true(res.step_s[i] > 0);
    sum += res.step_s[i];
  }
  assert_true(res.n_decode_steps >= 6 && sum <= res.decode_s);
  free(text);
  ra_gen_result_free(&res);
  ra_state_free(st);
  free(ids);
  free(chat);
  ra_tok_free(tok);
  ra_model_free(m);
  ra_backend_destroy(be);
}

/* A random model (vocabulary 60000) with SmolLM2's tokenizer (49152), as the benchmarks run
 * Llama-3-8B geometry: ~18 % of its argmaxes would lie past the tokenizer, and the text (and
 * the JSON of `generate`) could not be written after the whole run. */
static void test_ids_stay_inside_the_tokenizer(void **state) {
  (void)state;
  const char *path = smollm2_path();
  if (!path) fail_msg("model missing: run deploy/fetch-model.sh");
  ra_backend *be;
  ra_model *m;
  ra_tokenizer *tok;
  ra_error err;
  ra_backend_config bc = {2, 0};
  assert_int_equal(ra_backend_create("cpu", &bc, &be, &err), RA_OK);
  ra_gguf g;
  if (ra_gguf_open(path, &g, &err) != RA_OK || ra_tok_load_gguf(&g, &tok, &err) != RA_OK) fail_msg("%s", err.msg);
  ra_gguf_close(&g);
  ra_model_config c;
  assert_int_equal(ra_model_config_preset("tiny", &c, &err), RA_OK);
  c.vocab = 60000;
  assert_int_equal(ra_model_random(be, &c, 7, &m, &err), RA_OK);
  int32_t prompt[] = {1, 2, 3, 4};
  ra_state *st;
  assert_int_equal(ra_state_new(m, 4 + 48, 8, RA_DTYPE_F32, &st, &err), RA_OK);
  ra_gen_config gc = {.max_new_tokens = 48, .top_p = 1.0f, .top_k = 1, .seed = 1};
  ra_gen_result res;
  if (ra_generate(st, tok, prompt, 4, &gc, NULL, NULL, &res, &err) != RA_OK) fail_msg("%s", err.msg);
  assert_int_equal(res.n_tokens, 48);
  for (size_t i = 0; i < res.n_tokens; i++) assert_true(res.tokens[i] >= 0 && res.tokens[i] < ra_tok_vocab(tok));
  char *text;
  size_t len;
  assert_int_equal(ra_tok_decode(tok, res.tokens, res.n_tokens, &text, &len, &err), RA_OK);
  free(text);
  ra_gen_result_free(&res);
  ra_state_free(st);
  ra_tok_free(tok);
  ra_model_free(m);
  ra_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_greedy_first_tokens),
                                     cmocka_unit_test(test_ids_stay_inside_the_tokenizer)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
