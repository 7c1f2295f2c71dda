/* Tensor parallelism on the CPU simulation of N ranks: the shard plan, the host all-reduce, the
 * per-rank shard map, and the sharded forward (prefill with every position's logits, then
 * decode steps) against the unsharded one for N = 1, 2, 4, 8 on a 16 q / 8 kv head random
 * model with uneven FFN blocks and q/k/v biases, and for N = 3 on SmolLM2 (9 q / 3 kv heads). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf.h"
#include "model.h"
#include "tp.h"

#include "cpu_fixture.h"
#include "model_path.h"

/* Logits agree within TOL of the largest |logit| (the partial sums add in another order). */
#define TOL 2e-5f

static ra_model_config geometry(void) {
  ra_model_config c;
  assert_int_equal(ra_model_config_preset("tiny", &c, NULL), RA_OK);
  c.dim = 128;
  c.n_heads = 16;
  c.n_kv_heads = 8;
  c.head_dim = 16;
  c.n_rot = 16;
  c.ffn_dim = 203; /* blocks of 25 and 26 columns over 8 ranks */
  c.n_layers = 3;
  c.qkv_bias = 1;
  c.rope_style = RA_ROPE_NEOX;
  return c;
}

static void test_plan(void **state) {
  (void)state;
  ra_model_config c = geometry();
  ra_tp_plan p;
  ra_error err;
  assert_int_equal(ra_tp_plan_make(&c, 3, &p, &err), RA_OK);
  int kv = 0, ffn = 0;
  for (int r = 0; r < 3; r++) {
    const ra_tp_slice *s = &p.ranks[r];
    assert_int_equal(s->kv_lo, kv);
    assert_int_equal(s->q_lo, 2 * s->kv_lo);
    assert_int_equal(s->q_hi, 2 * s->kv_hi);
    assert_int_equal(s->ffn_lo, ffn);
    assert_in_range(s->kv_hi - s->kv_lo, 2, 3);
    assert_in_range(s->ffn_hi - s->ffn_lo, 67, 68);
    kv = s->kv_hi;
    ffn = s->ffn_hi;
  }
  assert_int_equal(kv, 8);
  assert_int_equal(ffn, 203);
  assert_int_equal(ra_tp_plan_make(&c, 9, &p, &err), RA_EINVAL);
  assert_non_null(strstr(err.msg, "whole kv heads"));
  assert_int_equal(ra_tp_plan_make(&c, 0, &p, &err), RA_EINVAL);
}

/* ---- the host all-reduce ---- */

typedef struct reduce_job {
  ra_tp_comm *comm;
  int rank, n, fail;
  ra_tensor x;
  int rc;
  ra_error err;
} reduce_job;

static void *reduce_main(void *arg) {
  reduce_job *j = arg;
  j->rc = RA_OK;
  for (int it = 0; it < 3 && j->rc == RA_OK; it++) {
    if (j->fail && it == 1) {
      j->comm->ops->abort(j->comm);
      j->rc = RA_EIO;
      break;
    }
    float v[7];
    for (int i = 0; i < 7; i++) v[i] = (float)(j->rank + 1) * (float)(i + it);
    j->rc = be->ops->upload(be, &j->x, 0, v, 7, &j->err);
    /* a rank passing a different count: every rank fails */
    ra_tensor x = j->n == 7 ? j->x : ra_tensor_rows(&j->x, 0, 1);
    if (j->rc == RA_OK) j->rc = ra_tp_all_reduce(j->comm, j->rank, &x, &j->err);
    if (j->rc == RA_OK && j->n == 7) {
      float got[7];
      assert_int_equal(be->ops->download(be, &j->x, 0, got, 7, NULL), RA_OK);
      for (int i = 0; i < 7; i++) assert_float_equal(got[i], 10.0f * (float)(i + it), 0.0f); /* 1+2+3+4 */
    }
  }
  return NULL;
}

static void run_reduce(int bad_count, int fail_rank, int *rcs) {
  ra_tp_comm *comm;
  assert_int_equal(ra_tp_comm_host_new(4, &comm, NULL), RA_OK);
  reduce_job jobs[4];
  pthread_t th[4];
  for (int r = 0; r < 4; r++) {
    jobs[r] = (reduce_job){.comm = comm, .rank = r, .n = r == bad_count ? 1 : 7, .fail = r == fail_rank};
    int64_t shape[1] = {7};
    assert_int_equal(ra_tensor_new(be, &jobs[r].x, RA_DTYPE_F32, 1, shape, NULL), RA_OK);
    assert_int_equal(pthread_create(&th[r], NULL, reduce_main, &jobs[r]), 0);
  }
  for (int r = 0; r < 4; r++) {
    pthread_join(th[r], NULL);
    rcs[r] = jobs[r].rc;
    ra_tensor_free(&jobs[r].x);
  }
  ra_tp_comm_free(comm);
}

static void test_all_reduce(void **state) {
  (void)state;
  int rcs[4];
  run_reduce(-1, -1, rcs);
  for (int r = 0; r < 4; r++) assert_int_equal(rcs[r], RA_OK);
  run_reduce(2, -1, rcs);
  for (int r = 0; r < 4; r++) assert_int_equal(rcs[r], RA_EINTERNAL);
  /* a rank that fails releases the others: no hang, they see the cancellation */
  run_reduce(-1, 1, rcs);
  assert_int_equal(rcs[1], RA_EIO);
  for (int r = 0; r < 4; r++)
    if (r != 1) assert_int_equal(rcs[r], RA_ECANCELED);
}

/* ---- the rank's shard map ---- */

static void test_shard_map(void **state) {
  (void)state;
  ra_shard_map map, sub;
  ra_error err;
  const char *text = "a:1 0-1 0-2 *\n"
                     "b:2 0-1 3-7 0-99\n"
                     "c:3 0-1 3-7 100-\n";
  assert_int_equal(ra_shard_map_parse(text, &map, &err), RA_OK);
  ra_tp_slice s = {.kv_lo = 2, .kv_hi = 6};
  assert_int_equal(ra_tp_shard_map(&map, &s, &sub, &err), RA_OK);
  assert_int_equal(ra_shard_map_validate(&sub, 2, 4, &err), RA_OK);
  assert_int_equal(sub.n_stores, 3);
  assert_int_equal(ra_shard_map_find(&sub, 1, 0, 5)->store, 0); /* global head 2 at a */
  assert_string_equal(sub.stores[ra_shard_map_find(&sub, 1, 3, 5)->store], "b:2");
  assert_string_equal(sub.stores[ra_shard_map_find(&sub, 0, 1, 100)->store], "c:3");
  ra_shard_map_free(&sub);
  /* a slice inside one rule's heads names only that store */
  s = (ra_tp_slice){.kv_lo = 0, .kv_hi = 2};
  assert_int_equal(ra_tp_shard_map(&map, &s, &sub, &err), RA_OK);
  assert_int_equal(sub.n_stores, 1);
  assert_int_equal(ra_shard_map_validate(&sub, 2, 2, &err), RA_OK);
  ra_shard_map_free(&sub);
  ra_shard_map_free(&map);
  /* replicas: every owner of a rule is renumbered into the rank's map */
  assert_int_equal(ra_shard_map_parse("a:1 0-1 0-3 *\nb:2,c:3 0-1 4-7 *\n", &map, &err), RA_OK);
  s = (ra_tp_slice){.kv_lo = 4, .kv_hi = 8};
  assert_int_equal(ra_tp_shard_map(&map, &s, &sub, &err), RA_OK);
  assert_int_equal(sub.n_stores, 2);
  assert_int_equal(ra_shard_map_validate(&sub, 2, 4, &err), RA_OK);
  const ra_shard_rule *r = ra_shard_map_find(&sub, 0, 1, 0);
  assert_non_null(r);
  assert_int_equal(r->n_owners, 2);
  assert_string_equal(sub.stores[r->owners[0]], "b:2");
  assert_string_equal(sub.stores[r->owners[1]], "c:3");
  ra_shard_map_free(&sub);
  ra_shard_map_free(&map);
}

/* ---- sharded == unsharded ---- */

typedef struct fwd_job {
  const int32_t *tokens;
  int n_prompt, n_decode;
  float *logits[RA_TP_MAX_RANKS]; /* per rank: [n_prompt + n_decode, vocab] */
} fwd_job;

/* The prompt in one step with every position's logits, then one decode step per token. */
static int forward_all(ra_model *m, const int32_t *tokens, int n_prompt, int n_decode, float *out, ra_error *err) {
  ra_state *st;
  const int64_t vocab = m->cfg.vocab;
  int rc = ra_state_new(m, n_prompt + n_decode, n_prompt, RA_DTYPE_F32, &st, err);
  if (rc) return rc;
  rc = ra_model_forward(st, tokens, n_prompt, 1, NULL, err);
  if (rc == RA_OK) rc = m->be->ops->download(m->be, &st->logits, 0, out, (size_t)(n_prompt * vocab), err);
  for (int i = 0; rc == RA_OK && i < n_decode; i++) {
    rc = ra_model_forward(st, tokens + n_prompt + i, 1, 0, NULL, err);
    if (rc == RA_OK)
      rc = m->be->ops->download(m->be, &st->logits, 0, out + (n_prompt + i) * vocab, (size_t)vocab, err);
  }
  ra_state_free(st);
  return rc;
}

static int rank_forward(void *ctx, int rank, ra_model *m, ra_error *err) {
  fwd_job *j = ctx;
  return forward_all(m, j->tokens, j->n_prompt, j->n_decode, j->logits[rank], err);
}

static void check_sharded(const ra_model *m, int n_ranks, int n_prompt, int n_decode) {
  const int n = n_prompt + n_decode;
  const size_t nl = (size_t)n * (size_t)m->cfg.vocab;
  int32_t *tokens = malloc((size_t)n * sizeof(int32_t));
  float *ref = malloc(nl * sizeof(float));
  for (int i = 0; i < n; i++) tokens[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab);
  ra_error err;
  assert_int_equal(forward_all((ra_model *)m, tokens, n_prompt, n_decode, ref, &err), RA_OK);
  ra_tp_group *g;
  ra_backend_config bc = {n_ranks, 0};
  assert_int_equal(ra_tp_group_new(m, n_ranks, "cpu", &bc, &g, &err), RA_OK);
  assert_string_equal(g->comm->name, "host");
  fwd_job j = {.tokens = tokens, .n_prompt = n_prompt, .n_decode = n_decode};
  for (int r = 0; r < n_ranks; r++) {
    assert_int_equal(g->models[r]->cfg.n_kv_heads, g->plan.ranks[r].kv_hi - g->plan.ranks[r].kv_lo);
    j.logits[r] = malloc(nl * sizeof(float));
  }
  int rc = ra_tp_run(g, rank_forward, &j, &err);
  if (rc) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, RA_OK);
  float amax = 0, dmax = 0;
  for (size_t i = 0; i < nl; i++) amax = fmaxf(amax, fabsf(ref[i]));
  for (int r = 0; r < n_ranks; r++) {
    for (size_t i = 0; i < nl; i++) {
      dmax = fmaxf(dmax, fabsf(j.logits[0][i] - ref[i]));
      /* the all-reduce gives every rank the same x, hence the same logits, bitwise */
      assert_memory_equal(&j.logits[r][i], &j.logits[0][i], sizeof(float));
    }
  }
  for (int r = 0; r < n_ranks; r++) free(j.logits[r]);
  fprintf(stderr, "tp %d: max |logit| %.3f, max |sharded - unsharded| %.3g\n", n_ranks, amax, dmax);
  assert_true(amax > 0.1f);
  assert_true(dmax <= TOL * amax);
  ra_tp_group_free(g);
  free(tokens);
  free(ref);
}

static void test_sharded_equals_unsharded(void **state) {
  (void)state;
  ra_model_config c = geometry();
  ra_model *m;
  assert_int_equal(ra_model_random(be, &c, 7, &m, NULL), RA_OK);
  const int ns[] = {1, 2, 4, 8};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) check_sharded(m, ns[i], 9, 4);
  ra_model_free(m);
  /* tied embeddings and MHA (group 1) */
  c.tied_embeddings = 1;
  c.n_heads = 8;
  c.qkv_bias = 0;
  assert_int_equal(ra_model_random(be, &c, 8, &m, NULL), RA_OK);
  check_sharded(m, 4, 6, 2);
  ra_model_free(m);
}

static void test_smollm2_three_ranks(void **state) {
  (void)state;
  const char *path = smollm2_path();
  assert_non_null(path);
  ra_gguf g;
  ra_model *m;
  ra_error err;
  assert_int_equal(ra_gguf_open(path, &g, &err), RA_OK);
  assert_int_equal(ra_model_load_gguf(be, &g, &m, &err), RA_OK);
  ra_gguf_close(&g);
  assert_int_equal(m->cfg.n_kv_heads, 3);
  check_sharded(m, 3, 6, 2);
  ra_model_free(m);
}

/* A rank that fails surfaces its own error, not the others' cancellations. */
static int fail_on_rank1(void *ctx, int rank, ra_model *m, ra_error *err) {
  if (rank == 1) return ra_errorf(err, RA_EIO, "rank one broke");
  return rank_forward(ctx, rank, m, err);
}

static void test_rank_failure(void **state) {
  (void)state;
  ra_model_config c = geometry();
  ra_model *m;
  assert_int_equal(ra_model_random(be, &c, 7, &m, NULL), RA_OK);
  ra_tp_group *g;
  ra_error err;
  assert_int_equal(ra_tp_group_new(m, 4, "cpu", NULL, &g, &err), RA_OK);
  int32_t tokens[4] = {1, 2, 3, 4};
  fwd_job j = {.tokens = tokens, .n_prompt = 3, .n_decode = 1};
  for (int r = 0; r < 4; r++) j.logits[r] = malloc((size_t)4 * (size_t)c.vocab * sizeof(float));
  assert_int_equal(ra_tp_run(g, fail_on_rank1, &j, &err), RA_EIO);
  assert_non_null(strstr(err.msg, "tp rank 1: rank one broke"));
  for (int r = 0; r < 4; r++) free(j.logits[r]);
  ra_tp_group_free(g);
  ra_model_free(m);
}

static void test_preset_70b(void **state) {
  (void)state;
  ra_model_config c;
  assert_int_equal(ra_model_config_preset("llama3-70b", &c, NULL), RA_OK);
  assert_int_equal(c.n_layers, 80);
  assert_int_equal(c.dim, 8192);
  assert_int_equal(c.n_heads, 64);
  assert_int_equal(c.n_kv_heads, 8);
  assert_int_equal(c.ffn_dim, 28672);
  assert_int_equal(c.vocab, 128256);
  assert_int_equal(ra_model_config_validate(&c, NULL), RA_OK);
  ra_tp_plan p;
  assert_int_equal(ra_tp_plan_make(&c, 8, &p, NULL), RA_OK);
  assert_int_equal(p.ranks[7].q_lo, 56);
  assert_int_equal(p.ranks[7].ffn_hi - p.ranks[7].ffn_lo, 3584);
  assert_int_equal(ra_model_config_preset("llama3-70b:2", &c, NULL), RA_OK);
  assert_int_equal(c.n_layers, 2);
  assert_string_equal(c.name, "random-llama3-70b-2L");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_shard_map),
      cmocka_unit_test(test_sharded_equals_unsharded),
      cmocka_unit_test(test_smollm2_three_ranks),
      cmocka_unit_test(test_rank_failure),
      cmocka_unit_test(test_preset_70b),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
