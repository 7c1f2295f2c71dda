/* The weighted FIFO gate: clamping, never more units out than the capacity under contention,
 * first-come-first-served order (a small request does not pass a waiting large one), and the
 * shares of callers that joined together. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "gate.h"
#include "status.h"

static void test_init_and_clamp(void **state) {
  (void)state;
  ra_gate g;
  assert_int_equal(ra_gate_init(&g, 0), RA_EINVAL);
  assert_int_equal(ra_gate_init(&g, 4), RA_OK);
  assert_int_equal(ra_gate_acquire(&g, 100), 4);
  ra_gate_release(&g, 4);
  assert_int_equal(ra_gate_acquire(&g, 0), 1);
  assert_int_equal(ra_gate_acquire(&g, 3), 3);
  assert_int_equal(g.free, 0);
  ra_gate_release(&g, 1);
  ra_gate_release(&g, 3);
  assert_int_equal(g.free, 4);
  ra_gate_destroy(&g);
}

typedef struct load {
  ra_gate *g;
  atomic_int held, peak;
  int want, rounds;
} load;

static void *worker(void *arg) {
  load *l = arg;
  for (int r = 0; r < l->rounds; r++) {
    int got = ra_gate_acquire(l->g, l->want + r % 3);
    int now = atomic_fetch_add(&l->held, got) + got;
    int p = atomic_load(&l->peak);
    while (now > p && !atomic_compare_exchange_weak(&l->peak, &p, now)) {
    }
    atomic_fetch_sub(&l->held, got);
    ra_gate_release(l->g, got);
  }
  return NULL;
}

static void test_capacity_never_exceeded(void **state) {
  (void)state;
  ra_gate g;
  assert_int_equal(ra_gate_init(&g, 5), RA_OK);
  load l = {.g = &g, .want = 1, .rounds = 2000};
  atomic_init(&l.held, 0);
  atomic_init(&l.peak, 0);
  pthread_t t[8];
  for (int i = 0; i < 8; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, &l), 0);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  assert_true(atomic_load(&l.peak) <= 5);
  assert_true(atomic_load(&l.peak) >= 2); /* 8 threads asking 1-3 units did overlap */
  assert_int_equal(g.free, 5);
  ra_gate_destroy(&g);
}

typedef struct req {
  ra_gate *g;
  int want;
  atomic_int done;
} req;

static void *take(void *arg) {
  req *r = arg;
  int got = ra_gate_acquire(r->g, r->want);
  atomic_store(&r->done, got);
  return NULL;
}

static uint64_t tickets(ra_gate *g) {
  pthread_mutex_lock(&g->mu);
  uint64_t t = g->next_ticket;
  pthread_mutex_unlock(&g->mu);
  return t;
}

static void test_fifo(void **state) {
  (void)state;
  ra_gate g;
  assert_int_equal(ra_gate_init(&g, 4), RA_OK);
  assert_int_equal(ra_gate_acquire(&g, 3), 3); /* one unit left */
  req big = {.g = &g, .want = 2}, small = {.g = &g, .want = 1};
  atomic_init(&big.done, 0);
  atomic_init(&small.done, 0);
  pthread_t tb, ts;
  assert_int_equal(pthread_create(&tb, NULL, take, &big), 0);
  while (tickets(&g) < 2) sched_yield();
  assert_int_equal(pthread_create(&ts, NULL, take, &small), 0);
  while (tickets(&g) < 3) sched_yield();
  /* The free unit would fit the small request, but the big one came first. */
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  assert_int_equal(atomic_load(&big.done), 0);
  assert_int_equal(atomic_load(&small.done), 0);
  ra_gate_release(&g, 3);
  pthread_join(tb, NULL);
  pthread_join(ts, NULL);
  assert_int_equal(atomic_load(&big.done), 2);
  assert_int_equal(atomic_load(&small.done), 1);
  ra_gate_release(&g, 3);
  assert_int_equal(g.free, 4);
  ra_gate_destroy(&g);
}

/* Shares: what a caller is worth among those that joined. */
static void test_share(void **state) {
  (void)state;
  ra_gate g;
  assert_int_equal(ra_gate_init(&g, 8), RA_OK);
  assert_int_equal(ra_gate_share(&g, 32), 8); /* alone: clamped to the capacity */
  assert_int_equal(ra_gate_share(&g, 3), 3);
  /* Four builds of a layer, each worth every unit: two units each, side by side. */
  for (int i = 0; i < 4; i++) ra_gate_join(&g, 32);
  assert_int_equal(ra_gate_share(&g, 32), 2);
  int got[4], sum = 0;
  for (int i = 0; i < 4; i++) sum += got[i] = ra_gate_acquire(&g, ra_gate_share(&g, 32));
  assert_int_equal(sum, 8); /* all four run at once: nobody waits */
  for (int i = 0; i < 4; i++) {
    ra_gate_release(&g, got[i]);
    ra_gate_leave(&g, 32);
  }
  assert_int_equal(ra_gate_share(&g, 32), 8);
  /* One large and three small: wants that fit are granted, the large one gets the rest. */
  ra_gate_join(&g, 8);
  for (int i = 0; i < 3; i++) ra_gate_join(&g, 1);
  assert_int_equal(ra_gate_share(&g, 8), 6); /* 8 * 8 / 11, rounded up */
  assert_int_equal(ra_gate_share(&g, 1), 1); /* never below 1 */
  for (int i = 0; i < 3; i++) ra_gate_leave(&g, 1);
  assert_int_equal(ra_gate_share(&g, 8), 8); /* alone again */
  /* Two of 3 fit in 8: each keeps its want. */
  ra_gate_join(&g, 3);
  ra_gate_leave(&g, 8);
  ra_gate_join(&g, 3);
  assert_int_equal(ra_gate_share(&g, 3), 3);
  ra_gate_leave(&g, 3);
  ra_gate_leave(&g, 3);
  assert_int_equal(g.joined, 0);
  assert_int_equal(g.joined_want, 0);
  assert_int_equal(g.free, 8);
  ra_gate_destroy(&g);
}

/* Four builds of a layer on 7 units: shares of 2 (1.75 rounded up) taken with acquire_some give
 * 2 + 2 + 2 + 1, every unit busy and nobody waiting (rounded down, 1 each left 3 idle). */
static void test_shares_fill_an_odd_capacity(void **state) {
  (void)state;
  ra_gate g;
  assert_int_equal(ra_gate_init(&g, 7), RA_OK);
  for (int i = 0; i < 4; i++) ra_gate_join(&g, 32);
  assert_int_equal(ra_gate_share(&g, 32), 2);
  int got[4], sum = 0;
  for (int i = 0; i < 4; i++) sum += got[i] = ra_gate_acquire_some(&g, ra_gate_share(&g, 32));
  assert_int_equal(got[0], 2);
  assert_int_equal(got[3], 1);
  assert_int_equal(sum, 7);
  assert_int_equal(g.free, 0);
  for (int i = 0; i < 4; i++) {
    ra_gate_release(&g, got[i]);
    ra_gate_leave(&g, 32);
  }
  assert_int_equal(g.free, 7);
  /* alone, acquire_some takes its whole want when it is free */
  assert_int_equal(ra_gate_acquire_some(&g, 5), 5);
  ra_gate_release(&g, 5);
  ra_gate_destroy(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_and_clamp),
      cmocka_unit_test(test_capacity_never_exceeded),
      cmocka_unit_test(test_fifo),
      cmocka_unit_test(test_share),
      cmocka_unit_test(test_shares_fill_an_odd_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
