/* The accuracy suite's task generators (bench/accuracy/tasks.h) with SmolLM2's tokenizer:
 * determinism under a seed, prompt length within tolerance of the target, the needle at the
 * requested depth, the expected values present exactly as often as the construction puts them,
 * the chat template and answer prefix, scoring, and refused input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <ctype.h>
#include <math.h>

#include "../gpu-worker/model_path.h"
#include "tasks.h"

static ra_tokenizer *tok;
static ra_acc_corpus corpus;

static int setup(void **state) {
  const char *path = smollm2_path();
  if (!path) return -1;
  ra_gguf g;
  ra_error err;
  if (ra_gguf_open(path, &g, &err) != RA_OK) return -1;
  int rc = ra_tok_load_gguf(&g, &tok, &err);
  ra_gguf_close(&g);
  if (rc == RA_OK) rc = ra_acc_corpus_load("/usr/share/common-licenses", &corpus, &err);
  if (rc != RA_OK) fprintf(stderr, "FAIL: %s\n", err.msg);
  return rc;
}

static int teardown(void **state) {
  ra_acc_corpus_free(&corpus);
  ra_tok_free(tok);
  return 0;
}

static void gen(ra_acc_task t, int len, double depth, uint64_t seed, ra_acc_sample *s) {
  ra_error err;
  int rc = ra_acc_generate(tok, &corpus, t, len, depth, seed, s, &err);
  if (rc != RA_OK) fail_msg("%s: %s", ra_acc_task_name(t), err.msg);
}

/* Whole-word, case-sensitive occurrences of w in text. */
static int count_whole(const char *text, const char *w) {
  int c = 0;
  size_t n = strlen(w);
  for (const char *p = strstr(text, w); p; p = strstr(p + 1, w))
    if ((p == text || !isalnum((unsigned char)p[-1])) && !isalnum((unsigned char)p[n])) c++;
  return c;
}

static void test_deterministic_under_seed(void **state) {
  for (int t = 0; t < RA_ACC_N_TASKS; t++) {
    ra_acc_sample a, b, c;
    gen((ra_acc_task)t, 600, 0.5, 42, &a);
    gen((ra_acc_task)t, 600, 0.5, 42, &b);
    gen((ra_acc_task)t, 600, 0.5, 43, &c);
    assert_string_equal(a.text, b.text);
    assert_int_equal(a.n_tokens, b.n_tokens);
    assert_memory_equal(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t));
    assert_string_not_equal(a.text, c.text);
    ra_acc_sample_free(&a);
    ra_acc_sample_free(&b);
    ra_acc_sample_free(&c);
  }
}

static void test_length_within_tolerance(void **state) {
  static const int lens[] = {512, 2048};
  for (int t = 0; t < RA_ACC_N_TASKS; t++)
    for (int i = 0; i < 2; i++) {
      ra_acc_sample s;
      gen((ra_acc_task)t, lens[i], 0.3, 7, &s);
      /* at most the target, short of it by less than one haystack unit (a JSON pair is ~55) */
      if ((int)s.n_tokens > lens[i] || (int)s.n_tokens < lens[i] - 64)
        fail_msg("%s at %d: %zu tokens", ra_acc_task_name((ra_acc_task)t), lens[i], s.n_tokens);
      assert_true(s.hay_begin > 0 && s.hay_begin < s.hay_end && s.hay_end < (int64_t)s.n_tokens);
      ra_acc_sample_free(&s);
    }
}

static void test_needle_at_requested_depth(void **state) {
  static const ra_acc_task tasks[] = {RA_ACC_NIAH_SINGLE_NUMBER, RA_ACC_NIAH_SINGLE_UUID, RA_ACC_NIAH_MULTIKEY,
                                      RA_ACC_PASSKEY, RA_ACC_KV_RETRIEVAL};
  static const double depths[] = {0, 0.25, 0.5, 0.75, 1};
  for (size_t t = 0; t < sizeof tasks / sizeof tasks[0]; t++)
    for (int d = 0; d < 5; d++) {
      ra_acc_sample s;
      gen(tasks[t], 2048, depths[d], 11, &s);
      assert_non_null(s.needle);
      /* the needle's own tokens are part of the haystack span: compare with the span without them */
      int32_t *ids;
      size_t nn;
      assert_int_equal(ra_tok_encode(tok, s.needle, strlen(s.needle), 0, 0, &ids, &nn, NULL), RA_OK);
      free(ids);
      double rel = (double)(s.needle_token - s.hay_begin) / (double)(s.hay_end - s.hay_begin - (int64_t)nn);
      if (fabs(rel - depths[d]) > 0.03)
        fail_msg("%s depth %.2f: needle at %.3f of the haystack", ra_acc_task_name(tasks[t]), depths[d], rel);
      ra_acc_sample_free(&s);
    }
}

static void test_values_present_as_constructed(void **state) {
  for (int t = 0; t < RA_ACC_N_TASKS; t++) {
    ra_acc_sample s;
    gen((ra_acc_task)t, 1024, 0.6, 5, &s);
    assert_true(s.n_values >= 1);
    assert_true(s.answer_tokens > 4);
    /* the prompt ends where the answer starts: after the assistant turn's opening */
    assert_non_null(strstr(s.text, "<|im_start|>assistant\n"));
    for (int i = 0; i < s.n_values; i++) {
      int c = count_whole(s.text, s.values[i]);
      switch ((ra_acc_task)t) {
        case RA_ACC_PASSKEY: assert_int_equal(c, 2); break; /* "The pass key is V. ... V is the pass key." */
        case RA_ACC_VARIABLE_TRACKING: assert_int_equal(c, i < 4 ? 2 : 1); break; /* assigned, then read */
        case RA_ACC_COMMON_WORDS: assert_true(c >= 6); break; /* 6 repetitions at 1K */
        default:
          if (c != 1) fail_msg("%s: value %s present %d times", ra_acc_task_name((ra_acc_task)t), s.values[i], c);
      }
    }
    if (s.needle) assert_int_equal(count_whole(s.text, s.needle), 1);
    ra_acc_sample_free(&s);
  }
}

static void test_multi_needle_tasks_ask_what_they_should(void **state) {
  ra_acc_sample s;
  gen(RA_ACC_NIAH_MULTIVALUE, 1024, 0.5, 3, &s);
  assert_int_equal(s.n_values, 4);
  ra_acc_sample_free(&s);
  gen(RA_ACC_NIAH_MULTIQUERY, 1024, 0.5, 3, &s);
  assert_int_equal(s.n_values, 2);
  ra_acc_sample_free(&s);
  gen(RA_ACC_NIAH_MULTIKEY, 1024, 0.5, 3, &s);
  assert_int_equal(s.n_values, 1);
  assert_int_equal(count_whole(s.text, "One of the special magic numbers for"), 4); /* 3 distractors */
  ra_acc_sample_free(&s);
}

static void test_score_exact_match(void **state) {
  ra_acc_sample s;
  gen(RA_ACC_NIAH_MULTIVALUE, 1024, 0.5, 9, &s);
  char out[512];
  snprintf(out, sizeof out, " %s, %s, %s and %s.", s.values[0], s.values[1], s.values[2], s.values[3]);
  assert_true(ra_acc_score(&s, out) == 1.0);
  snprintf(out, sizeof out, " %s and %s", s.values[2], s.values[0]);
  assert_true(ra_acc_score(&s, out) == 0.5);
  snprintf(out, sizeof out, " %s7", s.values[0]); /* a longer number is not the value */
  assert_true(ra_acc_score(&s, out) == 0.0);
  assert_true(ra_acc_score(&s, "") == 0.0);
  ra_acc_sample_free(&s);
  gen(RA_ACC_NIAH_SINGLE_UUID, 1024, 0.5, 9, &s);
  for (char *p = s.values[0]; *p; p++) out[p - s.values[0]] = (char)toupper((unsigned char)*p);
  out[strlen(s.values[0])] = 0;
  assert_true(ra_acc_score(&s, out) == 1.0); /* case does not matter */
  ra_acc_sample_free(&s);
}

static void test_longgen_plants_every_item_once_and_asks_them_in_order(void **state) {
  static const int lens[] = {1024, 2048, 8192};
  for (int li = 0; li < 3; li++) {
    ra_acc_sample s;
    gen(RA_ACC_LONGGEN_NEEDLES, lens[li], 0.5, 21, &s);
    int k = ra_acc_longgen_items(lens[li]);
    assert_int_equal(s.n_values, k);
    assert_true(s.sequential);
    assert_int_equal(s.needle_token, -1); /* no single target depth */
    for (int i = 0; i < k; i++) {
      char needle[64];
      snprintf(needle, sizeof needle, "The code of item %d is %s.", i + 1, s.values[i]);
      if (count_whole(s.text, needle) != 1) fail_msg("item %d at %d: \"%s\" not once", i + 1, lens[li], needle);
      for (int j = 0; j < i; j++) assert_string_not_equal(s.values[i], s.values[j]);
    }
    char q[64];
    snprintf(q, sizeof q, "and so on up to item %d,", k);
    assert_non_null(strstr(s.text, q));
    /* the answer prefix opens answer 0; the decode budget covers k labelled 7-digit codes */
    assert_non_null(strstr(s.text, "<|im_start|>assistant\nItem 1:"));
    assert_true(s.answer_tokens >= k * 10);
    ra_acc_sample_free(&s);
  }
  assert_int_equal(ra_acc_longgen_items(256), 4);
  assert_int_equal(ra_acc_longgen_items(2048), 8);
  assert_int_equal(ra_acc_longgen_items(1 << 20), RA_ACC_MAX_VALUES);
}

static void test_sequential_answers_scored_each_in_its_segment(void **state) {
  ra_acc_sample s;
  gen(RA_ACC_LONGGEN_NEEDLES, 1024, 0.5, 4, &s);
  assert_int_equal(s.n_values, 4);
  const char *const *v = (const char *const *)s.values;
  char out[512];
  int hit[RA_ACC_MAX_VALUES];
  /* all right, in the model's own wording of the labels */
  snprintf(out, sizeof out, " %s\nThe code of item 2 is %s.\nitem 3: %s\nITEM 4: %s", v[0], v[1], v[2], v[3]);
  assert_int_equal(ra_acc_score_items(&s, out, hit), 4);
  assert_true(ra_acc_score(&s, out) == 1.0);
  /* answers 2 and 3 swapped: every value is in the output, only 1 and 4 are right */
  snprintf(out, sizeof out, " %s\nItem 2: %s\nItem 3: %s\nItem 4: %s", v[0], v[2], v[1], v[3]);
  assert_int_equal(ra_acc_score_items(&s, out, hit), 2);
  assert_int_equal(hit[0], 1);
  assert_int_equal(hit[1], 0);
  assert_int_equal(hit[2], 0);
  assert_int_equal(hit[3], 1);
  assert_true(ra_acc_score(&s, out) == 0.5);
  /* the generation stops writing labels after item 2: the rest is unanswered, even if the codes follow */
  snprintf(out, sizeof out, " %s\nItem 2: %s %s %s", v[0], v[1], v[2], v[3]);
  assert_int_equal(ra_acc_score_items(&s, out, hit), 2);
  assert_int_equal(hit[2] + hit[3], 0);
  /* "Item 10" is not the label of item 1; a longer number is not the code */
  snprintf(out, sizeof out, " %s7\nItem 2: %s\nItem 30: %s", v[0], v[1], v[2]);
  assert_int_equal(ra_acc_score_items(&s, out, hit), 1);
  assert_int_equal(hit[1], 1);
  assert_int_equal(ra_acc_score_items(&s, "", hit), 0);
  ra_acc_sample_free(&s);
  /* a non-sequential sample: each value anywhere */
  gen(RA_ACC_NIAH_MULTIVALUE, 1024, 0.5, 9, &s);
  snprintf(out, sizeof out, " %s and %s", s.values[3], s.values[1]);
  assert_int_equal(ra_acc_score_items(&s, out, hit), 2);
  assert_int_equal(hit[1] + hit[3], 2);
  ra_acc_sample_free(&s);
}

static void test_refuses_bad_input(void **state) {
  ra_acc_sample s;
  ra_error err;
  assert_int_equal(ra_acc_generate(tok, &corpus, RA_ACC_PASSKEY, 100, 0.5, 1, &s, &err), RA_EINVAL);
  assert_int_equal(ra_acc_generate(tok, &corpus, RA_ACC_PASSKEY, 1024, 1.5, 1, &s, &err), RA_EINVAL);
  assert_int_equal(ra_acc_generate(tok, &corpus, RA_ACC_N_TASKS, 1024, 0.5, 1, &s, &err), RA_EINVAL);
  ra_acc_task t;
  assert_int_equal(ra_acc_task_parse("passkey", &t), RA_OK);
  assert_int_equal(t, RA_ACC_PASSKEY);
  assert_int_equal(ra_acc_task_parse("nope", &t), RA_EINVAL);
  ra_acc_corpus c;
  assert_int_equal(ra_acc_corpus_load("/nonexistent", &c, &err), RA_ENOTFOUND);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deterministic_under_seed),      cmocka_unit_test(test_length_within_tolerance),
      cmocka_unit_test(test_needle_at_requested_depth),     cmocka_unit_test(test_values_present_as_constructed),
      cmocka_unit_test(test_multi_needle_tasks_ask_what_they_should), cmocka_unit_test(test_score_exact_match),
      cmocka_unit_test(test_longgen_plants_every_item_once_and_asks_them_in_order),
      cmocka_unit_test(test_sequential_answers_scored_each_in_its_segment),
      cmocka_unit_test(test_refuses_bad_input),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
