#include "store.h"

#include "clock.h"
#include "clusters.h"
#include "hugemem.h"
#include "indexer.h"
#include "journal.h"
#include "log.h"
#include "retro.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct kvs_store {
  pthread_mutex_t mu;      /* guards sessions[] and every session's registry reference */
  kvs_session **sessions;  /* sorted by id */
  size_t n_sessions;
  size_t cap_sessions;
  uint64_t budget;
  atomic_uint_fast64_t used;
  atomic_uint_fast64_t tokens;
  pthread_mutex_t scratch_mu; /* guards the free scratches */
  ra_index_scratch **scratch; /* [n_scratch] free for the next attend thread */
  size_t n_scratch;
  size_t cap_scratch;
  kvs_indexer *indexer; /* inserts written rows into the shards' indexes (indexer.c) */
};

/* Shards grow by 1/8 of their capacity (at least this many rows), so an open shard's slack is
 * bounded by ~12% of what it holds; large blocks are mremap'ed by realloc, so growth is cheap. */
#define KVS_GROW_MIN_ROWS 64u
/* A session's shard list is indexed by uint32. */
#define KVS_MAX_SHARDS (1u << 24)

int kvs_store_create(uint64_t budget_bytes, kvs_store **out, ra_error *err) {
  kvs_store *st = calloc(1, sizeof *st);
  if (!st) return ra_errorf(err, RA_ENOMEM, "out of memory creating the store");
  if (pthread_mutex_init(&st->mu, NULL) != 0) {
    free(st);
    return ra_errorf(err, RA_EINTERNAL, "pthread_mutex_init failed");
  }
  if (pthread_mutex_init(&st->scratch_mu, NULL) != 0) {
    pthread_mutex_destroy(&st->mu);
    free(st);
    return ra_errorf(err, RA_EINTERNAL, "pthread_mutex_init failed");
  }
  int rc = kvs_indexer_create(&st->indexer, err);
  if (rc) {
    pthread_mutex_destroy(&st->scratch_mu);
    pthread_mutex_destroy(&st->mu);
    free(st);
    return rc;
  }
  st->budget = budget_bytes;
  atomic_init(&st->used, 0);
  atomic_init(&st->tokens, 0);
  *out = st;
  return RA_OK;
}

static void session_free(kvs_session *s) {
  kvs_store *st = s->store;
  uint64_t n_search = atomic_load(&s->n_searches), n_ins = atomic_load(&s->n_inserted);
  char name[sizeof s->client * 4];
  if (n_search || n_ins)
    ra_log_info("session by '%s' ends: %llu index searches (%llu scanned exactly, the index busy; "
                "%.0f us wall, %.0f us CPU each), %.1f ms waiting for index locks; %llu rows "
                "inserted in %.1f ms (%.0f us wall, %.0f us CPU each)",
                ra_log_escape(s->client, strlen(s->client), name, sizeof name), (unsigned long long)n_search,
                (unsigned long long)atomic_load(&s->n_searches_exact),
                n_search ? (double)atomic_load(&s->search_us) / (double)n_search : 0.0,
                n_search ? (double)atomic_load(&s->search_cpu_us) / (double)n_search : 0.0,
                (double)atomic_load(&s->lock_wait_us) / 1e3, (unsigned long long)n_ins,
                (double)atomic_load(&s->insert_us) / 1e3,
                n_ins ? (double)atomic_load(&s->insert_us) / (double)n_ins : 0.0,
                n_ins ? (double)atomic_load(&s->insert_cpu_us) / (double)n_ins : 0.0);
  for (size_t i = 0; i < s->n_shards; i++) {
    kvs_shard_index_free(s, &s->shards[i]);
    pthread_rwlock_destroy(&s->shards[i].ix_lock);
    const size_t rb = kvs_row_bytes(&s->geo);
    ra_huge_free(s->shards[i].keys, s->shards[i].keys_cap * rb);
    ra_huge_free(s->shards[i].values, s->shards[i].cap * rb);
  }
  kvs_clusters_free(s->clusters);
  kvs_retro_free(s->retro);
  kvs_journal_close(s->journal, atomic_load(&s->journal_discard));
  free(s->shards);
  free(s->heads);
  pthread_rwlock_destroy(&s->lock);
  atomic_fetch_sub(&st->tokens, atomic_load(&s->tokens));
  kvs_store_uncharge(st, atomic_load(&s->bytes));
  free(s);
}

/* A session left the registry: the indexer lets go of it, then the registry's reference goes. */
static void session_unregistered(kvs_store *st, kvs_session *s) {
  kvs_indexer_cancel(st->indexer, s);
  kvs_session_release(s);
}

void kvs_store_destroy(kvs_store *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n_sessions; i++) session_unregistered(st, st->sessions[i]);
  kvs_indexer_destroy(st->indexer);
  free(st->sessions);
  for (size_t i = 0; i < st->n_scratch; i++) {
    ra_index_scratch_free(st->scratch[i]);
    free(st->scratch[i]);
  }
  free(st->scratch);
  pthread_mutex_destroy(&st->scratch_mu);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

uint64_t kvs_store_budget(const kvs_store *st) { return st->budget; }
uint64_t kvs_store_bytes_used(const kvs_store *st) {
  return atomic_load(&((kvs_store *)st)->used);
}
uint64_t kvs_store_tokens(const kvs_store *st) { return atomic_load(&((kvs_store *)st)->tokens); }

uint64_t kvs_store_sessions(kvs_store *st) {
  pthread_mutex_lock(&st->mu);
  uint64_t n = st->n_sessions;
  pthread_mutex_unlock(&st->mu);
  return n;
}

void kvs_store_owner_totals(kvs_store *st, const char *owner, uint64_t *sessions, uint64_t *tokens,
                            uint64_t *bytes) {
  *sessions = *tokens = *bytes = 0;
  pthread_mutex_lock(&st->mu);
  for (size_t i = 0; i < st->n_sessions; i++) {
    const kvs_session *s = st->sessions[i];
    if (strcmp(s->owner, owner) != 0) continue;
    (*sessions)++;
    *tokens += atomic_load(&s->tokens);
    *bytes += atomic_load(&s->bytes);
  }
  pthread_mutex_unlock(&st->mu);
}

void kvs_session_tag(const uint8_t *id, char out[KVS_SESSION_TAG_LEN]) {
  snprintf(out, KVS_SESSION_TAG_LEN, "%02x%02x%02x%02x..", id[0], id[1], id[2], id[3]);
}

int kvs_store_charge(kvs_store *st, uint64_t n, ra_error *err) {
  uint_fast64_t cur = atomic_load(&st->used);
  for (;;) {
    if (n > st->budget || cur > st->budget - n)
      return ra_errorf(err, RA_ENOMEM,
                       "memory budget exceeded: %llu more bytes would use %llu of budget %llu",
                       (unsigned long long)n, (unsigned long long)(cur + n),
                       (unsigned long long)st->budget);
    if (atomic_compare_exchange_weak(&st->used, &cur, cur + n)) return RA_OK;
  }
}

void kvs_store_uncharge(kvs_store *st, uint64_t n) { atomic_fetch_sub(&st->used, n); }

kvs_indexer *kvs_store_indexer(kvs_store *st) { return st->indexer; }
void kvs_store_set_index_threads(kvs_store *st, int n) { kvs_indexer_set_threads(st->indexer, n); }
void kvs_store_index_pause(kvs_store *st, int paused) { kvs_indexer_pause(st->indexer, paused); }
void kvs_session_index_drain(kvs_session *s) { kvs_indexer_drain(s->store->indexer, s); }

void kvs_store_settle(kvs_store *st, uint64_t charged, uint64_t actual) {
  if (actual < charged)
    atomic_fetch_sub(&st->used, charged - actual);
  else
    atomic_fetch_add(&st->used, actual - charged);
}

ra_index_scratch *kvs_store_scratch_get(kvs_store *st) {
  ra_index_scratch *sc = NULL;
  pthread_mutex_lock(&st->scratch_mu);
  if (st->n_scratch > 0) sc = st->scratch[--st->n_scratch];
  pthread_mutex_unlock(&st->scratch_mu);
  /* A zeroed scratch is valid: the first search sizes it for its index. */
  return sc ? sc : calloc(1, sizeof *sc);
}

void kvs_store_scratch_put(kvs_store *st, ra_index_scratch *sc) {
  if (!sc) return;
  pthread_mutex_lock(&st->scratch_mu);
  if (st->n_scratch == st->cap_scratch) {
    size_t cap = st->cap_scratch ? st->cap_scratch * 2 : 16;
    ra_index_scratch **a = realloc(st->scratch, cap * sizeof *a);
    if (a) {
      st->scratch = a;
      st->cap_scratch = cap;
    }
  }
  if (st->n_scratch < st->cap_scratch) {
    st->scratch[st->n_scratch++] = sc;
    sc = NULL;
  }
  pthread_mutex_unlock(&st->scratch_mu);
  if (sc) {
    /* No room to keep it: the next attend allocates a fresh one. */
    ra_index_scratch_free(sc);
    free(sc);
  }
}

int kvs_geometry_check(const kvs_geometry *g, ra_error *err) {
  if (g->n_layers == 0 || g->n_layers > KVS_MAX_LAYERS)
    return ra_errorf(err, RA_EINVAL, "n_layers %u out of range [1, %u]", g->n_layers,
                     KVS_MAX_LAYERS);
  if (g->n_kv_heads == 0 || g->n_kv_heads > KVS_MAX_KV_HEADS)
    return ra_errorf(err, RA_EINVAL, "n_kv_heads %u out of range [1, %u]", g->n_kv_heads,
                     KVS_MAX_KV_HEADS);
  if (g->n_q_heads == 0 || g->n_q_heads > KVS_MAX_Q_HEADS)
    return ra_errorf(err, RA_EINVAL, "n_q_heads %u out of range [1, %u]", g->n_q_heads,
                     KVS_MAX_Q_HEADS);
  if (g->n_q_heads % g->n_kv_heads != 0)
    return ra_errorf(err, RA_EINVAL, "n_q_heads %u is not a multiple of n_kv_heads %u",
                     g->n_q_heads, g->n_kv_heads);
  if (g->head_dim == 0 || g->head_dim > KVS_MAX_HEAD_DIM)
    return ra_errorf(err, RA_EINVAL, "head_dim %u out of range [1, %u]", g->head_dim,
                     KVS_MAX_HEAD_DIM);
  if (ra_dtype_row_bytes(g->dtype, 1) == 0)
    return ra_errorf(err, RA_EINVAL, "dtype %d is not f32, f16, bf16 or int8", (int)g->dtype);
  return RA_OK;
}

static int spec_cmp(const void *a, const void *b) {
  const kvs_shard_spec *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->kv_head != y->kv_head) return x->kv_head < y->kv_head ? -1 : 1;
  if (x->token_begin != y->token_begin) return x->token_begin < y->token_begin ? -1 : 1;
  return 0;
}

static void format_range(char *buf, size_t len, uint64_t begin, uint64_t end) {
  if (end == RA_TOKEN_END_OPEN)
    snprintf(buf, len, "[%llu, open)", (unsigned long long)begin);
  else
    snprintf(buf, len, "[%llu, %llu)", (unsigned long long)begin, (unsigned long long)end);
}

/* Checks a sorted shard list for overlaps within each (layer, kv head). */
static int shards_check_sorted(const kvs_shard_spec *s, size_t n, ra_error *err) {
  for (size_t i = 1; i < n; i++) {
    const kvs_shard_spec *a = &s[i - 1], *b = &s[i];
    if (a->layer != b->layer || a->kv_head != b->kv_head) continue;
    if (a->token_end == RA_TOKEN_END_OPEN || a->token_end > b->token_begin) {
      char ra[64], rb[64];
      format_range(ra, sizeof ra, a->token_begin, a->token_end);
      format_range(rb, sizeof rb, b->token_begin, b->token_end);
      return ra_errorf(err, RA_EINVAL, "shards %s and %s of layer %u kv head %u overlap", ra, rb,
                       a->layer, a->kv_head);
    }
  }
  return RA_OK;
}

int kvs_shards_check(const kvs_geometry *g, const kvs_shard_spec *shards, size_t n,
                     ra_error *err) {
  if (n == 0) return ra_errorf(err, RA_EINVAL, "a session needs at least one shard");
  if (n > KVS_MAX_SHARDS)
    return ra_errorf(err, RA_EINVAL, "%zu shards is more than the limit %u", n, KVS_MAX_SHARDS);
  for (size_t i = 0; i < n; i++) {
    const kvs_shard_spec *s = &shards[i];
    if (s->layer >= g->n_layers)
      return ra_errorf(err, RA_EINVAL, "shard %zu: layer %u out of range [0, %u)", i, s->layer,
                       g->n_layers);
    if (s->kv_head >= g->n_kv_heads)
      return ra_errorf(err, RA_EINVAL, "shard %zu: kv head %u out of range [0, %u)", i,
                       s->kv_head, g->n_kv_heads);
    if (s->token_end != RA_TOKEN_END_OPEN && s->token_end <= s->token_begin)
      return ra_errorf(err, RA_EINVAL, "shard %zu: token range [%llu, %llu) is empty", i,
                       (unsigned long long)s->token_begin, (unsigned long long)s->token_end);
  }
  kvs_shard_spec *sorted = malloc(n * sizeof *sorted);
  if (!sorted) return ra_errorf(err, RA_ENOMEM, "out of memory checking %zu shards", n);
  memcpy(sorted, shards, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, spec_cmp);
  int rc = shards_check_sorted(sorted, n, err);
  free(sorted);
  return rc;
}

/* Index of the first session whose id is >= id. */
static size_t registry_lower_bound(const kvs_store *st, const uint8_t *id) {
  size_t lo = 0, hi = st->n_sessions;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (memcmp(st->sessions[mid]->id, id, KVS_SESSION_ID_BYTES) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int registry_find(const kvs_store *st, const uint8_t *id, size_t *at) {
  size_t i = registry_lower_bound(st, id);
  *at = i;
  return i < st->n_sessions && memcmp(st->sessions[i]->id, id, KVS_SESSION_ID_BYTES) == 0;
}

static int random_id(uint8_t id[KVS_SESSION_ID_BYTES], ra_error *err) {
  size_t got = 0;
  while (got < KVS_SESSION_ID_BYTES) {
    ssize_t r = getrandom(id + got, KVS_SESSION_ID_BYTES - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ra_errorf(err, RA_EINTERNAL, "getrandom: %s", strerror(errno));
    }
    got += (size_t)r;
  }
  return RA_OK;
}

/* Inserts s with a fresh id not already in the registry, or with `id` when given. Registry
 * mutex held. */
static int registry_insert(kvs_store *st, kvs_session *s, const uint8_t *id, ra_error *err) {
  if (st->n_sessions == st->cap_sessions) {
    size_t cap = st->cap_sessions ? st->cap_sessions * 2 : 16;
    kvs_session **a = realloc(st->sessions, cap * sizeof *a);
    if (!a) return ra_errorf(err, RA_ENOMEM, "out of memory growing the session registry");
    st->sessions = a;
    st->cap_sessions = cap;
  }
  size_t at;
  if (id) {
    memcpy(s->id, id, KVS_SESSION_ID_BYTES);
    if (registry_find(st, s->id, &at)) return ra_errorf(err, RA_ESTATE, "a session with that id exists");
  } else {
    do {
      int rc = random_id(s->id, err);
      if (rc) return rc;
    } while (registry_find(st, s->id, &at));
  }
  memmove(&st->sessions[at + 1], &st->sessions[at], (st->n_sessions - at) * sizeof *st->sessions);
  st->sessions[at] = s;
  st->n_sessions++;
  return RA_OK;
}

/* The shards' ix_locks prefer writers: searches of a shard overlapping back to back (many
 * threads, many sessions' requests) could otherwise keep the indexer out of it indefinitely
 * (the lag then only grows); with the preference a waiting indexer makes new attends scan that
 * shard exactly until it is in. No thread holds two ix_locks, so a waiting writer cannot
 * deadlock readers. *done: locks initialized. */
static int shard_locks_init(kvs_shard *sh, size_t n, size_t *done) {
  pthread_rwlockattr_t attr;
  if (pthread_rwlockattr_init(&attr) != 0) return RA_EINTERNAL;
#ifdef __GLIBC__
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
  size_t i = 0;
  while (i < n && pthread_rwlock_init(&sh[i].ix_lock, &attr) == 0) i++;
  *done = i;
  pthread_rwlockattr_destroy(&attr);
  return i == n ? RA_OK : RA_EINTERNAL;
}

/* The retro records' growth, charged to the session like its shards (given back by
 * kvs_retro_free before the session's bytes are). */
static int retro_charge(void *ctx, int64_t delta, ra_error *err) {
  kvs_session *s = ctx;
  if (delta < 0) {
    kvs_store_uncharge(s->store, (uint64_t)-delta);
    atomic_fetch_sub(&s->bytes, (uint64_t)-delta);
    return RA_OK;
  }
  int rc = kvs_store_charge(s->store, (uint64_t)delta, err);
  if (rc == RA_OK) atomic_fetch_add(&s->bytes, (uint64_t)delta);
  return rc;
}

int kvs_store_open(kvs_store *st, const kvs_geometry *g, const kvs_shard_spec *shards, size_t n,
                   const ra_index_spec *index, const char *client, kvs_session **out,
                   ra_error *err) {
  return kvs_store_open_as(st, NULL, g, shards, n, index, client, out, err);
}

int kvs_store_open_as(kvs_store *st, const uint8_t *id, const kvs_geometry *g, const kvs_shard_spec *shards,
                      size_t n, const ra_index_spec *index, const char *client, kvs_session **out, ra_error *err) {
  int rc = kvs_geometry_check(g, err);
  if (rc) return rc;
  rc = kvs_shards_check(g, shards, n, err);
  if (rc) return rc;

  size_t n_heads = (size_t)g->n_layers * g->n_kv_heads;
  uint64_t meta = sizeof(kvs_session) + n * sizeof(kvs_shard) + n_heads * sizeof(kvs_head_shards) +
                  kvs_retro_table_bytes(g->n_layers, g->n_q_heads);
  rc = kvs_store_charge(st, meta, err);
  if (rc) return ra_error_wrap(err, "opening a session");

  kvs_session *s = calloc(1, sizeof *s);
  kvs_shard *sh = calloc(n, sizeof *sh);
  kvs_head_shards *heads = calloc(n_heads, sizeof *heads);
  if (s && kvs_retro_new(g->n_layers, g->n_q_heads, retro_charge, s, &s->retro, err) != RA_OK) s->retro = NULL;
  if (!s || !sh || !heads || !s->retro) {
    if (s) kvs_retro_free(s->retro);
    free(s);
    free(sh);
    free(heads);
    kvs_store_uncharge(st, meta);
    return ra_errorf(err, RA_ENOMEM, "out of memory opening a session");
  }
  if (pthread_rwlock_init(&s->lock, NULL) != 0) {
    kvs_retro_free(s->retro);
    free(s);
    free(sh);
    free(heads);
    kvs_store_uncharge(st, meta);
    return ra_errorf(err, RA_EINTERNAL, "pthread_rwlock_init failed");
  }
  for (size_t i = 0; i < n; i++) sh[i].spec = shards[i];
  /* kvs_shard starts with its spec, so the spec order sorts shards. */
  qsort(sh, n, sizeof *sh, spec_cmp);
  /* The locks after the sort: an initialized lock must not move. */
  size_t locked = 0;
  rc = shard_locks_init(sh, n, &locked);
  if (rc) {
    for (size_t i = 0; i < locked; i++) pthread_rwlock_destroy(&sh[i].ix_lock);
    pthread_rwlock_destroy(&s->lock);
    kvs_retro_free(s->retro);
    free(s);
    free(sh);
    free(heads);
    kvs_store_uncharge(st, meta);
    return ra_errorf(err, RA_EINTERNAL, "pthread_rwlock_init failed");
  }
  for (size_t i = 0; i < n; i++) {
    sh[i].session = s;
    atomic_init(&sh[i].n_stored, 0);
  }
  for (size_t i = 0; i < n; i++) {
    kvs_head_shards *h = &heads[(size_t)sh[i].spec.layer * g->n_kv_heads + sh[i].spec.kv_head];
    if (h->count == 0) h->first = (uint32_t)i;
    h->count++;
  }
  s->geo = *g;
  s->store = st;
  s->shards = sh;
  s->n_shards = n;
  s->heads = heads;
  atomic_init(&s->refs, 2); /* the registry's and the caller's */
  atomic_init(&s->bytes, meta);
  atomic_init(&s->tokens, 0);
  atomic_init(&s->last_used_ms, (ra_clock_now_us() / 1000u));
  if (index) s->index = *index;
  snprintf(s->client, sizeof s->client, "%s", client ? client : "");

  pthread_mutex_lock(&st->mu);
  rc = registry_insert(st, s, id, err);
  pthread_mutex_unlock(&st->mu);
  if (rc) {
    atomic_store(&s->refs, 1);
    kvs_session_release(s);
    return rc;
  }
  *out = s;
  return RA_OK;
}

static int check_id_len(size_t id_len, ra_error *err) {
  if (id_len != KVS_SESSION_ID_BYTES)
    return ra_errorf(err, RA_EINVAL, "session id is %zu bytes, want %d", id_len,
                     KVS_SESSION_ID_BYTES);
  return RA_OK;
}

int kvs_store_get(kvs_store *st, const uint8_t *id, size_t id_len, kvs_session **out,
                  ra_error *err) {
  int rc = check_id_len(id_len, err);
  if (rc) return rc;
  size_t at;
  pthread_mutex_lock(&st->mu);
  int found = registry_find(st, id, &at);
  if (found) {
    *out = st->sessions[at];
    atomic_fetch_add(&(*out)->refs, 1);
    atomic_store(&(*out)->last_used_ms, (ra_clock_now_us() / 1000u));
  }
  pthread_mutex_unlock(&st->mu);
  if (!found) return ra_errorf(err, RA_ENOTFOUND, "no session with that id (closed, expired or never opened)");
  return RA_OK;
}

size_t kvs_store_expire(kvs_store *st, uint64_t idle_ms) {
  uint64_t now = (ra_clock_now_us() / 1000u);
  size_t n_expired = 0, kept = 0;
  kvs_session **expired = NULL;
  pthread_mutex_lock(&st->mu);
  expired = malloc((st->n_sessions ? st->n_sessions : 1) * sizeof *expired);
  for (size_t i = 0; expired && i < st->n_sessions; i++) {
    kvs_session *s = st->sessions[i];
    if (now - atomic_load(&s->last_used_ms) > idle_ms) expired[n_expired++] = s;
    else st->sessions[kept++] = s; /* keeps the id order */
  }
  if (expired) st->n_sessions = kept;
  pthread_mutex_unlock(&st->mu);
  for (size_t i = 0; i < n_expired; i++) {
    kvs_session *s = expired[i];
    atomic_store(&s->journal_discard, 1);
    char tag[KVS_SESSION_TAG_LEN], name[sizeof s->client * 4];
    kvs_session_tag(s->id, tag);
    ra_log_info("session %s of '%s' expired after %llu ms idle: %llu bytes freed", tag,
                ra_log_escape(s->client, strlen(s->client), name, sizeof name), (unsigned long long)idle_ms,
                (unsigned long long)atomic_load(&s->bytes));
    session_unregistered(st, s);
  }
  free(expired);
  return n_expired;
}

void kvs_session_release(kvs_session *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) session_free(s);
}

int kvs_store_close(kvs_store *st, const uint8_t *id, size_t id_len, uint64_t *bytes_freed,
                    ra_error *err) {
  int rc = check_id_len(id_len, err);
  if (rc) return rc;
  size_t at;
  kvs_session *s = NULL;
  pthread_mutex_lock(&st->mu);
  if (registry_find(st, id, &at)) {
    s = st->sessions[at];
    memmove(&st->sessions[at], &st->sessions[at + 1],
            (st->n_sessions - at - 1) * sizeof *st->sessions);
    st->n_sessions--;
  }
  pthread_mutex_unlock(&st->mu);
  if (!s) return ra_errorf(err, RA_ENOTFOUND, "no session with that id (closed or never opened)");
  atomic_store(&s->journal_discard, 1);
  /* After the indexer has let go, so that its last batch's index growth is counted. */
  kvs_indexer_cancel(st->indexer, s);
  if (bytes_freed) *bytes_freed = atomic_load(&s->bytes);
  kvs_session_release(s);
  return RA_OK;
}

/* ---- writes ---- */

/* The shard of (layer, kv_head) whose range contains token, or NULL. */
static kvs_shard *shard_containing(kvs_session *s, uint32_t layer, uint32_t kv_head,
                                   uint64_t token) {
  size_t count;
  kvs_shard *sh = (kvs_shard *)kvs_session_head(s, layer, kv_head, &count);
  size_t lo = 0, hi = count; /* first shard with token_begin > token */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (sh[mid].spec.token_begin <= token)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return NULL;
  kvs_shard *c = &sh[lo - 1];
  if (c->spec.token_end != RA_TOKEN_END_OPEN && token >= c->spec.token_end) return NULL;
  return c;
}

int kvs_session_read(kvs_session *s, uint32_t layer, uint32_t kv_head, uint64_t token_begin, uint64_t n, void *keys,
                     void *values, ra_error *err) {
  if (layer >= s->geo.n_layers || kv_head >= s->geo.n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "read: layer %u kv head %u out of range", layer, kv_head);
  pthread_rwlock_rdlock(&s->lock);
  const kvs_shard *sh = shard_containing(s, layer, kv_head, token_begin);
  int rc = RA_OK;
  if (!sh || n == 0 || token_begin + n > sh->spec.token_begin + sh->n || token_begin + n < token_begin) {
    rc = ra_errorf(err, RA_EINVAL, "read: tokens %llu-%llu of layer %u kv head %u are not stored here",
                   (unsigned long long)token_begin, (unsigned long long)(token_begin + n), layer, kv_head);
  } else {
    size_t rb = kvs_row_bytes(&s->geo), at = (size_t)(token_begin - sh->spec.token_begin) * rb;
    memcpy(keys, (const uint8_t *)sh->keys + at, (size_t)n * rb);
    memcpy(values, (const uint8_t *)sh->values + at, (size_t)n * rb);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

static uint64_t head_rows(kvs_session *s, uint32_t layer, uint32_t kv_head) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(s, layer, kv_head, &count);
  uint64_t total = 0;
  for (size_t i = 0; i < count; i++) total += sh[i].n + sh[i].staged + sh[i].pending;
  return total;
}

/* Checks one block against the session as it will be after the blocks before it. */
static int rows_check(kvs_session *s, const kvs_rows *r, size_t i, const kvs_stage *stage,
                      kvs_shard **out, ra_error *err) {
  const kvs_geometry *g = &s->geo;
  if (r->layer >= g->n_layers)
    return ra_errorf(err, RA_EINVAL, "chunk %zu: layer %u out of range [0, %u)", i, r->layer,
                     g->n_layers);
  if (r->kv_head >= g->n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "chunk %zu: kv head %u out of range [0, %u)", i, r->kv_head,
                     g->n_kv_heads);
  if (r->n == 0) return ra_errorf(err, RA_EINVAL, "chunk %zu: n_tokens is 0", i);
  if (r->n >= UINT64_MAX || r->token_begin > UINT64_MAX - 1 - r->n)
    return ra_errorf(err, RA_EINVAL, "chunk %zu: token range overflows", i);
  uint64_t b = r->token_begin, e = r->token_begin + r->n;
  size_t count;
  kvs_session_head(s, r->layer, r->kv_head, &count);
  if (count == 0)
    return ra_errorf(err, RA_EINVAL, "chunk %zu: layer %u kv head %u has no shard in this session",
                     i, r->layer, r->kv_head);
  kvs_shard *sh = shard_containing(s, r->layer, r->kv_head, b);
  if (!sh)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: tokens [%llu, %llu) of layer %u kv head %u are not in a shard of "
                     "this session",
                     i, (unsigned long long)b, (unsigned long long)e, r->layer, r->kv_head);
  if (sh->stager && sh->stager != stage)
    return ra_errorf(err, RA_ESTATE,
                     "chunk %zu: layer %u kv head %u tokens from %llu are being written by an unfinished "
                     "PutKv stream",
                     i, r->layer, r->kv_head, (unsigned long long)(sh->spec.token_begin + sh->n));
  uint64_t filled = sh->spec.token_begin + sh->n + sh->staged + sh->pending;
  if (b < filled)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: overlap: tokens [%llu, %llu) of layer %u kv head %u overlap "
                     "tokens [%llu, %llu) already stored",
                     i, (unsigned long long)b, (unsigned long long)e, r->layer, r->kv_head,
                     (unsigned long long)sh->spec.token_begin, (unsigned long long)filled);
  if (b > filled)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: hole: tokens [%llu, %llu) of layer %u kv head %u start at %llu "
                     "but the shard is filled up to %llu",
                     i, (unsigned long long)b, (unsigned long long)e, r->layer, r->kv_head,
                     (unsigned long long)b, (unsigned long long)filled);
  if (sh->spec.token_end != RA_TOKEN_END_OPEN && e > sh->spec.token_end)
    return ra_errorf(err, RA_EINVAL,
                     "chunk %zu: tokens [%llu, %llu) of layer %u kv head %u run past the shard's "
                     "end %llu",
                     i, (unsigned long long)b, (unsigned long long)e, r->layer, r->kv_head,
                     (unsigned long long)sh->spec.token_end);
  if (head_rows(s, r->layer, r->kv_head) + r->n > KVS_MAX_ROWS_PER_HEAD)
    return ra_errorf(err, RA_EINVAL, "chunk %zu: layer %u kv head %u would hold more than %llu tokens",
                     i, r->layer, r->kv_head, (unsigned long long)KVS_MAX_ROWS_PER_HEAD);
  /* int8 rows carry their scale: a NaN or negative one would be a silently wrong attend */
  for (int kv = 0; kv < 2; kv++) {
    const char *rows = kv ? r->values : r->keys;
    size_t bad;
    if (ra_dtype_rows_check(g->dtype, rows, r->n, g->head_dim, &bad))
      return ra_errorf(err, RA_EINVAL,
                       "chunk %zu: the %s of token %llu (layer %u kv head %u) has int8 scale %g, "
                       "want finite and >= 0",
                       i, kv ? "value" : "key", (unsigned long long)(b + bad), r->layer, r->kv_head,
                       (double)ra_i8_row_scale(rows + bad * kvs_row_bytes(g), g->head_dim));
  }
  *out = sh;
  return RA_OK;
}

/* Makes room for sh->n + sh->pending rows, charging the budget first. */
static int shard_reserve(kvs_session *s, kvs_shard *sh, ra_error *err) {
  uint64_t need = sh->n + sh->staged + sh->pending;
  if (need <= sh->cap) return RA_OK;
  uint64_t cap = sh->cap + sh->cap / 8;
  if (cap < sh->cap + KVS_GROW_MIN_ROWS) cap = sh->cap + KVS_GROW_MIN_ROWS;
  if (cap < need) cap = need;
  if (sh->spec.token_end != RA_TOKEN_END_OPEN) {
    uint64_t bound = sh->spec.token_end - sh->spec.token_begin;
    if (cap > bound) cap = bound;
  }
  size_t rb = kvs_row_bytes(&s->geo);
  if (cap > SIZE_MAX / 2 / rb)
    return ra_errorf(err, RA_ENOMEM, "%llu rows of %zu bytes do not fit in memory",
                     (unsigned long long)cap, rb);
  uint64_t delta = (cap - sh->cap) * rb * 2;
  int rc = kvs_store_charge(s->store, delta, err);
  if (rc && cap > need) {
    /* Near the budget the growth slack is what does not fit: take exactly what is needed. */
    cap = need;
    delta = (cap - sh->cap) * rb * 2;
    rc = kvs_store_charge(s->store, delta, err);
  }
  if (rc) return rc;
  /* The indexer reads the keys under ix_lock alone (it never takes the session lock), so moving
   * them waits for its batch on this shard; growth is rare (1/8 of the shard at a time). */
  pthread_rwlock_wrlock(&sh->ix_lock);
  /* On huge pages (hugemem.h), which growing keeps. */
  void *k = sh->keys;
  if (cap > sh->keys_cap && (k = ra_huge_realloc(sh->keys, sh->keys_cap * rb, cap * rb))) {
    sh->keys = k;
    sh->keys_cap = cap;
  }
  void *v = k ? ra_huge_realloc(sh->values, sh->cap * rb, cap * rb) : NULL;
  if (k && !v && sh->keys_cap > sh->cap) {
    /* Back to the old size, so that the charge stays exact; should shrinking fail, the larger
     * block is kept (keys_cap says so) and serves the next growth. */
    void *shrunk = ra_huge_realloc(sh->keys, sh->keys_cap * rb, sh->cap * rb);
    if (shrunk) {
      sh->keys = shrunk;
      sh->keys_cap = sh->cap;
    }
  }
  pthread_rwlock_unlock(&sh->ix_lock);
  if (!v) {
    kvs_store_uncharge(s->store, delta);
    return ra_errorf(err, RA_ENOMEM, "out of memory growing a shard to %llu rows",
                     (unsigned long long)cap);
  }
  sh->values = v;
  sh->cap = cap;
  atomic_fetch_add(&s->bytes, delta);
  return RA_OK;
}

/* Rows of a shard become visible: to attends (n, under the write lock), to the indexer
 * (n_stored, after the copy) and to the session's counts. */
static void shard_publish(kvs_session *s, kvs_shard *sh, uint64_t rows) {
  sh->n += rows;
  atomic_store_explicit(&sh->n_stored, sh->n, memory_order_release);
  atomic_fetch_add(&s->tokens, rows);
  atomic_fetch_add(&s->store->tokens, rows);
}

static int stage_add_shard(kvs_stage *st, kvs_shard *sh) {
  for (size_t i = 0; i < st->n; i++)
    if (st->shards[i] == sh) return RA_OK;
  if (st->n == st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 16;
    kvs_shard **p = realloc(st->shards, cap * sizeof *p);
    if (!p) return RA_ENOMEM;
    st->shards = p;
    st->cap = cap;
  }
  st->shards[st->n++] = sh;
  return RA_OK;
}

/* kvs_session_write (stage NULL: published at once) and kvs_session_stage. */
/* Where one chunk's rows go in its shard. */
typedef struct kvs_copy {
  void *keys, *values;
} kvs_copy;

static int session_write(kvs_session *s, kvs_stage *stage, const kvs_rows *rows, size_t n_rows,
                         uint64_t *bytes_stored, ra_error *err) {
  if (n_rows == 0) return ra_errorf(err, RA_EINVAL, "no chunks to store");
  if (stage && stage->s && stage->s != s)
    return ra_errorf(err, RA_EINVAL, "a PutKv stream writes one session; this chunk names another");
  kvs_shard **target = malloc(n_rows * sizeof *target);
  kvs_copy *copies = stage ? malloc(n_rows * sizeof *copies) : NULL; /* where a stage's rows go */
  if (!target || (stage && !copies)) {
    free(target);
    free(copies);
    return ra_errorf(err, RA_ENOMEM, "out of memory planning %zu chunks", n_rows);
  }
  size_t rb = kvs_row_bytes(&s->geo);
  int rc = RA_OK;
  size_t checked = 0;

  pthread_rwlock_wrlock(&s->lock);
  for (; checked < n_rows; checked++) {
    rc = rows_check(s, &rows[checked], checked, stage, &target[checked], err);
    if (rc) break;
    target[checked]->pending += rows[checked].n;
  }
  for (size_t i = 0; rc == RA_OK && i < n_rows; i++) rc = shard_reserve(s, target[i], err);
  for (size_t i = 0; rc == RA_OK && stage && i < n_rows; i++)
    if (stage_add_shard(stage, target[i]) != RA_OK) rc = ra_errorf(err, RA_ENOMEM, "out of memory staging chunks");
  if (rc) {
    for (size_t i = 0; i < checked; i++) target[i]->pending = 0;
    pthread_rwlock_unlock(&s->lock);
    free(copies);
    free(target);
    return rc;
  }
  uint64_t total = 0;
  /* A stage's rows are claimed here and copied after the lock: the shard is its stager's alone
   * (other writers are refused, so nothing grows or moves it), its staged rows are invisible
   * until the stream commits, and the stream copies before it commits. PutKv streams of one
   * session then copy, and fault in their shards' fresh pages, side by side. */
  for (size_t i = 0; i < n_rows; i++) {
    kvs_shard *sh = target[i];
    size_t bytes = rows[i].n * rb, at = (size_t)(sh->n + sh->staged) * rb;
    sh->pending -= rows[i].n;
    total += rows[i].n;
    if (stage) {
      copies[i] = (kvs_copy){(char *)sh->keys + at, (char *)sh->values + at};
      sh->staged += rows[i].n;
      sh->stager = stage;
    } else {
      memcpy((char *)sh->keys + at, rows[i].keys, bytes);
      memcpy((char *)sh->values + at, rows[i].values, bytes);
      shard_publish(s, sh, rows[i].n);
    }
  }
  if (stage) {
    if (!stage->s) {
      stage->s = s;
      atomic_fetch_add(&s->refs, 1);
    }
    stage->tokens += total;
  } else {
    /* Insertion is the indexer's (store.h): until it gets there attends scan the new rows
     * exactly, so the write returns now and never fails half done. A shard named twice is
     * queued once. */
    size_t n_ix = 0;
    for (size_t i = 0; i < n_rows; i++)
      if (target[i]->ix) target[n_ix++] = target[i];
    kvs_indexer_enqueue(s->store->indexer, target, n_ix);
  }
  pthread_rwlock_unlock(&s->lock);
  for (size_t i = 0; stage && i < n_rows; i++) {
    memcpy(copies[i].keys, rows[i].keys, rows[i].n * rb);
    memcpy(copies[i].values, rows[i].values, rows[i].n * rb);
  }
  free(copies);
  free(target);
  if (bytes_stored) *bytes_stored = total * rb * 2;
  return RA_OK;
}

int kvs_session_write(kvs_session *s, const kvs_rows *rows, size_t n_rows, uint64_t *bytes_stored,
                      ra_error *err) {
  return session_write(s, NULL, rows, n_rows, bytes_stored, err);
}

int kvs_session_stage(kvs_session *s, kvs_stage *st, const kvs_rows *rows, size_t n_rows,
                      uint64_t *bytes_staged, ra_error *err) {
  return session_write(s, st, rows, n_rows, bytes_staged, err);
}

/* Ends a stage: publish 1 makes its rows visible, 0 drops them. */
static void stage_end(kvs_stage *st, int publish) {
  kvs_session *s = st->s;
  if (s) {
    pthread_rwlock_wrlock(&s->lock);
    size_t n_ix = 0;
    for (size_t i = 0; i < st->n; i++) {
      kvs_shard *sh = st->shards[i];
      if (publish) shard_publish(s, sh, sh->staged);
      sh->staged = 0;
      sh->stager = NULL;
      if (publish && sh->ix) st->shards[n_ix++] = sh;
    }
    kvs_indexer_enqueue(s->store->indexer, st->shards, n_ix);
    pthread_rwlock_unlock(&s->lock);
    kvs_session_release(s);
  }
  free(st->shards);
  memset(st, 0, sizeof *st);
}

void kvs_stage_commit(kvs_stage *st) { stage_end(st, 1); }
void kvs_stage_abort(kvs_stage *st) { stage_end(st, 0); }
