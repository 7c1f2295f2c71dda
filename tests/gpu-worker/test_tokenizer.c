/* Tokenizer: SmolLM2's byte-level BPE (ids cross-checked against Hugging Face `tokenizers` by
 * ref_smollm2.py), round trips, specials, chat template; and a synthetic SentencePiece vocab. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf_build.h"
#include "model_path.h"
#include "tokenizer.h"

static ra_tokenizer *smol;

static int setup(void **state) {
  (void)state;
  const char *path = smollm2_path();
  if (!path) return -1;
  ra_gguf g;
  ra_error err;
  if (ra_gguf_open(path, &g, &err) != RA_OK) return -1;
  int rc = ra_tok_load_gguf(&g, &smol, &err);
  ra_gguf_close(&g);
  return rc;
}

static int teardown(void **state) {
  (void)state;
  ra_tok_free(smol);
  return 0;
}

static void expect_ids(const ra_tokenizer *t, const char *text, int special, const int32_t *want, size_t n) {
  int32_t *ids;
  size_t k;
  assert_int_equal(ra_tok_encode(t, text, strlen(text), 0, special, &ids, &k, NULL), RA_OK);
  if (k != n || memcmp(ids, want, n * sizeof(int32_t)) != 0) {
    for (size_t i = 0; i < k; i++) fprintf(stderr, "%d ", ids[i]);
    fail_msg("unexpected ids for '%s'", text);
  }
  free(ids);
}

static void roundtrip(const ra_tokenizer *t, const char *text) {
  int32_t *ids;
  size_t k, len;
  char *back;
  assert_int_equal(ra_tok_encode(t, text, strlen(text), 0, 0, &ids, &k, NULL), RA_OK);
  assert_int_equal(ra_tok_decode(t, ids, k, &back, &len, NULL), RA_OK);
  if (len != strlen(text) || memcmp(back, text, len) != 0) fail_msg("round trip of '%s' gave '%s'", text, back);
  free(ids);
  free(back);
}

static void test_smollm2_known_ids(void **state) {
  (void)state;
  expect_ids(smol, "Hello world", 0, (int32_t[]){19556, 905}, 2);
  /* digits are split one by one (SmolLM's pre-tokenizer) */
  expect_ids(smol, "It's 2024!", 0, (int32_t[]){1589, 506, 216, 34, 32, 34, 36, 17}, 8);
  expect_ids(smol, "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", 0,
             (int32_t[]){3546, 46494, 37366, 17097, 241, 115, 40993}, 7);
  expect_ids(smol, "<|im_start|>user", 1, (int32_t[]){1, 4093}, 2);
  assert_int_equal(ra_tok_vocab(smol), 49152);
  assert_int_equal(ra_tok_eos(smol), 2);
  assert_true(ra_tok_is_stop(smol, 2));
  assert_false(ra_tok_is_stop(smol, 1));
  assert_false(ra_tok_add_bos(smol));
}

static void test_smollm2_roundtrips(void **state) {
  (void)state;
  roundtrip(smol, "The quick brown fox jumps over the lazy dog.");
  roundtrip(smol, "  two leading, three trailing   ");
  roundtrip(smol, "tabs\tand\nnewlines\n\n\r\n \t mixed \xc2\xa0nbsp");
  roundtrip(smol, "UTF-8: \xc3\xbc\xc3\xb6\xc3\xa4 \xce\xb1\xce\xb2\xce\xb3 \xd1\x80\xd1\x83\xd1\x81 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82\xf0\x9f\x9a\x80");
  roundtrip(smol, "x\x80 stray bytes \xc3 end \xe6\x97");
  /* a byte with no token (never in UTF-8) becomes <unk> (id 0) */
  expect_ids(smol, "\xff", 0, (int32_t[]){0}, 1);
  roundtrip(smol, "<|im_start|> as plain text");
  roundtrip(smol, "");
}

static void test_smollm2_chat_template(void **state) {
  (void)state;
  char *s;
  assert_int_equal(ra_tok_chat_format(smol, NULL, "Hi", &s, NULL), RA_OK);
  assert_string_equal(s,
                      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  free(s);
  assert_int_equal(ra_tok_chat_format(smol, "Be brief.", "Hi", &s, NULL), RA_OK);
  assert_non_null(strstr(s, "<|im_start|>system\nBe brief.<|im_end|>\n"));
  free(s);
  /* a second turn: the first answer inside, the default system prompt first */
  ra_chat_msg conv[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  assert_int_equal(ra_tok_chat_format_messages(smol, conv, 3, &s, NULL), RA_OK);
  assert_string_equal(s,
                      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                      "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  free(s);
  ra_error err;
  assert_int_equal(ra_tok_chat_format_messages(smol, conv, 0, &s, &err), RA_EINVAL);
}

/* A SentencePiece-style vocab: <unk>, <s>, </s>, byte tokens, and merges by score. */
static ra_tokenizer *spm_tokenizer(void) {
  const char *toks[3 + 256 + 7];
  int32_t types[3 + 256 + 7];
  float scores[3 + 256 + 7];
  static char bytes[256][8];
  int n = 0;
  toks[n] = "<unk>", types[n] = 2, scores[n++] = 0;
  toks[n] = "<s>", types[n] = 3, scores[n++] = 0;
  toks[n] = "</s>", types[n] = 3, scores[n++] = 0;
  for (int b = 0; b < 256; b++) {
    snprintf(bytes[b], 8, "<0x%02X>", b);
    toks[n] = bytes[b], types[n] = 6, scores[n++] = 0;
  }
  const char *pieces[] = {"\xe2\x96\x81", "h", "e", "he", "\xe2\x96\x81he", "llo", "ll"};
  float ps[] = {-5, -6, -6, -2, -1, -3, -4};
  for (int i = 0; i < 7; i++) toks[n] = pieces[i], types[n] = 1, scores[n++] = ps[i];
  gb b = {0};
  gb_str(&b, "tokenizer.ggml.model", "llama");
  gb_strs(&b, "tokenizer.ggml.tokens", toks, (size_t)n);
  gb_f32s(&b, "tokenizer.ggml.scores", scores, (size_t)n);
  gb_i32s(&b, "tokenizer.ggml.token_type", types, (size_t)n);
  gb_u32(&b, "tokenizer.ggml.bos_token_id", 1);
  gb_u32(&b, "tokenizer.ggml.eos_token_id", 2);
  gb_u32(&b, "tokenizer.ggml.unknown_token_id", 0);
  size_t len;
  uint8_t *f = gb_finish(&b, &len);
  ra_gguf g;
  ra_tokenizer *t;
  ra_error err;
  assert_int_equal(ra_gguf_parse(f, len, &g, &err), RA_OK);
  if (ra_tok_load_gguf(&g, &t, &err) != RA_OK) fail_msg("%s", err.msg);
  ra_gguf_close(&g);
  free(f);
  return t;
}

static void test_sentencepiece_style(void **state) {
  (void)state;
  ra_tokenizer *t = spm_tokenizer();
  assert_int_equal(ra_tok_kind(t), RA_TOK_SPM);
  assert_true(ra_tok_add_bos(t));
  int32_t *ids;
  size_t k;
  /* " he" wins (score -1) over "he" (-2); "ll" then "llo" merge; "!" falls back to its byte */
  assert_int_equal(ra_tok_encode(t, "hello!", 6, 1, 0, &ids, &k, NULL), RA_OK);
  int32_t base = 3 + 256;
  int32_t want[] = {1, base + 4, base + 5, 3 + '!'};
  assert_int_equal(k, 4);
  assert_memory_equal(ids, want, sizeof want);
  char *s;
  size_t len;
  assert_int_equal(ra_tok_decode(t, ids, k, &s, &len, NULL), RA_OK);
  assert_string_equal(s, "hello!");
  free(s);
  free(ids);
  roundtrip(t, "hello he h\xc3\xa9 \xf0\x9f\x99\x82");
  ra_tok_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_smollm2_known_ids),
      cmocka_unit_test(test_smollm2_roundtrips),
      cmocka_unit_test(test_smollm2_chat_template),
      cmocka_unit_test(test_sentencepiece_style),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
