/* Private to ra_index: the index object and the per-kind entry points that index.c dispatches to. */
#ifndef RA_INDEX_INTERNAL_H
#define RA_INDEX_INTERNAL_H

#include "graph.h"
#include "index.h"

#include <stddef.h>
#include <stdint.h>

/* ivf: k-means centroids and one growable id list per cluster. */
typedef struct ra_ivf {
  uint32_t n_lists;
  float *centroids;  /* [n_lists, dim] fp32 */
  float *half_norm2; /* [n_lists] |c|^2 / 2, for nearest-centroid assignment as an inner product */
  uint32_t **list;   /* [n_lists] -> [list_cap[i]] key ids */
  uint32_t *list_len;
  uint32_t *list_cap;
  float *vec; /* [dim] insertion: the new key widened to fp32 */
} ra_ivf;

/* roar: a sample of the build queries kept for query-aware insertion (roar.c, ra_roar_insert).
 * Each kept query tracks its current top-T keys over the indexed keys, so that a new key can be
 * linked to and from the keys of the queries that would rank it among their best. Defaults
 * (ra_index_params_default) 1024 queries x T 32, head_dim 64: 128 KiB of queries + 128 KiB of
 * lists + 12 KiB of thresholds and scratch per graph. */
typedef struct ra_roar_keep {
  uint32_t n;        /* kept queries */
  uint32_t T;        /* list length */
  int dim;
  uint32_t n_built;  /* keys the graph was built on; ids from here on were inserted */
  ra_fp16 *q;        /* [n, dim] the queries, fp16 */
  uint32_t *top;     /* [n, T] their top keys' ids, by descending q·key */
  float *thr;        /* [n] the T-th score: the bar a new key must beat to enter */
  float *sc;         /* [n] insertion scratch: q·new key */
  uint32_t *order;   /* [n] insertion scratch: query indices by descending margin */
  uint32_t *out_ids; /* [ROAR_KEEP_SELECT * T] insertion scratch: the guide's out keys */
  uint32_t *in_ids;  /* [ROAR_KEEP_SELECT * ROAR_KEEP_IN] insertion scratch: its in keys */
  float *qf;         /* [dim] a kept query widened to fp32 */
} ra_roar_keep;

struct ra_index {
  ra_mode kind;
  ra_index_params params;
  int dim;
  ra_dtype dtype;
  uint32_t n; /* keys indexed: ids [0, n) */
  ra_ivf *ivf;
  ra_graph *graph;         /* kgraph, roar */
  ra_graph_work *ins_work; /* graphs: insertion's search/prune buffers (insert is exclusive) */
  uint32_t n_pivots;
  ra_roar_keep *keep;      /* roar: kept build queries, NULL when none */
};

/* SplitMix64: a tiny seeded generator; every random choice of a build goes through it so that a
 * fixed seed reproduces the index bit for bit. */
static inline uint64_t ra_index_rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [0, bound), bound > 0. */
static inline uint32_t ra_index_rng_below(uint64_t *state, uint32_t bound) {
  return (uint32_t)(((ra_index_rng_next(state) >> 32) * (uint64_t)bound) >> 32);
}

/* Per-kind builds: fill ix (kind, params, dim, dtype, n already set). On failure they free what
 * they allocated in ix and leave those fields NULL. */
int ra_ivf_build(ra_index *ix, const ra_keys *keys, ra_error *err);
int ra_ivf_insert(ra_index *ix, const ra_keys *keys, uint32_t id, ra_error *err);
int ra_ivf_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                  uint32_t nprobe, ra_index_scratch *s, uint32_t *ids, float *scores,
                  uint32_t *n_out, uint64_t *n_scanned);
void ra_ivf_free(ra_ivf *ivf);
size_t ra_ivf_bytes(const ra_ivf *ivf, int dim);
int ra_ivf_check(const ra_index *ix, ra_error *err);

int ra_flat_search(const ra_index *ix, const ra_keys *keys, const float *q, uint32_t k,
                   ra_index_scratch *s, uint32_t *ids, float *scores, uint32_t *n_out,
                   uint64_t *n_scanned);

int ra_kgraph_build(ra_index *ix, const ra_keys *keys, ra_error *err);
int ra_roar_build(ra_index *ix, const ra_keys *keys, const ra_queries *queries, ra_error *err);
/* Links key id (== ix->graph->n, graph room and ix->ins_work reserved by the caller) into a roar
 * graph: ra_graph_insert guided by the kept queries, then the kept lists updated. */
void ra_roar_insert(ra_index *ix, const ra_keys *keys, uint32_t id);
void ra_roar_keep_free(ra_roar_keep *k);
size_t ra_roar_keep_bytes(const ra_roar_keep *k);
/* The most keys an insertion's guide names (what ix->ins_work must hold as candidates). */
uint32_t ra_roar_keep_guide_max(const ra_roar_keep *k);
/* Bytes of the kept queries that ra_roar_build keeps for these parameters and m sampled queries. */
size_t ra_roar_keep_estimate(const ra_index_params *p, uint32_t m, int dim);

/* Grows s so that it serves an index of n keys with a beam of pool entries, neighbor/scan blocks
 * of buf entries and lists probe lists. 0 or RA_ENOMEM (s keeps its old buffers). */
int ra_index_scratch_reserve(ra_index_scratch *s, uint32_t n, uint32_t pool, uint32_t buf,
                             uint32_t lists);

/* Rows scanned per ra_vec_dot_rows call by flat and ivf. */
#define RA_INDEX_SCAN_BLOCK 512u

#endif
