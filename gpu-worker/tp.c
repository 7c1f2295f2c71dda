#include "tp.h"

#include "log.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef RA_WITH_CUDA
#include "backend_cuda.h"
#endif

/* ---------- plan ---------- */

static void block(int n, int n_ranks, int r, int *lo, int *hi) {
  *lo = (int)((int64_t)n * r / n_ranks);
  *hi = (int)((int64_t)n * (r + 1) / n_ranks);
}

int ra_tp_plan_make(const ra_model_config *c, int n_ranks, ra_tp_plan *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  int max = c->n_kv_heads < RA_TP_MAX_RANKS ? c->n_kv_heads : RA_TP_MAX_RANKS;
  if (n_ranks < 1 || n_ranks > max)
    return ra_errorf(err, RA_EINVAL, "tp: %d ranks for %d kv heads (1 to %d: a rank holds whole kv heads)", n_ranks,
                     c->n_kv_heads, max);
  if (c->ffn_dim < n_ranks) return ra_errorf(err, RA_EINVAL, "tp: %d ranks for %d FFN columns", n_ranks, c->ffn_dim);
  const int group = c->n_heads / c->n_kv_heads;
  out->n_ranks = n_ranks;
  for (int r = 0; r < n_ranks; r++) {
    ra_tp_slice *s = &out->ranks[r];
    block(c->n_kv_heads, n_ranks, r, &s->kv_lo, &s->kv_hi);
    s->q_lo = s->kv_lo * group;
    s->q_hi = s->kv_hi * group;
    block(c->ffn_dim, n_ranks, r, &s->ffn_lo, &s->ffn_hi);
  }
  return RA_OK;
}

/* ---------- weight slicing ---------- */

#define SLICE_CHUNK_FLOATS ((size_t)1 << 22)

/* dst (new, F32, on be) = src[r0 : r0 + rows, c0 : c0 + cols] of a 2-D src [R, C], through a
 * host buffer of up to SLICE_CHUNK_FLOATS (whole rows at a time). */
static int slice_matrix(const ra_tensor *src, int64_t r0, int64_t rows, int64_t c0, int64_t cols, ra_backend *be,
                        ra_tensor *dst, ra_error *err) {
  if (src->ndim != 2 || r0 < 0 || c0 < 0 || r0 + rows > src->shape[0] || c0 + cols > src->shape[1])
    return ra_errorf(err, RA_EINTERNAL, "tp: slice [%lld+%lld, %lld+%lld] of a %d-D tensor", (long long)r0,
                     (long long)rows, (long long)c0, (long long)cols, src->ndim);
  int64_t shape[2] = {rows, cols};
  int rc = ra_tensor_new(be, dst, RA_DTYPE_F32, 2, shape, err);
  if (rc) return rc;
  const int64_t C = src->shape[1];
  int64_t per = (int64_t)(SLICE_CHUNK_FLOATS / (size_t)cols);
  if (per < 1) per = 1;
  if (per > rows) per = rows;
  float *buf = malloc((size_t)per * (size_t)cols * sizeof(float));
  if (!buf) rc = ra_errorf(err, RA_ENOMEM, "tp: out of memory slicing a [%lld, %lld] weight", (long long)src->shape[0],
                           (long long)C);
  for (int64_t i = 0; rc == RA_OK && i < rows; i += per) {
    int64_t n = rows - i < per ? rows - i : per;
    if (cols == C) {
      rc = src->be->ops->download(src->be, src, (size_t)(r0 + i) * (size_t)C, buf, (size_t)(n * C), err);
    } else {
      for (int64_t j = 0; rc == RA_OK && j < n; j++)
        rc = src->be->ops->download(src->be, src, (size_t)(r0 + i + j) * (size_t)C + (size_t)c0, buf + j * cols,
                                    (size_t)cols, err);
    }
    if (rc == RA_OK) rc = be->ops->upload(be, dst, (size_t)(i * cols), buf, (size_t)(n * cols), err);
  }
  free(buf);
  if (rc) ra_tensor_free(dst);
  return rc;
}

static int copy_whole(const ra_tensor *src, ra_backend *be, ra_tensor *dst, ra_error *err) {
  return slice_matrix(src, 0, src->shape[0], 0, src->shape[1], be, dst, err);
}

static int shard_layer(const ra_model *src, int l, const ra_tp_slice *s, ra_backend *be, ra_layer_weights *w,
                       ra_error *err) {
  const ra_layer_weights *sw = &src->layers[l];
  const int64_t hd = src->cfg.head_dim, dim = src->cfg.dim;
  const int64_t q0 = s->q_lo * hd, nq = (s->q_hi - s->q_lo) * hd, k0 = s->kv_lo * hd, nk = (s->kv_hi - s->kv_lo) * hd;
  const int64_t f0 = s->ffn_lo, nf = s->ffn_hi - s->ffn_lo;
  int rc;
  if ((rc = copy_whole(&sw->attn_norm, be, &w->attn_norm, err)) || (rc = copy_whole(&sw->ffn_norm, be, &w->ffn_norm, err)) ||
      (rc = slice_matrix(&sw->wq, q0, nq, 0, dim, be, &w->wq, err)) ||
      (rc = slice_matrix(&sw->wk, k0, nk, 0, dim, be, &w->wk, err)) ||
      (rc = slice_matrix(&sw->wv, k0, nk, 0, dim, be, &w->wv, err)) ||
      (rc = slice_matrix(&sw->wo, 0, dim, q0, nq, be, &w->wo, err)) ||
      (rc = slice_matrix(&sw->w_gate, f0, nf, 0, dim, be, &w->w_gate, err)) ||
      (rc = slice_matrix(&sw->w_up, f0, nf, 0, dim, be, &w->w_up, err)) ||
      (rc = slice_matrix(&sw->w_down, 0, dim, f0, nf, be, &w->w_down, err)))
    return rc;
  if (src->cfg.qkv_bias && ((rc = slice_matrix(&sw->bq, 0, 1, q0, nq, be, &w->bq, err)) ||
                            (rc = slice_matrix(&sw->bk, 0, 1, k0, nk, be, &w->bk, err)) ||
                            (rc = slice_matrix(&sw->bv, 0, 1, k0, nk, be, &w->bv, err))))
    return rc;
  return RA_OK;
}

int ra_tp_model_shard(const ra_model *src, const struct ra_tp_rank *tp, ra_backend *be, ra_model **out,
                      ra_error *err) {
  *out = NULL;
  const ra_tp_slice *s = &tp->slice;
  ra_model *m = calloc(1, sizeof *m);
  if (m) m->layers = calloc((size_t)src->cfg.n_layers, sizeof(ra_layer_weights));
  if (!m || !m->layers) {
    free(m);
    return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  }
  m->cfg = src->cfg;
  m->cfg.n_heads = s->q_hi - s->q_lo;
  m->cfg.n_kv_heads = s->kv_hi - s->kv_lo;
  m->cfg.ffn_dim = s->ffn_hi - s->ffn_lo;
  m->be = be;
  m->tp = tp;
  int rc = ra_model_config_validate(&m->cfg, err);
  if (rc == RA_OK) rc = copy_whole(&src->tok_embd, be, &m->tok_embd, err);
  if (rc == RA_OK) rc = copy_whole(&src->out_norm, be, &m->out_norm, err);
  if (rc == RA_OK && !src->cfg.tied_embeddings) rc = copy_whole(&src->output, be, &m->output, err);
  for (int l = 0; rc == RA_OK && l < src->cfg.n_layers; l++)
    if ((rc = shard_layer(src, l, s, be, &m->layers[l], err))) ra_error_wrap(err, "layer %d", l);
  /* keep the source's storage (e.g. BF16 on CUDA); slices come through host memory as F32 */
  if (rc == RA_OK && src->layers[0].wq.dtype != RA_DTYPE_F32) rc = ra_model_convert_weights(m, src->layers[0].wq.dtype, err);
  if (rc) {
    ra_model_free(m);
    ra_error_wrap(err, "tp rank %d", tp->rank);
    return rc;
  }
  *out = m;
  return RA_OK;
}

/* ---------- shard map ---------- */

int ra_tp_shard_map(const ra_shard_map *map, const ra_tp_slice *s, ra_shard_map *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  const uint32_t lo = (uint32_t)s->kv_lo, hi = (uint32_t)s->kv_hi - 1; /* inclusive, as rules are */
  out->rules = calloc(map->n_rules ? map->n_rules : 1, sizeof *out->rules);
  out->stores = calloc(map->n_stores ? map->n_stores : 1, sizeof *out->stores);
  uint32_t *renum = malloc((map->n_stores ? map->n_stores : 1) * sizeof(uint32_t));
  if (!out->rules || !out->stores || !renum) {
    free(renum);
    ra_shard_map_free(out);
    return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  }
  for (size_t i = 0; i < map->n_stores; i++) renum[i] = UINT32_MAX;
  for (size_t i = 0; i < map->n_rules; i++) {
    ra_shard_rule r = map->rules[i];
    if (r.head_hi < lo || r.head_lo > hi) continue;
    r.head_lo = (r.head_lo > lo ? r.head_lo : lo) - lo;
    r.head_hi = (r.head_hi < hi ? r.head_hi : hi) - lo;
    /* every owner (replicas) renumbered in order of first appearance */
    for (uint32_t j = 0; j < r.n_owners; j++) {
      const uint32_t st = r.owners[j];
      if (renum[st] == UINT32_MAX) {
        renum[st] = (uint32_t)out->n_stores;
        memcpy(out->stores[out->n_stores++], map->stores[st], RA_ADDR_MAX);
      }
      r.owners[j] = renum[st];
    }
    r.store = r.owners[0];
    out->rules[out->n_rules++] = r;
  }
  free(renum);
  return RA_OK;
}

/* ---------- group ---------- */

void ra_tp_group_free(ra_tp_group *g) {
  if (!g) return;
  for (int r = 0; r < g->n_ranks; r++) {
    ra_model_free(g->models[r]);
    ra_backend_destroy(g->bes[r]);
  }
  ra_tp_comm_free(g->comm);
  free(g);
}

int ra_tp_group_new(const ra_model *src, int n_ranks, const char *backend, const ra_backend_config *bc,
                    ra_tp_group **out, ra_error *err) {
  *out = NULL;
  ra_tp_group *g = calloc(1, sizeof *g);
  if (!g) return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  int rc = ra_tp_plan_make(&src->cfg, n_ranks, &g->plan, err);
  if (rc) {
    free(g);
    return rc;
  }
  const int is_cpu = strcmp(backend, "cpu") == 0;
  int threads = bc && bc->n_threads > 0 ? bc->n_threads : omp_get_num_procs();
  g->threads_per_rank = threads / n_ranks > 0 ? threads / n_ranks : 1;
  for (int r = 0; r < n_ranks && rc == RA_OK; r++) {
    ra_backend_config rb = {.n_threads = g->threads_per_rank, .device = is_cpu ? 0 : r};
    if ((rc = ra_backend_create(backend, &rb, &g->bes[r], err))) ra_error_wrap(err, "tp rank %d", r);
    else g->n_ranks = r + 1;
  }
  if (rc == RA_OK && !is_cpu) {
    ra_error nerr;
    rc = ra_tp_comm_nccl_new(n_ranks, g->bes, &g->comm, &nerr);
    if (rc == RA_EUNSUPPORTED) {
      ra_log_warn("%s; the all-reduce goes through host memory", nerr.msg);
      rc = RA_OK;
    } else if (rc && err) {
      *err = nerr;
    }
  }
  if (rc == RA_OK && !g->comm) rc = ra_tp_comm_host_new(n_ranks, &g->comm, err);
  for (int r = 0; r < n_ranks && rc == RA_OK; r++) {
    g->ranks[r] = (struct ra_tp_rank){.comm = g->comm, .rank = r, .n_ranks = n_ranks, .slice = g->plan.ranks[r],
                                      .n_heads = src->cfg.n_heads, .n_kv_heads = src->cfg.n_kv_heads};
    rc = ra_tp_model_shard(src, &g->ranks[r], g->bes[r], &g->models[r], err);
  }
  if (rc) {
    ra_tp_group_free(g);
    return rc;
  }
  *out = g;
  return RA_OK;
}

/* ---------- SPMD driver ---------- */

typedef struct rank_job {
  ra_tp_group *g;
  int rank;
  ra_tp_fn fn;
  void *ctx;
  int rc;
  ra_error err;
} rank_job;

static void *rank_main(void *arg) {
  rank_job *j = arg;
  ra_backend *be = j->g->bes[j->rank];
  ra_error_clear(&j->err);
  j->rc = RA_OK;
  /* a new thread starts from the default OpenMP team size, not the rank's share of the cores */
  if (strcmp(be->name, "cpu") == 0) omp_set_num_threads(j->g->threads_per_rank);
#ifdef RA_WITH_CUDA
  if (strcmp(be->name, "cuda") == 0) j->rc = ra_backend_cuda_bind(be, &j->err);
#endif
  if (j->rc == RA_OK) j->rc = j->fn(j->ctx, j->rank, j->g->models[j->rank], &j->err);
  if (j->rc != RA_OK) j->g->comm->ops->abort(j->g->comm);
  return NULL;
}

int ra_tp_run(ra_tp_group *g, ra_tp_fn fn, void *ctx, ra_error *err) {
  rank_job jobs[RA_TP_MAX_RANKS];
  pthread_t th[RA_TP_MAX_RANKS];
  int started = 0, rc = RA_OK;
  for (int r = 0; r < g->n_ranks; r++) {
    jobs[r] = (rank_job){.g = g, .rank = r, .fn = fn, .ctx = ctx};
    if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
      g->comm->ops->abort(g->comm);
      rc = ra_errorf(err, RA_ENOMEM, "tp: cannot start the thread of rank %d", r);
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  /* the root cause, not the cancellations it caused on the other ranks */
  for (int pass = 0; pass < 2 && rc == RA_OK; pass++)
    for (int r = 0; r < started && rc == RA_OK; r++)
      if (jobs[r].rc != RA_OK && (pass || jobs[r].rc != RA_ECANCELED)) {
        rc = jobs[r].rc;
        if (err) *err = jobs[r].err;
        ra_error_wrap(err, "tp rank %d", r);
      }
  return rc;
}
