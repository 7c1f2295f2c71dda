/* The distributed decode end to end, on SmolLM2-135M (CPU backend) and two real kv-store
 * processes, with most of the context in the stores (sink 32, window 64):
 *   - on a ~2K-token needle prompt, flat, roar and wave (default budgets) generate the same answer
 *     as full attention;
 *   - teacher-forced over 256 tokens of natural text, flat and roar pick the same next token as
 *     full attention at >= 99 % of positions (KL(full || mode) is printed);
 *   - flat with k >= the offloaded count is full attention: the same logits to rounding, which
 *     proves the partition of [0, n) and the merge;
 *   - teacher-forced, wave at its default budgets agrees with full attention at least as often as
 *     flat given as many exact keys per head as wave's stores scanned;
 *   - int8 stores (--store-dtype int8): the needle answers as with f16 in flat (k = 100 and k = all,
 *     i.e. full attention through the stores), roar and wave; teacher-forced, int8's top-1
 *     agreement with full attention is within 1 % of the positions of f16's, with every key
 *     attended (flat k = all) and in wave at its default budgets, and the stores hold about
 *     (head_dim + 4) / (2 head_dim) of f16's bytes per token (Stats);
 *   - a store killed mid-decode stops the step with an error naming it.
 * The tests run in parts (parts.h): needle, agreement, wave, int8, kill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#include "client.h"
#include "generate.h"
#include "offload.h"
#include "parts.h"
#include "smol_fixture.h"

/* The needle runs with a small sink and window (most of the prompt in the stores); the
 * teacher-forced comparison with the paper's defaults. */
enum { SINK = 32, WINDOW = 64, PAPER_SINK = 128, PAPER_WINDOW = 512, PROMPT = 2048, FORCED = 256 };

static struct {
  ra_backend *be;
  ra_model *m;
  ra_tokenizer *tok;
  harness_store st[2];
  ra_shard_map map;
  ra_offload_plan plan;       /* SINK, WINDOW */
  ra_offload_plan plan_paper; /* PAPER_SINK, PAPER_WINDOW */
} F;

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static int setup(void **state) {
  ra_error err;
  if (smol_fixture_up(&F.be, &F.m, &F.tok, F.st, 2, &F.map) != 0) return -1;
  const ra_model_config *c = &F.m->cfg;
  if (ra_offload_plan_build(&F.map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads, SINK,
                            WINDOW, &F.plan, &err) ||
      ra_offload_plan_build(&F.map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads,
                            PAPER_SINK, PAPER_WINDOW, &F.plan_paper, &err)) {
    fprintf(stderr, "FAIL: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  ra_offload_plan_free(&F.plan);
  ra_offload_plan_free(&F.plan_paper);
  return smol_fixture_down(F.be, F.m, F.tok, F.st, 2, &F.map);
}

static ra_offload *offload_new(const ra_offload_plan *plan, ra_mode mode, uint32_t top_k, ra_dtype store_dtype,
                               int64_t max_prompt, int64_t max_ctx) {
  ra_offload_config c;
  ra_offload_config_default(&c);
  c.mode = mode;
  c.n_sink = plan->n_sink;
  c.n_window = plan->n_window;
  if (mode == RA_MODE_STREAMING) plan = NULL; /* no stores: what leaves the window is dropped */
  c.top_k = top_k;
  c.store_dtype = store_dtype;
  c.max_prompt = max_prompt;
  c.max_ctx = max_ctx;
  ra_offload *o;
  ra_error err;
  ok(ra_offload_new(F.m, plan, &c, &o, &err), &err);
  return o;
}

/* Text of a file, tokenized; at most max_tokens. */
static int32_t *file_tokens(const char *path, size_t max_tokens, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  static char text[65536];
  size_t len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[len] = 0;
  int32_t *ids;
  ra_error err;
  ok(ra_tok_encode(F.tok, text, len, 1, 0, &ids, n, &err), &err);
  if (*n > max_tokens) *n = max_tokens;
  return ids;
}

/* Greedy answer to a prompt: full attention on an ordinary state, or an offload mode with its
 * stores in store_dtype, top_k keys (flat, roar). */
static size_t answer_at(ra_mode mode, ra_dtype store_dtype, uint32_t top_k, const int32_t *prompt, size_t n,
                        int max_new, int32_t *out) {
  ra_error err;
  ra_state *st = NULL;
  ra_offload *o = NULL;
  ra_gen_config gc = {.max_new_tokens = max_new, .top_p = 1.0f, .top_k = 1, .seed = 1, .stop_at_eos = 1};
  if (mode == RA_MODE_FULL) {
    ok(ra_state_new(F.m, (int64_t)n + max_new, (int64_t)n, RA_DTYPE_F32, &st, &err), &err);
  } else {
    o = offload_new(&F.plan, mode, top_k, store_dtype, (int64_t)n, (int64_t)n + max_new);
    st = ra_offload_state(o);
    gc.forward = ra_offload_forward;
    gc.forward_ctx = o;
  }
  ra_gen_result res;
  ok(ra_generate(st, F.tok, prompt, n, &gc, NULL, NULL, &res, &err), &err);
  size_t k = res.n_tokens;
  memcpy(out, res.tokens, k * sizeof *out);
  ra_gen_result_free(&res);
  if (o) ra_offload_free(o);
  else ra_state_free(st);
  return k;
}

static size_t answer(ra_mode mode, const int32_t *prompt, size_t n, int max_new, int32_t *out) {
  return answer_at(mode, RA_DTYPE_F16, 100, prompt, n, max_new, out);
}

static void print_tokens(const char *label, const int32_t *ids, size_t n) {
  char *text;
  size_t len;
  ra_error err;
  ok(ra_tok_decode(F.tok, ids, n, &text, &len, &err), &err);
  print_message("%-5s \"%s\"\n", label, text);
  free(text);
}

/* ~2K tokens of license text with a needle a third of the way in, then the question, as a
 * chat prompt; *n tokens. */
static int32_t *needle_prompt(size_t *n) {
  static char prompt[65536];
  FILE *f = fopen("/usr/share/common-licenses/GPL-3", "rb");
  assert_non_null(f);
  static char hay[10001];
  size_t len = fread(hay, 1, 10000, f);
  fclose(f);
  hay[len] = 0;
  size_t cut = len / 3;
  snprintf(prompt, sizeof prompt,
           "%.*s\nThe secret passkey is 48213. Remember it.\n%s\nWhat is the secret passkey? Answer with the number only.",
           (int)cut, hay, hay + cut);
  char *chat;
  int32_t *ids;
  ra_error err;
  ok(ra_tok_chat_format(F.tok, NULL, prompt, &chat, &err), &err);
  ok(ra_tok_encode(F.tok, chat, strlen(chat), ra_tok_add_bos(F.tok), 1, &ids, n, &err), &err);
  free(chat);
  return ids;
}

/* Full attention's answer to the needle prompt, computed once per process. */
static size_t needle_full(const int32_t *ids, size_t n, int32_t *out) {
  static int32_t full[16];
  static size_t n_full;
  if (n_full == 0) n_full = answer(RA_MODE_FULL, ids, n, 8, full);
  memcpy(out, full, n_full * sizeof *out);
  return n_full;
}

static void test_needle_answer_matches_full(void **state) {
  size_t n;
  int32_t *ids = needle_prompt(&n);
  print_message("needle prompt: %zu tokens, %zu offloaded\n", n, n - SINK - WINDOW);
  assert_true(n > 1500);
  int32_t full[16], flat[16], roar[16], wave[16];
  size_t nf = needle_full(ids, n, full);
  size_t nl = answer(RA_MODE_FLAT, ids, n, 8, flat);
  size_t nr = answer(RA_MODE_ROAR, ids, n, 8, roar);
  size_t nw = answer(RA_MODE_WAVE, ids, n, 8, wave);
  print_tokens("full", full, nf);
  print_tokens("flat", flat, nl);
  print_tokens("roar", roar, nr);
  print_tokens("wave", wave, nw);
  assert_true(nf > 0);
  assert_int_equal(nl, nf);
  assert_memory_equal(flat, full, nf * sizeof *full);
  assert_int_equal(nr, nf);
  assert_memory_equal(roar, full, nf * sizeof *full);
  assert_int_equal(nw, nf);
  assert_memory_equal(wave, full, nf * sizeof *full);
  free(ids);
}

/* The logits after every step of a teacher-forced offload decode, against full attention. */
typedef struct agreement {
  size_t positions, same_top1;
  double kl_mean, max_abs;
  double rows_per_head; /* keys the stores scanned per q head, layer and step */
  uint64_t store_bytes, store_rows; /* over the stores after the prefill (Stats): bytes charged, K/V rows held */
} agreement;

/* Sums the stores' Stats into a. */
static void store_usage(agreement *a) {
  for (int i = 0; i < 2; i++) {
    ra_kvclient *c;
    ra_kvclient_store_stats s;
    ra_error err;
    ok(ra_kvclient_connect(F.st[i].addr, NULL, &c, &err), &err);
    ok(ra_kvclient_stats(c, &s, &err), &err);
    a->store_bytes += s.bytes_used;
    a->store_rows += s.tokens;
    ra_kvclient_close(c);
  }
}

static agreement forced(ra_mode mode, uint32_t top_k, ra_dtype store_dtype, const int32_t *ids,
                        const float *full_logits) {
  int vocab = F.m->cfg.vocab;
  ra_offload *o = offload_new(&F.plan_paper, mode, top_k, store_dtype, PROMPT, PROMPT + FORCED);
  ra_state *st = ra_offload_state(o);
  ra_error err;
  float *lg = malloc((size_t)vocab * sizeof *lg);
  agreement a = {0};
  ok(ra_offload_prefill(o, ids, PROMPT, NULL, &err), &err);
  store_usage(&a);
  for (int t = 0; t < FORCED; t++) {
    if (t > 0) ok(ra_offload_decode(o, ids[PROMPT + t - 1], NULL, &err), &err);
    ok(st->be->ops->download(st->be, &st->logits, 0, lg, (size_t)vocab, &err), &err);
    const float *ref = full_logits + (size_t)(PROMPT + t - 1) * vocab;
    int am = 0, ar = 0;
    double zm = 0, zr = 0, mm = lg[0], mr = ref[0];
    for (int v = 0; v < vocab; v++) {
      if (lg[v] > lg[am]) am = v;
      if (ref[v] > ref[ar]) ar = v;
      a.max_abs = fmax(a.max_abs, fabs((double)lg[v] - ref[v]));
      mm = fmax(mm, lg[v]);
      mr = fmax(mr, ref[v]);
    }
    for (int v = 0; v < vocab; v++) {
      zm += exp(lg[v] - mm);
      zr += exp(ref[v] - mr);
    }
    double kl = 0;
    for (int v = 0; v < vocab; v++) {
      double lp = ref[v] - mr - log(zr), lq = lg[v] - mm - log(zm);
      kl += exp(lp) * (lp - lq);
    }
    a.kl_mean += kl / FORCED;
    a.same_top1 += am == ar;
    a.positions++;
  }
  size_t n_steps;
  const ra_offload_stats *steps = ra_offload_step_stats(o, &n_steps);
  for (size_t i = 0; i < n_steps; i++)
    a.rows_per_head += (double)steps[i].n_scanned / ((double)n_steps * F.m->cfg.n_layers * F.m->cfg.n_heads);
  free(lg);
  ra_offload_free(o);
  return a;
}

/* The teacher-forced text and full attention's logits of every position (one forward). */
static float *forced_reference(int32_t **ids) {
  size_t n;
  *ids = file_tokens("/usr/share/common-licenses/GPL-3", PROMPT + FORCED, &n);
  assert_int_equal(n, PROMPT + FORCED);
  ra_state *st;
  ra_error err;
  ok(ra_state_new(F.m, PROMPT + FORCED, PROMPT + FORCED, RA_DTYPE_F32, &st, &err), &err);
  ok(ra_model_forward(st, *ids, PROMPT + FORCED, 1, NULL, &err), &err);
  size_t nl = (size_t)(PROMPT + FORCED) * (size_t)F.m->cfg.vocab;
  float *full = malloc(nl * sizeof *full);
  ok(st->be->ops->download(st->be, &st->logits, 0, full, nl, &err), &err);
  ra_state_free(st);
  return full;
}

static void test_teacher_forced_agreement_and_exact_flat(void **state) {
  int32_t *ids;
  float *full = forced_reference(&ids);

  agreement all = forced(RA_MODE_FLAT, PROMPT + FORCED, RA_DTYPE_F32, ids, full);
  print_message("flat k=all (f32 stores): top-1 %zu/%zu, max |logit diff| %.2e, KL %.2e\n", all.same_top1,
                all.positions, all.max_abs, all.kl_mean);
  assert_int_equal(all.same_top1, all.positions);
  assert_true(all.max_abs < 1e-3);

  static const ra_mode modes[] = {RA_MODE_STREAMING, RA_MODE_FLAT, RA_MODE_ROAR};
  agreement a[3];
  for (size_t i = 0; i < 3; i++) {
    a[i] = forced(modes[i], 100, RA_DTYPE_F16, ids, full);
    print_message("%-9s k=100: top-1 agreement %zu/%zu (%.1f %%), mean KL(full || %s) %.3e\n",
                  ra_mode_name(modes[i]), a[i].same_top1, a[i].positions,
                  100.0 * (double)a[i].same_top1 / (double)a[i].positions, ra_mode_name(modes[i]), a[i].kl_mean);
  }
  double flat = (double)a[1].same_top1 / (double)a[1].positions, roar = (double)a[2].same_top1 / (double)a[2].positions;
  assert_true(flat >= 0.90);                    /* exact top-100 keeps most next tokens */
  assert_true(roar >= flat - 0.02);             /* the index retrieves as well as the exact scan */
  assert_true(a[2].kl_mean <= 1.5 * a[1].kl_mean + 1e-4);
  assert_true(a[0].kl_mean > 1.5 * a[1].kl_mean); /* dropping the middle is visibly worse */
  free(full);
  free(ids);
}

/* Wave reads the selected clusters' rows and the lag at the stores and estimates more clusters
 * on the device; flat gets as many exact keys per head as wave's stores scanned, its top-k chosen
 * per q head and key where wave's clusters are chosen per kv head. At 2K tokens flat stays
 * ahead at every budget tried (bench/results/wave-smollm2): wave must beat dropping the middle
 * (streaming's KL) and stay within 5 % of flat's agreement. */
static void test_teacher_forced_wave_vs_flat_at_equal_keys(void **state) {
  int32_t *ids;
  float *full = forced_reference(&ids);
  agreement w = forced(RA_MODE_WAVE, 0, RA_DTYPE_F16, ids, full);
  uint32_t keys = (uint32_t)ceil(w.rows_per_head);
  agreement f = forced(RA_MODE_FLAT, keys, RA_DTYPE_F16, ids, full);
  agreement s = forced(RA_MODE_STREAMING, 0, RA_DTYPE_F16, ids, full);
  print_message("wave (default budgets, %.1f keys per head scanned): top-1 %zu/%zu, KL %.3e; flat k=%u: top-1 "
                "%zu/%zu, KL %.3e; streaming: top-1 %zu/%zu, KL %.3e\n", w.rows_per_head, w.same_top1, w.positions,
                w.kl_mean, keys, f.same_top1, f.positions, f.kl_mean, s.same_top1, s.positions, s.kl_mean);
  assert_true(w.rows_per_head > 0);
  assert_true(w.kl_mean < 0.5 * s.kl_mean);
  assert_true((double)w.same_top1 >= (double)f.same_top1 - 0.05 * (double)f.positions);
  free(full);
  free(ids);
}

/* int8 stores answer the needle as f16 stores do (test_needle_answer_matches_full: as full
 * attention) in flat (k = 100, and k = all: full attention through the stores), roar and wave. */
static void test_int8_needle_answers_as_f16(void **state) {
  size_t n;
  int32_t *ids = needle_prompt(&n);
  int32_t full[16], got[16];
  size_t nf = needle_full(ids, n, full);
  print_tokens("full", full, nf);
  assert_true(nf > 0);
  static const struct {
    ra_mode mode;
    uint32_t top_k;
  } runs[] = {{RA_MODE_FLAT, 100}, {RA_MODE_FLAT, 4096}, {RA_MODE_ROAR, 100}, {RA_MODE_WAVE, 0}};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    size_t ng = answer_at(runs[i].mode, RA_DTYPE_I8, runs[i].top_k, ids, n, 8, got);
    char label[32];
    snprintf(label, sizeof label, "%s k=%u int8", ra_mode_name(runs[i].mode), runs[i].top_k);
    print_tokens(label, got, ng);
    assert_int_equal(ng, nf);
    assert_memory_equal(got, full, nf * sizeof *full);
  }
  free(ids);
}

static void print_json(const char *mode, const char *dtype, const agreement *a) {
  print_message("json: {\"mode\": \"%s\", \"store_dtype\": \"%s\", \"positions\": %zu, \"same_top1\": %zu, "
                "\"kl_mean\": %.4e, \"max_abs_logit_diff\": %.4e, \"keys_per_head\": %.1f, "
                "\"store_bytes\": %llu, \"store_kv_rows\": %llu, \"bytes_per_kv_row\": %.2f}\n",
                mode, dtype, a->positions, a->same_top1, a->kl_mean, a->max_abs, a->rows_per_head,
                (unsigned long long)a->store_bytes, (unsigned long long)a->store_rows,
                (double)a->store_bytes / (double)a->store_rows);
}

/* Teacher-forced (paper sink / window, 2K prompt, 256 tokens): int8 stores against f16 stores,
 * every key attended (flat k = all) and wave at its default budgets. int8 keeps f16's top-1
 * agreement with full attention to within 1 % of the positions (3 of 256), and its stores hold
 * (head_dim + 4) / (2 head_dim) of f16's bytes per K/V row (68 / 128 at SmolLM2's head_dim 64;
 * 2 % for shard growth slack and wave's directory). */
static void test_int8_teacher_forced_vs_f16(void **state) {
  int32_t *ids;
  float *full = forced_reference(&ids);
  const double want = (double)(F.m->cfg.head_dim + 4) / (2.0 * F.m->cfg.head_dim);
  static const ra_mode modes[] = {RA_MODE_FLAT, RA_MODE_WAVE};
  for (size_t i = 0; i < 2; i++) {
    uint32_t k = modes[i] == RA_MODE_FLAT ? PROMPT + FORCED : 0;
    const char *name = modes[i] == RA_MODE_FLAT ? "flat-all" : "wave";
    agreement h = forced(modes[i], k, RA_DTYPE_F16, ids, full);
    agreement q = forced(modes[i], k, RA_DTYPE_I8, ids, full);
    print_json(name, "f16", &h);
    print_json(name, "int8", &q);
    assert_int_equal(q.positions, h.positions);
    assert_true(q.same_top1 + 3 >= h.same_top1);
    double ratio = ((double)q.store_bytes / (double)q.store_rows) / ((double)h.store_bytes / (double)h.store_rows);
    print_message("%s: int8 / f16 store bytes per K/V row %.3f (rows alone: %.3f)\n", name, ratio, want);
    assert_int_equal(q.store_rows, h.store_rows);
    assert_true(fabs(ratio - want) <= 0.02);
  }
  free(full);
  free(ids);
}

static void test_store_killed_mid_decode_names_it(void **state) {
  size_t n;
  int32_t *ids = file_tokens("/usr/share/common-licenses/GPL-3", 400, &n);
  ra_offload *o = offload_new(&F.plan, RA_MODE_FLAT, 100, RA_DTYPE_F16, (int64_t)n, (int64_t)n + 8);
  ra_error err;
  ok(ra_offload_prefill(o, ids, (int64_t)n, NULL, &err), &err);
  ok(ra_offload_decode(o, ids[1], NULL, &err), &err);
  kill(F.st[1].pid, SIGKILL);
  waitpid(F.st[1].pid, NULL, 0);
  F.st[1].pid = 0;
  int rc = ra_offload_decode(o, ids[2], NULL, &err);
  print_message("after killing %s: %s\n", F.st[1].addr, err.msg);
  assert_true(rc < 0);
  assert_non_null(strstr(err.msg, F.st[1].addr));
  ra_offload_free(o);
  free(ids);
}

int main(int argc, char **argv) {
  static const struct CMUnitTest needle[] = {
      cmocka_unit_test(test_needle_answer_matches_full),
      cmocka_unit_test(test_int8_needle_answers_as_f16),
  };
  static const struct CMUnitTest forced_agreement[] = {cmocka_unit_test(test_teacher_forced_agreement_and_exact_flat)};
  static const struct CMUnitTest wave[] = {cmocka_unit_test(test_teacher_forced_wave_vs_flat_at_equal_keys)};
  static const struct CMUnitTest int8[] = {cmocka_unit_test(test_int8_teacher_forced_vs_f16)};
  static const struct CMUnitTest kill[] = {cmocka_unit_test(test_store_killed_mid_decode_names_it)};
  static const test_part parts[] = {TEST_PART("needle", needle), TEST_PART("agreement", forced_agreement),
                                    TEST_PART("wave", wave), TEST_PART("int8", int8),
                                    TEST_PART("kill", kill)}; /* last: it kills a store */
  return test_parts_run(parts, sizeof parts / sizeof parts[0], argc, argv, setup, teardown);
}
