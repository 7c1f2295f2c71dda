/* The background indexer (indexer.h): a FIFO of shards and a pool of threads, each taking one
 * shard at a time for one short batch of insertions and putting it back at the tail while rows
 * remain.
 *
 * Why a pool of plain threads: the decode's Append touches every (layer, kv head) at once (90
 * shards for SmolLM2, 256 for Llama-3-8B), each costing ~150-270 µs per roar index per row, so
 * one thread would trail the decode by tens of ms per token; the shards are independent, so N
 * threads catch up N times faster, as the OpenMP loop on the write path did. Not OpenMP: a team
 * per write would be started from whichever request thread wrote, whereas these threads outlive
 * requests, and a queue shared by all sessions lets one session's backlog and another's appends
 * proceed side by side. Batches rather than whole shards: a shard that received a large PutKv
 * after its build does not hold a thread (nor its ix_lock) for seconds while other shards wait.
 * (Attends never wait for a batch: they scan a shard being inserted into exactly, attend.c.)
 * Normal priority: with a lowered one a thread preempted while holding a shard's lock stalls
 * whatever needs that shard (bench/results/defaults/README.md). */
#include "indexer.h"

#include "log.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

/* How long a batch holds a shard's ix_lock: a few roar insertions (one at Llama-3-8B's head_dim
 * 128, ~1.5 ms). Meanwhile attends scan that shard exactly and a write that grows it or an
 * install waits; queued shards are served round robin in slices of this size. */
#define KVS_IX_BATCH_US 1000u
/* More threads than this would only contend for the same cores. */
#define KVS_IX_MAX_THREADS 256

struct kvs_indexer {
  pthread_mutex_t mu;
  pthread_cond_t work; /* queue filled, unpaused, or stopping */
  pthread_cond_t idle; /* some session's ix_busy reached 0 */
  kvs_shard *head, *tail;
  int paused;
  int stop;
  int want_threads;
  int n_threads; /* started */
  int warned;    /* a failed start is logged once */
  pthread_t *threads;
};

int kvs_indexer_create(kvs_indexer **out, ra_error *err) {
  kvs_indexer *q = calloc(1, sizeof *q);
  if (!q) return ra_errorf(err, RA_ENOMEM, "out of memory creating the indexer");
  if (pthread_mutex_init(&q->mu, NULL) != 0) {
    free(q);
    return ra_errorf(err, RA_EINTERNAL, "pthread_mutex_init failed");
  }
  if (pthread_cond_init(&q->work, NULL) != 0) {
    pthread_mutex_destroy(&q->mu);
    free(q);
    return ra_errorf(err, RA_EINTERNAL, "pthread_cond_init failed");
  }
  if (pthread_cond_init(&q->idle, NULL) != 0) {
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return ra_errorf(err, RA_EINTERNAL, "pthread_cond_init failed");
  }
  *out = q;
  return RA_OK;
}

static void push(kvs_indexer *q, kvs_shard *sh) {
  sh->ix_next = NULL;
  if (q->tail)
    q->tail->ix_next = sh;
  else
    q->head = sh;
  q->tail = sh;
}

static kvs_shard *pop(kvs_indexer *q) {
  kvs_shard *sh = q->head;
  q->head = sh->ix_next;
  if (!q->head) q->tail = NULL;
  sh->ix_next = NULL;
  return sh;
}

/* A shard of s leaves the indexer (mutex held): drops its reference, wakes drains at 0. */
static void shard_done(kvs_indexer *q, kvs_shard *sh) {
  kvs_session *s = sh->session;
  sh->ix_state = KVS_IX_IDLE;
  int idle = --s->ix_busy == 0;
  /* Never the last reference: a session is cancelled (which waits for this) before its
   * registry reference goes, so this cannot free it under the mutex. */
  kvs_session_release(s);
  if (idle) pthread_cond_broadcast(&q->idle);
}

static void *indexer_main(void *arg) {
  kvs_indexer *q = arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->stop && (q->paused || !q->head)) pthread_cond_wait(&q->work, &q->mu);
    if (q->stop) break;
    kvs_shard *sh = pop(q);
    sh->ix_state = KVS_IX_RUNNING;
    pthread_mutex_unlock(&q->mu);
    int more = kvs_shard_index_step(sh->session, sh, KVS_IX_BATCH_US);
    pthread_mutex_lock(&q->mu);
    if (!sh->session->ix_closing && (more || sh->ix_state == KVS_IX_RERUN)) {
      sh->ix_state = KVS_IX_QUEUED;
      push(q, sh); /* at the tail: other shards' batches come first */
    } else {
      shard_done(q, sh);
    }
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

/* Starts the threads on first use (mutex held). */
static int start_locked(kvs_indexer *q) {
  if (q->n_threads > 0) return RA_OK;
  int n = q->want_threads > 0 ? q->want_threads : omp_get_max_threads();
  if (n < 1) n = 1;
  if (n > KVS_IX_MAX_THREADS) n = KVS_IX_MAX_THREADS;
  if (!q->threads) q->threads = calloc((size_t)n, sizeof *q->threads);
  for (int i = 0; q->threads && i < n; i++) {
    if (pthread_create(&q->threads[q->n_threads], NULL, indexer_main, q) != 0) break;
    q->n_threads++;
  }
  if (q->n_threads > 0) return RA_OK;
  if (!q->warned) {
    q->warned = 1;
    ra_log_warn("cannot start the index insertion threads: written rows stay unindexed and are "
                "scanned exactly; retried on every write");
  }
  return RA_EINTERNAL;
}

void kvs_indexer_set_threads(kvs_indexer *q, int n) {
  pthread_mutex_lock(&q->mu);
  if (q->n_threads == 0) q->want_threads = n;
  pthread_mutex_unlock(&q->mu);
}

void kvs_indexer_enqueue(kvs_indexer *q, kvs_shard *const *shards, size_t n) {
  /* One critical section and one wake-up for the whole write: with a lock and a signal per
   * shard, the woken threads fought the writer for the mutex and a 256-shard Append took 3.7 ms
   * to return on 16 cores instead of 0.15. */
  size_t queued = 0;
  pthread_mutex_lock(&q->mu);
  for (size_t i = 0; i < n && !q->stop; i++) {
    kvs_shard *sh = shards[i];
    kvs_session *s = sh->session;
    if (s->ix_closing) continue;
    if (sh->ix_state == KVS_IX_RUNNING) {
      sh->ix_state = KVS_IX_RERUN;
    } else if (sh->ix_state == KVS_IX_IDLE && start_locked(q) == RA_OK) {
      sh->ix_state = KVS_IX_QUEUED;
      s->ix_busy++;
      atomic_fetch_add(&s->refs, 1); /* the writer holds one, so s is alive */
      push(q, sh);
      queued++;
    }
  }
  if (queued == 1)
    pthread_cond_signal(&q->work);
  else if (queued > 1)
    pthread_cond_broadcast(&q->work);
  pthread_mutex_unlock(&q->mu);
}

void kvs_indexer_cancel(kvs_indexer *q, kvs_session *s) {
  pthread_mutex_lock(&q->mu);
  s->ix_closing = 1;
  kvs_shard *prev = NULL, *sh = q->head;
  while (sh) {
    kvs_shard *next = sh->ix_next;
    if (sh->session == s) {
      if (prev)
        prev->ix_next = next;
      else
        q->head = next;
      if (q->tail == sh) q->tail = prev;
      sh->ix_next = NULL;
      shard_done(q, sh);
    } else {
      prev = sh;
    }
    sh = next;
  }
  /* A running batch ends within KVS_IX_BATCH_US (plus one insertion) and, s closing, drops s. */
  while (s->ix_busy > 0) pthread_cond_wait(&q->idle, &q->mu);
  pthread_mutex_unlock(&q->mu);
}

void kvs_indexer_drain(kvs_indexer *q, kvs_session *s) {
  pthread_mutex_lock(&q->mu);
  while (s->ix_busy > 0) pthread_cond_wait(&q->idle, &q->mu);
  pthread_mutex_unlock(&q->mu);
}

void kvs_indexer_pause(kvs_indexer *q, int paused) {
  pthread_mutex_lock(&q->mu);
  q->paused = paused;
  if (!paused) pthread_cond_broadcast(&q->work);
  pthread_mutex_unlock(&q->mu);
}

void kvs_indexer_destroy(kvs_indexer *q) {
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->stop = 1;
  pthread_cond_broadcast(&q->work);
  pthread_mutex_unlock(&q->mu);
  for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
  /* Every session was cancelled, so nothing is queued; a shard left by a caller that broke that
   * rule is dropped rather than leaked. */
  while (q->head) shard_done(q, pop(q));
  free(q->threads);
  pthread_cond_destroy(&q->idle);
  pthread_cond_destroy(&q->work);
  pthread_mutex_destroy(&q->mu);
  free(q);
}
