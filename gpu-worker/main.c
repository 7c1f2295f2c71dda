/* gpu-worker CLI: runs the model runtime locally.
 *   gpu-worker generate --model PATH (--prompt-file F | --prompt TEXT) [--max-new-tokens N] ...
 *   gpu-worker dump-qk  --model PATH (--prompt-file F | --prompt TEXT) --out DIR [--decode-tokens N] ...
 *   gpu-worker tokenize --model PATH (--prompt-file F | --prompt TEXT)       ids as JSON
 *   gpu-worker logits   --model PATH (--prompt-file F | --prompt TEXT) --out FILE.npy
 *   gpu-worker info     --model PATH
 *   gpu-worker serve    --model PATH --listen HOST:PORT [--mode M --stores ...]   OpenAI HTTP API */
#include "context.h"
#include "dump_qk.h"
#include "generate.h"
#include "json.h"
#include "loader.h"
#include "log.h"
#include "procenv.h"
#include "serve.h"
#include "npy.h"
#include "offload.h"
#include "opts.h"
#include "textfile.h"
#include "tp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Commands: bit i of an option's scope is commands[i]. */
enum { GEN = 1u << 0, DUMP = 1u << 1, TOK = 1u << 2, LOGITS = 1u << 3, INFO = 1u << 4, SERVE = 1u << 5 };
#define ALL_COMMANDS (GEN | DUMP | TOK | LOGITS | INFO | SERVE)
#define PROMPTED (GEN | DUMP | TOK | LOGITS)        /* commands that read a prompt */
#define LOADED (GEN | DUMP | LOGITS | INFO | SERVE) /* commands that load the weights */
#define RUNS (GEN | SERVE)                          /* commands that generate: modes, stores */
static const char *const commands[] = {"generate", "dump-qk", "tokenize", "logits", "info", "serve"};

static const char *commands_text =
    "usage: gpu-worker COMMAND [options]\n"
    "commands:\n"
    "  generate   prefill a prompt and generate text; prints the text and timings\n"
    "  dump-qk    write post-RoPE Q/K of a prompt (+ greedy decode) as .npy files\n"
    "  tokenize   print the token ids of a prompt as JSON\n"
    "  logits     write the logits of every prompt position as [n_tokens, vocab] .npy\n"
    "  info       print the model's configuration\n"
    "  serve      the OpenAI HTTP API (completions, chat, streaming) with continuous batching\n";

typedef struct opts {
  const char *cmd, *model, *tokenizer, *prompt_file, *prompt, *backend, *json, *out, *layers;
  const char *stores, *shard_map, *save_context, *context, *spare_stores;
  const char *listen, *ready_file, *model_name; /* serve */
  int max_seqs, max_cached, max_conns, drain_ms, attend_batch;
  uint64_t max_body, kv_budget;
  double cache_ttl;
  const char *store_tls_ca, *store_tls_cert, *store_tls_key, *auth_token_file;
  ra_offload_config off; /* mode == RA_MODE_FULL: no offload */
  int tp; /* tensor-parallel ranks */
  int help, chat, threads, max_new, decode_tokens, no_stop, top_k, synthetic, replicas;
  long ctx, batch;
  float temperature, top_p;
  uint64_t seed;
  ra_dtype kv_dtype, dump_dtype;
} opts;

/* The defaults of every option, the offload's from the offload runtime. */
static void opts_default(opts *o) {
  *o = (opts){.backend = "cpu", .tp = 1, .max_new = 64, .replicas = 1, .batch = 512, .top_p = 0.95f, .top_k = 40, .seed = 1,
              .kv_dtype = RA_DTYPE_F32, .dump_dtype = RA_DTYPE_F16, .max_seqs = 16, .max_cached = 16, .attend_batch = 1,
              .max_conns = 256, .drain_ms = 30000, .max_body = 1u << 20, .cache_ttl = 600};
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
     .help = "GGUF file, Hugging Face model directory, or random:PRESET[:LAYERS] (llama3-8b, llama3-70b, yi-6b, "
             "smollm2-135m, tiny; :LAYERS keeps the first LAYERS layers)"},
    {"tokenizer", RA_OPT_STRING, AT(tokenizer), .meta = "PATH",
     .help = "the tokenizer of a GGUF file or Hugging Face directory, instead of the model's"},
    {"prompt-file", RA_OPT_STRING, AT(prompt_file), .meta = "F", .help = "the prompt, from a file", .scope = PROMPTED},
    {"prompt", RA_OPT_STRING, AT(prompt), .meta = "TEXT", .help = "the prompt", .scope = PROMPTED},
    {"chat", RA_OPT_FLAG, AT(chat), .help = "wrap the prompt in the model's chat template", .scope = PROMPTED},
    {"backend", RA_OPT_STRING, AT(backend), .meta = "cpu|cuda", .help = "where the model runs", .scope = LOADED},
    {"threads", RA_OPT_INT, AT(threads), .lo = 1, .hi = 4096, .meta = "N", .help = "CPU threads",
     .dflt = "all cores", .scope = LOADED},
    {"tp", RA_OPT_INT, AT(tp), .lo = 1, .hi = RA_TP_MAX_RANKS, .meta = "N",
     .help = "tensor-parallel ranks: kv heads (with their q heads) and FFN columns split over N backends, a thread "
             "each (cpu: --threads / N threads each; cuda: devices 0..N-1), x all-reduced after Wo and W_down; "
             "N <= kv heads",
     .scope = GEN},
    {"seed", RA_OPT_INT, AT(seed), .lo = 0, .hi = 0x7fffffff, .meta = "N", .help = "sampling / random-weight seed",
     .scope = LOADED},
    {"kv-dtype", RA_OPT_ENUM, AT(kv_dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_BF16, .name_of = dtype_name,
     .help = "KV cache dtype", .scope = GEN | DUMP | SERVE | LOGITS | SERVE},
    {"batch", RA_OPT_INT, AT(batch), .lo = 1, .hi = 1L << 20, .meta = "N",
     .help = "prefill chunk size (serve: prompt tokens per step over all sequences; offload modes: a prompt's "
             "prefill in pieces of that much work: N x layers rows of layers, within a layer for a long prompt)",
     .scope = GEN | DUMP | SERVE},
    {"ctx", RA_OPT_INT, AT(ctx), .lo = 1, .hi = 1L << 24, .meta = "N",
     .help = "KV cache tokens (serve: of each sequence, prompt + answer)", .dflt = "prompt + new tokens; serve: 2048", .scope = RUNS},
    {"max-new-tokens", RA_OPT_INT, AT(max_new), .lo = 0, .hi = 1L << 24, .meta = "N", .help = "tokens to generate",
     .scope = GEN},
    {"temperature", RA_OPT_FLOAT, AT(temperature), .flo = 0, .fhi = HUGE_VAL, .meta = "T",
     .help = "sampling temperature; 0: greedy", .scope = GEN},
    {"top-p", RA_OPT_FLOAT, AT(top_p), .flo = 0, .fhi = 1, .flags = RA_OPT_OPEN_LO, .meta = "P",
     .help = "sample from the most likely tokens of this much probability", .scope = GEN},
    {"top-k", RA_OPT_INT, AT(top_k), .lo = 1, .hi = 1L << 24, .meta = "K",
     .help = "sample from the K most likely tokens", .scope = RUNS},
    {"json", RA_OPT_STRING, AT(json), .meta = "FILE", .help = "write the text, tokens and timings to FILE",
     .scope = GEN},
    {"no-stop", RA_OPT_FLAG, AT(no_stop), .help = "ignore EOS", .scope = GEN},
    {"mode", RA_OPT_CUSTOM, AT(off.mode), .parse = mode_parse, .show = mode_show, .meta = RA_MODE_NAMES,
     .help = "attention: full keeps every token on the device, streaming only the sink and the window; the "
             "others keep sink + window on the device and the rest in kv-stores",
     .scope = RUNS},
    {"stores", RA_OPT_STRING, AT(stores), .meta = "HOST:PORT,...", .help = "kv-stores; kv heads dealt round-robin",
     .scope = RUNS},
    {"shard-map", RA_OPT_STRING, AT(shard_map), .meta = "FILE",
     .help = "kv-stores and their shards, from FILE (a rule may name several owners: replicas)", .scope = RUNS},
    {"replicas", RA_OPT_INT, AT(replicas), .lo = 1, .hi = RA_SHARD_MAX_REPLICAS, .meta = "R",
     .help = "with --stores: every shard on R stores (writes to all, attends to one, failover to the next)",
     .scope = RUNS},
    {"spare-stores", RA_OPT_STRING, AT(spare_stores), .meta = "HOST:PORT,...",
     .help = "with replicas: stores that take a failed one's place, its shards copied from their other owners "
             "(flat, ivf, kgraph)",
     .scope = RUNS},
    {"store-reconnect-ms", RA_OPT_INT, AT(off.reconnect_ms), .lo = 0, .hi = 3600000, .meta = "MS",
     .help = "a failed store with no live replica: reconnect and reattach its session for up to MS (a store "
             "restarting from --data-dir); 0: the generation fails",
     .scope = RUNS},
    {"save-context", RA_OPT_STRING, AT(save_context), .meta = "FILE",
     .help = "after generating, leave the sessions on the stores and write the worker's part (device window, "
             "position, next token) to FILE, for --context",
     .scope = GEN},
    {"context", RA_OPT_STRING, AT(context), .meta = "FILE",
     .help = "continue a context saved with --save-context, without prefill (no prompt; the same mode, "
             "sink, window, dtypes and stores)",
     .scope = GEN},
    {"sink", RA_OPT_INT, AT(off.n_sink), .lo = 0, .hi = 1L << 20, .meta = "N",
     .help = "first tokens kept on the device", .scope = RUNS},
    {"window", RA_OPT_INT, AT(off.n_window), .lo = 1, .hi = 1L << 20, .meta = "N",
     .help = "latest tokens kept on the device", .scope = RUNS},
    {"attn-top-k", RA_OPT_INT, AT(off.top_k), .lo = 1, .hi = RA_ATTEND_MAX_TOP_K, .meta = "K",
     .help = "keys per head the stores attend to", .scope = RUNS},
    {"ef", RA_OPT_INT, AT(off.ef), .lo = 1, .hi = RA_INDEX_MAX_EF, .meta = "N", .help = "index search: candidates kept",
     .dflt = "set by the store", .scope = RUNS},
    {"nprobe", RA_OPT_INT, AT(off.nprobe), .lo = 1, .hi = RA_INDEX_MAX_LISTS, .meta = "N",
     .help = "index search: clusters scanned", .dflt = "set by the store", .scope = RUNS},
    {"store-dtype", RA_OPT_ENUM, AT(off.store_dtype), .lo = RA_DTYPE_F32, .hi = RA_DTYPE_I8,
     .name_of = dtype_name, .help = "KV dtype at the stores (int8: per-row scale, quantized here)", .scope = RUNS},
    {"store-timeout-ms", RA_OPT_INT, AT(off.timeout_ms), .lo = 1, .hi = 3600000, .meta = "MS",
     .help = "deadline of every store call (an index build's grows with its keys); a store that stops answering "
             "pings fails the generation within about as long",
     .scope = RUNS},
    {"store-tls-ca", RA_OPT_STRING, AT(store_tls_ca), .meta = "FILE",
     .help = "talk TLS to the stores, whose certificates this PEM CA signed", .scope = GEN},
    {"store-tls-cert", RA_OPT_STRING, AT(store_tls_cert), .meta = "FILE",
     .help = "mutual TLS: the worker's PEM certificate (with --store-tls-key)", .scope = GEN},
    {"store-tls-key", RA_OPT_STRING, AT(store_tls_key), .meta = "FILE", .help = "the PEM key of --store-tls-cert",
     .scope = GEN},
    {"auth-token-file", RA_OPT_STRING, AT(auth_token_file), .meta = "FILE",
     .help = "send the token on this file's first line to the stores with every call", .scope = GEN},
    {"index-per-kv-head", RA_OPT_FLAG, AT(off.roar_per_kv_head),
     .help = "roar: one graph per kv head from its group's queries", .scope = RUNS},
    {"key-top-queries", RA_OPT_INT, AT(off.key_top_queries), .lo = 0, .hi = RA_KVCLIENT_KEY_TOP_MAX, .meta = "T",
     .help = "roar build: every offloaded key's T best queries, from the backend; 0: off", .scope = RUNS},
    {"build-layers", RA_OPT_INT, AT(off.build_layers), .lo = 1, .hi = RA_OFFLOAD_MAX_BUILD_LAYERS, .meta = "N",
     .help = "index builds of up to N layers in flight at the stores during the prefill", .scope = RUNS},
    {"retro", RA_OPT_INT, AT(off.retro_window), .lo = 0, .hi = RA_OFFLOAD_MAX_RETRO, .meta = "W",
     .help = "flat / index modes / wave: correct the last W steps' outputs with the keys retrieved later "
             "(RetroAttention); 0: off",
     .scope = GEN},
    {"retrieve", RA_OPT_CUSTOM, AT(off.wave.retrieve), .parse = budget_parse, .show = budget_show, .meta = "X",
     .help = "wave: clusters attended exactly at the stores" BUDGET_HELP, .scope = RUNS},
    {"retrieve-min", RA_OPT_INT, AT(off.wave.retrieve_min), .lo = 0, .hi = 1L << 30, .meta = "N",
     .help = "wave: the retrieval zone's floor, N tokens' worth of clusters (short contexts, where the "
             "fraction names a few; 0: none)",
     .scope = RUNS},
    {"estimate", RA_OPT_CUSTOM, AT(off.wave.estimate), .parse = budget_parse, .show = budget_show, .meta = "X",
     .help = "wave: the next clusters, estimated on the device from centroids" BUDGET_HELP, .scope = RUNS},
    {"wave-segment", RA_OPT_INT, AT(off.wave.segment), .lo = 1, .hi = 1L << 30, .meta = "N",
     .help = "wave: prefill rows clustered together (k-means segment)", .scope = RUNS},
    {"wave-cluster", RA_OPT_INT, AT(off.wave.cluster), .lo = 1, .hi = 1L << 20, .meta = "N",
     .help = "wave: rows per cluster on average", .scope = RUNS},
    {"wave-iters", RA_OPT_INT, AT(off.wave.iters), .lo = 1, .hi = 1000, .meta = "N",
     .help = "wave: k-means iterations at most", .scope = RUNS},
    {"wave-block", RA_OPT_INT, AT(off.wave.block), .lo = 1, .hi = 1L << 24, .meta = "N",
     .help = "wave: evicted tokens clustered together during the decode (lag rows until then)", .scope = RUNS},
    {"wave-buffer", RA_OPT_INT, AT(off.wave.buffer), .lo = 0, .hi = 1L << 20, .meta = "N",
     .help = "wave: device buffer of recently retrieved clusters per layer and kv head, in clusters of "
             "--wave-cluster rows (0: off)", .scope = RUNS},
    {"synthetic-prefill", RA_OPT_FLAG, AT(synthetic),
     .help = "benchmarks: the stores get KV computed from the token embeddings alone, --batch tokens at a "
             "time, no attention or MLP; the offload, index builds and decode are real",
     .scope = GEN},
    {"listen", RA_OPT_STRING, AT(listen), .meta = "HOST:PORT", .help = "serve: the HTTP address (port 0: any free one)",
     .scope = SERVE},
    {"ready-file", RA_OPT_STRING, AT(ready_file), .meta = "FILE",
     .help = "serve: write the bound HOST:PORT to FILE once serving", .scope = SERVE},
    {"model-name", RA_OPT_STRING, AT(model_name), .meta = "ID", .help = "serve: the model id clients name",
     .dflt = "the model file's name without .gguf", .scope = SERVE},
    {"max-seqs", RA_OPT_INT, AT(max_seqs), .lo = 1, .hi = 256, .meta = "N",
     .help = "serve: sequences running at once; more get 429", .scope = SERVE},
    {"select-group", RA_OPT_INT, AT(off.select_group), .lo = 1, .hi = RA_OFFLOAD_MAX_BATCH, .meta = "N",
     .help = "serve, wave: a batched step ranks N sequences' clusters per device call and sends their "
             "requests before ranking the next N",
     .scope = SERVE},
    {"attend-batch", RA_OPT_INT, AT(attend_batch), .lo = 0, .hi = 1, .meta = "0|1",
     .help = "serve, offload modes: per layer, one AttendBatch message per store for each --select-group "
             "sequences; 0: one Attend request per sequence and store",
     .scope = SERVE},
    {"max-cached", RA_OPT_INT, AT(max_cached), .lo = 0, .hi = 4096, .meta = "N",
     .help = "serve: finished contexts kept for reuse by a request that extends them (LRU); 0: no reuse",
     .scope = SERVE},
    {"kv-budget", RA_OPT_SIZE, AT(kv_budget), .ulo = 0, .uhi = 1ull << 50, .meta = "BYTES",
     .help = "serve: device memory the contexts may hold (K/M/G); a request that finds none waits for a "
             "running one to end; 0: all the device has",
     .scope = SERVE},
    {"cache-ttl", RA_OPT_FLOAT, AT(cache_ttl), .flo = 0, .fhi = 1e9, .meta = "S",
     .help = "serve: seconds a finished context is kept", .scope = SERVE},
    {"max-body", RA_OPT_SIZE, AT(max_body), .ulo = 1024, .uhi = 1ull << 32, .meta = "BYTES",
     .help = "serve: request bodies above this get 413", .scope = SERVE},
    {"max-conns", RA_OPT_INT, AT(max_conns), .lo = 1, .hi = 65536, .meta = "N", .help = "serve: HTTP connections at once",
     .scope = SERVE},
    {"drain-timeout-ms", RA_OPT_INT, AT(drain_ms), .lo = 0, .hi = 3600000, .meta = "MS",
     .help = "serve: on SIGTERM, how long running requests may finish", .scope = SERVE},
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
  if ((o->save_context || o->context) && (!distributed || o->off.mode == RA_MODE_WAVE))
    return usage_error(s->scope, "--save-context / --context need a --mode with stores other than wave, not %s", mode);
  if (o->context && (o->prompt || o->prompt_file || o->chat))
    return usage_error(s->scope, "--context continues a saved context: give no prompt");
  if (o->spare_stores && !(o->shard_map || o->replicas > 1))
    return usage_error(s->scope, "--spare-stores restore replicas: give --replicas 2 or more, or a --shard-map with them");
  if (o->tp > 1 && (o->replicas > 1 || o->spare_stores || o->save_context || o->context))
    return usage_error(s->scope, "--tp takes no --replicas, --spare-stores, --save-context or --context yet");
  if (ra_opts_given(s, "replicas") && !o->stores)
    return usage_error(s->scope, "--replicas is for --stores (a --shard-map names each rule's owners)");
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
  if (o->off.retro_window && !ra_mode_takes_retro(o->off.mode)) {
    char retro_modes[96];
    ra_mode_list(retro_modes, sizeof retro_modes, RA_MODE_F_RETRO);
    return usage_error(s->scope, "--retro is for a mode with retrieval (%s), not %s", retro_modes, mode);
  }
  if (o->off.retro_window && o->off.wave.buffer > 0)
    return usage_error(s->scope, "--retro takes no --wave-buffer (the clusters the device attends from it would not be "
                       "supplemented to past steps)");
  if (o->off.retro_window >= o->off.n_window)
    return usage_error(s->scope, "--retro %u must be below --window %u", o->off.retro_window, o->off.n_window);
  static const char *const wave_only[] = {"retrieve", "retrieve-min", "estimate", "wave-segment", "wave-cluster", "wave-iters",
                                          "wave-block", "wave-buffer"};
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
  /* a tensor-parallel rank: the whole model's map, then the part of its kv heads */
  const uint32_t kv_all = m->tp ? (uint32_t)m->tp->n_kv_heads : (uint32_t)c->n_kv_heads;
  int rc;
  if (o->shard_map) {
    rc = ra_shard_map_load(o->shard_map, map, err);
  } else {
    rc = ra_shard_map_spread_list(o->stores, (uint32_t)c->n_layers, kv_all, map, err);
    if (rc == RA_OK) rc = ra_shard_map_replicate(map, (uint32_t)o->replicas, err);
  }
  if (rc == RA_OK && m->tp) {
    ra_shard_map whole = *map;
    memset(map, 0, sizeof *map);
    rc = ra_shard_map_validate(&whole, (uint32_t)c->n_layers, kv_all, err);
    if (rc == RA_OK) rc = ra_tp_shard_map(&whole, &m->tp->slice, map, err);
    ra_shard_map_free(&whole);
  }
  if (rc == RA_OK)
    rc = ra_offload_plan_build(map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads,
                               o->off.n_sink, o->off.n_window, plan, err);
  if (rc == RA_OK) return RA_OK;
  ra_shard_map_free(map);
  return rc;
}

/* --spare-stores: checked like --stores, none of them in the shard map. */
typedef struct spare_set {
  ra_shard_map map; /* only its store list is used */
  const char **stores;
  size_t n_stores;
} spare_set;

static void spare_free(spare_set *s) {
  ra_shard_map_free(&s->map);
  free(s->stores);
  memset(s, 0, sizeof *s);
}

static int spare_list(const char *csv, const ra_shard_map *map, spare_set *out, ra_error *err) {
  int rc = ra_shard_map_spread_list(csv, 1, 1, &out->map, err);
  if (rc) return ra_error_wrap(err, "--spare-stores");
  out->stores = malloc(out->map.n_stores * sizeof *out->stores);
  if (!out->stores) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
  for (size_t i = 0; rc == RA_OK && i < out->map.n_stores; i++) {
    out->stores[i] = out->map.stores[i];
    for (size_t j = 0; j < map->n_stores; j++)
      if (strcmp(map->stores[j], out->stores[i]) == 0)
        rc = ra_errorf(err, RA_EINVAL, "--spare-stores: %s is in the shard map already", out->stores[i]);
  }
  out->n_stores = out->map.n_stores;
  if (rc) spare_free(out);
  return rc;
}

/* The prefill's progress on a terminal: one line rewritten after each layer. */
static void print_progress(void *ctx, const ra_offload_progress *p) {
  (void)ctx;
  fprintf(stderr, "\rprefill %lld tokens: layer %d/%d, %.2f GB offloaded, index build %.1f s%s", (long long)p->n_tokens,
          p->layer, p->n_layers, (double)p->bytes_offloaded / 1e9, p->index_s, p->layer == p->n_layers ? "\n" : "");
  fflush(stderr);
}

/* wave's buffer counts: hits, misses, hit rate, rows the device attended, fetch wait. */
static void json_write_buffer(FILE *f, uint64_t hits, uint64_t misses, uint64_t dev_rows, double fetch_us) {
  fprintf(f, ", \"buffer_hits\": %llu, \"buffer_misses\": %llu, \"buffer_hit_rate\": %.4f, \"buffer_rows\": %llu, "
             "\"fetch_us\": %.1f",
          (unsigned long long)hits, (unsigned long long)misses, hits + misses ? (double)hits / (double)(hits + misses) : 0.0,
          (unsigned long long)dev_rows, fetch_us);
}

/* buffer: with wave's buffer counts */
static void json_write_stats(FILE *f, const ra_offload_stats *s, int buffer) {
  fprintf(f, "{\"total_us\": %.1f, \"wait_us\": %.1f, \"store_us\": %.1f, \"append_us\": %.1f, \"download_us\": %.1f, "
             "\"index_us\": %.1f, \"select_us\": %.1f, \"merge_us\": %.1f, \"n_scanned\": %llu, \"n_offloaded\": %llu, "
             "\"retro_past\": %u, \"retro_rows\": %llu, \"retro_us\": %.1f, \"retro_store_us\": %.1f",
          s->total_us, s->wait_us, s->store_us, s->append_us, s->download_us, s->index_us, s->select_us, s->merge_us,
          (unsigned long long)s->n_scanned, (unsigned long long)s->n_offloaded, s->retro_past,
          (unsigned long long)s->retro_rows, s->retro_us, s->retro_store_us);
  if (buffer) json_write_buffer(f, s->buffer_hits, s->buffer_misses, s->buffer_rows, s->fetch_us);
  fprintf(f, "}");
}

/* The stores' health: which were marked down (and why) and reattached, for the --json record. */
static void json_write_store_health(FILE *f, ra_remote *r) {
  if (!r) return;
  fprintf(f, ", \"store_health\": [");
  for (size_t i = 0; i < ra_remote_n_stores(r); i++) {
    ra_remote_store_report st;
    ra_remote_store_state(r, i, &st);
    fprintf(f, "%s{\"store\": ", i ? ", " : "");
    ra_json_write_str(f, st.addr);
    fprintf(f, ", \"replaced\": ");
    if (st.replaced) ra_json_write_str(f, st.replaced);
    else fprintf(f, "null");
    fprintf(f, ", \"down\": %s, \"error\": ", st.down ? "true" : "false");
    if (st.why) ra_json_write_str(f, st.why);
    else fprintf(f, "null");
    fprintf(f, ", \"reconnects\": %u, \"rows\": %llu}", st.reconnects, (unsigned long long)st.tokens);
  }
  fprintf(f, "]");
}

static int no_print(void *ctx, int32_t id) {
  (void)ctx;
  (void)id;
  return 0;
}

static int cmd_generate(const opts *o, ra_model *m, const ra_tokenizer *tok, ra_error *err) {
  /* tensor-parallel: every rank runs this, in lockstep; rank 0 prints and writes the JSON */
  const int root = !m->tp || m->tp->rank == 0;
  int32_t *ids = NULL;
  size_t n;
  ra_context saved = {0};
  int rc;
  if (o->context) {
    /* a saved context's first step feeds its next token at its position */
    rc = ra_context_read(o->context, &saved, err);
    if (rc == RA_OK && !(ids = malloc(sizeof *ids))) rc = ra_errorf(err, RA_ENOMEM, "out of memory");
    if (rc) {
      ra_context_free(&saved);
      return rc;
    }
    ids[0] = saved.next_token;
    n = 1;
  } else if ((rc = prompt_tokens(o, tok, &ids, &n, err)) != RA_OK) {
    return rc;
  }
  long ctx = o->ctx ? o->ctx : (long)saved.position + (long)n + o->max_new;
  ra_state *st = NULL;
  ra_shard_map map = {0};
  ra_offload_plan plan = {0};
  ra_offload *off = NULL;
  ra_offload_config oc = o->off;
  spare_set spares = {0};
  ra_kvclient_secrets secrets = {0};
  if (o->off.mode == RA_MODE_FULL) {
    rc = ra_state_new(m, ctx, o->batch < ctx ? o->batch : ctx, o->kv_dtype, &st, err);
  } else {
    oc = o->off;
    oc.kv_dtype = o->kv_dtype;
    rc = ra_kvclient_options_load(&oc.store_client, o->store_tls_ca, o->store_tls_cert, o->store_tls_key,
                                  o->auth_token_file, &secrets, err);
    if (rc) {
      ra_context_free(&saved);
      free(ids);
      return rc;
    }
    oc.max_ctx = ctx;
    oc.max_prompt = (int64_t)n; /* the prefill runs layer by layer over the whole prompt */
    if (root && !o->json && isatty(STDERR_FILENO)) oc.progress = print_progress;
    if (oc.mode != RA_MODE_STREAMING) rc = stores_plan(o, m, &map, &plan, err);
    if (rc == RA_OK && o->context && (rc = ra_context_check(&saved, &m->cfg, &oc, &plan, err)) == RA_OK)
      oc.resume = saved.sessions;
    if (rc == RA_OK && o->spare_stores && (rc = spare_list(o->spare_stores, &map, &spares, err)) == RA_OK) {
      oc.spares = spares.stores;
      oc.n_spares = spares.n_stores;
    }
    if (rc == RA_OK) rc = ra_offload_new(m, oc.mode == RA_MODE_STREAMING ? NULL : &plan, &oc, &off, err);
    if (rc == RA_OK) st = ra_offload_state(off);
    if (rc == RA_OK && o->context) rc = ra_context_restore(&saved, off, err);
  }
  if (rc) {
    ra_offload_free(off);
    spare_free(&spares);
    ra_offload_plan_free(&plan);
    ra_shard_map_free(&map);
    ra_context_free(&saved);
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
  rc = ra_generate(st, tok, ids, n, &gc, root ? print_token : no_print, &sc, &res, err);
  if (rc == RA_OK && o->save_context) {
    /* the last token sampled has not been fed: the reopened context feeds it first */
    if (res.stopped || res.n_tokens == 0)
      rc = ra_errorf(err, RA_EINVAL, "save context: the generation %s: no next token to continue from",
                     res.stopped ? "ended on a stop token (use --no-stop)" : "made no token");
    else rc = ra_context_save(o->save_context, off, &oc, res.tokens[res.n_tokens - 1], err);
    if (rc == RA_OK) ra_remote_keep_sessions(ra_offload_remote(off));
    if (rc) ra_gen_result_free(&res);
  }
  size_t n_prefill = o->context ? 0 : n;
  if (rc == RA_OK && !root) {
    ra_gen_result_free(&res);
  } else if (rc == RA_OK) {
    double pf = res.prefill_s > 0 ? (double)n / res.prefill_s : 0;
    double dc = res.decode_s > 0 && res.n_decode_steps ? (double)res.n_decode_steps / res.decode_s : 0;
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt %zu tokens, generated %zu%s; prefill %.3f s (%.1f tok/s), decode %.3f s (%.2f tok/s)\n",
            n_prefill, res.n_tokens, res.stopped ? " (stop token)" : "", res.prefill_s, pf, res.decode_s, dc);
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
        fprintf(f, ", \"prompt_tokens\": %zu, \"prefill_tokens\": %zu, \"context_position\": %lld", n_prefill,
                n_prefill, (long long)saved.position);
        fprintf(f, ", \"generated_tokens\": %zu, \"stopped\": %s, \"tokens\": [", res.n_tokens,
                res.stopped ? "true" : "false");
        for (size_t i = 0; i < res.n_tokens; i++) fprintf(f, "%s%d", i ? ", " : "", res.tokens[i]);
        fprintf(f, "], \"prefill_s\": %.6f, \"prefill_tok_s\": %.3f, \"decode_s\": %.6f, \"decode_steps\": %zu, \"decode_tok_s\": %.3f",
                res.prefill_s, pf, res.decode_s, res.n_decode_steps, dc);
        fprintf(f, ", \"mode\": \"%s\", \"tp\": %d", ra_mode_name(o->off.mode), o->tp);
        if (off) {
          size_t n_steps;
          const ra_offload_stats *steps = ra_offload_step_stats(off, &n_steps);
          fprintf(f, ", \"sink\": %u, \"window\": %u, \"attn_top_k\": %u, \"retro\": %u, \"stores\": %zu, \"prefill\": ",
                  o->off.n_sink, o->off.n_window, o->off.top_k, o->off.retro_window, plan.n_stores);
          json_write_stats(f, ra_offload_prefill_stats(off), 0);
          const ra_wave_config *wc = &o->off.wave;
          if (o->off.mode == RA_MODE_WAVE) {
            fprintf(f, ", \"wave\": {\"retrieve\": %g, \"retrieve_min\": %lld, \"estimate\": %g, \"segment\": %lld, "
                       "\"cluster\": %lld, \"iters\": %d, \"block\": %lld, \"buffer\": %lld",
                    wc->retrieve, (long long)wc->retrieve_min, wc->estimate, (long long)wc->segment,
                    (long long)wc->cluster, wc->iters, (long long)wc->block, (long long)wc->buffer);
            /* the decode's totals */
            ra_wave_buffer_stats bt;
            ra_wave_buffer_totals(ra_offload_wave(off), &bt);
            json_write_buffer(f, bt.hits, bt.misses, bt.rows, bt.fetch_us);
            fprintf(f, ", \"buffer_fetched\": %llu, \"buffer_fetched_rows\": %llu}", (unsigned long long)bt.fetched,
                    (unsigned long long)bt.fetched_rows);
          }
          json_write_store_health(f, ra_offload_remote(off));
          fprintf(f, ", \"steps\": [");
          for (size_t i = 0; i < n_steps; i++) {
            fprintf(f, "%s", i ? ", " : "");
            json_write_stats(f, &steps[i], o->off.mode == RA_MODE_WAVE);
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
  spare_free(&spares);
  ra_offload_plan_free(&plan);
  ra_shard_map_free(&map);
  ra_context_free(&saved);
  ra_kvclient_secrets_free(&secrets);
  free(ids);
  return rc;
}

typedef struct tp_gen {
  const opts *o;
  const ra_tokenizer *tok;
} tp_gen;

static int rank_generate(void *ctx, int rank, ra_model *m, ra_error *err) {
  (void)rank;
  const tp_gen *t = ctx;
  return cmd_generate(t->o, m, t->tok, err);
}

/* generate --tp N: the model, loaded in host memory, sharded over N backends (then freed), and
 * cmd_generate on every rank. */
static int cmd_generate_tp(const opts *o, ra_model **m, const ra_tokenizer *tok, ra_error *err) {
  ra_tp_group *g;
  ra_backend_config bc = {o->threads, 0};
  int rc = ra_tp_group_new(*m, o->tp, o->backend, &bc, &g, err);
  if (rc) return rc;
  ra_model_free(*m);
  *m = NULL;
  tp_gen t = {o, tok};
  rc = ra_tp_run(g, rank_generate, &t, err);
  ra_tp_group_free(g);
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

/* Bytes of the model's tensors on the device. */
static size_t weight_bytes(const ra_model *m) {
  size_t b = m->tok_embd.nbytes + m->out_norm.nbytes + m->output.nbytes;
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const ra_layer_weights *w = &m->layers[l];
    const ra_tensor *all[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq, &w->bk, &w->bv,
                              &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) b += all[i]->nbytes;
  }
  return b;
}

static int cmd_serve(const opts *o, ra_model *m, const ra_tokenizer *tok, ra_error *err) {
  if (!o->listen) return ra_errorf(err, RA_EINVAL, "serve needs --listen HOST:PORT");
  if (!tok) return ra_errorf(err, RA_EINVAL, "the model has no tokenizer (give --tokenizer GGUF)");
  /* the model id: --model-name, else the file's name without its directory and .gguf */
  char name[256];
  const char *base = strrchr(o->model, '/');
  snprintf(name, sizeof name, "%s", o->model_name ? o->model_name : base ? base + 1 : o->model);
  size_t nl = strlen(name);
  if (!o->model_name && nl > 5 && strcmp(name + nl - 5, ".gguf") == 0) name[nl - 5] = 0;
  ra_shard_map map = {0};
  ra_offload_plan plan = {0};
  int rc = RA_OK;
  int with_stores = ra_mode_uses_stores(o->off.mode);
  if (with_stores) rc = stores_plan(o, m, &map, &plan, err);
  if (rc) return rc;
  ra_serve_config sc = {
      .listen = o->listen, .ready_file = o->ready_file, .model_name = name, .max_body = (size_t)o->max_body,
      .max_conns = o->max_conns, .drain_timeout_ms = o->drain_ms, .weight_bytes = weight_bytes(m),
      .sched = {.m = m, .tok = tok, .off = o->off, .plan = with_stores ? &plan : NULL, .max_seqs = o->max_seqs,
                .max_ctx = o->ctx ? o->ctx : 2048, .prefill_chunk = o->batch, .max_cached = o->max_cached,
                .kv_budget = (size_t)o->kv_budget, .cache_ttl_s = o->cache_ttl, .kv_dtype = o->kv_dtype, .top_k = o->top_k,
                .attend_batch = o->attend_batch}};
  rc = ra_serve_run(&sc, err);
  ra_offload_plan_free(&plan);
  ra_shard_map_free(&map);
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
    rc = ra_load_tokenizer(o.tokenizer ? o.tokenizer : o.model, &tok, &err);
    if (rc == RA_OK) rc = cmd_tokenize(&o, tok, &err);
  } else if ((rc = ra_backend_create(o.tp > 1 ? "cpu" : o.backend, &bc, &be, &err)) == RA_OK &&
             (rc = ra_load_model(be, o.model, o.tokenizer, o.seed, &m, &tok, &err)) == RA_OK) {
    if (o.tp > 1) rc = cmd_generate_tp(&o, &m, tok, &err);
    else if (strcmp(o.cmd, "generate") == 0) rc = cmd_generate(&o, m, tok, &err);
    else if (strcmp(o.cmd, "dump-qk") == 0) rc = cmd_dump(&o, m, tok, &err);
    else if (strcmp(o.cmd, "logits") == 0) rc = cmd_logits(&o, m, tok, &err);
    else if (strcmp(o.cmd, "serve") == 0) rc = cmd_serve(&o, m, tok, &err);
    else cmd_info(m, tok);
  }
  if (rc != RA_OK) fprintf(stderr, "gpu-worker %s: error: %s\n", o.cmd, err.msg[0] ? err.msg : ra_strerror(rc));
  ra_tok_free(tok);
  ra_model_free(m);
  ra_backend_destroy(be);
  return rc == RA_OK ? 0 : 1;
}
