/* The accuracy suite's CI subset, on SmolLM2-135M (CPU backend) and two real kv-store processes
 * (sink 64, window 128: most of a 1K prompt is in the stores):
 *   - a runtime seeded from a captured prefill decodes like one that ran ra_offload_prefill
 *     (same logits after the prefill and over forced decode steps, flat and roar);
 *   - passkey at three depths: full / streaming / roar from one prefill per sample; roar answers
 *     right wherever full does, and streaming fails every needle outside its sink + window that
 *     full finds (the suite can show a bad mode as bad); the reports (Markdown, PNG) are written;
 *   - text fidelity: flat (exact top-k; the cheapest store mode, roar's index builds are the
 *     test's main cost) is closer to full than streaming: smaller KL and attention error;
 *   - the long-generation task with retro: with every key retrieved, flat+retro2 generates full's
 *     answers token for token with no supplementary rows (nothing is unseen) and its fidelity
 *     along full's own continuation is exact; at top-k 8 its supplementary work shows; wave+retro2
 *     the same way, with every cluster in the retrieval zone, then with 5 % retrieved. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parts.h"
#include "report.h"
#include "runner.h"
#include "smol_fixture.h"

enum { SINK = 64, WINDOW = 128, BUILD_QUERIES = 128 };

static struct {
  ra_backend *be;
  ra_model *m;
  ra_tokenizer *tok;
  ra_acc_corpus corpus;
  harness_store st[2];
  ra_shard_map map;
  ra_offload_plan plan;
} F;

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static int setup(void **state) {
  ra_error err;
  if (smol_fixture_up(&F.be, &F.m, &F.tok, F.st, 2, &F.map) != 0) return -1;
  const ra_model_config *c = &F.m->cfg;
  if (ra_acc_corpus_load("/usr/share/common-licenses", &F.corpus, &err) ||
      ra_offload_plan_build(&F.map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads, SINK,
                            WINDOW, &F.plan, &err)) {
    fprintf(stderr, "FAIL: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  ra_offload_plan_free(&F.plan);
  ra_acc_corpus_free(&F.corpus);
  return smol_fixture_down(F.be, F.m, F.tok, F.st, 2, &F.map);
}

static void base_config(ra_acc_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  ra_offload_config_default(&cfg->off);
  cfg->off.n_sink = SINK;
  cfg->off.n_window = WINDOW;
  cfg->off.build_queries = BUILD_QUERIES;
  cfg->plan = &F.plan;
  cfg->samples = 1;
  cfg->seed = 1;
}

static ra_offload *offload_new(ra_mode mode, int64_t n, int64_t max_ctx) {
  ra_acc_config cfg;
  base_config(&cfg);
  cfg.off.mode = mode;
  cfg.off.max_prompt = n;
  cfg.off.max_ctx = max_ctx;
  ra_offload *o;
  ra_error err;
  ok(ra_offload_new(F.m, mode == RA_MODE_STREAMING ? NULL : &F.plan, &cfg.off, &o, &err), &err);
  return o;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
  return d;
}

static void test_seeded_runtime_decodes_like_direct_prefill(void **state) {
  enum { N = 512, FORCED = 4 };
  ra_error err;
  int32_t *ids;
  size_t n;
  /* license prose as the prompt; the forced tokens continue it */
  char buf[16384];
  size_t len = 0;
  for (size_t i = 0; i < F.corpus.n_lines && len + 512 < sizeof buf; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", F.corpus.lines[i]);
  ok(ra_tok_encode(F.tok, buf, len, 1, 0, &ids, &n, &err), &err);
  assert_true(n >= N + FORCED);
  ra_prefill_capture *cap;
  ra_state *full;
  ok(ra_prefill_capture_new(F.m, N, BUILD_QUERIES, &cap, &err), &err);
  ok(ra_state_new(F.m, N, N, RA_DTYPE_F32, &full, &err), &err);
  ok(ra_prefill_capture_run(cap, full, ids, &err), &err);
  ra_state_free(full);
  int vocab = F.m->cfg.vocab;
  float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
  static const ra_mode modes[] = {RA_MODE_FLAT, RA_MODE_ROAR};
  for (int mi = 0; mi < 2; mi++) {
    ra_offload *direct = offload_new(modes[mi], N, N + FORCED + 1), *seeded = offload_new(modes[mi], N, N + FORCED + 1);
    ok(ra_offload_prefill(direct, ids, N, NULL, &err), &err);
    ok(ra_offload_seed(seeded, cap, NULL, &err), &err);
    assert_int_equal(ra_offload_state(seeded)->pos, N);
    double worst = 0;
    for (int t = 0; t <= FORCED; t++) {
      if (t > 0) {
        ok(ra_offload_decode(direct, ids[N + t - 1], NULL, &err), &err);
        ok(ra_offload_decode(seeded, ids[N + t - 1], NULL, &err), &err);
      }
      ra_state *sd = ra_offload_state(direct), *ss = ra_offload_state(seeded);
      ok(F.be->ops->download(F.be, &sd->logits, 0, a, (size_t)vocab, &err), &err);
      ok(F.be->ops->download(F.be, &ss->logits, 0, b, (size_t)vocab, &err), &err);
      worst = fmax(worst, max_abs_diff(a, b, (size_t)vocab));
    }
    print_message("%s: seeded vs direct prefill, max |logit diff| over the prefill + %d steps: %.2e\n",
                  ra_mode_name(modes[mi]), FORCED, worst);
    /* the same K/V and index inputs: equal up to the stores' f16 rounding of identical data */
    assert_true(worst < 1e-3);
    ra_offload_free(direct);
    ra_offload_free(seeded);
  }
  free(a);
  free(b);
  ra_prefill_capture_free(cap);
  free(ids);
}

static void test_passkey_subset_roar_matches_full_streaming_fails(void **state) {
  ra_acc_config cfg;
  base_config(&cfg);
  cfg.tasks[cfg.n_tasks++] = RA_ACC_PASSKEY;
  cfg.lengths[cfg.n_lengths++] = 1024;
  const double depths[] = {0.25, 0.5, 0.75};
  for (int i = 0; i < 3; i++) cfg.depths[cfg.n_depths++] = depths[i];
  const ra_mode modes[] = {RA_MODE_FULL, RA_MODE_STREAMING, RA_MODE_ROAR};
  for (int i = 0; i < 3; i++) cfg.modes[cfg.n_modes++] = modes[i];
  cfg.log = stderr;
  ra_acc_results res = {0};
  ra_error err;
  ok(ra_acc_run(F.m, F.tok, &F.corpus, &cfg, &res, &err), &err);
  assert_int_equal(res.n, 3);
  int full_right = 0, outside = 0;
  for (size_t i = 0; i < res.n; i++) {
    const ra_acc_record *r = &res.recs[i];
    if (r->modes[0].score < 1) continue;
    full_right++;
    if (r->modes[2].score < 1)
      fail_msg("roar missed the passkey at depth %.2f that full found: \"%s\"", r->depth, r->modes[2].output);
    /* the needle (~25 tokens) lies between the sink and the window: streaming cannot see it */
    if (r->needle_token > SINK && r->needle_token + 32 < r->n_tokens - WINDOW) {
      outside++;
      if (r->modes[1].score > 0)
        fail_msg("streaming found a needle outside its sink + window: \"%s\"", r->modes[1].output);
    }
  }
  assert_true(full_right >= 2); /* the task counts: full >= 50 % */
  assert_true(outside >= 1);
  char dir[] = "/tmp/test_accuracy_XXXXXX";
  assert_non_null(mkdtemp(dir));
  ra_acc_report_info info = {.model = "SmolLM2-135M", .backend = "cpu", .trained_ctx = F.m->cfg.max_ctx};
  ok(ra_acc_report_write(dir, &cfg, &res, &info, &err), &err);
  char path[256];
  struct stat sb;
  snprintf(path, sizeof path, "%s/heatmap_roar.png", dir);
  assert_int_equal(stat(path, &sb), 0);
  assert_true(sb.st_size > 1000);
  static const char *const files[] = {"summary.md", "heatmap_full.png", "heatmap_streaming.png", "heatmap_roar.png",
                                      "heatmap_full.dat", "heatmap_streaming.dat", "heatmap_roar.dat",
                                      "heatmap_full.gp", "heatmap_streaming.gp", "heatmap_roar.gp"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
  ra_acc_results_free(&res);
}

static void test_fidelity_streaming_worse_than_flat(void **state) {
  enum { P = 512, FORCED = 16 };
  ra_acc_config cfg;
  base_config(&cfg);
  const ra_mode modes[] = {RA_MODE_FULL, RA_MODE_STREAMING, RA_MODE_FLAT};
  for (int i = 0; i < 3; i++) cfg.modes[cfg.n_modes++] = modes[i];
  cfg.tasks[cfg.n_tasks++] = RA_ACC_PASSKEY;
  cfg.lengths[cfg.n_lengths++] = 1024;
  cfg.depths[cfg.n_depths++] = 0.5;
  char buf[16384];
  size_t len = 0;
  for (size_t i = 0; i < F.corpus.n_lines && len + 512 < sizeof buf; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", F.corpus.lines[i]);
  int32_t *ids;
  size_t n;
  ra_error err;
  ok(ra_tok_encode(F.tok, buf, len, 1, 0, &ids, &n, &err), &err);
  assert_true(n >= P + FORCED);
  ra_acc_fidelity fid[2];
  ok(ra_acc_fidelity_run(F.m, &cfg, ids, P, FORCED, 0, fid, &err), &err);
  for (int i = 0; i < 2; i++)
    print_message("%-9s top-1 = full %.1f %%, KL %.3e, attention rel. error layer 0 / last %.3f / %.3f\n",
                  ra_mode_name(fid[i].mode), 100 * fid[i].top1, fid[i].kl_mean, fid[i].att_rel[0],
                  fid[i].att_rel[fid[i].n_layers - 1]);
  assert_int_equal(fid[0].positions, FORCED);
  assert_true(fid[1].top1 >= fid[0].top1);
  assert_true(fid[1].kl_mean < fid[0].kl_mean);
  double e0 = 0, e1 = 0;
  for (int l = 0; l < fid[0].n_layers; l++) {
    e0 += fid[0].att_rel[l];
    e1 += fid[1].att_rel[l];
  }
  assert_true(e1 < e0);
  for (int i = 0; i < 2; i++) ra_acc_fidelity_free(&fid[i]);
  free(ids);
}

static void test_longgen_retro_exact_with_every_key_then_corrects(void **state) {
  ra_acc_config cfg;
  base_config(&cfg);
  cfg.modes[cfg.n_modes++] = RA_MODE_FULL;
  cfg.modes[cfg.n_modes] = RA_MODE_FLAT;
  cfg.retro[cfg.n_modes++] = 2;
  cfg.off.top_k = 4096; /* more than the stores hold: every key */
  ra_acc_sample s;
  ra_error err;
  ok(ra_acc_generate(F.tok, &F.corpus, RA_ACC_LONGGEN_NEEDLES, 448, 0.5, 3, &s, &err), &err);
  ra_acc_record rec;
  ok(ra_acc_run_sample(F.m, F.tok, &cfg, &s, &rec, &err), &err);
  print_message("full: %.2f \"%.60s\"; flat+retro2, every key: %.2f, %llu supplementary rows\n", rec.modes[0].score,
                rec.modes[0].output, rec.modes[1].score, (unsigned long long)rec.modes[1].retro_rows);
  assert_true(rec.modes[0].n_generated > 3 * s.n_values); /* one generation of every answer */
  assert_int_equal(rec.modes[1].n_generated, rec.modes[0].n_generated);
  assert_string_equal(rec.modes[1].output, rec.modes[0].output);
  assert_true(rec.modes[1].score == rec.modes[0].score);
  assert_int_equal(rec.modes[1].retro_rows, 0);
  /* fidelity along full's own continuation (self-forced), every key: exact */
  int32_t *ids = calloc(s.n_tokens + 16, sizeof *ids);
  memcpy(ids, s.tokens, s.n_tokens * sizeof *ids);
  ra_acc_fidelity fid;
  ok(ra_acc_fidelity_run(F.m, &cfg, ids, (int)s.n_tokens, 16, 1, &fid, &err), &err);
  assert_int_equal(fid.positions, 16);
  assert_true(fid.top1 == 1.0);
  assert_true(fid.kl_mean < 1e-3);
  ra_acc_fidelity_free(&fid);
  free(ids);
  /* a small budget: the past queries get supplementary partials */
  cfg.off.top_k = 8;
  ok(ra_acc_run_sample(F.m, F.tok, &cfg, &s, &rec, &err), &err);
  print_message("flat+retro2 top-8: %.2f, %llu supplementary rows over %d tokens\n", rec.modes[1].score,
                (unsigned long long)rec.modes[1].retro_rows, rec.modes[1].n_generated);
  assert_true(rec.modes[1].retro_rows > 0);
  assert_int_equal(rec.modes[1].n_items, s.n_values);
  ra_acc_sample_free(&s);
}

static void test_longgen_wave_retro_exact_with_every_cluster_then_corrects(void **state) {
  ra_acc_config cfg;
  base_config(&cfg);
  cfg.modes[cfg.n_modes++] = RA_MODE_FULL;
  cfg.modes[cfg.n_modes] = RA_MODE_WAVE;
  cfg.retro[cfg.n_modes++] = 2;
  cfg.off.wave.retrieve = 1.0; /* every cluster, exact at the stores */
  cfg.off.wave.estimate = 0.0;
  ra_acc_sample s;
  ra_error err;
  ok(ra_acc_generate(F.tok, &F.corpus, RA_ACC_LONGGEN_NEEDLES, 448, 0.5, 3, &s, &err), &err);
  ra_acc_record rec;
  ok(ra_acc_run_sample(F.m, F.tok, &cfg, &s, &rec, &err), &err);
  print_message("full: %.2f; wave+retro2, every cluster: %.2f, %llu supplementary rows\n", rec.modes[0].score,
                rec.modes[1].score, (unsigned long long)rec.modes[1].retro_rows);
  assert_int_equal(rec.modes[1].n_generated, rec.modes[0].n_generated);
  assert_string_equal(rec.modes[1].output, rec.modes[0].output);
  assert_int_equal(rec.modes[1].retro_rows, 0);
  cfg.off.wave.retrieve = 0.05;
  cfg.off.wave.retrieve_min = 0; /* 5 % of a 448-token prompt, not the floor's 1024 tokens */
  cfg.off.wave.estimate = 0.2;
  ok(ra_acc_run_sample(F.m, F.tok, &cfg, &s, &rec, &err), &err);
  print_message("wave+retro2 at 5 %% / 20 %%: %.2f, %llu supplementary rows over %d tokens\n", rec.modes[1].score,
                (unsigned long long)rec.modes[1].retro_rows, rec.modes[1].n_generated);
  assert_true(rec.modes[1].retro_rows > 0);
  assert_int_equal(rec.modes[1].n_items, s.n_values);
  ra_acc_sample_free(&s);
}

int main(int argc, char **argv) {
  static const struct CMUnitTest seeded[] = {cmocka_unit_test(test_seeded_runtime_decodes_like_direct_prefill)};
  static const struct CMUnitTest passkey[] = {cmocka_unit_test(test_passkey_subset_roar_matches_full_streaming_fails)};
  static const struct CMUnitTest fidelity[] = {cmocka_unit_test(test_fidelity_streaming_worse_than_flat)};
  static const struct CMUnitTest retro[] = {cmocka_unit_test(test_longgen_retro_exact_with_every_key_then_corrects)};
  static const struct CMUnitTest wave_retro[] = {
      cmocka_unit_test(test_longgen_wave_retro_exact_with_every_cluster_then_corrects)};
  static const test_part parts[] = {TEST_PART("seeded", seeded), TEST_PART("passkey", passkey),
                                    TEST_PART("fidelity", fidelity), TEST_PART("retro", retro),
                                    TEST_PART("wave-retro", wave_retro)};
  return test_parts_run(parts, sizeof parts / sizeof parts[0], argc, argv, setup, teardown);
}
