/* accuracy-bench: the long-context accuracy suite (see README.md here). One prefill per sample,
 * the answer decoded in every requested mode, exact-match scores; text fidelity; reports. */
#include "loader.h"
#include "opts.h"
#include "report.h"
#include "runner.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
  char store_modes[128];
  ra_mode_list(store_modes, sizeof store_modes, RA_MODE_F_STORES);
  fprintf(f, "usage: accuracy-bench --model M.gguf --out DIR [options]\n"
             "  --backend cpu|cuda (cpu)   --threads N (0: all cores)\n"
             "  --stores HOST:PORT,... | --shard-map FILE   (needed by %s)\n", store_modes);
  fputs("  --tasks all|none|NAME,...  (none: text fidelity only) niah_single_number niah_single_word niah_single_uuid niah_multikey\n"
        "                             niah_multivalue niah_multiquery passkey kv_retrieval variable_tracking\n"
        "                             common_words longgen_needles (default all)\n"
        "  --lengths N,... (1024,2048,4096,8192)   --depths D,... in [0,1] (0,0.25,0.5,0.75,1)\n"
        "  --samples N per (task, length, depth) (1)   --seed S (1)\n"
        "  --modes full,... (of the modes listed last; all by default; full first); MODE+retroW: MODE with\n"
        "                             --retro W (flat, ivf, kgraph, roar, wave), e.g. full,flat,flat+retro2\n"
        "  --sink N (128) --window N (512) --top-k K (100) --ef N --nprobe N (store defaults)\n"
        "  --knn-nq N (100) --build-queries N (1024)\n"
        "  --fidelity-prompt N (2048; 0: skip) --fidelity-tokens N (64)\n"
        "  --fidelity-text corpus|generated (corpus: the license text after the prompt; generated: full\n"
        "                             attention's own greedy continuation, forced in every mode)\n"
        "  --corpus DIR (/usr/share/common-licenses)\n"
        "  --print-prompts 1          print every sample's prompt and expected values, run nothing\n"
        "  --report-from FILE.jsonl   only the reports, from the samples.jsonl of an earlier or interrupted run\n"
        "                             (give the run's --tasks, --lengths, --depths and --modes)\n"
        "  --fidelity-from FILE.json  with --report-from: the fidelity.json of a run, into the summary\n"
        "writes DIR/samples.jsonl, DIR/summary.md, DIR/fidelity.json, DIR/heatmap_<mode>.png\n",
        f);
  fprintf(f, "modes: %s\n", RA_MODE_NAMES);
}

static int bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("accuracy-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (--help for usage)\n", stderr);
  return 2;
}

/* Comma-separated list -> items via parse(item, i); the count or -1. */
static int split(const char *csv, int max, int (*parse)(const char *item, void *out, int i), void *out) {
  char buf[1024];
  if (strlen(csv) >= sizeof buf) return -1;
  strcpy(buf, csv);
  int n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (n == max || parse(t, out, n) != 0) return -1;
    n++;
  }
  return n;
}

static int parse_len(const char *s, void *out, int i) {
  int64_t v;
  if (ra_opts_parse_int(s, 200, 1 << 20, &v, NULL) != RA_OK) return -1;
  ((int *)out)[i] = (int)v;
  return 0;
}

static int parse_depth(const char *s, void *out, int i) {
  char *e;
  double v = strtod(s, &e);
  if (*e || !(v >= 0 && v <= 1)) return -1;
  ((double *)out)[i] = v;
  return 0;
}

static int parse_task(const char *s, void *out, int i) { return ra_acc_task_parse(s, &((ra_acc_task *)out)[i]); }
/* --modes entries into cfg's modes and retro windows */
static int parse_mode(const char *s, void *out, int i) {
  ra_acc_config *cfg = out;
  return ra_acc_mode_parse(s, &cfg->modes[i], &cfg->retro[i]);
}

static int parse_u32(const char *s, uint32_t *out) {
  int64_t v;
  if (ra_opts_parse_int(s, 0, UINT32_MAX, &v, NULL) != RA_OK) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* --print-prompts: every sample the sweep would run, generated and shown, nothing decoded. */
static int print_samples(const ra_tokenizer *tok, const ra_acc_corpus *corpus, const ra_acc_config *cfg,
                         ra_error *err) {
  for (int ti = 0; ti < cfg->n_tasks; ti++) {
    ra_acc_task t = cfg->tasks[ti];
    int n_depths = ra_acc_task_has_depth(t) ? cfg->n_depths : 1;
    for (int li = 0; li < cfg->n_lengths; li++)
      for (int di = 0; di < n_depths; di++)
        for (int k = 0; k < cfg->samples; k++) {
          ra_acc_sample s;
          int rc = ra_acc_generate(tok, corpus, t, cfg->lengths[li], cfg->depths[di],
                                   ra_acc_sample_seed(cfg->seed, t, cfg->lengths[li], di, k), &s, err);
          if (rc) return rc;
          printf("=== %s, %zu tokens (target %d), depth %.2f, needle at token %lld, expected:", ra_acc_task_name(t),
                 s.n_tokens, s.target_len, s.depth, (long long)s.needle_token);
          for (int i = 0; i < s.n_values; i++) printf(" %s", s.values[i]);
          printf("\n%s\n", s.text);
          ra_acc_sample_free(&s);
        }
  }
  return RA_OK;
}

int main(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *backend = "cpu", *stores = NULL, *shard_map = NULL;
  const char *corpus_dir = "/usr/share/common-licenses", *report_from = NULL, *fidelity_from = NULL;
  uint32_t threads = 0, fid_prompt = 2048, fid_forced = 64, samples = 1, print_prompts = 0;
  uint64_t seed = 1;
  int fid_generated = 0;
  ra_acc_config cfg = {0};
  ra_offload_config_default(&cfg.off);
  cfg.samples = 1;
  for (int i = 0; i < RA_ACC_N_TASKS; i++) cfg.tasks[cfg.n_tasks++] = (ra_acc_task)i;
  const int def_len[] = {1024, 2048, 4096, 8192};
  for (int i = 0; i < 4; i++) cfg.lengths[cfg.n_lengths++] = def_len[i];
  const double def_depth[] = {0, 0.25, 0.5, 0.75, 1};
  for (int i = 0; i < 5; i++) cfg.depths[cfg.n_depths++] = def_depth[i];
  for (int i = 0; i < RA_MODE_COUNT; i++) cfg.modes[cfg.n_modes++] = (ra_mode)i;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) return bad("%s needs a value", a);
    const char *v = argv[++i];
    uint32_t *u32 = strcmp(a, "--threads") == 0           ? &threads
                    : strcmp(a, "--sink") == 0            ? &cfg.off.n_sink
                    : strcmp(a, "--window") == 0          ? &cfg.off.n_window
                    : strcmp(a, "--top-k") == 0           ? &cfg.off.top_k
                    : strcmp(a, "--ef") == 0              ? &cfg.off.ef
                    : strcmp(a, "--nprobe") == 0          ? &cfg.off.nprobe
                    : strcmp(a, "--knn-nq") == 0          ? &cfg.off.knn_nq
                    : strcmp(a, "--build-queries") == 0   ? &cfg.off.build_queries
                    : strcmp(a, "--fidelity-prompt") == 0 ? &fid_prompt
                    : strcmp(a, "--fidelity-tokens") == 0 ? &fid_forced
                    : strcmp(a, "--samples") == 0         ? &samples
                    : strcmp(a, "--print-prompts") == 0   ? &print_prompts
                                                          : NULL;
    if (u32) {
      if (parse_u32(v, u32) != 0) return bad("%s: not a non-negative integer: %s", a, v);
    } else if (strcmp(a, "--model") == 0) model = v;
    else if (strcmp(a, "--out") == 0) out = v;
    else if (strcmp(a, "--backend") == 0) backend = v;
    else if (strcmp(a, "--stores") == 0) stores = v;
    else if (strcmp(a, "--shard-map") == 0) shard_map = v;
    else if (strcmp(a, "--corpus") == 0) corpus_dir = v;
    else if (strcmp(a, "--report-from") == 0) report_from = v;
    else if (strcmp(a, "--fidelity-from") == 0) fidelity_from = v;
    else if (strcmp(a, "--fidelity-text") == 0) {
      if (strcmp(v, "corpus") != 0 && strcmp(v, "generated") != 0)
        return bad("--fidelity-text: corpus or generated: %s", v);
      fid_generated = strcmp(v, "generated") == 0;
    }
    else if (strcmp(a, "--seed") == 0) {
      if (ra_opts_parse_u64(v, 0, 0, UINT64_MAX, &seed, NULL) != RA_OK)
        return bad("--seed: not a non-negative integer: %s", v);
    } else if (strcmp(a, "--tasks") == 0) {
      if (strcmp(v, "none") == 0) cfg.n_tasks = 0;
      else if (strcmp(v, "all") != 0 && (cfg.n_tasks = split(v, RA_ACC_N_TASKS, parse_task, cfg.tasks)) < 1)
        return bad("--tasks: unknown task in %s", v);
    } else if (strcmp(a, "--lengths") == 0) {
      if ((cfg.n_lengths = split(v, RA_ACC_MAX_AXIS, parse_len, cfg.lengths)) < 1)
        return bad("--lengths: want up to %d token counts >= 200: %s", RA_ACC_MAX_AXIS, v);
    } else if (strcmp(a, "--depths") == 0) {
      if ((cfg.n_depths = split(v, RA_ACC_MAX_AXIS, parse_depth, cfg.depths)) < 1)
        return bad("--depths: want up to %d values in [0, 1]: %s", RA_ACC_MAX_AXIS, v);
    } else if (strcmp(a, "--modes") == 0) {
      if ((cfg.n_modes = split(v, RA_ACC_MAX_MODES, parse_mode, &cfg)) < 1)
        return bad("--modes: unknown mode in %s", v);
    } else {
      return bad("unknown option %s", a);
    }
  }
  if (!model || !out) return bad("--model and --out are required");
  if (samples < 1) return bad("--samples must be >= 1");
  if (cfg.n_modes < 1 || cfg.modes[0] != RA_MODE_FULL || cfg.retro[0])
    return bad("--modes must start with full (the reference)");
  int need_stores = 0;
  for (int i = 1; i < cfg.n_modes; i++) need_stores |= ra_mode_uses_stores(cfg.modes[i]);
  if (report_from) need_stores = 0;
  if (fidelity_from && !report_from) return bad("--fidelity-from goes with --report-from");
  if (report_from && cfg.n_tasks == 0) return bad("--report-from needs the run's --tasks");
  if (need_stores && !stores && !shard_map && !print_prompts) {
    char store_modes[128];
    ra_mode_list(store_modes, sizeof store_modes, RA_MODE_F_STORES);
    return bad("modes %s need --stores or --shard-map", store_modes);
  }
  if (stores && shard_map) return bad("give --stores or --shard-map, not both");
  if (cfg.off.n_window < 1) return bad("--window must be >= 1");
  cfg.samples = (int)samples;
  cfg.seed = seed;
  if (mkdir(out, 0755) != 0 && errno != EEXIST) return bad("cannot create %s: %s", out, strerror(errno));

  ra_error err = {0};
  ra_backend *be = NULL;
  ra_model *m = NULL;
  ra_tokenizer *tok = NULL;
  ra_acc_corpus corpus = {0};
  ra_shard_map map = {0};
  ra_offload_plan plan = {0};
  ra_acc_results res = {0};
  ra_acc_fidelity fid[RA_ACC_MAX_MODES] = {0};
  int have_plan = 0, n_fid = 0;
  ra_backend_config bc = {(int)threads, 0};
  /* --report-from runs nothing: the CPU backend only reads the model's config */
  int rc = ra_backend_create(report_from ? "cpu" : backend, &bc, &be, &err);
  if (rc == RA_OK) rc = ra_load_model(be, model, NULL, 1, &m, &tok, &err);
  if (rc == RA_OK && !tok) rc = ra_errorf(&err, RA_EINVAL, "%s has no tokenizer", model);
  if (rc == RA_OK) rc = ra_acc_corpus_load(corpus_dir, &corpus, &err);
  if (rc == RA_OK && print_prompts) {
    rc = print_samples(tok, &corpus, &cfg, &err);
    need_stores = 0;
    cfg.n_tasks = 0;
    fid_prompt = 0;
  }
  if (rc == RA_OK && need_stores) {
    const ra_model_config *c = &m->cfg;
    rc = shard_map ? ra_shard_map_load(shard_map, &map, &err)
                   : ra_shard_map_spread_list(stores, (uint32_t)c->n_layers, (uint32_t)c->n_kv_heads, &map, &err);
    if (rc == RA_OK)
      rc = ra_offload_plan_build(&map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads,
                                 cfg.off.n_sink, cfg.off.n_window, &plan, &err);
    have_plan = rc == RA_OK;
    cfg.plan = have_plan ? &plan : NULL;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/samples.jsonl", out);
  if (report_from) {
    /* the reports of an earlier (or interrupted) run: nothing runs */
    if (rc == RA_OK) rc = ra_acc_results_read(report_from, &cfg, &res, &err);
    fid_prompt = 0;
    if (rc == RA_OK && fidelity_from) {
      rc = ra_acc_fidelity_read(fidelity_from, &cfg, m->cfg.n_layers, fid, &fid_prompt, &fid_forced, &err);
      n_fid = cfg.n_modes - 1;
    }
  } else if (rc == RA_OK && !(cfg.jsonl = fopen(path, "w"))) {
    rc = ra_errorf(&err, RA_EIO, "cannot write %s", path);
  }
  cfg.log = stderr;
  if (rc == RA_OK && cfg.n_tasks > 0 && !report_from) rc = ra_acc_run(m, tok, &corpus, &cfg, &res, &err);
  if (rc == RA_OK && !report_from && fid_prompt > 0 && cfg.n_modes > 1) {
    /* the prose corpus from its start: the license texts as running text */
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    for (size_t i = 0; i < corpus.n_lines; i++) len += strlen(corpus.lines[i]) + 1;
    char *text = malloc(len + 1), *p = text;
    rc = text ? RA_OK : ra_errorf(&err, RA_ENOMEM, "out of memory");
    for (size_t i = 0; rc == RA_OK && i < corpus.n_lines; i++) p += sprintf(p, "%s\n", corpus.lines[i]);
    if (rc == RA_OK) rc = ra_tok_encode(tok, text, (size_t)(p - text), ra_tok_add_bos(tok), 0, &ids, &n, &err);
    free(text);
    if (rc == RA_OK && n < (size_t)fid_prompt + fid_forced)
      rc = ra_errorf(&err, RA_EINVAL, "the corpus has %zu tokens, fewer than --fidelity-prompt + --fidelity-tokens", n);
    if (rc == RA_OK) {
      fprintf(stderr, "text fidelity: %u forced tokens (%s) after %u\n", fid_forced,
              fid_generated ? "full's greedy continuation" : "corpus", fid_prompt);
      rc = ra_acc_fidelity_run(m, &cfg, ids, (int)fid_prompt, (int)fid_forced, fid_generated, fid, &err);
      n_fid = cfg.n_modes - 1;
    }
    free(ids);
  }
  if (rc == RA_OK && n_fid > 0 && !report_from) {
    snprintf(path, sizeof path, "%s/fidelity.json", out);
    FILE *f = fopen(path, "w");
    if (!f) rc = ra_errorf(&err, RA_EIO, "cannot write %s", path);
    for (int i = 0; f && i < n_fid; i++) {
      char label[RA_ACC_LABEL_MAX];
      fprintf(f, "%s{\"mode\": \"%s\", \"retro\": %u, \"prompt\": %u, \"forced\": %d, \"text\": \"%s\", "
                 "\"top1\": %.4f, \"kl_mean\": %.6e, \"att_rel\": [",
              i ? ",\n " : "[", ra_acc_mode_label(fid[i].mode, fid[i].retro, label), fid[i].retro, fid_prompt,
              fid[i].positions, fid_generated ? "generated" : "corpus", fid[i].top1, fid[i].kl_mean);
      for (int l = 0; l < fid[i].n_layers; l++) fprintf(f, "%s%.4e", l ? ", " : "", fid[i].att_rel[l]);
      fputs("]}", f);
    }
    if (f) {
      fputs("]\n", f);
      fclose(f);
    }
  }
  if (rc == RA_OK && cfg.n_tasks > 0) {
    ra_acc_report_info info = {.model = model, .backend = backend, .trained_ctx = m->cfg.max_ctx,
                               .fidelity = n_fid ? fid : NULL, .n_fidelity = n_fid,
                               .fidelity_prompt = (int)fid_prompt, .fidelity_forced = (int)fid_forced,
                               .fidelity_generated = fid_generated};
    rc = ra_acc_report_write(out, &cfg, &res, &info, &err);
    if (rc == RA_OK) fprintf(stderr, "wrote %s/summary.md\n", out);
  }
  if (cfg.jsonl) fclose(cfg.jsonl);
  for (int i = 0; i < RA_ACC_MAX_MODES; i++) ra_acc_fidelity_free(&fid[i]);
  ra_acc_results_free(&res);
  if (have_plan) ra_offload_plan_free(&plan);
  ra_shard_map_free(&map);
  ra_acc_corpus_free(&corpus);
  ra_tok_free(tok);
  ra_model_free(m);
  if (be) ra_backend_destroy(be);
  if (rc != RA_OK) {
    fprintf(stderr, "accuracy-bench: %s: %s\n", ra_status_name(rc), err.msg);
    return 1;
  }
  return 0;
}
