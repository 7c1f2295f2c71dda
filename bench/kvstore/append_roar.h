/* kvstore-bench's append section: the decode's per-step Append (one token to each (layer, kv
 * head) shard) against roar indexes, run on an in-process store (kv-store/store.h), so that the
 * time a write takes to return and the time until its rows are in the indexes can be told
 * apart (the RPC adds its round trip to the first: rpc-bench). */
#ifndef KVSTORE_BENCH_APPEND_ROAR_H
#define KVSTORE_BENCH_APPEND_ROAR_H

#include "status.h"

#include <stdint.h>

typedef struct append_roar_opts {
  uint32_t shards; /* (layer, kv head) shards, a multiple of 8: shards / 8 layers x 8 kv heads */
  uint32_t tokens; /* rows per shard when the indexes are built */
  int steps;       /* steps measured per phase (after 3 warm-up steps each) */
  int threads;     /* attend, build and index threads; 0: the OpenMP default */
} append_roar_opts;

/* Medians (p50) and p99 over the steps, microseconds. */
typedef struct append_roar_result {
  double build_s;           /* building every shard's roar index (per kv head) */
  double reply_p50_us, reply_p99_us;     /* kvs_session_write of the step's Append */
  double drained_p50_us, drained_p99_us; /* from the write until every index holds the rows
                                            (kvs_session_index_drain), nothing else running */
  double attend_busy_p50_us; /* attends of every layer (32 q heads, roar, k = 100) issued right
                                after the write, while the rows are being inserted */
  double attend_idle_p50_us; /* the same attends once drained */
} append_roar_result;

int append_roar_run(const append_roar_opts *o, append_roar_result *out, ra_error *err);

#endif
