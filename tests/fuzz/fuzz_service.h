/* Shared by the fuzz target and its seed-corpus generator: the input format and the session
 * every input can reach.
 *
 * Input = 1 selector byte (which service call, see fuzz_call) + serialized request bytes. Any
 * 16-byte run of FUZZ_ID_PLACEHOLDER bytes in the request is replaced with the live session's
 * random id before the call, so mutations of valid requests reach the put/append/attend paths
 * instead of stopping at "no session". */
#ifndef RA_FUZZ_SERVICE_H
#define RA_FUZZ_SERVICE_H

#define FUZZ_ID_PLACEHOLDER 0xA5

enum fuzz_call {
  FUZZ_OPEN = 0,
  FUZZ_PUT = 1,        /* the request bytes are split into up to 3 chunks of one stream */
  FUZZ_APPEND = 2,
  FUZZ_ATTEND = 3,
  FUZZ_CLOSE = 4,
  FUZZ_STATS = 5,
  FUZZ_HEALTH = 6,
  FUZZ_BUILD = 7,
  FUZZ_PUT_CLUSTERS = 8,
  FUZZ_FETCH_CLUSTERS = 9,
  FUZZ_ATTEND_BATCH = 10,
  FUZZ_N_CALLS = 11,
};

/* The live session: f16, 2 layers, 4 q heads, 2 kv heads, head_dim 8; shards layer 0 kv 0
 * [0, open), layer 1 kv 1 [0, 64) and [100, open). It holds tokens [0, 16) of the first (rows
 * [0, 8) of it permuted and in wave clusters 0 and 1, of 4 rows each), a roar
 * index of layer 0 q head 0 and a shared kgraph index of layer 1 kv head 1 (both shards, empty),
 * so that index-mode attends and appends reach the search and insertion paths. */
#define FUZZ_N_LAYERS 2
#define FUZZ_N_Q 4
#define FUZZ_N_KV 2
#define FUZZ_DIM 8

#endif
