/* model-bench: prefill and decode throughput of the model runtime at given context lengths.
 *   model-bench --model PATH [--ctx 2048,8192] [--decode 32] [--backend cpu] [--threads N]
 *               [--kv-dtype f32|f16] [--batch 512] [--json FILE]
 * For each context length L: prefill L tokens (ids cycled from a fixed pseudo-random sequence,
 * in chunks of --batch), then decode --decode tokens greedily on top of that context.
 * Prints a JSON object (and writes it to --json FILE). */
#include "generate.h"
#include "loader.h"
#include "log.h"
#include "procenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CTX_POINTS 16

static void usage(void) {
  fprintf(stderr, "usage: model-bench --model PATH|random:PRESET [--ctx 2048,8192] [--decode 32] [--backend cpu|cuda]\n"
                  "                   [--threads N] [--kv-dtype f32|f16|bf16] [--batch N] [--json FILE]\n");
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv);
  ra_log_set_name("model-bench");
  const char *model = NULL, *backend = "cpu", *json = NULL, *ctx_list = "2048,8192";
  int decode = 32, threads = 0;
  long batch = 512;
  ra_dtype kv = RA_DTYPE_F32;
  for (int i = 1; i < argc; i += 2) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      usage();
      return 2;
    }
    if (strcmp(argv[i], "--model") == 0) model = v;
    else if (strcmp(argv[i], "--backend") == 0) backend = v;
    else if (strcmp(argv[i], "--json") == 0) json = v;
    else if (strcmp(argv[i], "--ctx") == 0) ctx_list = v;
    else if (strcmp(argv[i], "--decode") == 0) decode = atoi(v);
    else if (strcmp(argv[i], "--threads") == 0) threads = atoi(v);
    else if (strcmp(argv[i], "--batch") == 0) batch = atol(v);
    else if (strcmp(argv[i], "--kv-dtype") == 0) {
      if (ra_dtype_parse(v, &kv) || kv == RA_DTYPE_I8) { /* int8 is a store dtype only */
        usage();
        return 2;
      }
    } else {
      usage();
      return 2;
    }
  }
  long ctxs[MAX_CTX_POINTS];
  int n_ctx = 0;
  for (const char *p = ctx_list; *p && n_ctx < MAX_CTX_POINTS;) {
    char *end;
    ctxs[n_ctx] = strtol(p, &end, 10);
    if (end == p || ctxs[n_ctx] < 1) {
      usage();
      return 2;
    }
    n_ctx++;
    p = *end == ',' ? end + 1 : end;
  }
  if (!model || decode < 1 || batch < 1) {
    usage();
    return 2;
  }
  ra_error err;
  ra_error_clear(&err);
  ra_backend *be = NULL;
  ra_model *m = NULL;
  ra_tokenizer *tok = NULL;
  ra_backend_config bc = {threads, 0};
  int rc = ra_backend_create(backend, &bc, &be, &err);
  if (rc == RA_OK) rc = ra_load_model(be, model, NULL, 1, &m, &tok, &err);
  char *out = NULL;
  size_t out_len = 0;
  FILE *js = open_memstream(&out, &out_len);
  if (rc == RA_OK) {
    fprintf(js, "{\"model\": \"%s\", \"backend\": \"%s\", \"kv_dtype\": \"%s\", \"batch\": %ld, \"decode_tokens\": %d, \"results\": [",
            m->cfg.name, backend, ra_dtype_name(kv), batch, decode);
  }
  for (int c = 0; rc == RA_OK && c < n_ctx; c++) {
    long L = ctxs[c];
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < L; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids[i] = (int32_t)((s >> 33) % (uint64_t)(m->cfg.vocab > 256 ? 256 + (m->cfg.vocab - 256) / 4 : m->cfg.vocab));
    }
    ra_state *st = NULL;
    rc = ra_state_new(m, L + decode + 1, batch < L ? batch : L, kv, &st, &err);
    ra_gen_result res;
    ra_gen_config gc = {.max_new_tokens = decode + 1, .temperature = 0.0f, .top_p = 1.0f, .top_k = 1, .seed = 1};
    if (rc == RA_OK) rc = ra_generate(st, NULL, ids, (size_t)L, &gc, NULL, NULL, &res, &err);
    if (rc == RA_OK) {
      double pf = (double)L / res.prefill_s, dc = (double)res.n_decode_steps / res.decode_s;
      fprintf(stderr, "ctx %ld: prefill %.2f s (%.1f tok/s), decode %zu steps %.2f s (%.2f tok/s)\n", L, res.prefill_s, pf,
              res.n_decode_steps, res.decode_s, dc);
      fprintf(js, "%s{\"ctx\": %ld, \"prefill_s\": %.4f, \"prefill_tok_s\": %.2f, \"decode_steps\": %zu, \"decode_s\": %.4f, \"decode_tok_s\": %.3f}",
              c ? ", " : "", L, res.prefill_s, pf, res.n_decode_steps, res.decode_s, dc);
      ra_gen_result_free(&res);
    }
    ra_state_free(st);
    free(ids);
  }
  if (js) {
    if (rc == RA_OK) fprintf(js, "]}\n");
    fclose(js);
  }
  if (rc == RA_OK) {
    fputs(out, stdout);
    if (json) {
      FILE *f = fopen(json, "w");
      if (!f || fputs(out, f) < 0) rc = ra_errorf(&err, RA_EIO, "cannot write %s", json);
      if (f) fclose(f);
    }
  }
  if (rc != RA_OK) fprintf(stderr, "model-bench: error: %s\n", err.msg);
  free(out);
  ra_tok_free(tok);
  ra_model_free(m);
  ra_backend_destroy(be);
  return rc == RA_OK ? 0 : 1;
}
