/* libFuzzer target over the kv-store's request decoding and handlers (kv-store/service.h).
 * Every input must end in a status, never a crash, leak or sanitizer report; the live session
 * must stay usable whatever the input did. */
#include "fuzz_service.h"

#include "kvstore.pb-c.h"
#include "service.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small budget: a request that asks for more must be refused, not served. */
#define FUZZ_BUDGET (32u << 20)

/* Every request comes from one credential, so the owner checks and the per-owner Stats run. */
static const kvs_caller who = {.principal = "token 1", .peer = "fuzz"};

static kvs_service *svc;
static uint8_t live_id[16];
static ra_buf reply;

static int pack_into(const ProtobufCMessage *m, ra_buf *b) {
  size_t n = protobuf_c_message_get_packed_size(m);
  if (ra_buf_reserve(b, n ? n : 1) != RA_OK) return RA_ENOMEM;
  b->len = protobuf_c_message_pack(m, b->data);
  return RA_OK;
}

/* Opens the live session and stores its first 16 tokens; returns nonzero on failure. */
static int open_live(void) {
  ra_error err;
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = FUZZ_N_LAYERS;
  g.n_q_heads = FUZZ_N_Q;
  g.n_kv_heads = FUZZ_N_KV;
  g.head_dim = FUZZ_DIM;
  g.dtype = RAKV__DTYPE__DTYPE_F16;
  Rakv__Shard s[3] = {RAKV__SHARD__INIT, RAKV__SHARD__INIT, RAKV__SHARD__INIT};
  s[1].layer = s[2].layer = 1;
  s[1].kv_head = s[2].kv_head = 1;
  s[1].token_end = 64;
  s[2].token_begin = 100;
  Rakv__Shard *sp[3] = {&s[0], &s[1], &s[2]};
  Rakv__OpenSessionRequest req = RAKV__OPEN_SESSION_REQUEST__INIT;
  req.geometry = &g;
  req.n_shards = 3;
  req.shards = sp;
  ra_buf b = {0};
  int rc = pack_into(&req.base, &b);
  if (rc == RA_OK) rc = kvs_service_open_session(svc, &who, b.data, b.len, &reply, &err);
  Rakv__OpenSessionReply *r =
      rc == RA_OK ? rakv__open_session_reply__unpack(NULL, reply.len, reply.data) : NULL;
  if (!r || r->session_id.len != 16) rc = RA_EINTERNAL;
  if (r) {
    if (rc == RA_OK) memcpy(live_id, r->session_id.data, 16);
    rakv__open_session_reply__free_unpacked(r, NULL);
  }
  uint16_t kv[16 * FUZZ_DIM];
  for (int i = 0; i < 16 * FUZZ_DIM; i++) kv[i] = (uint16_t)(0x3c00 + i); /* ~1.0 .. 1.1 */
  Rakv__KvChunk c = RAKV__KV_CHUNK__INIT;
  c.session_id.data = live_id;
  c.session_id.len = 16;
  c.n_tokens = 16;
  c.keys.data = c.values.data = (uint8_t *)kv;
  c.keys.len = c.values.len = sizeof kv;
  kvs_put_state st;
  kvs_service_put_begin(svc, &who, &st);
  if (rc == RA_OK) rc = pack_into(&c.base, &b);
  if (rc == RA_OK) rc = kvs_service_put_chunk(svc, &st, b.data, b.len, &err);
  if (rc == RA_OK) rc = kvs_service_put_finish(svc, &st, &reply, &err);

  uint32_t counts[2] = {4, 4}, perm[8] = {7, 6, 5, 4, 3, 2, 1, 0};
  Rakv__PutClustersRequest pc = RAKV__PUT_CLUSTERS_REQUEST__INIT;
  pc.session_id.data = live_id;
  pc.session_id.len = 16;
  pc.n_counts = 2;
  pc.counts = counts;
  pc.n_perm = 8;
  pc.perm = perm;
  if (rc == RA_OK) rc = pack_into(&pc.base, &b);
  if (rc == RA_OK) rc = kvs_service_put_clusters(svc, &who, b.data, b.len, &reply, &err);

  float q[2 * FUZZ_DIM];
  for (int i = 0; i < 2 * FUZZ_DIM; i++) q[i] = 0.5f - 0.125f * (float)(i % 9);
  Rakv__IndexParams ip = RAKV__INDEX_PARAMS__INIT;
  ip.kind = RAKV__ATTEND_MODE__MODE_ROAR;
  Rakv__BuildIndexRequest bi = RAKV__BUILD_INDEX_REQUEST__INIT;
  bi.session_id.data = live_id;
  bi.session_id.len = 16;
  bi.params = &ip;
  bi.queries.data = (uint8_t *)q;
  bi.queries.len = sizeof q;
  bi.n_queries = 2;
  if (rc == RA_OK) rc = pack_into(&bi.base, &b);
  if (rc == RA_OK) rc = kvs_service_build_index(svc, &who, b.data, b.len, &reply, &err);
  ip.kind = RAKV__ATTEND_MODE__MODE_KGRAPH;
  ip.per_kv_head = 1;
  bi.layer = 1;
  bi.q_head = 3;
  bi.queries.len = 0;
  bi.n_queries = 0;
  if (rc == RA_OK) rc = pack_into(&bi.base, &b);
  if (rc == RA_OK) rc = kvs_service_build_index(svc, &who, b.data, b.len, &reply, &err);
  ra_buf_free(&b);
  return rc;
}

/* A fresh service and live session: keeps sessions opened by inputs from piling up. A failure
 * here is a broken harness, not a finding, and libFuzzer has no error path but a crash. */
static void reset(void) {
  kvs_service_destroy(svc);
  ra_error err;
  kvs_service_config cfg = {.memory_budget = FUZZ_BUDGET, .attend_threads = 1};
  if (kvs_service_create(&cfg, &svc, &err) != RA_OK || open_live() != RA_OK) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  reset();
  return 0;
}

static void put_stream(const uint8_t *req, size_t len) {
  /* Up to three chunks: the request split at two points taken from its own bytes. */
  size_t a = len ? req[0] % (len + 1) : 0, b = len ? req[len - 1] % (len + 1) : 0;
  if (a > b) {
    size_t t = a;
    a = b;
    b = t;
  }
  size_t cut[4] = {0, a, b, len};
  kvs_put_state st;
  ra_error err;
  kvs_service_put_begin(svc, &who, &st);
  for (int i = 0; i < 3; i++) {
    if (cut[i + 1] == cut[i] && i > 0) continue;
    if (kvs_service_put_chunk(svc, &st, req + cut[i], cut[i + 1] - cut[i], &err) != RA_OK) return;
  }
  kvs_service_put_finish(svc, &st, &reply, &err);
}

/* An AttendBatch item's reply: kept as the last reply, as a server would send it. */
static int emit_keep(void *ctx, const uint8_t *data, size_t len, ra_error *err) {
  (void)ctx;
  if (ra_buf_reserve(&reply, len ? len : 1) != RA_OK) return ra_errorf(err, RA_ENOMEM, "out of memory");
  memcpy(reply.data, data, len);
  reply.len = len;
  return RA_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t len = size - 1;
  uint8_t *req = malloc(len ? len : 1);
  memcpy(req, data + 1, len);
  for (size_t i = 0; i + 16 <= len; i++) {
    size_t j = 0;
    while (j < 16 && req[i + j] == FUZZ_ID_PLACEHOLDER) j++;
    if (j == 16) {
      memcpy(req + i, live_id, 16);
      i += 15;
    }
  }
  ra_error err;
  switch (data[0] % FUZZ_N_CALLS) {
    case FUZZ_OPEN: kvs_service_open_session(svc, &who, req, len, &reply, &err); break;
    case FUZZ_PUT: put_stream(req, len); break;
    case FUZZ_APPEND: kvs_service_append(svc, &who, req, len, &reply, &err); break;
    case FUZZ_ATTEND: kvs_service_attend(svc, &who, req, len, &reply, &err); break;
    case FUZZ_CLOSE: kvs_service_close_session(svc, &who, req, len, &reply, &err); break;
    case FUZZ_STATS: kvs_service_stats(svc, &who, req, len, &reply, &err); break;
    case FUZZ_HEALTH: kvs_service_health(svc, &who, req, len, &reply, &err); break;
    case FUZZ_BUILD: kvs_service_build_index(svc, &who, req, len, &reply, &err); break;
    case FUZZ_PUT_CLUSTERS: kvs_service_put_clusters(svc, &who, req, len, &reply, &err); break;
    case FUZZ_FETCH_CLUSTERS: kvs_service_fetch_clusters(svc, &who, req, len, &reply, &err); break;
    case FUZZ_ATTEND_BATCH: kvs_service_attend_batch(svc, &who, req, len, emit_keep, NULL, &err); break;
  }
  free(req);
  kvs_session *s;
  kvs_store *st = kvs_service_store(svc);
  if (kvs_store_get(st, live_id, 16, &s, &err) == RA_OK) {
    kvs_session_release(s);
    if (kvs_store_sessions(st) > 16 || kvs_store_bytes_used(st) > FUZZ_BUDGET / 2) reset();
  } else {
    reset();
  }
  return 0;
}
