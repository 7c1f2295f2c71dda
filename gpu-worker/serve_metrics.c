#include "serve_metrics.h"

#include "status.h"

#include <string.h>

int ra_serve_metrics_new(ra_serve_metrics *m) {
  memset(m, 0, sizeof *m);
  if (ra_metrics_new("ra_serve_", &m->reg) != RA_OK) return RA_ENOMEM;
  /* seconds: 1 ms .. 60 s; sizes: powers of two */
  static const double lat[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  static const double sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  int nl = (int)(sizeof lat / sizeof lat[0]), ns = (int)(sizeof sizes / sizeof sizes[0]);
  ra_metrics *r = m->reg;
  m->requests = ra_metrics_add(r, "requests_total", RA_METRIC_COUNTER, "HTTP requests by status", NULL, 0);
  m->prompt_tokens = ra_metrics_add(r, "prompt_tokens_total", RA_METRIC_COUNTER, "prompt tokens", NULL, 0);
  m->generated_tokens = ra_metrics_add(r, "generated_tokens_total", RA_METRIC_COUNTER, "generated tokens", NULL, 0);
  m->reused_tokens = ra_metrics_add(r, "reused_tokens_total", RA_METRIC_COUNTER,
                                    "prompt tokens whose KV was reused from a cached context", NULL, 0);
  m->ttft = ra_metrics_add(r, "time_to_first_token_seconds", RA_METRIC_HISTOGRAM, "request to first token", lat, nl);
  m->inter_token = ra_metrics_add(r, "inter_token_seconds", RA_METRIC_HISTOGRAM, "between a sequence's tokens", lat, nl);
  m->batch_size = ra_metrics_add(r, "batch_sequences", RA_METRIC_HISTOGRAM, "sequences per step", sizes, ns);
  m->step_tokens = ra_metrics_add(r, "batch_tokens", RA_METRIC_HISTOGRAM, "tokens per step", sizes, ns);
  m->store_wait = ra_metrics_add(r, "store_wait_seconds", RA_METRIC_HISTOGRAM,
                                 "a sequence's decode step blocked on the kv-stores (all layers)", lat, nl);
  m->decode_parts = ra_metrics_add(r, "decode_step_seconds_total", RA_METRIC_COUNTER,
                                   "offloaded sequences' decode steps by part (total, wait for the stores, the "
                                   "slowest store's own time, device selection, merge, append, index, retro), "
                                   "summed; divide by store_wait_seconds_count for a step's mean",
                                   NULL, 0);
  m->engine_parts = ra_metrics_add(r, "engine_step_seconds_total", RA_METRIC_COUNTER,
                                   "the engine's steps by part (step: all of it; between: from one step's end to "
                                   "the next one's start; full mode's forward: launching it, logits: waiting for "
                                   "the device, sample: picking and handing out the tokens), summed; divide by "
                                   "engine_steps_total for a step's mean",
                                   NULL, 0);
  m->engine_steps = ra_metrics_add(r, "engine_steps_total", RA_METRIC_COUNTER, "engine steps that ran sequences", NULL, 0);
  m->store_errors = ra_metrics_add(r, "store_errors_total", RA_METRIC_COUNTER, "sequences failed by a kv-store", NULL, 0);
  m->attend_batch = ra_metrics_add(r, "attend_batch_total", RA_METRIC_COUNTER,
                                   "AttendBatch messages sent to the kv-stores and the sequences' requests in them",
                                   NULL, 0);
  m->live_seqs = ra_metrics_add(r, "live_sequences", RA_METRIC_GAUGE, "sequences running or queued", NULL, 0);
  m->cached_seqs = ra_metrics_add(r, "cached_sequences", RA_METRIC_GAUGE, "idle contexts kept for reuse", NULL, 0);
  m->device_bytes = ra_metrics_add(r, "device_bytes", RA_METRIC_GAUGE, "device memory: weights and KV caches", NULL, 0);
  m->store_bytes = ra_metrics_add(r, "store_bytes", RA_METRIC_GAUGE, "kv-store memory (Stats)", NULL, 0);
  m->store_up = ra_metrics_add(r, "store_up", RA_METRIC_GAUGE, "kv-store answered Health as serving", NULL, 0);
  ra_metric *all[] = {m->requests, m->prompt_tokens, m->generated_tokens, m->reused_tokens, m->ttft, m->inter_token,
                      m->batch_size, m->step_tokens, m->store_wait, m->decode_parts, m->engine_parts,
                      m->engine_steps, m->store_errors, m->attend_batch, m->live_seqs, m->cached_seqs, m->device_bytes,
                      m->store_bytes, m->store_up};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!all[i]) {
      ra_serve_metrics_free(m);
      return RA_ENOMEM;
    }
  return RA_OK;
}

void ra_serve_metrics_free(ra_serve_metrics *m) {
  ra_metrics_free(m->reg);
  memset(m, 0, sizeof *m);
}
