/* Per-shard top-k inner-product indexes over a kv head's keys: the retrieval half of
 * RetrievalAttention (arXiv 2409.10516). For a decode query q the store wants the keys with the
 * largest raw q·k (it applies the softmax scale itself) while computing as few dot products as
 * possible.
 *
 * Kinds (ra_mode, common/modes.h):
 *   flat    exact scan of every key.
 *   ivf     k-means clusters of the keys; a query scans the nprobe clusters whose centroid has
 *           the largest q·centroid.
 *   kgraph  a bounded-degree graph from key-key proximity only (each key linked to its exact
 *           top-inner-product keys, occlusion-pruned): the "traditional ANNS" baseline that
 *           fails on out-of-distribution queries.
 *   roar    the attention-aware graph (RoarGraph, VLDB 2024): prefill queries' exact top-Nq key
 *           lists are projected onto the keys, so edges join keys that *queries* find close.
 *
 * Keys are not copied: every call takes an ra_keys view of the shard's array, row i = key id i.
 * The index never keeps that pointer (the array moves when the shard grows); the caller must
 * pass the same rows (plus appended ones) on every call.
 *
 * Threads: ra_index_search is safe concurrently on one index, each thread with its own scratch.
 * ra_index_insert mutates the index: the caller must exclude searches while it runs (the store
 * holds a rwlock: searches shared, insert exclusive). Build uses OpenMP inside. */
#ifndef RA_INDEX_H
#define RA_INDEX_H

#include "half.h"
#include "index_params.h"
#include "modes.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* A view of a shard's keys: rows is [n, dim] row-major in dtype. */
typedef struct {
  const void *rows;
  ra_dtype dtype;
  int dim;
  uint32_t n;
} ra_keys;

/* Build parameters, resolved (the library takes no "unset"). Fields a kind does not use are
 * ignored. The fields of common/index_params.h's build rows have their names, and their bounds
 * (ra_index_spec_check_resolved); the rest are the library's own. */
typedef struct {
  ra_mode kind;       /* RA_MODE_FLAT (an exact scan) or a mode with an index */
  uint32_t degree;    /* graphs: max out-degree M of every node */
  uint32_t build_ef;  /* graphs: beam width L_build when linking a key by search (connectivity
                         repair, insertion); kgraph: also the length of each key's exact
                         key-key candidate list */
  uint32_t knn_nq;    /* roar: Nq, exact top keys per prefill query that are projected */
  uint32_t n_lists;   /* ivf: clusters; 0 = about 4*sqrt(n) */
  uint32_t max_iters; /* ivf: k-means Lloyd iterations */
  uint32_t train_per_list; /* ivf: k-means trains on a seeded sample of at most n_lists * this
                              keys (then assigns every key); 0 = on every key */
  float query_sample; /* roar: fraction in (0, 1] of the given prefill queries used */
  uint32_t pivots;    /* roar: the first `pivots` keys of each query's list are pivots of the
                         projection (RoarGraph: 1; capped at knn_nq); 0 (the default) = 64, or
                         fewer when key -> query lists come (roar.c, ROAR_PIVOTS_KEYED) */
  uint32_t keep_queries; /* roar: sampled build queries kept (fp16) with their top-T lists for
                            query-aware insertion (roar.c); 0 = none. Needs query vectors */
  uint32_t keep_topk;    /* roar: T, the top keys each kept query tracks (capped at knn_nq) */
  uint64_t seed;      /* every random choice; a fixed seed gives a bit-identical index */
  int n_threads;      /* build threads; 0 = OpenMP's default */
} ra_index_params;

/* Defaults measured on synthetic Q/K (bench/results/index-synthetic; see index.c's comment). */
void ra_index_params_default(ra_mode kind, ra_index_params *p);

/* Search parameters: ef = L_search (graphs; raised to k when smaller), nprobe (ivf). */
typedef struct {
  uint32_t ef;
  uint32_t nprobe;
} ra_search_params;
void ra_search_params_default(ra_mode kind, ra_search_params *sp);

/* Prefill queries for roar: vectors q [n, dim] (fp32), and/or knn [n, knn_k]: each query's exact
 * top-knn_k key ids by inner product, best first (computed on the GPU during prefill). With knn
 * given, no brute force runs; without it the build computes the lists from q over the keys
 * (blocked sgemm). knn_k >= 2 is needed; min(knn_k, knn_nq) ids per query are used. The vectors
 * also give the pruning metric (the queries' second moment, graph.h); with knn lists alone (q
 * NULL) pruning falls back to plain L2 between keys, which measured worse: send both. */
typedef struct {
  const float *q;
  uint32_t n;
  const uint32_t *knn;
  uint32_t knn_k;
  /* Optional: key -> query lists, [keys->n, key_top_k] (1 <= key_top_k <= RA_INDEX_KEY_TOP_MAX;
   * 4 measured best for its cost, roar.c). Row i names the queries (indices into [0, n)) that
   * rank key i best relative to their own lists, best first: by the margin q_j·k_i - s_j, s_j
   * being query j's knn_nq-th best score over the keys (the last of its list; the margin ranks
   * better than raw q_j·k_i: bench/results/defaults/README.md). RA_INDEX_NO_QUERY fills rows with fewer; queries
   * the build does not sample (query_sample < 1) are skipped, so send the sampled queries only,
   * with query_sample 1. With the lists every key that is no pivot is linked through its
   * queries' lists instead of by beam searches (much cheaper at the same recall); NULL links them
   * by beam searches. Key ids are taken to be in token order (keys sharing a query
   * are taken nearest in id first). */
  const uint32_t *key_top_queries;
  uint32_t key_top_k;
} ra_queries;

#define RA_INDEX_NO_QUERY 0xffffffffu
#define RA_INDEX_KEY_TOP_MAX 64u

typedef struct ra_index ra_index;

/* Upper bound of the bytes ra_index_build will hold at its peak (index + build temporaries) for
 * n_keys keys of dimension dim, and n_queries prefill queries (roar; 0 otherwise), so the store
 * can charge its budget before building. */
size_t ra_index_estimate_bytes(const ra_index_params *p, uint32_t n_keys, int dim,
                               uint32_t n_queries);

/* Builds an index over keys [0, keys->n). queries: roar only (NULL otherwise). On failure *out
 * is NULL and nothing is held. RA_EINVAL for bad parameters, RA_ENOMEM. */
int ra_index_build(const ra_index_params *p, const ra_keys *keys, const ra_queries *queries,
                   ra_index **out, ra_error *err);

/* Adds key `id`, which must equal ra_index_count(ix) and be < keys->n (the shard appended it):
 * a token evicted from the GPU window. It is retrievable by the next search. Graphs link it by a
 * beam search (L_build) + occlusion pruning + reverse edges, keeping the degree bound and
 * reachability from the entry; roar also links it through the kept build queries whose top
 * lists it enters (roar.c). On failure the index is unchanged. */
int ra_index_insert(ra_index *ix, const ra_keys *keys, uint32_t id, ra_error *err);

/* Per-thread search state: visited marks (uint32 epochs per key), the beam, top-k buffers.
 * Sized at init for the index and max_ef; a search on a grown index or with a larger ef/k grows it
 * (amortized, never per search in the steady state). */
typedef struct ra_index_scratch {
  uint32_t *visited; /* [visited_cap] epoch marks */
  uint32_t visited_cap;
  uint32_t epoch;
  uint32_t *pool_id; /* [pool_cap] the beam, best first */
  float *pool_score;
  uint32_t pool_cap;
  uint32_t *nbr_id; /* [buf_cap] a node's unvisited neighbors / a scan block */
  float *nbr_score;
  uint32_t buf_cap;
  uint32_t *list_id; /* [list_cap] ivf: probed list order */
  float *list_score;
  uint32_t list_cap;
} ra_index_scratch;

int ra_index_scratch_init(ra_index_scratch *s, const ra_index *ix, uint32_t max_ef, uint32_t max_k,
                          ra_error *err);
void ra_index_scratch_free(ra_index_scratch *s);

/* The (up to) k keys with the largest q·k, ids_out/scores_out [k] sorted by descending score (ties
 * by ascending id). *n_out = results (< k only when fewer keys exist or, for graphs, were
 * reached); *n_scanned (may be NULL) = keys whose dot product was computed. q is fp32 [dim].
 * Graphs whose beam max(ef, k) is at least a quarter of the keys answer by an exact scan.
 * RA_EINVAL (bad arguments, keys smaller than the index), RA_ENOMEM (scratch growth). */
int ra_index_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                    const ra_search_params *sp, ra_index_scratch *s, uint32_t *ids_out,
                    float *scores_out, uint32_t *n_out, uint64_t *n_scanned);

uint32_t ra_index_count(const ra_index *ix); /* keys indexed */
ra_mode ra_index_get_kind(const ra_index *ix);
size_t ra_index_bytes(const ra_index *ix); /* heap bytes held now */

/* Structural self-check (tests, debugging): graph degree <= M, no self loops or duplicate edges,
 * every key reachable from the entry; ivf every key in exactly one list. RA_EINTERNAL + message. */
int ra_index_check(const ra_index *ix, ra_error *err);

/* Graph statistics for reports; zeros for non-graph kinds. */
typedef struct {
  uint32_t entry;
  double mean_degree;
  uint32_t max_degree;
  uint32_t n_pivots;   /* roar: distinct pivot keys (top-`pivots` of the build queries' lists) */
  uint32_t n_repaired; /* keys linked by the connectivity repair */
} ra_index_graph_stats;
void ra_index_get_graph_stats(const ra_index *ix, ra_index_graph_stats *st);

void ra_index_free(ra_index *ix);

#endif
