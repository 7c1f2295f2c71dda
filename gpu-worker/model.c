#include "model.h"

#include "json.h"
#include "log.h"
#include "quant.h"
#include "safetensors.h"
#include "tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- config ---------- */

int ra_model_config_validate(const ra_model_config *c, ra_error *err) {
  if (c->n_layers < 1 || c->n_layers > 1024) return ra_errorf(err, RA_EINVAL, "model: %d layers", c->n_layers);
  if (c->dim < 1 || c->dim > 65536 || c->ffn_dim < 1 || c->ffn_dim > 262144)
    return ra_errorf(err, RA_EINVAL, "model: hidden %d / ffn %d out of range", c->dim, c->ffn_dim);
  if (c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0 || c->n_heads > 1024)
    return ra_errorf(err, RA_EINVAL, "model: %d q heads do not group over %d kv heads", c->n_heads, c->n_kv_heads);
  if (c->head_dim < 2 || c->head_dim > 1024 || c->head_dim % 2)
    return ra_errorf(err, RA_EINVAL, "model: head_dim %d (even, <= 1024)", c->head_dim);
  if (c->n_rot < 2 || c->n_rot > c->head_dim || c->n_rot % 2)
    return ra_errorf(err, RA_EINVAL, "model: rope dims %d for head_dim %d", c->n_rot, c->head_dim);
  if (c->vocab < 1 || c->vocab > (1 << 24)) return ra_errorf(err, RA_EINVAL, "model: vocab %d", c->vocab);
  if (!(c->rope_theta > 0) || !(c->norm_eps > 0) || !(c->norm_eps < 1))
    return ra_errorf(err, RA_EINVAL, "model: rope theta %g / norm eps %g", c->rope_theta, c->norm_eps);
  return RA_OK;
}

int ra_model_config_preset(const char *spec, ra_model_config *c, ra_error *err) {
  /* NAME or NAME:LAYERS, the preset's first LAYERS layers: a benchmark that must fit a time
   * budget (a million-token index build of all 32 layers outlasts a 10-minute device call)
   * keeps the per-layer geometry, which is what a decode step's per-layer work depends on. */
  char name[32];
  int n_layers = 0;
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  if (len >= sizeof name) return ra_errorf(err, RA_EINVAL, "model: unknown preset '%s'", spec);
  memcpy(name, spec, len);
  name[len] = '\0';
  if (colon) {
    char *end;
    long v = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || v < 1 || v > 1024)
      return ra_errorf(err, RA_EINVAL, "model: preset '%s': layers '%s' is not a number in [1, 1024]", spec,
                       colon + 1);
    n_layers = (int)v;
  }
  if (strcmp(name, "llama3-8b") == 0) {
    *c = (ra_model_config){.n_layers = 32, .dim = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                           .ffn_dim = 14336, .vocab = 128256, .n_rot = 128, .rope_theta = 500000.0f,
                           .norm_eps = 1e-5f, .max_ctx = 131072, .rope_style = RA_ROPE_NEOX};
  } else if (strcmp(name, "llama3-70b") == 0) {
    /* bf16 weights ~140 GB: tensor-parallel over several devices (gpu-worker/tp.h) */
    *c = (ra_model_config){.n_layers = 80, .dim = 8192, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
                           .ffn_dim = 28672, .vocab = 128256, .n_rot = 128, .rope_theta = 500000.0f,
                           .norm_eps = 1e-5f, .max_ctx = 131072, .rope_style = RA_ROPE_NEOX};
  } else if (strcmp(name, "yi-6b") == 0) {
    /* Yi-6B-200K's geometry (4 kv heads: a million tokens of KV fit one host's RAM) with
     * Llama-3's vocabulary, so that the Llama-3 tokenizer's ids are valid */
    *c = (ra_model_config){.n_layers = 32, .dim = 4096, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128,
                           .ffn_dim = 11008, .vocab = 128256, .n_rot = 128, .rope_theta = 5000000.0f,
                           .norm_eps = 1e-5f, .max_ctx = 200000, .rope_style = RA_ROPE_NEOX};
  } else if (strcmp(name, "smollm2-135m") == 0) {
    *c = (ra_model_config){.n_layers = 30, .dim = 576, .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .ffn_dim = 1536,
                           .vocab = 49152, .n_rot = 64, .rope_theta = 100000.0f, .norm_eps = 1e-5f, .max_ctx = 8192,
                           .rope_style = RA_ROPE_NORM, .tied_embeddings = 1};
  } else if (strcmp(name, "tiny") == 0) {
    *c = (ra_model_config){.n_layers = 2, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .ffn_dim = 96,
                           .vocab = 97, .n_rot = 16, .rope_theta = 10000.0f, .norm_eps = 1e-5f, .max_ctx = 4096,
                           .rope_style = RA_ROPE_NORM};
  } else {
    return ra_errorf(err, RA_EINVAL, "model: unknown preset '%s' (llama3-8b, llama3-70b, yi-6b, smollm2-135m, tiny)", name);
  }
  if (n_layers > c->n_layers)
    return ra_errorf(err, RA_EINVAL, "model: preset '%s' has %d layers, not %d", name, c->n_layers, n_layers);
  strcpy(c->arch, "llama");
  if (n_layers) {
    c->n_layers = n_layers;
    snprintf(c->name, sizeof c->name, "random-%s-%dL", name, n_layers);
  } else {
    snprintf(c->name, sizeof c->name, "random-%s", name);
  }
  return RA_OK;
}

/* Reads "<arch>.<suffix>" as u32; absent keys keep *out when optional. */
static int arch_u32(const ra_gguf *g, const char *arch, const char *suffix, int optional, int *out, ra_error *err) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  uint32_t v;
  int rc = ra_gguf_get_u32(g, key, &v, err);
  if (rc == RA_ENOTFOUND && optional) return RA_OK;
  if (rc) return rc;
  if (v > INT32_MAX) return ra_errorf(err, RA_EFORMAT, "gguf: %s = %u is too large", key, v);
  *out = (int)v;
  return RA_OK;
}

static int arch_f32(const ra_gguf *g, const char *arch, const char *suffix, float *out, ra_error *err) {
  char key[128];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int rc = ra_gguf_get_f32(g, key, out, err);
  return rc == RA_ENOTFOUND ? RA_OK : rc;
}

int ra_model_config_from_gguf(const ra_gguf *g, ra_model_config *c, ra_error *err) {
  memset(c, 0, sizeof(*c));
  ra_gguf_str s;
  int rc = ra_gguf_get_str(g, "general.architecture", &s, err);
  if (rc) return rc;
  if (s.len >= sizeof c->arch) return ra_errorf(err, RA_EFORMAT, "gguf: architecture name too long");
  memcpy(c->arch, s.ptr, s.len);
  int is_llama = strcmp(c->arch, "llama") == 0, is_qwen2 = strcmp(c->arch, "qwen2") == 0;
  if (!is_llama && !is_qwen2)
    return ra_errorf(err, RA_EUNSUPPORTED, "gguf: architecture '%s' is not supported (llama, qwen2)", c->arch);
  if (ra_gguf_get_str(g, "general.name", &s, NULL) == RA_OK)
    snprintf(c->name, sizeof c->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
  c->rope_theta = 10000.0f;
  c->norm_eps = 1e-5f;
  c->max_ctx = 4096;
  if ((rc = arch_u32(g, c->arch, "block_count", 0, &c->n_layers, err)) ||
      (rc = arch_u32(g, c->arch, "embedding_length", 0, &c->dim, err)) ||
      (rc = arch_u32(g, c->arch, "feed_forward_length", 0, &c->ffn_dim, err)) ||
      (rc = arch_u32(g, c->arch, "attention.head_count", 0, &c->n_heads, err)) ||
      (rc = arch_u32(g, c->arch, "context_length", 1, &c->max_ctx, err)) ||
      (rc = arch_f32(g, c->arch, "rope.freq_base", &c->rope_theta, err)) ||
      (rc = arch_f32(g, c->arch, "attention.layer_norm_rms_epsilon", &c->norm_eps, err)))
    return rc;
  c->n_kv_heads = c->n_heads;
  if ((rc = arch_u32(g, c->arch, "attention.head_count_kv", 1, &c->n_kv_heads, err))) return rc;
  c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
  if ((rc = arch_u32(g, c->arch, "attention.key_length", 1, &c->head_dim, err))) return rc;
  c->n_rot = c->head_dim;
  if ((rc = arch_u32(g, c->arch, "rope.dimension_count", 1, &c->n_rot, err))) return rc;
  const ra_gguf_tensor *emb = ra_gguf_find_tensor(g, "token_embd.weight");
  if (!emb || emb->n_dims != 2) return ra_errorf(err, RA_EFORMAT, "gguf: no 2-D token_embd.weight");
  c->vocab = emb->ne[1] > INT32_MAX ? 0 : (int)emb->ne[1];
  c->tied_embeddings = ra_gguf_find_tensor(g, "output.weight") == NULL;
  /* The GGUF converter permutes llama q/k rows to adjacent-pair RoPE; qwen2 keeps HF's order. */
  c->rope_style = is_llama ? RA_ROPE_NORM : RA_ROPE_NEOX;
  c->qkv_bias = ra_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
  return ra_model_config_validate(c, err);
}

/* ---------- weights ---------- */

/* Where weights come from: a lookup giving raw data, its ggml type and [rows, cols]. */
typedef struct weight_src {
  int (*find)(void *ctx, const char *name, const void **raw, uint32_t *type, int64_t *rows, int64_t *cols);
  void *ctx;
  int hf_names; /* Hugging Face names instead of GGUF's */
} weight_src;

enum wkind { W_EMBD, W_OUT_NORM, W_OUTPUT, W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_BQ, W_BK, W_BV, W_FFN_NORM, W_GATE, W_UP, W_DOWN };

static void weight_name(int hf, enum wkind k, int l, char *buf, size_t n) {
  static const char *gg[] = {"token_embd.weight", "output_norm.weight", "output.weight", "attn_norm.weight",
                             "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q.bias",
                             "attn_k.bias", "attn_v.bias", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                             "ffn_down.weight"};
  static const char *hfn[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                              "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                              "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
                              "self_attn.k_proj.bias", "self_attn.v_proj.bias", "post_attention_layernorm.weight",
                              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  const char *base = hf ? hfn[k] : gg[k];
  if (k <= W_OUTPUT) snprintf(buf, n, "%s", base);
  else snprintf(buf, n, hf ? "model.layers.%d.%s" : "blk.%d.%s", l, base);
}

static int load_one(ra_model *m, const weight_src *src, enum wkind k, int l, int64_t rows, int64_t cols, ra_tensor *out,
                    ra_error *err) {
  char name[128];
  weight_name(src->hf_names, k, l, name, sizeof name);
  const void *raw;
  uint32_t type;
  int64_t r, c;
  if (src->find(src->ctx, name, &raw, &type, &r, &c) != RA_OK)
    return ra_errorf(err, RA_EFORMAT, "model: missing tensor %s", name);
  if (r != rows || c != cols)
    return ra_errorf(err, RA_EFORMAT, "model: tensor %s is [%lld, %lld], config wants [%lld, %lld]", name, (long long)r,
                     (long long)c, (long long)rows, (long long)cols);
  int rc = m->be->ops->load_weight(m->be, raw, type, rows, cols, out, err);
  return rc ? ra_error_wrap(err, "%s", name) : RA_OK;
}

static void free_weights(ra_model *m) {
  ra_tensor_free(&m->tok_embd);
  ra_tensor_free(&m->out_norm);
  ra_tensor_free(&m->output);
  if (m->layers)
    for (int l = 0; l < m->cfg.n_layers; l++) {
      ra_layer_weights *w = &m->layers[l];
      ra_tensor *all[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq, &w->bk,
                          &w->bv, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ra_tensor_free(all[i]);
    }
  free(m->layers);
}

void ra_model_free(ra_model *m) {
  if (!m) return;
  free_weights(m);
  free(m);
}

static int load_weights(ra_model *m, const weight_src *src, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
  int rc;
  if ((rc = load_one(m, src, W_EMBD, 0, c->vocab, c->dim, &m->tok_embd, err)) ||
      (rc = load_one(m, src, W_OUT_NORM, 0, 1, c->dim, &m->out_norm, err)))
    return rc;
  if (!c->tied_embeddings && (rc = load_one(m, src, W_OUTPUT, 0, c->vocab, c->dim, &m->output, err))) return rc;
  for (int l = 0; l < c->n_layers; l++) {
    ra_layer_weights *w = &m->layers[l];
    if ((rc = load_one(m, src, W_ATTN_NORM, l, 1, c->dim, &w->attn_norm, err)) ||
        (rc = load_one(m, src, W_Q, l, qd, c->dim, &w->wq, err)) || (rc = load_one(m, src, W_K, l, kvd, c->dim, &w->wk, err)) ||
        (rc = load_one(m, src, W_V, l, kvd, c->dim, &w->wv, err)) || (rc = load_one(m, src, W_O, l, c->dim, qd, &w->wo, err)) ||
        (rc = load_one(m, src, W_FFN_NORM, l, 1, c->dim, &w->ffn_norm, err)) ||
        (rc = load_one(m, src, W_GATE, l, c->ffn_dim, c->dim, &w->w_gate, err)) ||
        (rc = load_one(m, src, W_UP, l, c->ffn_dim, c->dim, &w->w_up, err)) ||
        (rc = load_one(m, src, W_DOWN, l, c->dim, c->ffn_dim, &w->w_down, err)))
      return rc;
    if (c->qkv_bias && ((rc = load_one(m, src, W_BQ, l, 1, qd, &w->bq, err)) ||
                        (rc = load_one(m, src, W_BK, l, 1, kvd, &w->bk, err)) ||
                        (rc = load_one(m, src, W_BV, l, 1, kvd, &w->bv, err))))
      return rc;
  }
  return RA_OK;
}

static int model_new(ra_backend *be, const ra_model_config *cfg, ra_model **out, ra_error *err) {
  int rc = ra_model_config_validate(cfg, err);
  if (rc) return rc;
  ra_model *m = calloc(1, sizeof(*m));
  if (m) m->layers = calloc((size_t)cfg->n_layers, sizeof(ra_layer_weights));
  if (!m || !m->layers) {
    free(m);
    return ra_errorf(err, RA_ENOMEM, "model: out of memory");
  }
  m->cfg = *cfg;
  m->be = be;
  *out = m;
  return RA_OK;
}

static int gguf_find(void *ctx, const char *name, const void **raw, uint32_t *type, int64_t *rows, int64_t *cols) {
  const ra_gguf_tensor *t = ra_gguf_find_tensor(ctx, name);
  if (!t || t->n_dims > 2) return RA_ENOTFOUND;
  *raw = t->data;
  *type = t->type;
  *cols = (int64_t)t->ne[0];
  *rows = (int64_t)t->ne[1];
  return RA_OK;
}

int ra_model_load_gguf(ra_backend *be, const ra_gguf *g, ra_model **out, ra_error *err) {
  ra_model_config cfg;
  ra_model *m = NULL;
  int rc = ra_model_config_from_gguf(g, &cfg, err);
  if (rc || (rc = model_new(be, &cfg, &m, err))) return rc;
  weight_src src = {gguf_find, (void *)g, 0};
  if ((rc = load_weights(m, &src, err))) {
    ra_model_free(m);
    return rc;
  }
  *out = m;
  return RA_OK;
}

/* ---------- safetensors ---------- */

typedef struct st_set {
  ra_st_file *files;
  size_t n;
} st_set;

static int st_find(void *ctx, const char *name, const void **raw, uint32_t *type, int64_t *rows, int64_t *cols) {
  st_set *s = ctx;
  for (size_t i = 0; i < s->n; i++) {
    const ra_st_tensor *t = ra_st_find(&s->files[i], name);
    if (!t || t->ndim < 1 || t->ndim > 2) continue;
    *raw = t->data;
    *type = t->ggml_type;
    *rows = t->ndim == 2 ? t->shape[0] : 1;
    *cols = t->shape[t->ndim - 1];
    return RA_OK;
  }
  return RA_ENOTFOUND;
}

static int read_text(const char *path, char **out, size_t *len, ra_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, RA_ENOTFOUND, "model: cannot open %s", path);
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 65536 > cap) {
      if (cap > (256u << 20)) {
        free(buf);
        fclose(f);
        return ra_errorf(err, RA_EFORMAT, "model: %s is too large", path);
      }
      char *nb = realloc(buf, cap = cap * 2 + 65536);
      if (!nb) {
        free(buf);
        fclose(f);
        return ra_errorf(err, RA_ENOMEM, "model: out of memory reading %s", path);
      }
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  fclose(f);
  *out = buf;
  *len = n;
  return RA_OK;
}

static int config_from_hf(const ra_json *j, ra_model_config *c, ra_error *err) {
  memset(c, 0, sizeof(*c));
  const char *mt = "llama";
  ra_json_get_str(j, "model_type", &mt);
  if (strcmp(mt, "llama") != 0 && strcmp(mt, "qwen2") != 0 && strcmp(mt, "mistral") != 0)
    return ra_errorf(err, RA_EUNSUPPORTED, "model: config.json model_type '%s' is not supported", mt);
  snprintf(c->arch, sizeof c->arch, "%s", mt);
  snprintf(c->name, sizeof c->name, "%s", mt);
  struct { const char *key; int *dst; int required; } ints[] = {
      {"num_hidden_layers", &c->n_layers, 1}, {"hidden_size", &c->dim, 1}, {"intermediate_size", &c->ffn_dim, 1},
      {"num_attention_heads", &c->n_heads, 1}, {"num_key_value_heads", &c->n_kv_heads, 0},
      {"vocab_size", &c->vocab, 1}, {"head_dim", &c->head_dim, 0}, {"max_position_embeddings", &c->max_ctx, 0}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    double v;
    int rc = ra_json_get_num(j, ints[i].key, &v);
    if (rc == RA_ENOTFOUND && !ints[i].required) continue;
    if (rc != RA_OK || v < 0 || v > INT32_MAX || v != (double)(int64_t)v)
      return ra_errorf(err, RA_EFORMAT, "model: config.json: '%s' missing or not a count", ints[i].key);
    *ints[i].dst = (int)v;
  }
  if (!c->n_kv_heads) c->n_kv_heads = c->n_heads;
  if (!c->head_dim && c->n_heads) c->head_dim = c->dim / c->n_heads;
  c->n_rot = c->head_dim;
  double v;
  c->rope_theta = ra_json_get_num(j, "rope_theta", &v) == RA_OK ? (float)v : 10000.0f;
  c->norm_eps = ra_json_get_num(j, "rms_norm_eps", &v) == RA_OK ? (float)v : 1e-6f;
  int tied = 0;
  ra_json_get_bool(j, "tie_word_embeddings", &tied);
  c->tied_embeddings = tied;
  c->qkv_bias = strcmp(mt, "qwen2") == 0;
  c->rope_style = RA_ROPE_NEOX; /* HF checkpoints use rotate_half */
  return ra_model_config_validate(c, err);
}

int ra_model_load_safetensors(ra_backend *be, const char *dir, ra_model **out, ra_error *err) {
  char path[4096];
  char *text = NULL;
  size_t len;
  ra_json *cj = NULL, *idx = NULL;
  st_set set = {0};
  ra_model *m = NULL;
  ra_model_config cfg;
  snprintf(path, sizeof path, "%s/config.json", dir);
  int rc = read_text(path, &text, &len, err);
  if (rc == RA_OK) rc = ra_json_parse(text, len, &cj, err);
  if (rc == RA_OK) rc = config_from_hf(cj, &cfg, err);
  free(text);
  text = NULL;
  if (rc) goto done;
  /* A single model.safetensors, or the shards named by model.safetensors.index.json. */
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  const ra_json *wm = NULL;
  if (read_text(path, &text, &len, NULL) == RA_OK) {
    if ((rc = ra_json_parse(text, len, &idx, err))) goto done;
    wm = ra_json_get(idx, "weight_map");
    if (!wm || wm->type != RA_JSON_OBJECT) {
      rc = ra_errorf(err, RA_EFORMAT, "model: %s has no weight_map", path);
      goto done;
    }
  }
  size_t max_files = wm ? wm->n : 1;
  set.files = calloc(max_files ? max_files : 1, sizeof(ra_st_file));
  if (!set.files) {
    rc = ra_errorf(err, RA_ENOMEM, "model: out of memory");
    goto done;
  }
  for (size_t i = 0; i < max_files; i++) {
    const char *fname = "model.safetensors";
    if (wm) {
      if (wm->items[i].type != RA_JSON_STRING || strchr(wm->items[i].str, '/')) {
        rc = ra_errorf(err, RA_EFORMAT, "model: bad shard name in the index");
        goto done;
      }
      fname = wm->items[i].str;
      int seen = 0;
      for (size_t k = 0; k < i && !seen; k++) seen = strcmp(wm->items[k].str, fname) == 0;
      if (seen) continue;
    }
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    if ((rc = ra_st_open(path, &set.files[set.n], err))) goto done;
    set.n++;
  }
  if ((rc = model_new(be, &cfg, &m, err))) goto done;
  weight_src src = {st_find, &set, 1};
  if (!cfg.tied_embeddings && st_find(&set, "lm_head.weight", &(const void *){0}, &(uint32_t){0}, &(int64_t){0},
                                      &(int64_t){0}) != RA_OK)
    m->cfg.tied_embeddings = 1; /* some exports omit tie_word_embeddings but also lm_head */
  if ((rc = load_weights(m, &src, err))) {
    ra_model_free(m);
    m = NULL;
    goto done;
  }
  *out = m;
done:
  for (size_t i = 0; i < set.n; i++) ra_st_close(&set.files[i]);
  free(set.files);
  free(text);
  ra_json_free(cj);
  ra_json_free(idx);
  return rc;
}

/* ---------- random ---------- */

static int convert_matrix(ra_backend *be, ra_tensor *t, ra_dtype dtype, ra_error *err) {
  if (!t->data || t->ndim != 2 || t->shape[0] <= 1 || t->dtype == dtype) return RA_OK;
  ra_tensor b;
  int rc = ra_tensor_new(be, &b, dtype, 2, t->shape, err);
  if (rc) return rc;
  if ((rc = be->ops->copy(be, &b, 0, t, 0, ra_tensor_nelem(t), err))) {
    ra_tensor_free(&b);
    return rc;
  }
  ra_tensor_free(t);
  *t = b;
  return RA_OK;
}

int ra_model_convert_weights(ra_model *m, ra_dtype dtype, ra_error *err) {
  int rc;
  if ((rc = convert_matrix(m->be, &m->tok_embd, dtype, err)) || (rc = convert_matrix(m->be, &m->output, dtype, err)))
    return rc;
  for (int l = 0; l < m->cfg.n_layers; l++) {
    ra_layer_weights *w = &m->layers[l];
    ra_tensor *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      if ((rc = convert_matrix(m->be, all[i], dtype, err))) return ra_error_wrap(err, "layer %d", l);
  }
  return RA_OK;
}

int ra_model_random(ra_backend *be, const ra_model_config *cfg, uint64_t seed, ra_model **out, ra_error *err) {
  ra_model *m = NULL;
  int rc = model_new(be, cfg, &m, err);
  if (rc) return rc;
  const ra_model_config *c = &m->cfg;
  int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
  uint64_t tid = 0;
  /* Uniform [-a, a] has std a/sqrt(3): a = sqrt(3 / fan_in) keeps activations O(1) per layer. */
#define RAND(t, rows, cols, center, amp)                                                            \
  do {                                                                                              \
    int64_t sh_[2] = {(rows), (cols)};                                                              \
    if ((rc = ra_tensor_new(be, (t), RA_DTYPE_F32, 2, sh_, err)) ||                                 \
        (rc = be->ops->fill_random(be, (t), seed * 1000003u + tid++, (center), (amp), err)))        \
      goto fail;                                                                                    \
  } while (0)
  RAND(&m->tok_embd, c->vocab, c->dim, 0.0f, 1.0f);
  RAND(&m->out_norm, 1, c->dim, 1.0f, 0.1f);
  if (!c->tied_embeddings) RAND(&m->output, c->vocab, c->dim, 0.0f, sqrtf(3.0f / (float)c->dim));
  for (int l = 0; l < c->n_layers; l++) {
    ra_layer_weights *w = &m->layers[l];
    float a_in = sqrtf(3.0f / (float)c->dim), a_q = sqrtf(3.0f / (float)qd), a_f = sqrtf(3.0f / (float)c->ffn_dim);
    RAND(&w->attn_norm, 1, c->dim, 1.0f, 0.1f);
    RAND(&w->wq, qd, c->dim, 0.0f, a_in);
    RAND(&w->wk, kvd, c->dim, 0.0f, a_in);
    RAND(&w->wv, kvd, c->dim, 0.0f, a_in);
    RAND(&w->wo, c->dim, qd, 0.0f, a_q);
    if (c->qkv_bias) {
      RAND(&w->bq, 1, qd, 0.0f, 0.1f);
      RAND(&w->bk, 1, kvd, 0.0f, 0.1f);
      RAND(&w->bv, 1, kvd, 0.0f, 0.1f);
    }
    RAND(&w->ffn_norm, 1, c->dim, 1.0f, 0.1f);
    RAND(&w->w_gate, c->ffn_dim, c->dim, 0.0f, a_in);
    RAND(&w->w_up, c->ffn_dim, c->dim, 0.0f, a_in);
    RAND(&w->w_down, c->dim, c->ffn_dim, 0.0f, a_f);
  }
#undef RAND
  *out = m;
  return RA_OK;
fail:
  ra_model_free(m);
  return rc;
}

/* ---------- state ---------- */

void ra_state_free(ra_state *st) {
  if (!st) return;
  if (st->k_cache)
    for (int l = 0; l < st->m->cfg.n_layers; l++) {
      ra_tensor_free(&st->k_cache[l]);
      ra_tensor_free(&st->v_cache[l]);
    }
  free(st->k_cache);
  free(st->v_cache);
  ra_tensor *all[] = {&st->x, &st->xn, &st->q, &st->k, &st->v, &st->att, &st->gate, &st->up, &st->dec_ml, &st->logits};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ra_tensor_free(all[i]);
  free(st);
}

int ra_state_new(const ra_model *m, int64_t n_ctx, int64_t max_batch, ra_dtype kv_dtype, ra_state **out, ra_error *err) {
  return ra_state_new_ring(m, n_ctx, max_batch, n_ctx, kv_dtype, out, err);
}

int ra_state_new_ring(const ra_model *m, int64_t n_ctx, int64_t max_batch, int64_t cache_rows, ra_dtype kv_dtype,
                      ra_state **out, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  if (n_ctx < 1 || max_batch < 1 || max_batch > n_ctx || cache_rows < 1 || cache_rows > n_ctx)
    return ra_errorf(err, RA_EINVAL, "model: context %lld / batch %lld / cache rows %lld", (long long)n_ctx,
                     (long long)max_batch, (long long)cache_rows);
  ra_state *st = calloc(1, sizeof(*st));
  if (!st) return ra_errorf(err, RA_ENOMEM, "model: out of memory");
  st->m = m;
  st->be = m->be;
  st->n_ctx = n_ctx;
  st->max_batch = max_batch;
  st->k_cache = calloc((size_t)c->n_layers, sizeof(ra_tensor));
  st->v_cache = calloc((size_t)c->n_layers, sizeof(ra_tensor));
  int rc = RA_OK;
  if (!st->k_cache || !st->v_cache) {
    rc = ra_errorf(err, RA_ENOMEM, "model: out of memory");
    goto fail;
  }
  int64_t kv_shape[3] = {cache_rows, c->n_kv_heads, c->head_dim};
  for (int l = 0; l < c->n_layers; l++)
    if ((rc = ra_tensor_new(m->be, &st->k_cache[l], kv_dtype, 3, kv_shape, err)) ||
        (rc = ra_tensor_new(m->be, &st->v_cache[l], kv_dtype, 3, kv_shape, err)))
      goto fail;
  int64_t b = max_batch;
  st->ffn_rows = b < RA_FFN_ROWS ? b : RA_FFN_ROWS;
  int64_t sx[2] = {b, c->dim}, sq[3] = {b, c->n_heads, c->head_dim}, skv[3] = {b, c->n_kv_heads, c->head_dim},
          sf[2] = {st->ffn_rows, c->ffn_dim}, sml[2] = {c->n_heads, 2}, sl[2] = {1, c->vocab};
  if ((rc = ra_tensor_new(m->be, &st->x, RA_DTYPE_F32, 2, sx, err)) ||
      (rc = ra_tensor_new(m->be, &st->xn, RA_DTYPE_F32, 2, sx, err)) ||
      (rc = ra_tensor_new(m->be, &st->q, RA_DTYPE_F32, 3, sq, err)) ||
      (rc = ra_tensor_new(m->be, &st->k, RA_DTYPE_F32, 3, skv, err)) ||
      (rc = ra_tensor_new(m->be, &st->v, RA_DTYPE_F32, 3, skv, err)) ||
      (rc = ra_tensor_new(m->be, &st->att, RA_DTYPE_F32, 3, sq, err)) ||
      (rc = ra_tensor_new(m->be, &st->gate, RA_DTYPE_F32, 2, sf, err)) ||
      (rc = ra_tensor_new(m->be, &st->up, RA_DTYPE_F32, 2, sf, err)) ||
      (rc = ra_tensor_new(m->be, &st->dec_ml, RA_DTYPE_F32, 2, sml, err)) ||
      (rc = ra_tensor_new(m->be, &st->logits, RA_DTYPE_F32, 2, sl, err)))
    goto fail;
  st->logits_rows = 1;
  *out = st;
  return RA_OK;
fail:
  ra_state_free(st);
  return rc;
}

int ra_state_set_ffn_rows(ra_state *st, int64_t rows, ra_error *err) {
  if (rows < 1 || rows > st->max_batch)
    return ra_errorf(err, RA_EINVAL, "model: %lld MLP rows per pass (1 to the batch, %lld)", (long long)rows,
                     (long long)st->max_batch);
  return ra_state_set_max_batch(st, st->max_batch, rows, err);
}

int ra_state_set_max_batch(ra_state *st, int64_t rows, int64_t ffn_rows, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  if (rows < 1 || rows > st->n_ctx || ffn_rows < 1 || ffn_rows > rows)
    return ra_errorf(err, RA_EINVAL, "model: steps of %lld tokens, %lld MLP rows per pass (context %lld)",
                     (long long)rows, (long long)ffn_rows, (long long)st->n_ctx);
  const int64_t sx[2] = {rows, c->dim}, sq[3] = {rows, c->n_heads, c->head_dim},
                skv[3] = {rows, c->n_kv_heads, c->head_dim}, sf[2] = {ffn_rows, c->ffn_dim};
  const int ndim[8] = {2, 2, 3, 3, 3, 3, 2, 2};
  const int64_t *shape[8] = {sx, sx, sq, skv, skv, sq, sf, sf};
  ra_tensor *dst[8] = {&st->x, &st->xn, &st->q, &st->k, &st->v, &st->att, &st->gate, &st->up};
  /* only the buffers whose rows change, all allocated before any is replaced */
  ra_tensor t[8] = {0};
  int rc = RA_OK;
  for (int i = 0; i < 8 && rc == RA_OK; i++)
    if (dst[i]->shape[0] != shape[i][0]) rc = ra_tensor_new(st->be, &t[i], RA_DTYPE_F32, ndim[i], shape[i], err);
  for (int i = 0; i < 8; i++) {
    if (rc) {
      ra_tensor_free(&t[i]);
    } else if (dst[i]->shape[0] != shape[i][0]) {
      ra_tensor_free(dst[i]);
      *dst[i] = t[i];
    }
  }
  if (rc) return rc;
  st->max_batch = rows;
  st->ffn_rows = ffn_rows;
  return RA_OK;
}

void ra_state_swap_cache(ra_state *st, int layer, ra_tensor *k, ra_tensor *v) {
  ra_tensor t = st->k_cache[layer];
  st->k_cache[layer] = *k;
  *k = t;
  t = st->v_cache[layer];
  st->v_cache[layer] = *v;
  *v = t;
}

void ra_state_reset(ra_state *st) {
  st->pos = 0;
  st->n = st->step_rows = st->row0 = 0;
}

/* ---------- forward ---------- */

/* The cur_* views on the step's rows [r0, r0 + nr) (the MLP's: its first rows, one pass's). */
static void focus(ra_state *st, int64_t r0, int64_t nr) {
  st->cur_x = ra_tensor_rows(&st->x, r0, nr);
  st->cur_xn = ra_tensor_rows(&st->xn, r0, nr);
  st->cur_q = ra_tensor_rows(&st->q, r0, nr);
  st->cur_k = ra_tensor_rows(&st->k, r0, nr);
  st->cur_v = ra_tensor_rows(&st->v, r0, nr);
  st->cur_att = ra_tensor_rows(&st->att, r0, nr);
  st->cur_gate = ra_tensor_rows(&st->gate, 0, nr < st->ffn_rows ? nr : st->ffn_rows);
  st->cur_up = ra_tensor_rows(&st->up, 0, nr < st->ffn_rows ? nr : st->ffn_rows);
}

int ra_step_begin(ra_state *st, const int32_t *tokens, int64_t n, ra_error *err) {
  if (n < 1 || n > st->max_batch) return ra_errorf(err, RA_EINVAL, "model: step of %lld tokens (max %lld)", (long long)n, (long long)st->max_batch);
  if (st->pos + n > st->n_ctx)
    return ra_errorf(err, RA_EINVAL, "model: context full: %lld + %lld tokens > %lld", (long long)st->pos, (long long)n,
                     (long long)st->n_ctx);
  st->n = st->step_rows = n;
  st->row0 = 0;
  st->cache_row = st->pos;
  st->wrap_at = st->wrap_row = 0;
  focus(st, 0, n);
  return st->be->ops->get_rows(st->be, &st->m->tok_embd, tokens, n, &st->cur_x, err);
}

int ra_step_rows(ra_state *st, int64_t r0, int64_t nr, ra_error *err) {
  if (r0 < 0 || nr < 1 || r0 + nr > st->step_rows)
    return ra_errorf(err, RA_EINVAL, "model: rows %lld..%lld of a step of %lld", (long long)r0, (long long)(r0 + nr),
                     (long long)st->step_rows);
  if (st->wrap_at > 0 && st->wrap_at < st->step_rows && (r0 > 0 || nr < st->step_rows))
    return ra_errorf(err, RA_EUNSUPPORTED, "model: a step whose ring wraps runs whole");
  st->pos += r0 - st->row0;
  st->cache_row += r0 - st->row0;
  st->row0 = r0;
  st->n = nr;
  focus(st, r0, nr);
  return RA_OK;
}

int ra_step_layer_qkv(ra_state *st, int l, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  const ra_layer_weights *w = &st->m->layers[l];
  const ra_backend_ops *op = st->be->ops;
  ra_backend *be = st->be;
  const ra_tensor *bq = c->qkv_bias ? &w->bq : NULL, *bk = c->qkv_bias ? &w->bk : NULL, *bv = c->qkv_bias ? &w->bv : NULL;
  int rc = RA_OK;
  const int64_t split = st->wrap_at > 0 && st->wrap_at < st->n ? st->wrap_at : st->n;
  if (st->cache_row < 0 || st->cache_row + split > st->k_cache[l].shape[0] ||
      (split < st->n && (st->wrap_row < 0 || st->wrap_row + st->n - split > st->k_cache[l].shape[0])))
    return ra_errorf(err, RA_EINVAL, "model: layer %d: cache rows %lld..%lld outside its %lld rows", l,
                     (long long)st->cache_row, (long long)(st->cache_row + st->n), (long long)st->k_cache[l].shape[0]);
  /* xn = rmsnorm(x); q = xn Wq^T: [n, heads*hd] viewed as [n, heads, hd]; same for k, v; then
   * RoPE of q and k, and k, v into the cache rows of the step (fused ops: one launch each on a
   * backend that fuses) */
  const ra_tensor *ws[3] = {&w->wq, &w->wk, &w->wv}, *bs[3] = {bq, bk, bv};
  ra_tensor *ys[3] = {&st->cur_q, &st->cur_k, &st->cur_v};
  if ((rc = op->norm_matmul(be, &st->cur_x, &w->attn_norm, c->norm_eps, &st->cur_xn, 3, ws, bs, ys, err)))
    return ra_error_wrap(err, "layer %d", l);
  if (split == st->n) {
    rc = op->rope_store(be, &st->cur_q, &st->cur_k, &st->cur_v, st->pos, c->n_rot, c->rope_theta, c->rope_style,
                        &st->k_cache[l], &st->v_cache[l], st->cache_row, err);
  } else {
    /* the ring wraps: the step's rows in two runs of cache rows */
    for (int part = 0; part < 2 && rc == RA_OK; part++) {
      const int64_t r0 = part ? split : 0, nr = part ? st->n - split : split;
      ra_tensor q = ra_tensor_rows(&st->cur_q, r0, nr), k = ra_tensor_rows(&st->cur_k, r0, nr),
                v = ra_tensor_rows(&st->cur_v, r0, nr);
      rc = op->rope_store(be, &q, &k, &v, st->pos + r0, c->n_rot, c->rope_theta, c->rope_style, &st->k_cache[l],
                          &st->v_cache[l], part ? st->wrap_row : st->cache_row, err);
    }
  }
  return rc ? ra_error_wrap(err, "layer %d", l) : RA_OK;
}

int ra_step_layer_attend(ra_state *st, int l, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  float scale = 1.0f / sqrtf((float)c->head_dim);
  int rc;
  if (st->n == 1) {
    /* one token: the decode kernel (split over the cache); att row 0 is o [heads, hd] */
    ra_token_range all = {0, st->pos + 1};
    rc = st->be->ops->attn_decode(st->be, &st->cur_q, &st->k_cache[l], &st->v_cache[l], &all, 1, scale, &st->cur_att,
                                  &st->dec_ml, err);
  } else {
    rc = st->be->ops->attn_prefill(st->be, &st->cur_q, &st->k_cache[l], &st->v_cache[l], st->pos, scale, &st->cur_att, err);
  }
  return rc ? ra_error_wrap(err, "layer %d", l) : RA_OK;
}

int ra_step_layer_finish(ra_state *st, int l, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  const ra_layer_weights *w = &st->m->layers[l];
  const ra_backend_ops *op = st->be->ops;
  ra_backend *be = st->be;
  const struct ra_tp_rank *tp = st->m->tp;
  /* tensor-parallel: a rank's Wo / W_down columns give a partial sum of the update; rank 0 adds
   * the residual to its own, the others overwrite x with theirs, and the all-reduce of x is then
   * residual + every rank's partial */
  const int acc = !tp || tp->rank == 0;
  int rc;
  /* x += att Wo^T (att: [n, heads, hd] as [n, heads*hd]);  x += W_down (silu(xn W_gate^T) * (xn W_up^T)) with xn = rmsnorm(x),
   * the MLP over at most ffn_rows rows at a time (its [rows, ffn] activations); a tensor-parallel
   * rank's partial sums all-reduced after each */
  if ((rc = op->matmul(be, &st->cur_att, &w->wo, NULL, &st->cur_x, acc, err)) ||
      (tp && (rc = ra_tp_all_reduce(tp->comm, tp->rank, &st->cur_x, err))))
    return ra_error_wrap(err, "layer %d", l);
  for (int64_t r0 = 0; r0 < st->n; r0 += st->ffn_rows) {
    const int64_t cn = st->n - r0 < st->ffn_rows ? st->n - r0 : st->ffn_rows;
    ra_tensor x = ra_tensor_rows(&st->cur_x, r0, cn), xn = ra_tensor_rows(&st->cur_xn, r0, cn);
    ra_tensor up = ra_tensor_rows(&st->cur_up, 0, cn), gate = ra_tensor_rows(&st->cur_gate, 0, cn);
    if ((rc = op->norm_swiglu(be, &x, &w->ffn_norm, c->norm_eps, &xn, &w->w_gate, &w->w_up, &up, &gate, err)) ||
        (rc = op->matmul(be, &gate, &w->w_down, NULL, &x, acc, err)))
      return ra_error_wrap(err, "layer %d", l);
  }
  if (tp && (rc = ra_tp_all_reduce(tp->comm, tp->rank, &st->cur_x, err))) return ra_error_wrap(err, "layer %d", l);
  return RA_OK;
}

int ra_step_end(ra_state *st, int all_logits, ra_error *err) {
  const ra_model *m = st->m;
  int rc;
  if ((st->row0 != 0 || st->n != st->step_rows) && (rc = ra_step_rows(st, 0, st->step_rows, err))) return rc;
  int64_t rows = all_logits ? st->n : 1;
  if (rows > st->logits_rows) {
    ra_tensor nl;
    int64_t shape[2] = {rows, m->cfg.vocab};
    if ((rc = ra_tensor_new(st->be, &nl, RA_DTYPE_F32, 2, shape, err))) return rc;
    ra_tensor_free(&st->logits);
    st->logits = nl;
    st->logits_rows = rows;
  }
  ra_tensor x = ra_tensor_rows(&st->x, st->n - rows, rows), xn = ra_tensor_rows(&st->xn, 0, rows);
  ra_tensor lg = ra_tensor_rows(&st->logits, 0, rows);
  const ra_tensor *out_w = m->cfg.tied_embeddings ? &m->tok_embd : &m->output;
  if ((rc = m->be->ops->rmsnorm(m->be, &x, &m->out_norm, m->cfg.norm_eps, &xn, err)) ||
      (rc = m->be->ops->matmul(m->be, &xn, out_w, NULL, &lg, 0, err)))
    return rc;
  st->n_logits = rows;
  st->pos += st->n;
  st->n = 0;
  return RA_OK;
}

int ra_model_forward(ra_state *st, const int32_t *tokens, int64_t n, int all_logits, const ra_forward_hooks *hooks,
                     ra_error *err) {
  if (all_logits && n > st->max_batch)
    return ra_errorf(err, RA_EINVAL, "model: all logits of %lld tokens need a batch of that size (have %lld)",
                     (long long)n, (long long)st->max_batch);
  for (int64_t i = 0; i < n; i += st->max_batch) {
    int64_t cn = n - i < st->max_batch ? n - i : st->max_batch;
    int rc = ra_step_begin(st, tokens + i, cn, err);
    for (int l = 0; rc == RA_OK && l < st->m->cfg.n_layers; l++) {
      rc = ra_step_layer_qkv(st, l, err);
      if (rc == RA_OK && hooks && hooks->on_qkv) rc = hooks->on_qkv(hooks->ctx, st, l, err);
      if (rc == RA_OK) rc = ra_step_layer_attend(st, l, err);
      if (rc == RA_OK) rc = ra_step_layer_finish(st, l, err);
    }
    /* Only the last chunk's logits matter: earlier chunks still finish the step to advance pos. */
    if (rc == RA_OK) rc = ra_step_end(st, all_logits, err);
    if (rc != RA_OK) {
      st->n = 0;
      return rc;
    }
  }
  return RA_OK;
}
