/* Wave mode on the worker (RetroInfer's wave index over the store tier): the worker keeps, per
 * layer and kv head, a meta-index of the offloaded keys' clusters on the device (centroid, size,
 * value sum); the stores hold the rows in cluster order (PutClusters). A decode step ranks the
 * clusters on the device (wave_select) and splits them into
 *   - the retrieval zone: attended exactly by the stores owning them (one attend per store and
 *     layer naming, per kv head, the cluster ids it holds), together with every row the stores
 *     hold that no cluster covers yet (the lag: tokens evicted since the last growth block);
 *   - the estimation zone: approximated on the device from centroids and value sums, no KV read;
 *   - the rest, dropped.
 *
 * Clusters never cross a shard boundary: the offloaded positions are cut at every shard
 * boundary of the plan (any layer, any kv head) into pieces, and each piece is clustered on its
 * own (backend cluster_keys, segments within a piece). Cluster ids at the stores are dense per
 * (layer, kv head): the backend's empty clusters get none and are never selected.
 *
 * Growth: every token that leaves the window is appended to its store (a lag row, attended every
 * step) and copied into a device block [block, n_kv_heads, head_dim] per layer; when the block
 * is full (or the next position starts another shard) it is clustered as one segment, its
 * clusters join the meta-index and the stores reorder those rows into cluster order
 * (PutClusters with perm). A token is a lag row until then and a cluster row after: never
 * invisible, never counted twice. */
#ifndef RA_WAVE_H
#define RA_WAVE_H

#include "backend.h"
#include "offload_plan.h"
#include "remote.h"

#include <stdint.h>

/* Budgets per kv head and step: a value <= 1 is a fraction of the kv head's clusters (1: all of
 * them, 0: none), a value > 1 an integer count of tokens, taken as that many tokens' worth of
 * clusters (ceil(tokens / cluster)). */
typedef struct ra_wave_config {
  double retrieve;  /* retrieval zone (default 0.018, RetroInfer's 1.8 %) */
  int64_t retrieve_min; /* the retrieval zone's floor, tokens' worth of clusters (default 1024: at a
                           few thousand tokens 1.8 % is a handful of clusters and misses needles,
                           bench/results/wave-smollm2/README.md; 0: none) */
  double estimate;  /* estimation zone (default 0.232) */
  int64_t segment;  /* prefill rows per k-means segment (default 8192) */
  int64_t cluster;  /* rows per cluster on average (default 16) */
  int iters;        /* Lloyd iterations (default 10) */
  int64_t block;    /* decode-time growth block, rows (default 1024) */
  int64_t buffer;   /* device buffer per (layer, kv head), in clusters of `cluster` rows (0: off,
                       the default; wave_buffer.h) */
} ra_wave_config;

void ra_wave_config_default(ra_wave_config *c);
/* RA_OK, or RA_EINVAL naming the bad field. */
int ra_wave_config_check(const ra_wave_config *c, ra_error *err);
/* A budget from its text form ("0.018", "2400"): RA_OK, or RA_EINVAL with the reason. */
int ra_wave_budget_parse(const char *s, double *out, ra_error *err);
/* Clusters a budget takes of n_clusters (clamped to [0, n_clusters]). */
int64_t ra_wave_budget_clusters(double budget, int64_t n_clusters, int64_t cluster);
/* Clusters of the retrieval zone: the retrieve budget's, at least retrieve_min tokens' worth. */
int64_t ra_wave_retrieve_clusters(const ra_wave_config *c, int64_t n_clusters);

typedef struct ra_wave ra_wave;

/* Geometry of the model; the plan and the remote must outlive the state. kv_dtype: the device
 * caches' dtype (the growth blocks are kept in it). retro_window: retrospective correction of
 * that many past steps (0: off; wave_retro.h), which takes no device buffer (cfg->buffer 0). */
int ra_wave_new(ra_backend *be, const ra_offload_plan *plan, ra_remote *remote, int n_layers, int n_heads,
                int n_kv_heads, int head_dim, ra_dtype kv_dtype, const ra_wave_config *cfg, uint32_t retro_window,
                ra_wave **out, ra_error *err);
void ra_wave_free(ra_wave *w);

/* Before the prefill (or seed): the prefill offloads positions [b, e) and the decode evicts
 * positions up to max_end (exclusive); sizes the meta-index for them. Once per runtime. */
int ra_wave_begin(ra_wave *w, int64_t b, int64_t e, int64_t max_end, ra_error *err);

/* PutClusters requests of one layer (what a prefill's layer job sends after its PutKv). */
typedef struct ra_wave_puts {
  ra_kvclient_clusters *c;
  size_t n;
  uint32_t *counts; /* the requests' counts, one array */
} ra_wave_puts;
void ra_wave_puts_free(ra_wave_puts *p);

/* The dtype of the rows ra_wave_prefill_layer writes: the stores' own when it is f16 or bf16
 * (no host core converts them, and the download is half of fp32's), else fp32. */
ra_dtype ra_wave_rows_dtype(const ra_wave *w);

/* Prefill of layer l: clusters rows [b, e) of kc, vc ([.., n_kv_heads, head_dim], row = position)
 * on the backend into the meta-index, and writes them in cluster order to k, v: host
 * [n_kv_heads, e - b, head_dim] in ra_wave_rows_dtype, kv head g's i-th row at [g, i] being the
 * row the store holds at position b + i (ra_remote_put_heads). puts: the layer's PutClusters, no
 * perm. *download_us += the time of the rows' downloads (the rest of the call is the clustering). */
int ra_wave_prefill_layer(ra_wave *w, int l, const ra_tensor *kc, const ra_tensor *vc, int64_t b, int64_t e, void *k,
                          void *v, ra_wave_puts *puts, double *download_us, ra_error *err);

/* Decode, layer l, after q: ranks the clusters (q: [n_heads, head_dim] on the backend, RoPE
 * applied). *sel: per store of the plan, the retrieval zone's cluster ids it holds, for
 * ra_remote_attend_begin_wave. *est_o / *est_ml: the estimation zone's partial on the backend
 * ([n_heads, head_dim] / [n_heads, 2], attn_merge's layout), NULL when the zone is empty.
 * With retro, step is the decode step (>= 1, one more each step, every layer selected) and
 * n_past (< step, <= the window) the past steps corrected: each store's selection also names,
 * per past step and kv head, the clusters retrieved now that the step has not seen
 * (ra_remote_wave_sel.retro_*; then they count as seen), and the step's zones are recorded.
 * Without retro both are ignored. */
int ra_wave_select(ra_wave *w, int l, const ra_tensor *q, float scale, uint64_t step, uint32_t n_past,
                   const ra_remote_wave_sel **sel, const ra_tensor **est_o, const ra_tensor **est_ml, ra_error *err);

/* One sequence's selection of a step's layer: ra_wave_select's outputs. */
typedef struct ra_wave_selection {
  const ra_remote_wave_sel *sel;
  const ra_tensor *est_o, *est_ml;
} ra_wave_selection;

/* ra_wave_select of layer l for n sequences of one batched step (1 <= n <= 256, one backend,
 * none with retro): ws[i] with q qs[i] to out[i], the rankings in one backend call
 * (wave_select_batch: one synchronization for them all, not one per sequence). Each out[i]
 * stays valid until ws[i]'s next selection. On failure no selection is usable. */
int ra_wave_select_batch(ra_wave *const *ws, const ra_tensor *const *qs, int n, int l, float scale,
                         ra_wave_selection *out, ra_error *err);

/* Decode, layer l, after ra_wave_select (with the stores' requests in flight): the partial of
 * the retrieval zone's clusters the buffer holds, over their rows on the device (*o, *ml as
 * est_o / est_ml; NULL when none hit or the buffer is off). */
int ra_wave_attend_buffer(ra_wave *w, int l, const ra_tensor *q, float scale, const ra_tensor **o,
                          const ra_tensor **ml, ra_error *err);
/* Decode, layer l, after its attend: starts fetching the rows of the step's admitted misses
 * (no-op when the buffer is off or nothing missed). */
int ra_wave_admit(ra_wave *w, int l, ra_error *err);

/* The buffer's counts since ra_wave_begin (all zero when it is off). */
typedef struct ra_wave_buffer_stats {
  uint64_t hits, misses;   /* retrieved clusters attended on the device / at the stores */
  uint64_t rows;           /* rows the device attended from the buffer */
  uint64_t fetched;        /* clusters whose rows were fetched for admission */
  uint64_t fetched_rows;
  double fetch_us;         /* waiting for the fetches and installing their rows */
} ra_wave_buffer_stats;
void ra_wave_buffer_totals(const ra_wave *w, ra_wave_buffer_stats *out);

/* Decode: position pos left the window; its K/V of every layer are at row `row` of k_caches[l],
 * v_caches[l] and were appended to the stores already. Adds it to the growth block; when the
 * block is due, clusters it and installs the clusters (meta-index, then PutClusters with perm). */
int ra_wave_evict(ra_wave *w, int64_t pos, const ra_tensor *k_caches, const ra_tensor *v_caches, int64_t row,
                  ra_error *err);

/* Clusters of layer l (every kv head has the same number, empty ones included). */
int64_t ra_wave_n_clusters_of(const ra_wave *w, int l);
/* Rows waiting in the growth block. */
int64_t ra_wave_block_rows(const ra_wave *w);

#endif
