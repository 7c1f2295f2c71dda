/* Distributed RetrievalAttention decode: the model runs on the worker's backend, but its device
 * KV cache holds only the sink (first S tokens) and the recent window (last W); every other
 * token's K/V lives in kv-stores (gpu-worker/remote.h), which answer each decode query with a
 * partial attention that is merged with the device's own by log-sum-exp.
 *
 * Device memory per layer: a ring of S + W cache rows (row of position p: p for p < S, else
 * S + (p - S) mod W), plus ONE full-length scratch cache shared by all layers during prefill.
 *
 * Prefill of n tokens runs layer by layer over all of them (one step): layer l's K/V go to the
 * scratch, attention runs over it, then positions [S, n - W) go to their stores, the sink and
 * window are copied into layer l's ring, and — in an index mode — the exact top-Nq keys of a
 * sample of layer l's prefill queries are computed on the backend (q K^T, top-k rows) and sent
 * to the stores with the queries, which build the index (RoarGraph projection). Only one
 * layer's full KV is ever on the device.
 *
 * A decode step at context n (new token at position n): position n - W leaves the window — its
 * K/V of every layer are appended to the stores first — and the new token's K/V take its ring
 * row. Per layer: q goes to the stores (all of them at once), the backend attends over the ring
 * meanwhile, and the stores' merged partial is merged into the ring's. Sink, window and
 * offloaded sets never overlap and always cover [0, n].
 *
 * Modes: streaming (sink + window only; evicted tokens are dropped — StreamingLLM), flat, ivf,
 * kgraph, roar (stores attend over the top-k keys their index finds; flat = exact top-k), wave
 * (clusters ranked on the device: the best exact at the stores, the next estimated on the
 * device; gpu-worker/wave.h). Full
 * attention is not an offload mode: it is ra_model_forward on an ordinary state. */
#ifndef RA_OFFLOAD_H
#define RA_OFFLOAD_H

#include "batch.h"
#include "remote_batch.h"
#include "model.h"
#include "modes.h"
#include "offload_plan.h"
#include "prefill_capture.h"
#include "remote.h"
#include "wave.h"

#include <stdint.h>

/* Where a prefill stands, after each layer. */
typedef struct ra_offload_progress {
  int layer, n_layers;     /* layers done, of */
  int64_t n_tokens;        /* prompt tokens */
  uint64_t bytes_offloaded;/* K + V bytes sent to the stores so far (session dtype) */
  double index_s;          /* time in kNN + index builds so far */
} ra_offload_progress;

#define RA_OFFLOAD_MAX_BUILD_LAYERS 8
/* Sequences in one batched decode step at most (ra_offload_decode_batch). */
#define RA_OFFLOAD_MAX_BATCH 256
/* Past steps retrospective correction may look back (the stores keep that many sets). */
#define RA_OFFLOAD_MAX_RETRO 16

typedef struct ra_offload_config {
  ra_mode mode;           /* anything but full (common/modes.h) */
  uint32_t n_sink;        /* S, default 128 */
  uint32_t n_window;      /* W, default 512 */
  uint32_t top_k;         /* keys per q head at the stores (default 100) */
  uint32_t ef, nprobe;    /* index search parameters; 0: store defaults */
  uint32_t knn_nq;        /* index build: top keys per sampled prefill query (default 100) */
  uint32_t build_queries; /* index build: prefill queries sampled per q head (default 4096) */
  ra_dtype kv_dtype;      /* device ring and scratch */
  ra_dtype store_dtype;   /* KV at the stores */
  int64_t max_ctx;        /* prompt + generated tokens */
  int64_t max_prompt;     /* tokens of the prefill (one step); scratch rows */
  int timeout_ms;         /* deadline of every store reply; 0: 10 s */
  int reconnect_ms;       /* > 0: a failed store with no other owner is reattached within this
                             long (remote.h) */
  const ra_remote_session *resume; /* a saved context's sessions (context.h), plan order; NULL:
                             open new ones */
  const char *const *spares; /* spare stores restoring the replicas of a down one (remote.h) */
  size_t n_spares;
  ra_kvclient_options store_client; /* TLS and token of the store connections (client.h) */
  int roar_per_kv_head;   /* roar: one graph per kv head from its group's queries (the build and
                             every decode step's insertion cost 1 / group of per-q-head graphs) */
  uint32_t key_top_queries; /* roar: send every offloaded key's best t queries of its build
                             (computed on the backend), so that the stores link the keys no
                             query list covers without beam searches (default 4; 0: off) */
  uint32_t select_group; /* a batched decode step (ra_offload_decode_batch) ranks the wave
                             sequences' clusters this many per device call (one sync each) and
                             sends their requests before ranking the next ones, so that the
                             stores start while the device ranks (1..RA_OFFLOAD_MAX_BATCH; the
                             batch's first runtime's value counts; default 4: 32 sequences of
                             32K on the H200 decode 1.05-1.25x faster than one at a time, all 32
                             at once 0.85x, bench/results/serve-h200/README.md) */
  uint32_t build_layers;  /* index builds of up to this many layers in flight at the stores
                             (1..RA_OFFLOAD_MAX_BUILD_LAYERS, default 3): a layer's builds start
                             while the previous layers' still run, so that the threads one layer's
                             last builds leave idle take up the next layer's (Llama-3-8B 128K on
                             the H200, stores at --threads 7: roar prefill 1.25x the prefill alone
                             with 3, 1.46x with 1, in one call) */
  ra_wave_config wave;    /* wave mode: budgets and clustering (gpu-worker/wave.h) */
  uint32_t retro_window;  /* retrospective correction of the last W decode steps (0: off; flat,
                             ivf, kgraph, roar, wave without a buffer; W < n_window, <=
                             RA_OFFLOAD_MAX_RETRO): see "Retrospective correction" in
                             docs/architecture.md */
  int64_t synthetic_chunk; /* > 0: a generated-KV prefill (benchmarks at contexts whose real
                             prefill would take hours): every layer's q/k/v come from the token
                             embeddings alone, `synthetic_chunk` tokens per step, with no
                             attention or MLP in between, so the stores get KV the model never
                             computed; the offload, the index builds and the decode after it are
                             the real ones. 0: the model's prefill */
  void (*progress)(void *ctx, const ra_offload_progress *p); /* optional, after each prefill layer */
  void *progress_ctx;
  /* optional, every decode step after layer `layer`'s attention (local and stores' merged):
   * st->cur_att is [1, n_heads, head_dim] (the accuracy suite compares it with full attention) */
  int (*on_attn)(void *ctx, ra_state *st, int layer, ra_error *err);
  void *attn_ctx;
} ra_offload_config;

void ra_offload_config_default(ra_offload_config *c);

/* Time of one decode step (or, for prefill, of the whole prefill), microseconds. */
typedef struct ra_offload_stats {
  double total_us;
  double wait_us;      /* decode: blocked on store replies (after the device's own attention);
                        * prefill: the device's thread blocked on the stores' layer jobs (both
                        * pipe slots busy, and the drain after the last layer) */
  double store_us;     /* the stores' own compute, slowest store per layer, summed */
  double append_us;    /* prefill: puts to the stores; decode: the evicted token's append */
  double download_us;  /* prefill: the offloaded K/V from the device to host memory */
  double index_us;     /* prefill: kNN on the backend + index builds (wave: the clustering and
                        * PutClusters); decode, wave: clustering a full growth block */
  double select_us;    /* decode, wave: ranking the clusters and the estimation zone on the device
                        * (batched: the sequence's share of the layers' ranking calls),
                        * with the selection's host lists */
  double merge_us;     /* decode: the stores' partial (and wave's estimate) uploaded and merged */
  uint64_t n_scanned;  /* keys the stores scored, all layers and heads */
  uint64_t retro_rows; /* retro: rows the past queries' supplementary partials attended over */
  uint32_t retro_past; /* retro: past steps corrected (and recomputed through the layers) */
  double retro_us;     /* retro: the worker's side (the output cache's merges, uploads, downloads) */
  double retro_store_us; /* retro: the stores' time on the supplementary partials (slowest per layer) */
  /* decode, wave with a buffer: retrieved clusters found in the device buffer / sent to the
   * stores, the rows the device attended from it, and the time waiting for admissions' fetches
   * and installing their rows (in total_us) */
  uint64_t buffer_hits, buffer_misses, buffer_rows;
  double fetch_us;
  uint64_t n_offloaded;/* tokens at the stores (per layer and kv head) after the step */
} ra_offload_stats;

typedef struct ra_offload ra_offload;

/* plan: the stores (NULL in streaming mode). The plan and the model must outlive the runtime. */
int ra_offload_new(const ra_model *m, const ra_offload_plan *plan, const ra_offload_config *cfg,
                   ra_offload **out, ra_error *err);
void ra_offload_free(ra_offload *o);

/* The model state: its logits after prefill / decode are those of the last token. */
ra_state *ra_offload_state(ra_offload *o);

/* Prefill of the first n tokens (1 <= n <= max_prompt), in one step, layer by layer. */
int ra_offload_prefill(ra_offload *o, const int32_t *tokens, int64_t n, ra_offload_stats *stats,
                       ra_error *err);
/* The same prefill in pieces, so that a server decodes its other sequences between them (a
 * 128K prompt's prefill would otherwise hold every running stream for its whole time): begin
 * checks and starts it (tokens stay the caller's until it ends); each next runs up to max_rows
 * (>= 1) more rows of layers, layer by layer in token order (a layer over the whole prompt is n
 * rows; a piece may end within a layer, except a synthetic prefill's, whose layers run whole),
 * and the one that runs the last ends it (*done = 1, stats as ra_offload_prefill's). Other runtimes may run in between; this one refuses a decode
 * (RA_ESTATE) until it is done. A failure ends it, the runtime back as before begin;
 * ra_offload_free ends one under way. */
int ra_offload_prefill_begin(ra_offload *o, const int32_t *tokens, int64_t n, ra_error *err);
int ra_offload_prefill_next(ra_offload *o, int64_t max_rows, int *done, ra_offload_stats *stats, ra_error *err);
/* Instead of ra_offload_prefill: the runtime's state after the prefill that `cap` captured
 * (prefill_capture.h), without running the model. Per layer, positions [S, n - W) of the
 * captured K/V go to the stores and, in an index mode, the index is built from the captured
 * query sample exactly as ra_offload_prefill builds it (kNN on the backend); the sink and window
 * go to the ring; the logits are the captured ones. The result decodes as if ra_offload_prefill
 * had run on the same tokens (same K/V, same index inputs): tests/integration/test_accuracy.c
 * checks the logits. cap->n <= max_prompt; in an index mode cap->n_queries must be
 * min(n, build_queries). */
int ra_offload_seed(ra_offload *o, const ra_prefill_capture *cap, ra_offload_stats *stats, ra_error *err);

/* One decode step: feeds `token` at the next position. */
int ra_offload_decode(ra_offload *o, int32_t token, ra_offload_stats *stats, ra_error *err);

/* One decode step of n runtimes (of one model), token i fed to os[i], in one batched forward
 * (batch.h): the dense work over [n, dim] (weights read once per step); per layer, one RoPE op
 * for all, wave's rankings in one backend call (one synchronization for the step's layer, not one
 * per sequence), q in one download, every sequence's store requests sent before any is waited
 * for (the stores work on all sequences at once), then every sequence's device attention over
 * its sink + window in one attn_decode_batch, and each one's stores' partial and the merge. A
 * runtime with retrospective correction or an on_attn hook decodes alone (ra_offload_decode)
 * within the call. A sequence's own failure (its store's) fails only it: rcs[i] / errs[i], its
 * position unchanged; each success leaves its logits in its state and its timings in stats[i]
 * (optional). Returns the batch's own failure (the backend's), which is every batched
 * sequence's. b: ra_batch_new with max_items >= n. rb (remote_batch.h; NULL: none): the
 * requests of each group of select_group sequences (in every mode) go to each store as one
 * AttendBatch message per layer instead of one Attend request per sequence. */
int ra_offload_decode_batch(ra_offload *const *os, const int32_t *tokens, int n, ra_batch *b, ra_remote_batch *rb,
                            int *rcs, ra_error *errs, ra_offload_stats *stats, ra_error *err);

/* The roar build's key lists (config key_top_queries): every key of keys [n_keys, head_dim] (an
 * fp32 tensor on be) gets the t queries of queries [n_q, head_dim] with the largest margin
 * q.k - thr[q] (thr: each query's knn_nq-th best key score, its list's last), best first, as
 * indices into queries; RA_KVCLIENT_NO_QUERY pads when n_q < t. The margin, not the score: a key
 * belongs with the queries whose lists it comes closest to entering (kv-store/index/roar.c). On
 * the backend, a matmul with a bias then top-k rows, in chunks of `chunk` keys (0: scores of a
 * chunk under 64M floats), with the queries held in q_dtype (F32, or a half type where the
 * backend's matmul takes half weights: the CUDA backend then uses its tensor cores). queries,
 * thr, out: host; out: [n_keys, t]. */
int ra_offload_key_top_queries(ra_backend *be, const ra_tensor *keys, ra_dtype q_dtype, const float *queries,
                               const float *thr, int64_t n_q, int t, int64_t chunk, uint32_t *out, ra_error *err);

/* A ra_gen_forward_fn (generate.h) over the runtime `ctx`: prefill on the first call, one decode
 * step per token after. */
int ra_offload_forward(void *ctx, ra_state *st, const int32_t *tokens, int64_t n, ra_error *err);

/* A saved context reopened (context.h): the ring holds its rows, the stores its sessions; the
 * runtime continues at `position` as if prefill and decode had brought it there. */
int ra_offload_resume(ra_offload *o, int64_t position, ra_error *err);
/* The runtime's store tier (NULL in streaming mode): for reports. */
ra_remote *ra_offload_remote(ra_offload *o);
/* Wave mode's meta-index and growth block (NULL in other modes): for tests and reports. */
const ra_wave *ra_offload_wave(const ra_offload *o);

/* Timings the runtime recorded: its prefill's, and every decode step's in order. */
const ra_offload_stats *ra_offload_prefill_stats(const ra_offload *o);
const ra_offload_stats *ra_offload_step_stats(const ra_offload *o, size_t *n_steps);

#endif
