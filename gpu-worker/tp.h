/* Tensor parallelism over N ranks of one process (Megatron-style), a thread per rank.
 *
 * Rank r holds a contiguous block of kv heads [kv_lo, kv_hi), their q heads [q_lo, q_hi) (the
 * groups stay whole), and a block of FFN columns [ffn_lo, ffn_hi):
 *     wq [q*hd, dim], wk, wv [kv*hd, dim], biases     rows of its heads       (column-parallel)
 *     w_gate, w_up [ffn_r, dim]                       rows of its FFN columns (column-parallel)
 *     wo [dim, q*hd], w_down [dim, ffn_r]             columns of the same     (row-parallel)
 *     norms, tok_embd, output                         whole (replicated)
 * so a rank's model is an ordinary ra_model with n_heads = q_hi - q_lo, n_kv_heads = kv_hi -
 * kv_lo, ffn_dim = ffn_hi - ffn_lo and m->tp set. Its attention, KV cache and remote attention
 * cover only its own heads; the two row-parallel matmuls give partial sums of x, which
 * ra_step_layer_finish all-reduces (rank 0 alone adds the residual), so every rank holds the
 * whole x after each layer, and the same logits.
 *
 * A program runs SPMD: ra_tp_run calls fn on every rank's thread with its model; ranks that do
 * the same calls in the same order stay in lockstep (greedy or seeded sampling picks the same
 * tokens everywhere). The offloaded decode runs one ra_offload per rank over the rank's shard
 * map (ra_tp_shard_map): each rank talks to the stores of its kv heads, in sessions of its own,
 * and merges its heads' partials itself. */
#ifndef RA_TP_H
#define RA_TP_H

#include "model.h"
#include "shardmap.h"
#include "tp_comm.h"

#define RA_TP_MAX_RANKS 64

typedef struct ra_tp_slice {
  int kv_lo, kv_hi;   /* kv heads */
  int q_lo, q_hi;     /* q heads: the kv heads' groups */
  int ffn_lo, ffn_hi; /* FFN columns */
} ra_tp_slice;

typedef struct ra_tp_plan {
  int n_ranks;
  ra_tp_slice ranks[RA_TP_MAX_RANKS];
} ra_tp_plan;

/* What a rank's model knows of the others (ra_model.tp). */
struct ra_tp_rank {
  ra_tp_comm *comm;
  int rank, n_ranks;
  ra_tp_slice slice;
  int n_heads, n_kv_heads; /* the whole model's */
};

/* Deals the kv heads (and their groups) and the FFN columns in contiguous blocks whose sizes
 * differ by at most one; RA_EINVAL when n_ranks is not in [1, min(n_kv_heads, RA_TP_MAX_RANKS)]. */
int ra_tp_plan_make(const ra_model_config *c, int n_ranks, ra_tp_plan *out, ra_error *err);

/* Rank `rank`'s model on be: src's weights sliced as above (through host memory, in row chunks;
 * matrices keep src's dtype when it is not F32). tp must outlive the model. */
int ra_tp_model_shard(const ra_model *src, const struct ra_tp_rank *tp, ra_backend *be, ra_model **out,
                      ra_error *err);

/* The rank's shard map: the rules of map that own any of the slice's kv heads, clipped to them
 * and renumbered from 0 (the rank's model numbers its heads so), with only the stores they name. */
int ra_tp_shard_map(const ra_shard_map *map, const ra_tp_slice *s, ra_shard_map *out, ra_error *err);

/* N ranks: a backend each (cpu: threads / N threads each; cuda: device r), the plan, the
 * all-reduce (NCCL on CUDA when built, else host) and the sharded models. src may be freed after. */
typedef struct ra_tp_group {
  int n_ranks;
  int threads_per_rank; /* cpu: OpenMP threads of each rank's thread */
  ra_tp_plan plan;
  ra_tp_comm *comm;
  struct ra_tp_rank ranks[RA_TP_MAX_RANKS];
  ra_backend *bes[RA_TP_MAX_RANKS];
  ra_model *models[RA_TP_MAX_RANKS];
} ra_tp_group;

int ra_tp_group_new(const ra_model *src, int n_ranks, const char *backend, const ra_backend_config *bc,
                    ra_tp_group **out, ra_error *err);
void ra_tp_group_free(ra_tp_group *g);

/* Runs fn(ctx, rank, model) on a thread per rank and waits for all. A rank that fails aborts the
 * all-reduce, so the others fail too instead of waiting; the first failure that is not such a
 * cancellation is returned in err. */
typedef int (*ra_tp_fn)(void *ctx, int rank, ra_model *m, ra_error *err);
int ra_tp_run(ra_tp_group *g, ra_tp_fn fn, void *ctx, ra_error *err);

#endif
