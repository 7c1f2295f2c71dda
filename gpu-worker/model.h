/* Llama-family transformer on a backend: config, weights, KV cache and the forward pass.
 *
 * Supported: Llama / Llama-2/3, SmolLM2 (GGUF arch "llama"), Qwen2 (q/k/v biases, NEOX RoPE),
 * tied or separate output matrix; from GGUF (any ra_quant type) or safetensors + config.json,
 * or random weights of any geometry for tests and benchmarks.
 *
 * The forward pass of a step of n tokens at positions pos..pos+n-1 is a loop over layers that
 * the caller can drive itself (the distributed decode replaces local attention with merged
 * local + remote partials):
 *     ra_step_begin(st, tokens, n)          x = embed(tokens)                 x: [n, dim]
 *     for each layer l:
 *       ra_step_layer_qkv(st, l)            q, k, v = proj(rmsnorm(x)), RoPE; k, v -> cache rows
 *                                           q: [n, n_heads, hd], k, v: [n, n_kv_heads, hd]
 *       ra_step_layer_attend(st, l)         att = attention over cache rows [0, pos + i]
 *         (or the caller writes st->att)    att: [n, n_heads, hd]
 *       ra_step_layer_finish(st, l)         x += att Wo^T; x += ffn(rmsnorm(x))
 *                                           (tensor-parallel: each sum over the ranks' partials)
 *     ra_step_end(st, all_logits)           logits of the last (or every) token; pos += n
 * ra_model_forward does exactly that, with an optional hook after each layer's q/k/v. */
#ifndef RA_MODEL_H
#define RA_MODEL_H

#include "backend.h"
#include "gguf.h"
#include "status.h"

#include <stdint.h>

typedef struct ra_model_config {
  char arch[32];  /* "llama", "qwen2" */
  char name[128];
  int n_layers;
  int dim;        /* hidden size */
  int n_heads;    /* query heads */
  int n_kv_heads;
  int head_dim;
  int ffn_dim;
  int vocab;
  int n_rot;      /* rotary dims per head (usually head_dim) */
  float rope_theta;
  float norm_eps;
  int max_ctx;    /* trained context length (informational) */
  ra_rope_style rope_style;
  int qkv_bias;   /* q/k/v projections have biases (Qwen2) */
  int tied_embeddings;
} ra_model_config;

typedef struct ra_layer_weights {
  ra_tensor attn_norm;      /* [dim] */
  ra_tensor wq, wk, wv, wo; /* [n_heads*hd, dim], [n_kv*hd, dim] x2, [dim, n_heads*hd] */
  ra_tensor bq, bk, bv;     /* biases when cfg.qkv_bias, else unallocated */
  ra_tensor ffn_norm;       /* [dim] */
  ra_tensor w_gate, w_up;   /* [ffn, dim] */
  ra_tensor w_down;         /* [dim, ffn] */
} ra_layer_weights;

struct ra_tp_rank;

typedef struct ra_model {
  ra_model_config cfg;
  ra_backend *be;
  /* NULL: the whole model. Else one rank's slice of a tensor-parallel model (gpu-worker/tp.h):
   * cfg counts this rank's heads and FFN columns, and ra_step_layer_finish all-reduces x. */
  const struct ra_tp_rank *tp;
  ra_tensor tok_embd; /* [vocab, dim] */
  ra_tensor out_norm; /* [dim] */
  ra_tensor output;   /* [vocab, dim]; unallocated when tied (tok_embd is used) */
  ra_layer_weights *layers;
} ra_model;

/* Checks a config for consistency and sane bounds (RA_EINVAL with the reason). */
int ra_model_config_validate(const ra_model_config *cfg, ra_error *err);
/* Reads the config from GGUF metadata (and tensor shapes). */
int ra_model_config_from_gguf(const ra_gguf *g, ra_model_config *cfg, ra_error *err);

int ra_model_load_gguf(ra_backend *be, const ra_gguf *g, ra_model **out, ra_error *err);
/* A Hugging Face directory: config.json + model.safetensors (or model.safetensors.index.json
 * with shards). Weights F32/F16/BF16. */
int ra_model_load_safetensors(ra_backend *be, const char *dir, ra_model **out, ra_error *err);
/* Random weights from `seed`, generated on the backend (fill_random); deterministic. */
int ra_model_random(ra_backend *be, const ra_model_config *cfg, uint64_t seed, ra_model **out, ra_error *err);
/* Replaces every weight matrix of m (2-D, more than one row) by a copy in dtype (F16/BF16/F32),
 * one at a time (peak memory: the model plus one converted matrix). Vectors (norms, biases)
 * stay F32. Random models are made in F32; on CUDA, where loaded checkpoints are kept as BF16,
 * this makes a random model run the kernels a real one runs. */
int ra_model_convert_weights(ra_model *m, ra_dtype dtype, ra_error *err);
void ra_model_free(ra_model *m);
/* A named geometry for ra_model_random: "llama3-8b", "llama3-70b", "yi-6b", "smollm2-135m", "tiny", or
 * "NAME:LAYERS" for its first LAYERS layers (1 <= LAYERS <= the preset's). RA_EINVAL + message
 * for an unknown name or a bad layer count. */
int ra_model_config_preset(const char *spec, ra_model_config *cfg, ra_error *err);

/* Rows of the MLP's [rows, ffn_dim] activations per pass: an offloaded prefill steps the whole
 * prompt through each layer, and at 1M tokens two such [n, ffn] fp32 tensors would take 92 GB. */
#define RA_FFN_ROWS 16384

/* Inference state: KV cache and activation buffers for steps of up to max_batch tokens. */
typedef struct ra_state {
  const ra_model *m;
  ra_backend *be;
  int64_t n_ctx;     /* cache capacity in tokens */
  int64_t max_batch; /* tokens per step */
  int64_t pos;       /* tokens already in the context */
  int64_t n;         /* tokens in the current step (in its focus: ra_step_rows) */
  int64_t step_rows; /* tokens ra_step_begin took */
  int64_t row0;      /* the focus's first row within the step (0: the whole step) */
  int64_t cache_row; /* cache row of the step's first token: pos, unless the caller keeps a ring
                        (set it after ra_step_begin) */
  int64_t wrap_at, wrap_row; /* a ring that wraps inside the step: its tokens from wrap_at on (0 < wrap_at
                        < n) go to cache rows from wrap_row; ra_step_begin sets wrap_at 0 (none) */
  ra_tensor *k_cache, *v_cache; /* per layer: [n_ctx, n_kv_heads, hd] */
  /* per-step activations, each with max_batch rows (gate and up: ffn_rows, the MLP runs over a
   * step's rows that many at a time); views of n rows are in the cur_* fields */
  ra_tensor x, xn, q, k, v, att, gate, up;
  int64_t ffn_rows;
  ra_tensor dec_ml; /* [n_heads, 2] (m, l) of local decode attention */
  ra_tensor logits; /* [logits_rows, vocab] */
  int64_t logits_rows;
  int64_t n_logits; /* rows of logits written by the last ra_step_end */
  /* Views of the current step's n rows (valid between ra_step_begin and ra_step_end). */
  ra_tensor cur_x, cur_xn, cur_q, cur_k, cur_v, cur_att, cur_gate, cur_up;
} ra_state;

int ra_state_new(const ra_model *m, int64_t n_ctx, int64_t max_batch, ra_dtype kv_dtype, ra_state **out, ra_error *err);
/* Reallocates the MLP activations for `rows` rows per pass (1 .. max_batch; RA_FFN_ROWS or the
 * batch by default): less device memory for long prompts, the same results. Between steps. */
int ra_state_set_ffn_rows(ra_state *st, int64_t rows, ra_error *err);
/* Reallocates the step activations for steps of up to rows tokens (1 .. n_ctx), the MLP's for
 * ffn_rows per pass (1 .. rows): an offloading prefill's state keeps its prompt-sized buffers
 * (GBs at 32K tokens) only while it prefills. Between steps; on failure the state is unchanged. */
int ra_state_set_max_batch(ra_state *st, int64_t rows, int64_t ffn_rows, ra_error *err);
/* A state whose per-layer caches hold only cache_rows rows (<= n_ctx) for a context of n_ctx tokens:
 * the caller decides where each step's k, v go (st->cache_row) and what attention covers — the
 * distributed decode keeps sink + window there (gpu-worker/offload.h). */
int ra_state_new_ring(const ra_model *m, int64_t n_ctx, int64_t max_batch, int64_t cache_rows, ra_dtype kv_dtype,
                      ra_state **out, ra_error *err);
/* Exchanges layer `layer`'s cache tensors with *k, *v (a prefill that runs one layer over a
 * full-length scratch cache swaps it in, then back). */
void ra_state_swap_cache(ra_state *st, int layer, ra_tensor *k, ra_tensor *v);
void ra_state_free(ra_state *st);
void ra_state_reset(ra_state *st);

int ra_step_begin(ra_state *st, const int32_t *tokens, int64_t n, ra_error *err);
int ra_step_layer_qkv(ra_state *st, int layer, ra_error *err);
int ra_step_layer_attend(ra_state *st, int layer, ra_error *err);
int ra_step_layer_finish(ra_state *st, int layer, ra_error *err);
/* Narrows the step to its rows [r0, r0 + nr) (of those ra_step_begin took): n, pos, cache_row
 * and the cur_* views become those rows', so that the three layer calls run a layer over them
 * alone; (0, all) is the whole step again, and ra_step_end returns to it. A layer run chunk by
 * chunk in row order computes what it computes over the whole step: its attention is causal,
 * so a chunk's queries read only rows that earlier chunks put in the cache. This is what lets a
 * prefill stop within a layer (gpu-worker/offload.c). A step whose ring wraps cannot be
 * narrowed (RA_EUNSUPPORTED). */
int ra_step_rows(ra_state *st, int64_t r0, int64_t nr, ra_error *err);
/* Final norm and logits: of every token of the step when all_logits, else of the last one. */
int ra_step_end(ra_state *st, int all_logits, ra_error *err);

typedef struct ra_forward_hooks {
  void *ctx;
  /* Called after layer `layer`'s q, k, v (post-RoPE) are in st->cur_q/cur_k/cur_v. */
  int (*on_qkv)(void *ctx, ra_state *st, int layer, ra_error *err);
} ra_forward_hooks;

/* Feeds n tokens (in steps of max_batch), appending to the cache. Afterwards st->logits holds
 * the last token's logits, or every token's when all_logits (then n <= max_batch). */
int ra_model_forward(ra_state *st, const int32_t *tokens, int64_t n, int all_logits, const ra_forward_hooks *hooks,
                     ra_error *err);

#endif
