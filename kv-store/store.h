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
 * a reference count, so closing a session while an attend runs frees it when the attend ends.
 * A PutKv stream's rows are claimed under the write lock and copied after it (the shard is the
 * stream's alone until it commits, and nothing else moves it), so a session's streams copy side
 * by side.
 *
 * Indexes (store_index.c): a shard may hold search indexes (kv-store/index/index.h) over its
 * keys, ids = rows within the shard: per q head (one per q head of the shard's GQA group and
 * kind) or per kv head (one per kind, shared by the group's q heads). Attends in an index mode
 * search them. An index may lag its shard: rows [ra_index_count, n) are then scanned exactly by
 * attends (attend.c), so a stored row is always retrievable and an attend's result never depends
 * on how far insertion has got (for exact retrieval it is the same; a graph search sees the lag
 * exactly instead of through the graph).
 *
 * Insertion is not on the write path (indexer.c): a write stores its rows and queues the shards
 * it touched; the store's background indexer inserts them. Locks, always taken in this order:
 *   session lock   attends, snapshots: read; writes, index installs: write.
 *   shard ix_lock  guards the contents of the shard's indexes, its index table, and the keys
 *                  array's address: the indexer takes it for writing per short batch of
 *                  insertions (it never takes the session lock, so writes and attends of other
 *                  shards go on); attends try it for reading around one shard's search + lag
 *                  scan, and scan the shard exactly when it is taken, so an attend never waits
 *                  for the indexer; a write takes it for writing only to move (grow) the keys;
 *                  an install for writing to swap indexes.
 *   indexer mutex  the queue and the session / shard queue states below.
 * The indexer reads rows [0, n_stored) of the keys: a write fills rows past n_stored, then
 * publishes the new count (release), so the two never touch the same bytes. An insertion refused
 * by the budget (or out of memory) leaves the index lagging until a later write retries it.
 * Index bytes are charged like KV bytes, before they exist. */
#ifndef KVS_STORE_H
#define KVS_STORE_H

#include "gate.h"
#include "half.h"
#include "index.h"
#include "shardmap.h"
#include "status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

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

/* One index of a shard and the bytes charged for it (>= ra_index_bytes(ix)). */
typedef struct kvs_index {
  ra_index *ix;
  uint64_t bytes;
  uint64_t refused_at; /* n_stored when an insertion was last refused (0: none); the indexer
                          retries once more rows are written, as a write did before */
} kvs_index;

typedef struct kvs_shard {
  kvs_shard_spec spec; /* first: shards sort by their spec (store.c) */
  uint64_t n;      /* rows filled: tokens [token_begin, token_begin + n) */
  uint64_t cap;    /* rows allocated in values, and usable in keys */
  uint64_t keys_cap; /* rows allocated in keys: cap (more only after a failed growth's undo) */
  void *keys;      /* [cap, head_dim] session dtype */
  void *values;    /* [cap, head_dim] session dtype */
  uint64_t pending; /* rows a write in progress will add (write lock held) */
  /* Rows [n, n + staged) claimed and copied by an unfinished PutKv stream (stager): invisible to
   * attends, builds and the indexer until it commits; other writers of the shard are refused
   * meanwhile. */
  uint64_t staged;
  const struct kvs_stage *stager;
  /* NULL until the first index of this shard is installed; then
   * [RA_MODE_N_INDEXED][group_size + 1] (by ra_mode_index_slot): slot j < group_size is the index of the group's j-th q
   * head, slot group_size the kv head's shared one (kvs_shard_index). Set, and its slots
   * swapped, under the session write lock and ix_lock. */
  kvs_index *ix;
  pthread_rwlock_t ix_lock;       /* see the header comment */
  atomic_uint_fast64_t n_stored;  /* n as published to the indexer (release after the copy) */
  struct kvs_session *session;    /* the owner (the indexer's queue holds shards) */
  /* Indexer queue state (indexer mutex): KVS_IX_IDLE / QUEUED / RUNNING / RERUN. */
  int ix_state;
  struct kvs_shard *ix_next;
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
  atomic_uint_fast64_t last_used_ms; /* monotonic ms of the last request that looked it up */
  ra_index_spec index;         /* the session's index defaults (OpenSession) */
  struct kvs_clusters *clusters; /* wave mode's cluster directory (clusters.h); NULL: none */
  struct kvs_retro *retro;       /* recent steps' attended positions (retro.h) */
  char client[64];
  /* Persistence (journal.h): the session's journal with --data-dir (NULL: none), set once
   * after open; closed when the session is freed, its files removed when journal_discard is
   * set (the session was closed or expired, not the store shut down). */
  struct kvs_journal *journal;
  atomic_int journal_discard;
  char owner[96]; /* the credential that opened it (service.h kvs_caller); "": none */
  /* Indexer bookkeeping (indexer mutex): shards of this session queued or being indexed, and
   * whether it was closed (no more queuing). */
  size_t ix_busy;
  int ix_closing;
  /* Where the session's index work went, for the log line at its end (store.c): index searches,
   * those that scanned the shard exactly because the indexer held it, the time attends waited
   * for shards' index locks, the searches' wall and CPU time, and the rows the indexer inserted
   * and the wall and CPU time it took (a wall well above the CPU: threads waiting for cores). */
  atomic_uint_fast64_t n_searches, n_searches_exact, lock_wait_us, search_us, search_cpu_us;
  atomic_uint_fast64_t n_inserted, insert_us, insert_cpu_us;
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
/* Sessions, tokens and bytes of the sessions opened by `owner` (kvs_session.owner). */
void kvs_store_owner_totals(kvs_store *st, const char *owner, uint64_t *sessions, uint64_t *tokens,
                            uint64_t *bytes);

/* A session's name in logs: the first 4 bytes of its id in hex and "..": enough to follow one
 * session through a log, too little to use it (the id is its capability). */
#define KVS_SESSION_TAG_LEN 11
void kvs_session_tag(const uint8_t *id, char out[KVS_SESSION_TAG_LEN]);

/* Charges n bytes to the budget or fails with RA_ENOMEM ("would use X of budget Y"). */
int kvs_store_charge(kvs_store *st, uint64_t n, ra_error *err);
void kvs_store_uncharge(kvs_store *st, uint64_t n);
/* Turns a charge of `charged` bytes into one of `actual`: gives back the difference, or takes
 * the excess unconditionally when an up-front bound was low (memory that already exists must be
 * counted; the budget is then overshot by that excess). */
void kvs_store_settle(kvs_store *st, uint64_t charged, uint64_t actual);

/* Index search scratches shared by every attend of the store: one per thread of a running
 * attend, kept across requests so that a search in the steady state allocates nothing.
 * get returns NULL when out of memory. */
ra_index_scratch *kvs_store_scratch_get(kvs_store *st);
void kvs_store_scratch_put(kvs_store *st, ra_index_scratch *sc);

/* Checks a geometry and shard list; names what is wrong. */
int kvs_geometry_check(const kvs_geometry *g, ra_error *err);
int kvs_shards_check(const kvs_geometry *g, const kvs_shard_spec *shards, size_t n, ra_error *err);

/* Creates a session (its id from getrandom) and returns it with one reference held by the
 * caller, besides the registry's. index: the session's index defaults (NULL: none), as
 * ra_index_spec_check passed them (common/index_params.h; the service checks requests). */
int kvs_store_open(kvs_store *st, const kvs_geometry *g, const kvs_shard_spec *shards, size_t n,
                   const ra_index_spec *index, const char *client, kvs_session **out,
                   ra_error *err);
/* kvs_store_open with a given id (a session restored from its journal); RA_ESTATE when the
 * registry has it already. id NULL: a fresh one. */
int kvs_store_open_as(kvs_store *st, const uint8_t *id, const kvs_geometry *g, const kvs_shard_spec *shards,
                      size_t n, const ra_index_spec *index, const char *client, kvs_session **out, ra_error *err);
/* Looks a session up by id and takes a reference; RA_ENOTFOUND when there is none. */
int kvs_store_get(kvs_store *st, const uint8_t *id, size_t id_len, kvs_session **out,
                  ra_error *err);
/* Closes every session no request has looked up for more than idle_ms: the lease of a worker that
 * went away without closing. Requests in flight keep theirs until they end. Returns how many. */
size_t kvs_store_expire(kvs_store *st, uint64_t idle_ms);

/* Drops a reference; the last one frees the session and uncharges its bytes. */
void kvs_session_release(kvs_session *s);
/* Removes a session from the registry; its memory is freed once no attend uses it.
 * *bytes_freed gets the bytes it had charged. */
int kvs_store_close(kvs_store *st, const uint8_t *id, size_t id_len, uint64_t *bytes_freed,
                    ra_error *err);

/* Writes several row blocks atomically: every block is checked (in range, owned, starting
 * exactly where its shard's filled range ends, counting earlier blocks of the same call) and
 * room reserved before any row is copied, so on failure the session is unchanged. Takes the
 * session's write lock. *bytes_stored gets the key+value bytes written. Returns once the rows
 * are stored: the shards with indexes are queued for the background indexer, and attends scan
 * the rows exactly until it has inserted them. */
int kvs_session_write(kvs_session *s, const kvs_rows *rows, size_t n_rows, uint64_t *bytes_stored,
                      ra_error *err);

/* Copies rows [token_begin, token_begin + n) of (layer, kv_head), which must lie in one shard's
 * stored rows, into keys / values ([n, head_dim] session dtype each). Takes the read lock. */
int kvs_session_read(kvs_session *s, uint32_t layer, uint32_t kv_head, uint64_t token_begin, uint64_t n, void *keys,
                     void *values, ra_error *err);
/* A PutKv stream's writes, all or nothing: stage copies row blocks into their shards as
 * kvs_session_write does (same checks, same budget charge; the copy outside the session lock)
 * but leaves them invisible; commit
 * publishes every staged row at once, abort drops them (the shards' capacity stays charged to
 * the session, like any growth). The stage holds a reference to its session; every stage ends
 * with commit or abort. */
typedef struct kvs_stage {
  kvs_session *s;        /* NULL until the first stage */
  kvs_shard **shards;    /* [n] the shards with staged rows */
  size_t n, cap;
  uint64_t tokens;       /* staged rows */
} kvs_stage;

int kvs_session_stage(kvs_session *s, kvs_stage *st, const kvs_rows *rows, size_t n_rows,
                      uint64_t *bytes_staged, ra_error *err);
void kvs_stage_commit(kvs_stage *st);
void kvs_stage_abort(kvs_stage *st);

/* ---- the background indexer (indexer.c) ---- */

/* Threads of the store's indexer; takes effect when it starts (the first write to a shard with
 * an index). n < 1: omp_get_max_threads(). */
void kvs_store_set_index_threads(kvs_store *st, int n);
/* Rows written but not yet inserted, summed over every index of the session (an index refused
 * by the budget counts too). Takes each shard's ix_lock for reading. */
uint64_t kvs_session_index_lag(kvs_session *s);
/* Blocks until no shard of the session is queued or being indexed: every index has then caught
 * up with what was written before the call, or was refused (its rows stay lagging until a later
 * write). For tests and benchmarks: nothing in serving waits for insertion. Never returns while
 * the indexer is paused with work queued. */
void kvs_session_index_drain(kvs_session *s);
/* Test hook: paused, the indexer starts no batch (one running finishes), so the lag stays put
 * and a test can attend against it deterministically. Queued work resumes with paused = 0. */
void kvs_store_index_pause(kvs_store *st, int paused);

/* ---- indexes (store_index.c) ---- */

/* The build parameters of a request: req's set fields over the session's over the defaults
 * (both checked by ra_index_spec_check). RA_EINVAL when neither names a kind. */
int kvs_index_spec_resolve(const ra_index_spec *req, const ra_index_spec *session,
                           ra_index_params *out, int *per_kv_head, ra_error *err);

typedef struct kvs_build_args {
  uint32_t layer;
  uint32_t q_head;          /* with per_kv_head: any q head of the group names it */
  ra_index_params params;   /* resolved (kvs_index_spec_resolve) */
  int per_kv_head;
  const float *queries;     /* [n_queries, head_dim] prefill queries of the q head, or NULL */
  uint32_t n_queries;
  const uint64_t *knn;      /* [n_queries, knn_k] token positions, best first, or NULL */
  uint32_t knn_k;
  /* roar, optional: [n_key_rows, key_top_k] for the keys at positions key_pos_begin + i, their
   * best queries (indices into queries / knn), RA_INDEX_NO_QUERY padding (index.h) */
  const uint32_t *key_top_queries;
  uint32_t key_top_k;
  uint64_t key_pos_begin, n_key_rows;
  ra_gate *gate;            /* the store's build threads (NULL: params.n_threads, ungated) */
} kvs_build_args;

typedef struct kvs_build_result {
  uint64_t n_keys;      /* keys the new indexes answer for over the head's shards: the rows at
                           install, those written during the build included (still lagging) */
  uint64_t index_bytes; /* bytes the new indexes hold */
  uint64_t n_repaired;  /* graph keys the build linked by beam searches (connectivity repair) */
  uint32_t n_shards;
} kvs_build_result;

/* Builds the index of (layer, q head) — or of its kv head, shared — over every shard of the kv
 * head held here, one per shard, and installs them, replacing older ones of the same kind and
 * owner. roar takes prefill queries: vectors and/or knn lists of token positions, which are
 * mapped to each shard's rows (positions outside it are dropped, a query with fewer than 2 left
 * is skipped for that shard). Each build's peak (ra_index_estimate_bytes + a copy of the keys)
 * is charged before it runs and settled to the index's bytes after. Builds run on a copy of
 * each shard's keys taken under the read lock, so writes and attends go on meanwhile; the write
 * lock is taken only to install. Rows written during the build are left to the background
 * indexer (scanned exactly until then). All shards' indexes are installed together or none. */
int kvs_session_build_index(kvs_session *s, const kvs_build_args *a, kvs_build_result *out,
                            ra_error *err);

/* The index an attend of `kind` uses for q head q_head over shard sh: the q head's own, else the
 * kv head's shared one; NULL when there is none. Caller holds the read lock. */
const ra_index *kvs_shard_index(const kvs_session *s, const kvs_shard *sh, ra_mode kind,
                                uint32_t q_head);

/* One batch of the indexer on sh, holding sh->ix_lock for writing (and no other lock): inserts
 * rows [ra_index_count, n_stored) into sh's indexes until they have caught up or about budget_us
 * have passed (at least one row). An index whose insertion is refused (budget, memory) keeps the
 * rows it took and is skipped until more rows are written. Returns 1 when rows remain for a later
 * batch, 0 when none does (caught up, or refused). */
int kvs_shard_index_step(kvs_session *s, kvs_shard *sh, uint64_t budget_us);
/* Rows written to sh but not in its indexes, summed over them; takes sh->ix_lock for reading. */
uint64_t kvs_shard_index_lag(const kvs_session *s, kvs_shard *sh);
/* Frees a shard's indexes and uncharges them (session teardown). */
void kvs_shard_index_free(kvs_session *s, kvs_shard *sh);

/* A hold on one shard's indexes while they are searched and their lag scanned: the indexer
 * cannot change them meanwhile. timed: 1 when taken within max_us, 0 when the indexer kept it
 * (an attend then scans the shard exactly instead: it waits no longer than that scan would
 * take). ix_lock is the one field of a shard an attend changes, hence the casts from the const
 * view it reads shards through. */
static inline int kvs_shard_index_timed_read_lock(const kvs_shard *sh, uint64_t max_us) {
  if (pthread_rwlock_tryrdlock((pthread_rwlock_t *)&sh->ix_lock) == 0) return 1;
  if (max_us == 0) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)(max_us % 1000000u) * 1000L;
  ts.tv_sec += (time_t)(max_us / 1000000u) + ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  return pthread_rwlock_timedrdlock((pthread_rwlock_t *)&sh->ix_lock, &ts) == 0;
}
static inline void kvs_shard_index_read_lock(const kvs_shard *sh) {
  pthread_rwlock_rdlock((pthread_rwlock_t *)&sh->ix_lock);
}
static inline void kvs_shard_index_read_unlock(const kvs_shard *sh) {
  pthread_rwlock_unlock((pthread_rwlock_t *)&sh->ix_lock);
}

/* The shards of (layer, kv_head); caller holds the read lock. Never NULL when count > 0. */
static inline const kvs_shard *kvs_session_head(const kvs_session *s, uint32_t layer,
                                                uint32_t kv_head, size_t *count) {
  const kvs_head_shards *h = &s->heads[(size_t)layer * s->geo.n_kv_heads + kv_head];
  *count = h->count;
  return s->shards + h->first;
}

static inline size_t kvs_row_bytes(const kvs_geometry *g) {
  return ra_dtype_row_bytes(g->dtype, g->head_dim);
}

#endif
