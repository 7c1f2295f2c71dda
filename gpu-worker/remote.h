/* Remote attention: the worker's side of the kv-store tier.
 *
 * Given an offload plan (common/offload_plan.h), it opens a session on every store with the
 * shards the plan gives it, sends each offloaded (layer, kv head, position) to its owner during
 * prefill, appends the token that leaves the window at every decode step, and, per decode step
 * and layer, sends one attend request to every store that owns part of the layer — all of them
 * before waiting for any — and merges their partials into one per q head (common/merge.h), which
 * the caller merges with its own sink + window partial.
 *
 * Replicas (offload_plan.h): every write and index build goes to each live owner of a shard,
 * each attend to one owner per rule. A store that fails or stays silent past the deadline is
 * marked down (logged, and reported by ra_remote_store_state) when every rule it owns has
 * another live owner: an attend's heads it did not answer are sent to the next owner within
 * the same step, and the partials merge in the rules' order, so the step's result is the one an
 * undisturbed step gives. Without another owner, and with cfg.reconnect_ms, the remote
 * reconnects to the store for up to that long and reattaches its session (a store restarted
 * from --data-dir keeps it): it must hold exactly the rows acknowledged to the worker (or those
 * plus the append that was in flight), and the operation is redone there.
 *
 * Spares (cfg.spares): before the next operation, a down store's shards are copied to a spare
 * (ReadKv from their other owners, PutKv to the spare; ivf / kgraph indexes built again there)
 * and the spare takes its place, restoring R. Not in roar or wave mode (the worker does not keep
 * their index inputs).
 *
 * Otherwise the first failure fails the call with the store's address in the message, and the
 * remote refuses further steps (RA_ESTATE) so a generation stops instead of decoding on half the
 * context. ra_remote_close still closes the sessions on the stores that answer, so they free
 * the memory. */
#ifndef RA_REMOTE_H
#define RA_REMOTE_H

#include "client.h"
#include "half.h"
#include "offload_plan.h"
#include "status.h"

#include <stdint.h>

typedef struct ra_remote ra_remote;

/* A session to reattach instead of opening one (a saved context): its id at the store and the
 * rows the store must hold. */
typedef struct ra_remote_session {
  uint8_t id[16];
  uint64_t tokens;
} ra_remote_session;

typedef struct ra_remote_config {
  ra_dtype dtype;          /* KV storage dtype at the stores */
  ra_mode mode;            /* how stores choose keys: a mode with a wire value (common/modes.h) */
  uint32_t top_k;          /* keys per q head for every mode but full */
  ra_search_spec search;   /* index search parameters; 0: store defaults */
  int timeout_ms;          /* every store call's deadline (client.h: the policy); 0: 10 s */
  ra_kvclient_options client; /* the connections' security (TLS, token); its timeout_ms is the above */
  int roar_per_kv_head;    /* roar: one graph per kv head, built from its whole group's queries */
  const char *client_name; /* for the stores' logs */
  uint32_t retro_window;   /* retrospective correction: past steps corrected (0: off) */
  int reconnect_ms;        /* > 0: reattach a failed store without another owner (above) */
  const ra_remote_session *resume; /* NULL, or [n_stores] (plan order): reattach these sessions */
  const char *const *spares; /* spare stores (HOST:PORT) that take a down store's place (remote.c) */
  size_t n_spares;
} ra_remote_config;

typedef struct ra_remote_stats {
  uint64_t n_scanned;  /* keys whose dot product the stores computed, all heads */
  uint64_t n_keys;     /* keys the stores hold for the asked heads' kv heads */
  double wait_us;      /* from the first send to the last reply */
  double store_us;     /* the slowest store's own compute time */
  uint64_t retro_rows; /* retro: rows the supplementary partials attended over, all stores */
  double retro_us;     /* retro: the slowest store's time on them (part of store_us) */
} ra_remote_stats;

/* Connects to every store of the plan and opens the sessions. Geometry: the plan's, head_dim. */
int ra_remote_open(const ra_offload_plan *plan, uint32_t head_dim, const ra_remote_config *cfg,
                   ra_remote **out, ra_error *err);

/* Prefill: positions [pos0, pos0 + n) of one layer, all offloaded (inside [S, n_ctx - W)).
 * k, v: [n, n_kv_heads, head_dim] fp32 (the cache layout); each (kv head, position) goes to its
 * owner in the session dtype. */
int ra_remote_put(ra_remote *r, uint32_t layer, const float *k, const float *v, uint64_t pos0,
                  uint64_t n, ra_error *err);
/* The same from head-major rows: k, v [n_kv_heads, n, head_dim] in dt, row [g, i] going to kv
 * head g's position pos0 + i (wave mode sends each kv head's rows in its own cluster order). dt:
 * fp32, converted as ra_remote_put does, or the session dtype, sent as it is (the stores refuse
 * a non-finite row); any other is RA_EINVAL. */
int ra_remote_put_heads(ra_remote *r, uint32_t layer, const void *k, const void *v, ra_dtype dt, uint64_t pos0,
                        uint64_t n, ra_error *err);

/* Wave mode: installs clusters at the store owning each request's (layer, kv head, row_begin),
 * in order (client.h ra_kvclient_put_clusters has the rules). */
int ra_remote_put_clusters(ra_remote *r, const ra_kvclient_clusters *c, size_t n, ra_error *err);

/* Index build of (layer, q head) at every store holding tokens of its kv head there. in: the
 * roar build's input (client.h ra_kvclient_build_input; NULL for ivf / kgraph): the q head's
 * sampled prefill queries, their exact top-knn_k token positions (best first; the stores keep
 * the ids that fall in their shards) and, optionally, every offloaded key's best queries. The
 * index kind is the config's mode (ivf, kgraph or roar); ivf and kgraph are built once per kv
 * head (any q head of the group names it), shared by the group. So is roar with
 * roar_per_kv_head: the call then names the group's first q head and carries every q head's
 * queries and lists of the group, one after the other. */
int ra_remote_build_index(ra_remote *r, uint32_t layer, uint32_t q_head, const ra_kvclient_build_input *in,
                          ra_error *err);
/* The same in two halves: start sends the build (its arguments may be reused at once) and
 * returns; wait waits for every build started since the last wait and returns the first
 * failure. The stores run the started builds in parallel (one per head: a store's threads
 * would mostly idle inside one small graph's build). close waits for what is left. */
int ra_remote_build_index_start(ra_remote *r, uint32_t layer, uint32_t q_head, const ra_kvclient_build_input *in,
                                ra_error *err);
int ra_remote_build_index_wait(ra_remote *r, ra_error *err);
/* Waits for the builds started before the `keep` latest (all but those) and returns the first
 * failure among them; the latest stay in flight. keep 0 is ra_remote_build_index_wait. */
int ra_remote_build_index_wait_older(ra_remote *r, size_t keep, ra_error *err);
/* Builds started and not yet waited for. */
size_t ra_remote_builds_in_flight(const ra_remote *r);

/* Decode: the position that left the window, for every layer. k, v: [n_layers, n_kv_heads,
 * head_dim] fp32. One Append call per store. */
int ra_remote_append(ra_remote *r, uint64_t pos, const float *k, const float *v, ra_error *err);
/* ra_remote_append in two halves, so that several runtimes' appends are in flight together:
 * start sends every store its rows (k, v may go away after it), wait waits for them, recovers a
 * failed store as ra_remote_append does and returns the first failure. One append in flight at a
 * time (RA_ESTATE otherwise, and for a wait without a start); a start that fails leaves none. */
int ra_remote_append_start(ra_remote *r, uint64_t pos, const float *k, const float *v, ra_error *err);
int ra_remote_append_wait(ra_remote *r, ra_error *err);

/* The merged partial over the offloaded tokens of `layer` for every q head.
 * q: [n_q_heads, head_dim] (RoPE applied); o: [n_q_heads, head_dim]; ml: [n_q_heads, 2], (m, l)
 * per head: the layout of the backend's attn_merge (backend.h), uploaded as it is.
 * A head no store holds tokens for gets the empty partial (m = -inf, l = 0, o = 0). */
int ra_remote_attend(ra_remote *r, uint32_t layer, const float *q, float *o, float *ml,
                     ra_remote_stats *stats, ra_error *err);

/* attend in two halves: begin sends the requests of every store, end waits for the replies and
 * merges; the caller computes its own sink + window attention in between. */
int ra_remote_attend_begin(ra_remote *r, uint32_t layer, const float *q, ra_error *err);
/* The next attend (begin ... end; not one with retro) goes through batch b (remote_batch.h):
 * begin stages its requests there, the caller sends the batch, end takes the replies from it.
 * What a failed store's heads are sent again on goes on the remote's own streams. */
typedef struct ra_remote_batch ra_remote_batch;
void ra_remote_attend_via(ra_remote *r, ra_remote_batch *b);
/* Wave mode's selection for one store: kv head kv_heads[i] selects counts[i] cluster ids, the
 * next ones of clusters (the request fields of client.h ra_kvclient_attend_req). With retro,
 * past step j's clusters for kv head kv_heads[i]: retro_counts[(j - 1) * n_heads + i] ids, the
 * next ones of retro_clusters (NULL without retro). */
typedef struct ra_remote_wave_sel {
  const uint32_t *kv_heads, *counts, *clusters;
  size_t n_heads;
  const uint32_t *retro_counts, *retro_clusters;
} ra_remote_wave_sel;
/* attend_begin in wave mode: sel[i] is store i's selection (plan order). With retro (config
 * retro_window > 0, n_past > 0) it is decode step `step` and q_past the n_past past queries as
 * for attend_begin_retro, each getting its partial over the clusters sel names for it; collect
 * them with attend_end_retro. n_past 0: q_past and step are ignored. */
int ra_remote_attend_begin_wave(ra_remote *r, uint32_t layer, const float *q, const ra_remote_wave_sel *sel,
                                uint64_t step, uint32_t n_past, const float *q_past, ra_error *err);
/* Wave mode's device buffer: starts fetching the K/V rows of the clusters sel names (their ids
 * at store `store`, of `layer`) from that store, off the decode's critical path (the stores
 * answer while the worker computes). wait takes the rows (client.h ra_kvclient_cluster_rows, in
 * the session dtype; valid until ra_kvclient_fetch_free, which the caller calls after wait or
 * instead of it). A failure fails the remote like any store failure. */
int ra_remote_fetch_clusters_start(ra_remote *r, size_t store, uint32_t layer, const ra_remote_wave_sel *sel,
                                   ra_kvclient_fetch **out, ra_error *err);
int ra_remote_fetch_clusters_wait(ra_remote *r, ra_kvclient_fetch *f, ra_kvclient_cluster_rows *out, ra_error *err);
/* The session dtype of the stores' KV. */
ra_dtype ra_remote_dtype(const ra_remote *r);

int ra_remote_attend_end(ra_remote *r, float *o, float *ml, ra_remote_stats *stats, ra_error *err);

/* Retrospective correction (config retro_window W > 0; flat and the index modes: the stores keep
 * each step's attended positions, kv-store/retro.h; wave: attend_begin_wave). begin_retro is attend_begin as decode step
 * `step` (>= 1, one more each step), with the queries of the n_past <= W previous steps q_past
 * [n_past, n_q_heads, head_dim] (step - j at row j - 1); end_retro is attend_end that also
 * merges their supplementary partials over the stores into o_past [n_past, n_q_heads, head_dim]
 * and ml_past [n_past, n_q_heads, 2] (each past query's partial over the positions retrieved
 * now that it has not seen; empty where there are none). */
int ra_remote_attend_begin_retro(ra_remote *r, uint32_t layer, const float *q, uint64_t step, uint32_t n_past,
                                 const float *q_past, ra_error *err);
int ra_remote_attend_end_retro(ra_remote *r, float *o, float *ml, float *o_past, float *ml_past,
                               ra_remote_stats *stats, ra_error *err);
/* What became of store i (plan order), for reports and saved contexts. */
typedef struct ra_remote_store_report {
  const char *addr;    /* where it is now */
  const char *replaced; /* the plan's store a spare replaced (NULL: none) */
  int down;            /* marked down: its shards went on at their other owners */
  const char *why;     /* the failure that marked it down (NULL when up) */
  uint32_t reconnects; /* times its session was reattached */
  uint64_t tokens;     /* rows it acknowledged */
  uint8_t session_id[16];
} ra_remote_store_report;
size_t ra_remote_n_stores(const ra_remote *r);
int ra_remote_store_state(const ra_remote *r, size_t i, ra_remote_store_report *out);

/* ra_remote_close will leave the sessions open on the stores (a saved context reattaches them). */
void ra_remote_keep_sessions(ra_remote *r);

/* Closes the sessions (stores free their memory) and frees everything. */
void ra_remote_close(ra_remote *r);

#endif
