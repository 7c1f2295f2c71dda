/* A batched forward step over several sequences: each sequence keeps its own ra_state (its KV
 * cache and position), and one step feeds every sequence's next tokens together, so that each
 * weight matrix is read once per step for the whole batch.
 *
 * Step of items i = 0..B-1, item i feeding n_i tokens at its state's positions pos_i..:
 *     x = embed(all tokens)                       x: [T, dim], T = sum n_i, item rows contiguous
 *     per layer:
 *       q, k, v = proj(rmsnorm(x))                one GEMM over [T, dim] per projection
 *       per item: RoPE at its positions, k, v -> its cache rows, attention over its cache
 *                 (the causal prefill kernel for a chunk; the one-token items' RoPE and cache
 *                 rows in one rope_store_batch, their attention in one attn_decode_batch)
 *       x += att Wo^T;  x += ffn(rmsnorm(x))      GEMMs over [T, ...]
 *     logits of every item's last token           [B, vocab]
 * A sequence's outputs do not depend on what it is batched with except through the GEMMs'
 * rounding (OpenBLAS takes a matrix-vector path for a single row); the decode and prefill
 * kernels are the ones ra_model_forward runs. */
#ifndef RA_BATCH_H
#define RA_BATCH_H

#include "model.h"

#include <stdint.h>

typedef struct ra_batch ra_batch;

/* Items' own attention, instead of RoPE + attention over their caches. Items that point at the
 * same ra_batch_attn form a group (an offloaded runtime's sequences, say): per layer, flush runs
 * once per group with the step's whole q, k, v [T, ...] before RoPE and its att [T, ...] (the
 * group knows its items' rows: they follow from the items before them; flush may write their
 * att rows), and only then end for each item, so that work flush starts (the store requests)
 * proceeds for the whole group while the device attends. end gets the item's index in
 * ra_batch_forward's items and its rows q [n, n_heads, head_dim], and writes its att
 * [n, n_heads, head_dim]. */
typedef struct ra_batch_attn {
  void *ctx;
  int (*flush)(void *ctx, int layer, ra_tensor *q, ra_tensor *k, ra_tensor *v, ra_tensor *att, ra_error *err);
  int (*end)(void *ctx, int item, int layer, ra_tensor *q, ra_tensor *att, ra_error *err);
} ra_batch_attn;

typedef struct ra_batch_item {
  ra_state *st;          /* the sequence: caches and position (its own activations are unused) */
  const int32_t *tokens; /* [n] */
  int64_t n;             /* >= 1 */
  const ra_batch_attn *attn; /* NULL: RoPE, the cache rows at pos and attention over the cache */
} ra_batch_item;

/* Activations for steps of up to max_tokens tokens over up to max_items sequences. */
int ra_batch_new(const ra_model *m, int64_t max_tokens, int max_items, ra_batch **out, ra_error *err);
void ra_batch_free(ra_batch *b);

/* One step (see the top). Each item's st->pos advances by its n; its logits are row i of
 * ra_batch_logits. On failure no position advances (a cache row may have been written past a
 * position, which the next step overwrites). */
int ra_batch_forward(ra_batch *b, const ra_batch_item *items, int n_items, ra_error *err);
/* [max_items, vocab]: row i = item i's last token after ra_batch_forward. */
const ra_tensor *ra_batch_logits(const ra_batch *b);

#endif
