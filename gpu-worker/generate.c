#include "generate.h"

#include "clock.h"

#include <stdlib.h>
#include <string.h>

void ra_gen_result_free(ra_gen_result *r) {
  free(r->tokens);
  free(r->step_s);
  memset(r, 0, sizeof(*r));
}

static int feed(const ra_gen_config *cfg, ra_state *st, const int32_t *tokens, int64_t n, ra_error *err) {
  if (cfg->forward) return cfg->forward(cfg->forward_ctx, st, tokens, n, err);
  return ra_model_forward(st, tokens, n, 0, NULL, err);
}

int ra_generate(ra_state *st, const ra_tokenizer *tok, const int32_t *prompt, size_t n_prompt, const ra_gen_config *cfg,
                ra_gen_token_fn on_token, void *ctx, ra_gen_result *res, ra_error *err) {
  memset(res, 0, sizeof(*res));
  if (n_prompt == 0) return ra_errorf(err, RA_EINVAL, "generate: empty prompt");
  if (cfg->max_new_tokens < 0) return ra_errorf(err, RA_EINVAL, "generate: max_new_tokens %d", cfg->max_new_tokens);
  if ((int64_t)(n_prompt + (size_t)cfg->max_new_tokens) > st->n_ctx)
    return ra_errorf(err, RA_EINVAL, "generate: %zu prompt + %d new tokens exceed the context of %lld", n_prompt,
                     cfg->max_new_tokens, (long long)st->n_ctx);
  /* A model whose output is wider than its tokenizer (padded vocabularies; a random model given
   * a real tokenizer) must not emit ids the tokenizer cannot decode: pick among the first
   * ra_tok_vocab(tok) logits only. */
  int vocab = st->m->cfg.vocab;
  if (tok && ra_tok_vocab(tok) < vocab) vocab = ra_tok_vocab(tok);
  int k = cfg->temperature > 0.0f ? (cfg->top_k > 0 ? cfg->top_k : 40) : 1;
  if (k > vocab) k = vocab;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)k);
  float *vals = malloc(sizeof(float) * (size_t)k);
  res->tokens = malloc(sizeof(int32_t) * (size_t)(cfg->max_new_tokens + 1));
  res->step_s = malloc(sizeof(double) * (size_t)(cfg->max_new_tokens + 1));
  if (!ids || !vals || !res->tokens || !res->step_s) {
    free(ids);
    free(vals);
    ra_gen_result_free(res);
    return ra_errorf(err, RA_ENOMEM, "generate: out of memory");
  }
  res->n_prompt = n_prompt;
  ra_sampler smp;
  ra_sampler_init(&smp, cfg->temperature, cfg->top_p, cfg->seed);
  ra_backend *be = st->be;
  double t0 = ra_clock_now_s();
  int rc = feed(cfg, st, prompt, (int64_t)n_prompt, err);
  if (rc == RA_OK) rc = be->ops->sync(be, err);
  res->prefill_s = ra_clock_now_s() - t0;
  double td = ra_clock_now_s(), t_step = td;
  while (rc == RA_OK && res->n_tokens < (size_t)cfg->max_new_tokens) {
    ra_tensor row = ra_tensor_rows(&st->logits, st->n_logits - 1, 1);
    row.shape[1] = vocab; /* one row: its first `vocab` columns are contiguous */
    row.nbytes = (size_t)vocab * sizeof(float);
    if ((rc = be->ops->topk_rows(be, &row, k, ids, vals, err))) break;
    if (res->n_decode_steps) res->step_s[res->n_decode_steps - 1] = ra_clock_now_s() - t_step;
    int32_t next = ra_sampler_pick(&smp, vals, ids, k);
    if (cfg->stop_at_eos && tok && ra_tok_is_stop(tok, next)) {
      res->stopped = 1;
      break;
    }
    res->tokens[res->n_tokens++] = next;
    if (on_token && on_token(ctx, next)) break;
    if (res->n_tokens == (size_t)cfg->max_new_tokens) break;
    t_step = ra_clock_now_s();
    rc = feed(cfg, st, &next, 1, err);
    res->n_decode_steps++;
  }
  if (rc == RA_OK) rc = be->ops->sync(be, err);
  res->decode_s = ra_clock_now_s() - td;
  free(ids);
  free(vals);
  if (rc != RA_OK) ra_gen_result_free(res);
  return rc;
}
