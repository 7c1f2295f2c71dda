/* cuda-batch-bench: what a decode step of B sequences costs on the CUDA backend: the batched
 * forward `gpu-worker serve` runs in full mode (ra_batch_forward, one token per sequence),
 * Llama-3-8B geometry, random BF16 weights; each sequence's cache holds --ctx tokens of random
 * data (a decode step's cost does not depend on the values).
 *
 *   step       per batch B and per --waves setting of attn_decode_batch: the median ms of a
 *              B-sequence step (event timing of the forward alone), tokens/s, and the bytes the
 *              step must read (the weights once, the B caches) over its time; beside it the
 *              step as serve's engine runs it, timed by the host's clock: the forward, then
 *              topk_rows of the B logits rows (greedy sampling), which waits for the device
 *              (step_sampled_ms_median; serve adds its HTTP and engine work to that)
 *   attention  attn_decode_batch of the B sequences over one layer's caches, alone, per --waves
 *   matmul     a layer's seven matmuls with x of B rows, alone (the GEMV up to
 *              RA_CUDA_GEMV_MAX_X rows, the tensor-core kernel up to --mma-rows, cuBLAS above)
 *
 * Usage: cuda-batch-bench [--batches 1,4,16] [--waves 1,2,4,8] [--ctx 32768] [--steps 20]
 *                         [--warmup 3] [--layers 32] [--mma-rows 10] [--device 0] [--json FILE]
 * Exit 0 on success, 1 on an error, 2 on bad options, 77 without a CUDA device. */
#include "backend.h"
#include "backend_cuda.h"
#include "batch.h"
#include "bench_time.h"
#include "clock.h"
#include "model.h"
#include "opts.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LIST = 8, MAX_B = 32 };

typedef struct opts {
  int64_t batches[MAX_LIST], waves[MAX_LIST];
  int n_batches, n_waves;
  int64_t ctx, steps, warmup, layers, mma_rows, device;
  const char *json;
} opts;

static int batches_parse(const char *v, void *field, ra_error *err) {
  opts *o = (opts *)((char *)field - offsetof(opts, batches));
  return ra_opts_parse_int_list(v, 1, MAX_B, o->batches, MAX_LIST, &o->n_batches, err);
}

static int waves_parse(const char *v, void *field, ra_error *err) {
  opts *o = (opts *)((char *)field - offsetof(opts, waves));
  return ra_opts_parse_int_list(v, 1, RA_CUDA_DECODE_BATCH_MAX_WAVES, o->waves, MAX_LIST, &o->n_waves, err);
}

#define AT(m) RA_OPT_AT(opts, m)
static const ra_opt opt_rows[] = {
    {"batches", RA_OPT_CUSTOM, AT(batches), .parse = batches_parse, .meta = "B[,B...]",
     .help = "sequences per step, each timed", .dflt = "1,4,16"},
    {"waves", RA_OPT_CUSTOM, AT(waves), .parse = waves_parse, .meta = "W[,W...]",
     .help = "attn_decode_batch settings timed (ra_backend_cuda_set_decode_batch_waves)", .dflt = "1,2,4,8"},
    {"ctx", RA_OPT_INT, AT(ctx), .lo = 1, .hi = 1 << 20, .meta = "N", .help = "tokens in each sequence's cache"},
    {"steps", RA_OPT_INT, AT(steps), .lo = 5, .hi = 10000, .meta = "N", .help = "timed steps per setting"},
    {"warmup", RA_OPT_INT, AT(warmup), .lo = 1, .hi = 1000, .meta = "N", .help = "untimed steps first"},
    {"layers", RA_OPT_INT, AT(layers), .lo = 1, .hi = 32, .meta = "N", .help = "layers of the model"},
    {"mma-rows", RA_OPT_INT, AT(mma_rows), .lo = 0, .hi = RA_CUDA_MMA_MAX_X, .meta = "N",
     .help = "rows of x up to which matmuls take the tensor-core kernel (0: cuBLAS past the GEMV)"},
    {"device", RA_OPT_INT, AT(device), .lo = 0, .hi = 1024, .meta = "N", .help = "CUDA device"},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "also write the JSON there"},
};
#undef AT

static int parse_opts(int argc, char **argv, opts *o) {
  *o = (opts){.batches = {1, 4, 16}, .n_batches = 3, .waves = {1, 2, 4, 8}, .n_waves = 4, .ctx = 32768,
              .steps = 20, .warmup = 3, .layers = 32, .mma_rows = RA_CUDA_MMA_DEFAULT_X};
  ra_opts_table t = {opt_rows, RA_OPTS_COUNT(opt_rows), o, NULL};
  ra_opts_set set = {&t, 1, NULL, 0};
  ra_error err;
  if (ra_opts_parse_args(&set, argc - 1, argv + 1, &err) == RA_OK) return 0;
  fprintf(stderr, "cuda-batch-bench: %s\nusage: cuda-batch-bench [options]\n", err.msg);
  ra_opts_usage(&set, stderr);
  return 2;
}

typedef struct step_result {
  int b, waves;
  double med_ms, p90_ms, sampled_ms, attn_us, bytes;
} step_result;

typedef struct bench {
  const opts *o;
  ra_backend *be;
  const ra_model *m;
  ra_cuda_timer *tm;
  ra_state *st[MAX_B];
  ra_batch *batch;
  /* attention alone: one q per sequence, its o and ml */
  ra_tensor q[MAX_B], out[MAX_B], ml[MAX_B];
  ra_attn_decode_item items[MAX_B];
  int n_items;
} bench;

static int attn_batch_op(ra_backend *be, void *ctx, ra_error *err) {
  bench *b = ctx;
  return be->ops->attn_decode_batch(be, b->items, b->n_items, 0.088f, err);
}

/* One step of B sequences, each fed one token: item i's token of step s. */
static void step_items(bench *bn, int B, int s, int32_t *tok, ra_batch_item *items) {
  for (int i = 0; i < B; i++) {
    tok[i] = (int32_t)((12345 + 7919 * (s * B + i)) % bn->m->cfg.vocab);
    items[i] = (ra_batch_item){bn->st[i], &tok[i], 1, NULL};
  }
}

/* Median and p90 of `steps` B-sequence steps after the warm-up, every cache at ctx tokens (event
 * timing of the forward), then the median of as many steps as serve's engine runs them (host
 * clock: the forward, then the greedy pick of every row, which waits for the device). */
static int time_steps(bench *bn, int B, double *med_ms, double *p90_ms, double *sampled_ms, ra_error *err) {
  const opts *o = bn->o;
  int n = (int)(o->warmup + o->steps), rc = RA_OK;
  double *ms = calloc((size_t)n, sizeof *ms);
  int32_t *tok = calloc((size_t)B, sizeof *tok), ids[MAX_B];
  float vals[MAX_B];
  ra_batch_item items[MAX_B];
  if (!ms || !tok) rc = ra_errorf(err, RA_ENOMEM, "bench: out of memory");
  for (int i = 0; i < B; i++) bn->st[i]->pos = o->ctx;
  for (int s = 0; rc == RA_OK && s < n; s++) {
    step_items(bn, B, s, tok, items);
    float t = 0.0f;
    if ((rc = ra_cuda_timer_start(bn->tm, err)) || (rc = ra_batch_forward(bn->batch, items, B, err)) ||
        (rc = ra_cuda_timer_stop(bn->tm, &t, err)))
      break;
    ms[s] = t;
  }
  if (rc == RA_OK) {
    /* the step produced numbers, not NaN */
    float probe[8];
    ra_tensor lg = ra_tensor_rows(ra_batch_logits(bn->batch), B - 1, 1);
    rc = bn->be->ops->download(bn->be, &lg, 0, probe, 8, err);
    for (int i = 0; rc == RA_OK && i < 8; i++)
      if (!isfinite(probe[i])) rc = ra_errorf(err, RA_EINTERNAL, "bench: logits are not finite");
  }
  if (rc == RA_OK) {
    qsort(ms + o->warmup, (size_t)o->steps, sizeof *ms, ra_bench_cmp_double);
    *med_ms = ra_bench_pct(ms + o->warmup, (int)o->steps, 0.5);
    *p90_ms = ra_bench_pct(ms + o->warmup, (int)o->steps, 0.9);
  }
  /* the caches back to ctx tokens, so that both loops attend over the same lengths */
  for (int i = 0; rc == RA_OK && i < B; i++) bn->st[i]->pos = o->ctx;
  const ra_tensor lg = ra_tensor_rows(ra_batch_logits(bn->batch), 0, B);
  for (int s = 0; rc == RA_OK && s < n; s++) {
    step_items(bn, B, s, tok, items);
    double t0 = ra_clock_now_s();
    if ((rc = ra_batch_forward(bn->batch, items, B, err)) ||
        (rc = bn->be->ops->topk_rows(bn->be, &lg, 1, ids, vals, err)))
      break;
    ms[s] = (ra_clock_now_s() - t0) * 1e3;
  }
  if (rc == RA_OK) {
    qsort(ms + o->warmup, (size_t)o->steps, sizeof *ms, ra_bench_cmp_double);
    *sampled_ms = ra_bench_pct(ms + o->warmup, (int)o->steps, 0.5);
  }
  free(ms);
  free(tok);
  return rc;
}

typedef struct matmul_ctx {
  const ra_tensor *w[7];
  ra_tensor *x, *y;
  int rows;
} matmul_ctx;

/* the layer's seven matmuls, x and y views of the shared buffers */
static int layer_matmuls_op(ra_backend *be, void *ctx, ra_error *err) {
  matmul_ctx *c = ctx;
  for (int i = 0; i < 7; i++) {
    ra_tensor xv = *c->x, yv = *c->y;
    xv.shape[0] = yv.shape[0] = c->rows;
    xv.shape[1] = c->w[i]->shape[1];
    xv.nbytes = (size_t)c->rows * (size_t)c->w[i]->shape[1] * sizeof(float);
    yv.shape[1] = c->w[i]->shape[0];
    yv.nbytes = (size_t)c->rows * (size_t)c->w[i]->shape[0] * sizeof(float);
    int rc = be->ops->matmul(be, &xv, c->w[i], NULL, &yv, 0, err);
    if (rc) return rc;
  }
  return RA_OK;
}

static int time_matmuls(bench *bn, int rows, double *us, double *bytes, ra_error *err) {
  const ra_model_config *c = &bn->m->cfg;
  const ra_layer_weights *L = &bn->m->layers[0];
  matmul_ctx mc = {{&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down}, NULL, NULL, rows};
  ra_tensor x = {0}, y = {0};
  int64_t wide = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;
  int64_t xs[2] = {rows, wide}, ys[2] = {rows, wide};
  int rc;
  if ((rc = ra_tensor_new(bn->be, &x, RA_DTYPE_F32, 2, xs, err)) == RA_OK &&
      (rc = ra_tensor_new(bn->be, &y, RA_DTYPE_F32, 2, ys, err)) == RA_OK &&
      (rc = bn->be->ops->fill_random(bn->be, &x, 5, 0.0f, 1.0f, err)) == RA_OK) {
    mc.x = &x;
    mc.y = &y;
    rc = ra_bench_time_op(bn->tm, bn->be, layer_matmuls_op, &mc, us, err);
  }
  *bytes = 0.0;
  for (int i = 0; i < 7; i++) *bytes += (double)mc.w[i]->nbytes;
  ra_tensor_free(&x);
  ra_tensor_free(&y);
  return rc;
}

/* The weights a step reads once: every layer's matrices and the output matrix (norms are
 * noise). */
static double weight_bytes(const ra_model *m) {
  double s = (double)(m->cfg.tied_embeddings ? m->tok_embd.nbytes : m->output.nbytes);
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const ra_layer_weights *L = &m->layers[l];
    const ra_tensor *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < 7; i++) s += (double)ws[i]->nbytes;
  }
  return s;
}

static int run(bench *bn, step_result *res, int *n_res, double *mm_us, double *mm_bytes, ra_error *err) {
  const opts *o = bn->o;
  const ra_model_config *c = &bn->m->cfg;
  int max_b = 1, rc = RA_OK;
  for (int i = 0; i < o->n_batches; i++) max_b = o->batches[i] > max_b ? (int)o->batches[i] : max_b;
  int64_t qs[2] = {c->n_heads, c->head_dim}, mls[2] = {c->n_heads, 2};
  for (int i = 0; rc == RA_OK && i < max_b; i++) {
    fprintf(stderr, "cuda-batch-bench: sequence %d of %d, %lld tokens of cache...\n", i + 1, max_b, (long long)o->ctx);
    rc = ra_state_new(bn->m, o->ctx + o->warmup + o->steps + 1, 1, RA_DTYPE_BF16, &bn->st[i], err);
    for (int l = 0; rc == RA_OK && l < c->n_layers; l++) {
      rc = bn->be->ops->fill_random(bn->be, &bn->st[i]->k_cache[l], 1000 + 64 * (uint64_t)i + (uint64_t)l, 0.0f,
                                    1.0f, err);
      if (rc == RA_OK)
        rc = bn->be->ops->fill_random(bn->be, &bn->st[i]->v_cache[l], 5000 + 64 * (uint64_t)i + (uint64_t)l, 0.0f,
                                      1.0f, err);
    }
    if (rc == RA_OK && (rc = ra_tensor_new(bn->be, &bn->q[i], RA_DTYPE_F32, 2, qs, err)) == RA_OK &&
        (rc = ra_tensor_new(bn->be, &bn->out[i], RA_DTYPE_F32, 2, qs, err)) == RA_OK &&
        (rc = ra_tensor_new(bn->be, &bn->ml[i], RA_DTYPE_F32, 2, mls, err)) == RA_OK)
      rc = bn->be->ops->fill_random(bn->be, &bn->q[i], 9000 + (uint64_t)i, 0.0f, 1.0f, err);
    if (rc == RA_OK)
      bn->items[i] = (ra_attn_decode_item){&bn->q[i], &bn->st[i]->k_cache[0], &bn->st[i]->v_cache[0], o->ctx,
                                           &bn->out[i], &bn->ml[i]};
  }
  if (rc == RA_OK) rc = ra_batch_new(bn->m, max_b, max_b, &bn->batch, err);
  const double wbytes = weight_bytes(bn->m);
  const double kv_seq = 2.0 * c->n_layers * (double)(o->ctx + 1) * c->n_kv_heads * c->head_dim * 2.0;
  *n_res = 0;
  for (int bi = 0; rc == RA_OK && bi < o->n_batches; bi++) {
    const int B = (int)o->batches[bi];
    if ((rc = time_matmuls(bn, B, &mm_us[bi], mm_bytes, err))) break;
    /* one sequence takes attn_decode, which --waves does not change */
    for (int wi = 0; rc == RA_OK && wi < (B == 1 ? 1 : o->n_waves); wi++) {
      step_result *r = &res[(*n_res)++];
      r->b = B;
      r->waves = B == 1 ? 0 : (int)o->waves[wi];
      if (B > 1 && (rc = ra_backend_cuda_set_decode_batch_waves(bn->be, r->waves, err))) break;
      bn->n_items = B;
      if ((rc = ra_bench_time_op(bn->tm, bn->be, attn_batch_op, bn, &r->attn_us, err)) ||
          (rc = time_steps(bn, B, &r->med_ms, &r->p90_ms, &r->sampled_ms, err)))
        break;
      r->bytes = wbytes + B * kv_seq;
      fprintf(stderr,
              "  B %d waves %d: step %.3f ms (%.1f tok/s, %.0f GB/s), with sampling %.3f ms, attention alone %.1f us "
              "(%.0f GB/s)\n",
              B, r->waves, r->med_ms, B * 1e3 / r->med_ms, r->bytes / (r->med_ms * 1e-3) / 1e9, r->sampled_ms, r->attn_us,
              B * kv_seq / c->n_layers / (r->attn_us * 1e-6) / 1e9);
    }
  }
  if (rc == RA_OK) rc = ra_backend_cuda_set_decode_batch_waves(bn->be, RA_CUDA_DECODE_BATCH_WAVES, err);
  return rc;
}

static void write_json(FILE *f, const bench *bn, const char *dev, const step_result *res, int n_res, const double *mm_us,
                       double mm_bytes) {
  const opts *o = bn->o;
  const ra_model_config *c = &bn->m->cfg;
  const double kv_seq_layer = 2.0 * (double)(o->ctx + 1) * c->n_kv_heads * c->head_dim * 2.0;
  double one_ms = 0.0;
  for (int i = 0; i < n_res; i++)
    if (res[i].b == 1) one_ms = res[i].med_ms;
  fprintf(f, "{\n  \"bench\": \"cuda-batch-bench\",\n  \"device\": \"%s\",\n", dev);
  fprintf(f,
          "  \"model\": {\"geometry\": \"llama3-8b\", \"weights\": \"random BF16\", \"n_layers\": %d, \"kv_dtype\": "
          "\"bf16\"},\n  \"context\": %lld,\n  \"kv_cache\": \"random data of the right shape, no real prefill\",\n"
          "  \"path\": \"ra_batch_forward (serve's full-mode step), one token per sequence\",\n"
          "  \"warmup_steps\": %lld,\n  \"timed_steps\": %lld,\n  \"default_waves\": %d,\n  \"mma_rows\": %lld,\n"
          "  \"steps\": [\n",
          c->n_layers, (long long)o->ctx, (long long)o->warmup, (long long)o->steps, RA_CUDA_DECODE_BATCH_WAVES,
          (long long)o->mma_rows);
  for (int i = 0; i < n_res; i++) {
    const step_result *r = &res[i];
    fprintf(f,
            "    {\"sequences\": %d, \"waves\": %d, \"step_ms_median\": %.4f, \"step_ms_p90\": %.4f, "
            "\"step_sampled_ms_median\": %.4f, \"tokens_per_s\": %.2f, \"vs_one_sequence\": %.3f, "
            "\"bytes_read\": %.4g, \"gbps\": %.1f, \"attention_layer_us\": %.2f, \"attention_gbps\": %.1f}%s\n",
            r->b, r->waves, r->med_ms, r->p90_ms, r->sampled_ms, r->b * 1e3 / r->med_ms,
            one_ms > 0 ? r->b * one_ms / r->med_ms : 0.0, r->bytes, r->bytes / (r->med_ms * 1e-3) / 1e9, r->attn_us,
            r->b * kv_seq_layer / (r->attn_us * 1e-6) / 1e9, i + 1 < n_res ? "," : "");
  }
  fprintf(f, "  ],\n  \"matmul\": [\n");
  for (int i = 0; i < o->n_batches; i++)
    fprintf(f, "    {\"rows\": %lld, \"path\": \"%s\", \"layer_us\": %.2f, \"gbps\": %.1f}%s\n",
            (long long)o->batches[i],
            o->batches[i] <= RA_CUDA_GEMV_MAX_X ? "gemv" : o->batches[i] <= o->mma_rows ? "mma" : "cublas", mm_us[i],
            mm_bytes / (mm_us[i] * 1e-6) / 1e9, i + 1 < o->n_batches ? "," : "");
  fprintf(f, "  ]\n}\n");
}

int main(int argc, char **argv) {
  opts o;
  if (parse_opts(argc, argv, &o)) return 2;
  ra_error err;
  bench bn;
  memset(&bn, 0, sizeof bn);
  bn.o = &o;
  ra_backend_config cfg = {0, (int)o.device};
  int rc = ra_backend_cuda_create(&cfg, &bn.be, &err);
  if (rc == RA_EUNAVAIL) {
    printf("SKIP: no CUDA device (%s)\n", err.msg);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "cuda-batch-bench: %s\n", err.msg);
    return 1;
  }
  char dev[256];
  ra_backend_cuda_device_info(bn.be, dev, sizeof dev, NULL, NULL, NULL);
  if ((rc = ra_backend_cuda_set_mma_rows(bn.be, (int)o.mma_rows, &err))) {
    fprintf(stderr, "cuda-batch-bench: %s\n", err.msg);
    ra_backend_destroy(bn.be);
    return 1;
  }
  ra_model_config mc;
  ra_model *m = NULL;
  step_result res[MAX_LIST * MAX_LIST];
  double mm_us[MAX_LIST] = {0}, mm_bytes = 0.0;
  int n_res = 0;
  if ((rc = ra_model_config_preset("llama3-8b", &mc, &err)) == RA_OK) {
    mc.n_layers = (int)o.layers;
    fprintf(stderr, "cuda-batch-bench: %s, llama3-8b geometry with %d layers, random weights...\n", dev, mc.n_layers);
    if ((rc = ra_model_random(bn.be, &mc, 42, &m, &err)) == RA_OK &&
        (rc = ra_model_convert_weights(m, RA_DTYPE_BF16, &err)) == RA_OK &&
        (rc = ra_cuda_timer_create(bn.be, &bn.tm, &err)) == RA_OK) {
      bn.m = m;
      rc = run(&bn, res, &n_res, mm_us, &mm_bytes, &err);
    }
  }
  if (rc == RA_OK) {
    write_json(stdout, &bn, dev, res, n_res, mm_us, mm_bytes);
    FILE *f = o.json ? fopen(o.json, "w") : NULL;
    if (o.json && !f) rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
    if (f) {
      write_json(f, &bn, dev, res, n_res, mm_us, mm_bytes);
      if (fclose(f) != 0) rc = ra_errorf(&err, RA_EIO, "cannot write %s", o.json);
    }
  }
  if (rc) fprintf(stderr, "cuda-batch-bench: %s\n", err.msg);
  ra_batch_free(bn.batch);
  for (int i = 0; i < MAX_B; i++) {
    ra_state_free(bn.st[i]);
    ra_tensor_free(&bn.q[i]);
    ra_tensor_free(&bn.out[i]);
    ra_tensor_free(&bn.ml[i]);
  }
  ra_cuda_timer_destroy(bn.tm);
  ra_model_free(m);
  ra_backend_destroy(bn.be);
  return rc ? 1 : 0;
}
