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
#include "opts.h"
#include "textfile.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Commands: bit i of an option's scope is commands[i]. */
enum { GEN = 1u << 0, DUMP = 1u << 1, TOK = 1u << 2, LOGITS = 1u << 3, INFO = 1u << 4 };
#define ALL_COMMANDS (GEN | DUMP | TOK | LOGITS | INFO)
#define PROMPTED (GEN | DUMP | TOK | LOGITS) /* commands that read a prompt */
#define LOADED (GEN | DUMP | LOGITS | INFO)  /* commands that load the weights */
static const char *const commands[] = {"generate", "dump-qk", "tokenize", "logits", "info"};

static const char *commands_text =
    "usage: gpu-worker COMMAND [options]\n"
    "commands:\n"
    "  generate   prefill a prompt and generate text; prints the text and timings\n"
    "  dump-qk    write post-RoPE Q/K of a prompt (+ greedy decode) as .npy files\n"
    "  tokenize   print the token ids of a prompt as JSON\n"
    "  logits     write the logits of every prompt position as [n_tokens, vocab] .npy\n"
    "  info       print the model's configuration\n";

typedef struct opts {
  const char *cmd, *model, *tokenizer, *prompt_file, *prompt, *backend, *json, *out, *layers;
  const char *stores, *shard_map;
  const char *store_tls_ca, *store_tls_cert, *store_tls_key, *auth_token_file;
  ra_offload_config off; /* mode == RA_MODE_FULL: no offload */
  int help, chat, threads, max_new, decode_tokens, no_stop, top_k, synthetic;
  long ctx, batch;
  float temperature, top_p;
  uint64_t seed;
  ra_dtype kv_dtype, dump_dtype;
} opts;

/* The defaults of every option, the offload's from the offload runtime. */
static void opts_default(opts *o) {
  *o = (opts){.backend = "cpu", .max_new = 64, .batch = 512, .top_p = 0.95f, .top_k = 40, .seed = 1,
              .kv_dtype = RA_DTYPE_F32, .dump_dtype = RA_DTYPE_F16};
  ra_offload_config_default(&o->off);
  o->off.mode = RA_MODE_FULL;
}

static const char *dtype_name(int t) { return ra_dtype_name((ra_dtype)t); }

/* --mode goes through the attention modes' own parser and names. */
static int mode_parse(const char *v, void *field, ra_error *err) {
  ra_mode m;
  if (ra_mode_parse(v, &m) != RA_OK) return ra_errorf(err, RA_EINVAL, "not one of %s", RA_MODE_NAMES);
  memcpy(field, &m, sizeof m);
  return RA_OK;
}

static const char *mode_show(const void *field) {
  ra_mode m;
  memcpy(&m, field, sizeof m);
  return ra_mode_name(m);
}

/* --retrieve / --estimate: a fraction of the clusters or a token count (wave.h). */
static int budget_parse(const char *v, void *field, ra_error *err) {
  double x;
  int rc = ra_wave_budget_parse(v, &x, err);
  if (rc == RA_OK) memcpy(field, &x, sizeof x);
  return rc;
}

static const char *budget_show(const void *field) {
  static char buf[2][32]; /* the usage shows both budgets on one pass */
  static int next;
  double x;
  memcpy(&x, field, sizeof x);
  char *b = buf[next++ % 2];
  snprintf(b, sizeof buf[0], "%g", x);
  return b;
}

#define BUDGET_HELP " per kv head and step: X <= 1 a fraction of its clusters (1: all), X > 1 that many tokens' worth"

#define AT(member) RA_OPT_AT(opts, member)
static const ra_opt rows[] = {
    {"help", RA_OPT_FLAG, AT(help), .help = "print the options of the command"},
    {"model", RA_OPT_STRING, AT(model), .meta = "PATH",
     .help = "GGUF file, safetensors directory, or random:PRESET[:LAYERS] (llama3-8b, yi-6b, smollm2-135m, "
             "tiny; :LAYERS keeps the first LAYERS layers)"},
    {"tokenizer", RA_OPT_STRING, AT(tokenizer), .meta = "GGUF", .help = "tokenizer for a safetensors model"},
    {"prompt-file", RA_OPT_STRING, AT(prompt_file), .meta = "F", .help = "the prompt, from a file", .scope = PROMPTED},
    {"prompt", RA_OPT_STRING, AT(prompt), .meta = "TEXT", .help = "the prompt", .scope = PROMPTED},
    {"chat", RA_OPT_FLAG, AT(chat), .help = "wrap the prompt in the model's chat template", .scope = PROMPTED},
    {"backend", RA_OPT_STRING, AT(backend), .meta = "cpu|cuda", .help = "where the model runs", .scope = LOADED},
    {"threads", RA_OPT_INT, AT(threads), .lo = 1, .hi = 4096, .meta = "N", .help = "CPU threads",
     .dflt = "all cores", .scope = LOADED},
    {"seed", RA_OPT_INT, AT(seed), .lo = 0, .hi = 0x7fffffff, .meta = "N", .help = "sampling / random-weight seed",
     .scope = LOADED},
    {"kv-dtype", RA_OPT_ENUM, AT(kv_dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_BF16, .name_of = dtype_name,
     .help = "KV cache dtype", .scope = GEN | DUMP | LOGITS},
    {"batch", RA_OPT_INT, AT(batch), .lo = 1, .hi = 1L << 20, .meta = "N", .help = "prefill chunk size",
     .scope = GEN | DUMP},
    {"ctx", RA_OPT_INT, AT(ctx), .lo = 1, .hi = 1L << 24, .meta = "N", .help = "KV cache tokens",
     .dflt = "prompt + new tokens", .scope = GEN},
    {"max-new-tokens", RA_OPT_INT, AT(max_new), .lo = 0, .hi = 1L << 24, .meta = "N", .help = "tokens to generate",
     .scope = GEN},
    {"temperature", RA_OPT_FLOAT, AT(temperature), .flo = 0, .fhi = HUGE_VAL, .meta = "T",
     .help = "sampling temperature; 0: greedy", .scope = GEN},
    {"top-p", RA_OPT_FLOAT, AT(top_p), .flo = 0, .fhi = 1, .flags = RA_OPT_OPEN_LO, .meta = "P",
     .help = "sample from the most likely tokens of this much probability", .scope = GEN},
    {"top-k", RA_OPT_INT, AT(top_k), .lo = 1, .hi = 1L << 24, .meta = "K",
     .help = "sample from the K most likely tokens", .scope = GEN},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "write the text, tokens and timings to FILE",
     .scope = GEN},
    {"no-stop", RA_OPT_FLAG, AT(no_stop), .help = "ignore EOS", .scope = GEN},
    {"mode", RA_OPT_CUSTOM, AT(off.mode), .parse = mode_parse, .show = mode_show, .meta = RA_MODE_NAMES,
     .help = "attention: full keeps every token on the device, streaming only the sink and the window; the "
             "others keep sink + window on the device and the rest in kv-stores",
     .scope = GEN},
    {"stores", RA_OPT_STRING, AT(stores), .meta = "HOST:PORT,...", .help = "kv-stores; kv heads dealt round-robin",
     .scope = GEN},
    {"shard-map", RA_OPT_STRING, AT(shard_map), .meta = "FILE", .help = "kv-stores and their shards, from FILE",
     .scope = GEN},
    {"sink", RA_OPT_INT, AT(off.n_sink), .lo = 0, .hi = 1L << 20, .meta = "N",
     .help = "first tokens kept on the device", .scope = GEN},
    {"window", RA_OPT_INT, AT(off.n_window), .lo = 1, .hi = 1L << 20, .meta = "N",
     .help = "latest tokens kept on the device", .scope = GEN},
    {"attn-top-k", RA_OPT_INT, AT(off.top_k), .lo = 1, .hi = RA_ATTEND_MAX_TOP_K, .meta = "K",
     .help = "keys per head the stores attend to", .scope = GEN},
    {"ef", RA_OPT_INT, AT(off.ef), .lo = 1, .hi = RA_INDEX_MAX_EF, .meta = "N", .help = "index search: candidates kept",
     .dflt = "set by the store", .scope = GEN},
    {"nprobe", RA_OPT_INT, AT(off.nprobe), .lo = 1, .hi = RA_INDEX_MAX_LISTS, .meta = "N",
     .help = "index search: clusters scanned", .dflt = "set by the store", .scope = GEN},
    {"store-dtype", RA_OPT_ENUM, AT(off.store_dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_BF16,
     .name_of = dtype_name, .help = "KV dtype at the stores", .scope = GEN},
    {"store-timeout-ms", RA_OPT_INT, AT(off.timeout_ms), .lo = 1, .hi = 3600000, .meta = "MS",
     .help = "deadline of every store call (an index build's grows with its keys); a store that stops answering "
             "pings fails the generation within about as long",
     .scope = GEN},
    {"store-tls-ca", RA_OPT_STRING, AT(store_tls_ca), .meta = "FILE",
     .help = "talk TLS to the stores, whose certificates this PEM CA signed", .scope = GEN},
    {"store-tls-cert", RA_OPT_STRING, AT(store_tls_cert), .meta = "FILE",
     .help = "mutual TLS: the worker's PEM certificate (with --store-tls-key)", .scope = GEN},
    {"store-tls-key", RA_OPT_STRING, AT(store_tls_key), .meta = "FILE", .help = "the PEM key of --store-tls-cert",
     .scope = GEN},
    {"auth-token-file", RA_OPT_STRING, AT(auth_token_file), .meta = "FILE",
     .help = "send the token on this file's first line to the stores with every call", .scope = GEN},
    {"index-per-kv-head", RA_OPT_FLAG, AT(off.roar_per_kv_head),
     .help = "roar: one graph per kv head from its group's queries", .scope = GEN},
    {"key-top-queries", RA_OPT_INT, AT(off.key_top_queries), .lo = 0, .hi = RA_KVCLIENT_KEY_TOP_MAX, .meta = "T",
     .help = "roar build: every offloaded key's T best queries, from the backend; 0: off", .scope = GEN},
    {"build-layers", RA_OPT_INT, AT(off.build_layers), .lo = 1, .hi = RA_OFFLOAD_MAX_BUILD_LAYERS, .meta = "N",
     .help = "index builds of up to N layers in flight at the stores during the prefill", .scope = GEN},
    {"retrieve", RA_OPT_CUSTOM, AT(off.wave.retrieve), .parse = budget_parse, .show = budget_show, .meta = "X",
     .help = "wave: clusters attended exactly at the stores" BUDGET_HELP, .scope = GEN},
    {"estimate", RA_OPT_CUSTOM, AT(off.wave.estimate), .parse = budget_parse, .show = budget_show, .meta = "X",
     .help = "wave: the next clusters, estimated on the device from centroids" BUDGET_HELP, .scope = GEN},
    {"wave-segment", RA_OPT_INT, AT(off.wave.segment), .lo = 1, .hi = 1L << 30, .meta = "N",
     .help = "wave: prefill rows clustered together (k-means segment)", .scope = GEN},
    {"wave-cluster", RA_OPT_INT, AT(off.wave.cluster), .lo = 1, .hi = 1L << 20, .meta = "N",
     .help = "wave: rows per cluster on average", .scope = GEN},
    {"wave-iters", RA_OPT_INT, AT(off.wave.iters), .lo = 1, .hi = 1000, .meta = "N",
     .help = "wave: k-means iterations at most", .scope = GEN},
    {"wave-block", RA_OPT_INT, AT(off.wave.block), .lo = 1, .hi = 1L << 24, .meta = "N",
     .help = "wave: evicted tokens clustered together during the decode (lag rows until then)", .scope = GEN},
    {"synthetic-prefill", RA_OPT_FLAG, AT(synthetic),
     .help = "benchmarks: the stores get KV computed from the token embeddings alone, --batch tokens at a "
             "time, no attention or MLP; the offload, index builds and decode are real",
     .scope = GEN},
    {"decode-tokens", RA_OPT_INT, AT(decode_tokens), .lo = 0, .hi = 1L << 24, .meta = "N",
     .help = "greedy decode steps after the prompt", .scope = DUMP},
    {"layers", RA_OPT_STRING, AT(layers), .meta = "0,2,5-7", .help = "the layers to write", .dflt = "all",
     .scope = DUMP},
    {"dtype", RA_OPT_ENUM, AT(dump_dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_F16, .name_of = dtype_name,
     .help = "dtype of the .npy files", .scope = DUMP},
    {"out", RA_OPT_STRING, AT(out), .meta = "PATH", .help = "dump-qk: the directory; logits: the .npy file",
     .scope = DUMP | LOGITS},
};
#undef AT

/* The usage of the commands in `scope`, with the defaults. */
static void usage_write(unsigned scope, FILE *f) {
  opts d;
  opts_default(&d);
  ra_opts_table t = {rows, RA_OPTS_COUNT(rows), &d, NULL};
  ra_opts_set s = {&t, 1, commands, scope};
  if (scope == ALL_COMMANDS) fputs(commands_text, f);
  for (unsigned i = 0; scope != ALL_COMMANDS && i < RA_OPTS_COUNT(commands); i++)
    if (scope == 1u << i) fprintf(f, "usage: gpu-worker %s [options]\n", commands[i]);
  ra_opts_usage(&s, f);
}

static int usage_error(unsigned scope, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(unsigned scope, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gpu-worker: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n\n");
  usage_write(scope, stderr);
  return 2;
}

/* The checks between options, after parsing; 0 or a usage error's exit status. */
static int opts_check(opts *o, const ra_opts_set *s) {
  const char *mode = ra_mode_name(o->off.mode);
  if (!o->model) return usage_error(s->scope, "%s needs --model", o->cmd);
  int distributed = ra_mode_uses_stores(o->off.mode);
  char store_modes[128];
  ra_mode_list(store_modes, sizeof store_modes, RA_MODE_F_STORES);
  if (distributed && !o->stores && !o->shard_map)
    return usage_error(s->scope, "--mode %s needs --stores or --shard-map", mode);
  if (!distributed && (o->stores || o->shard_map))
    return usage_error(s->scope,
                       "--stores / --shard-map need a --mode that uses them (%s), not %s", store_modes, mode);
  if (o->stores && o->shard_map) return usage_error(s->scope, "give --stores or --shard-map, not both");
  if ((!o->store_tls_cert) != (!o->store_tls_key))
    return usage_error(s->scope, "--store-tls-cert and --store-tls-key go together");
  if (!distributed && (o->store_tls_ca || o->store_tls_cert || o->auth_token_file))
    return usage_error(s->scope, "--store-tls-* / --auth-token-file are for a --mode that uses stores, not %s", mode);
  if (o->off.roar_per_kv_head && o->off.mode != RA_MODE_ROAR)
    return usage_error(s->scope, "--index-per-kv-head is for --mode roar, not %s", mode);
  if (o->synthetic && o->off.mode == RA_MODE_FULL)
    return usage_error(s->scope, "--synthetic-prefill fills kv-stores: it needs a --mode other than full");
  if (ra_opts_given(s, "key-top-queries") && o->off.mode != RA_MODE_ROAR)
    return usage_error(s->scope, "--key-top-queries is for --mode roar, not %s", mode);
  static const char *const wave_only[] = {"retrieve", "estimate", "wave-segment", "wave-cluster", "wave-iters",
                                          "wave-block"};
  for (size_t i = 0; i < RA_OPTS_COUNT(wave_only); i++)
    if (ra_opts_given(s, wave_only[i]) && o->off.mode != RA_MODE_WAVE)
      return usage_error(s->scope, "--%s is for --mode wave, not %s", wave_only[i], mode);
  ra_error werr;
  if (o->off.mode == RA_MODE_WAVE && ra_wave_config_check(&o->off.wave, &werr) != RA_OK)
    return usage_error(s->scope, "%s", werr.msg);
  o->off.synthetic_chunk = o->synthetic ? o->batch : 0;
  return 0;
}

/* Parses argv[2..] for the command argv[1] (scope: its bit); 0, -1 for --help, or a usage
 * error's exit status. */
static int parse_opts(int argc, char **argv, unsigned scope, opts *o) {
  opts_default(o);
  o->cmd = argv[1];
  unsigned char given[RA_OPTS_COUNT(rows)] = {0};
  ra_opts_table t = {rows, RA_OPTS_COUNT(rows), o, given};
  ra_opts_set s = {&t, 1, commands, scope};
  ra_error err;
  ra_error_clear(&err);
  if (ra_opts_parse_args(&s, argc - 2, argv + 2, &err) != RA_OK) return usage_error(scope, "%s", err.msg);
  if (o->help) return -1;
  return opts_check(o, &s);
}

#define PROMPT_MAX_BYTES (1ul << 30)

/* The prompt's token ids: text from --prompt/--prompt-file, optionally chat-formatted. */
static int prompt_tokens(const opts *o, const ra_tokenizer *tok, int32_t **ids, size_t *n, ra_error *err) {
  if (!o->prompt && !o->prompt_file) return ra_errorf(err, RA_EINVAL, "%s needs --prompt-file or --prompt", o->cmd);
  if (!tok) return ra_errorf(err, RA_EINVAL, "the model has no tokenizer (give --tokenizer GGUF)");
  size_t len;
  char *text = NULL;
  if (o->prompt_file) {
    int rc = ra_textfile_read(o->prompt_file, PROMPT_MAX_BYTES, &text, &len, err);
    if (rc) return rc;
  } else if (!(text = strdup(o->prompt))) {
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
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
             "\"index_us\": %.1f, \"select_us\": %.1f, \"merge_us\": %.1f, \"n_scanned\": %llu, \"n_offloaded\": %llu}",
          s->total_us, s->wait_us, s->store_us, s->append_us, s->download_us, s->index_us, s->select_us, s->merge_us,
          (unsigned long long)s->n_scanned, (unsigned long long)s->n_offloaded);
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
  ra_kvclient_secrets secrets = {0};
  if (o->off.mode == RA_MODE_FULL) {
    rc = ra_state_new(m, ctx, o->batch < ctx ? o->batch : ctx, o->kv_dtype, &st, err);
  } else {
    ra_offload_config oc = o->off;
    oc.kv_dtype = o->kv_dtype;
    rc = ra_kvclient_options_load(&oc.store_client, o->store_tls_ca, o->store_tls_cert, o->store_tls_key,
                                  o->auth_token_file, &secrets, err);
    if (rc) {
      free(ids);
      return rc;
    }
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
    ra_kvclient_secrets_free(&secrets);
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
          const ra_wave_config *wc = &o->off.wave;
          if (o->off.mode == RA_MODE_WAVE)
            fprintf(f, ", \"wave\": {\"retrieve\": %g, \"estimate\": %g, \"segment\": %lld, \"cluster\": %lld, "
                       "\"iters\": %d, \"block\": %lld}",
                    wc->retrieve, wc->estimate, (long long)wc->segment, (long long)wc->cluster, wc->iters,
                    (long long)wc->block);
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
  ra_kvclient_secrets_free(&secrets);
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
    usage_write(ALL_COMMANDS, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  unsigned scope = 0;
  for (unsigned i = 0; i < RA_OPTS_COUNT(commands); i++)
    if (strcmp(argv[1], commands[i]) == 0) scope = 1u << i;
  if (!scope) return usage_error(ALL_COMMANDS, "unknown command '%s'", argv[1]);
  opts o;
  int prc = parse_opts(argc, argv, scope, &o);
  if (prc == -1) {
    usage_write(scope, stdout);
    return 0;
  }
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
