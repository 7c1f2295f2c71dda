/* The kv-store's API as plain functions over serialized protobuf (proto/kvstore.proto):
 * request bytes in, reply bytes or an RA code + message out. Transport-independent, so the gRPC
 * server, the unit tests and the fuzz target all drive the same code. Every field of every
 * request is validated here; a bad request leaves every session as it was.
 *
 * RA codes become gRPC statuses in common/rpc.c: RA_EINVAL/RA_EFORMAT -> INVALID_ARGUMENT,
 * RA_ENOTFOUND -> NOT_FOUND, RA_ENOMEM -> RESOURCE_EXHAUSTED, RA_ESTATE -> FAILED_PRECONDITION,
 * RA_EUNSUPPORTED -> UNIMPLEMENTED. */
#ifndef KVS_SERVICE_H
#define KVS_SERVICE_H

#include "buf.h"
#include "pb_arena.h"
#include "status.h"
#include "store.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_service kvs_service;

/* Who sends a request (the server fills it from the call): principal names its credential
 * (common/rpc.h ra_rpc_call_principal; "" when the store checks none). A session is usable only
 * by the principal that opened it (others get RA_EPERM: PERMISSION_DENIED), and a caller with a
 * principal sees only its own sessions in Stats. A NULL caller (in-process: tests, fuzzing) may
 * use every session and sees the whole store. */
typedef struct kvs_caller {
  const char *principal;
  const char *peer; /* for logs */
} kvs_caller;

typedef struct kvs_service_config {
  uint64_t memory_budget; /* bytes of KV + session metadata the store may hold */
  int attend_threads;     /* OpenMP threads per attend; 0: the OpenMP default */
  int index_threads;      /* threads inserting written rows into indexes; 0: attend_threads' */
  const char *data_dir;   /* NULL: sessions live in memory only; else journal.h: each session's
                             changes are kept there and the sessions found there restored */
  int fsync_ms;           /* journal.h: 0 sync each record, > 0 every fsync_ms, < 0 never */
} kvs_service_config;

/* With data_dir, replays the sessions found there before returning (restart time: their
 * writes, and their index builds run again). */
int kvs_service_create(const kvs_service_config *cfg, kvs_service **out, ra_error *err);
/* Frees every session; no call may be running. */
void kvs_service_destroy(kvs_service *svc);
kvs_store *kvs_service_store(kvs_service *svc);
/* Health reports serving = false once draining (shutdown has begun). */
void kvs_service_set_draining(kvs_service *svc);

/* Unary methods: `req` is one serialized request, `reply` receives the serialized reply. */
int kvs_service_open_session(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                             ra_error *err);
int kvs_service_append(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err);
int kvs_service_attend(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err);
/* AttendBatch: each item is an attend of its own (its session, its checks, counted as a
 * request), run in order and answered at once: emit gets each item's serialized reply (proto
 * AttendBatchReply) as soon as it is done. Fails as a whole (nothing more emitted) when the
 * message cannot be parsed or has no items, a reply cannot be built, or emit fails (its code). */
typedef int (*kvs_emit_fn)(void *ctx, const uint8_t *data, size_t len, ra_error *err);
int kvs_service_attend_batch(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len,
                             kvs_emit_fn emit, void *ctx, ra_error *err);
/* BuildIndex: builds (layer, q_head)'s index of the kind its params name (over the session's
 * OpenSession IndexParams, over the defaults) on every shard of the kv head held here
 * (kvs_session_build_index). roar needs the q head's prefill queries: `queries` float32
 * [n_queries, head_dim] and/or `knn_ids` [n_queries, knn_k] token positions, best first. With
 * per_kv_head the index is the kv head's, shared by its GQA group: any q head of the group names
 * it, and the queries should be those of the whole group. An attend in that mode then searches
 * it (attend.h). INVALID_ARGUMENT for bad parameters or query shapes, RESOURCE_EXHAUSTED when
 * the build's memory does not fit the budget (nothing is installed; the session is unchanged).
 * Reply: keys indexed, index bytes, build time. */
int kvs_service_build_index(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                            ra_error *err);
/* PutClusters (wave mode): installs clusters of one (layer, kv head) over rows held here, after
 * reordering them by the optional perm (kvs_session_put_clusters, clusters.h); all or nothing.
 * Reply: the kv head's clusters and clustered / lagging rows here, the directory's bytes. */
int kvs_service_put_clusters(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                             ra_error *err);
/* FetchClusters (wave mode's device buffer): the K/V rows of named clusters held here
 * (kvs_session_fetch_clusters, clusters.h), keys and values at most RA_KVCLIENT_FETCH_MAX_BYTES
 * together (client.h). Reply: rows per cluster, keys, values. */
int kvs_service_fetch_clusters(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                               ra_error *err);

/* ReadKv: rows a session holds (kvs_session_read), as a KvChunk. */
int kvs_service_read_kv(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply, ra_error *err);
int kvs_service_close_session(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                              ra_error *err);
int kvs_service_stats(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                      ra_error *err);
int kvs_service_health(kvs_service *svc, const kvs_caller *who, const uint8_t *req, size_t len, ra_buf *reply,
                       ra_error *err);

/* PutKv is a client stream of KvChunk messages (all of one session) and one PutKvReply at the
 * end; it is all or nothing. Chunks are checked and copied as they come (kvs_session_stage) but
 * stay invisible until finish commits them all; a failing chunk drops the whole stream's rows
 * (its error says so), and so does abort, for a stream that ended without finishing (cancelled,
 * timed out, the peer gone). A retry then starts from where the shards were before the stream.
 * Every begun stream ends with finish, a failed chunk or abort. */
typedef struct kvs_put_state {
  uint64_t tokens_stored;
  uint64_t bytes_stored;
  uint64_t chunks;
  kvs_stage stage;
  const kvs_caller *who; /* lives as long as the stream */
  /* with --data-dir: the stream's chunks as they came, recorded in the session's journal when
   * finish commits them (a dropped stream leaves no record) */
  uint8_t **raw;
  size_t *raw_len;
  size_t n_raw, cap_raw;
  pb_arena arena; /* each chunk's unpacked fields */
} kvs_put_state;

void kvs_service_put_begin(kvs_service *svc, const kvs_caller *who, kvs_put_state *st);
int kvs_service_put_chunk(kvs_service *svc, kvs_put_state *st, const uint8_t *chunk, size_t len,
                          ra_error *err);
int kvs_service_put_finish(kvs_service *svc, kvs_put_state *st, ra_buf *reply, ra_error *err);
void kvs_service_put_abort(kvs_service *svc, kvs_put_state *st);

/* Counts a failure that happened outside the service (a transport error mid-stream). */
void kvs_service_count_error(kvs_service *svc);

#endif
