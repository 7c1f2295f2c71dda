/* Generation: prefill a prompt, then decode token by token with the KV cache on the backend,
 * picking tokens with the sampler, stopping at max_new_tokens or a stop token. */
#ifndef RA_GENERATE_H
#define RA_GENERATE_H

#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Feeds n tokens to st and leaves the last one's logits in st->logits. NULL in ra_gen_config means
 * ra_model_forward; the distributed decode feeds through its offload runtime (offload.h). */
typedef int (*ra_gen_forward_fn)(void *ctx, ra_state *st, const int32_t *tokens, int64_t n, ra_error *err);

typedef struct ra_gen_config {
  int max_new_tokens;
  float temperature; /* <= 0: greedy */
  float top_p;
  int top_k; /* candidates considered when sampling (greedy uses 1) */
  uint64_t seed;
  int stop_at_eos; /* stop on the tokenizer's stop tokens (needs a tokenizer) */
  ra_gen_forward_fn forward; /* NULL: ra_model_forward */
  void *forward_ctx;
} ra_gen_config;

typedef struct ra_gen_result {
  int32_t *tokens; /* generated ids (malloc'ed), n_tokens of them */
  size_t n_tokens;
  size_t n_prompt;
  int stopped; /* ended on a stop token */
  double prefill_s; /* prompt forward up to the first token's logits */
  double decode_s;  /* all later steps */
  size_t n_decode_steps;
  /* [n_decode_steps] wall time of each decode step: a token's forward and the pick of the next
   * one (the pick reads the logits back, so a device's work is done by then) */
  double *step_s;
} ra_gen_result;

/* Called with every generated token (before it is fed back); a nonzero return stops early. */
typedef int (*ra_gen_token_fn)(void *ctx, int32_t id);

int ra_generate(ra_state *st, const ra_tokenizer *tok, const int32_t *prompt, size_t n_prompt, const ra_gen_config *cfg,
                ra_gen_token_fn on_token, void *ctx, ra_gen_result *res, ra_error *err);
void ra_gen_result_free(ra_gen_result *r);

#endif
