/* cuda-bench: the model runtime's real forward path (model.h) on the CUDA backend with the
 * Llama-3-8B geometry (32 layers, 32 q / 8 kv heads, head_dim 128, hidden 4096, ffn 14336,
 * vocab 128256) and random BF16 weights (fill_random, then converted like load_weight does).
 *
 *   decode   batch 1 at 8K and 32K context: ms/token (median of >= 20 timed steps after
 *            warm-up, cudaEvent timing), against the HBM roofline: bytes a step must read
 *            (weights + KV cache) / bandwidth. The KV cache holds random data of the right
 *            shape (fill_random) instead of a real prefill: the decode cost does not depend on
 *            the values.
 *   prefill  32K tokens through ra_model_forward in chunks (real attn_prefill, causal):
 *            tokens/s.
 *   kernels  the FFN GEMV alone (GB/s) and attn_decode alone at 32K (GB/s), to tell which
 *            side misses the roofline.
 *
 * Usage: cuda-bench [--json FILE] [--steps N] [--warmup N] [--layers N] [--chunk N]
 *                   [--prefill-ctx N] [--bw-gbps X] [--device N]
 * Exit 0 on success, 1 on an error, 77 without a CUDA device. */
#include "backend.h"
#include "backend_cuda.h"
#include "model.h"
#include "model_bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
  const char *json;
  int steps, warmup, layers, chunk, device;
  int64_t prefill_ctx;
  double bw_gbps;
} opts;

typedef struct decode_result {
  int64_t ctx;
  double med_ms, p10_ms, p90_ms, mean_ms;
  double kv_bytes, weight_bytes_brief, weight_bytes_read;
  double roof_ms_brief, roof_ms_read;
} decode_result;

typedef struct prefill_result {
  int64_t ctx;
  int chunk;
  double seconds, tok_per_s, first_chunk_ms, last_chunk_ms;
} prefill_result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double p) {
  double i = p * (n - 1);
  int lo = (int)i;
  int hi = lo + 1 < n ? lo + 1 : lo;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (i - lo);
}

static double tensor_bytes(const ra_tensor *t) { return t->data ? (double)t->nbytes : 0.0; }

/* Bytes of weights one decode step reads: every matrix and vector except the embedding table,
 * of which it reads one row (when the output matrix is tied, the table is read in full). */
static double weight_bytes_read(const ra_model *m) {
  double b = tensor_bytes(&m->out_norm);
  if (m->cfg.tied_embeddings)
    b += tensor_bytes(&m->tok_embd);
  else
    b += tensor_bytes(&m->output) + tensor_bytes(&m->tok_embd) / (double)m->cfg.vocab;
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const ra_layer_weights *w = &m->layers[l];
    const ra_tensor *all[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq,
                              &w->bk,        &w->bv, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) b += tensor_bytes(all[i]);
  }
  return b;
}

static int run_decode(ra_backend *be, const ra_model *m, ra_cuda_timer *tm, const opts *o, int64_t ctx,
                      decode_result *res, ra_error *err) {
  ra_state *st = NULL;
  int rc = ra_state_new(m, ctx + o->warmup + o->steps + 1, 1, RA_DTYPE_BF16, &st, err);
  if (rc) return rc;
  double *ms = calloc((size_t)o->steps, sizeof(double));
  if (!ms) {
    ra_state_free(st);
    return ra_errorf(err, RA_ENOMEM, "bench: out of memory");
  }
  /* the cache of a ctx-token prefill, as far as decode can tell */
  for (int l = 0; l < m->cfg.n_layers && rc == RA_OK; l++) {
    rc = be->ops->fill_random(be, &st->k_cache[l], 1000 + (uint64_t)l, 0.0f, 1.0f, err);
    if (rc == RA_OK) rc = be->ops->fill_random(be, &st->v_cache[l], 2000 + (uint64_t)l, 0.0f, 1.0f, err);
  }
  st->pos = ctx;
  for (int i = 0; rc == RA_OK && i < o->warmup + o->steps; i++) {
    int32_t tok = (int32_t)((12345 + 7919 * i) % m->cfg.vocab);
    float t = 0.0f;
    if ((rc = ra_cuda_timer_start(tm, err))) break;
    if ((rc = ra_model_forward(st, &tok, 1, 0, NULL, err))) break;
    if ((rc = ra_cuda_timer_stop(tm, &t, err))) break;
    if (i >= o->warmup) ms[i - o->warmup] = t;
  }
  if (rc == RA_OK) {
    /* check the step produced numbers, not NaN */
    float probe[8];
    ra_tensor lg = ra_tensor_rows(&st->logits, 0, 1);
    rc = be->ops->download(be, &lg, 0, probe, 8, err);
    for (int i = 0; rc == RA_OK && i < 8; i++)
      if (!isfinite(probe[i])) rc = ra_errorf(err, RA_EINTERNAL, "bench: decode logits are not finite");
  }
  if (rc == RA_OK) {
    double sum = 0.0;
    for (int i = 0; i < o->steps; i++) sum += ms[i];
    qsort(ms, (size_t)o->steps, sizeof(double), cmp_double);
    const ra_model_config *c = &m->cfg;
    res->ctx = ctx;
    res->med_ms = pct(ms, o->steps, 0.5);
    res->p10_ms = pct(ms, o->steps, 0.1);
    res->p90_ms = pct(ms, o->steps, 0.9);
    res->mean_ms = sum / o->steps;
    /* K and V rows [0, ctx] of every layer, BF16 */
    res->kv_bytes = 2.0 * c->n_layers * (double)(ctx + 1) * c->n_kv_heads * c->head_dim * 2.0;
    /* the figure for Llama-3-8B BF16 weights, scaled when --layers shrinks the model */
    res->weight_bytes_brief = 16.06e9 * (c->n_layers == 32 ? 1.0 : weight_bytes_read(m) / 15.01e9);
    res->weight_bytes_read = weight_bytes_read(m);
    double bw = o->bw_gbps * 1e9;
    res->roof_ms_brief = (res->weight_bytes_brief + res->kv_bytes) / bw * 1e3;
    res->roof_ms_read = (res->weight_bytes_read + res->kv_bytes) / bw * 1e3;
  }
  free(ms);
  ra_state_free(st);
  return rc;
}

static int run_prefill(ra_backend *be, const ra_model *m, ra_cuda_timer *tm, const opts *o, prefill_result *res,
                       ra_error *err) {
  ra_state *st = NULL;
  int64_t n = o->prefill_ctx;
  int rc = ra_state_new(m, n, o->chunk, RA_DTYPE_BF16, &st, err);
  if (rc) return rc;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
  if (!tok) {
    ra_state_free(st);
    return ra_errorf(err, RA_ENOMEM, "bench: out of memory");
  }
  for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((31 + 104729 * i) % m->cfg.vocab);
  /* warm-up: one chunk (cuBLAS heuristics, kernel loading), then start over */
  float t = 0.0f;
  double total = 0.0;
  rc = ra_model_forward(st, tok, o->chunk < n ? o->chunk : n, 0, NULL, err);
  if (rc == RA_OK) rc = be->ops->sync(be, err);
  ra_state_reset(st);
  res->ctx = n;
  res->chunk = o->chunk;
  for (int64_t i = 0; rc == RA_OK && i < n; i += o->chunk) {
    int64_t cn = n - i < o->chunk ? n - i : o->chunk;
    if ((rc = ra_cuda_timer_start(tm, err))) break;
    if ((rc = ra_model_forward(st, tok + i, cn, 0, NULL, err))) break;
    if ((rc = ra_cuda_timer_stop(tm, &t, err))) break;
    if (i == 0) res->first_chunk_ms = t;
    res->last_chunk_ms = t;
    total += t;
  }
  if (rc == RA_OK) {
    res->seconds = total / 1e3;
    res->tok_per_s = (double)n / res->seconds;
  }
  free(tok);
  ra_state_free(st);
  return rc;
}

/* The FFN up-projection GEMV alone (x [1, 4096] -> [1, 14336], BF16 weights) and attn_decode
 * alone over 32K tokens: achieved GB/s of each, medians of 50. */
static int run_kernels(ra_backend *be, const ra_model *m, ra_cuda_timer *tm, double *gemv_gbps, double *attn_gbps,
                       ra_error *err) {
  const ra_model_config *c = &m->cfg;
  ra_tensor x = {0}, y = {0}, q = {0}, kc = {0}, vc = {0}, o = {0}, ml = {0};
  int64_t xs[2] = {1, c->dim}, ys[2] = {1, c->ffn_dim}, ctx = 32768;
  int64_t qs[2] = {c->n_heads, c->head_dim}, cs[3] = {ctx, c->n_kv_heads, c->head_dim}, ms[2] = {c->n_heads, 2};
  double t[50];
  int rc;
  if ((rc = ra_tensor_new(be, &x, RA_DTYPE_F32, 2, xs, err)) || (rc = ra_tensor_new(be, &y, RA_DTYPE_F32, 2, ys, err)) ||
      (rc = be->ops->fill_random(be, &x, 5, 0.0f, 1.0f, err)))
    goto done;
  for (int i = 0; i < 55; i++) {
    float ms_ = 0.0f;
    if ((rc = ra_cuda_timer_start(tm, err)) || (rc = be->ops->matmul(be, &x, &m->layers[0].w_up, NULL, &y, 0, err)) ||
        (rc = ra_cuda_timer_stop(tm, &ms_, err)))
      goto done;
    if (i >= 5) t[i - 5] = ms_;
  }
  qsort(t, 50, sizeof(double), cmp_double);
  *gemv_gbps = (double)m->layers[0].w_up.nbytes / (pct(t, 50, 0.5) * 1e-3) / 1e9;
  if ((rc = ra_tensor_new(be, &q, RA_DTYPE_F32, 2, qs, err)) || (rc = ra_tensor_new(be, &o, RA_DTYPE_F32, 2, qs, err)) ||
      (rc = ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, ms, err)) ||
      (rc = ra_tensor_new(be, &kc, RA_DTYPE_BF16, 3, cs, err)) ||
      (rc = ra_tensor_new(be, &vc, RA_DTYPE_BF16, 3, cs, err)) || (rc = be->ops->fill_random(be, &q, 6, 0.0f, 1.0f, err)) ||
      (rc = be->ops->fill_random(be, &kc, 7, 0.0f, 1.0f, err)) || (rc = be->ops->fill_random(be, &vc, 8, 0.0f, 1.0f, err)))
    goto done;
  ra_token_range all = {0, ctx};
  for (int i = 0; i < 55; i++) {
    float ms_ = 0.0f;
    if ((rc = ra_cuda_timer_start(tm, err)) ||
        (rc = be->ops->attn_decode(be, &q, &kc, &vc, &all, 1, 0.088f, &o, &ml, err)) ||
        (rc = ra_cuda_timer_stop(tm, &ms_, err)))
      goto done;
    if (i >= 5) t[i - 5] = ms_;
  }
  qsort(t, 50, sizeof(double), cmp_double);
  *attn_gbps = (double)(kc.nbytes + vc.nbytes) / (pct(t, 50, 0.5) * 1e-3) / 1e9;
done:
  ra_tensor_free(&x);
  ra_tensor_free(&y);
  ra_tensor_free(&q);
  ra_tensor_free(&kc);
  ra_tensor_free(&vc);
  ra_tensor_free(&o);
  ra_tensor_free(&ml);
  return rc;
}

static void write_json(FILE *f, const opts *o, const char *dev, int n_sm, const ra_model_config *c,
                       const decode_result *dec, int n_dec, const prefill_result *pf, double gemv_gbps,
                       double attn_gbps) {
  fprintf(f, "{\n  \"bench\": \"cuda-bench\",\n  \"device\": \"%s\",\n  \"n_sm\": %d,\n", dev, n_sm);
  fprintf(f,
          "  \"model\": {\"geometry\": \"llama3-8b\", \"weights\": \"random BF16 (fill_random)\", \"n_layers\": %d, "
          "\"dim\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"ffn_dim\": %d, \"vocab\": %d, "
          "\"kv_dtype\": \"bf16\"},\n",
          c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab);
  fprintf(f, "  \"path\": \"ra_model_forward (model runtime) on the cuda backend\",\n");
  fprintf(f, "  \"hbm_bandwidth_gbps\": %.0f,\n  \"decode\": [\n", o->bw_gbps);
  for (int i = 0; i < n_dec; i++) {
    const decode_result *d = &dec[i];
    fprintf(f,
            "    {\"context\": %lld, \"batch\": 1, \"kv_cache\": \"random data of the right shape (fill_random), no "
            "real prefill\", \"warmup_steps\": %d, \"timed_steps\": %d, \"ms_per_token_median\": %.4f, "
            "\"ms_per_token_p10\": %.4f, \"ms_per_token_p90\": %.4f, \"ms_per_token_mean\": %.4f, "
            "\"tokens_per_s\": %.2f, \"weight_bytes\": %.4g, \"kv_bytes\": %.4g, \"roofline_ms\": %.4f, "
            "\"roofline_fraction\": %.4f, \"weight_bytes_read\": %.4g, \"roofline_ms_bytes_read\": %.4f, "
            "\"roofline_fraction_bytes_read\": %.4f, \"target_fraction\": 0.70, \"meets_target\": %s}%s\n",
            (long long)d->ctx, o->warmup, o->steps, d->med_ms, d->p10_ms, d->p90_ms, d->mean_ms, 1e3 / d->med_ms,
            d->weight_bytes_brief, d->kv_bytes, d->roof_ms_brief, d->roof_ms_brief / d->med_ms, d->weight_bytes_read,
            d->roof_ms_read, d->roof_ms_read / d->med_ms, d->roof_ms_brief / d->med_ms >= 0.70 ? "true" : "false",
            i + 1 < n_dec ? "," : "");
  }
  fprintf(f, "  ],\n");
  if (pf)
    fprintf(f,
            "  \"prefill\": {\"context\": %lld, \"chunk\": %d, \"seconds\": %.3f, \"tokens_per_s\": %.1f, "
            "\"first_chunk_ms\": %.2f, \"last_chunk_ms\": %.2f},\n",
            (long long)pf->ctx, pf->chunk, pf->seconds, pf->tok_per_s, pf->first_chunk_ms, pf->last_chunk_ms);
  fprintf(f, "  \"kernels\": {\"gemv_ffn_up_gbps\": %.1f, \"attn_decode_32k_gbps\": %.1f}\n}\n", gemv_gbps, attn_gbps);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == 0 || *end != 0 || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  opts o = {NULL, 32, 5, 32, 2048, 0, 32768, 4800.0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = v == NULL, pc = 0;
    if (!bad && strcmp(a, "--json") == 0) o.json = v;
    else if (!bad && strcmp(a, "--steps") == 0) bad = parse_int(v, 20, 100000, &o.steps);
    else if (!bad && strcmp(a, "--warmup") == 0) bad = parse_int(v, 1, 100000, &o.warmup);
    else if (!bad && strcmp(a, "--layers") == 0) bad = parse_int(v, 1, 32, &o.layers);
    else if (!bad && strcmp(a, "--chunk") == 0) bad = parse_int(v, 1, 32768, &o.chunk);
    else if (!bad && strcmp(a, "--device") == 0) bad = parse_int(v, 0, 1024, &o.device);
    else if (!bad && strcmp(a, "--prefill-ctx") == 0) {
      bad = parse_int(v, 0, 1 << 20, &pc);
      o.prefill_ctx = pc;
    } else if (!bad && strcmp(a, "--bw-gbps") == 0) {
      o.bw_gbps = atof(v);
      bad = !(o.bw_gbps > 0);
    } else
      bad = 1;
    if (bad) {
      fprintf(stderr,
              "usage: %s [--json FILE] [--steps N>=20] [--warmup N] [--layers N<=32] [--chunk N] [--prefill-ctx N "
              "(0: skip)] [--bw-gbps X] [--device N]\n",
              argv[0]);
      return 2;
    }
    i++;
  }
  ra_error err;
  ra_backend *be = NULL;
  ra_backend_config cfg = {0, o.device};
  int rc = ra_backend_cuda_create(&cfg, &be, &err);
  if (rc == RA_EUNAVAIL) {
    printf("SKIP: no CUDA device (%s)\n", err.msg);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "cuda-bench: %s\n", err.msg);
    return 1;
  }
  char dev[256];
  int n_sm = 0;
  ra_backend_cuda_device_info(be, dev, sizeof dev, &n_sm, NULL, NULL);
  ra_model_config mc;
  ra_model *m = NULL;
  ra_cuda_timer *tm = NULL;
  decode_result dec[2];
  prefill_result pf;
  memset(dec, 0, sizeof dec);
  memset(&pf, 0, sizeof pf);
  double gemv_gbps = 0.0, attn_gbps = 0.0;
  const int64_t ctxs[2] = {8192, 32768};
  if ((rc = ra_model_config_preset("llama3-8b", &mc, &err))) goto fail;
  mc.n_layers = o.layers;
  fprintf(stderr, "cuda-bench: %s, llama3-8b geometry with %d layers, random weights...\n", dev, mc.n_layers);
  if ((rc = ra_model_random(be, &mc, 42, &m, &err)) || (rc = ra_cuda_model_to_bf16(m, &err)) ||
      (rc = ra_cuda_timer_create(be, &tm, &err)))
    goto fail;
  for (int i = 0; i < 2; i++) {
    fprintf(stderr, "cuda-bench: decode at context %lld...\n", (long long)ctxs[i]);
    if ((rc = run_decode(be, m, tm, &o, ctxs[i], &dec[i], &err))) goto fail;
    fprintf(stderr, "  %.3f ms/token (roofline %.3f ms: %.1f%%)\n", dec[i].med_ms, dec[i].roof_ms_brief,
            100.0 * dec[i].roof_ms_brief / dec[i].med_ms);
  }
  if (o.prefill_ctx > 0) {
    fprintf(stderr, "cuda-bench: prefill of %lld tokens in chunks of %d...\n", (long long)o.prefill_ctx, o.chunk);
    if ((rc = run_prefill(be, m, tm, &o, &pf, &err))) goto fail;
    fprintf(stderr, "  %.1f tokens/s (%.2f s)\n", pf.tok_per_s, pf.seconds);
  }
  fprintf(stderr, "cuda-bench: kernels alone...\n");
  if ((rc = run_kernels(be, m, tm, &gemv_gbps, &attn_gbps, &err))) goto fail;
  write_json(stdout, &o, dev, n_sm, &mc, dec, 2, o.prefill_ctx > 0 ? &pf : NULL, gemv_gbps, attn_gbps);
  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f) {
      rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
      goto fail;
    }
    write_json(f, &o, dev, n_sm, &mc, dec, 2, o.prefill_ctx > 0 ? &pf : NULL, gemv_gbps, attn_gbps);
    if (fclose(f) != 0) {
      rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
      goto fail;
    }
  }
  ra_cuda_timer_destroy(tm);
  ra_model_free(m);
  ra_backend_destroy(be);
  return 0;
fail:
  fprintf(stderr, "cuda-bench: %s\n", err.msg);
  ra_cuda_timer_destroy(tm);
  ra_model_free(m);
  ra_backend_destroy(be);
  return 1;
}
