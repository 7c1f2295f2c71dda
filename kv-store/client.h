/* ra_kvclient: a typed client of one kv-store (proto/kvstore.proto) over common/rpc.h, used by
 * the gpu-worker, the tests and the benchmark.
 *
 *   ra_kvclient *c;  ra_kvclient_connect("10.0.0.7:7000", NULL, &c, &err);
 *   ra_kvclient_session s;  ra_kvclient_open_session(c, &geo, shards, n, "worker-0", &s, &err);
 *   ra_kvclient_put_kv(c, &s, rows, n_rows, NULL, &err);           // prefill, chunked stream
 *   per (layer, q head):  ra_kvclient_build_index(c, &s, l, h, NULL, &input, &r, &err);
 *   ra_kvclient_stream *st;  ra_kvclient_attend_open(c, &s, &st, &err);
 *   per layer:  ra_kvclient_attend(st, &req, partials, 50, &err);  // one long-lived stream
 *   ra_kvclient_append(c, &s, &row, 1, &err);                      // window eviction
 *   wave:  ra_kvclient_put_clusters(c, &s, &clusters, NULL, &err);  // after put_kv / append
 *   ra_kvclient_attend_close(st);  ra_kvclient_close_session(c, &s, NULL, &err);
 *   ra_kvclient_close(c);
 *
 * Vectors are row-major: KV [n_tokens, head_dim] in the session dtype, q and o float32. Errors
 * are RA codes carrying the store's status message (e.g. RA_ENOMEM for RESOURCE_EXHAUSTED). A
 * client is used by one thread at a time; open one per thread, or one stream per thread. */
#ifndef RA_KVCLIENT_H
#define RA_KVCLIENT_H

#include "half.h"
#include "index_params.h"
#include "merge.h"
#include "modes.h"
#include "shardmap.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_kvclient ra_kvclient;
typedef struct ra_kvclient_put ra_kvclient_put;
typedef struct ra_kvclient_stream ra_kvclient_stream;

/* The deadline policy, from one value T (timeout_ms): every unary call has T; a PutKv stream's
 * reply T after its last chunk; a BuildIndex RA_KVCLIENT_BUILD_BASE_TIMEOUTS x T plus
 * RA_KVCLIENT_BUILD_US_PER_KEY for each key it covers (ra_kvclient_build_input.n_keys) times
 * the builds this client has in flight before it (they queue at the store's threads); attends the timeout their caller gives. Besides, the
 * connection is pinged every T / 2: a store that stops answering (frozen, its host gone) fails
 * every call in flight within about T, a long build's or a stream's send included. */
/* Ten times the slowest build measured (roar without key lists, 2 cores: 97 us a key): a shared
 * or loaded store must not fail a healthy build, and a frozen one is caught by the pings. */
#define RA_KVCLIENT_BUILD_US_PER_KEY 1000
/* A store starved by other work on a 2-core host took over 10 s + 2 s for a 2K-key build; a
 * build's deadline is a backstop (a frozen store is the pings' to catch), so its fixed part is
 * a few T. */
#define RA_KVCLIENT_BUILD_BASE_TIMEOUTS 3
typedef struct ra_kvclient_options {
  size_t max_message_bytes; /* channel limit; 0: 64 MiB (the store's default) */
  size_t chunk_bytes;       /* PutKv chunk size, keys + values; 0: 4 MiB */
  int timeout_ms;           /* T above; 0: 30 s */
  /* TLS (PEM text; NULL: plaintext unless tls is set): the CA that signed the store's
   * certificate (NULL with tls: gRPC's default roots), a client certificate and key for mutual
   * TLS (both or neither) */
  int tls;
  const char *tls_ca_pem, *tls_cert_pem, *tls_key_pem;
  const char *auth_token;   /* bearer token sent with every call (the store's --auth-token-file) */
  /* a connection seen up and then lost fails every later call at once (a session's client:
   * the pings found the store gone, so waiting for a reconnect only delays the error) */
  int fail_after_loss;
} ra_kvclient_options;

/* Fills the security fields of o from files (any NULL: not used): the CA, the client certificate
 * and key, and the token (the file's first line). Turns TLS on when any TLS file is given.
 * *texts gets what must outlive o (free with ra_kvclient_options_free). */
typedef struct ra_kvclient_secrets {
  char *ca, *cert, *key, *token;
} ra_kvclient_secrets;
int ra_kvclient_options_load(ra_kvclient_options *o, const char *ca_file, const char *cert_file,
                             const char *key_file, const char *token_file, ra_kvclient_secrets *texts,
                             ra_error *err);
void ra_kvclient_secrets_free(ra_kvclient_secrets *texts);

typedef struct ra_kvclient_geometry {
  uint32_t n_layers;
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  ra_dtype dtype;
} ra_kvclient_geometry;

typedef struct ra_kvclient_shard {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t token_begin;
  uint64_t token_end; /* exclusive; RA_TOKEN_END_OPEN: also takes appended tokens */
} ra_kvclient_shard;

typedef struct ra_kvclient_session {
  uint8_t id[16];
  ra_kvclient_geometry geo;
} ra_kvclient_session;

/* Tokens [token_begin, token_begin + n_tokens) of one (layer, kv head). */
typedef struct ra_kvclient_rows {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t token_begin;
  uint64_t n_tokens;
  const void *keys;   /* [n_tokens, head_dim] session dtype */
  const void *values; /* [n_tokens, head_dim] session dtype */
} ra_kvclient_rows;

typedef struct ra_kvclient_stats {
  uint64_t sessions, tokens, bytes_used, bytes_budget, requests, errors, attend_requests, attend_batches;
} ra_kvclient_store_stats;

typedef struct ra_kvclient_build_result {
  uint64_t n_keys;      /* keys indexed over the head's shards on this store */
  uint64_t index_bytes; /* bytes the new indexes hold (charged to the store's budget) */
  uint64_t build_us;    /* the store's time for the request */
  uint64_t n_repaired;  /* graph keys linked by beam searches (the build's slow part) */
} ra_kvclient_build_result;

typedef struct ra_kvclient_attend_req {
  uint32_t layer;
  const uint32_t *q_heads; /* [n_heads] */
  size_t n_heads;
  const float *q;          /* [n_heads, head_dim], RoPE applied */
  ra_mode mode;            /* a mode with a wire value (common/modes.h) */
  uint32_t top_k;          /* every mode but full */
  ra_search_spec search;   /* index search parameters; 0: store defaults */
  int want_ids;            /* wave: the row positions attended (clusters', then the lag) */
  /* wave only: kv head cluster_kv_heads[i] (of an asked q head, each named once) selects
   * cluster_counts[i] ids, the next ones of `clusters` (concatenated, sum(cluster_counts) in
   * all), each distinct and held by this store. A kv head not named selects none; the rows no
   * cluster covers are attended whatever the selection. */
  const uint32_t *cluster_kv_heads; /* [n_cluster_heads] */
  const uint32_t *cluster_counts;   /* [n_cluster_heads] */
  size_t n_cluster_heads;
  const uint32_t *clusters;         /* [sum(cluster_counts)] */
  /* retrospective correction (flat, index modes, wave; proto AttendRequest.retro_*): this
   * request is step retro_step (>= 1) of a window of retro_window steps, and the n_retro past
   * steps' queries retro_q [n_retro, n_heads, head_dim] get supplementary partials. Wave: past
   * step j's over the clusters it names for kv head cluster_kv_heads[i]: retro_cluster_counts
   * [n_retro, n_cluster_heads] ids, the next ones of retro_clusters (NULL: none) */
  uint64_t retro_step;
  uint32_t retro_window, n_retro;
  const float *retro_q;
  const uint32_t *retro_cluster_counts;
  const uint32_t *retro_clusters;
} ra_kvclient_attend_req;

int ra_kvclient_connect(const char *addr, const ra_kvclient_options *opt, ra_kvclient **out,
                        ra_error *err);
void ra_kvclient_close(ra_kvclient *c);
const char *ra_kvclient_addr(const ra_kvclient *c);

int ra_kvclient_health(ra_kvclient *c, int *serving, ra_error *err);
int ra_kvclient_stats(ra_kvclient *c, ra_kvclient_store_stats *out, ra_error *err);

int ra_kvclient_open_session(ra_kvclient *c, const ra_kvclient_geometry *geo,
                             const ra_kvclient_shard *shards, size_t n_shards, const char *name,
                             ra_kvclient_session *out, ra_error *err);
/* open_session with the session's index defaults (NULL: none), checked by the store. Index
 * parameters (common/index_params.h): zero fields are unset; BuildIndex takes the session's,
 * then the store's defaults (ra_index_params_default). */
int ra_kvclient_open_session_indexed(ra_kvclient *c, const ra_kvclient_geometry *geo,
                                     const ra_kvclient_shard *shards, size_t n_shards,
                                     const ra_index_spec *index, const char *name,
                                     ra_kvclient_session *out, ra_error *err);
/* Reattaches to session `id` of this store (proto OpenSessionRequest.resume_session_id):
 * RA_ENOTFOUND when the store has none, RA_EINVAL when geo is not the session's. *tokens gets
 * the rows it holds over all its shards (the worker compares them with what it wrote). */
int ra_kvclient_resume_session(ra_kvclient *c, const uint8_t id[16], const ra_kvclient_geometry *geo,
                               ra_kvclient_session *out, uint64_t *tokens, ra_error *err);
int ra_kvclient_close_session(ra_kvclient *c, const ra_kvclient_session *s,
                              uint64_t *bytes_freed, ra_error *err);

/* What a roar index is built from; ivf and kgraph learn from the keys alone (pass NULL). All
 * optional: queries [n_queries, head_dim] float32 (RoPE applied); knn_ids [n_queries, knn_k]:
 * each query's exact top-knn_k token positions, best first; key_top_queries [n_key_rows,
 * key_top_k]: for the key at position key_pos_begin + i, the queries (indices into queries)
 * that rank it best by the margin q.k - s_q, s_q being the query's knn_k-th best score, best
 * first, RA_KVCLIENT_NO_QUERY padding (proto BuildIndexRequest). */
#define RA_KVCLIENT_NO_QUERY 0xffffffffu
#define RA_KVCLIENT_KEY_TOP_MAX 64 /* key_top_k's bound (the store's) */
typedef struct ra_kvclient_build_input {
  const float *queries;
  uint32_t n_queries;
  const uint64_t *knn_ids;
  uint32_t knn_k;
  const uint32_t *key_top_queries;
  uint32_t key_top_k;
  uint64_t key_pos_begin, n_key_rows;
  uint64_t n_keys; /* keys the build covers at this store, for its deadline (0: n_key_rows) */
} ra_kvclient_build_input;

/* Builds the index of (layer, q_head) on every shard of its kv head this store holds, replacing
 * an older one of the same kind (kv-store/service.h, BuildIndex). params: NULL or overrides of
 * the session's defaults; in: the roar build's input (NULL: none). With per_kv_head, q_head is
 * any head of the group and the queries those of the whole group. Attends in the index's mode
 * work once it returns; appended tokens are inserted by the store. */
int ra_kvclient_build_index(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer,
                            uint32_t q_head, const ra_index_spec *params,
                            const ra_kvclient_build_input *in, ra_kvclient_build_result *out,
                            ra_error *err);
/* The same in two halves, so that builds of many heads run at the store at once: start sends
 * the request (the arguments may be reused as soon as it returns); wait takes the reply and
 * frees the call whatever happened. Every started build must be waited for. */
typedef struct ra_kvclient_build ra_kvclient_build;
int ra_kvclient_build_index_start(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer,
                                  uint32_t q_head, const ra_index_spec *params,
                                  const ra_kvclient_build_input *in, ra_kvclient_build **out,
                                  ra_error *err);
int ra_kvclient_build_index_wait(ra_kvclient_build *b, ra_kvclient_build_result *out, ra_error *err);

/* PutKv as a stream: begin, any number of put_rows (each split into chunks of at most
 * chunk_bytes; every send waits until gRPC has taken the previous one, which is the stream's
 * back-pressure), then end, which returns the store's counts and frees the stream whatever
 * happened. abort frees a stream without finishing it. */
int ra_kvclient_put_begin(ra_kvclient *c, const ra_kvclient_session *s, ra_kvclient_put **out,
                          ra_error *err);
int ra_kvclient_put_rows(ra_kvclient_put *p, const ra_kvclient_rows *rows, ra_error *err);
int ra_kvclient_put_end(ra_kvclient_put *p, uint64_t *tokens_stored, uint64_t *bytes_stored,
                        ra_error *err);
void ra_kvclient_put_abort(ra_kvclient_put *p);
/* begin + put_rows for each + end. */
int ra_kvclient_put_kv(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                       size_t n_rows, uint64_t *tokens_stored, ra_error *err);

/* Reads rows the store holds (proto ReadKvRequest): [token_begin, token_begin + n) of (layer,
 * kv_head), within one of its shards' stored rows, into keys / values ([n, head_dim] session
 * dtype each), in requests of at most chunk_bytes. */
int ra_kvclient_read_kv(ra_kvclient *c, const ra_kvclient_session *s, uint32_t layer, uint32_t kv_head,
                        uint64_t token_begin, uint64_t n, void *keys, void *values, ra_error *err);
/* Appends tokens (each block continues its shard); all blocks are stored or none. */
int ra_kvclient_append(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                       size_t n_rows, ra_error *err);
/* The same in two halves, so that appends to several stores are in flight at once: start sends
 * the request (rows may be reused once it returns); wait takes the reply and frees the call
 * whatever happened. Every started append must be waited for. */
typedef struct ra_kvclient_append_call ra_kvclient_append_call;
int ra_kvclient_append_start(ra_kvclient *c, const ra_kvclient_session *s, const ra_kvclient_rows *rows,
                             size_t n_rows, ra_kvclient_append_call **out, ra_error *err);
int ra_kvclient_append_wait(ra_kvclient_append_call *a, ra_error *err);

/* Wave mode's clusters of one (layer, kv head) (proto PutClustersRequest has the rules): rows
 * [row_begin, row_begin + n), n = sum(counts), of one shard this store holds, stored already and
 * starting where its clustered rows end, are first reordered by perm when given (new row
 * row_begin + j = old row row_begin + perm[j]), then cluster first_cluster + i covers the next
 * counts[i] of them. Ids are global per kv head, taken by a store in increasing order. */
typedef struct ra_kvclient_clusters {
  uint32_t layer, kv_head;
  uint32_t first_cluster;
  uint64_t row_begin;        /* a row position: the shard's token_begin + its row */
  const uint32_t *counts;    /* [n_clusters], each > 0 */
  size_t n_clusters;
  const uint32_t *perm;      /* [sum(counts)] or NULL: the rows are in cluster order already */
} ra_kvclient_clusters;

typedef struct ra_kvclient_clusters_result {
  uint32_t n_clusters;      /* the kv head's clusters on this store */
  uint64_t rows_clustered;  /* its rows here that clusters cover */
  uint64_t rows_lagging;    /* its rows here that none covers (attended by every wave attend) */
  uint64_t directory_bytes; /* the session's cluster directory on this store */
} ra_kvclient_clusters_result;

/* Installs the clusters, all or nothing; out may be NULL. Errors: RA_EINVAL (INVALID_ARGUMENT)
 * for malformed counts / perm / ids or rows outside the store's shards, RA_ESTATE
 * (FAILED_PRECONDITION) for ids already held or out of order and rows not stored yet, already
 * clustered or not at the clustered prefix's end, RA_ENOMEM for the budget. */
int ra_kvclient_put_clusters(ra_kvclient *c, const ra_kvclient_session *s,
                             const ra_kvclient_clusters *in, ra_kvclient_clusters_result *out,
                             ra_error *err);

/* Wave mode's device buffer (proto FetchClustersRequest): the K/V rows of clusters this store
 * holds, of one layer; kv head kv_heads[i] names the next counts[i] of ids. The rows come back
 * as an attend over those clusters scans them, in request order. start sends the request (its
 * arguments may be reused at once); wait takes the reply into *out, which stays valid until
 * ra_kvclient_fetch_free (that also frees a fetch never waited for, cancelling it). Errors:
 * RA_EINVAL (INVALID_ARGUMENT) for a malformed selection or an answer over
 * RA_KVCLIENT_FETCH_MAX_BYTES (under the 64 MiB default message limit),
 * RA_ENOTFOUND for an unknown session or a cluster the store does not hold. */
#define RA_KVCLIENT_FETCH_MAX_BYTES (32u << 20) /* keys + values of one reply, the store's bound */
typedef struct ra_kvclient_fetch ra_kvclient_fetch;
typedef struct ra_kvclient_cluster_sel {
  uint32_t layer;
  const uint32_t *kv_heads, *counts; /* [n_heads] */
  size_t n_heads;
  const uint32_t *ids;               /* [sum(counts)] */
} ra_kvclient_cluster_sel;
typedef struct ra_kvclient_cluster_rows {
  const uint32_t *rows;  /* [n_ids] rows of each id */
  size_t n_ids;
  uint64_t n_rows;       /* sum(rows) */
  const void *keys;      /* [n_rows, head_dim] session dtype, the clusters back to back */
  const void *values;
} ra_kvclient_cluster_rows;
int ra_kvclient_fetch_clusters_start(ra_kvclient *c, const ra_kvclient_session *s,
                                     const ra_kvclient_cluster_sel *sel, ra_kvclient_fetch **out,
                                     ra_error *err);
int ra_kvclient_fetch_clusters_wait(ra_kvclient_fetch *f, ra_kvclient_cluster_rows *out,
                                    ra_error *err);
void ra_kvclient_fetch_free(ra_kvclient_fetch *f);

/* A long-lived Attend stream. attend sends one request and waits up to timeout_ms (< 0: no
 * limit) for its reply; out: [n_heads] in request order, each with part.o room for head_dim
 * floats and ids room for ids_cap positions (or NULL), both the caller's (common/merge.h).
 * The stream's call starts with the first attend (a stream opened long before its first request
 * would sit idle at the store, which takes idle calls' slots back). When the store ends the
 * stream with an error (a bad request, a timeout, a restart) that error is returned and the next
 * attend opens a fresh stream. *compute_us (optional) gets the store's compute time. */
int ra_kvclient_attend_open(ra_kvclient *c, const ra_kvclient_session *s,
                            ra_kvclient_stream **out, ra_error *err);
int ra_kvclient_attend(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                       ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                       ra_error *err);
void ra_kvclient_attend_close(ra_kvclient_stream *st);
/* Frees a stream without the polite end (a store that stopped answering): cancels its call. */
void ra_kvclient_attend_abort(ra_kvclient_stream *st);

/* attend in two halves, so that one thread can have a request in flight at every store of a
 * layer before it waits for any reply: send, then recv with the same req (for its q heads).
 * recv_retro also takes the supplementary partials of a request with n_retro > 0 into retro
 * [n_retro, n_heads] (part.o room for head_dim floats each; ids are not carried) and the
 * store's time on them into *retro_us (optional). */
int ra_kvclient_attend_send(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                            ra_error *err);
int ra_kvclient_attend_recv(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                            ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                            ra_error *err);
int ra_kvclient_attend_recv_retro(ra_kvclient_stream *st, const ra_kvclient_attend_req *req,
                                  ra_head_partial *out, ra_head_partial *retro, int timeout_ms,
                                  uint64_t *compute_us, uint64_t *retro_us, ra_error *err);

/* AttendBatch (proto): the attends of several sessions at this store in one message, e.g. a
 * group of a batched decode step's sequences, one message per layer. A batch stream belongs to
 * the client, not to a session:
 *
 *   ra_kvclient_batch *b;  ra_kvclient_batch_open(c, &b, &err);
 *   per item:  ra_kvclient_batch_add(b, &session_i, &req_i, &item_i, &err);  // staged
 *   ra_kvclient_batch_send(b, &err);                    // one message for every staged item
 *   per item, in order:  ra_kvclient_batch_reply *rep;  ra_kvclient_batch_recv(b, 50, &rep, &err);
 *     ra_kvclient_batch_reply_take(rep, &session_i, &req_i, partials, NULL, &err);
 *     ra_kvclient_batch_reply_free(rep);
 *   ra_kvclient_batch_close(b);
 *
 * A staged request (and the arrays it points to) must stay valid until send, which clears the
 * staged items (at least one). Several messages may be in flight; the store answers each item as
 * soon as it is done, so recv returns one reply per item, the first message's items in order,
 * then the next message's. An item fails alone: reply_take returns the store's error for it (a
 * bad request, an unknown session) while the others are answered. A send or recv that fails (the
 * store gone, a timeout, a reply out of order) breaks the stream: every reply still awaited is
 * lost, and the next send opens a fresh stream. Requests with retro queries are refused. */
typedef struct ra_kvclient_batch ra_kvclient_batch;
typedef struct ra_kvclient_batch_reply ra_kvclient_batch_reply;
int ra_kvclient_batch_open(ra_kvclient *c, ra_kvclient_batch **out, ra_error *err);
void ra_kvclient_batch_close(ra_kvclient_batch *b);
int ra_kvclient_batch_add(ra_kvclient_batch *b, const ra_kvclient_session *s, const ra_kvclient_attend_req *req,
                          size_t *item, ra_error *err);
size_t ra_kvclient_batch_staged(const ra_kvclient_batch *b);
int ra_kvclient_batch_send(ra_kvclient_batch *b, ra_error *err);
/* The next item's reply (timeout_ms as for ra_kvclient_attend). */
int ra_kvclient_batch_recv(ra_kvclient_batch *b, int timeout_ms, ra_kvclient_batch_reply **out, ra_error *err);
/* The item's partials, out [req->n_heads] as for ra_kvclient_attend (s, req: the item's); its
 * error; *compute_us: the store's time on it. */
int ra_kvclient_batch_reply_take(const ra_kvclient_batch_reply *rep, const ra_kvclient_session *s,
                                 const ra_kvclient_attend_req *req, ra_head_partial *out, uint64_t *compute_us,
                                 ra_error *err);
void ra_kvclient_batch_reply_free(ra_kvclient_batch_reply *rep);

#endif
