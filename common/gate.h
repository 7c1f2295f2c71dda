/* A weighted, first-come-first-served counting semaphore: a pool of `capacity` units (a
 * process's CPU threads) that callers take several at a time.
 *
 * Why: a kv-store serves many BuildIndex calls at once (a worker starts all heads of a layer
 * together) and every build is an OpenMP team. Unbounded, n concurrent builds of T threads each
 * put n*T spinning threads on T cores and the store crawls; serialized, small builds leave most
 * cores idle. The gate hands each build the threads its size is worth and makes the next one
 * wait until they are back, so concurrent builds share the cores exactly.
 *
 * FIFO: a waiter is served only when every earlier one has been, so a large request is not
 * starved by a stream of small ones (a small one behind it waits instead). */
#ifndef RA_GATE_H
#define RA_GATE_H

#include <pthread.h>
#include <stdint.h>

typedef struct ra_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int capacity;
  int free;
  uint64_t next_ticket; /* handed to the next arrival */
  uint64_t serving;     /* the ticket that may take units now */
  int joined;           /* callers between ra_gate_join and ra_gate_leave */
  int64_t joined_want;  /* the sum of their wants (each clamped to [1, capacity]) */
} ra_gate;

/* capacity >= 1. 0, RA_EINVAL or RA_ENOMEM. */
int ra_gate_init(ra_gate *g, int capacity);
void ra_gate_destroy(ra_gate *g);

/* Blocks until it is this caller's turn and min(want, capacity) units are free, takes them and
 * returns how many (>= 1; want < 1 counts as 1). */
int ra_gate_acquire(ra_gate *g, int want);
/* The same, but once it is this caller's turn it takes what is free, at least 1 and at most
 * want, instead of waiting for all of want: for callers whose work scales with the units they get
 * (an index build's OpenMP team), so that rounded-up shares fill the capacity. */
int ra_gate_acquire_some(ra_gate *g, int want);
/* Gives back n units taken by ra_gate_acquire or ra_gate_acquire_some. */
void ra_gate_release(ra_gate *g, int n);

/* Fair shares for callers that arrive together. A caller announces itself and what it would
 * take (want, clamped to [1, capacity]) with ra_gate_join as soon as it arrives, before the
 * work that precedes its acquire, and leaves once it released its units. ra_gate_share(g, want)
 * is then what it should ask for: want while the joined callers' wants fit in the capacity,
 * else its proportional part of the capacity, want * capacity / sum of wants rounded up (so the
 * shares may add up to a little more than the capacity: take them with ra_gate_acquire_some).
 *
 * Why: four 131K-key roar builds reach a store together (one layer's kv heads). Each asking for
 * every unit, the FIFO runs them one after another, each on all threads with its serial phases
 * idling the rest; sharing, they run side by side on a part each and together finish sooner
 * (build-bench). */
void ra_gate_join(ra_gate *g, int want);
void ra_gate_leave(ra_gate *g, int want); /* the same want as the join */
int ra_gate_share(ra_gate *g, int want);

#endif
