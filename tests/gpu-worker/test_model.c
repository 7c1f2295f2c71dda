/* Forward pass on tiny random models: KV-cached decode equals full recompute, chunked prefill
 * equals one pass, so does a step whose layers run in row chunks, the per-layer API with merged partial attention equals local attention,
 * and a safetensors export of a model loads back to the same logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "model.h"

#include "cpu_fixture.h"

static ra_model *tiny(int qwen_style) {
  ra_model_config c;
  assert_int_equal(ra_model_config_preset("tiny", &c, NULL), RA_OK);
  if (qwen_style) {
    c.qkv_bias = 1;
    c.rope_style = RA_ROPE_NEOX;
    c.n_heads = 6; /* group of 3 */
    c.n_kv_heads = 2;
  }
  ra_model *m;
  ra_error err;
  if (ra_model_random(be, &c, 42, &m, &err) != RA_OK) fail_msg("%s", err.msg);
  return m;
}

#define N_TOK 40
static const int32_t toks[N_TOK] = {5, 17, 3, 96, 44, 0, 12, 12, 80, 7, 33, 61, 2, 9, 90, 18, 27, 64, 70, 1,
                                    8, 55, 23, 43, 11, 6, 38, 77, 4, 50, 31, 19, 88, 66, 13, 29, 41, 72, 58, 35};

static float *all_logits(ra_model *m, int64_t n, ra_dtype kv) {
  ra_state *st;
  ra_error err;
  assert_int_equal(ra_state_new(m, n, n, kv, &st, &err), RA_OK);
  if (ra_model_forward(st, toks, n, 1, NULL, &err) != RA_OK) fail_msg("%s", err.msg);
  size_t sz = (size_t)n * (size_t)m->cfg.vocab;
  float *h = malloc(sz * sizeof(float));
  assert_int_equal(be->ops->download(be, &st->logits, 0, h, sz, NULL), RA_OK);
  ra_state_free(st);
  return h;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
  return d;
}

static void check_decode_equals_recompute(int qwen_style) {
  ra_model *m = tiny(qwen_style);
  int V = m->cfg.vocab;
  float *full = all_logits(m, N_TOK, RA_DTYPE_F32);
  /* one token at a time through the KV cache */
  ra_state *st;
  assert_int_equal(ra_state_new(m, N_TOK, 4, RA_DTYPE_F32, &st, NULL), RA_OK);
  float *row = malloc(sizeof(float) * (size_t)V);
  for (int i = 0; i < N_TOK; i++) {
    assert_int_equal(ra_model_forward(st, &toks[i], 1, 0, NULL, NULL), RA_OK);
    assert_int_equal(be->ops->download(be, &st->logits, 0, row, (size_t)V, NULL), RA_OK);
    float d = max_abs_diff(row, full + (size_t)i * (size_t)V, (size_t)V);
    if (d > 1e-4f) fail_msg("position %d: decode differs from recompute by %g", i, d);
  }
  /* chunked prefill (chunks of 4) gives the same last logits */
  ra_state_reset(st);
  assert_int_equal(ra_model_forward(st, toks, N_TOK, 0, NULL, NULL), RA_OK);
  assert_int_equal(be->ops->download(be, &st->logits, 0, row, (size_t)V, NULL), RA_OK);
  assert_true(max_abs_diff(row, full + (size_t)(N_TOK - 1) * (size_t)V, (size_t)V) < 1e-4f);
  /* the context is full now: one more token is an error, not an overflow */
  ra_error err;
  assert_int_equal(ra_model_forward(st, toks, 1, 0, NULL, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "context full"));
  free(row);
  free(full);
  ra_state_free(st);
  ra_model_free(m);
}

static void test_decode_equals_recompute_llama(void **state) {
  (void)state;
  check_decode_equals_recompute(0);
}

static void test_decode_equals_recompute_qwen2_style(void **state) {
  (void)state;
  check_decode_equals_recompute(1);
}

/* A forward over toks on st gives the logits of a fresh state of m (all of them). */
static void assert_logits_of_fresh_state(ra_model *m, ra_state *st) {
  const size_t V = (size_t)m->cfg.vocab;
  float *want = all_logits(m, N_TOK, RA_DTYPE_F32), *got = malloc(N_TOK * V * sizeof *got);
  assert_int_equal(ra_model_forward(st, toks, N_TOK, 1, NULL, NULL), RA_OK);
  assert_int_equal(be->ops->download(be, &st->logits, 0, got, N_TOK * V, NULL), RA_OK);
  assert_true(max_abs_diff(got, want, N_TOK * V) < 1e-5f);
  free(want);
  free(got);
}

/* The MLP in passes of fewer rows than the step (a long offloaded prefill) gives the logits of
 * one pass; a pass count outside [1, batch] is refused. */
static void test_ffn_in_row_passes(void **state) {
  (void)state;
  ra_model *m = tiny(0);
  ra_state *st;
  ra_error err;
  assert_int_equal(ra_state_new(m, N_TOK, N_TOK, RA_DTYPE_F32, &st, &err), RA_OK);
  assert_int_equal(st->ffn_rows, N_TOK);
  assert_int_equal(ra_state_set_ffn_rows(st, 7, &err), RA_OK);
  assert_logits_of_fresh_state(m, st);
  assert_int_equal(ra_state_set_ffn_rows(st, 0, &err), RA_EINVAL);
  assert_int_equal(ra_state_set_ffn_rows(st, N_TOK + 1, &err), RA_EINVAL);
  ra_state_free(st);
  ra_model_free(m);
}

/* A state shrunk to decode-sized steps refuses a longer step with a clear error, and grown
 * back it computes the logits of a state that never changed; bad sizes leave it as it was. */
static void test_set_max_batch(void **state) {
  (void)state;
  ra_model *m = tiny(0);
  ra_state *st;
  ra_error err;
  assert_int_equal(ra_state_new(m, N_TOK, N_TOK, RA_DTYPE_F32, &st, &err), RA_OK);
  assert_int_equal(ra_state_set_max_batch(st, 2, 1, &err), RA_OK);
  assert_int_equal(st->max_batch, 2);
  assert_int_equal(st->x.shape[0], 2);
  assert_int_equal(st->gate.shape[0], 1);
  assert_int_equal(ra_step_begin(st, toks, 3, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "step of 3 tokens"));
  assert_int_equal(ra_state_set_max_batch(st, 0, 1, &err), RA_EINVAL);
  assert_int_equal(ra_state_set_max_batch(st, 2, 3, &err), RA_EINVAL);
  assert_int_equal(ra_state_set_max_batch(st, N_TOK + 1, 1, &err), RA_EINVAL);
  assert_int_equal(st->max_batch, 2);
  assert_int_equal(ra_state_set_max_batch(st, N_TOK, N_TOK, &err), RA_OK);
  assert_logits_of_fresh_state(m, st);
  ra_state_free(st);
  ra_model_free(m);
}

/* A step whose layers run in row chunks (ra_step_rows: 13 rows, then 1, then the rest; the
 * chunks ending within the MLP's 7-row passes) gives every logit of the whole step; rows
 * outside the step, or a part of a step whose ring wraps, are refused, and ra_step_end returns
 * to the whole step by itself. */
static void test_layer_in_row_chunks(void **state) {
  (void)state;
  ra_model *m = tiny(0);
  const size_t V = (size_t)m->cfg.vocab;
  ra_state *st;
  ra_error err;
  assert_int_equal(ra_state_new(m, N_TOK, N_TOK, RA_DTYPE_F32, &st, &err), RA_OK);
  assert_int_equal(ra_state_set_ffn_rows(st, 7, &err), RA_OK);
  assert_int_equal(ra_step_begin(st, toks, N_TOK, &err), RA_OK);
  assert_int_equal(ra_step_rows(st, 30, 11, &err), RA_EINVAL);
  assert_int_equal(ra_step_rows(st, 0, 0, &err), RA_EINVAL);
  assert_int_equal(ra_step_rows(st, -1, 2, &err), RA_EINVAL);
  /* a step whose ring wraps (a caller keeping a ring sets wrap_at) runs whole */
  st->wrap_at = 5;
  assert_int_equal(ra_step_rows(st, 0, 3, &err), RA_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "wraps"));
  assert_int_equal(ra_step_rows(st, 0, N_TOK, &err), RA_OK);
  st->wrap_at = 0;
  const int64_t cuts[] = {0, 13, 14, N_TOK};
  for (int l = 0; l < m->cfg.n_layers; l++)
    for (int c = 0; c < 3; c++) {
      assert_int_equal(ra_step_rows(st, cuts[c], cuts[c + 1] - cuts[c], &err), RA_OK);
      assert_int_equal(st->pos, cuts[c]);
      assert_int_equal(st->n, cuts[c + 1] - cuts[c]);
      if (ra_step_layer_qkv(st, l, &err) || ra_step_layer_attend(st, l, &err) || ra_step_layer_finish(st, l, &err))
        fail_msg("layer %d rows %lld..: %s", l, (long long)cuts[c], err.msg);
    }
  assert_int_equal(ra_step_end(st, 1, &err), RA_OK);
  assert_int_equal(st->pos, N_TOK);
  assert_int_equal(st->n_logits, N_TOK);
  float *want = all_logits(m, N_TOK, RA_DTYPE_F32), *got = malloc(N_TOK * V * sizeof *got);
  assert_int_equal(be->ops->download(be, &st->logits, 0, got, N_TOK * V, NULL), RA_OK);
  assert_true(max_abs_diff(got, want, N_TOK * V) < 1e-5f);
  free(want);
  free(got);
  ra_state_free(st);
  ra_model_free(m);
}

/* Drives one decode step layer by layer, replacing local attention by three partials
 * (sink [0,S), middle, window [n-W, n)) merged with attn_merge, as the distributed mode does. */
static void test_layer_api_with_merged_partials(void **state) {
  (void)state;
  ra_model *m = tiny(0);
  const ra_model_config *c = &m->cfg;
  int V = c->vocab;
  float *full = all_logits(m, N_TOK, RA_DTYPE_F32);
  ra_state *st;
  assert_int_equal(ra_state_new(m, N_TOK, 16, RA_DTYPE_F32, &st, NULL), RA_OK);
  assert_int_equal(ra_model_forward(st, toks, N_TOK - 1, 0, NULL, NULL), RA_OK);
  ra_tensor o2, ml2;
  assert_int_equal(ra_tensor_new(be, &o2, RA_DTYPE_F32, 2, (int64_t[]){c->n_heads, c->head_dim}, NULL), RA_OK);
  assert_int_equal(ra_tensor_new(be, &ml2, RA_DTYPE_F32, 2, (int64_t[]){c->n_heads, 2}, NULL), RA_OK);
  float scale = 1.0f / sqrtf((float)c->head_dim);
  assert_int_equal(ra_step_begin(st, &toks[N_TOK - 1], 1, NULL), RA_OK);
  int64_t n = st->pos + 1;
  for (int l = 0; l < c->n_layers; l++) {
    assert_int_equal(ra_step_layer_qkv(st, l, NULL), RA_OK);
    ra_token_range sink_window[2] = {{0, 4}, {n - 8, n}}, middle = {4, n - 8};
    assert_int_equal(be->ops->attn_decode(be, &st->cur_q, &st->k_cache[l], &st->v_cache[l], sink_window, 2, scale,
                                          &st->cur_att, &st->dec_ml, NULL),
                     RA_OK);
    assert_int_equal(be->ops->attn_decode(be, &st->cur_q, &st->k_cache[l], &st->v_cache[l], &middle, 1, scale, &o2,
                                          &ml2, NULL),
                     RA_OK);
    assert_int_equal(be->ops->attn_merge(be, &st->cur_att, &st->dec_ml, &o2, &ml2, NULL), RA_OK);
    assert_int_equal(ra_step_layer_finish(st, l, NULL), RA_OK);
  }
  assert_int_equal(ra_step_end(st, 0, NULL), RA_OK);
  float *row = malloc(sizeof(float) * (size_t)V);
  assert_int_equal(be->ops->download(be, &st->logits, 0, row, (size_t)V, NULL), RA_OK);
  assert_true(max_abs_diff(row, full + (size_t)(N_TOK - 1) * (size_t)V, (size_t)V) < 1e-4f);
  free(row);
  free(full);
  ra_tensor_free(&o2);
  ra_tensor_free(&ml2);
  ra_state_free(st);
  ra_model_free(m);
}

static void test_f16_cache_and_determinism(void **state) {
  (void)state;
  ra_model *a = tiny(0), *b = tiny(0);
  size_t sz = (size_t)N_TOK * (size_t)a->cfg.vocab;
  float *la = all_logits(a, N_TOK, RA_DTYPE_F32), *lb = all_logits(b, N_TOK, RA_DTYPE_F32);
  assert_memory_equal(la, lb, sz * sizeof(float)); /* same seed, same model */
  float *lh = all_logits(a, N_TOK, RA_DTYPE_F16);
  float d = max_abs_diff(la, lh, sz);
  assert_true(d > 0.0f && d < 2e-2f);
  free(la), free(lb), free(lh);
  ra_model_free(a);
  ra_model_free(b);
}

/* ---- safetensors export of a random NEOX model, then load it back ---- */

static void write_st(const char *path, ra_model *m) {
  const ra_model_config *c = &m->cfg;
  typedef struct { char name[96]; const ra_tensor *t; } entry;
  entry e[3 + 12 * 8];
  int n = 0;
#define ADD(nm, tt) do { snprintf(e[n].name, sizeof e[n].name, "%s", nm); e[n].t = (tt); n++; } while (0)
  ADD("model.embed_tokens.weight", &m->tok_embd);
  ADD("model.norm.weight", &m->out_norm);
  ADD("lm_head.weight", &m->output);
  static const char *ln[] = {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                             "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  for (int l = 0; l < c->n_layers; l++) {
    const ra_layer_weights *w = &m->layers[l];
    const ra_tensor *lt[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
    for (int i = 0; i < 9; i++) {
      char nm[96];
      snprintf(nm, sizeof nm, "model.layers.%d.%s", l, ln[i]);
      ADD(nm, lt[i]);
    }
  }
#undef ADD
  char *hdr = malloc(65536);
  size_t h = 0, off = 0;
  h += (size_t)sprintf(hdr + h, "{\"__metadata__\": {\"format\": \"pt\"}");
  for (int i = 0; i < n; i++) {
    size_t bytes = ra_tensor_nelem(e[i].t) * 4;
    int is_vec = e[i].t->shape[0] == 1;
    if (is_vec)
      h += (size_t)sprintf(hdr + h, ", \"%s\": {\"dtype\": \"F32\", \"shape\": [%lld], \"data_offsets\": [%zu, %zu]}",
                           e[i].name, (long long)e[i].t->shape[1], off, off + bytes);
    else
      h += (size_t)sprintf(hdr + h, ", \"%s\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%zu, %zu]}",
                           e[i].name, (long long)e[i].t->shape[0], (long long)e[i].t->shape[1], off, off + bytes);
    off += bytes;
  }
  h += (size_t)sprintf(hdr + h, "}");
  FILE *f = fopen(path, "wb");
  uint64_t hl = h;
  fwrite(&hl, 8, 1, f);
  fwrite(hdr, 1, h, f);
  for (int i = 0; i < n; i++) {
    size_t cnt = ra_tensor_nelem(e[i].t);
    float *buf = malloc(cnt * sizeof(float));
    be->ops->download(be, e[i].t, 0, buf, cnt, NULL);
    fwrite(buf, 4, cnt, f);
    free(buf);
  }
  fclose(f);
  free(hdr);
}

static void test_safetensors_roundtrip(void **state) {
  (void)state;
  ra_model_config c;
  assert_int_equal(ra_model_config_preset("tiny", &c, NULL), RA_OK);
  c.rope_style = RA_ROPE_NEOX; /* HF checkpoints are rotate-half */
  c.rope_theta = 10000.0f;
  ra_model *m;
  assert_int_equal(ra_model_random(be, &c, 9, &m, NULL), RA_OK);
  char dir[] = "/tmp/ra_st_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  write_st(path, m);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  fprintf(f,
          "{\"model_type\": \"llama\", \"hidden_size\": %d, \"intermediate_size\": %d, \"num_attention_heads\": %d,\n"
          " \"num_key_value_heads\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-05,\n"
          " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}\n",
          c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.n_layers, c.vocab);
  fclose(f);
  ra_model *m2;
  ra_error err;
  if (ra_model_load_safetensors(be, dir, &m2, &err) != RA_OK) fail_msg("%s", err.msg);
  assert_int_equal(m2->cfg.rope_style, RA_ROPE_NEOX);
  size_t sz = (size_t)N_TOK * (size_t)c.vocab;
  float *a = all_logits(m, N_TOK, RA_DTYPE_F32), *b = all_logits(m2, N_TOK, RA_DTYPE_F32);
  assert_true(max_abs_diff(a, b, sz) < 1e-5f);
  /* a truncated file is rejected with a reason */
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  struct stat sb;
  stat(path, &sb);
  assert_int_equal(truncate(path, sb.st_size - 100), 0);
  ra_model *m3;
  assert_int_equal(ra_model_load_safetensors(be, dir, &m3, &err), RA_EFORMAT);
  assert_non_null(strstr(err.msg, "outside the file"));
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
  free(a), free(b);
  ra_model_free(m);
  ra_model_free(m2);
}

/* Weight conversion: every matrix becomes BF16 holding the rounded F32 values, vectors stay F32.
 * The CPU backend widens BF16 tables and weights (get_rows, matmul), so the BF16 model computes
 * exactly what the same values do in F32. */
static void test_convert_weights(void **state) {
  (void)state;
  ra_model *m = tiny(0);
  ra_error err;
  const ra_tensor *wq = &m->layers[1].wq;
  size_t n = ra_tensor_nelem(wq);
  float *before = malloc(n * sizeof(float)), *after = malloc(n * sizeof(float));
  assert_int_equal(be->ops->download(be, wq, 0, before, n, NULL), RA_OK);
  assert_int_equal(ra_model_convert_weights(m, RA_DTYPE_BF16, &err), RA_OK);
  assert_int_equal(m->layers[1].wq.dtype, RA_DTYPE_BF16);
  assert_int_equal(m->layers[0].w_down.dtype, RA_DTYPE_BF16);
  assert_int_equal(m->tok_embd.dtype, RA_DTYPE_BF16);
  assert_int_equal(m->layers[0].attn_norm.dtype, RA_DTYPE_F32);
  assert_int_equal(m->out_norm.dtype, RA_DTYPE_F32);
  assert_int_equal(be->ops->download(be, &m->layers[1].wq, 0, after, n, NULL), RA_OK);
  for (size_t i = 0; i < n; i++) assert_true(after[i] == ra_bf16_to_fp32(ra_fp32_to_bf16(before[i])));
  ra_model *wide = tiny(0);
  assert_int_equal(ra_model_convert_weights(wide, RA_DTYPE_BF16, &err), RA_OK);
  assert_int_equal(ra_model_convert_weights(wide, RA_DTYPE_F32, &err), RA_OK);
  assert_int_equal(wide->tok_embd.dtype, RA_DTYPE_F32);
  assert_int_equal(wide->layers[1].wq.dtype, RA_DTYPE_F32);
  float *lb = all_logits(m, N_TOK, RA_DTYPE_F32), *lw = all_logits(wide, N_TOK, RA_DTYPE_F32);
  assert_memory_equal(lb, lw, (size_t)N_TOK * (size_t)m->cfg.vocab * sizeof(float));
  free(before), free(after), free(lb), free(lw);
  ra_model_free(m);
  ra_model_free(wide);
}

/* "NAME:LAYERS" keeps the preset's geometry with fewer layers; bad counts and names are refused
 * with a message. */
static void test_preset_layers(void **state) {
  (void)state;
  ra_model_config full, cut;
  ra_error err;
  assert_int_equal(ra_model_config_preset("yi-6b", &full, &err), RA_OK);
  assert_int_equal(ra_model_config_preset("yi-6b:8", &cut, &err), RA_OK);
  assert_int_equal(cut.n_layers, 8);
  assert_int_equal(full.n_layers, 32);
  assert_int_equal(cut.n_kv_heads, full.n_kv_heads);
  assert_int_equal(cut.head_dim, full.head_dim);
  assert_int_equal(cut.ffn_dim, full.ffn_dim);
  assert_string_equal(cut.name, "random-yi-6b-8L");
  assert_int_equal(ra_model_config_preset("yi-6b:33", &cut, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "has 32 layers, not 33"));
  const char *bad[] = {"yi-6b:0", "yi-6b:", "yi-6b:8x", "yi-6b:-2"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(ra_model_config_preset(bad[i], &cut, &err), RA_EINVAL);
    assert_non_null(strstr(err.msg, "is not a number in [1, 1024]"));
  }
  assert_int_equal(ra_model_config_preset("gpt-5:2", &cut, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "unknown preset 'gpt-5'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_convert_weights),
      cmocka_unit_test(test_decode_equals_recompute_llama),
      cmocka_unit_test(test_ffn_in_row_passes),
      cmocka_unit_test(test_set_max_batch),
      cmocka_unit_test(test_layer_in_row_chunks),
      cmocka_unit_test(test_decode_equals_recompute_qwen2_style),
      cmocka_unit_test(test_layer_api_with_merged_partials),
      cmocka_unit_test(test_f16_cache_and_determinism),
      cmocka_unit_test(test_safetensors_roundtrip),
      cmocka_unit_test(test_preset_layers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
