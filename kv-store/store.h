/* The kv-store's memory tier: a registry of sessions, each holding shards of offloaded KV, and
 * the memory budget every byte of them is charged against.
 *
 * A session has a model geometry and the shards it owns. A shard is one (layer, kv head) and a
 * token range [token_begin, token_end) (token_end RA_TOKEN_END_OPEN: it also takes appended
 * tokens); its keys and values are contiguous row-major arrays [n, head_dim] in the session's
 * dtype, filled strictly in order: a write must start exactly where the filled range ends.
 *
 * Memory: bytes are charged to the store's budget BEFORE they are allocated, so a request that
 * would exceed it fails with RA_ENOMEM and the process never grows past the budget.
 *
 * Concurrency: the registry has a mutex; each session a rwlock (attends read, writes write) and
 * a reference count, so closing a session while an attend runs frees it when the attend ends. */
#ifndef KVS_STORE_H
#define KVS_STORE_H

#include "half.h"
#include "shardmap.h"
#include "status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_SESSION_ID_BYTES 16

/* Geometry bounds: generous for any real model, small enough that a hostile OpenSession cannot
 * make the per-(layer, kv head) table large. */
#define KVS_MAX_LAYERS 1024u
#define KVS_MAX_KV_HEADS 1024u
#define KVS_MAX_Q_HEADS 8192u
#define KVS_MAX_HEAD_DIM 1024u
/* Rows of one (layer, kv head) are numbered by uint32 (top-k and index ids). */
#define KVS_MAX_ROWS_PER_HEAD ((uint64_t)UINT32_MAX)

typedef struct kvs_geometry {
  uint32_t n_layers;
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  ra_dtype dtype;
} kvs_geometry;

typedef struct kvs_shard_spec {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t token_begin;
  uint64_t token_end; /* exclusive; RA_TOKEN_END_OPEN for open-ended */
} kvs_shard_spec;

typedef struct kvs_shard {
  kvs_shard_spec spec;
  uint64_t n;      /* rows filled: tokens [token_begin, token_begin + n) */
  uint64_t cap;    /* rows allocated in keys and values */
  void *keys;      /* [cap, head_dim] session dtype */
  void *values;    /* [cap, head_dim] session dtype */
  uint64_t pending; /* rows a write in progress will add (write lock held) */
} kvs_shard;

/* The shards of one (layer, kv head), sorted by token_begin, non-overlapping. */
typedef struct kvs_head_shards {
  uint32_t first; /* index into session->shards */
  uint32_t count;
} kvs_head_shards;

typedef struct kvs_store kvs_store;

typedef struct kvs_session {
  uint8_t id[KVS_SESSION_ID_BYTES];
  kvs_geometry geo;
  kvs_store *store;
  atomic_int refs;
  pthread_rwlock_t lock;
  kvs_shard *shards;      /* [n_shards], sorted by (layer, kv_head, token_begin) */
  size_t n_shards;
  kvs_head_shards *heads; /* [n_layers * n_kv_heads] */
  atomic_uint_fast64_t bytes;  /* charged to the budget: metadata + KV capacity */
  atomic_uint_fast64_t tokens; /* rows filled over all shards */
  char client[64];
} kvs_session;

/* One write: n rows of (layer, kv_head) starting at token position token_begin. keys and values
 * are [n, head_dim] in the session dtype (any alignment). */
typedef struct kvs_rows {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t token_begin;
  uint64_t n;
  const void *keys;
  const void *values;
} kvs_rows;

int kvs_store_create(uint64_t budget_bytes, kvs_store **out, ra_error *err);
/* Frees every session; no session may be in use. */
void kvs_store_destroy(kvs_store *st);

uint64_t kvs_store_budget(const kvs_store *st);
uint64_t kvs_store_bytes_used(const kvs_store *st);
uint64_t kvs_store_sessions(kvs_store *st);
uint64_t kvs_store_tokens(const kvs_store *st);

/* Charges n bytes to the budget or fails with RA_ENOMEM ("would use X of budget Y"). */
int kvs_store_charge(kvs_store *st, uint64_t n, ra_error *err);
void kvs_store_uncharge(kvs_store *st, uint64_t n);

/* Checks a geometry and shard list; names what is wrong. */
int kvs_geometry_check(const kvs_geometry *g, ra_error *err);
int kvs_shards_check(const kvs_geometry *g, const kvs_shard_spec *shards, size_t n, ra_error *err);

/* Creates a session (its id from getrandom) and returns it with one reference held by the
 * caller, besides the registry's. */
int kvs_store_open(kvs_store *st, const kvs_geometry *g, const kvs_shard_spec *shards, size_t n,
                   const char *client, kvs_session **out, ra_error *err);
/* Looks a session up by id and takes a reference; RA_ENOTFOUND when there is none. */
int kvs_store_get(kvs_store *st, const uint8_t *id, size_t id_len, kvs_session **out,
                  ra_error *err);
/* Drops a reference; the last one frees the session and uncharges its bytes. */
void kvs_session_release(kvs_session *s);
/* Removes a session from the registry; its memory is freed once no attend uses it.
 * *bytes_freed gets the bytes it had charged. */
int kvs_store_close(kvs_store *st, const uint8_t *id, size_t id_len, uint64_t *bytes_freed,
                    ra_error *err);

/* Writes several row blocks atomically: every block is checked (in range, owned, starting
 * exactly where its shard's filled range ends, counting earlier blocks of the same call) and
 * room reserved before any row is copied, so on failure the session is unchanged. Takes the
 * session's write lock. *bytes_stored gets the key+value bytes written. */
int kvs_session_write(kvs_session *s, const kvs_rows *rows, size_t n_rows, uint64_t *bytes_stored,
                      ra_error *err);

/* The shards of (layer, kv_head); caller holds the read lock. Never NULL when count > 0. */
static inline const kvs_shard *kvs_session_head(const kvs_session *s, uint32_t layer,
                                                uint32_t kv_head, size_t *count) {
  const kvs_head_shards *h = &s->heads[(size_t)layer * s->geo.n_kv_heads + kv_head];
  *count = h->count;
  return s->shards + h->first;
}

static inline size_t kvs_row_bytes(const kvs_geometry *g) {
  return ra_dtype_size(g->dtype) * g->head_dim;
}

#endif
