/* The metrics gpu-worker serve exports at GET /metrics (names prefixed "ra_serve_"). */
#ifndef RA_SERVE_METRICS_H
#define RA_SERVE_METRICS_H

#include "metrics.h"

typedef struct ra_serve_metrics {
  ra_metrics *reg;
  ra_metric *requests;         /* counter {status="200"|"400"|...} */
  ra_metric *prompt_tokens;    /* counter: prompt tokens of finished requests */
  ra_metric *generated_tokens; /* counter */
  ra_metric *reused_tokens;    /* counter: prompt tokens whose KV came from a cached context */
  ra_metric *ttft;             /* histogram, seconds: submit to first token */
  ra_metric *inter_token;      /* histogram, seconds: between consecutive tokens of a sequence */
  ra_metric *batch_size;       /* histogram: sequences in a step */
  ra_metric *step_tokens;      /* histogram: tokens in a step (decode + prefill chunks) */
  ra_metric *store_wait;       /* histogram, seconds: a decode step blocked on the stores */
  ra_metric *decode_parts;     /* counter {part=...}, seconds: offloaded decode steps by part (ra_offload_stats),
                                  summed over sequences; steps: store_wait's count */
  ra_metric *engine_parts;     /* counter {part=...}, seconds: the engine's steps by part (step; between steps;
                                  full mode: forward launch, logits wait, sampling); steps: engine_steps */
  ra_metric *engine_steps;     /* counter: the engine's steps that ran sequences */
  ra_metric *store_errors;     /* counter */
  ra_metric *attend_batch;     /* counter {kind="messages"|"requests"}: AttendBatch messages sent to the stores
                                  and the per-sequence requests they carried */
  ra_metric *live_seqs;        /* gauge: sequences running or queued */
  ra_metric *cached_seqs;      /* gauge: idle contexts kept for reuse */
  ra_metric *device_bytes;     /* gauge {kind="weights"|"kv"} */
  ra_metric *store_bytes;      /* gauge {store="HOST:PORT",kind="used"|"budget"}, from Stats */
  ra_metric *store_up;         /* gauge {store="HOST:PORT"}: 1 when Health answered SERVING */
} ra_serve_metrics;

/* RA_OK or RA_ENOMEM. */
int ra_serve_metrics_new(ra_serve_metrics *m);
void ra_serve_metrics_free(ra_serve_metrics *m);

#endif
