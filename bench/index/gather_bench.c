/* gather-bench: what scoring a graph walk's keys costs when nothing else does. A roar search at
 * ef 400 on 131K keys scores ~5.4K random rows (bf16, head_dim 128: 256 B each) of one kv head
 * (34 MB), which a store touches once per decode step among gigabytes of other heads. This
 * bench scores 5.4K random rows of a random 34 MB window of a large array with fp32 q, one
 * "search" after another on each thread, in three ways:
 *   stream     one ra_vec_dot_rows call over all 5.4K ids: its prefetch runs 8 rows ahead
 *              through the whole list (the best a gather of those rows can do);
 *   batch8     calls of 8 ids (a walk's expansion yields ~8 unvisited neighbors): the prefetch
 *              never reaches past a batch, though the core may run ahead into the next one;
 *   batch8dep  as batch8, but the next batch's ids depend on this batch's scores, as a walk's
 *              next expansion depends on the beam: each batch waits for the last one's rows.
 * Comparing a search's measured time with these says how much of it is fetching its keys, how
 * much the walk's chain of dependent fetches, and how much the walk's own work.
 *
 *   gather-bench [--gib 8] [--threads 1,14] [--searches 400] [--json FILE]
 * Prints JSON (and writes it to FILE). */
#include "clock.h"
#include "half.h"
#include "hugemem.h"
#include "opts.h"
#include "vec.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 128
#define ROW_BYTES (DIM * 2)          /* bf16 */
#define WINDOW_ROWS (131072u)        /* one kv head at 128K: 32 MiB of keys */
#define ROWS_PER_SEARCH 5400u        /* ef 400 scores ~4.1 % of 131K keys */
#define BATCH 8u
#define MAX_THREADS 64

enum { P_STREAM, P_BATCH, P_BATCH_DEP, N_PATTERNS };
static const char *const pattern_name[N_PATTERNS] = {"stream", "batch8", "batch8dep"};

typedef struct opts {
  size_t gib;
  int threads[8], n_threads;
  int searches;
  const char *json;
} opts;

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A value drawn uniformly from [-1, 1] in steps of 1/1000. */
static float uniform_pm1(uint64_t *s) { return (float)((int)(xorshift(s) % 2001) - 1000) / 1000.0f; }

static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.gib = 8, .threads = {1, 14}, .n_threads = 2, .searches = 400};
  if ((argc - 1) % 2) return -1; /* every flag takes a value */
  for (int i = 1; i < argc; i += 2) {
    const char *f = argv[i], *v = argv[i + 1];
    char *end;
    int64_t n;
    if (strcmp(f, "--gib") == 0) {
      if (ra_opts_parse_int(v, 1, 1024, &n, NULL) != RA_OK) return -1;
      o->gib = (size_t)n;
    } else if (strcmp(f, "--searches") == 0) {
      if (ra_opts_parse_int(v, 1, INT32_MAX, &n, NULL) != RA_OK) return -1;
      o->searches = (int)n;
    } else if (strcmp(f, "--threads") == 0) {
      o->n_threads = 0;
      for (const char *p = v; *p; p = *end ? end + 1 : end) {
        long t = strtol(p, &end, 10);
        if (o->n_threads == 8) return -1; /* at most 8 counts */
        if (end == p || t < 1 || t > MAX_THREADS || (*end && *end != ',')) return -1;
        o->threads[o->n_threads++] = (int)t;
      }
      if (o->n_threads == 0) return -1;
    } else if (strcmp(f, "--json") == 0) {
      o->json = v;
    } else {
      return -1;
    }
  }
  return 0;
}

/* One thread's searches of pattern p; returns the seconds spent scoring (ids drawn outside). */
static double run_searches(const char *rows, size_t n_windows, int p, int searches, uint64_t seed,
                           float *sink) {
  uint32_t *ids = malloc(ROWS_PER_SEARCH * sizeof *ids);
  float *scores = malloc(ROWS_PER_SEARCH * sizeof *scores), q[DIM];
  double spent = 0;
  if (!ids || !scores) {
    free(ids);
    free(scores);
    return -1;
  }
  for (int d = 0; d < DIM; d++) q[d] = uniform_pm1(&seed);
  for (int s = 0; s < searches; s++) {
    const char *win = rows + (xorshift(&seed) % n_windows) * (size_t)WINDOW_ROWS * ROW_BYTES;
    for (uint32_t i = 0; i < ROWS_PER_SEARCH; i++) ids[i] = (uint32_t)(xorshift(&seed) % WINDOW_ROWS);
    const double t0 = ra_clock_now_s();
    if (p == P_STREAM) {
      ra_vec_dot_rows(q, win, RA_DTYPE_BF16, DIM, ids, ROWS_PER_SEARCH, scores);
    } else {
      for (uint32_t b = 0; b < ROWS_PER_SEARCH; b += BATCH) {
        uint32_t n = ROWS_PER_SEARCH - b < BATCH ? ROWS_PER_SEARCH - b : BATCH;
        if (p == P_BATCH_DEP && b) {
          /* never true (scores are finite), but the core cannot know before the last batch's
           * rows are in: the next ids wait for them, as a walk's next expansion does */
          const uint32_t dep = scores[b - 1] > 3e38f;
          for (uint32_t i = 0; i < n; i++) ids[b + i] ^= dep;
        }
        ra_vec_dot_rows(q, win, RA_DTYPE_BF16, DIM, ids + b, n, scores + b);
      }
    }
    spent += ra_clock_now_s() - t0;
    *sink += scores[ROWS_PER_SEARCH - 1];
  }
  free(ids);
  free(scores);
  return spent;
}

int main(int argc, char **argv) {
  opts o;
  if (parse_args(argc, argv, &o)) {
    fprintf(stderr, "usage: gather-bench [--gib 8] [--threads 1,14 (up to 8 counts)] [--searches 400] [--json FILE]\n");
    return 2;
  }
  const size_t bytes = o.gib << 30, window = (size_t)WINDOW_ROWS * ROW_BYTES;
  const size_t n_windows = bytes / window;
  char *rows = ra_huge_alloc(bytes); /* as a store's keys: on huge pages */
  if (!rows) {
    fprintf(stderr, "gather-bench: cannot allocate %zu GiB\n", o.gib);
    return 1;
  }
  /* Small random bf16 values, written by all cores (and so faulted in) before any timing. */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes / 2; i += 4096) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ i;
    for (size_t j = i; j < i + 4096 && j < bytes / 2; j++)
      ((uint16_t *)rows)[j] = ra_fp32_to_bf16(uniform_pm1(&s) / 4.0f);
  }
  FILE *out[2] = {stdout, o.json ? fopen(o.json, "w") : NULL};
  if (o.json && !out[1]) {
    fprintf(stderr, "gather-bench: cannot create %s\n", o.json);
    ra_huge_free(rows, bytes);
    return 1;
  }
  double ns[8][N_PATTERNS];
  float sink = 0;
  for (int t = 0; t < o.n_threads; t++)
    for (int p = 0; p < N_PATTERNS; p++) {
      double total = 0;
      int failed = 0;
#pragma omp parallel num_threads(o.threads[t]) reduction(+ : total, failed, sink)
      {
        float mine = 0;
        double s = run_searches(rows, n_windows, p, o.searches,
                                0x2545F4914F6CDD1Dull * (uint64_t)(omp_get_thread_num() + 1), &mine);
        if (s < 0) failed++;
        else total += s;
        sink += mine;
      }
      if (failed) {
        fprintf(stderr, "gather-bench: out of memory\n");
        ra_huge_free(rows, bytes);
        return 1;
      }
      ns[t][p] = total / o.threads[t] / o.searches / ROWS_PER_SEARCH * 1e9;
    }
  for (int f = 0; f < 2; f++) {
    if (!out[f]) continue;
    fprintf(out[f],
            "{\"gib\": %zu, \"window_rows\": %u, \"row_bytes\": %d, \"rows_per_search\": %u, "
            "\"searches_per_thread\": %d, \"kernel\": \"%s\", \"results\": [",
            o.gib, WINDOW_ROWS, ROW_BYTES, ROWS_PER_SEARCH, o.searches, ra_vec_kernel_name());
    for (int t = 0; t < o.n_threads; t++)
      for (int p = 0; p < N_PATTERNS; p++)
        fprintf(out[f], "%s\n  {\"threads\": %d, \"pattern\": \"%s\", \"ns_per_row\": %.1f, "
                        "\"us_per_search\": %.1f}",
                t || p ? "," : "", o.threads[t], pattern_name[p], ns[t][p],
                ns[t][p] * ROWS_PER_SEARCH / 1e3);
    fprintf(out[f], "\n], \"checksum\": %g}\n", (double)sink);
  }
  if (out[1] && fclose(out[1]) != 0) {
    fprintf(stderr, "gather-bench: writing %s failed\n", o.json);
    ra_huge_free(rows, bytes);
    return 1;
  }
  ra_huge_free(rows, bytes);
  return 0;
}
