/* gpu-worker CLI: runs the model runtime locally.
 *   gpu-worker generate --model PATH (--prompt-file F | --prompt TEXT) [--max-new-tokens N] ...
 *   gpu-worker dump-qk  --model PATH (--prompt-file F | --prompt TEXT) --out DIR [--decode-tokens N] ...
 *   gpu-worker tokenize --model PATH (--prompt-file F | --prompt TEXT)       ids as JSON
 *   gpu-worker logits   --model PATH (--prompt-file F | --prompt TEXT) --out FILE.npy
 *   gpu-worker info     --model PATH */
#include "dump_qk.h"
#include "generate.h"
#include "json.h"
#include "loader.h"
#include "log.h"
#include "procenv.h"
#include "npy.h"
#include "offload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *usage_text =
    "usage: gpu-worker COMMAND [options]\n"
    "commands:\n"
    "  generate   prefill a prompt and generate text; prints the text and timings\n"
    "  dump-qk    write post-RoPE Q/K of a prompt (+ greedy decode) as .npy files\n"
    "  tokenize   print the token ids of a prompt as JSON\n"
    "  logits     write the logits of every prompt position as [n_tokens, vocab] .npy\n"
    "  info       print the model's configuration\n"
    "common options:\n"
    "  --model PATH            GGUF file, safetensors directory, or random:PRESET[:LAYERS] (llama3-8b, yi-6b,\n"
    "                          smollm2-135m, tiny; :LAYERS keeps the first LAYERS layers)\n"
    "  --tokenizer GGUF        tokenizer for a safetensors model\n"
    "  --prompt-file F | --prompt TEXT\n"
    "  --chat                  wrap the prompt in the model's chat template\n"
    "  --backend cpu|cuda      (default cpu)\n"
    "  --threads N             CPU threads (default: all cores)\n"
    "  --ctx N                 KV cache tokens (default: prompt + new tokens)\n"
    "  --batch N               prefill chunk size (default 512)\n"
    "  --kv-dtype f32|f16|bf16 KV cache dtype (default f32)\n"
    "  --seed N                sampling / random-weight seed (default 1)\n"
    "generate: --max-new-tokens N (default 64) --temperature T (0 = greedy, default) --top-p P --top-k K\n"
    "          --json FILE (text, tokens and timings) --no-stop (ignore EOS)\n"
    "          distributed attention (sink + window on the device, the rest in kv-stores):\n"
    "          --mode full|streaming|flat|ivf|kgraph|roar (default full: everything on the device)\n"
    "          --stores HOST:PORT,... (kv heads dealt round-robin) | --shard-map FILE\n"
    "          --sink N (128) --window N (512) --attn-top-k K (keys per head at the stores, 100)\n"
    "          --ef N --nprobe N (index search) --store-dtype f32|f16|bf16 (f16) --store-timeout-ms MS\n"
    "          --index-per-kv-head (roar: one graph per kv head from its group's queries)\n"
    "          --key-top-queries T (roar build: every offloaded key's T best queries, from the backend; 4, 0 off)\n"
    "          --build-layers N (index builds of up to N layers in flight at the stores during the prefill; 3)\n"
    "          --synthetic-prefill (benchmarks: the stores get KV computed from the token embeddings alone,\n"
    "          --batch tokens at a time, no attention or MLP; the offload, index builds and decode are real)\n"
    "dump-qk:  --out DIR --decode-tokens N (default 0) --layers 0,2,5-7 --dtype f16|f32 (default f16)\n"
    "logits:   --out FILE.npy\n";

typedef struct opts {
  const char *cmd, *model, *tokenizer, *prompt_file, *prompt, *backend, *json, *out, *layers;
  const char *stores, *shard_map;
  ra_offload_config off; /* mode == RA_MODE_FULL: no offload */
  int chat, threads, max_new, decode_tokens, no_stop, top_k, key_top_given, synthetic;
  long ctx, batch;
  float temperature, top_p;
  uint64_t seed;
  ra_dtype kv_dtype, dump_dtype;
} opts;

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gpu-worker: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n\n%s", usage_text);
  return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

_Static_assert(RA_OFFLOAD_MAX_BUILD_LAYERS == 8, "--build-layers' messages say 1 to 8");

static int parse_opts(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof(*o));
  o->backend = "cpu";
  o->max_new = 64;
  o->batch = 512;
  o->top_p = 0.95f;
  o->top_k = 40;
  o->seed = 1;
  o->kv_dtype = RA_DTYPE_F32;
  o->dump_dtype = RA_DTYPE_F16;
  ra_offload_config_default(&o->off);
  o->off.mode = RA_MODE_FULL;
  o->cmd = argv[1];
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    long n;
#define NEED_VALUE() do { if (!v) return usage_error("option %s needs a value", a); i++; } while (0)
    if (strcmp(a, "--chat") == 0) o->chat = 1;
    else if (strcmp(a, "--no-stop") == 0) o->no_stop = 1;
    else if (strcmp(a, "--index-per-kv-head") == 0) o->off.roar_per_kv_head = 1;
    else if (strcmp(a, "--synthetic-prefill") == 0) o->synthetic = 1;
    else if (strcmp(a, "--model") == 0) { NEED_VALUE(); o->model = v; }
    else if (strcmp(a, "--tokenizer") == 0) { NEED_VALUE(); o->tokenizer = v; }
    else if (strcmp(a, "--prompt-file") == 0) { NEED_VALUE(); o->prompt_file = v; }
    else if (strcmp(a, "--prompt") == 0) { NEED_VALUE(); o->prompt = v; }
    else if (strcmp(a, "--backend") == 0) { NEED_VALUE(); o->backend = v; }
    else if (strcmp(a, "--json") == 0) { NEED_VALUE(); o->json = v; }
    else if (strcmp(a, "--out") == 0) { NEED_VALUE(); o->out = v; }
    else if (strcmp(a, "--layers") == 0) { NEED_VALUE(); o->layers = v; }
    else if (strcmp(a, "--threads") == 0) { NEED_VALUE(); if (parse_int(v, 1, 4096, &n)) return usage_error("bad --threads %s", v); o->threads = (int)n; }
    else if (strcmp(a, "--ctx") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 24, &n)) return usage_error("bad --ctx %s", v); o->ctx = n; }
    else if (strcmp(a, "--batch") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 20, &n)) return usage_error("bad --batch %s", v); o->batch = n; }
    else if (strcmp(a, "--max-new-tokens") == 0) { NEED_VALUE(); if (parse_int(v, 0, 1L << 24, &n)) return usage_error("bad --max-new-tokens %s", v); o->max_new = (int)n; }
    else if (strcmp(a, "--decode-tokens") == 0) { NEED_VALUE(); if (parse_int(v, 0, 1L << 24, &n)) return usage_error("bad --decode-tokens %s", v); o->decode_tokens = (int)n; }
    else if (strcmp(a, "--top-k") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 24, &n)) return usage_error("bad --top-k %s", v); o->top_k = (int)n; }
    else if (strcmp(a, "--seed") == 0) { NEED_VALUE(); if (parse_int(v, 0, 0x7fffffffL, &n)) return usage_error("bad --seed %s", v); o->seed = (uint64_t)n; }
    else if (strcmp(a, "--temperature") == 0) { NEED_VALUE(); char *e; o->temperature = strtof(v, &e); if (*e || o->temperature < 0) return usage_error("bad --temperature %s", v); }
    else if (strcmp(a, "--top-p") == 0) { NEED_VALUE(); char *e; o->top_p = strtof(v, &e); if (*e || !(o->top_p > 0) || o->top_p > 1) return usage_error("bad --top-p %s", v); }
    else if (strcmp(a, "--kv-dtype") == 0) { NEED_VALUE(); if (ra_dtype_parse(v, &o->kv_dtype)) return usage_error("bad --kv-dtype %s", v); }
    else if (strcmp(a, "--dtype") == 0) { NEED_VALUE(); if (ra_dtype_parse(v, &o->dump_dtype) || o->dump_dtype == RA_DTYPE_BF16) return usage_error("bad --dtype %s (f16 or f32)", v); }
    else if (strcmp(a, "--stores") == 0) { NEED_VALUE(); o->stores = v; }
    else if (strcmp(a, "--shard-map") == 0) { NEED_VALUE(); o->shard_map = v; }
    else if (strcmp(a, "--mode") == 0) { NEED_VALUE(); if (ra_mode_parse(v, &o->off.mode)) return usage_error("bad --mode %s (full, streaming, flat, ivf, kgraph, roar)", v); }
    else if (strcmp(a, "--sink") == 0) { NEED_VALUE(); if (parse_int(v, 0, 1L << 20, &n)) return usage_error("bad --sink %s", v); o->off.n_sink = (uint32_t)n; }
    else if (strcmp(a, "--window") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 20, &n)) return usage_error("bad --window %s", v); o->off.n_window = (uint32_t)n; }
    else if (strcmp(a, "--attn-top-k") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 24, &n)) return usage_error("bad --attn-top-k %s", v); o->off.top_k = (uint32_t)n; }
    else if (strcmp(a, "--ef") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 20, &n)) return usage_error("bad --ef %s", v); o->off.ef = (uint32_t)n; }
    else if (strcmp(a, "--nprobe") == 0) { NEED_VALUE(); if (parse_int(v, 1, 1L << 20, &n)) return usage_error("bad --nprobe %s", v); o->off.nprobe = (uint32_t)n; }
    else if (strcmp(a, "--store-dtype") == 0) { NEED_VALUE(); if (ra_dtype_parse(v, &o->off.store_dtype)) return usage_error("bad --store-dtype %s", v); }
    else if (strcmp(a, "--build-layers") == 0) { NEED_VALUE(); if (parse_int(v, 1, RA_OFFLOAD_MAX_BUILD_LAYERS, &n)) return usage_error("bad --build-layers %s (1 to 8)", v); o->off.build_layers = (uint32_t)n; }
    else if (strcmp(a, "--key-top-queries") == 0) { NEED_VALUE(); if (parse_int(v, 0, RA_KVCLIENT_KEY_TOP_MAX, &n)) return usage_error("bad --key-top-queries %s (0 to 64)", v); o->off.key_top_queries = (uint32_t)n; o->key_top_given = 1; }
    else if (strcmp(a, "--store-timeout-ms") == 0) { NEED_VALUE(); if (parse_int(v, 1, 3600000, &n)) return usage_error("bad --store-timeout-ms %s", v); o->off.timeout_ms = (int)n; }
    else return usage_error("unknown option %s", a);
#undef NEED_VALUE
  }
  if (!o->model) return usage_error("%s needs --model", o->cmd);
  int distributed = o->off.mode != RA_MODE_FULL && o->off.mode != RA_MODE_STREAMING;
  if (distributed && !o->stores && !o->shard_map)
    return usage_error("--mode %s needs --stores or --shard-map", ra_mode_name(o->off.mode));
  if (!distributed && (o->stores || o->shard_map))
    return usage_error("--stores / --shard-map need a --mode that uses them (flat, ivf, kgraph, roar), not %s",
                       ra_mode_name(o->off.mode));
  if (o->stores && o->shard_map) return usage_error("give --stores or --shard-map, not both%s", "");
  if (o->off.roar_per_kv_head && o->off.mode != RA_MODE_ROAR)
    return usage_error("--index-per-kv-head is for --mode roar, not %s", ra_mode_name(o->off.mode));
  if (o->synthetic && strcmp(o->cmd, "generate") != 0)
    return usage_error("--synthetic-prefill is a generate option, not %s", o->cmd);
  if (o->synthetic && o->off.mode == RA_MODE_FULL)
    return usage_error("--synthetic-prefill fills kv-stores: it needs a --mode other than %s", "full");
  o->off.synthetic_chunk = o->synthetic ? o->batch : 0;
  if (o->key_top_given && o->off.mode != RA_MODE_ROAR)
    return usage_error("--key-top-queries is for --mode roar, not %s", ra_mode_name(o->off.mode));
  return 0;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0, r;
  do {
    if (n + 4096 > cap) {
      char *nb = realloc(buf, cap = cap * 2 + 4096);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
  } while (r > 0);
  fclose(f);
  buf[n] = 0;
  *len = n;
  return buf;
}

/* The prompt's token ids: text from --prompt/--prompt-file, optionally chat-formatted. */
static int prompt_tokens(const opts *o, const ra_tokenizer *tok, int32_t **ids, size_t *n, ra_error *err) {
  if (!o->prompt && !o->prompt_file) return ra_errorf(err, RA_EINVAL, "%s needs --prompt-file or --prompt", o->cmd);
  if (!tok) return ra_errorf(err, RA_EINVAL, "the model has no tokenizer (give --tokenizer GGUF)");
  size_t len;
  char *text = o->prompt ? strdup(o->prompt) : read_file(o->prompt_file, &len);
  if (!text) return ra_errorf(err, RA_EIO, "cannot read prompt file %s", o->prompt_file);
  /* a prompt file's final newline is an editor artifact, not part of the prompt */
  len = strlen(text);
  if (o->prompt_file && len && text[len - 1] == '\n') text[--len] = 0;
  int rc = RA_OK;
  if (o->chat) {
    char *chat;
    rc = ra_tok_chat_format(tok, NULL, text, &chat, err);
    free(text);
    if (rc) return rc;
    text = chat;
  }
  rc = ra_tok_encode(tok, text, strlen(text), ra_tok_add_bos(tok), 1, ids, n, err);
  free(text);
  return rc;
}

typedef struct stream_ctx {
  const ra_tokenizer *tok;
} stream_ctx;

static int print_token(void *vctx, int32_t id) {
  stream_ctx *s = vctx;
  char buf[256];
  int k = ra_tok_piece(s->tok, id, buf, sizeof buf);
  if (k > 0) fwrite(buf, 1, (size_t)(k < (int)sizeof buf ? k : (int)sizeof buf), stdout);
  fflush(stdout);
  return 0;
}

/* The shard map from --shard-map or --stores, and the plan for this model. */
static int stores_plan(const opts *o, const ra_model *m, ra_shard_map *map, ra_offload_plan *plan, ra_error *err) {
  const ra_model_config *c = &m->cfg;
  int rc;
  if (o->shard_map) {
    rc = ra_shard_map_load(o->shard_map, map, err);
  } else {
    rc = ra_shard_map_spread_list(o->stores, (uint32_t)c->n_layers, (uint32_t)c->n_kv_heads, map, err);
  }
  if (rc == RA_OK)
    rc = ra_offload_plan_build(map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads,
                               o->off.n_sink, o->off.n_window, plan, err);
  if (rc == RA_OK) return RA_OK;
  ra_shard_map_free(map);
  return rc;
}

/* The prefill's progress on a terminal: one line rewritten after each layer. */
static void print_progress(void *ctx, const ra_offload_progress *p) {
  (void)ctx;
  fprintf(stderr, "\rprefill %lld tokens: layer %d/%d, %.2f GB offloaded, index build %.1f s%s", (long long)p->n_tokens,
          p->layer, p->n_layers, (double)p->bytes_offloaded / 1e9, p->index_s, p->layer == p->n_layers ? "\n" : "");
  fflush(stderr);
}

static void json_write_stats(FILE *f, const ra_offload_stats *s) {
  fprintf(f, "{\"total_us\": %.1f, \"wait_us\": %.1f, \"store_us\": %.1f, \"append_us\": %.1f, \"download_us\": %.1f, "
             "\"index_us\": %.1f, \"n_scanned\": %llu, \"n_offloaded\": %llu}",
          s->total_us, s->wait_us, s->store_us, s->append_us, s->download_us, s->index_us, (unsigned long long)s->n_scanned,
          (unsigned long long)s->n_offloaded);
}

static int cmd_generate(const opts *o, ra_model *m, const ra_tokenizer *tok, ra_error *err) {
  int32_t *ids;
  size_t n;
  int rc = prompt_tokens(o, tok, &ids, &n, err);
  if (rc) return rc;
  long ctx = o->ctx ? o->ctx : (long)n + o->max_new;
  ra_state *st = NULL;
  ra_shard_map map = {0};
  ra_offload_plan plan = {0};
  ra_offload *off = NULL;
  if (o->off.mode == RA_MODE_FULL) {
    rc = ra_state_new(m, ctx, o->batch < ctx ? o->batch : ctx, o->kv_dtype, &st, err);
  } else {
    ra_offload_config oc = o->off;
    oc.kv_dtype = o->kv_dtype;
    oc.max_ctx = ctx;
    oc.max_prompt = (int64_t)n; /* the prefill runs layer by layer over the whole prompt */
    if (!o->json && isatty(STDERR_FILENO)) oc.progress = print_progress;
    if (oc.mode != RA_MODE_STREAMING) rc = stores_plan(o, m, &map, &plan, err);
    if (rc == RA_OK) rc = ra_offload_new(m, oc.mode == RA_MODE_STREAMING ? NULL : &plan, &oc, &off, err);
    if (rc == RA_OK) st = ra_offload_state(off);
  }
  if (rc) {
    ra_offload_plan_free(&plan);
    ra_shard_map_free(&map);
    free(ids);
    return rc;
  }
  ra_gen_config gc = {o->max_new, o->temperature, o->top_p, o->top_k, o->seed, !o->no_stop, NULL, NULL};
  if (off) {
    gc.forward = ra_offload_forward;
    gc.forward_ctx = off;
  }
  ra_gen_result res;
  stream_ctx sc = {tok};
  rc = ra_generate(st, tok, ids, n, &gc, print_token, &sc, &res, err);
  if (rc == RA_OK) {
    double pf = res.prefill_s > 0 ? (double)n / res.prefill_s : 0;
    double dc = res.decode_s > 0 && res.n_decode_steps ? (double)res.n_decode_steps / res.decode_s : 0;
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt %zu tokens, generated %zu%s; prefill %.3f s (%.1f tok/s), decode %.3f s (%.2f tok/s)\n", n,
            res.n_tokens, res.stopped ? " (stop token)" : "", res.prefill_s, pf, res.decode_s, dc);
    if (o->json) {
      FILE *f = fopen(o->json, "w");
      char *text = NULL;
      size_t tl;
      if (!f) rc = ra_errorf(err, RA_EIO, "cannot create %s", o->json);
      else if ((rc = ra_tok_decode(tok, res.tokens, res.n_tokens, &text, &tl, err)) == RA_OK) {
        fprintf(f, "{\"model\": ");
        ra_json_write_str(f, m->cfg.name);
        fprintf(f, ", \"backend\": \"%s\", \"text\": ", o->backend);
        ra_json_write_str(f, text);
        fprintf(f, ", \"prompt_tokens\": %zu, \"generated_tokens\": %zu, \"stopped\": %s, \"tokens\": [", n, res.n_tokens,
                res.stopped ? "true" : "false");
        for (size_t i = 0; i < res.n_tokens; i++) fprintf(f, "%s%d", i ? ", " : "", res.tokens[i]);
        fprintf(f, "], \"prefill_s\": %.6f, \"prefill_tok_s\": %.3f, \"decode_s\": %.6f, \"decode_steps\": %zu, \"decode_tok_s\": %.3f",
                res.prefill_s, pf, res.decode_s, res.n_decode_steps, dc);
        fprintf(f, ", \"mode\": \"%s\"", ra_mode_name(o->off.mode));
        if (off) {
          size_t n_steps;
          const ra_offload_stats *steps = ra_offload_step_stats(off, &n_steps);
          fprintf(f, ", \"sink\": %u, \"window\": %u, \"attn_top_k\": %u, \"stores\": %zu, \"prefill\": ", o->off.n_sink,
                  o->off.n_window, o->off.top_k, plan.n_stores);
          json_write_stats(f, ra_offload_prefill_stats(off));
          fprintf(f, ", \"steps\": [");
          for (size_t i = 0; i < n_steps; i++) {
            fprintf(f, "%s", i ? ", " : "");
            json_write_stats(f, &steps[i]);
          }
          fprintf(f, "]");
        } else {
          /* Every token's forward is on this process: the step's wall time is all there is. */
          fprintf(f, ", \"steps\": [");
          for (size_t i = 0; i < res.n_decode_steps; i++)
            fprintf(f, "%s{\"total_us\": %.1f}", i ? ", " : "", res.step_s[i] * 1e6);
          fprintf(f, "]");
        }
        fprintf(f, "}\n");
      }
      free(text);
      if (f && fclose(f) != 0 && rc == RA_OK) rc = ra_errorf(err, RA_EIO, "writing %s failed", o->json);
    }
    ra_gen_result_free(&res);
  }
  if (off) ra_offload_free(off);
  else ra_state_free(st);
  ra_offload_plan_free(&plan);
  ra_shard_map_free(&map);
  free(ids);
  return rc;
}

static int cmd_dump(const opts *o, ra_model *m, const ra_tokenizer *tok, ra_error *err) {
  if (!o->out) return ra_errorf(err, RA_EINVAL, "dump-qk needs --out DIR");
  int32_t *ids;
  size_t n;
  int rc = prompt_tokens(o, tok, &ids, &n, err);
  if (rc) return rc;
  uint8_t *flags = NULL;
  if (o->layers) {
    flags = malloc((size_t)m->cfg.n_layers);
    if (!flags) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
    else rc = ra_dump_parse_layers(o->layers, m->cfg.n_layers, flags, err);
  }
  long ctx = (long)n + o->decode_tokens;
  ra_state *st = NULL;
  if (rc == RA_OK) rc = ra_state_new(m, ctx, o->batch < ctx ? o->batch : ctx, o->kv_dtype, &st, err);
  if (rc == RA_OK) {
    ra_dump_config dc = {o->out, o->decode_tokens, flags, o->dump_dtype, m->cfg.name};
    rc = ra_dump_qk(st, ids, n, &dc, err);
    if (rc == RA_OK) printf("dump-qk: %zu prompt + %d decode tokens written to %s\n", n, o->decode_tokens, o->out);
  }
  ra_state_free(st);
  free(flags);
  free(ids);
  return rc;
}

static int cmd_tokenize(const opts *o, const ra_tokenizer *tok, ra_error *err) {
  int32_t *ids;
  size_t n;
  int rc = prompt_tokens(o, tok, &ids, &n, err);
  if (rc) return rc;
  printf("[");
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
  printf("]\n");
  free(ids);
  return RA_OK;
}

static int cmd_logits(const opts *o, ra_model *m, const ra_tokenizer *tok, ra_error *err) {
  if (!o->out) return ra_errorf(err, RA_EINVAL, "logits needs --out FILE.npy");
  int32_t *ids;
  size_t n;
  int rc = prompt_tokens(o, tok, &ids, &n, err);
  if (rc) return rc;
  ra_state *st = NULL;
  float *host = malloc(sizeof(float) * n * (size_t)m->cfg.vocab);
  if (!host) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
  if (rc == RA_OK) rc = ra_state_new(m, (int64_t)n, (int64_t)n, o->kv_dtype, &st, err);
  if (rc == RA_OK) rc = ra_model_forward(st, ids, (int64_t)n, 1, NULL, err);
  if (rc == RA_OK) rc = m->be->ops->download(m->be, &st->logits, 0, host, n * (size_t)m->cfg.vocab, err);
  if (rc == RA_OK) rc = ra_npy_write_f32(o->out, RA_DTYPE_F32, n, (uint64_t)m->cfg.vocab, host, err);
  ra_state_free(st);
  free(host);
  free(ids);
  return rc;
}

static void cmd_info(const ra_model *m, const ra_tokenizer *tok) {
  const ra_model_config *c = &m->cfg;
  printf("{\"name\": ");
  ra_json_write_str(stdout, c->name);
  printf(", \"arch\": \"%s\", \"layers\": %d, \"dim\": %d, \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
         "\"ffn\": %d, \"vocab\": %d, \"rope_theta\": %g, \"rope_style\": \"%s\", \"norm_eps\": %g, \"qkv_bias\": %s, "
         "\"tied_embeddings\": %s, \"max_ctx\": %d, \"tokenizer\": \"%s\"}\n",
         c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab, c->rope_theta,
         c->rope_style == RA_ROPE_NORM ? "norm" : "neox", c->norm_eps, c->qkv_bias ? "true" : "false",
         c->tied_embeddings ? "true" : "false", c->max_ctx,
         !tok ? "none" : ra_tok_kind(tok) == RA_TOK_BPE ? "bpe" : "spm");
}

int main(int argc, char **argv) {
  ra_procenv_apply_defaults(argv);
  ra_log_set_name("gpu-worker");
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fputs(usage_text, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *cmds[] = {"generate", "dump-qk", "tokenize", "logits", "info"};
  int known = 0;
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) known |= strcmp(argv[1], cmds[i]) == 0;
  if (!known) return usage_error("unknown command '%s'", argv[1]);
  opts o;
  int prc = parse_opts(argc, argv, &o);
  if (prc) return prc;
  ra_error err;
  ra_error_clear(&err);
  ra_backend *be = NULL;
  ra_model *m = NULL;
  ra_tokenizer *tok = NULL;
  ra_backend_config bc = {o.threads, 0};
  int rc;
  if (strcmp(o.cmd, "tokenize") == 0) {
    /* no weights needed: only the tokenizer's metadata */
    ra_gguf g;
    rc = ra_gguf_open(o.tokenizer ? o.tokenizer : o.model, &g, &err);
    if (rc == RA_OK) {
      rc = ra_tok_load_gguf(&g, &tok, &err);
      ra_gguf_close(&g);
    }
    if (rc == RA_OK) rc = cmd_tokenize(&o, tok, &err);
  } else if ((rc = ra_backend_create(o.backend, &bc, &be, &err)) == RA_OK &&
             (rc = ra_load_model(be, o.model, o.tokenizer, o.seed, &m, &tok, &err)) == RA_OK) {
    if (strcmp(o.cmd, "generate") == 0) rc = cmd_generate(&o, m, tok, &err);
    else if (strcmp(o.cmd, "dump-qk") == 0) rc = cmd_dump(&o, m, tok, &err);
    else if (strcmp(o.cmd, "logits") == 0) rc = cmd_logits(&o, m, tok, &err);
    else cmd_info(m, tok);
  }
  if (rc != RA_OK) fprintf(stderr, "gpu-worker %s: error: %s\n", o.cmd, err.msg[0] ? err.msg : ra_strerror(rc));
  ra_tok_free(tok);
  ra_model_free(m);
  ra_backend_destroy(be);
  return rc == RA_OK ? 0 : 1;
}
