/* Wave retro's records (gpu-worker/wave_retro.h): the clusters a later step retrieves that a past
 * step has not seen, against a reference that keeps every step's seen set explicitly: estimated
 * clusters count as seen, clusters created after a step count as seen by it, a supplemented
 * cluster is not supplemented twice, a step without a record (or whose slot a newer step took)
 * misses nothing, and (layer, kv head) records are independent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wave_retro.h"

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static void test_cases(void **state) {
  (void)state;
  ra_wave_retro *r;
  ra_error err;
  ok(ra_wave_retro_new(2, 3, 100, 2, &r, &err), &err);
  int32_t out[16];
  /* step 1 of layer 1, kv head 2: 10 clusters; retrieved 1, 2; estimated 3, 4 */
  const int32_t zones1[] = {1, 2, 3, 4, -1};
  ra_wave_retro_record(r, 1, 2, 1, 10, zones1, 5);
  /* step 2 retrieves 0..5 and 12 (created after step 1: a growth block) */
  const int32_t ret2[] = {5, 0, 1, 2, 3, 4, -1, 12};
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 1, ret2, 8, out), 2);
  assert_int_equal(out[0], 5);
  assert_int_equal(out[1], 0);
  /* supplemented once: seen now */
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 1, ret2, 8, out), 0);
  /* other (layer, kv head) pairs have no record of step 1 */
  assert_int_equal(ra_wave_retro_missing(r, 0, 2, 1, ret2, 8, out), 0);
  assert_int_equal(ra_wave_retro_missing(r, 1, 1, 1, ret2, 8, out), 0);
  /* a cluster retrieved twice in one list is supplemented once */
  const int32_t dup[] = {7, 7};
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 1, dup, 2, out), 1);
  /* step 3 takes step 1's slot (window 2): step 1 has no record any more */
  ra_wave_retro_record(r, 1, 2, 3, 20, NULL, 0);
  const int32_t eight[] = {8};
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 1, eight, 1, out), 0);
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 3, eight, 1, out), 1);
  /* a record replaced by its slot's next step starts empty */
  ra_wave_retro_record(r, 1, 2, 5, 20, eight, 1);
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 5, eight, 1, out), 0);
  const int32_t nine[] = {9};
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 5, nine, 1, out), 1);
  assert_int_equal(ra_wave_retro_missing(r, 1, 2, 0, nine, 1, out), 0);
  ra_wave_retro_free(r);
  assert_int_equal(ra_wave_retro_new(1, 1, 10, 0, &r, &err), RA_EINVAL);
}

/* Random steps with growth, as the worker's select runs them: per step, the missing clusters of
 * each past step in the window, then the step's record. */
#define CAP 300
#define STEPS 200
#define W 5
static uint64_t rng = 12345;
static uint32_t next_rand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}

static void test_against_reference(void **state) {
  (void)state;
  enum { L = 2, G = 2 };
  ra_wave_retro *r;
  ra_error err;
  ok(ra_wave_retro_new(L, G, CAP, W, &r, &err), &err);
  static uint8_t seen[STEPS + 1][L][G][CAP]; /* the reference's seen sets */
  static int64_t count[STEPS + 1][L][G];
  int64_t nc = 40;
  uint64_t total = 0;
  for (uint64_t t = 1; t <= STEPS; t++) {
    if (t % 7 == 0 && nc + 20 <= CAP) nc += 20; /* a growth block */
    for (int l = 0; l < L; l++)
      for (int g = 0; g < G; g++) {
        int32_t zones[CAP], n_ret = 1 + (int32_t)(next_rand() % 12), n_est = (int32_t)(next_rand() % 20);
        for (int32_t i = 0; i < n_ret + n_est; i++) zones[i] = (int32_t)(next_rand() % (uint32_t)nc);
        if (n_est > 0) zones[n_ret] = -1; /* wave_select's padding */
        const uint32_t P = t - 1 < W ? (uint32_t)(t - 1) : W;
        for (uint32_t j = 1; j <= P; j++) {
          const uint64_t past = t - j;
          int32_t out[CAP], want[CAP];
          size_t nw = 0;
          for (int32_t i = 0; i < n_ret; i++) {
            const int32_t c = zones[i];
            if (c >= 0 && c < count[past][l][g] && !seen[past][l][g][c]) {
              seen[past][l][g][c] = 1;
              want[nw++] = c;
            }
          }
          size_t n = ra_wave_retro_missing(r, l, g, past, zones, (size_t)n_ret, out);
          assert_int_equal(n, nw);
          assert_memory_equal(out, want, n * sizeof *out);
          total += n;
        }
        ra_wave_retro_record(r, l, g, t, nc, zones, (size_t)(n_ret + n_est));
        count[t][l][g] = nc;
        for (int32_t i = 0; i < n_ret + n_est; i++)
          if (zones[i] >= 0) seen[t][l][g][zones[i]] = 1;
      }
  }
  assert_true(total > 100); /* the reference's sets were exercised */
  ra_wave_retro_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cases),
      cmocka_unit_test(test_against_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
