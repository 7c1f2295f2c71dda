/* The offloading runtime's state, shared by its two halves: offload.c (creation, the prefill and
 * seeding) and offload_decode.c (the decode step, alone or batched, with retrospective
 * correction). Not a public header: the runtime's API is offload.h. */
#ifndef RA_OFFLOAD_INTERNAL_H
#define RA_OFFLOAD_INTERNAL_H

#include "job_pipe.h"
#include "offload.h"

#include <uv.h>

/* One decode step of a runtime, between its setup and its finish (batched steps keep it per
 * sequence across the layers). */
typedef struct decode_step {
  uint64_t t0;
  int64_t n; /* the new token's position */
  ra_token_range ranges[2]; /* the device's rows: sink, window */
  int n_ranges;
  int remote, retro;     /* the stores hold rows; retrospective correction on */
  uint64_t step;         /* decode steps since the prefill, this one included */
  uint32_t P;            /* retro: past steps corrected */
  uint64_t off_b, off_e; /* the stores' rows after the step */
  float scale;
  const ra_remote_wave_sel *sel; /* wave: the layer's selection and the device's estimate */
  const ra_tensor *est_o, *est_ml;
  ra_wave_buffer_stats b0;
  ra_offload_stats s;
  int64_t evicted;       /* the position whose appends are in flight, or -1 */
  int rc; /* batched: the sequence's first failure, and its message */
  ra_error err;
  int ring_done; /* batched: the layer's partial over sink + window is in att1 and dec_ml already */
} decode_step;

/* Host K/V buffers a prefill reuses: K and V of the two layers in flight and of the one being
 * offloaded. */
#define RA_OFFLOAD_KV_POOL 6

/* A prefill between ra_offload_prefill_begin and its last layer: what the layers share. */
typedef struct prefill_run {
  int active;
  const int32_t *tokens; /* the caller's, [n] */
  int64_t n, n_q;        /* prompt tokens; roar's sampled queries per layer */
  int layer;             /* the layer under way, or the next to run */
  int64_t row;           /* its rows [0, row) have run (0: not begun; its scratch not swapped in) */
  int synthetic;
  float *q;              /* roar: the layer's sampled queries [n_q, n_heads, head_dim] (else NULL) */
  ra_job_pipe *pipe;     /* layers' offload jobs in flight (NULL without stores) */
  ra_offload_stats s;
  uint64_t t0;
} prefill_run;

struct ra_offload {
  const ra_model *m;
  const ra_offload_plan *plan;
  ra_offload_config cfg;
  ra_state *st;           /* per-layer caches are the rings: [S + W, n_kv_heads, head_dim] */
  ra_tensor scratch_k;    /* [max_prompt, n_kv_heads, head_dim]: one layer's prefill KV */
  ra_tensor scratch_v;
  ra_remote *remote;      /* NULL in streaming mode */
  ra_wave *wave;          /* wave mode's meta-index and growth block (NULL in other modes) */
  ra_tensor rem_o;        /* [n_heads, head_dim]: the stores' merged partial, on the backend */
  ra_tensor rem_ml;       /* [n_heads, 2] */
  ra_tensor q_pick;       /* roar: [build_queries, n_heads * head_dim], the sampled prefill
                           * queries gathered on the device: only they cross to the host (the whole
                           * q of a 128K-token Llama-3-8B prefill is 2 GiB per layer) */
  int32_t *q_pick_rows;   /* [build_queries] their rows in the step's q */
  float *q_host;          /* [n_heads, head_dim] */
  float *o_host;          /* [n_heads, head_dim] */
  float *ml_host;         /* [n_heads, 2]: (m, l) per head, the layout attn_merge takes */
  float *evict_k;         /* [n_layers, n_kv_heads, head_dim]: the token leaving the window */
  float *evict_v;         /* the same for V, in evict_k's allocation after its K */
  ra_tensor evict_dev;    /* [2, n_layers, n_kv_heads * head_dim] F32: its K and V gathered on
                           * the backend, so that one download (one sync) fetches them */
  size_t kv_row;          /* floats per cache row: n_kv_heads * head_dim */
  double pipe_append_us, pipe_index_us; /* prefill: the layer jobs' puts and builds (layer_job_run) */
  /* prefill: builds started by the latest layer jobs, newest at [n_jobs % B] (B = build_layers) */
  size_t job_builds[RA_OFFLOAD_MAX_BUILD_LAYERS];
  uint32_t n_jobs;
  /* retro: the output cache of the last retro_window (W) decode steps, decode step k (from 1)
   * in slot (k - 1) % W: its token, and per layer its q, its output o and (m, l) per q head */
  int32_t *retro_tok;     /* [W] */
  float *retro_q;         /* [n_layers, W, n_heads * head_dim] */
  float *retro_o;         /* [n_layers, W, n_heads * head_dim] */
  float *retro_ml;        /* [n_layers, W, n_heads * 2] */
  float *rq, *ro, *rml;   /* one layer's past queries, newest first, and the stores' supplementary
                           * partials for them: [W, n_heads, head_dim] x2, [W, n_heads, 2] */
  float *ratt;            /* [W, n_heads, head_dim]: the corrected outputs in the step's row order */
  uint64_t n_decoded;     /* decode steps since the prefill: the stores' retro step numbers */
  /* prefill: host buffers of offloaded layers' K/V handed back by finished layer jobs (the pipe's
   * thread) for the next layers, so that a layer's ~1 GB is not page-faulted in afresh */
  uv_mutex_t kv_pool_lock;
  void *kv_pool[RA_OFFLOAD_KV_POOL];
  size_t kv_pool_cap[RA_OFFLOAD_KV_POOL]; /* bytes of each, 0: slot empty */
  int64_t prefill_rows, prefill_ffn; /* the state's step and MLP rows while it prefills */
  prefill_run pf;          /* the prefill under way (ra_offload_prefill_begin .. its last layer) */
  ra_offload_stats prefill_stats;
  ra_offload_stats *steps; /* [n_steps] recorded decode timings */
  size_t n_steps, steps_cap;
  decode_step ds;          /* the decode step under way */
};

static inline int64_t ring_rows(const ra_offload *o) { return (int64_t)o->cfg.n_sink + o->cfg.n_window; }

/* The ring row holding position p. */
static inline int64_t ring_row(const ra_offload *o, int64_t p) {
  int64_t s = o->cfg.n_sink;
  return p < s ? p : s + (p - s) % o->cfg.n_window;
}

#endif
