#include "gate.h"

#include "status.h"

int ra_gate_init(ra_gate *g, int capacity) {
  if (capacity < 1) return RA_EINVAL;
  if (pthread_mutex_init(&g->mu, NULL) != 0) return RA_ENOMEM;
  if (pthread_cond_init(&g->cv, NULL) != 0) {
    pthread_mutex_destroy(&g->mu);
    return RA_ENOMEM;
  }
  g->capacity = capacity;
  g->free = capacity;
  g->next_ticket = 0;
  g->serving = 0;
  g->joined = 0;
  g->joined_want = 0;
  return RA_OK;
}

void ra_gate_destroy(ra_gate *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

/* Waits for the caller's turn and for all of want free (all) or at least 1, then takes up to
 * want. */
static int take(ra_gate *g, int want, int all) {
  if (want < 1) want = 1;
  if (want > g->capacity) want = g->capacity;
  const int least = all ? want : 1;
  pthread_mutex_lock(&g->mu);
  uint64_t ticket = g->next_ticket++;
  while (ticket != g->serving || g->free < least) pthread_cond_wait(&g->cv, &g->mu);
  const int took = g->free < want ? g->free : want;
  g->free -= took;
  g->serving++;
  /* The next ticket may fit in what is left. */
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  return took;
}

int ra_gate_acquire(ra_gate *g, int want) { return take(g, want, 1); }

int ra_gate_acquire_some(ra_gate *g, int want) { return take(g, want, 0); }

void ra_gate_release(ra_gate *g, int n) {
  pthread_mutex_lock(&g->mu);
  g->free += n;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static int clamp_want(const ra_gate *g, int want) {
  return want < 1 ? 1 : want > g->capacity ? g->capacity : want;
}

void ra_gate_join(ra_gate *g, int want) {
  pthread_mutex_lock(&g->mu);
  g->joined++;
  g->joined_want += clamp_want(g, want);
  pthread_mutex_unlock(&g->mu);
}

void ra_gate_leave(ra_gate *g, int want) {
  pthread_mutex_lock(&g->mu);
  g->joined--;
  g->joined_want -= clamp_want(g, want);
  pthread_mutex_unlock(&g->mu);
}

int ra_gate_share(ra_gate *g, int want) {
  want = clamp_want(g, want);
  pthread_mutex_lock(&g->mu);
  int64_t total = g->joined_want;
  pthread_mutex_unlock(&g->mu);
  if (total <= g->capacity) return want;
  /* rounded up: rounded down, four builds of a layer on 7 units got 1 each and left 3 idle (a
   * store with --threads 7 took 1.4x as long over a 128K prefill); ra_gate_acquire_some lets
   * the last of them take the 1 unit that is left instead of waiting for its 2 */
  int64_t s = ((int64_t)want * g->capacity + total - 1) / total;
  return s < 1 ? 1 : (int)s;
}
