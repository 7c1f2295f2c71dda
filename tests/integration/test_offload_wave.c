/* Wave mode end to end on a tiny random model with two real kv-store processes (seconds):
 *   - every cluster in the retrieval zone is full attention (the same logits to rounding), and
 *     the stores scan each offloaded row exactly once per q head;
 *   - a decode that crosses growth blocks (lag rows clustered and reordered at the stores) keeps
 *     every token visible: still full attention;
 *   - kv heads split over the stores by token range, cut in the prefill and in the growth;
 *   - every cluster estimated (none retrieved): the stores scan only the lag, and the logits are
 *     closer to full attention than dropping the middle (streaming);
 *   - a runtime seeded from a captured prefill decodes as the one that ran the prefill;
 *   - the device buffer of retrieved clusters changes nothing but where they are attended: on
 *     equals off across growth blocks, with hits on a steady decode, under eviction, in f16;
 *   - a batched decode step (one ranking call for the step's wave sequences) equals each
 *     sequence decoding alone, also with its requests in AttendBatch messages;
 *   - a prefill in pieces that end within layers, another runtime decoding between them, equals
 *     the whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "harness.h"
#include "offload.h"
#include "shardmap.h"

enum { N_PROMPT = 600, SINK = 16, WINDOW = 48, MAX_DECODE = 100 };

static void ok(int rc, const ra_error *err) {
  if (rc != RA_OK) fail_msg("%s: %s", ra_status_name(rc), err->msg);
}

static struct {
  ra_backend *be;
  ra_model *m;
  harness_store st[2];
  int32_t tokens[N_PROMPT + MAX_DECODE];
} F;

static int setup(void **state) {
  (void)state;
  ra_error err;
  ra_backend_config bc = {2, 0};
  ra_model_config c;
  if (ra_backend_create("cpu", &bc, &F.be, &err) || ra_model_config_preset("tiny", &c, &err)) return -1;
  c.n_layers = 4;
  if (ra_model_random(F.be, &c, 11, &F.m, &err)) return -1;
  const char *const args[] = {"--threads", "1", NULL};
  for (int i = 0; i < 2; i++)
    if (harness_store_start(&F.st[i], args)) return -1;
  for (int i = 0; i < N_PROMPT + MAX_DECODE; i++) F.tokens[i] = (int32_t)((i * 37 + 11) % c.vocab);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  int rc = 0;
  for (int i = 0; i < 2; i++)
    if (F.st[i].pid > 0 && harness_store_stop(&F.st[i], 5000) != 0) rc = -1;
  ra_model_free(F.m);
  ra_backend_destroy(F.be);
  return rc;
}

/* The plan of `map_text` ("%1$s" / "%2$s": the stores' addresses), or the kv heads dealt
 * round-robin when NULL. */
typedef struct plan_of {
  ra_shard_map map;
  ra_offload_plan plan;
} plan_of;

static void plan_make(plan_of *p, const char *map_text, uint32_t sink, uint32_t window) {
  const ra_model_config *c = &F.m->cfg;
  ra_error err;
  if (map_text) {
    char text[1024];
    snprintf(text, sizeof text, map_text, F.st[0].addr, F.st[1].addr);
    ok(ra_shard_map_parse(text, &p->map, &err), &err);
  } else {
    const char *addrs[2] = {F.st[0].addr, F.st[1].addr};
    ok(ra_shard_map_spread(addrs, 2, (uint32_t)c->n_layers, (uint32_t)c->n_kv_heads, &p->map, &err), &err);
  }
  ok(ra_offload_plan_build(&p->map, (uint32_t)c->n_layers, (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads, sink,
                           window, &p->plan, &err),
     &err);
}

static void plan_free(plan_of *p) {
  ra_offload_plan_free(&p->plan);
  ra_shard_map_free(&p->map);
}

static void wave_config(ra_offload_config *c, const ra_offload_plan *plan, double retrieve, double estimate,
                        int64_t block, int n_decode) {
  ra_offload_config_default(c);
  c->mode = RA_MODE_WAVE;
  c->n_sink = plan->n_sink;
  c->n_window = plan->n_window;
  c->store_dtype = RA_DTYPE_F32;
  c->max_prompt = N_PROMPT;
  c->max_ctx = N_PROMPT + n_decode;
  c->timeout_ms = 5000;
  c->wave.retrieve = retrieve;
  c->wave.retrieve_min = 0; /* the fractions as given: a short prompt would otherwise retrieve all */
  c->wave.estimate = estimate;
  c->wave.segment = 256; /* several segments per piece */
  if (block) c->wave.block = block;
}

static ra_offload *offload_new(const ra_offload_plan *plan, const ra_offload_config *c) {
  ra_offload *o;
  ra_error err;
  ok(ra_offload_new(F.m, c->mode == RA_MODE_STREAMING ? NULL : plan, c, &o, &err), &err);
  return o;
}

/* Both stores' Stats, summed. */
static ra_kvclient_store_stats stores_stats(void) {
  ra_kvclient_store_stats sum = {0};
  for (int i = 0; i < 2; i++) {
    ra_kvclient *c;
    ra_kvclient_store_stats st;
    ra_error err;
    ok(ra_kvclient_connect(F.st[i].addr, NULL, &c, &err), &err);
    ok(ra_kvclient_stats(c, &st, &err), &err);
    ra_kvclient_close(c);
    sum.sessions += st.sessions;
    sum.bytes_used += st.bytes_used;
    sum.attend_batches += st.attend_batches;
  }
  return sum;
}

static void last_logits(ra_state *st, float *out) {
  ra_tensor row = ra_tensor_rows(&st->logits, st->n_logits - 1, 1);
  ra_error err;
  ok(st->be->ops->download(st->be, &row, 0, out, (size_t)st->m->cfg.vocab, &err), &err);
}

/* Prefills o (unless seeded already) and decodes n_decode teacher-forced tokens; the largest
 * |logit difference| from full attention over the prefill's and every step's logits. */
static double against_full(ra_offload *o, int n_decode, int prefill) {
  const int vocab = F.m->cfg.vocab;
  float *want = malloc((size_t)vocab * sizeof *want), *got = malloc((size_t)vocab * sizeof *got);
  assert_non_null(want);
  assert_non_null(got);
  ra_state *st;
  ra_error err;
  ok(ra_state_new(F.m, N_PROMPT + n_decode, N_PROMPT, RA_DTYPE_F32, &st, &err), &err);
  ok(ra_model_forward(st, F.tokens, N_PROMPT, 0, NULL, &err), &err);
  if (prefill) ok(ra_offload_prefill(o, F.tokens, N_PROMPT, NULL, &err), &err);
  double worst = 0;
  for (int t = 0; t <= n_decode; t++) {
    if (t > 0) {
      ok(ra_model_forward(st, &F.tokens[N_PROMPT + t - 1], 1, 0, NULL, &err), &err);
      ok(ra_offload_decode(o, F.tokens[N_PROMPT + t - 1], NULL, &err), &err);
    }
    last_logits(st, want);
    last_logits(ra_offload_state(o), got);
    for (int i = 0; i < vocab; i++) worst = fmax(worst, fabs((double)want[i] - got[i]));
  }
  ra_state_free(st);
  free(want);
  free(got);
  return worst;
}

/* Every step's n_scanned is `rows(step)` keys per q head and layer. */
static void assert_scanned(const ra_offload *o, uint64_t (*rows)(const ra_offload_stats *s, size_t i)) {
  size_t n_steps;
  const ra_offload_stats *s = ra_offload_step_stats(o, &n_steps);
  const uint64_t per_row = (uint64_t)F.m->cfg.n_heads * (uint64_t)F.m->cfg.n_layers;
  for (size_t i = 0; i < n_steps; i++) assert_int_equal(s[i].n_scanned, rows(&s[i], i) * per_row);
}

static uint64_t all_rows(const ra_offload_stats *s, size_t i) {
  (void)i;
  return s->n_offloaded;
}

static void test_all_retrieved_equals_full(void **state) {
  (void)state;
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 1.0, 0.0, 0, 4);
  ra_offload *o = offload_new(&p.plan, &c);
  double worst = against_full(o, 4, 1);
  print_message("wave, every cluster retrieved: max |logit diff| from full %.2e\n", worst);
  assert_true(worst < 1e-3);
  /* offloaded [16, 552) in segments of 256: 16 + 16 + 2 clusters per kv head */
  assert_int_equal(ra_wave_n_clusters_of(ra_offload_wave(o), 0), 34);
  assert_int_equal(ra_wave_block_rows(ra_offload_wave(o)), 4);
  assert_scanned(o, all_rows);
  ra_offload_free(o);
  plan_free(&p);
}

static void test_growth_blocks_keep_every_token(void **state) {
  (void)state;
  enum { W = 8, STEPS = 40, BLOCK = 16 };
  plan_of p;
  plan_make(&p, NULL, SINK, W);
  ra_offload_config c;
  wave_config(&c, &p.plan, 1.0, 0.0, BLOCK, STEPS);
  ra_offload *o = offload_new(&p.plan, &c);
  double worst = against_full(o, STEPS, 1);
  const ra_wave *w = ra_offload_wave(o);
  print_message("wave across %d growth blocks of %d: max |logit diff| from full %.2e, %lld clusters, %lld lag rows\n",
                STEPS / BLOCK, BLOCK, worst, (long long)ra_wave_n_clusters_of(w, 0), (long long)ra_wave_block_rows(w));
  assert_true(worst < 1e-3);
  /* prefill [16, 592): 256 + 256 + 64 rows, 16 + 16 + 4 clusters; two blocks of one cluster each */
  assert_int_equal(ra_wave_n_clusters_of(w, 3), 36 + 2 * (BLOCK / 16));
  assert_int_equal(ra_wave_block_rows(w), STEPS % BLOCK);
  assert_scanned(o, all_rows);
  ra_offload_free(o);
  plan_free(&p);
}

static void test_kv_head_split_by_tokens(void **state) {
  (void)state;
  enum { STEPS = 90, BLOCK = 16 };
  /* every kv head on both stores: cut at 300 inside the prefill, at 620 in the growth (blocks
   * from 552: 552, 568, 584, 600, then 616-619 cut short) */
  plan_of p;
  plan_make(&p, "%1$s * * 0-299\n%2$s * * 300-619\n%1$s * * 620-\n", SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 1.0, 0.0, BLOCK, STEPS);
  ra_offload *o = offload_new(&p.plan, &c);
  double worst = against_full(o, STEPS, 1);
  const ra_wave *w = ra_offload_wave(o);
  print_message("wave, kv heads split at 300 and 620: max |logit diff| from full %.2e, %lld clusters\n", worst,
                (long long)ra_wave_n_clusters_of(w, 1));
  assert_true(worst < 1e-3);
  /* prefill pieces [16, 300) and [300, 552): 256 + 28 rows -> 16 + 2, 252 rows -> 16; growth:
   * 552..616 four blocks, 616..620 one, 620..636 one, then 636..642 in the block */
  assert_int_equal(ra_wave_n_clusters_of(w, 1), 18 + 16 + 4 + 1 + 1);
  assert_int_equal(ra_wave_block_rows(w), 6);
  assert_scanned(o, all_rows);
  ra_offload_free(o);
  plan_free(&p);
}

/* Rows evicted since the prefill (all lag: the block is never full). */
static uint64_t lag_rows(const ra_offload_stats *s, size_t i) {
  (void)s;
  return (uint64_t)i + 1;
}

static void test_all_estimated_scans_only_the_lag(void **state) {
  (void)state;
  enum { STEPS = 4 };
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.0, 1.0, 0, STEPS);
  ra_offload *o = offload_new(&p.plan, &c);
  double est = against_full(o, STEPS, 1);
  assert_scanned(o, lag_rows);
  ra_offload_free(o);
  c.mode = RA_MODE_STREAMING;
  o = offload_new(NULL, &c);
  double dropped = against_full(o, STEPS, 1);
  ra_offload_free(o);
  print_message("every cluster estimated: max |logit diff| from full %.2e (streaming: %.2e)\n", est, dropped);
  assert_true(est < dropped);
  plan_free(&p);
}

static void test_seeded_decodes_as_prefilled(void **state) {
  (void)state;
  enum { STEPS = 20, BLOCK = 16 };
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.1, 0.3, BLOCK, STEPS);
  ra_prefill_capture *cap;
  ra_state *st;
  ra_error err;
  ok(ra_prefill_capture_new(F.m, N_PROMPT, c.build_queries, &cap, &err), &err);
  ok(ra_state_new(F.m, N_PROMPT, N_PROMPT, RA_DTYPE_F32, &st, &err), &err);
  ok(ra_prefill_capture_run(cap, st, F.tokens, &err), &err);
  ra_state_free(st);
  ra_offload *direct = offload_new(&p.plan, &c);
  ok(ra_offload_prefill(direct, F.tokens, N_PROMPT, NULL, &err), &err);
  /* the direct runtime holds its sessions open: the seeded one gets sessions of its own */
  ra_offload *seeded = offload_new(&p.plan, &c);
  ok(ra_offload_seed(seeded, cap, NULL, &err), &err);
  ra_prefill_capture_free(cap);
  const int vocab = F.m->cfg.vocab;
  float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
  double worst = 0;
  for (int t = 0; t <= STEPS; t++) {
    if (t > 0) {
      ok(ra_offload_decode(direct, F.tokens[N_PROMPT + t - 1], NULL, &err), &err);
      ok(ra_offload_decode(seeded, F.tokens[N_PROMPT + t - 1], NULL, &err), &err);
    }
    last_logits(ra_offload_state(direct), a);
    last_logits(ra_offload_state(seeded), b);
    for (int i = 0; i < vocab; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
  }
  print_message("wave (retrieve 0.1, estimate 0.3): seeded vs prefilled, max |logit diff| %.2e\n", worst);
  assert_true(worst < 1e-4);
  free(a);
  free(b);
  ra_offload_free(direct);
  ra_offload_free(seeded);
  plan_free(&p);
}

/* Two runtimes of config c, buffer off and `buffer` clusters, decode the same tokens in
 * lockstep: the largest |logit difference| between them; *hits, *misses, *rows: the buffered
 * runtime's totals. Checks that the stores scanned fewer rows exactly by the buffer's rows. */
static double buffer_against_off(const ra_offload_plan *plan, ra_offload_config c, int64_t buffer, int steps,
                                 ra_wave_buffer_stats *bt) {
  ra_error err;
  c.wave.buffer = 0;
  ra_offload *off = offload_new(plan, &c);
  c.wave.buffer = buffer;
  ra_offload *on = offload_new(plan, &c);
  ok(ra_offload_prefill(off, F.tokens, N_PROMPT, NULL, &err), &err);
  ok(ra_offload_prefill(on, F.tokens, N_PROMPT, NULL, &err), &err);
  const int vocab = F.m->cfg.vocab;
  float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
  double worst = 0;
  for (int t = 1; t <= steps; t++) {
    ok(ra_offload_decode(off, F.tokens[N_PROMPT + t - 1], NULL, &err), &err);
    ok(ra_offload_decode(on, F.tokens[N_PROMPT + t - 1], NULL, &err), &err);
    last_logits(ra_offload_state(off), a);
    last_logits(ra_offload_state(on), b);
    for (int i = 0; i < vocab; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
  }
  ra_wave_buffer_totals(ra_offload_wave(on), bt);
  /* per step: the stores scan what the buffer did not hold (rows per q head and layer) */
  size_t n_off, n_on;
  const ra_offload_stats *so = ra_offload_step_stats(off, &n_off), *sn = ra_offload_step_stats(on, &n_on);
  assert_int_equal(n_off, n_on);
  const uint64_t group = (uint64_t)(F.m->cfg.n_heads / F.m->cfg.n_kv_heads);
  uint64_t hits = 0, misses = 0, rows = 0;
  for (size_t i = 0; i < n_on; i++) {
    assert_int_equal(so[i].n_scanned, sn[i].n_scanned + sn[i].buffer_rows * group);
    assert_int_equal(so[i].buffer_hits + so[i].buffer_misses, 0);
    hits += sn[i].buffer_hits;
    misses += sn[i].buffer_misses;
    rows += sn[i].buffer_rows;
  }
  assert_int_equal(hits, bt->hits);
  assert_int_equal(misses, bt->misses);
  assert_int_equal(rows, bt->rows);
  free(a);
  free(b);
  ra_offload_free(off);
  ra_offload_free(on);
  return worst;
}

static void test_buffer_equals_off(void **state) {
  (void)state;
  enum { W = 8, STEPS = 40, BLOCK = 16 };
  plan_of p;
  plan_make(&p, NULL, SINK, W);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.15, 0.3, BLOCK, STEPS);
  ra_wave_buffer_stats bt;
  double worst = buffer_against_off(&p.plan, c, 64, STEPS, &bt);
  print_message("wave buffer 64 across %d growth blocks: max |logit diff| from off %.2e, %llu hits, %llu misses, "
                "%llu rows on the device, %llu clusters fetched\n",
                STEPS / BLOCK, worst, (unsigned long long)bt.hits, (unsigned long long)bt.misses,
                (unsigned long long)bt.rows, (unsigned long long)bt.fetched);
  assert_true(worst < 1e-4);
  assert_true(bt.hits > 0 && bt.rows > 0);
  assert_true(bt.fetched > 0 && bt.fetched_rows >= bt.fetched);
  plan_free(&p);
}

static void test_buffer_steady_hits(void **state) {
  (void)state;
  enum { STEPS = 12 };
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.1, 0.2, 0, STEPS);
  ra_wave_buffer_stats bt;
  double worst = buffer_against_off(&p.plan, c, 256, STEPS, &bt);
  double rate = (double)bt.hits / (double)(bt.hits + bt.misses);
  print_message("wave buffer 256, steady decode: hit rate %.3f, max |logit diff| from off %.2e\n", rate, worst);
  assert_true(worst < 1e-4);
  /* the first step fills it; later ones find most of their picks (adjacent queries) */
  assert_true(rate > 0.3);
  plan_free(&p);
}

static void test_buffer_evicts_and_splits(void **state) {
  (void)state;
  enum { STEPS = 40, BLOCK = 16 };
  /* a buffer of 2 clusters' rows evicts all the time; kv heads split over both stores; f16 at
   * the stores (the buffer holds the stores' dtype, so hits see the same rows) */
  plan_of p;
  plan_make(&p, "%1$s * * 0-299\n%2$s * * 300-619\n%1$s * * 620-\n", SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.2, 0.3, BLOCK, STEPS);
  c.store_dtype = RA_DTYPE_F16;
  ra_wave_buffer_stats bt;
  double worst = buffer_against_off(&p.plan, c, 2, STEPS, &bt);
  print_message("wave buffer 2, split kv heads, f16: max |logit diff| from off %.2e, %llu hits of %llu\n", worst,
                (unsigned long long)bt.hits, (unsigned long long)(bt.hits + bt.misses));
  assert_true(worst < 1e-4);
  assert_true(bt.hits > 0);
  assert_true(bt.fetched_rows > 2 * 16 * (uint64_t)F.m->cfg.n_layers * (uint64_t)F.m->cfg.n_kv_heads);
  /* every cluster retrieved with a buffer holding them all: still full attention */
  wave_config(&c, &p.plan, 1.0, 0.0, BLOCK, STEPS);
  c.wave.buffer = 64;
  ra_offload *o = offload_new(&p.plan, &c);
  worst = against_full(o, STEPS, 1);
  ra_wave_buffer_totals(ra_offload_wave(o), &bt);
  print_message("wave buffer 64, every cluster retrieved: max |logit diff| from full %.2e, %llu hits\n", worst,
                (unsigned long long)bt.hits);
  assert_true(worst < 1e-3);
  assert_true(bt.hits > 0);
  ra_offload_free(o);
  plan_free(&p);
}

/* int8 rows at the stores: the buffer holds them dequantized in fp32, the values the stores
 * attend over, so the buffer still changes nothing. */
static void test_buffer_int8_stores(void **state) {
  (void)state;
  enum { STEPS = 24, BLOCK = 16 };
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.15, 0.3, BLOCK, STEPS);
  c.store_dtype = RA_DTYPE_I8;
  ra_wave_buffer_stats bt;
  double worst = buffer_against_off(&p.plan, c, 32, STEPS, &bt);
  print_message("wave buffer 32, int8 stores: max |logit diff| from off %.2e, %llu hits\n", worst,
                (unsigned long long)bt.hits);
  assert_true(worst < 1e-4);
  assert_true(bt.hits > 0);
  plan_free(&p);
}

/* ra_offload_decode_batch: wave sequences (one with a device buffer, one across growth blocks)
 * and a flat one, ranked in two groups, decode in one batched step each as they decode alone,
 * step after step, with the same keys scanned: with each sequence's requests on its own streams,
 * and as one AttendBatch message per group, layer and store (the stores count them); a batch
 * mixing two models is refused. */
static void test_decode_batch_equals_alone(void **state) {
  (void)state;
  enum { N = 3, STEPS = 40, BLOCK = 16 };
  const int vocab = F.m->cfg.vocab;
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c[N];
  wave_config(&c[0], &p.plan, 0.15, 0.3, BLOCK, STEPS);
  c[0].select_group = 2; /* the batch's first runtime's: ranked in chunks {0, 1}, {2} */
  wave_config(&c[1], &p.plan, 0.1, 0.2, 0, STEPS);
  c[1].wave.buffer = 32;
  wave_config(&c[2], &p.plan, 0, 0, 0, STEPS);
  c[2].mode = RA_MODE_FLAT;
  c[2].top_k = 40;
  ra_offload *alone[N], *batched[N], *via[N];
  int32_t toks[N][N_PROMPT + STEPS];
  ra_error err;
  for (int i = 0; i < N; i++) {
    for (int t = 0; t < N_PROMPT + STEPS; t++) toks[i][t] = F.tokens[(t + 53 * i) % (N_PROMPT + MAX_DECODE)];
    alone[i] = offload_new(&p.plan, &c[i]);
    batched[i] = offload_new(&p.plan, &c[i]);
    via[i] = offload_new(&p.plan, &c[i]);
    ok(ra_offload_prefill(alone[i], toks[i], N_PROMPT, NULL, &err), &err);
    ok(ra_offload_prefill(batched[i], toks[i], N_PROMPT, NULL, &err), &err);
    ok(ra_offload_prefill(via[i], toks[i], N_PROMPT, NULL, &err), &err);
  }
  ra_remote_batch *rb;
  ok(ra_remote_batch_new(&rb, &err), &err);
  uint64_t batches0 = stores_stats().attend_batches;
  ra_batch *b;
  ok(ra_batch_new(F.m, N, N, &b, &err), &err);
  float *want = malloc((size_t)vocab * sizeof *want), *got = malloc((size_t)vocab * sizeof *got);
  assert_non_null(want);
  assert_non_null(got);
  double worst = 0, worst_via = 0;
  for (int t = 0; t < STEPS; t++) {
    int32_t next[N];
    int rcs[N];
    ra_error errs[N];
    ra_offload_stats sa[N], sb[N], sv[N];
    for (int i = 0; i < N; i++) {
      next[i] = toks[i][N_PROMPT + t];
      ok(ra_offload_decode(alone[i], next[i], &sa[i], &err), &err);
    }
    ok(ra_offload_decode_batch(batched, next, N, b, NULL, rcs, errs, sb, &err), &err);
    for (int i = 0; i < N; i++) ok(rcs[i], &errs[i]);
    ok(ra_offload_decode_batch(via, next, N, b, rb, rcs, errs, sv, &err), &err);
    for (int i = 0; i < N; i++) {
      ok(rcs[i], &errs[i]);
      assert_int_equal(sb[i].n_scanned, sa[i].n_scanned);
      assert_int_equal(sv[i].n_scanned, sa[i].n_scanned);
      last_logits(ra_offload_state(alone[i]), want);
      last_logits(ra_offload_state(batched[i]), got);
      for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs((double)want[v] - got[v]));
      last_logits(ra_offload_state(via[i]), got);
      for (int v = 0; v < vocab; v++) worst_via = fmax(worst_via, fabs((double)want[v] - got[v]));
    }
  }
  print_message("batched wave (f32, buffer, growth) + flat decode: max |logit diff| from alone %.2e over %d steps "
                "(%.2e in AttendBatch messages)\n",
                worst, STEPS, worst_via);
  assert_true(worst < 1e-4);
  assert_true(worst_via < 1e-4);
  /* per step, layer, ranking group {0, 1} / {2} and store: one message, each sequence's request in it */
  uint64_t msgs, reqs;
  ra_remote_batch_counts(rb, &msgs, &reqs);
  const uint64_t per_layer = 2 * 2; /* groups x stores: every layer has kv heads at both */
  assert_int_equal(msgs, (uint64_t)STEPS * F.m->cfg.n_layers * per_layer);
  assert_int_equal(reqs, (uint64_t)STEPS * F.m->cfg.n_layers * N * 2);
  assert_int_equal(stores_stats().attend_batches - batches0, msgs);
  ra_remote_batch_free(rb);
  for (int i = 0; i < N; i++) ra_offload_free(via[i]);
  ra_wave_buffer_stats bt;
  ra_wave_buffer_totals(ra_offload_wave(batched[1]), &bt);
  assert_true(bt.hits > 0);
  /* a batch selection of no sequences, or of a runtime with retro (which decodes alone), is
   * refused */
  ra_wave_selection out[1];
  assert_int_equal(ra_wave_select_batch(NULL, NULL, 0, 0, 1.0f, out, &err), RA_EINVAL);
  ra_offload_config rc_cfg = c[0];
  rc_cfg.retro_window = 2;
  ra_offload *with_retro = offload_new(&p.plan, &rc_cfg);
  ok(ra_offload_prefill(with_retro, toks[0], N_PROMPT, NULL, &err), &err);
  ra_wave *rw = (ra_wave *)ra_offload_wave(with_retro);
  const ra_tensor *rq = &ra_offload_state(with_retro)->cur_q;
  assert_int_equal(ra_wave_select_batch(&rw, &rq, 1, 0, 1.0f, out, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "retro"));
  ra_offload_free(with_retro);
  /* a group of 0 sequences is refused when the runtime is made */
  ra_offload_config zero = c[0];
  zero.select_group = 0;
  ra_offload *none = NULL;
  assert_int_equal(ra_offload_new(F.m, &p.plan, &zero, &none, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "select_group"));
  assert_null(none);
  /* one batch, one model */
  ra_model *other;
  ok(ra_model_random(F.be, &F.m->cfg, 12, &other, &err), &err);
  ra_offload_config oc = c[0];
  ra_offload *foreign;
  ok(ra_offload_new(other, &p.plan, &oc, &foreign, &err), &err);
  ra_offload *mixed[2] = {batched[0], foreign};
  int32_t two[2] = {1, 2};
  int rcs[2];
  ra_error errs[2];
  assert_int_equal(ra_offload_decode_batch(mixed, two, 2, b, NULL, rcs, errs, NULL, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "another model"));
  ra_offload_free(foreign);
  ra_model_free(other);
  free(want);
  free(got);
  ra_batch_free(b);
  for (int i = 0; i < N; i++) {
    ra_offload_free(alone[i]);
    ra_offload_free(batched[i]);
  }
  plan_free(&p);
}

/* ra_offload_prefill_begin / _next: a wave prefill in pieces of rows that end within layers
 * and cross from one layer into the next, with another runtime decoding between the pieces,
 * gives the logits of the whole prefill and decodes as it does; a decode or a second prefill
 * during it is refused; a runtime freed within a layer of its prefill closes its sessions (the
 * stores free what it sent). */
static void test_prefill_in_pieces(void **state) {
  (void)state;
  enum { STEPS = 12 };
  const int vocab = F.m->cfg.vocab;
  plan_of p;
  plan_make(&p, NULL, SINK, WINDOW);
  ra_offload_config c;
  wave_config(&c, &p.plan, 0.15, 0.3, 0, STEPS + 1);
  ra_error err;
  ra_offload *whole = offload_new(&p.plan, &c), *pieces = offload_new(&p.plan, &c), *other = offload_new(&p.plan, &c);
  ok(ra_offload_prefill(other, F.tokens + 7, N_PROMPT, NULL, &err), &err);
  ok(ra_offload_prefill(whole, F.tokens, N_PROMPT, NULL, &err), &err);
  ok(ra_offload_prefill_begin(pieces, F.tokens, N_PROMPT, &err), &err);
  int done = 0, n_pieces = 0;
  assert_int_equal(ra_offload_prefill_next(pieces, 0, &done, NULL, &err), RA_EINVAL);
  assert_int_equal(ra_offload_prefill_begin(pieces, F.tokens, N_PROMPT, &err), RA_ESTATE);
  assert_int_equal(ra_offload_decode(pieces, 1, NULL, &err), RA_ESTATE);
  ra_offload_stats st;
  const int64_t piece = N_PROMPT * 2 / 5 + 7, all = (int64_t)N_PROMPT * F.m->cfg.n_layers;
  while (!done) {
    ok(ra_offload_prefill_next(pieces, piece, &done, &st, &err), &err);
    n_pieces++;
    ok(ra_offload_decode(other, F.tokens[N_PROMPT + n_pieces], NULL, &err), &err);
  }
  assert_int_equal(n_pieces, (all + piece - 1) / piece);
  assert_true(st.n_offloaded > 0);
  assert_int_equal(ra_offload_prefill_next(pieces, 1, &done, NULL, &err), RA_ESTATE);
  float *want = malloc((size_t)vocab * sizeof *want), *got = malloc((size_t)vocab * sizeof *got);
  assert_non_null(want);
  assert_non_null(got);
  double worst = 0;
  for (int t = 0; t <= STEPS; t++) {
    if (t > 0) {
      ok(ra_offload_decode(whole, F.tokens[N_PROMPT + t], NULL, &err), &err);
      ok(ra_offload_decode(pieces, F.tokens[N_PROMPT + t], NULL, &err), &err);
    }
    last_logits(ra_offload_state(whole), want);
    last_logits(ra_offload_state(pieces), got);
    for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs((double)want[v] - got[v]));
  }
  print_message("prefill in %d pieces (another runtime decoding between them): max |logit diff| %.2e\n", n_pieces,
                worst);
  assert_true(worst < 1e-5);
  /* freed in its third layer: its sessions close, the stores hold what they held */
  ra_kvclient_store_stats before = stores_stats();
  ra_offload *left = offload_new(&p.plan, &c);
  ok(ra_offload_prefill_begin(left, F.tokens, N_PROMPT, &err), &err);
  ok(ra_offload_prefill_next(left, 2 * N_PROMPT + N_PROMPT / 2, &done, NULL, &err), &err);
  assert_false(done);
  assert_true(stores_stats().bytes_used > before.bytes_used);
  ra_offload_free(left);
  ra_kvclient_store_stats after = stores_stats();
  assert_int_equal(after.sessions, before.sessions);
  assert_int_equal(after.bytes_used, before.bytes_used);
  free(want);
  free(got);
  ra_offload_free(whole);
  ra_offload_free(pieces);
  ra_offload_free(other);
  plan_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_retrieved_equals_full),
      cmocka_unit_test(test_growth_blocks_keep_every_token),
      cmocka_unit_test(test_kv_head_split_by_tokens),
      cmocka_unit_test(test_all_estimated_scans_only_the_lag),
      cmocka_unit_test(test_seeded_decodes_as_prefilled),
      cmocka_unit_test(test_buffer_equals_off),
      cmocka_unit_test(test_buffer_steady_hits),
      cmocka_unit_test(test_buffer_evicts_and_splits),
      cmocka_unit_test(test_buffer_int8_stores),
      cmocka_unit_test(test_decode_batch_equals_alone),
      cmocka_unit_test(test_prefill_in_pieces),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
