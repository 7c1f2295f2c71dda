/* The session's indexes: parameter checks, BuildIndex (snapshot, build outside the lock,
 * install), the indexer's insertion batches, lag, lookup and teardown. See store.h for the model
 * and the locks. */
#include "store.h"
#include "hugemem.h"

#include "clock.h"
#include "indexer.h"
#include "log.h"

#include <omp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keys per build thread: below this a parallel region costs more than it saves (measured on
 * SmolLM2 shards: a 4K-key roar build is ~0.1 s on one core). */
#define BUILD_KEYS_PER_THREAD 4096u

static uint32_t group_size(const kvs_session *s) { return s->geo.n_q_heads / s->geo.n_kv_heads; }

static size_t table_len(const kvs_session *s) {
  return (size_t)RA_MODE_N_INDEXED * (group_size(s) + 1);
}

/* The slot of (kind, q head) in a shard's table; shared: the kv head's slot of that kind. */
static size_t slot_of(const kvs_session *s, ra_mode kind, uint32_t q_head, int shared) {
  uint32_t g = group_size(s);
  return (size_t)ra_mode_index_slot(kind) * (g + 1) + (shared ? g : q_head % g);
}

static void shard_range(const kvs_shard *sh, char *buf, size_t len) {
  if (sh->spec.token_end == RA_TOKEN_END_OPEN)
    snprintf(buf, len, "%llu-open", (unsigned long long)sh->spec.token_begin);
  else
    snprintf(buf, len, "%llu-%llu", (unsigned long long)sh->spec.token_begin,
             (unsigned long long)sh->spec.token_end);
}

int kvs_index_spec_resolve(const ra_index_spec *req, const ra_index_spec *session,
                           ra_index_params *out, int *per_kv_head, ra_error *err) {
  ra_mode kind = req->kind != RA_MODE_FULL ? req->kind : session->kind;
  if (kind == RA_MODE_FULL)
    return ra_errorf(err, RA_EINVAL,
                     "no index kind: neither the request's nor the session's IndexParams names one");
  ra_index_params_default(kind, out);
  /* 0 is unset: the request's value, else the session's, else the default. */
#define PICK_(name, type, lo, hi, modes, zero, flag, help) \
  if (req->name)                                         \
    out->name = req->name;                               \
  else if (session->name)                                \
    out->name = session->name;
  RA_INDEX_BUILD_PARAM_TABLE(PICK_)
#undef PICK_
  *per_kv_head = req->per_kv_head || session->per_kv_head;
  return RA_OK;
}

const ra_index *kvs_shard_index(const kvs_session *s, const kvs_shard *sh, ra_mode kind,
                                uint32_t q_head) {
  if (!sh->ix || !ra_mode_has_index(kind)) return NULL;
  const ra_index *own = sh->ix[slot_of(s, kind, q_head, 0)].ix;
  return own ? own : sh->ix[slot_of(s, kind, q_head, 1)].ix;
}

/* Makes x's charge `actual` bytes, on the store and in the session's count. */
static void index_settle(kvs_session *s, kvs_index *x, uint64_t actual) {
  kvs_store_settle(s->store, x->bytes, actual);
  if (actual < x->bytes)
    atomic_fetch_sub(&s->bytes, x->bytes - actual);
  else
    atomic_fetch_add(&s->bytes, actual - x->bytes);
  x->bytes = actual;
}

/* A bound of what one insertion can add to an index of `bytes` bytes and n keys: a graph's
 * capacity step (half its nodes, plus 64 nodes of the largest degree, 4 KiB each), an ivf list
 * doubling (at most 8 bytes per key), the insertion work's marks; plus slack. */
static uint64_t insert_margin(uint64_t bytes, uint64_t n) {
  return bytes / 2 + 8 * n + 64 * ((uint64_t)RA_INDEX_MAX_DEGREE * 4 + 64) + (64u << 10);
}

/* Inserts rows [ra_index_count, keys->n) into x, charging ahead of each insertion so that the
 * index never holds more than is charged; stops after the row during which deadline_us (a
 * ra_clock_now_us() time) passed. On failure x keeps the rows it took. sh's ix_lock held for writing. */
static int index_insert_rows(kvs_session *s, kvs_index *x, const ra_keys *keys,
                             uint64_t deadline_us, ra_error *err) {
  int rc = RA_OK;
  for (uint32_t id = ra_index_count(x->ix); id < keys->n; id++) {
    uint64_t have = ra_index_bytes(x->ix), need = have + insert_margin(have, id);
    if (x->bytes < need) {
      rc = kvs_store_charge(s->store, need - x->bytes, err);
      if (rc) break;
      atomic_fetch_add(&s->bytes, need - x->bytes);
      x->bytes = need;
    }
    rc = ra_index_insert(x->ix, keys, id, err);
    if (rc || ra_clock_now_us() >= deadline_us) break;
  }
  index_settle(s, x, ra_index_bytes(x->ix));
  return rc;
}

int kvs_shard_index_step(kvs_session *s, kvs_shard *sh, uint64_t budget_us) {
  int more = 0;
  pthread_rwlock_wrlock(&sh->ix_lock);
  /* Rows below n_stored are copied and stay put while ix_lock is held (store.h). */
  uint64_t n = atomic_load_explicit(&sh->n_stored, memory_order_acquire);
  ra_keys keys = {.rows = sh->keys, .dtype = s->geo.dtype, .dim = (int)s->geo.head_dim,
                  .n = (uint32_t)n};
  const uint64_t t0 = ra_clock_now_us(), c0 = ra_clock_thread_cpu_us(), deadline = t0 + budget_us;
  uint64_t inserted = 0;
  for (size_t i = 0; sh->ix && i < table_len(s); i++) {
    kvs_index *x = &sh->ix[i];
    if (!x->ix || ra_index_count(x->ix) >= n || x->refused_at == n) continue;
    const uint32_t had = ra_index_count(x->ix);
    if (ra_clock_now_us() >= deadline) {
      more = 1;
      break;
    }
    ra_error err;
    if (index_insert_rows(s, x, &keys, deadline, &err) != RA_OK) {
      x->refused_at = n;
      char range[64];
      shard_range(sh, range, sizeof range);
      ra_log_warn("layer %u kv head %u shard %s: %s index lags by %llu rows (scanned exactly "
                  "until a later write retries): %s",
                  sh->spec.layer, sh->spec.kv_head, range,
                  ra_mode_name(ra_index_get_kind(x->ix)),
                  (unsigned long long)(n - ra_index_count(x->ix)), err.msg);
    } else if (ra_index_count(x->ix) < n) {
      more = 1;
    }
    inserted += ra_index_count(x->ix) - had;
  }
  pthread_rwlock_unlock(&sh->ix_lock);
  if (inserted) {
    atomic_fetch_add(&s->n_inserted, inserted);
    atomic_fetch_add(&s->insert_us, ra_clock_now_us() - t0);
    atomic_fetch_add(&s->insert_cpu_us, ra_clock_thread_cpu_us() - c0);
  }
  return more;
}

uint64_t kvs_shard_index_lag(const kvs_session *s, kvs_shard *sh) {
  uint64_t lag = 0;
  pthread_rwlock_rdlock(&sh->ix_lock);
  uint64_t n = atomic_load_explicit(&sh->n_stored, memory_order_acquire);
  for (size_t i = 0; sh->ix && i < table_len(s); i++)
    if (sh->ix[i].ix) lag += n - ra_index_count(sh->ix[i].ix);
  pthread_rwlock_unlock(&sh->ix_lock);
  return lag;
}

uint64_t kvs_session_index_lag(kvs_session *s) {
  uint64_t lag = 0;
  for (size_t i = 0; i < s->n_shards; i++) lag += kvs_shard_index_lag(s, &s->shards[i]);
  return lag;
}

static void index_drop(kvs_session *s, kvs_index *x) {
  if (!x->ix) return;
  ra_index_free(x->ix);
  kvs_store_uncharge(s->store, x->bytes);
  atomic_fetch_sub(&s->bytes, x->bytes);
  x->ix = NULL;
  x->bytes = 0;
  x->refused_at = 0;
}

void kvs_shard_index_free(kvs_session *s, kvs_shard *sh) {
  if (!sh->ix) return;
  for (size_t i = 0; i < table_len(s); i++) index_drop(s, &sh->ix[i]);
  free(sh->ix);
  sh->ix = NULL;
  uint64_t table = table_len(s) * sizeof(kvs_index);
  kvs_store_uncharge(s->store, table);
  atomic_fetch_sub(&s->bytes, table);
}

/* ---- BuildIndex ---- */

/* One shard's build: what was snapshot and the index built from it. */
typedef struct shard_build {
  kvs_shard *sh;
  uint64_t n_snap;  /* rows the index was built over */
  void *copy;       /* [n_snap, head_dim] the keys at the snapshot */
  float *q;         /* [nq, head_dim] queries kept for this shard, or NULL */
  uint32_t *knn;    /* [nq, knn_k] their lists as rows of this shard, or NULL */
  uint32_t *key_top;/* [n_snap, key_top_k] the rows' best queries, renumbered as kept, or NULL */
  uint32_t nq;
  uint64_t charged; /* bytes charged to the store for this build */
  ra_index *ix;
} shard_build;

static void build_release(kvs_session *s, shard_build *b) {
  ra_huge_free(b->copy, b->n_snap * kvs_row_bytes(&s->geo));
  free(b->q);
  free(b->knn);
  free(b->key_top);
  b->copy = NULL;
  b->q = NULL;
  b->knn = NULL;
  b->key_top = NULL;
  ra_index_free(b->ix);
  b->ix = NULL;
  kvs_store_uncharge(s->store, b->charged);
  b->charged = 0;
}

/* Copies the shard's filled keys under the read lock, charging the copy first. */
static int build_snapshot(kvs_session *s, shard_build *b, ra_error *err) {
  size_t rb = kvs_row_bytes(&s->geo);
  pthread_rwlock_rdlock(&s->lock);
  b->n_snap = b->sh->n;
  uint64_t bytes = b->n_snap * rb;
  int rc = kvs_store_charge(s->store, bytes, err);
  if (rc == RA_OK) {
    b->charged += bytes;
    b->copy = ra_huge_alloc(bytes); /* the build's walks read it at random, as a search */
    if (b->copy && bytes)
      memcpy(b->copy, b->sh->keys, bytes);
    else if (!b->copy)
      rc = ra_errorf(err, RA_ENOMEM, "out of memory copying %llu keys",
                     (unsigned long long)b->n_snap);
  }
  pthread_rwlock_unlock(&s->lock);
  return rc;
}

/* The key -> query lists of a shard's snapshot rows (kvs_build_args.key_top_queries): the row at
 * position lo + r takes the request's row for that position, its queries renumbered as the
 * shard kept them (kept[], RA_INDEX_NO_QUERY for a query the shard dropped); a row the request
 * does not cover is all padding, and the index links that key the old way. Charged like the
 * knn lists. */
static int key_lists_for_shard(kvs_session *s, const kvs_build_args *a, shard_build *b, const uint32_t *kept,
                               ra_queries *out, ra_error *err) {
  const uint32_t t = a->key_top_k;
  const uint64_t bytes = b->n_snap * t * 4;
  int rc = kvs_store_charge(s->store, bytes, err);
  if (rc) return rc;
  b->charged += bytes;
  b->key_top = malloc((size_t)b->n_snap * t * sizeof *b->key_top + 1);
  if (!b->key_top) return ra_errorf(err, RA_ENOMEM, "out of memory for %llu key lists", (unsigned long long)b->n_snap);
  const uint64_t lo = b->sh->spec.token_begin;
  for (uint64_t r = 0; r < b->n_snap; r++) {
    uint32_t *row = b->key_top + r * t;
    const uint64_t pos = lo + r;
    const int covered = pos >= a->key_pos_begin && pos - a->key_pos_begin < a->n_key_rows;
    for (uint32_t u = 0; u < t; u++) {
      const uint32_t j = covered ? a->key_top_queries[(pos - a->key_pos_begin) * t + u] : RA_INDEX_NO_QUERY;
      row[u] = j == RA_INDEX_NO_QUERY ? RA_INDEX_NO_QUERY : kept[j];
    }
  }
  out->key_top_queries = b->key_top;
  out->key_top_k = t;
  return RA_OK;
}

/* The roar queries of one shard: knn token positions become rows of the snapshot (positions
 * outside it dropped); a query left with fewer than 2 is skipped; a shorter list is padded with
 * its last row (projection ignores repeats) since the index takes rectangular lists. The first
 * ids of a list inside the shard are the shard's exact top ids, so nothing else changes. With
 * no knn lists, or none reaching the shard, the vectors alone are used (the index computes the
 * lists). */
static int build_queries(kvs_session *s, const kvs_build_args *a, shard_build *b,
                         ra_queries *out, ra_error *err) {
  const size_t dim = s->geo.head_dim;
  memset(out, 0, sizeof *out);
  if (b->n_snap <= 1) return RA_OK; /* a graph of 0 or 1 keys learns nothing from queries */
  if (a->knn) {
    uint64_t bytes = (uint64_t)a->n_queries * ((uint64_t)a->knn_k * 4 + (a->queries ? dim * 4 : 0));
    int rc = kvs_store_charge(s->store, bytes, err);
    if (rc) return rc;
    b->charged += bytes;
    b->knn = malloc(((size_t)a->n_queries * a->knn_k + 1) * sizeof *b->knn);
    if (a->queries) b->q = malloc(((size_t)a->n_queries * dim + 1) * sizeof *b->q);
    if (!b->knn || (a->queries && !b->q))
      return ra_errorf(err, RA_ENOMEM, "out of memory mapping %u knn lists", a->n_queries);
    uint64_t lo = b->sh->spec.token_begin, hi = lo + b->n_snap;
    /* kept[i]: query i's number among the shard's kept queries (the key lists name those) */
    uint32_t *kept = a->key_top_queries ? malloc(((size_t)a->n_queries + 1) * sizeof *kept) : NULL;
    if (a->key_top_queries && !kept) return ra_errorf(err, RA_ENOMEM, "out of memory mapping the key lists");
    for (uint32_t i = 0; i < a->n_queries; i++) {
      uint32_t *row = b->knn + (size_t)b->nq * a->knn_k, c = 0;
      if (kept) kept[i] = RA_INDEX_NO_QUERY;
      for (uint32_t j = 0; j < a->knn_k; j++) {
        uint64_t t = a->knn[(size_t)i * a->knn_k + j];
        if (t >= lo && t < hi) row[c++] = (uint32_t)(t - lo);
      }
      if (c < 2) continue;
      for (uint32_t j = c; j < a->knn_k; j++) row[j] = row[c - 1];
      if (b->q) memcpy(b->q + (size_t)b->nq * dim, a->queries + (size_t)i * dim, dim * 4);
      if (kept) kept[i] = b->nq;
      b->nq++;
    }
    if (b->nq > 0) {
      *out = (ra_queries){.q = b->q, .n = b->nq, .knn = b->knn, .knn_k = a->knn_k};
      rc = kept ? key_lists_for_shard(s, a, b, kept, out, err) : RA_OK;
      free(kept);
      return rc;
    }
    free(kept);
    if (!a->queries) {
      char range[64];
      shard_range(b->sh, range, sizeof range);
      return ra_errorf(err, RA_EINVAL,
                       "roar: no query has 2 knn ids among the %llu tokens of shard %s of layer "
                       "%u kv head %u (ids outside a shard are dropped)",
                       (unsigned long long)b->n_snap, range, b->sh->spec.layer,
                       b->sh->spec.kv_head);
    }
  }
  *out = (ra_queries){.q = a->queries, .n = a->n_queries};
  return RA_OK;
}

/* The threads a build of n keys is worth: one per BUILD_KEYS_PER_THREAD, up to the request's
 * n_threads (0: OpenMP's default) and the gate's capacity. */
static int build_threads_want(const kvs_build_args *a, uint64_t n) {
  int max_t = a->params.n_threads > 0 ? a->params.n_threads : omp_get_max_threads();
  if (a->gate && a->gate->capacity < max_t) max_t = a->gate->capacity;
  uint64_t want = (n + BUILD_KEYS_PER_THREAD - 1) / BUILD_KEYS_PER_THREAD;
  return want < 1 ? 1 : want > (uint64_t)max_t ? max_t : (int)want;
}

/* joined: what the build told the gate it wants (kvs_session_build_index). */
static int build_one(kvs_session *s, const kvs_build_args *a, int joined, shard_build *b,
                     ra_error *err) {
  int rc = build_snapshot(s, b, err);
  if (rc) return rc;
  ra_queries qs, *qp = NULL;
  if (a->params.kind == RA_MODE_ROAR) {
    if ((rc = build_queries(s, a, b, &qs, err))) return rc;
    if (qs.n > 0) qp = &qs;
  }
  const int dim = (int)s->geo.head_dim;
  /* Threads by size, and no more than the build's share of the gate among the builds that
   * arrived with it (ra_gate_share): one build on 8 threads of the H200 host used them at ~49 %
   * (5.5 CPU-s in 1.4 s: its setup, CSR and entry phases are serial), so a layer's 4 builds
   * taking all 8 each, one after another, left half the cores idle; side by side on 2 each
   * their serial phases overlap the others' parallel ones (build-bench measures it). */
  ra_index_params p = a->params;
  int threads = build_threads_want(a, b->n_snap);
  if (a->gate) {
    int share = ra_gate_share(a->gate, joined);
    if (share < threads) threads = share;
    threads = ra_gate_acquire_some(a->gate, threads);
  }
  p.n_threads = threads;
  uint64_t est = ra_index_estimate_bytes(&p, (uint32_t)b->n_snap, dim, qp ? qp->n : 0);
  rc = kvs_store_charge(s->store, est, err);
  if (rc == RA_OK) {
    b->charged += est;
    ra_keys keys = {.rows = b->copy, .dtype = s->geo.dtype, .dim = dim, .n = (uint32_t)b->n_snap};
    rc = ra_index_build(&p, &keys, qp, &b->ix, err);
  }
  if (a->gate) ra_gate_release(a->gate, threads);
  ra_huge_free(b->copy, b->n_snap * kvs_row_bytes(&s->geo));
  free(b->q);
  free(b->knn);
  free(b->key_top);
  b->copy = NULL;
  b->q = NULL;
  b->knn = NULL;
  b->key_top = NULL;
  if (rc) return rc;
  /* The temporaries are gone: keep only the index's own bytes charged. */
  uint64_t bytes = ra_index_bytes(b->ix);
  kvs_store_settle(s->store, b->charged, bytes);
  b->charged = bytes;
  return RA_OK;
}

int kvs_session_build_index(kvs_session *s, const kvs_build_args *a, kvs_build_result *out,
                            ra_error *err) {
  const kvs_geometry *g = &s->geo;
  memset(out, 0, sizeof *out);
  if (a->layer >= g->n_layers)
    return ra_errorf(err, RA_EINVAL, "layer %u out of range [0, %u)", a->layer, g->n_layers);
  if (a->q_head >= g->n_q_heads)
    return ra_errorf(err, RA_EINVAL, "q head %u out of range [0, %u)", a->q_head, g->n_q_heads);
  if (!ra_mode_has_index(a->params.kind))
    return ra_errorf(err, RA_EINVAL, "index kind %s has no index", ra_mode_name(a->params.kind));
  if (a->params.kind == RA_MODE_ROAR && !a->queries && !a->knn)
    return ra_errorf(err, RA_EINVAL,
                     "a roar index needs the q head's prefill queries: send queries and/or "
                     "knn_ids");
  if (a->knn && a->knn_k < 2)
    return ra_errorf(err, RA_EINVAL, "knn lists of %u ids: a roar index needs at least 2",
                     a->knn_k);
  const uint32_t kv = a->q_head / group_size(s);
  /* The shard layout never changes after open, so it can be read without the lock. */
  size_t count;
  kvs_shard *sh = (kvs_shard *)kvs_session_head(s, a->layer, kv, &count);
  if (count == 0)
    return ra_errorf(err, RA_EINVAL, "q head %u (kv head %u) of layer %u is not stored here",
                     a->q_head, kv, a->layer);
  shard_build *b = calloc(count, sizeof *b);
  if (!b) return ra_errorf(err, RA_ENOMEM, "out of memory planning %zu shard builds", count);
  /* Joined from arrival, before the snapshots, so that builds arriving together see each other
   * when they take their threads; wanting what the largest shard is worth now. */
  int joined = 0;
  if (a->gate) {
    uint64_t most = 0;
    for (size_t i = 0; i < count; i++) {
      uint64_t n = atomic_load(&sh[i].n_stored);
      if (n > most) most = n;
    }
    joined = build_threads_want(a, most);
    ra_gate_join(a->gate, joined);
  }
  int rc = RA_OK;
  for (size_t i = 0; i < count && rc == RA_OK; i++) {
    b[i].sh = &sh[i];
    rc = build_one(s, a, joined, &b[i], err);
  }
  if (a->gate) ra_gate_leave(a->gate, joined);
  if (rc) {
    ra_error_wrap(err, "building the %s index of layer %u q head %u",
                  ra_mode_name(a->params.kind), a->layer, a->q_head);
    goto fail;
  }

  /* Install: every missing table first (all shards or none), then swap each index in. */
  const uint64_t table = table_len(s) * sizeof(kvs_index);
  pthread_rwlock_wrlock(&s->lock);
  for (size_t i = 0; i < count && rc == RA_OK; i++) {
    if (sh[i].ix) continue;
    rc = kvs_store_charge(s->store, table, err);
    if (rc == RA_OK) {
      kvs_index *t = calloc(table_len(s), sizeof(kvs_index));
      if (t) {
        /* ix_lock too: the indexer and kvs_shard_index_lag read the table under it alone. */
        pthread_rwlock_wrlock(&sh[i].ix_lock);
        sh[i].ix = t;
        pthread_rwlock_unlock(&sh[i].ix_lock);
        atomic_fetch_add(&s->bytes, table);
      } else {
        kvs_store_uncharge(s->store, table);
        rc = ra_errorf(err, RA_ENOMEM, "out of memory for an index table");
      }
    }
  }
  if (rc) {
    pthread_rwlock_unlock(&s->lock);
    ra_error_wrap(err, "installing the %s index of layer %u q head %u",
                  ra_mode_name(a->params.kind), a->layer, a->q_head);
    goto fail;
  }
  for (size_t i = 0; i < count; i++) {
    /* ix_lock: a batch of the indexer on the old index ends before it is freed. */
    pthread_rwlock_wrlock(&sh[i].ix_lock);
    kvs_index *x = &sh[i].ix[slot_of(s, a->params.kind, a->q_head, a->per_kv_head)];
    index_drop(s, x);
    x->ix = b[i].ix;
    x->bytes = b[i].charged;
    x->refused_at = 0;
    atomic_fetch_add(&s->bytes, x->bytes);
    b[i].ix = NULL;
    b[i].charged = 0;
    int lags = ra_index_count(x->ix) < sh[i].n;
    out->n_keys += sh[i].n;
    out->index_bytes += ra_index_bytes(x->ix);
    ra_index_graph_stats gs = {0};
    ra_index_get_graph_stats(x->ix, &gs);
    out->n_repaired += gs.n_repaired;
    pthread_rwlock_unlock(&sh[i].ix_lock);
    /* Rows written during the build go to the indexer like any write's (scanned exactly until
     * then), so the install holds the write lock only for the swap. */
    if (lags) {
      kvs_shard *one = &sh[i];
      kvs_indexer_enqueue(kvs_store_indexer(s->store), &one, 1);
    }
  }
  pthread_rwlock_unlock(&s->lock);
  out->n_shards = (uint32_t)count;
  free(b);
  return RA_OK;
fail:
  for (size_t i = 0; i < count; i++) build_release(s, &b[i]);
  free(b);
  return rc;
}
