/* The offloading runtime's decode: a step over the device's sink + window and the stores' partials,
 * layer by layer (wave: the zones ranked on the device first), with retrospective correction and
 * the batched step of several runtimes (serve). */
#include "offload_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The evicted position's K/V of every layer, from the rings, to its stores: the appends start
 * here and are waited for in evict_end. */
static int evict_begin(ra_offload *o, int64_t pos, ra_offload_stats *s, ra_error *err) {
  ra_backend *be = o->m->be;
  ra_state *st = o->st;
  uint64_t t0 = uv_hrtime();
  const size_t row = (size_t)ring_row(o, pos) * o->kv_row, nl = (size_t)o->m->cfg.n_layers;
  int rc = RA_OK;
  for (size_t l = 0; l < nl && rc == RA_OK; l++) {
    rc = be->ops->copy(be, &o->evict_dev, l * o->kv_row, &st->k_cache[l], row, o->kv_row, err);
    if (rc == RA_OK) rc = be->ops->copy(be, &o->evict_dev, (nl + l) * o->kv_row, &st->v_cache[l], row, o->kv_row, err);
  }
  if (rc == RA_OK) rc = be->ops->download(be, &o->evict_dev, 0, o->evict_k, 2 * nl * o->kv_row, err);
  if (rc == RA_OK) rc = ra_remote_append_start(o->remote, (uint64_t)pos, o->evict_k, o->evict_v, err);
  s->append_us += (double)(uv_hrtime() - t0) / 1e3;
  return rc;
}

static int evict_end(ra_offload *o, int64_t pos, ra_offload_stats *s, ra_error *err) {
  uint64_t t0 = uv_hrtime();
  int rc = ra_remote_append_wait(o->remote, err);
  uint64_t t1 = uv_hrtime();
  s->append_us += (double)(t1 - t0) / 1e3;
  /* wave: the rows are lag rows at the stores now; the growth block may turn them into clusters */
  if (rc == RA_OK && o->wave) {
    rc = ra_wave_evict(o->wave, pos, o->st->k_cache, o->st->v_cache, ring_row(o, pos), err);
    s->index_us += (double)(uv_hrtime() - t1) / 1e3;
  }
  return rc;
}

/* ---- retrospective correction: the output cache ----
 * Decode step k (from 1) keeps, per layer, its q, output and (m, l) per q head in slot
 * (k - 1) % W. A later step gives those past queries the stores' supplementary partials (over
 * the positions retrieved now that they have not seen), merges them in by LSE and runs the
 * corrected outputs through the rest of the layer with the new token, so the next layer's K/V of
 * those tokens are rewritten in the ring (they are still in the window: W < n_window). */
static size_t retro_slot(const ra_offload *o, uint64_t step) { return (size_t)((step - 1) % o->cfg.retro_window); }

/* Layer l's past queries of steps step - 1 .. step - P into rq, newest first. */
static void retro_gather_q(ra_offload *o, int l, uint64_t step, uint32_t P) {
  const size_t hq = (size_t)o->m->cfg.n_heads * (size_t)o->m->cfg.head_dim, w = o->cfg.retro_window;
  for (uint32_t j = 1; j <= P; j++)
    memcpy(o->rq + (j - 1) * hq, o->retro_q + ((size_t)l * w + retro_slot(o, step - j)) * hq, hq * sizeof(float));
}

/* Each past step's cached output merged with its supplementary partial (none without stores),
 * kept, and laid out in the step's row order (oldest first) in ratt. */
static void retro_merge(ra_offload *o, int l, uint64_t step, uint32_t P, int with_stores) {
  const int hd = o->m->cfg.head_dim, nh = o->m->cfg.n_heads;
  const size_t hq = (size_t)nh * (size_t)hd, w = o->cfg.retro_window;
  for (uint32_t j = 1; j <= P; j++) {
    const size_t sl = (size_t)l * w + retro_slot(o, step - j);
    float *co = o->retro_o + sl * hq, *cml = o->retro_ml + sl * (size_t)nh * 2;
    for (int h = 0; with_stores && h < nh; h++) {
      ra_partial acc = {.o = co + (size_t)h * hd, .m = cml[2 * h], .l = cml[2 * h + 1]};
      const size_t at = (size_t)(j - 1) * nh + h;
      ra_partial_merge(&acc, o->ro + at * hd, o->rml[2 * at], o->rml[2 * at + 1], hd);
      cml[2 * h] = acc.m;
      cml[2 * h + 1] = acc.l;
    }
    memcpy(o->ratt + (size_t)(P - j) * hq, co, hq * sizeof(float));
  }
}

/* The current step's q (q_host), output and (m, l) into its slot of layer l. */
static int retro_keep(ra_offload *o, int l, uint64_t step, const ra_tensor *att1, ra_error *err) {
  ra_backend *be = o->m->be;
  const size_t nh = (size_t)o->m->cfg.n_heads, hq = nh * (size_t)o->m->cfg.head_dim;
  const size_t sl = (size_t)l * o->cfg.retro_window + retro_slot(o, step);
  memcpy(o->retro_q + sl * hq, o->q_host, hq * sizeof(float));
  int rc = be->ops->download(be, att1, 0, o->retro_o + sl * hq, hq, err);
  if (rc == RA_OK) rc = be->ops->download(be, &o->st->dec_ml, 0, o->retro_ml + sl * nh * 2, nh * 2, err);
  return rc;
}

/* Step setup: the evicted token's appends to its stores started (d->evicted), the device's
 * ranges (sink + window). decode_setup_end waits for the appends. */
static int decode_setup_begin(ra_offload *o, decode_step *d, ra_error *err) {
  memset(d, 0, sizeof *d);
  d->evicted = -1;
  d->t0 = uv_hrtime();
  int64_t n = d->n = o->st->pos; /* the new token's position */
  if (n == 0 || o->pf.active) return ra_errorf(err, RA_ESTATE, "offload: decode before its prefill is done");
  int rc = RA_OK;
  int64_t ev = ra_partition_evicted(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n);
  if (ev >= 0 && o->remote && (rc = evict_begin(o, ev, &d->s, err)) == RA_OK) d->evicted = ev;
  /* After this step the stores hold [S, n + 1 - W); the ring holds the sink and the window. */
  ra_partition_offloaded(o->cfg.n_sink, o->cfg.n_window, (uint64_t)n + 1, &d->off_b, &d->off_e);
  d->remote = o->remote && d->off_e > d->off_b;
  int64_t s_end = n + 1 < (int64_t)o->cfg.n_sink ? n + 1 : (int64_t)o->cfg.n_sink;
  d->ranges[d->n_ranges++] = (ra_token_range){0, s_end};
  if (n + 1 > (int64_t)o->cfg.n_sink) {
    int64_t w = n + 1 - (int64_t)o->cfg.n_sink < (int64_t)o->cfg.n_window ? n + 1 - (int64_t)o->cfg.n_sink
                                                                           : (int64_t)o->cfg.n_window;
    d->ranges[d->n_ranges++] = (ra_token_range){o->cfg.n_sink, (int64_t)o->cfg.n_sink + w};
  }
  /* retro: the step is the P past decoded tokens (rows 0 .. P - 1, corrected) and the new one
   * (row P) at positions n - P .. n */
  d->retro = o->cfg.retro_window > 0;
  d->step = o->n_decoded + 1;
  d->P = d->retro ? (uint32_t)(o->n_decoded < o->cfg.retro_window ? o->n_decoded : o->cfg.retro_window) : 0;
  d->scale = 1.0f / sqrtf((float)o->m->cfg.head_dim);
  if (o->wave) ra_wave_buffer_totals(o->wave, &d->b0);
  return rc;
}

static int decode_setup_end(ra_offload *o, decode_step *d, ra_error *err) {
  if (d->evicted < 0) return RA_OK;
  int64_t ev = d->evicted;
  d->evicted = -1;
  return evict_end(o, ev, &d->s, err);
}

static int decode_setup(ra_offload *o, decode_step *d, ra_error *err) {
  int rc = decode_setup_begin(o, d, err);
  int rc2 = decode_setup_end(o, d, err);
  return rc ? rc : rc2;
}

/* Layer l, wave: the zones ranked on the device for the new token's q1 [1, n_heads, hd]. */
static int decode_layer_select(ra_offload *o, decode_step *d, int l, const ra_tensor *q1, ra_error *err) {
  uint64_t ts = uv_hrtime();
  int rc = ra_wave_select(o->wave, l, q1, d->scale, d->step, d->P, &d->sel, &d->est_o, &d->est_ml, err);
  d->s.select_us += (double)(uv_hrtime() - ts) / 1e3;
  return rc;
}

/* Layer l, the new token's q in o->q_host: the stores' requests (wave: the selection's). */
static int decode_layer_request(ra_offload *o, decode_step *d, int l, ra_error *err) {
  if (d->remote && d->retro) retro_gather_q(o, l, d->step, d->P);
  if (d->remote && d->sel)
    return ra_remote_attend_begin_wave(o->remote, (uint32_t)l, o->q_host, d->sel, d->step, d->retro ? d->P : 0, o->rq,
                                       err);
  if (d->remote && d->retro) return ra_remote_attend_begin_retro(o->remote, (uint32_t)l, o->q_host, d->step, d->P, o->rq, err);
  if (d->remote) return ra_remote_attend_begin(o->remote, (uint32_t)l, o->q_host, err);
  return RA_OK;
}

/* Layer l, the new token's q1 [1, n_heads, hd]: the stores' requests (wave: after ranking the
 * zones on the device, since the requests carry the retrieval zone). */
static int decode_layer_send(ra_offload *o, decode_step *d, int l, const ra_tensor *q1, ra_error *err) {
  ra_backend *be = o->m->be;
  size_t hq = (size_t)o->m->cfg.n_heads * (size_t)o->m->cfg.head_dim;
  d->sel = NULL;
  d->est_o = d->est_ml = NULL;
  int rc = d->remote && o->wave ? decode_layer_select(o, d, l, q1, err) : RA_OK;
  if (rc == RA_OK && (d->remote || d->retro)) rc = be->ops->download(be, q1, 0, o->q_host, hq, err);
  return rc == RA_OK ? decode_layer_request(o, d, l, err) : rc;
}

/* Layer l: the device's own partial over sink + window (and wave's estimate and buffer), then the
 * stores' merged partial waited for and merged in: att1 [1, n_heads, hd]. */
static int decode_layer_attend(ra_offload *o, decode_step *d, int l, const ra_tensor *q1, ra_tensor *att1,
                               int sync_first, ra_error *err) {
  ra_backend *be = o->m->be;
  ra_state *st = o->st;
  const ra_model_config *c = &o->m->cfg;
  size_t hq = (size_t)c->n_heads * (size_t)c->head_dim;
  int rc = d->ring_done ? RA_OK
                        : be->ops->attn_decode(be, q1, &st->k_cache[l], &st->v_cache[l], d->ranges, d->n_ranges,
                                               d->scale, att1, &st->dec_ml, err);
  if (rc == RA_OK && d->est_o) rc = be->ops->attn_merge(be, att1, &st->dec_ml, d->est_o, d->est_ml, err);
  /* wave: the retrieved clusters the device buffer holds (the stores were not asked for them) */
  if (rc == RA_OK && d->sel) {
    const ra_tensor *buf_o, *buf_ml;
    rc = ra_wave_attend_buffer(o->wave, l, q1, d->scale, &buf_o, &buf_ml, err);
    if (rc == RA_OK && buf_o) rc = be->ops->attn_merge(be, att1, &st->dec_ml, buf_o, buf_ml, err);
  }
  if (rc == RA_OK && d->remote) {
    /* alone, the wait is timed from the device's own partial on; in a batch the device keeps
     * working on the other sequences while this one's replies are awaited */
    if (sync_first) rc = be->ops->sync(be, err);
    uint64_t tw = uv_hrtime();
    ra_remote_stats rs;
    if (rc == RA_OK)
      rc = ra_remote_attend_end_retro(o->remote, o->o_host, o->ml_host, d->retro ? o->ro : NULL,
                                      d->retro ? o->rml : NULL, &rs, err);
    uint64_t tm = uv_hrtime();
    d->s.wait_us += (double)(tm - tw) / 1e3;
    if (rc == RA_OK) {
      d->s.store_us += rs.store_us;
      d->s.n_scanned += rs.n_scanned;
      d->s.retro_rows += rs.retro_rows;
      d->s.retro_store_us += rs.retro_us;
      rc = be->ops->upload(be, &o->rem_o, 0, o->o_host, hq, err);
    }
    if (rc == RA_OK) rc = be->ops->upload(be, &o->rem_ml, 0, o->ml_host, (size_t)c->n_heads * 2, err);
    if (rc == RA_OK) rc = be->ops->attn_merge(be, att1, &st->dec_ml, &o->rem_o, &o->rem_ml, err);
    d->s.merge_us += (double)(uv_hrtime() - tm) / 1e3;
    /* wave: the misses' rows are fetched for the buffer while the next layers compute */
    if (rc == RA_OK && d->sel) rc = ra_wave_admit(o->wave, l, err);
  }
  return rc;
}

/* The step's bookkeeping once the forward is done: retro's slot, timings. */
static int decode_finish(ra_offload *o, decode_step *d, int32_t token, ra_offload_stats *stats, ra_error *err) {
  ra_offload_stats s = d->s;
  if (d->retro) {
    o->retro_tok[retro_slot(o, d->step)] = token;
    o->n_decoded = d->step;
    s.retro_past = d->P;
  }
  s.n_offloaded = o->remote ? d->off_e - d->off_b : 0;
  if (o->wave) {
    ra_wave_buffer_stats b1;
    ra_wave_buffer_totals(o->wave, &b1);
    s.buffer_hits = b1.hits - d->b0.hits;
    s.buffer_misses = b1.misses - d->b0.misses;
    s.buffer_rows = b1.rows - d->b0.rows;
    s.fetch_us = b1.fetch_us - d->b0.fetch_us;
  }
  s.total_us = (double)(uv_hrtime() - d->t0) / 1e3;
  if (o->n_steps == o->steps_cap) {
    size_t cap = o->steps_cap ? 2 * o->steps_cap : 64;
    ra_offload_stats *grown = realloc(o->steps, cap * sizeof *grown);
    if (!grown) return ra_errorf(err, RA_ENOMEM, "offload: out of memory for step timings");
    o->steps = grown;
    o->steps_cap = cap;
  }
  o->steps[o->n_steps++] = s;
  if (stats) *stats = s;
  return RA_OK;
}

int ra_offload_decode(ra_offload *o, int32_t token, ra_offload_stats *stats, ra_error *err) {
  ra_state *st = o->st;
  ra_backend *be = o->m->be;
  const ra_model_config *c = &o->m->cfg;
  decode_step *d = &o->ds;
  int rc = decode_setup(o, d, err);
  if (d->n == 0) return rc;
  int64_t n = d->n;
  const int retro = d->retro;
  const uint64_t step = d->step;
  const uint32_t P = d->P;
  int32_t batch[RA_OFFLOAD_MAX_RETRO + 1];
  for (uint32_t i = 0; i < P; i++) batch[i] = o->retro_tok[retro_slot(o, step - P + i)];
  batch[P] = token;
  st->pos = n - P;
  if (rc == RA_OK) rc = ra_step_begin(st, batch, (int64_t)P + 1, err);
  if (rc == RA_OK) {
    st->cache_row = ring_row(o, n - P);
    for (uint32_t i = 1; i <= P; i++)
      if (ring_row(o, n - P + i) != st->cache_row + i) {
        st->wrap_at = i;
        st->wrap_row = ring_row(o, n - P + i);
        break;
      }
  }
  size_t hq = (size_t)c->n_heads * (size_t)c->head_dim;
  for (int l = 0; l < c->n_layers && rc == RA_OK; l++) {
    rc = ra_step_layer_qkv(st, l, err);
    ra_tensor q1 = ra_tensor_rows(&st->cur_q, P, 1), att1 = ra_tensor_rows(&st->cur_att, P, 1);
    if (rc == RA_OK) rc = decode_layer_send(o, d, l, &q1, err);
    if (rc == RA_OK) rc = decode_layer_attend(o, d, l, &q1, &att1, 1, err);
    if (rc == RA_OK && retro) {
      uint64_t tr = uv_hrtime();
      retro_merge(o, l, step, P, d->remote);
      rc = retro_keep(o, l, step, &att1, err);
      if (rc == RA_OK && P) rc = be->ops->upload(be, &st->cur_att, 0, o->ratt, (size_t)P * hq, err);
      d->s.retro_us += (double)(uv_hrtime() - tr) / 1e3;
    }
    if (rc == RA_OK && o->cfg.on_attn) {
      /* the hook sees the new token's attention, as without retro */
      ra_tensor all = st->cur_att;
      st->cur_att = att1;
      rc = o->cfg.on_attn(o->cfg.attn_ctx, st, l, err);
      st->cur_att = all;
    }
    if (rc == RA_OK) rc = ra_step_layer_finish(st, l, err);
  }
  if (rc == RA_OK) rc = ra_step_end(st, 0, err);
  if (rc == RA_OK) rc = be->ops->sync(be, err);
  if (rc != RA_OK) {
    st->n = 0;
    st->pos = n;
    return rc;
  }
  return decode_finish(o, d, token, stats, err);
}

/* ---- batched decode: the runtimes of a step as one group of ra_batch items (batch.h) ----
 * Per layer, the group's RoPE and cache rows are one op, wave's rankings one backend call with
 * one synchronization, q one download; then every sequence's requests go out, and each one's
 * end merges its stores' partial without waiting for the device. A sequence's failure (a
 * store's, say) is kept in its step (d->rc) rather than failing the batch: its later layers
 * attend on the device only and it reports the error after the step. */

typedef struct offload_group {
  ra_offload *const *os;    /* item j (row j of the step) is os[which[j]] */
  const int *which;
  int n;
  ra_rope_store_item *rope; /* [n] */
  ra_wave **ws;             /* [n]: the wave items of a layer, */
  const ra_tensor **qs;     /* their q rows, */
  ra_tensor *qv;
  ra_wave_selection *sel;   /* their selections, */
  int *wj;                  /* and their items */
  float *q_host;            /* [select_group, n_heads, head_dim] */
  ra_remote_batch *rb;      /* NULL: each sequence's requests on its own streams */
  ra_attn_decode_item *dec; /* [n]: the sequences' partials over their rings, */
  ra_tensor *dq, *datt;     /* [n] each: from their q rows into their att rows */
} offload_group;

static ra_offload *group_item(const offload_group *g, int j) { return g->os[g->which[j]]; }

/* Wave items among [j0, j1): their zones in one ranking call; a failure fails those sequences
 * alone. */
static void group_select(offload_group *g, int l, const ra_tensor *q, int j0, int j1) {
  int nw = 0;
  for (int j = j0; j < j1; j++) {
    ra_offload *o = group_item(g, j);
    decode_step *d = &o->ds;
    d->sel = NULL;
    d->est_o = d->est_ml = NULL;
    if (d->rc != RA_OK || !d->remote || !o->wave) continue;
    g->wj[nw] = j;
    g->ws[nw] = o->wave;
    g->qv[nw] = ra_tensor_rows(q, j, 1);
    g->qs[nw] = &g->qv[nw];
    nw++;
  }
  if (!nw) return;
  ra_error e;
  uint64_t ts = uv_hrtime();
  int rc = ra_wave_select_batch(g->ws, g->qs, nw, l, group_item(g, 0)->ds.scale, g->sel, &e);
  const double share = (double)(uv_hrtime() - ts) / 1e3 / nw;
  for (int i = 0; i < nw; i++) {
    decode_step *d = &group_item(g, g->wj[i])->ds;
    d->s.select_us += share;
    if (rc) {
      d->rc = rc;
      d->err = e;
      continue;
    }
    d->sel = g->sel[i].sel;
    d->est_o = g->sel[i].est_o;
    d->est_ml = g->sel[i].est_ml;
  }
}

/* The ring rows a step attends on the device when they are one prefix [0, *m) of the ring (the
 * sink fills rows [0, S) before the window's rows start at S). */
static int ring_prefix(const decode_step *d, int64_t *m) {
  if (d->n_ranges < 1 || d->ranges[0].begin != 0) return 0;
  if (d->n_ranges == 2 && d->ranges[1].begin != d->ranges[0].end) return 0;
  *m = d->ranges[d->n_ranges - 1].end;
  return 1;
}

/* Every sequence's partial over its ring (sink + window) in one attn_decode_batch, into its att
 * row and dec_ml: one launch per layer for the group instead of one per sequence, while the
 * stores work on the requests. */
static int group_rings(offload_group *g, int l, ra_tensor *q, ra_tensor *att, ra_error *err) {
  int nd = 0;
  for (int j = 0; j < g->n; j++) {
    ra_offload *o = group_item(g, j);
    decode_step *d = &o->ds;
    int64_t m;
    /* a failed launch fails the whole step, so a sequence may count on it already */
    d->ring_done = ring_prefix(d, &m);
    if (!d->ring_done) continue;
    g->dq[nd] = ra_tensor_rows(q, j, 1);
    g->datt[nd] = ra_tensor_rows(att, j, 1);
    g->dec[nd] = (ra_attn_decode_item){&g->dq[nd], &o->st->k_cache[l], &o->st->v_cache[l], m, &g->datt[nd],
                                       &o->st->dec_ml};
    nd++;
  }
  if (!nd) return RA_OK;
  ra_backend *be = group_item(g, 0)->m->be;
  return be->ops->attn_decode_batch(be, g->dec, nd, group_item(g, 0)->ds.scale, err);
}

/* The group's RoPE and cache rows, then per chunk of select_group sequences: their zones ranked,
 * their q downloaded and their requests sent, so that the stores start on a chunk while the
 * device ranks the next; then every sequence's ring attention. */
static int group_flush(void *ctx, int l, ra_tensor *q, ra_tensor *k, ra_tensor *v, ra_tensor *att, ra_error *err) {
  offload_group *g = ctx;
  const ra_offload *o0 = group_item(g, 0);
  const ra_model_config *c = &o0->m->cfg;
  ra_backend *be = o0->m->be;
  const size_t hq = (size_t)c->n_heads * (size_t)c->head_dim;
  for (int j = 0; j < g->n; j++) {
    ra_offload *o = group_item(g, j);
    g->rope[j] = (ra_rope_store_item){j, 1, o->ds.n, ring_row(o, o->ds.n), &o->st->k_cache[l], &o->st->v_cache[l]};
  }
  int rc = be->ops->rope_store_batch(be, q, k, v, g->rope, g->n, c->n_rot, c->rope_theta, c->rope_style, err);
  const int chunk = (int)o0->cfg.select_group;
  for (int j0 = 0; rc == RA_OK && j0 < g->n; j0 += chunk) {
    const int j1 = j0 + chunk < g->n ? j0 + chunk : g->n;
    group_select(g, l, q, j0, j1);
    int asks = 0;
    for (int j = j0; j < j1; j++) asks |= group_item(g, j)->ds.rc == RA_OK && group_item(g, j)->ds.remote;
    if (!asks) continue;
    ra_tensor qc = ra_tensor_rows(q, j0, j1 - j0);
    if ((rc = be->ops->download(be, &qc, 0, g->q_host, (size_t)(j1 - j0) * hq, err))) break;
    for (int j = j0; j < j1; j++) {
      ra_offload *o = group_item(g, j);
      decode_step *d = &o->ds;
      if (d->rc != RA_OK || !d->remote) continue;
      memcpy(o->q_host, g->q_host + (size_t)(j - j0) * hq, hq * sizeof(float));
      if (g->rb) ra_remote_attend_via(o->remote, g->rb);
      d->rc = decode_layer_request(o, d, l, &d->err);
    }
    if (g->rb) ra_remote_batch_send(g->rb);
  }
  return rc == RA_OK ? group_rings(g, l, q, att, err) : rc;
}

static int group_end(void *ctx, int j, int l, ra_tensor *q, ra_tensor *att, ra_error *err) {
  ra_offload *o = group_item(ctx, j);
  decode_step *d = &o->ds;
  if (d->rc) {
    d->remote = 0;
    d->sel = NULL;
    d->est_o = d->est_ml = NULL;
    return decode_layer_attend(o, d, l, q, att, 0, err);
  }
  d->rc = decode_layer_attend(o, d, l, q, att, 0, &d->err);
  return RA_OK;
}

static int batchable(const ra_offload *o) { return o->cfg.retro_window == 0 && !o->cfg.on_attn; }

int ra_offload_decode_batch(ra_offload *const *os, const int32_t *tokens, int n, ra_batch *b, ra_remote_batch *rb,
                            int *rcs, ra_error *errs, ra_offload_stats *stats, ra_error *err) {
  enum { MAX = RA_OFFLOAD_MAX_BATCH };
  if (n < 1 || n > MAX) return ra_errorf(err, RA_EINVAL, "offload: a batch of %d sequences (1 to %d)", n, MAX);
  ra_batch_item items[MAX];
  ra_rope_store_item rope[MAX];
  ra_wave *ws[MAX];
  const ra_tensor *qs[MAX];
  ra_tensor qv[MAX];
  ra_wave_selection sel[MAX];
  ra_attn_decode_item dec[MAX];
  ra_tensor dq[MAX], datt[MAX];
  int which[MAX], wj[MAX], n_items = 0;
  offload_group g = {os, which, 0, rope, ws, qs, qv, sel, wj, NULL, rb, dec, dq, datt};
  const ra_batch_attn attn = {&g, group_flush, group_end};
  for (int i = 1; i < n; i++)
    if (os[i]->m != os[0]->m) return ra_errorf(err, RA_EINVAL, "offload: sequence %d of a batch runs another model", i);
  for (int i = 0; i < n; i++) {
    ra_offload *o = os[i];
    ra_error_clear(&errs[i]);
    if (!batchable(o)) {
      rcs[i] = ra_offload_decode(o, tokens[i], stats ? &stats[i] : NULL, &errs[i]);
      continue;
    }
    /* every sequence's appends in flight before any is waited for */
    if ((rcs[i] = decode_setup_begin(o, &o->ds, &errs[i])) != RA_OK) {
      decode_setup_end(o, &o->ds, &errs[i]);
      continue;
    }
    items[n_items] = (ra_batch_item){o->st, &tokens[i], 1, &attn};
    which[n_items++] = i;
  }
  int n_set = 0;
  for (int j = 0; j < n_items; j++) {
    const int i = which[j];
    if ((rcs[i] = decode_setup_end(os[i], &os[i]->ds, &errs[i])) != RA_OK) continue;
    items[n_set] = items[j];
    which[n_set++] = i;
  }
  n_items = n_set;
  if (!n_items) return RA_OK;
  g.n = n_items;
  const ra_model_config *c = &os[which[0]]->m->cfg;
  const uint32_t group = os[which[0]]->cfg.select_group;
  const size_t chunk = group < (uint32_t)n_items ? group : (size_t)n_items;
  g.q_host = malloc(chunk * (size_t)c->n_heads * (size_t)c->head_dim * sizeof(float));
  ra_backend *be = os[which[0]]->m->be;
  const size_t vocab = (size_t)c->vocab;
  int rc = g.q_host ? ra_batch_forward(b, items, n_items, err)
                    : ra_errorf(err, RA_ENOMEM, "offload: out of memory for %d sequences' queries", n_items);
  free(g.q_host);
  if (rb) ra_remote_batch_end_step(rb);
  if (rc == RA_OK) rc = be->ops->sync(be, err);
  for (int j = 0; j < n_items; j++) {
    int i = which[j];
    ra_offload *o = os[i];
    decode_step *d = &o->ds;
    if (rc == RA_OK && d->rc == RA_OK)
      d->rc = be->ops->copy(be, &o->st->logits, 0, ra_batch_logits(b), (size_t)j * vocab, vocab, &d->err);
    if (rc != RA_OK || d->rc != RA_OK) {
      rcs[i] = rc != RA_OK ? rc : d->rc;
      errs[i] = rc != RA_OK ? *err : d->err;
      o->st->pos = d->n;
      o->st->n = 0;
      continue;
    }
    o->st->n_logits = 1;
    rcs[i] = decode_finish(o, d, tokens[i], stats ? &stats[i] : NULL, &errs[i]);
  }
  return rc;
}

int ra_offload_forward(void *ctx, ra_state *st, const int32_t *tokens, int64_t n, ra_error *err) {
  ra_offload *o = ctx;
  if (st != o->st) return ra_errorf(err, RA_EINVAL, "offload: forward on a state that is not the runtime's");
  if (st->pos == 0) return ra_offload_prefill(o, tokens, n, NULL, err);
  for (int64_t i = 0; i < n; i++) {
    int rc = ra_offload_decode(o, tokens[i], NULL, err);
    if (rc) return rc;
  }
  return RA_OK;
}

const ra_wave *ra_offload_wave(const ra_offload *o) { return o->wave; }

const ra_offload_stats *ra_offload_prefill_stats(const ra_offload *o) { return &o->prefill_stats; }

const ra_offload_stats *ra_offload_step_stats(const ra_offload *o, size_t *n_steps) {
  *n_steps = o->n_steps;
  return o->steps;
}
