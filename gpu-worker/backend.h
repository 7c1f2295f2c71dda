/* The backend ops table: everything the model runtime does to tensor memory goes through it.
 *
 * model.c, generate.c and dump_qk.c never dereference tensor data; they allocate tensors, move
 * data with upload/download, and call ops. A backend (CPU here; CUDA implements the same table)
 * owns the memory and decides how weights are stored (load_weight may keep quantized blocks).
 *
 * Conventions shared by every op:
 *   - Shapes are row-major: the LAST dimension is contiguous. Comments give them as
 *     [n_tokens, n_heads, head_dim]. matmul's x and y are [n, ...] with every dim after the
 *     first flattened (q [n, heads, hd] is [n, heads * hd]); other ops that take "rows" flatten
 *     all leading dims.
 *   - Activations, attention outputs and partials are F32 unless a comment says otherwise;
 *     KV caches may be F32, F16 or BF16 (attention ops convert on the fly).
 *   - Ops are issued in order on one stream; a backend may run them asynchronously, and
 *     download() and sync() are the points where the host sees finished results. Pointers to
 *     host memory passed to an op (token ids, ranges) only need to live for the call.
 *   - Every op returns RA_OK or an RA_E* code and fills err; shape/dtype mismatches are
 *     RA_EINVAL, so a wrong call fails loudly instead of reading out of bounds.
 *
 * Attention: q heads h use kv head h / (n_q_heads / n_kv_heads) (grouped-query attention).
 * scale is applied to q·k (normally 1/sqrt(head_dim)).
 *   attn_prefill: causal attention for a chunk of n queries at positions pos0..pos0+n-1 over the
 *     cache rows [0, pos0 + i] of query i. Implementations must tile (online softmax) and never
 *     hold an n x n score matrix: prefill must scale to 128K tokens.
 *   attn_decode: one query token over an arbitrary union of disjoint token ranges of the cache,
 *     returning the partial triple of common/merge.h per q head:
 *       m = max z,  l = sum exp(z - m),  o = sum exp(z - m) v / l     (z = scale q·k)
 *     so local results (e.g. sink [0,S) + window [n-W,n)) merge exactly with partials computed
 *     elsewhere (remote kv-stores) via attn_merge. An empty range set gives m=-inf, l=0, o=0. */
#ifndef RA_BACKEND_H
#define RA_BACKEND_H

#include "half.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_TENSOR_MAX_DIMS 4

typedef struct ra_backend ra_backend;

typedef struct ra_tensor {
  ra_backend *be;  /* the backend that owns data */
  ra_dtype dtype;  /* element type */
  int ndim;
  int64_t shape[RA_TENSOR_MAX_DIMS]; /* shape[ndim-1] is contiguous */
  size_t nbytes;
  void *data; /* backend memory: a host pointer on CPU, a device pointer on CUDA */
} ra_tensor;

/* RoPE pairing conventions. NORM rotates adjacent pairs (x[2i], x[2i+1]): GGUF llama files,
 * whose converter permuted the q/k rows into that order. NEOX rotates (x[i], x[i + n_rot/2]):
 * Hugging Face checkpoints ("rotate_half") and GGUF qwen2. */
typedef enum ra_rope_style { RA_ROPE_NORM = 0, RA_ROPE_NEOX = 1 } ra_rope_style;

/* A half-open range [begin, end) of token positions (cache rows). */
typedef struct ra_token_range {
  int64_t begin, end;
} ra_token_range;

/* One sequence of attn_decode_batch: q [1, n_q_heads, head_dim] or [n_q_heads, head_dim] over
 * cache rows [0, n) (n >= 1); o: [n_q_heads, head_dim], ml: [n_q_heads, 2]. */
typedef struct ra_attn_decode_item {
  const ra_tensor *q, *k_cache, *v_cache;
  int64_t n;
  ra_tensor *o, *ml;
} ra_attn_decode_item;

/* One sequence's rows of rope_store_batch: rows [r0, r0 + n) of the step's q, k, v (n >= 1), at
 * positions pos.., into rows [row, row + n) of its own caches. */
typedef struct ra_rope_store_item {
  int64_t r0, n, pos, row;
  ra_tensor *k_cache, *v_cache;
} ra_rope_store_item;

/* Wave index (RetroInfer): the offloaded keys of each (layer, kv head) are clustered, and a
 * decode step splits the clusters into a retrieval zone (exact attention over the clusters'
 * rows, at the kv-stores) and an estimation zone (approximated on the device, no KV read).
 *
 * Clustering (cluster_keys): rows [row0, row0 + n) of a layer's caches are cut, per kv head,
 * into segments of seg_len consecutive rows (the last one shorter); a segment of len rows gets
 * ceil(len / cluster_size) clusters, numbered after those of the earlier segments, and a
 * cluster never crosses a segment. Within a segment, spherical k-means on the mean-centred keys
 * x_t = (k_t - mean) / |k_t - mean| (x_t = 0 where the norm is 0):
 *   init:   unit centroid j = x at segment row floor(j * len / k), j < k;
 *   iters x: assign every row to argmax_j x_t . c_j (ties to the lower j), then c_j =
 *           normalise(sum of its rows' x) (an empty cluster, or a zero sum, keeps c_j);
 *   an iteration that changes no assignment ends the segment's loop (later ones would repeat it).
 * The result per cluster is the last assignment's: centroid = mean of the RAW keys (the key
 * representative for logits; 0 for an empty cluster), size = rows, vsum = sum of the values. */
typedef struct ra_wave_cluster_params {
  int64_t seg_len;      /* rows per segment (RetroInfer: ~8K) */
  int64_t cluster_size; /* rows per cluster on average (~16) */
  int iters;            /* Lloyd iterations, >= 1 */
} ra_wave_cluster_params;

/* Clusters that cluster_keys makes of n rows: sum over segments of ceil(len / cluster_size);
 * 0 for n <= 0, -1 when seg_len or cluster_size is not positive. */
int64_t ra_wave_n_clusters(int64_t n, int64_t seg_len, int64_t cluster_size);

/* One sequence of wave_select_batch: wave_select's arguments for that sequence (vsum, o and ml
 * all three or none). */
typedef struct ra_wave_select_item {
  const ra_tensor *q, *centroid, *size;
  int64_t n_clusters;
  int r, e;
  int32_t *idx;
  const ra_tensor *vsum;
  ra_tensor *o, *ml;
} ra_wave_select_item;

typedef struct ra_backend_ops {
  /* ---- memory ---- */
  /* Allocates t->data for t->dtype/ndim/shape (set by the caller) and zero-fills it. */
  int (*alloc)(ra_backend *be, ra_tensor *t, ra_error *err);
  void (*free)(ra_backend *be, ra_tensor *t);
  /* Host fp32 -> tensor elements [offset, offset + n), converting to t->dtype. */
  int (*upload)(ra_backend *be, ra_tensor *t, size_t offset, const float *src, size_t n, ra_error *err);
  /* Tensor elements [offset, offset + n) -> host fp32. Synchronizes. */
  int (*download)(ra_backend *be, const ra_tensor *t, size_t offset, float *dst, size_t n, ra_error *err);
  /* Tensor elements [offset, offset + n) -> host as stored: n * ra_dtype_size(t->dtype) bytes, no
   * conversion (an offloading prefill's rows already in the stores' dtype). Synchronizes. */
  int (*download_raw)(ra_backend *be, const ra_tensor *t, size_t offset, void *dst, size_t n, ra_error *err);
  /* Host memory of `bytes` that download fills fastest (CUDA: pinned, so that a 16-bit tensor
   * is widened on the device and copied by DMA, no host core involved; CPU: malloc), for the
   * large buffers an offloading prefill downloads every layer's K/V into. host_free(NULL) is a
   * no-op. */
  int (*host_alloc)(ra_backend *be, size_t bytes, void **out, ra_error *err);
  void (*host_free)(ra_backend *be, void *p);
  /* dst[dst_off + i] = src[src_off + i] for i < n, converting dtypes (KV-cache appends). */
  int (*copy)(ra_backend *be, ra_tensor *dst, size_t dst_off, const ra_tensor *src, size_t src_off,
              size_t n, ra_error *err);
  /* Creates a weight matrix [rows, cols] from raw GGUF/safetensors data of `ggml_type`
   * (ra_ggml_type: F32, F16, BF16, Q4_0, Q4_1, Q5_*, Q8_0, Q2_K..Q6_K) in host memory. The
   * backend picks the storage (CPU: dequantized fp32); the result is only for matmul/get_rows. */
  int (*load_weight)(ra_backend *be, const void *raw, uint32_t ggml_type, int64_t rows, int64_t cols,
                     ra_tensor *out, ra_error *err);
  /* t[i] = center + scale * u_i with u_i uniform in [-1, 1), a pure function of (seed, i):
   * identical on every backend and thread count (counter-based splitmix64). */
  int (*fill_random)(ra_backend *be, ra_tensor *t, uint64_t seed, float center, float scale, ra_error *err);

  /* ---- layer ops ---- */
  /* out[i, :] = table[ids[i], :].  table: [vocab, dim] (a weight, or a cache as a matrix) of any
   * dtype, ids: host [n], out: [n, dim] F32 */
  int (*get_rows)(ra_backend *be, const ra_tensor *table, const int32_t *ids, int64_t n, ra_tensor *out,
                  ra_error *err);
  /* table[ids[i], :] = src[i, :] for i < n, converting to table's dtype: rows scattered into a
   * device cache in one call (wave's buffer installs a step's fetched clusters).  table: [rows,
   * dim] (a cache as a matrix) of any dtype, src: [>= n, dim] F32, ids: host [n], distinct */
  int (*set_rows)(ra_backend *be, ra_tensor *table, const int32_t *ids, int64_t n, const ra_tensor *src,
                  ra_error *err);
  /* y = x w^T (+ bias) (+ y if accumulate).  x: [n, k] F32, w: [m, k] (a weight, or keys/queries
   * of a half-precision cache) and bias: [m] or NULL of any dtype, y: [n, m] F32; x and y may have
   * more dims, flattened after the first (q: [n, heads, hd]).
   * accumulate fuses the residual add (x_res += attn_out Wo^T). */
  int (*matmul)(ra_backend *be, const ra_tensor *x, const ra_tensor *w, const ra_tensor *bias, ra_tensor *y,
                int accumulate, ra_error *err);
  /* y = x / sqrt(mean(x^2) + eps) * w.  x, y: [n, dim] (may alias), w: [dim] */
  int (*rmsnorm)(ra_backend *be, const ra_tensor *x, const ra_tensor *w, float eps, ra_tensor *y, ra_error *err);
  /* In-place rotary embedding of the first n_rot dims of every head of token i at position
   * pos0 + i, frequency theta_base^(-2j/n_rot) for pair j.  x: [n, n_heads, head_dim] */
  int (*rope)(ra_backend *be, ra_tensor *x, int64_t pos0, int n_rot, float theta_base, ra_rope_style style,
              ra_error *err);
  /* out = silu(gate) * up.  gate, up, out: [n, ffn] (out may alias gate) */
  int (*swiglu)(ra_backend *be, const ra_tensor *gate, const ra_tensor *up, ra_tensor *out, ra_error *err);
  /* Causal attention of a chunk (see the top).  q: [n, n_q_heads, head_dim],
   * k_cache, v_cache: [n_ctx, n_kv_heads, head_dim] holding rows [0, pos0 + n),
   * out: [n, n_q_heads, head_dim] */
  int (*attn_prefill)(ra_backend *be, const ra_tensor *q, const ra_tensor *k_cache, const ra_tensor *v_cache,
                      int64_t pos0, float scale, ra_tensor *out, ra_error *err);
  /* Partial attention of one token (see the top).  q: [1, n_q_heads, head_dim] or
   * [n_q_heads, head_dim], ranges: host [n_ranges], disjoint, inside [0, n_ctx);
   * o: [n_q_heads, head_dim], ml: [n_q_heads, 2] holding (m, l) per head */
  int (*attn_decode)(ra_backend *be, const ra_tensor *q, const ra_tensor *k_cache, const ra_tensor *v_cache,
                     const ra_token_range *ranges, int n_ranges, float scale, ra_tensor *o, ra_tensor *ml,
                     ra_error *err);
  /* attn_decode of several sequences at once, item i one query over its cache rows [0, n_i),
   * all of one geometry and dtype (a batched decode step: one launch on a GPU, not one per
   * sequence). items: host [n_items] */
  int (*attn_decode_batch)(ra_backend *be, const ra_attn_decode_item *items, int n_items, float scale,
                           ra_error *err);
  /* Exact merge of partials, per head: (o_acc, ml_acc) <- merge((o_acc, ml_acc), (o, ml)).
   * o_acc, o: [n_heads, head_dim], ml_acc, ml: [n_heads, 2] */
  int (*attn_merge)(ra_backend *be, ra_tensor *o_acc, ra_tensor *ml_acc, const ra_tensor *o, const ra_tensor *ml,
                    ra_error *err);
  /* The k largest values of every row, descending, with their column indices, to host memory.
   * x: [n, m], idx, val: host [n, k]; k <= m. Ties go to the lower index. */
  int (*topk_rows)(ra_backend *be, const ra_tensor *x, int k, int32_t *idx, float *val, ra_error *err);

  /* ---- wave index (see ra_wave_cluster_params) ----
   * Cluster tensors of a layer: centroid, vsum [n_kv_heads, cap, head_dim] F32, size
   * [n_kv_heads, cap] F32; clusters [0, n_clusters) of each kv head are valid. */
  /* Clusters rows [row0, row0 + n) of k_cache, v_cache ([n_ctx, n_kv_heads, head_dim], any KV
   * dtype, both the same shape) into K = ra_wave_n_clusters(n, ...) clusters per kv head, written
   * at cluster offset c0 (c0 + K <= cap) of centroid, size, vsum. To host memory:
   *   perm [n_kv_heads, n]: perm[h * n + i] = r - row0 for the i-th row r of kv head h in cluster
   *     order (segments in order, their clusters in order, a cluster's rows ascending);
   *   counts [n_kv_heads, K]: rows per cluster (so cluster j of head h is perm[h * n + ..]
   *     from the sum of the counts before it).
   * out_k, out_v ([n_kv_heads, n, head_dim], any dtype; either may be NULL): the rows in that
   * order, out_k[h, i] = k_cache[row0 + perm[h * n + i], h], ready to ship to the stores.
   * Synchronizes (the host outputs). CUDA scores keys against centroids in TF32, so rows at a
   * near tie (|score difference| ~1e-3) may be assigned differently than on the CPU. */
  int (*cluster_keys)(ra_backend *be, const ra_tensor *k_cache, const ra_tensor *v_cache, int64_t row0, int64_t n,
                      const ra_wave_cluster_params *p, ra_tensor *centroid, ra_tensor *size, ra_tensor *vsum,
                      int64_t c0, ra_tensor *out_k, ra_tensor *out_v, int32_t *perm, int32_t *counts,
                      ra_error *err);
  /* Zones of one decode step.  q: [1, n_q_heads, head_dim] or [n_q_heads, head_dim] F32 (RoPE
   * applied); centroid, size as above with n_clusters (>= 0) valid. Per q head and cluster
   * z = scale q.c + log(size) (-inf for size 0), p = softmax over the clusters of the head;
   * per kv head the clusters are ranked by the sum of p over its group (size-0 clusters last),
   * best first, ties to the lower index, to host idx [n_kv_heads, r + e]: entries [0, r) are the
   * retrieval zone, [r, r + e) the estimation zone; entries from n_clusters on are -1.
   * With o and ml (both or neither; vsum then required) the estimation zone's partial is
   * computed in the same call, as wave_estimate(idx + r, e, ld r + e) would: one pass over the
   * scores, no second launch. r, e >= 0, r + e >= 1. Synchronizes for idx only: o and ml
   * may still be computing on the backend's queue when it returns (ready for its next ops). */
  int (*wave_select)(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                     int64_t n_clusters, float scale, int r, int e, int32_t *idx, const ra_tensor *vsum,
                     ra_tensor *o, ra_tensor *ml, ra_error *err);
  /* wave_select of several sequences (a batched decode step's offloaded ones, one scale): each
   * item as wave_select, with one synchronization for all their idx instead of one per item.
   * Every item is checked before any runs. items: host [n_items] */
  int (*wave_select_batch)(ra_backend *be, const ra_wave_select_item *items, int n_items, float scale,
                           ra_error *err);
  /* The estimation zone's partial per q head, in attn_decode's (o, ml) convention: each key of
   * a cluster is approximated by its centroid. For the clusters c of the head's kv head kvh,
   * ids[kvh * ld + j], j < n_ids (-1 entries and size-0 clusters are skipped; others must be
   * < n_clusters): z_c = scale q.centroid_c, m = max z_c, l = sum size_c exp(z_c - m),
   * o = sum exp(z_c - m) vsum_c / l; m = -inf, l = 0, o = 0 for an empty set.
   * q as for wave_select; ids: host; o: [n_q_heads, head_dim], ml: [n_q_heads, 2] F32. */
  int (*wave_estimate)(ra_backend *be, const ra_tensor *q, const ra_tensor *centroid, const ra_tensor *size,
                       const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids, int n_ids, int64_t ld,
                       float scale, ra_tensor *o, ra_tensor *ml, ra_error *err);

  /* ---- fused ops ----
   * A decode step is ~15 tiny launches per layer when run op by op; these do in one call what
   * the model would otherwise issue as a sequence, and must equal that sequence (to rounding).
   * backend_fused.h has the sequences themselves: a backend points an entry at them, or falls
   * back to them for shapes its fusion does not cover. xn and up are scratch the sequence
   * writes; a fused implementation may leave them untouched. */
  /* y_i = rmsnorm(x, norm_w, eps) w_i^T (+ bias_i), i < n_out (1..3): the q/k/v projections.
   * x, xn: [n, k], w_i: [m_i, k] (weights), bias_i: [m_i] or NULL, y_i: [n, m_i] */
  int (*norm_matmul)(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn, int n_out,
                     const ra_tensor *const *w, const ra_tensor *const *bias, ra_tensor *const *y, ra_error *err);
  /* out = silu(xn w_gate^T) * (xn w_up^T), xn = rmsnorm(x, norm_w, eps): the FFN's first half.
   * x, xn: [n, dim], w_gate, w_up: [ffn, dim], up, out: [n, ffn] */
  int (*norm_swiglu)(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                     const ra_tensor *w_gate, const ra_tensor *w_up, ra_tensor *up, ra_tensor *out, ra_error *err);
  /* rope(q), rope(k) in place as `rope` does, then k, v -> cache rows [row, row + n) as `copy`
   * does.  q: [n, hq, hd], k, v: [n, hkv, hd], caches: [n_ctx, hkv, hd] */
  int (*rope_store)(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v, int64_t pos0, int n_rot,
                    float theta, ra_rope_style style, ra_tensor *k_cache, ra_tensor *v_cache, int64_t row,
                    ra_error *err);
  /* rope_store of several sequences' rows of one step (a batch's decoders: one launch, not one
   * per sequence): each item as rope_store on its rows. q: [T, hq, hd], k, v: [T, hkv, hd] */
  int (*rope_store_batch)(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v,
                          const ra_rope_store_item *items, int n_items, int n_rot, float theta, ra_rope_style style,
                          ra_error *err);

  /* Waits for queued work (timing). */
  int (*sync)(ra_backend *be, ra_error *err);
  void (*destroy)(ra_backend *be);
} ra_backend_ops;

struct ra_backend {
  const ra_backend_ops *ops;
  const char *name; /* "cpu", "cuda" */
  void *impl;
};

typedef struct ra_backend_config {
  int n_threads; /* CPU: OpenMP/BLAS threads; 0 = all cores */
  int device;    /* CUDA: device ordinal */
} ra_backend_config;

/* Creates the backend called `name` ("cpu" or "cuda"). RA_EUNSUPPORTED when it was not built. */
int ra_backend_create(const char *name, const ra_backend_config *cfg, ra_backend **out, ra_error *err);
int ra_backend_cpu_create(const ra_backend_config *cfg, ra_backend **out, ra_error *err);
void ra_backend_destroy(ra_backend *be);

/* Tensor helpers (backend-independent). */
size_t ra_tensor_nelem(const ra_tensor *t);
/* Fills t's shape fields and allocates it on be. */
int ra_tensor_new(ra_backend *be, ra_tensor *t, ra_dtype dtype, int ndim, const int64_t *shape, ra_error *err);
void ra_tensor_free(ra_tensor *t); /* no-op on a zeroed tensor */
/* A view of rows [row0, row0 + n_rows) of t along its first dimension (no copy, not to be freed). */
ra_tensor ra_tensor_rows(const ra_tensor *t, int64_t row0, int64_t n_rows);
/* t as a matrix [nelem / row_len, row_len] (no copy, not to be freed): e.g. a cache
 * [n, n_kv_heads, head_dim] as a table of n * n_kv_heads rows for get_rows. row_len divides the
 * element count. */
ra_tensor ra_tensor_matrix(const ra_tensor *t, int64_t row_len);

#endif
