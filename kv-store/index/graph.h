/* Bounded-degree directed graph over key ids, shared by kgraph and roar: flat adjacency storage,
 * best-first beam search by inner product, occlusion pruning, reverse edges, connectivity repair
 * and online insertion.
 *
 * Reachability is an invariant, not a hope: every node but the entry has exactly one *pinned*
 * in-edge from a parent that was reachable when it was attached, and pruning never removes a
 * pinned edge, so the pinned edges form a spanning tree rooted at the entry whatever later
 * re-pruning does. A node holds at most pin_cap = M/2 pinned edges (its first npin slots), which
 * leaves at least half of every row to the pruned, quality-driven edges. */
#ifndef RA_GRAPH_H
#define RA_GRAPH_H

#include "index.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_graph {
  uint32_t n;     /* nodes: key ids [0, n) */
  uint32_t cap;   /* rows allocated */
  uint32_t M;     /* max out-degree */
  uint32_t entry; /* every beam search starts here */
  uint32_t *adj;  /* [cap, M]: row u = out-neighbors of u, pinned ones first */
  uint16_t *deg;  /* [cap] */
  uint16_t *npin; /* [cap] pinned (spanning-tree) edges at the front of the row */
  float *hn;      /* [cap] |key|_C^2 / 2: pruning's key-key similarity is -|a - b|_C^2 / 2 */
  float *qm;      /* [dim, dim] C, the metric of key-key closeness; NULL = identity (plain L2) */
  float *mk;      /* [n, dim] C·key of every node while a build runs (ra_graph_cache_metric), else
                   * NULL: pruning maps each key many times, insertion once */
  uint64_t metric_id; /* unique per ra_graph_set_metric call with a metric (0: none): what a
                       * work's map cache (ra_graph_work_cache) was filled under */
  int dim;
  uint32_t n_repaired;
} ra_graph;

/* One thread's buffers for building/inserting: a beam-search scratch and pruning space. */
typedef struct ra_cand {
  float sim;
  uint32_t id;
} ra_cand;

typedef struct ra_graph_work {
  ra_index_scratch sc; /* beam search state */
  int dim;
  uint32_t M;
  const float *hn; /* the graph's half squared norms and metric (ra_graph_work_bind) */
  const float *qm;
  const float *mk;
  float *tmp;      /* [dim] */
  float *vec;      /* [dim] a key widened to fp32, used as a query */
  float *qvec;     /* [dim] the key being linked, kept while vec is reused by pruning */
  uint32_t *sel;   /* [M] the pruned selection */
  float *selm;     /* [M, dim] C·key of each selected key */
  float *selh;     /* [M] hn of each selected key */
  uint32_t *selpos; /* [M] each selected key's place in the candidates (ascending) */
  ra_cand *cand;   /* [cand_cap] (id, similarity to the pivot) */
  uint32_t n_sorted; /* cand[0..n_sorted) is in order; prune sorts the rest when it gets there */
  uint32_t *ids;   /* [cand_cap] candidate ids, contiguous for the gather */
  float *dots;     /* [cand_cap] */
  uint32_t cand_cap;
  uint32_t *res_id; /* [res_cap] a beam search's results */
  uint32_t *co_id; /* [res_cap] the second search of a key's neighbors (search_near_key) */
  uint32_t res_cap;
  uint32_t *mark; /* [mark_cap] epoch marks for de-duplicating candidates */
  uint32_t mark_cap, mark_epoch;
  /* C·key of recently mapped keys (ra_graph_work_cache; mc_n 0 = none): 4-way sets, least
   * recently used out. Valid while the graph's metric is the one they were mapped under
   * (mc_metric, checked by ra_graph_work_bind) and a key id's row never changes, which an index
   * guarantees: its keys only grow. */
  float *mc;          /* [mc_n, dim] */
  uint32_t *mc_id;    /* [mc_n] the key held, UINT32_MAX = empty */
  uint32_t *mc_used;  /* [mc_n] mc_clock at its last use */
  uint32_t mc_n, mc_clock;
  uint64_t mc_metric;
  uint64_t mc_hits, mc_misses; /* counters, for tests and benchmarks */
} ra_graph_work;

/* Largest degree a graph accepts (the row counters are 16-bit). */
#define RA_GRAPH_MAX_DEGREE 1024u

int ra_graph_init(ra_graph *g, uint32_t M, uint32_t n, uint32_t cap);
void ra_graph_free(ra_graph *g);
/* Sets the metric C [dim, dim] (copied; NULL = identity). Key-key closeness for pruning is
 * |a - b|_C^2 = (a - b)^T C (a - b); roar passes the prefill queries' second moment E[q q^T], so
 * that |a - b|_C^2 = E_q[(q·a - q·b)^2]: two keys are close when queries score them alike. */
int ra_graph_set_metric(ra_graph *g, const float *C, int dim);
/* Fills g->mk for nodes [0, g->n) (one sgemm per block instead of a dim x dim product each time a
 * key is pruned or linked); ra_graph_uncache_metric frees it when the build is done. Call it
 * after ra_graph_set_metric and before binding works. 0 or RA_ENOMEM. */
int ra_graph_cache_metric(ra_graph *g, const ra_keys *keys);
void ra_graph_uncache_metric(ra_graph *g);
/* hn[u] for nodes [from, to) from their keys. */
void ra_graph_set_norms(ra_graph *g, const ra_keys *keys, uint32_t from, uint32_t to);
/* Points w at g's norms and metric (again after g grows); empties w's map cache if g's metric is
 * not the one it was filled under. */
void ra_graph_work_bind(ra_graph_work *w, const ra_graph *g);
/* Gives w a cache of `entries` (rounded up to a power of two >= 4) mapped keys C·key, for
 * insertion, which has no metric cache (g->mk) and maps ~100 keys per key it links, most of them
 * again soon (the rows it re-prunes are its neighbors' and those of the keys before it). Without
 * a metric nothing is cached. 0 or RA_ENOMEM (w keeps no cache then). */
int ra_graph_work_cache(ra_graph_work *w, uint32_t entries);
/* Bytes of w's map cache. */
size_t ra_graph_work_cache_bytes(const ra_graph_work *w);
/* Key row id mapped to C·key (fp32) into out[dim]: its similarity-side form (from g->mk during
 * a build, else from w's map cache or computed and cached there). */
void ra_graph_key_to_metric(const ra_keys *keys, uint32_t id, ra_graph_work *w, float *out);
int ra_graph_reserve(ra_graph *g, uint32_t cap); /* 0 or RA_ENOMEM, g unchanged on failure */
size_t ra_graph_bytes(const ra_graph *g);

int ra_graph_work_init(ra_graph_work *w, int dim, uint32_t M);
void ra_graph_work_free(ra_graph_work *w);
/* Grows w for cand_cap candidates, graphs of n nodes and beams of width L. 0 or RA_ENOMEM. */
int ra_graph_work_reserve(ra_graph_work *w, uint32_t cand_cap, uint32_t n, uint32_t L);

/* Best-first beam search from the entry with a beam of L >= 1 (the k best found are returned, k
 * <= L). Thread-safe against other searches; s must be sized (ra_index_scratch_reserve) for g->n
 * nodes and L + 1 beam entries and M neighbors. */
void ra_graph_search(const ra_graph *g, const ra_keys *keys, const float *q, uint32_t L, uint32_t k,
                     ra_index_scratch *s, uint32_t *ids, float *scores, uint32_t *n_out,
                     uint64_t *n_scanned);

/* Sorts cand[0..n) by descending similarity, ties by ascending id. */
void ra_graph_sort_cands(ra_cand *cand, uint32_t n);

/* w->cand[0..n) = (id, s(pivot, id)) for the ids w->ids[0..n), best first (uses w->qvec): the
 * first w->n_sorted in order, the rest after them, sorted by ra_graph_prune if it reads them. */
void ra_graph_rank_cands(const ra_keys *keys, uint32_t pivot, uint32_t n, ra_graph_work *w);

/* Occlusion pruning (HNSW heuristic / NSG's MRNG rule) with the similarity s(a, b) =
 * -|a - b|_C^2 / 2 = a^T C b - hn[a] - hn[b]: walking cand (sorted by similarity to the pivot,
 * pivot itself and duplicates absent), accept p unless an already accepted r has s(r, p) >
 * s(pivot, p), i.e. r is closer to p than the pivot is, so a walk reaches p through r anyway.
 * (Inner product as the similarity measured far worse: high-norm keys occlude everything.) Stops at `budget`; with fill, the most similar rejected candidates
 * top the selection up to budget (RoarGraph keeps rows full). Writes w->sel, returns the count. */
uint32_t ra_graph_prune(const ra_keys *keys, const ra_cand *cand, uint32_t n_cand, uint32_t budget,
                        int fill, ra_graph_work *w);

/* Replaces u's unpinned edges by the pruned selection of cand. */
void ra_graph_set_row(ra_graph *g, uint32_t u, const uint32_t *sel, uint32_t n_sel);

/* Adds the edge u -> v (no-op if present or u == v). A full row is re-pruned: u's unpinned
 * neighbors plus v, by similarity to u, back to the row's free budget, pinned edges kept. */
void ra_graph_add_edge(ra_graph *g, const ra_keys *keys, uint32_t u, uint32_t v, ra_graph_work *w);

/* Every u: its edges plus its in-edges as candidates, re-pruned when more than M. Parallel over
 * nodes (n_threads), deterministic. 0 or RA_ENOMEM. */
int ra_graph_add_reverse_edges(ra_graph *g, const ra_keys *keys, int n_threads, ra_error *err);

/* Pins a spanning tree from the entry (BFS over existing edges) and links every node it cannot
 * reach by a beam search of width L for the nodes nearest it in the graph's metric (batches
 * searched in parallel, then linked in phases): a parent with pin room gets a pinned edge to it, it gets pruned
 * out-edges to what it found, and those get reverse edges. Afterwards all nodes are reachable. */
int ra_graph_connect(ra_graph *g, const ra_keys *keys, uint32_t L, int n_threads, ra_error *err);

/* Query-aware links for a node being inserted (roar's kept queries, roar.c). Ids may repeat. */
typedef struct ra_graph_guide {
  const uint32_t *out; /* keys the node should link to, most wanted first */
  uint32_t n_out;
  uint32_t out_slots;  /* row slots held for them; the metric neighbors get the rest */
  const uint32_t *in;  /* keys that should link to the node (re-pruned where full) */
  uint32_t n_in;
  uint32_t n_built;    /* nodes [0, n_built) came from the build, the rest were inserted */
} ra_graph_guide;

/* Links node id == g->n (its key is keys row id) into the graph: beam search with width L,
 * pinned parent, pruned out-edges, reverse edges; g->n becomes id + 1. With a guide, up to
 * out_slots of the row go to guide->out (pruned among themselves), guide->in get edges to it,
 * and the search's neighbors whose rows are full get none (see link_guided). g must have room
 * (ra_graph_reserve) and w must be reserved for M + L + guide->n_out candidates, id + 1 nodes,
 * width L. */
void ra_graph_insert(ra_graph *g, const ra_keys *keys, uint32_t id, uint32_t L,
                     const ra_graph_guide *guide, ra_graph_work *w);

/* Structural invariants: degree <= M, no self loops or duplicates, ids < n, pinned edges form a
 * tree from the entry, every node reachable. RA_EINTERNAL + message, RA_ENOMEM. */
int ra_graph_check(const ra_graph *g, ra_error *err);

/* Key row `id` widened to fp32 into out[dim]. */
void ra_graph_key_to_f32(const ra_keys *keys, uint32_t id, float *out);

#endif
