#include "dump_qk.h"

#include "json.h"
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct dump_ctx {
  const ra_dump_config *cfg;
  int64_t n_prompt;
  ra_npy_writer **wq;   /* [layers * q_heads] prompt queries */
  ra_npy_writer **wqd;  /* [layers * q_heads] decode queries */
  float *host;          /* [max_batch, q_heads, hd] */
  float *col;           /* [max_batch, hd] */
} dump_ctx;

int ra_dump_parse_layers(const char *spec, int n_layers, uint8_t *flags, ra_error *err) {
  memset(flags, 0, (size_t)n_layers);
  const char *p = spec;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p) return ra_errorf(err, RA_EINVAL, "--layers: expected a number at '%s'", p);
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (end == p + 1) return ra_errorf(err, RA_EINVAL, "--layers: bad range at '%s'", p);
      p = end;
    }
    if (a < 0 || b < a || b >= n_layers) return ra_errorf(err, RA_EINVAL, "--layers: %ld-%ld outside [0, %d)", a, b, n_layers);
    for (long l = a; l <= b; l++) flags[l] = 1;
    if (*p == ',') p++;
    else if (*p) return ra_errorf(err, RA_EINVAL, "--layers: unexpected '%c'", *p);
  }
  return RA_OK;
}

static int layer_on(const ra_dump_config *cfg, int l) { return !cfg->layer_on || cfg->layer_on[l]; }

/* Hook: appends the step's post-RoPE q rows of every head to the prompt or decode file. */
static int on_qkv(void *vctx, ra_state *st, int layer, ra_error *err) {
  dump_ctx *d = vctx;
  if (!layer_on(d->cfg, layer)) return RA_OK;
  const ra_model_config *c = &st->m->cfg;
  int64_t n = st->n, hq = c->n_heads, hd = c->head_dim;
  int rc = st->be->ops->download(st->be, &st->cur_q, 0, d->host, (size_t)(n * hq * hd), err);
  if (rc) return rc;
  ra_npy_writer **w = st->pos < d->n_prompt ? d->wq : d->wqd;
  for (int64_t h = 0; h < hq; h++) {
    for (int64_t t = 0; t < n; t++) memcpy(d->col + t * hd, d->host + (t * hq + h) * hd, (size_t)hd * sizeof(float));
    if ((rc = ra_npy_writer_append(w[layer * hq + h], d->col, (uint64_t)n, err))) return rc;
  }
  return RA_OK;
}

static int path_fmt(char *buf, size_t n, const char *dir, const char *name, int l, int h, ra_error *err) {
  int k = snprintf(buf, n, "%s/%s_L%d_H%d.npy", dir, name, l, h);
  return k < 0 || (size_t)k >= n ? ra_errorf(err, RA_EINVAL, "dump: output path too long") : RA_OK;
}

/* The k and v cache rows [0, n_tokens) of every dumped layer, one file per kv head each. */
static int write_kv(ra_state *st, const ra_dump_config *cfg, int64_t n_tokens, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  int64_t hkv = c->n_kv_heads, hd = c->head_dim;
  float *all = malloc(sizeof(float) * (size_t)(n_tokens * hkv * hd));
  float *col = malloc(sizeof(float) * (size_t)(n_tokens * hd));
  int rc = RA_OK;
  if (!all || !col) rc = ra_errorf(err, RA_ENOMEM, "dump: out of memory for %lld keys", (long long)n_tokens);
  for (int l = 0; rc == RA_OK && l < c->n_layers; l++) {
    if (!layer_on(cfg, l)) continue;
    const ra_tensor *caches[2] = {&st->k_cache[l], &st->v_cache[l]};
    static const char *const names[2] = {"k", "v"};
    for (int w = 0; rc == RA_OK && w < 2; w++) {
      /* cache rows [0, n_tokens): [n_tokens, kv_heads, hd] */
      if ((rc = st->be->ops->download(st->be, caches[w], 0, all, (size_t)(n_tokens * hkv * hd), err))) break;
      for (int64_t g = 0; rc == RA_OK && g < hkv; g++) {
        for (int64_t t = 0; t < n_tokens; t++) memcpy(col + t * hd, all + (t * hkv + g) * hd, (size_t)hd * sizeof(float));
        char path[4096];
        if ((rc = path_fmt(path, sizeof path, cfg->out_dir, names[w], l, (int)g, err)) == RA_OK)
          rc = ra_npy_write_f32(path, cfg->dtype, (uint64_t)n_tokens, (uint64_t)hd, col, err);
      }
    }
  }
  free(all);
  free(col);
  return rc;
}

static int write_meta(const ra_state *st, const ra_dump_config *cfg, const int32_t *prompt, size_t n_prompt,
                      const int32_t *dec, int n_dec, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", cfg->out_dir);
  FILE *f = fopen(path, "w");
  if (!f) return ra_errorf(err, RA_EIO, "dump: cannot create %s: %s", path, strerror(errno));
  fprintf(f, "{\n  \"model\": ");
  ra_json_write_str(f, cfg->model_name ? cfg->model_name : c->name);
  fprintf(f,
          ",\n  \"layers\": %d,\n  \"q_heads\": %d,\n  \"kv_heads\": %d,\n  \"head_dim\": %d,\n"
          "  \"n_prompt_tokens\": %zu,\n  \"n_decode_tokens\": %d,\n  \"n_tokens\": %zu,\n  \"rope_applied\": true,\n"
          "  \"rope_style\": \"%s\",\n  \"rope_theta\": %g,\n  \"dtype\": \"%s\",\n  \"dumped_layers\": [",
          c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, n_prompt, n_dec, n_prompt + (size_t)n_dec,
          c->rope_style == RA_ROPE_NORM ? "norm" : "neox", c->rope_theta,
          cfg->dtype == RA_DTYPE_F16 ? "float16" : "float32");
  int first = 1;
  for (int l = 0; l < c->n_layers; l++)
    if (layer_on(cfg, l)) {
      fprintf(f, "%s%d", first ? "" : ", ", l);
      first = 0;
    }
  fprintf(f, "],\n  \"prompt_tokens\": [");
  for (size_t i = 0; i < n_prompt; i++) fprintf(f, "%s%d", i ? ", " : "", prompt[i]);
  fprintf(f, "],\n  \"decode_tokens\": [");
  for (int i = 0; i < n_dec; i++) fprintf(f, "%s%d", i ? ", " : "", dec[i]);
  fprintf(f, "]\n}\n");
  return fclose(f) == 0 ? RA_OK : ra_errorf(err, RA_EIO, "dump: writing %s failed", path);
}

int ra_dump_qk(ra_state *st, const int32_t *prompt, size_t n_prompt, const ra_dump_config *cfg, ra_error *err) {
  const ra_model_config *c = &st->m->cfg;
  int64_t total = (int64_t)n_prompt + cfg->n_decode;
  if (n_prompt == 0 || cfg->n_decode < 0 || total > st->n_ctx)
    return ra_errorf(err, RA_EINVAL, "dump: %zu prompt + %d decode tokens do not fit the context of %lld", n_prompt,
                     cfg->n_decode, (long long)st->n_ctx);
  if (mkdir(cfg->out_dir, 0777) != 0 && errno != EEXIST)
    return ra_errorf(err, RA_EIO, "dump: cannot create %s: %s", cfg->out_dir, strerror(errno));
  size_t nw = (size_t)c->n_layers * (size_t)c->n_heads;
  dump_ctx d = {cfg, (int64_t)n_prompt, calloc(nw, sizeof(ra_npy_writer *)), calloc(nw, sizeof(ra_npy_writer *)),
                malloc(sizeof(float) * (size_t)(st->max_batch * c->n_heads * c->head_dim)),
                malloc(sizeof(float) * (size_t)(st->max_batch * c->head_dim))};
  int32_t *dec = malloc(sizeof(int32_t) * (size_t)(cfg->n_decode + 1));
  int rc = RA_OK;
  if (!d.wq || !d.wqd || !d.host || !d.col || !dec) rc = ra_errorf(err, RA_ENOMEM, "dump: out of memory");
  for (int l = 0; rc == RA_OK && l < c->n_layers; l++) {
    if (!layer_on(cfg, l)) continue;
    for (int h = 0; rc == RA_OK && h < c->n_heads; h++) {
      char path[4096];
      size_t i = (size_t)l * (size_t)c->n_heads + (size_t)h;
      if ((rc = path_fmt(path, sizeof path, cfg->out_dir, "q", l, h, err)) == RA_OK)
        rc = ra_npy_writer_open(path, cfg->dtype, n_prompt, (uint64_t)c->head_dim, &d.wq[i], err);
      if (rc == RA_OK && (rc = path_fmt(path, sizeof path, cfg->out_dir, "qdec", l, h, err)) == RA_OK)
        rc = ra_npy_writer_open(path, cfg->dtype, (uint64_t)cfg->n_decode, (uint64_t)c->head_dim, &d.wqd[i], err);
    }
  }
  ra_forward_hooks hooks = {&d, on_qkv};
  ra_state_reset(st);
  if (rc == RA_OK) rc = ra_model_forward(st, prompt, (int64_t)n_prompt, 0, &hooks, err);
  for (int j = 0; rc == RA_OK && j < cfg->n_decode; j++) {
    float val;
    ra_tensor row = ra_tensor_rows(&st->logits, st->n_logits - 1, 1);
    if ((rc = st->be->ops->topk_rows(st->be, &row, 1, &dec[j], &val, err))) break;
    rc = ra_model_forward(st, &dec[j], 1, 0, &hooks, err);
  }
  for (size_t i = 0; i < nw; i++) {
    if (d.wq && d.wq[i]) {
      int r2 = ra_npy_writer_close(d.wq[i], rc ? NULL : err);
      if (rc == RA_OK) rc = r2;
    }
    if (d.wqd && d.wqd[i]) {
      int r2 = ra_npy_writer_close(d.wqd[i], rc ? NULL : err);
      if (rc == RA_OK) rc = r2;
    }
  }
  if (rc == RA_OK) rc = write_kv(st, cfg, total, err);
  if (rc == RA_OK) rc = write_meta(st, cfg, prompt, n_prompt, dec, cfg->n_decode, err);
  free(d.wq);
  free(d.wqd);
  free(d.host);
  free(d.col);
  free(dec);
  return rc;
}
