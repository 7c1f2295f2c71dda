/* attn-prefill-bench: the attn_prefill op alone on the CUDA backend, as a chunked prefill calls
 * it: for a prompt of ctx tokens, the chunks [p, p + c) (p = 0, c, 2c, ...) each attend to the
 * cache rows [0, p + c). One walk over the chunks is one layer's attention of the prefill; its
 * time, the causal FLOPs it does (4 * head_dim * n_heads * ctx (ctx + 1) / 2: Q K^T and P V)
 * over that time, and the walk times n_layers (the attention share of a whole prefill).
 *
 * Geometries: Llama-3-8B (32 q / 8 kv heads, head_dim 128; BF16 and F16 KV) and SmolLM2-135M
 * (9 / 3, head_dim 64; BF16 KV). Queries, keys and values are random (fill_random), the same
 * chunk of queries at every position. Median of --reps walks after a warm-up chunk.
 *
 * Each geometry and context runs with the mma.sync kernel (ra_backend_cuda_set_prefill_kernel
 * MMA) and then with the default choice, the wgmma kernel on sm_90 ("kernel" in the rows; the
 * second run is left out where the default is the same kernel). The two walks' last chunks are
 * compared: their max abs difference is printed and stored in the wgmma row, and one over
 * kMaxDiff fails the run.
 *
 * Usage: attn-prefill-bench [--json FILE] [--chunk N] [--reps N] [--max-ctx N] [--device N]
 * Exit 0 on success, 1 on an error or outputs that differ, 2 on bad usage, 77 without a CUDA
 * device. */
#include "backend.h"
#include "backend_cuda.h"
#include "bench_time.h"
#include "opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct geometry {
  const char *name;
  int hq, hkv, hd, n_layers;
  ra_dtype kv;
} geometry;

static const geometry kGeoms[] = {
    {"llama3-8b", 32, 8, 128, 32, RA_DTYPE_BF16},
    {"llama3-8b", 32, 8, 128, 32, RA_DTYPE_F16},
    {"smollm2-135m", 9, 3, 64, 30, RA_DTYPE_BF16},
};
static const int64_t kCtx[] = {8192, 32768, 131072};
enum { N_GEOM = sizeof kGeoms / sizeof kGeoms[0], N_CTX = sizeof kCtx / sizeof kCtx[0], MAX_REPS = 15 };
/* wgmma against mma.sync on the last chunk: both round Q and P to the cache's 16-bit type and
 * accumulate in fp32, in different orders */
static const double kMaxDiff = 2e-2;

typedef struct walk_result {
  double med_s, min_s, first_chunk_ms, last_chunk_ms;
} walk_result;

/* One walk over the chunks of a ctx-token prompt: seconds (sum of the chunks' event times). */
static int walk(ra_backend *be, ra_cuda_timer *tm, ra_tensor *q, ra_tensor *o, ra_tensor *kc, ra_tensor *vc,
                int64_t ctx, int64_t chunk, float scale, double *secs, double *first_ms, double *last_ms,
                ra_error *err) {
  double total = 0.0;
  for (int64_t p = 0; p < ctx; p += chunk) {
    int64_t cn = ctx - p < chunk ? ctx - p : chunk;
    ra_tensor qv = ra_tensor_rows(q, 0, cn), ov = ra_tensor_rows(o, 0, cn);
    float ms = 0.0f;
    int rc;
    if ((rc = ra_cuda_timer_start(tm, err)) || (rc = be->ops->attn_prefill(be, &qv, kc, vc, p, scale, &ov, err)) ||
        (rc = ra_cuda_timer_stop(tm, &ms, err)))
      return rc;
    if (p == 0) *first_ms = ms;
    *last_ms = ms;
    total += ms;
  }
  *secs = total / 1e3;
  return RA_OK;
}

/* Times the walks; the last chunk's output ([cn, hq, hd], cn its rows) goes to last_out
 * (chunk * hq * hd floats). */
static int run_geometry(ra_backend *be, ra_cuda_timer *tm, const geometry *g, int64_t ctx, int64_t chunk, int reps,
                        walk_result *res, float *last_out, size_t *n_out, ra_error *err) {
  ra_tensor q = {0}, o = {0}, kc = {0}, vc = {0};
  int64_t qs[3] = {chunk, g->hq, g->hd}, cs[3] = {ctx, g->hkv, g->hd};
  float scale = 1.0f / sqrtf((float)g->hd);
  double t[MAX_REPS];
  int rc;
  if ((rc = ra_tensor_new(be, &q, RA_DTYPE_F32, 3, qs, err)) || (rc = ra_tensor_new(be, &o, RA_DTYPE_F32, 3, qs, err)) ||
      (rc = ra_tensor_new(be, &kc, g->kv, 3, cs, err)) || (rc = ra_tensor_new(be, &vc, g->kv, 3, cs, err)) ||
      (rc = be->ops->fill_random(be, &q, 11, 0.0f, 2.0f, err)) ||
      (rc = be->ops->fill_random(be, &kc, 12, 0.0f, 1.0f, err)) ||
      (rc = be->ops->fill_random(be, &vc, 13, 0.0f, 1.0f, err)))
    goto done;
  /* warm-up: one chunk (module load) */
  {
    ra_tensor qv = ra_tensor_rows(&q, 0, chunk < ctx ? chunk : ctx), ov = ra_tensor_rows(&o, 0, qv.shape[0]);
    if ((rc = be->ops->attn_prefill(be, &qv, &kc, &vc, 0, scale, &ov, err)) || (rc = be->ops->sync(be, err))) goto done;
  }
  for (int r = 0; r < reps; r++)
    if ((rc = walk(be, tm, &q, &o, &kc, &vc, ctx, chunk, scale, &t[r], &res->first_chunk_ms, &res->last_chunk_ms,
                   err)))
      goto done;
  /* the last chunk's output must be numbers */
  *n_out = (size_t)(ctx - (ctx - 1) / chunk * chunk) * (size_t)g->hq * (size_t)g->hd;
  if ((rc = be->ops->download(be, &o, 0, last_out, *n_out, err))) goto done;
  for (size_t i = 0; i < *n_out; i++)
    if (!isfinite(last_out[i])) {
      rc = ra_errorf(err, RA_EINTERNAL, "bench: attention output is not finite");
      goto done;
    }
  qsort(t, (size_t)reps, sizeof(double), ra_bench_cmp_double);
  res->med_s = t[reps / 2];
  res->min_s = t[0];
done:
  ra_tensor_free(&q);
  ra_tensor_free(&o);
  ra_tensor_free(&kc);
  ra_tensor_free(&vc);
  return rc;
}

static int parse(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  return ra_opts_parse_int(s, lo, hi, out, NULL) == RA_OK ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *json = NULL;
  int64_t chunk = 2048, reps = 3, max_ctx = 131072, device = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = v == NULL;
    if (!bad && strcmp(a, "--json") == 0) json = v;
    else if (!bad && strcmp(a, "--chunk") == 0) bad = parse(v, 1, 1 << 16, &chunk);
    else if (!bad && strcmp(a, "--reps") == 0) bad = parse(v, 1, MAX_REPS, &reps);
    else if (!bad && strcmp(a, "--max-ctx") == 0) bad = parse(v, 1, 1 << 20, &max_ctx);
    else if (!bad && strcmp(a, "--device") == 0) bad = parse(v, 0, 1024, &device);
    else bad = 1;
    if (bad) {
      fprintf(stderr, "usage: %s [--json FILE] [--chunk N] [--reps N<=%d] [--max-ctx N] [--device N]\n", argv[0],
              MAX_REPS);
      return 2;
    }
    i++;
  }
  ra_error err;
  ra_backend *be = NULL;
  ra_backend_config cfg = {0, (int)device};
  int rc = ra_backend_cuda_create(&cfg, &be, &err);
  if (rc == RA_EUNAVAIL) {
    printf("SKIP: no CUDA device (%s)\n", err.msg);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "attn-prefill-bench: %s\n", err.msg);
    return 1;
  }
  char dev[256];
  int n_sm = 0;
  ra_backend_cuda_device_info(be, dev, sizeof dev, &n_sm, NULL, NULL);
  ra_cuda_timer *tm = NULL;
  FILE *jf = NULL;
  float *ref = NULL, *out = NULL;
  if ((rc = ra_cuda_timer_create(be, &tm, &err))) goto fail;
  if (json && !(jf = fopen(json, "w"))) {
    rc = ra_errorf(&err, RA_EIO, "cannot write %s", json);
    goto fail;
  }
  if (jf)
    fprintf(jf, "{\n  \"bench\": \"attn-prefill-bench\",\n  \"device\": \"%s\",\n  \"n_sm\": %d,\n  \"chunk\": %lld,\n"
                "  \"reps\": %lld,\n  \"walks\": [\n", dev, n_sm, (long long)chunk, (long long)reps);
  printf("attn_prefill alone on %s, chunks of %lld, median of %lld walks\n", dev, (long long)chunk, (long long)reps);
  printf("%-14s %-5s %8s %-6s %11s %9s %12s %12s %14s %12s\n", "geometry", "kv", "ctx", "kernel", "s/layer", "TFLOP/s",
         "first ms", "last ms", "all layers s", "|d| vs mma");
  size_t max_out = 0;
  for (int gi = 0; gi < N_GEOM; gi++)
    if ((size_t)chunk * kGeoms[gi].hq * kGeoms[gi].hd > max_out) max_out = (size_t)chunk * kGeoms[gi].hq * kGeoms[gi].hd;
  /* the last chunk's output of the mma.sync walk (ref) and of the default kernel's (out) */
  if (!(ref = malloc(max_out * sizeof(float))) || !(out = malloc(max_out * sizeof(float)))) {
    rc = ra_errorf(&err, RA_ENOMEM, "out of host memory");
    goto fail;
  }
  int first = 1, differ = 0;
  for (int gi = 0; gi < N_GEOM; gi++)
    for (int ci = 0; ci < N_CTX && kCtx[ci] <= max_ctx; ci++) {
      const geometry *g = &kGeoms[gi];
      const int modes[2] = {RA_CUDA_PREFILL_MMA, RA_CUDA_PREFILL_AUTO};
      const char *ref_kernel = NULL;
      size_t n_ref = 0;
      for (int mi = 0; mi < 2; mi++) {
        if ((rc = ra_backend_cuda_set_prefill_kernel(be, modes[mi], &err))) goto fail;
        const char *kernel = ra_backend_cuda_prefill_kernel(be, g->hq, g->hkv, g->hd, g->kv, kCtx[ci]);
        if (mi == 1 && strcmp(kernel, ref_kernel) == 0) break; /* the default is the same kernel */
        walk_result r;
        memset(&r, 0, sizeof r);
        size_t n_out = 0;
        if ((rc = run_geometry(be, tm, g, kCtx[ci], chunk, (int)reps, &r, mi ? out : ref, mi ? &n_out : &n_ref,
                               &err)))
          goto fail;
        double diff = -1.0; /* not compared */
        if (mi == 0) {
          ref_kernel = kernel;
        } else {
          diff = 0.0;
          for (size_t i = 0; i < n_out; i++) {
            const double d = fabs((double)out[i] - (double)ref[i]);
            if (d > diff) diff = d;
          }
          if (!(diff <= kMaxDiff)) differ = 1;
        }
        const double flop = 4.0 * g->hd * g->hq * (double)kCtx[ci] * (double)(kCtx[ci] + 1) / 2.0;
        const double tflops = flop / r.med_s / 1e12;
        char dtxt[32] = "";
        if (diff >= 0.0) snprintf(dtxt, sizeof dtxt, "%.3g%s", diff, diff <= kMaxDiff ? "" : " FAIL");
        printf("%-14s %-5s %8lld %-6s %11.4f %9.1f %12.2f %12.2f %14.2f %12s\n", g->name, ra_dtype_name(g->kv),
               (long long)kCtx[ci], kernel, r.med_s, tflops, r.first_chunk_ms, r.last_chunk_ms, r.med_s * g->n_layers,
               dtxt);
        if (jf) {
          fprintf(jf,
                  "%s    {\"geometry\": \"%s\", \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"kv_dtype\": "
                  "\"%s\", \"ctx\": %lld, \"kernel\": \"%s\", \"seconds_per_layer_median\": %.6f, "
                  "\"seconds_per_layer_min\": %.6f, \"causal_flop\": %.6g, \"tflops\": %.2f, \"first_chunk_ms\": %.3f, "
                  "\"last_chunk_ms\": %.3f, \"n_layers\": %d, \"seconds_all_layers\": %.3f",
                  first ? "" : ",\n", g->name, g->hq, g->hkv, g->hd, ra_dtype_name(g->kv), (long long)kCtx[ci], kernel,
                  r.med_s, r.min_s, flop, tflops, r.first_chunk_ms, r.last_chunk_ms, g->n_layers,
                  r.med_s * g->n_layers);
          if (diff >= 0.0) fprintf(jf, ", \"max_abs_diff_vs_mma\": %.6g", diff);
          fprintf(jf, "}");
        }
        first = 0;
        fflush(stdout);
      }
      if ((rc = ra_backend_cuda_set_prefill_kernel(be, RA_CUDA_PREFILL_AUTO, &err))) goto fail;
    }
  if (jf) {
    fprintf(jf, "\n  ]\n}\n");
    if (fclose(jf) != 0) {
      jf = NULL;
      rc = ra_errorf(&err, RA_EIO, "cannot write %s", json);
      goto fail;
    }
    jf = NULL;
  }
  free(ref);
  free(out);
  ra_cuda_timer_destroy(tm);
  ra_backend_destroy(be);
  if (differ) {
    fprintf(stderr, "attn-prefill-bench: the kernels' outputs differ by more than %g\n", kMaxDiff);
    return 1;
  }
  return 0;
fail:
  fprintf(stderr, "attn-prefill-bench: %s\n", err.msg);
  if (jf) fclose(jf);
  free(ref);
  free(out);
  ra_cuda_timer_destroy(tm);
  ra_backend_destroy(be);
  return 1;
}
