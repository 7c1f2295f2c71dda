/* The store's background indexer: a queue of shards whose indexes lag the rows written to them,
 * and a pool of threads that insert those rows (kvs_shard_index_step), so that a write returns
 * as soon as its rows are stored. store.h describes the locks; this module only ever takes the
 * shards' ix_lock (inside kvs_shard_index_step) and its own mutex, never a session lock.
 *
 * Internal to the store (store.c drives it); the public face is store.h's kvs_session_index_lag,
 * kvs_session_index_drain, kvs_store_index_pause and kvs_store_set_index_threads. */
#ifndef KVS_INDEXER_H
#define KVS_INDEXER_H

#include "status.h"
#include "store.h"

#include <stddef.h>

typedef struct kvs_indexer kvs_indexer;

/* Shard queue states (kvs_shard.ix_state). RERUN: rows arrived while a batch ran; queued again
 * when it ends. */
enum { KVS_IX_IDLE = 0, KVS_IX_QUEUED, KVS_IX_RUNNING, KVS_IX_RERUN };

/* No thread is started until the first enqueue. RA_OK, RA_ENOMEM or RA_EINTERNAL. */
int kvs_indexer_create(kvs_indexer **out, ra_error *err);
/* Stops and joins the threads. Every session must have been cancelled (nothing queued). */
void kvs_indexer_destroy(kvs_indexer *q);
/* Threads to start (n < 1: omp_get_max_threads()); no effect once started. */
void kvs_indexer_set_threads(kvs_indexer *q, int n);
/* Queues shards[0..n) (their session's write lock held, so each sh->ix is stable; every one has
 * an index table), except one queued already or of a cancelled session; a shard being indexed
 * is queued again when its batch ends. Takes a session reference per queued shard. When no
 * thread can be started nothing is queued: the rows lag (scanned exactly) and a later write
 * tries again. */
void kvs_indexer_enqueue(kvs_indexer *q, kvs_shard *const *shards, size_t n);
/* The session is going away: no more queuing, its queued shards are dropped, and this returns
 * once no batch of it runs, so the indexer holds no reference to it afterwards. */
void kvs_indexer_cancel(kvs_indexer *q, kvs_session *s);
/* Blocks until no shard of s is queued or running (kvs_session_index_drain). */
void kvs_indexer_drain(kvs_indexer *q, kvs_session *s);
/* Test hook (kvs_store_index_pause). */
void kvs_indexer_pause(kvs_indexer *q, int paused);

/* The store's indexer (store.c). */
kvs_indexer *kvs_store_indexer(kvs_store *st);

#endif
