/* Partial attention over a session's stored KV for one layer.
 *
 * For each requested query head h (GQA: it reads kv head h / (n_q_heads / n_kv_heads)) the
 * result is the partial triple over the keys the mode selects, with z_i = q·k_i / sqrt(head_dim):
 *   m = max_i z_i,  l = sum_i exp(z_i - m),  o = sum_i exp(z_i - m) v_i / l      (o: [head_dim])
 * which the worker merges exactly with ra_partial_merge (common/merge.h).
 *
 * Modes: full scans every stored key; flat computes every q·k and keeps the exact top-k, then
 * attends over those k. Index modes (ivf, kgraph, roar) search, for each asked q head and each
 * shard of its kv head, the shard's index of that kind (the q head's own, else the kv head's
 * shared one: store.h) for the top_k keys, plus an exact scan of any rows the index lags behind;
 * the global top_k over the shards' candidates is then attended over exactly, with the same
 * gather step as flat. A shard whose indexes the background indexer is inserting into at that
 * moment is scanned exactly instead (an attend never waits for insertion), so exact retrieval
 * gives the same result whatever insertion is doing. n_scanned counts the dot products the
 * searches and scans computed. A
 * non-empty shard without an index of the mode's kind fails the request with RA_ESTATE
 * (FAILED_PRECONDITION) naming the layer, q head and shard.
 *
 * Wave mode (attend_wave.h) attends exactly over the clusters the request selects (clusters.h)
 * plus every row of the kv head that no cluster covers.
 *
 * Work is split into (kv head, row block) tasks run by OpenMP, the q heads of one GQA group
 * sharing each block's key and value loads; per-block partials merge exactly, so even one head
 * over many tokens uses every thread. Index modes run one task per (q head, shard), each
 * thread searching with a scratch from the store's pool. */
#ifndef KVS_ATTEND_H
#define KVS_ATTEND_H

#include "index_params.h"
#include "merge.h"
#include "modes.h"
#include "store.h"

#include <stddef.h>
#include <stdint.h>

/* Wave mode's cluster selection (proto AttendRequest.cluster_*): kv head kv_heads[i] selects
 * counts[i] cluster ids, the next ones of ids ([n_ids], concatenated). With retro, past step j
 * (1-based) names for kv head kv_heads[i] retro_counts[(j - 1) * n_heads + i] ids, the next ones
 * of retro_ids: the clusters it gets its exact partial over (AttendRequest.retro_clusters). */
typedef struct kvs_wave_select {
  const uint32_t *kv_heads; /* [n_heads] */
  const uint32_t *counts;   /* [n_heads] */
  size_t n_heads;
  const uint32_t *ids;
  size_t n_ids;
  const uint32_t *retro_counts; /* [n_retro_counts] = [n_retro, n_heads] */
  size_t n_retro_counts;
  const uint32_t *retro_ids;    /* [n_retro_ids] */
  size_t n_retro_ids;
} kvs_wave_select;

typedef struct kvs_attend_args {
  uint32_t layer;
  const uint32_t *q_heads; /* [n_heads], distinct, each of a kv head this session stores */
  size_t n_heads;
  const float *q;          /* [n_heads, head_dim] */
  ra_mode mode;            /* a mode a store answers (one with a wire value) */
  uint32_t top_k;          /* keys per head for every mode but full */
  ra_search_spec search;   /* index modes: beam width, ivf lists probed; 0: ra_search_params_default */
  int want_ids;            /* fill ids with the token positions attended over */
  int n_threads;           /* OpenMP threads; 0: the OpenMP default */
  kvs_wave_select wave;    /* mode wave only */
  /* Retrospective correction (flat, index modes; retro.h): retro_window > 0 records the
   * positions each head attends over as step retro_step (>= 1), and each of the n_retro <=
   * retro_window past steps' queries retro_q [n_retro, n_heads, head_dim] (step retro_step - j
   * at row j - 1) gets the exact partial over the positions attended now that it has not seen.
   * Wave: nothing is recorded; past step j's partial is over wave.retro_ids' clusters of it. */
  uint64_t retro_step;
  uint32_t retro_window;
  uint32_t n_retro;
  const float *retro_q;
} kvs_attend_args;

typedef struct kvs_attend_result {
  size_t n_heads;
  ra_head_partial *heads;  /* [n_heads], in request order; heads[i].part.o = o + i * head_dim */
  float *o;                /* [n_heads, head_dim] */
  uint64_t *ids;           /* backing store of every head's ids */
  /* index modes: (head, shard) searches, those that scanned the shard exactly because the
   * background indexer held it, and the time spent waiting for shards' index locks (summed over
   * threads); the searches' wall and thread CPU time (summed: a wall time well above the CPU
   * time means the searching threads were descheduled); also added to the session's counters */
  uint64_t n_searches, n_searches_exact, lock_wait_us, search_us, search_cpu_us;
  /* retro: [n_retro, n_heads] supplementary partials (past step j's head i at (j - 1) * n_heads
   * + i; n_scanned = the rows it attended over), their o, and the time they took */
  ra_head_partial *retro;
  float *retro_o;
  uint64_t retro_us;
} kvs_attend_result;

/* Computes the partials; takes the session's read lock. On failure `out` holds nothing. */
int kvs_attend(kvs_session *s, const kvs_attend_args *a, kvs_attend_result *out, ra_error *err);
void kvs_attend_result_free(kvs_attend_result *r);

#endif
