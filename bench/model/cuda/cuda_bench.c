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
 *            Each context runs twice: kernels launched the plain way, then with programmatic
 *            dependent launch (the backend's default on sm_90), and reports both.
 *   rows     a layer's seven matmuls with x of 1..16 rows (a decode step of several tokens:
 *            retro's corrected rows, a serve step's sequences): us per layer through the GEMV (up
 *            to RA_CUDA_GEMV_MAX_X rows), the tensor-core kernel of a few rows (up to
 *            RA_CUDA_MMA_MAX_X) and cuBLAS (set_gemv_rows 1, set_mma_rows 0), and each path's
 *            GB/s of weights.
 *   kernels  every GEMV shape of a step and attn_decode at 8K / 32K alone (us, GB/s); each
 *            decode result's other_ms is the step time these do not explain (small kernels,
 *            launch gaps). It can be negative: inside a step each kernel overlaps its
 *            neighbours' start and end (programmatic dependent launch), which a kernel timed
 *            back to back with itself (one matrix, partly in L2) does not show the same way.
 *
 * Usage: cuda-bench [--json FILE] [--steps N] [--warmup N] [--layers N] [--chunk N]
 *                   [--prefill-ctx N] [--bw-gbps X] [--device N]
 * Exit 0 on success, 1 on an error, 77 without a CUDA device. */
#include "backend.h"
#include "backend_cuda.h"
#include "bench_time.h"
#include "model.h"
#include "opts.h"

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
  double kv_bytes, weight_bytes_nominal, weight_bytes_read;
  double roof_ms_nominal, roof_ms_read;
  double med_ms_no_pdl; /* the same steps launched without programmatic dependent launch */
} decode_result;

typedef struct prefill_result {
  int64_t ctx;
  int chunk;
  double seconds, tok_per_s, first_chunk_ms, last_chunk_ms;
} prefill_result;

enum { N_GEMV = 8, N_CTX = 2, N_ROWS = RA_CUDA_MMA_MAX_X };
static const char *const kGemvNames[N_GEMV] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "output"};

typedef struct kernel_times {
  int64_t gemv_m[N_GEMV], gemv_k[N_GEMV];
  double gemv_bytes[N_GEMV], gemv_us[N_GEMV];
  /* the layer's matmuls with x [n, k] at [n - 1]: through the GEMV (0 past its rows), cuBLAS */
  double rows_gemv_us[N_ROWS], rows_mma_us[N_ROWS], rows_blas_us[N_ROWS], layer_bytes;
  int64_t attn_ctx[N_CTX];
  double attn_bytes[N_CTX], attn_us[N_CTX];
  double attn1_us[N_CTX]; /* the same bytes as one kv head (4 q heads) of 8x the tokens */
} kernel_times;

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
    qsort(ms, (size_t)o->steps, sizeof(double), ra_bench_cmp_double);
    const ra_model_config *c = &m->cfg;
    res->ctx = ctx;
    res->med_ms = ra_bench_pct(ms, o->steps, 0.5);
    res->p10_ms = ra_bench_pct(ms, o->steps, 0.1);
    res->p90_ms = ra_bench_pct(ms, o->steps, 0.9);
    res->mean_ms = sum / o->steps;
    /* K and V rows [0, ctx] of every layer, BF16 */
    res->kv_bytes = 2.0 * c->n_layers * (double)(ctx + 1) * c->n_kv_heads * c->head_dim * 2.0;
    /* the nominal Llama-3-8B BF16 weight size (8.03B parameters x 2 bytes), scaled when --layers
     * shrinks the model */
    res->weight_bytes_nominal = 16.06e9 * (c->n_layers == 32 ? 1.0 : weight_bytes_read(m) / 15.01e9);
    res->weight_bytes_read = weight_bytes_read(m);
    double bw = o->bw_gbps * 1e9;
    res->roof_ms_nominal = (res->weight_bytes_nominal + res->kv_bytes) / bw * 1e3;
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

typedef struct gemv_ctx {
  const ra_tensor *w;
  ra_tensor *x, *y;
} gemv_ctx;

static int gemv_op(ra_backend *be, void *ctx, ra_error *err) {
  gemv_ctx *g = ctx;
  return be->ops->matmul(be, g->x, g->w, NULL, g->y, 0, err);
}

typedef struct attn_ctx {
  ra_tensor *q, *kc, *vc, *o, *ml;
  ra_token_range all;
} attn_ctx;

static int attn_op(ra_backend *be, void *ctx, ra_error *err) {
  attn_ctx *a = ctx;
  return be->ops->attn_decode(be, a->q, a->kc, a->vc, &a->all, 1, 0.088f, a->o, a->ml, err);
}

/* Every GEMV shape of a decode step (layer 0's weights and the output matrix) and attn_decode at
 * the decode contexts, alone: where a step's time goes. */
static int run_kernels(ra_backend *be, const ra_model *m, ra_cuda_timer *tm, kernel_times *kt, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  const ra_layer_weights *L = &m->layers[0];
  const ra_tensor *ws[N_GEMV] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                 m->cfg.tied_embeddings ? &m->tok_embd : &m->output};
  ra_tensor x = {0}, y = {0}, q = {0}, kc = {0}, vc = {0}, o = {0}, ml = {0};
  int64_t big = c->ffn_dim > c->vocab ? c->ffn_dim : c->vocab;
  int64_t xs[2] = {N_ROWS, c->ffn_dim > c->dim ? c->ffn_dim : c->dim}, ys[2] = {N_ROWS, big}, ctx = 32768;
  int64_t qs[2] = {c->n_heads, c->head_dim}, cs[3] = {ctx, c->n_kv_heads, c->head_dim}, ms[2] = {c->n_heads, 2};
  int rc;
  if ((rc = ra_tensor_new(be, &x, RA_DTYPE_F32, 2, xs, err)) || (rc = ra_tensor_new(be, &y, RA_DTYPE_F32, 2, ys, err)) ||
      (rc = be->ops->fill_random(be, &x, 5, 0.0f, 1.0f, err)))
    goto done;
  kt->layer_bytes = 0.0;
  for (int n = 1; n <= N_ROWS; n++) {
    kt->rows_gemv_us[n - 1] = kt->rows_mma_us[n - 1] = kt->rows_blas_us[n - 1] = 0.0;
    for (int i = 0; i < N_GEMV; i++) {
      /* views of the shared buffers with this matrix's shapes */
      ra_tensor xv = x, yv = y;
      xv.shape[0] = yv.shape[0] = n;
      xv.shape[1] = ws[i]->shape[1];
      xv.nbytes = (size_t)n * (size_t)ws[i]->shape[1] * sizeof(float);
      yv.shape[1] = ws[i]->shape[0];
      yv.nbytes = (size_t)n * (size_t)ws[i]->shape[0] * sizeof(float);
      gemv_ctx g = {ws[i], &xv, &yv};
      double us;
      if (n > 1 && i == N_GEMV - 1) break; /* the output matrix: the last token's logits only */
      if (n > 1) {
        /* the default path: the GEMV up to its rows, then the mma kernel */
        if ((rc = ra_bench_time_op(tm, be, gemv_op, &g, &us, err))) goto done;
        if (n <= RA_CUDA_GEMV_MAX_X)
          kt->rows_gemv_us[n - 1] += us;
        else
          kt->rows_mma_us[n - 1] += us;
        if ((rc = ra_backend_cuda_set_gemv_rows(be, 1, err)) == RA_OK) rc = ra_backend_cuda_set_mma_rows(be, 0, err);
        if (rc == RA_OK) rc = ra_bench_time_op(tm, be, gemv_op, &g, &us, err);
        if (rc == RA_OK) rc = ra_backend_cuda_set_gemv_rows(be, RA_CUDA_GEMV_MAX_X, err);
        if (rc == RA_OK) rc = ra_backend_cuda_set_mma_rows(be, RA_CUDA_MMA_MAX_X, err);
        if (rc) goto done;
        kt->rows_blas_us[n - 1] += us;
        continue;
      }
      if ((rc = ra_bench_time_op(tm, be, gemv_op, &g, &us, err))) goto done;
      kt->gemv_m[i] = ws[i]->shape[0];
      kt->gemv_k[i] = ws[i]->shape[1];
      kt->gemv_bytes[i] = (double)ws[i]->nbytes;
      kt->gemv_us[i] = us;
      if (i < N_GEMV - 1) {
        kt->rows_gemv_us[0] += us;
        kt->layer_bytes += (double)ws[i]->nbytes;
      }
    }
  }
  if ((rc = ra_tensor_new(be, &q, RA_DTYPE_F32, 2, qs, err)) || (rc = ra_tensor_new(be, &o, RA_DTYPE_F32, 2, qs, err)) ||
      (rc = ra_tensor_new(be, &ml, RA_DTYPE_F32, 2, ms, err)) ||
      (rc = ra_tensor_new(be, &kc, RA_DTYPE_BF16, 3, cs, err)) ||
      (rc = ra_tensor_new(be, &vc, RA_DTYPE_BF16, 3, cs, err)) || (rc = be->ops->fill_random(be, &q, 6, 0.0f, 1.0f, err)) ||
      (rc = be->ops->fill_random(be, &kc, 7, 0.0f, 1.0f, err)) || (rc = be->ops->fill_random(be, &vc, 8, 0.0f, 1.0f, err)))
    goto done;
  for (int i = 0; i < N_CTX; i++) {
    attn_ctx a = {&q, &kc, &vc, &o, &ml, {0, kt->attn_ctx[i]}};
    kt->attn_bytes[i] = 2.0 * (double)kt->attn_ctx[i] * c->n_kv_heads * c->head_dim * 2.0;
    if ((rc = ra_bench_time_op(tm, be, attn_op, &a, &kt->attn_us[i], err))) goto done;
    /* the same cache bytes seen as one kv head: every token row is contiguous, which tells
     * whether the [n_ctx, n_kv_heads, hd] layout (a head's rows 2 KB apart) costs bandwidth */
    ra_tensor q1 = q, o1 = o, ml1 = ml, k1 = kc, v1 = vc;
    q1.shape[0] = o1.shape[0] = ml1.shape[0] = 4;
    k1.shape[0] = v1.shape[0] = ctx * c->n_kv_heads;
    k1.shape[1] = v1.shape[1] = 1;
    attn_ctx a1 = {&q1, &k1, &v1, &o1, &ml1, {0, kt->attn_ctx[i] * c->n_kv_heads}};
    if ((rc = ra_bench_time_op(tm, be, attn_op, &a1, &kt->attn1_us[i], err))) goto done;
  }
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

/* The part of a decode step the big kernels do not explain: small kernels (RoPE and cache
 * writes, the attention reduce) and the gaps between launches; negative when the kernels overlap
 * more inside the step than alone (see the top). */
static double step_other_ms(const ra_model *m, const kernel_times *kt, int ci, double step_ms) {
  double layer_us = kt->attn_us[ci];
  for (int i = 0; i < N_GEMV - 1; i++) layer_us += kt->gemv_us[i];
  return step_ms - (layer_us * m->cfg.n_layers + kt->gemv_us[N_GEMV - 1]) / 1e3;
}

static void write_json(FILE *f, const opts *o, const char *dev, int n_sm, const ra_model *m,
                       const decode_result *dec, int n_dec, const prefill_result *pf, const kernel_times *kt) {
  const ra_model_config *c = &m->cfg;
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
            "\"roofline_fraction_bytes_read\": %.4f, \"target_fraction\": 0.70, \"meets_target\": %s, "
            "\"other_ms\": %.4f, \"ms_per_token_median_without_pdl\": %.4f}%s\n",
            (long long)d->ctx, o->warmup, o->steps, d->med_ms, d->p10_ms, d->p90_ms, d->mean_ms, 1e3 / d->med_ms,
            d->weight_bytes_nominal, d->kv_bytes, d->roof_ms_nominal, d->roof_ms_nominal / d->med_ms, d->weight_bytes_read,
            d->roof_ms_read, d->roof_ms_read / d->med_ms, d->roof_ms_nominal / d->med_ms >= 0.70 ? "true" : "false",
            step_other_ms(m, kt, i, d->med_ms), d->med_ms_no_pdl, i + 1 < n_dec ? "," : "");
  }
  fprintf(f, "  ],\n");
  if (pf)
    fprintf(f,
            "  \"prefill\": {\"context\": %lld, \"chunk\": %d, \"seconds\": %.3f, \"tokens_per_s\": %.1f, "
            "\"first_chunk_ms\": %.2f, \"last_chunk_ms\": %.2f},\n",
            (long long)pf->ctx, pf->chunk, pf->seconds, pf->tok_per_s, pf->first_chunk_ms, pf->last_chunk_ms);
  fprintf(f, "  \"rows\": [\n");
  for (int n = 1; n <= N_ROWS; n++) {
    const double g = kt->rows_gemv_us[n - 1], t = kt->rows_mma_us[n - 1], b = kt->rows_blas_us[n - 1],
                 one = kt->rows_gemv_us[0];
    fprintf(f, "    {\"rows\": %d", n);
    if (g > 0)
      fprintf(f, ", \"gemv_layer_us\": %.2f, \"gemv_vs_one_row\": %.3f, \"gemv_gbps\": %.1f", g, g / one,
              kt->layer_bytes / (g * 1e-6) / 1e9);
    if (t > 0)
      fprintf(f, ", \"mma_layer_us\": %.2f, \"mma_vs_one_row\": %.3f, \"mma_gbps\": %.1f", t, t / one,
              kt->layer_bytes / (t * 1e-6) / 1e9);
    if (b > 0)
      fprintf(f, ", \"cublas_layer_us\": %.2f, \"cublas_vs_one_row\": %.3f, \"cublas_gbps\": %.1f", b, b / one,
              kt->layer_bytes / (b * 1e-6) / 1e9);
    fprintf(f, "}%s\n", n < N_ROWS ? "," : "");
  }
  fprintf(f, "  ],\n");
  fprintf(f, "  \"kernels\": [\n");
  for (int i = 0; i < N_GEMV; i++)
    fprintf(f, "    {\"op\": \"gemv\", \"weight\": \"%s\", \"m\": %lld, \"k\": %lld, \"us\": %.2f, \"gbps\": %.1f},\n",
            kGemvNames[i], (long long)kt->gemv_m[i], (long long)kt->gemv_k[i], kt->gemv_us[i],
            kt->gemv_bytes[i] / (kt->gemv_us[i] * 1e-6) / 1e9);
  for (int i = 0; i < N_CTX; i++)
    fprintf(f,
            "    {\"op\": \"attn_decode\", \"context\": %lld, \"us\": %.2f, \"gbps\": %.1f, "
            "\"same_bytes_one_kv_head_us\": %.2f, \"same_bytes_one_kv_head_gbps\": %.1f}%s\n",
            (long long)kt->attn_ctx[i], kt->attn_us[i], kt->attn_bytes[i] / (kt->attn_us[i] * 1e-6) / 1e9,
            kt->attn1_us[i], kt->attn_bytes[i] / (kt->attn1_us[i] * 1e-6) / 1e9, i + 1 < N_CTX ? "," : "");
  fprintf(f, "  ]\n}\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  int64_t v;
  if (ra_opts_parse_int(s, lo, hi, &v, NULL) != RA_OK) return -1;
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
  decode_result dec[N_CTX];
  prefill_result pf;
  memset(dec, 0, sizeof dec);
  memset(&pf, 0, sizeof pf);
  kernel_times kt;
  memset(&kt, 0, sizeof kt);
  const int64_t ctxs[N_CTX] = {8192, 32768};
  kt.attn_ctx[0] = ctxs[0];
  kt.attn_ctx[1] = ctxs[1];
  if ((rc = ra_model_config_preset("llama3-8b", &mc, &err))) goto fail;
  mc.n_layers = o.layers;
  fprintf(stderr, "cuda-bench: %s, llama3-8b geometry with %d layers, random weights...\n", dev, mc.n_layers);
  if ((rc = ra_model_random(be, &mc, 42, &m, &err)) || (rc = ra_model_convert_weights(m, RA_DTYPE_BF16, &err)) ||
      (rc = ra_cuda_timer_create(be, &tm, &err)))
    goto fail;
  for (int i = 0; i < N_CTX; i++) {
    fprintf(stderr, "cuda-bench: decode at context %lld...\n", (long long)ctxs[i]);
    /* plain launches first (the same steps, for the ratio), then the default: PDL on sm_90 */
    decode_result plain;
    if ((rc = ra_backend_cuda_set_pdl(be, 0, &err)) || (rc = run_decode(be, m, tm, &o, ctxs[i], &plain, &err)))
      goto fail;
    if ((rc = ra_backend_cuda_set_pdl(be, 1, &err)) == RA_EUNSUPPORTED) rc = RA_OK;
    if (rc || (rc = run_decode(be, m, tm, &o, ctxs[i], &dec[i], &err))) goto fail;
    dec[i].med_ms_no_pdl = plain.med_ms;
    fprintf(stderr, "  %.3f ms/token (roofline %.3f ms: %.1f%%); without PDL %.3f ms\n", dec[i].med_ms,
            dec[i].roof_ms_nominal, 100.0 * dec[i].roof_ms_nominal / dec[i].med_ms, plain.med_ms);
  }
  if (o.prefill_ctx > 0) {
    fprintf(stderr, "cuda-bench: prefill of %lld tokens in chunks of %d...\n", (long long)o.prefill_ctx, o.chunk);
    if ((rc = run_prefill(be, m, tm, &o, &pf, &err))) goto fail;
    fprintf(stderr, "  %.1f tokens/s (%.2f s)\n", pf.tok_per_s, pf.seconds);
  }
  fprintf(stderr, "cuda-bench: kernels alone...\n");
  if ((rc = run_kernels(be, m, tm, &kt, &err))) goto fail;
  write_json(stdout, &o, dev, n_sm, m, dec, N_CTX, o.prefill_ctx > 0 ? &pf : NULL, &kt);
  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f) {
      rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
      goto fail;
    }
    write_json(f, &o, dev, n_sm, m, dec, N_CTX, o.prefill_ctx > 0 ? &pf : NULL, &kt);
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
