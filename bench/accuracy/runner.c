#include "runner.h"

#include "clock.h"
#include "generate.h"
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRO_SUFFIX "+retro"

int ra_acc_mode_parse(const char *spec, ra_mode *mode, uint32_t *retro) {
  char name[RA_ACC_LABEL_MAX];
  const char *plus = strstr(spec, RETRO_SUFFIX);
  size_t n = plus ? (size_t)(plus - spec) : strlen(spec);
  if (n >= sizeof name) return RA_EINVAL;
  memcpy(name, spec, n);
  name[n] = 0;
  *retro = 0;
  if (plus) {
    char *e;
    const char *w = plus + strlen(RETRO_SUFFIX);
    unsigned long v = strtoul(w, &e, 10);
    if (!isdigit((unsigned char)*w) || *e || v < 1 || v > RA_OFFLOAD_MAX_RETRO) return RA_EINVAL;
    *retro = (uint32_t)v;
  }
  return ra_mode_parse(name, mode);
}

const char *ra_acc_mode_label(ra_mode mode, uint32_t retro, char out[RA_ACC_LABEL_MAX]) {
  if (retro) snprintf(out, RA_ACC_LABEL_MAX, "%s" RETRO_SUFFIX "%u", ra_mode_name(mode), retro);
  else snprintf(out, RA_ACC_LABEL_MAX, "%s", ra_mode_name(mode));
  return out;
}

int ra_acc_config_check(const ra_acc_config *cfg, ra_error *err) {
  char label[RA_ACC_LABEL_MAX];
  if (cfg->n_modes < 1 || cfg->modes[0] != RA_MODE_FULL || cfg->retro[0])
    return ra_errorf(err, RA_EINVAL,
                     "accuracy: full attention (without retro) must be the first mode (it is the reference)");
  for (int i = 1; i < cfg->n_modes; i++) {
    if (cfg->modes[i] == RA_MODE_FULL) return ra_errorf(err, RA_EINVAL, "accuracy: full given twice");
    if (ra_mode_uses_stores(cfg->modes[i]) && !cfg->plan)
      return ra_errorf(err, RA_EINVAL, "accuracy: mode %s needs kv-stores", ra_mode_name(cfg->modes[i]));
    /* the worker-only modes never open a runtime that could refuse it */
    if (cfg->retro[i] && !ra_mode_takes_retro(cfg->modes[i]))
      return ra_errorf(err, RA_EINVAL, "accuracy: %s has no retrieval to correct",
                       ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label));
    for (int j = 1; j < i; j++)
      if (cfg->modes[j] == cfg->modes[i] && cfg->retro[j] == cfg->retro[i])
        return ra_errorf(err, RA_EINVAL, "accuracy: %s given twice",
                         ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label));
  }
  if (cfg->plan && (cfg->plan->n_sink != cfg->off.n_sink || cfg->plan->n_window != cfg->off.n_window))
    return ra_errorf(err, RA_EINVAL, "accuracy: the store plan's sink/window differ from the config's");
  return RA_OK;
}

/* The sweep's own checks: it needs axes (fidelity alone does not). */
static int sweep_check(const ra_acc_config *cfg, ra_error *err) {
  int rc = ra_acc_config_check(cfg, err);
  if (rc == RA_OK && (cfg->n_tasks < 1 || cfg->n_lengths < 1 || cfg->n_depths < 1 || cfg->samples < 1))
    rc = ra_errorf(err, RA_EINVAL, "accuracy: no tasks, lengths, depths or samples");
  return rc;
}

/* ---------- greedy decode in one mode ---------- */

typedef int (*step_fn)(void *ctx, int32_t token, ra_error *err);

static int full_step(void *ctx, int32_t token, ra_error *err) { return ra_model_forward(ctx, &token, 1, 0, NULL, err); }

/* A mode's decode, summing the supplementary work retro does. */
typedef struct offload_ctx {
  ra_offload *o;
  uint64_t retro_rows;
} offload_ctx;

static int offload_step(void *ctx, int32_t token, ra_error *err) {
  offload_ctx *c = ctx;
  ra_offload_stats st;
  int rc = ra_offload_decode(c->o, token, &st, err);
  if (rc == RA_OK) c->retro_rows += st.retro_rows;
  return rc;
}

/* The argmax of st's last logits row: the greedy next token. */
static int argmax_last(ra_state *st, int32_t *id, ra_error *err) {
  ra_tensor row = ra_tensor_rows(&st->logits, st->n_logits - 1, 1);
  float val;
  return st->be->ops->topk_rows(st->be, &row, 1, id, &val, err);
}

/* Greedy tokens from st's current logits until a stop token or max_new. */
static int greedy(ra_state *st, const ra_tokenizer *tok, step_fn step, void *ctx, int max_new, int32_t *out, int *n_out,
                  ra_error *err) {
  *n_out = 0;
  for (int i = 0; i < max_new; i++) {
    int32_t id;
    int rc = argmax_last(st, &id, err);
    if (rc) return rc;
    if (ra_tok_is_stop(tok, id)) break;
    out[(*n_out)++] = id;
    if (*n_out == max_new) break;
    if ((rc = step(ctx, id, err))) return rc;
  }
  return RA_OK;
}

/* A runtime of cfg's mode mi seeded from the capture, with room for max_new more tokens. */
static int mode_open(const ra_model *m, const ra_acc_config *cfg, int mi, const ra_prefill_capture *cap,
                     int max_new, ra_offload_config *oc, ra_offload **o, ra_error *err) {
  ra_mode mode = cfg->modes[mi];
  *oc = cfg->off;
  oc->mode = mode;
  oc->retro_window = cfg->retro[mi];
  oc->max_prompt = cap->n;
  oc->max_ctx = cap->n + max_new + 1;
  oc->progress = NULL;
  int rc = ra_offload_new(m, mode == RA_MODE_STREAMING ? NULL : cfg->plan, oc, o, err);
  if (rc == RA_OK && (rc = ra_offload_seed(*o, cap, NULL, err)) != RA_OK) {
    ra_offload_free(*o);
    *o = NULL;
  }
  return rc;
}

static void record_output(const ra_tokenizer *tok, const ra_acc_sample *s, const int32_t *ids, int n,
                          ra_acc_mode_result *r) {
  char *text = NULL;
  size_t len;
  r->n_generated = n;
  r->output[0] = 0;
  if (ra_tok_decode(tok, ids, (size_t)n, &text, &len, NULL) == RA_OK) {
    snprintf(r->output, sizeof r->output, "%s", text);
    r->score = ra_acc_score(s, text);
    r->n_items = s->n_values;
    ra_acc_score_items(s, text, r->items);
    free(text);
  }
}

static void write_jsonl(FILE *f, const ra_acc_config *cfg, const ra_acc_sample *s, const ra_acc_record *rec) {
  fprintf(f, "{\"task\": \"%s\", \"length\": %d, \"n_tokens\": %d, \"depth\": %.4f, \"sample\": %d, \"seed\": %llu, "
             "\"needle_token\": %lld, \"prefill_s\": %.3f, \"expected\": [",
          ra_acc_task_name(rec->task), rec->length, rec->n_tokens, rec->depth, rec->sample,
          (unsigned long long)s->seed, (long long)s->needle_token, rec->prefill_s);
  for (int i = 0; i < s->n_values; i++) {
    if (i) fputs(", ", f);
    ra_json_write_str(f, s->values[i]);
  }
  fprintf(f, "], \"sequential\": %s, \"modes\": {", s->sequential ? "true" : "false");
  for (int i = 0; i < cfg->n_modes; i++) {
    const ra_acc_mode_result *r = &rec->modes[i];
    char label[RA_ACC_LABEL_MAX];
    fprintf(f, "%s\"%s\": {\"score\": %.4f, \"seed_s\": %.3f, \"decode_s\": %.3f, \"tokens\": %d, \"retro\": %u, "
               "\"retro_rows\": %llu, \"items\": [",
            i ? ", " : "", ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label), r->score, r->seed_s, r->decode_s,
            r->n_generated, cfg->retro[i], (unsigned long long)r->retro_rows);
    for (int k = 0; k < r->n_items; k++) fprintf(f, "%s%d", k ? ", " : "", r->items[k]);
    fputs("], \"output\": ", f);
    ra_json_write_str(f, r->output);
    fputc('}', f);
  }
  fputs("}}\n", f);
  fflush(f);
}

int ra_acc_run_sample(const ra_model *m, const ra_tokenizer *tok, const ra_acc_config *cfg, const ra_acc_sample *s,
                      ra_acc_record *rec, ra_error *err) {
  int64_t n = (int64_t)s->n_tokens;
  int max_new = s->answer_tokens;
  memset(rec, 0, sizeof *rec);
  rec->task = s->task;
  rec->length = s->target_len;
  rec->n_tokens = (int)n;
  rec->depth = s->depth;
  rec->needle_token = s->needle_token;
  int32_t *out = malloc((size_t)max_new * sizeof *out);
  ra_prefill_capture *cap = NULL;
  ra_state *st = NULL;
  int rc = out ? RA_OK : ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  /* the one prefill: full attention, captured */
  double t0 = ra_clock_now_s();
  if (rc == RA_OK) rc = ra_prefill_capture_new(m, n, cfg->off.build_queries, &cap, err);
  if (rc == RA_OK) rc = ra_state_new(m, n + max_new + 1, n, cfg->off.kv_dtype, &st, err);
  if (rc == RA_OK) rc = ra_prefill_capture_run(cap, st, s->tokens, err);
  rec->prefill_s = ra_clock_now_s() - t0;
  for (int i = 0; rc == RA_OK && i < cfg->n_modes; i++) {
    ra_acc_mode_result *r = &rec->modes[i];
    int n_out = 0;
    double td = ra_clock_now_s();
    if (cfg->modes[i] == RA_MODE_FULL) {
      rc = greedy(st, tok, full_step, st, max_new, out, &n_out, err);
    } else {
      offload_ctx oc_run = {0};
      ra_offload_config oc;
      rc = mode_open(m, cfg, i, cap, max_new, &oc, &oc_run.o, err);
      r->seed_s = ra_clock_now_s() - td;
      td = ra_clock_now_s();
      if (rc == RA_OK) {
        rc = greedy(ra_offload_state(oc_run.o), tok, offload_step, &oc_run, max_new, out, &n_out, err);
        ra_offload_free(oc_run.o);
        r->retro_rows = oc_run.retro_rows;
      }
    }
    char label[RA_ACC_LABEL_MAX];
    if (rc != RA_OK) ra_error_wrap(err, "mode %s", ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label));
    r->decode_s = ra_clock_now_s() - td;
    record_output(tok, s, out, n_out, r);
  }
  ra_state_free(st);
  ra_prefill_capture_free(cap);
  free(out);
  return rc;
}

void ra_acc_results_free(ra_acc_results *r) {
  free(r->recs);
  memset(r, 0, sizeof *r);
}

static int results_push(ra_acc_results *r, const ra_acc_record *rec, ra_error *err) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 64;
    ra_acc_record *g = realloc(r->recs, cap * sizeof *g);
    if (!g) return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
    r->recs = g;
    r->cap = cap;
  }
  r->recs[r->n++] = *rec;
  return RA_OK;
}

/* One line of samples.jsonl (write_jsonl) back into a record of cfg's axes and modes. */
static int read_record(const ra_json *o, const ra_acc_config *cfg, ra_acc_record *rec, ra_error *err) {
  const char *task;
  double v;
  memset(rec, 0, sizeof *rec);
  if (ra_json_get_str(o, "task", &task) || ra_acc_task_parse(task, &rec->task))
    return ra_errorf(err, RA_EFORMAT, "no known \"task\"");
  if (ra_json_get_num(o, "length", &v)) return ra_errorf(err, RA_EFORMAT, "no \"length\"");
  rec->length = (int)v;
  if (ra_json_get_num(o, "n_tokens", &v)) return ra_errorf(err, RA_EFORMAT, "no \"n_tokens\"");
  rec->n_tokens = (int)v;
  if (ra_json_get_num(o, "depth", &rec->depth)) return ra_errorf(err, RA_EFORMAT, "no \"depth\"");
  rec->depth_index = -1;
  for (int d = 0; d < cfg->n_depths && rec->depth >= 0; d++)
    if (fabs(cfg->depths[d] - rec->depth) < 1e-4) rec->depth_index = d;
  if (rec->depth < 0) rec->depth_index = 0;
  if (rec->depth_index < 0) return ra_errorf(err, RA_EINVAL, "depth %.4f is not one of --depths", rec->depth);
  if (!ra_json_get_num(o, "sample", &v)) rec->sample = (int)v;
  if (!ra_json_get_num(o, "needle_token", &v)) rec->needle_token = (int64_t)v;
  ra_json_get_num(o, "prefill_s", &rec->prefill_s);
  const ra_json *modes = ra_json_get(o, "modes");
  for (int i = 0; i < cfg->n_modes; i++) {
    char name[RA_ACC_LABEL_MAX];
    const char *outp = "";
    ra_acc_mode_label(cfg->modes[i], cfg->retro[i], name);
    const ra_json *mr = modes ? ra_json_get(modes, name) : NULL;
    ra_acc_mode_result *r = &rec->modes[i];
    if (!mr || ra_json_get_num(mr, "score", &r->score))
      return ra_errorf(err, RA_EINVAL, "no result of mode %s (--modes must be those of the run)", name);
    ra_json_get_num(mr, "seed_s", &r->seed_s);
    ra_json_get_num(mr, "decode_s", &r->decode_s);
    if (!ra_json_get_num(mr, "tokens", &v)) r->n_generated = (int)v;
    ra_json_get_str(mr, "output", &outp);
    snprintf(r->output, sizeof r->output, "%s", outp);
    if (!ra_json_get_num(mr, "retro_rows", &v)) r->retro_rows = (uint64_t)v;
    const ra_json *items = ra_json_get(mr, "items");
    for (size_t k = 0; items && items->type == RA_JSON_ARRAY && k < items->n && k < RA_ACC_MAX_VALUES; k++)
      r->items[r->n_items++] = items->items[k].num != 0;
  }
  return RA_OK;
}

int ra_acc_results_read(const char *path, const ra_acc_config *cfg, ra_acc_results *out, ra_error *err) {
  FILE *f = fopen(path, "r");
  if (!f) return ra_errorf(err, RA_EIO, "cannot read %s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int rc = RA_OK, no = 0;
  while (rc == RA_OK && (len = getline(&line, &cap, f)) > 0) {
    no++;
    ra_json *o = NULL;
    ra_acc_record rec;
    rc = ra_json_parse(line, (size_t)len, &o, err);
    if (rc == RA_OK) rc = read_record(o, cfg, &rec, err);
    if (rc == RA_OK) rc = results_push(out, &rec, err);
    if (rc) ra_error_wrap(err, "%s line %d", path, no);
    ra_json_free(o);
  }
  free(line);
  fclose(f);
  if (rc == RA_OK && no == 0) rc = ra_errorf(err, RA_EINVAL, "%s has no samples", path);
  return rc;
}

int ra_acc_run(const ra_model *m, const ra_tokenizer *tok, const ra_acc_corpus *corpus, const ra_acc_config *cfg,
               ra_acc_results *out, ra_error *err) {
  int rc = sweep_check(cfg, err);
  for (int ti = 0; rc == RA_OK && ti < cfg->n_tasks; ti++) {
    ra_acc_task task = cfg->tasks[ti];
    int n_depths = ra_acc_task_has_depth(task) ? cfg->n_depths : 1;
    for (int li = 0; rc == RA_OK && li < cfg->n_lengths; li++)
      for (int di = 0; rc == RA_OK && di < n_depths; di++)
        for (int k = 0; rc == RA_OK && k < cfg->samples; k++) {
          ra_acc_sample s;
          uint64_t seed = ra_acc_sample_seed(cfg->seed, task, cfg->lengths[li], di, k);
          double depth = ra_acc_task_has_depth(task) ? cfg->depths[di] : 0.5;
          rc = ra_acc_generate(tok, corpus, task, cfg->lengths[li], depth, seed, &s, err);
          if (rc != RA_OK) break;
          ra_acc_record rec;
          rc = ra_acc_run_sample(m, tok, cfg, &s, &rec, err);
          if (rc == RA_OK) {
            rec.depth_index = di;
            rec.sample = k;
            rc = results_push(out, &rec, err);
            if (cfg->jsonl) write_jsonl(cfg->jsonl, cfg, &s, &rec);
            if (cfg->log) {
              fprintf(cfg->log, "%-20s %5d tok depth %5.2f #%d  prefill %.1f s ", ra_acc_task_name(task), rec.n_tokens,
                      rec.depth, k, rec.prefill_s);
              char label[RA_ACC_LABEL_MAX];
              for (int i = 0; i < cfg->n_modes; i++)
                fprintf(cfg->log, " %s=%.2f", ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label),
                        rec.modes[i].score);
              fprintf(cfg->log, "  (full: \"%.40s\")\n", rec.modes[0].output);
              fflush(cfg->log);
            }
          }
          ra_acc_sample_free(&s);
        }
  }
  return rc;
}

/* ---------- text fidelity ---------- */

double ra_acc_kl_logits(const float *p_logits, const float *q_logits, int vocab, int *same_top1) {
  int ap = 0, aq = 0;
  double mp = p_logits[0], mq = q_logits[0], zp = 0, zq = 0, kl = 0;
  for (int v = 0; v < vocab; v++) {
    if (p_logits[v] > p_logits[ap]) ap = v;
    if (q_logits[v] > q_logits[aq]) aq = v;
    mp = fmax(mp, p_logits[v]);
    mq = fmax(mq, q_logits[v]);
  }
  for (int v = 0; v < vocab; v++) {
    zp += exp(p_logits[v] - mp);
    zq += exp(q_logits[v] - mq);
  }
  double lzp = log(zp), lzq = log(zq);
  for (int v = 0; v < vocab; v++) {
    double lp = p_logits[v] - mp - lzp, lq = q_logits[v] - mq - lzq;
    kl += exp(lp) * (lp - lq);
  }
  if (same_top1) *same_top1 = ap == aq;
  return kl;
}

/* The per-layer attention comparison during a mode's forced decode. */
typedef struct att_cmp {
  const float *full_att; /* [n_forced, n_layers, hq] */
  float *row;            /* [hq] */
  size_t hq;
  int n_layers, t;
  double *sum;           /* [n_layers] */
} att_cmp;

static int on_attn(void *ctx, ra_state *st, int layer, ra_error *err) {
  att_cmp *a = ctx;
  int rc = st->be->ops->download(st->be, &st->cur_att, 0, a->row, a->hq, err);
  if (rc) return rc;
  const float *f = a->full_att + ((size_t)a->t * (size_t)a->n_layers + (size_t)layer) * a->hq;
  double num = 0, den = 0;
  for (size_t i = 0; i < a->hq; i++) {
    num += ((double)a->row[i] - f[i]) * ((double)a->row[i] - f[i]);
    den += (double)f[i] * f[i];
  }
  a->sum[layer] += den > 0 ? sqrt(num / den) : 0;
  return RA_OK;
}

void ra_acc_fidelity_free(ra_acc_fidelity *f) {
  free(f->att_rel);
  f->att_rel = NULL;
}

int ra_acc_fidelity_run(const ra_model *m, const ra_acc_config *cfg, int32_t *ids, int n_prompt, int n_forced,
                        int self_forced, ra_acc_fidelity *out, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  ra_backend *be = m->be;
  size_t hq = (size_t)c->n_heads * (size_t)c->head_dim, vocab = (size_t)c->vocab, L = (size_t)c->n_layers;
  int rc = ra_acc_config_check(cfg, err);
  if (rc == RA_OK && (n_prompt < 1 || n_forced < 1))
    rc = ra_errorf(err, RA_EINVAL, "accuracy: fidelity over %d + %d tokens", n_prompt, n_forced);
  for (int i = 1; i < cfg->n_modes; i++)
    out[i - 1] = (ra_acc_fidelity){.mode = cfg->modes[i], .retro = cfg->retro[i], .n_layers = c->n_layers};
  if (rc) return rc;
  float *full_att = malloc((size_t)n_forced * L * hq * sizeof(float));
  float *full_lg = malloc((size_t)n_forced * vocab * sizeof(float)), *lg = malloc(vocab * sizeof(float));
  float *row = malloc(hq * sizeof(float));
  ra_prefill_capture *cap = NULL;
  ra_state *st = NULL;
  if (!full_att || !full_lg || !lg || !row) rc = ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  if (rc == RA_OK) rc = ra_prefill_capture_new(m, n_prompt, cfg->off.build_queries, &cap, err);
  if (rc == RA_OK) rc = ra_state_new(m, n_prompt + n_forced + 1, n_prompt, cfg->off.kv_dtype, &st, err);
  if (rc == RA_OK) rc = ra_prefill_capture_run(cap, st, ids, err);
  if (rc == RA_OK && self_forced) rc = argmax_last(st, &ids[n_prompt], err);
  /* full attention, one forced token per step, keeping every layer's attention output */
  for (int t = 0; rc == RA_OK && t < n_forced; t++) {
    rc = ra_step_begin(st, &ids[n_prompt + t], 1, err);
    for (int l = 0; rc == RA_OK && l < c->n_layers; l++) {
      rc = ra_step_layer_qkv(st, l, err);
      if (rc == RA_OK) rc = ra_step_layer_attend(st, l, err);
      if (rc == RA_OK) rc = be->ops->download(be, &st->cur_att, 0, full_att + ((size_t)t * L + (size_t)l) * hq, hq, err);
      if (rc == RA_OK) rc = ra_step_layer_finish(st, l, err);
    }
    if (rc == RA_OK) rc = ra_step_end(st, 0, err);
    if (rc == RA_OK) rc = be->ops->download(be, &st->logits, 0, full_lg + (size_t)t * vocab, vocab, err);
    if (rc == RA_OK && self_forced && t + 1 < n_forced) rc = argmax_last(st, &ids[n_prompt + t + 1], err);
  }
  for (int i = 1; rc == RA_OK && i < cfg->n_modes; i++) {
    ra_acc_fidelity *f = &out[i - 1];
    f->att_rel = calloc(L, sizeof(double));
    if (!f->att_rel) {
      rc = ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
      break;
    }
    att_cmp a = {.full_att = full_att, .row = row, .hq = hq, .n_layers = c->n_layers, .sum = f->att_rel};
    ra_acc_config mc = *cfg;
    mc.off.on_attn = on_attn;
    mc.off.attn_ctx = &a;
    ra_offload *o;
    ra_offload_config oc;
    rc = mode_open(m, &mc, i, cap, n_forced, &oc, &o, err);
    if (rc) break;
    ra_state *ms = ra_offload_state(o);
    int same = 0;
    for (int t = 0; rc == RA_OK && t < n_forced; t++) {
      a.t = t;
      rc = ra_offload_decode(o, ids[n_prompt + t], NULL, err);
      if (rc == RA_OK) rc = be->ops->download(be, &ms->logits, 0, lg, vocab, err);
      if (rc == RA_OK) {
        int s1;
        f->kl_mean += ra_acc_kl_logits(full_lg + (size_t)t * vocab, lg, (int)vocab, &s1) / n_forced;
        same += s1;
        f->positions++;
      }
    }
    ra_offload_free(o);
    f->top1 = f->positions ? (double)same / f->positions : 0;
    for (size_t l = 0; l < L; l++) f->att_rel[l] /= n_forced;
  }
  ra_state_free(st);
  ra_prefill_capture_free(cap);
  free(full_att);
  free(full_lg);
  free(lg);
  free(row);
  return rc;
}

int ra_acc_fidelity_read(const char *path, const ra_acc_config *cfg, int n_layers, ra_acc_fidelity *out,
                         uint32_t *prompt, uint32_t *forced, ra_error *err) {
  FILE *f = fopen(path, "r");
  if (!f) return ra_errorf(err, RA_EIO, "cannot read %s: %s", path, strerror(errno));
  char *text = NULL;
  size_t cap = 0, len = 0, got;
  char buf[65536];
  int rc = RA_OK;
  while (rc == RA_OK && (got = fread(buf, 1, sizeof buf, f)) > 0) {
    if (len + got + 1 > cap) {
      size_t ncap = 2 * (len + got + 1);
      char *t = realloc(text, ncap);
      if (!t) rc = ra_errorf(err, RA_ENOMEM, "out of memory reading %s", path);
      else {
        text = t;
        cap = ncap;
      }
    }
    if (rc == RA_OK) {
      memcpy(text + len, buf, got);
      len += got;
    }
  }
  fclose(f);
  ra_json *root = NULL;
  if (rc == RA_OK) rc = ra_json_parse(text ? text : "", len, &root, err);
  free(text);
  if (rc == RA_OK && root->type != RA_JSON_ARRAY) rc = ra_errorf(err, RA_EFORMAT, "not a JSON array");
  for (int i = 1; rc == RA_OK && i < cfg->n_modes; i++) {
    char name[RA_ACC_LABEL_MAX];
    ra_acc_mode_label(cfg->modes[i], cfg->retro[i], name);
    const ra_json *e = NULL;
    for (size_t j = 0; j < root->n && !e; j++) {
      const char *m;
      if (!ra_json_get_str(&root->items[j], "mode", &m) && strcmp(m, name) == 0) e = &root->items[j];
    }
    const ra_json *att = e ? ra_json_get(e, "att_rel") : NULL;
    double p, fo, t1, kl;
    if (!e || ra_json_get_num(e, "prompt", &p) || ra_json_get_num(e, "forced", &fo) ||
        ra_json_get_num(e, "top1", &t1) || ra_json_get_num(e, "kl_mean", &kl) || !att ||
        att->type != RA_JSON_ARRAY) {
      rc = ra_errorf(err, RA_EINVAL, "no complete entry for mode %s", name);
      break;
    }
    if (att->n != (size_t)n_layers) {
      rc = ra_errorf(err, RA_EINVAL, "mode %s: %zu layers of attention error, the model has %d", name, att->n,
                     n_layers);
      break;
    }
    ra_acc_fidelity *fd = &out[i - 1];
    *fd = (ra_acc_fidelity){.mode = cfg->modes[i], .retro = cfg->retro[i], .positions = (int)fo, .top1 = t1,
                            .kl_mean = kl, .n_layers = n_layers};
    if (!(fd->att_rel = malloc((size_t)n_layers * sizeof(double)))) {
      rc = ra_errorf(err, RA_ENOMEM, "out of memory");
      break;
    }
    for (int l = 0; l < n_layers; l++) fd->att_rel[l] = att->items[l].num;
    *prompt = (uint32_t)p;
    *forced = (uint32_t)fo;
  }
  ra_json_free(root);
  if (rc) ra_error_wrap(err, "%s", path);
  return rc;
}
