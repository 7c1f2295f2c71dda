/* Writes the fuzz target's seed corpus: one valid request per call kind (and a few near-misses),
 * each as selector byte + serialized protobuf, session ids as the placeholder.
 *   fuzz-corpus DIR */
#include "fuzz_service.h"

#include "kvstore.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t placeholder[16];
static const char *dir;
static int failures;

static void write_seed(const char *name, int call, const ProtobufCMessage *m) {
  size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
  uint8_t *buf = malloc(n + 1);
  buf[0] = (uint8_t)call;
  if (m) protobuf_c_message_pack(m, buf + 1);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, n + 1, f) != n + 1) failures++;
  if (f && fclose(f) != 0) failures++;
  free(buf);
}

static void chunk(Rakv__KvChunk *c, uint32_t layer, uint32_t head, uint64_t begin, uint32_t n,
                  uint16_t *kv) {
  rakv__kv_chunk__init(c);
  c->session_id.data = placeholder;
  c->session_id.len = 16;
  c->layer = layer;
  c->kv_head = head;
  c->token_begin = begin;
  c->n_tokens = n;
  c->keys.data = c->values.data = (uint8_t *)kv;
  c->keys.len = c->values.len = (size_t)n * FUZZ_DIM * 2;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz-corpus DIR\n");
    return 2;
  }
  dir = argv[1];
  memset(placeholder, FUZZ_ID_PLACEHOLDER, sizeof placeholder);
  uint16_t kv[8 * FUZZ_DIM];
  for (int i = 0; i < 8 * FUZZ_DIM; i++) kv[i] = (uint16_t)(0x3800 + 3 * i);

  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 3;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = 16;
  g.dtype = RAKV__DTYPE__DTYPE_BF16;
  Rakv__Shard s[2] = {RAKV__SHARD__INIT, RAKV__SHARD__INIT};
  s[0].token_end = 10;
  s[1].token_begin = 10;
  s[1].layer = 2;
  Rakv__Shard *sp[2] = {&s[0], &s[1]};
  Rakv__OpenSessionRequest open = RAKV__OPEN_SESSION_REQUEST__INIT;
  open.geometry = &g;
  open.n_shards = 2;
  open.shards = sp;
  open.client = "seed";
  write_seed("open", FUZZ_OPEN, &open.base);

  Rakv__KvChunk c;
  chunk(&c, 0, 0, 16, 4, kv);
  write_seed("put", FUZZ_PUT, &c.base);
  chunk(&c, 1, 1, 60, 8, kv);
  write_seed("put_past_end", FUZZ_PUT, &c.base);
  chunk(&c, 1, 1, 100, 8, kv);
  write_seed("put_second_shard_hole", FUZZ_PUT, &c.base);

  Rakv__KvChunk c2;
  chunk(&c, 1, 1, 0, 3, kv);
  chunk(&c2, 1, 1, 3, 5, kv);
  c.session_id.len = 0;
  Rakv__KvChunk *cp[2] = {&c, &c2};
  Rakv__AppendRequest app = RAKV__APPEND_REQUEST__INIT;
  app.session_id.data = placeholder;
  app.session_id.len = 16;
  app.n_chunks = 2;
  app.chunks = cp;
  write_seed("append", FUZZ_APPEND, &app.base);

  uint32_t heads[2] = {0, 1};
  float q[2 * FUZZ_DIM];
  for (int i = 0; i < 2 * FUZZ_DIM; i++) q[i] = 0.25f * (float)(i % 5) - 0.5f;
  Rakv__AttendRequest at = RAKV__ATTEND_REQUEST__INIT;
  at.session_id.data = placeholder;
  at.session_id.len = 16;
  at.n_q_heads = 2;
  at.q_heads = heads;
  at.q.data = (uint8_t *)q;
  at.q.len = sizeof q;
  at.seq = 7;
  write_seed("attend_full", FUZZ_ATTEND, &at.base);
  at.mode = RAKV__ATTEND_MODE__MODE_FLAT;
  at.top_k = 3;
  at.return_ids = 1;
  write_seed("attend_flat", FUZZ_ATTEND, &at.base);
  heads[0] = 2;
  heads[1] = 3;
  at.layer = 1;
  write_seed("attend_layer1", FUZZ_ATTEND, &at.base);
  at.mode = RAKV__ATTEND_MODE__MODE_IVF;
  write_seed("attend_ivf", FUZZ_ATTEND, &at.base);
  at.mode = RAKV__ATTEND_MODE__MODE_KGRAPH;
  Rakv__SearchParams search = RAKV__SEARCH_PARAMS__INIT;
  search.ef = 4;
  at.search = &search;
  write_seed("attend_kgraph_shared", FUZZ_ATTEND, &at.base);
  heads[0] = 0;
  at.n_q_heads = 1;
  at.q.len = FUZZ_DIM * 4;
  at.layer = 0;
  at.mode = RAKV__ATTEND_MODE__MODE_ROAR;
  at.top_k = 5;
  write_seed("attend_roar", FUZZ_ATTEND, &at.base);

  /* Wave: clusters 0 and 1 of layer 0 kv head 0 selected, the lag [8, 16) scanned; more
   * clusters over rows [8, 12), permuted. */
  uint32_t wave_kv[1] = {0}, wave_counts[1] = {2}, wave_ids[2] = {1, 0};
  heads[1] = 1;
  at.n_q_heads = 2;
  at.q.len = sizeof q;
  at.mode = RAKV__ATTEND_MODE__MODE_WAVE;
  at.n_cluster_kv_heads = at.n_cluster_counts = 1;
  at.cluster_kv_heads = wave_kv;
  at.cluster_counts = wave_counts;
  at.n_clusters = 2;
  at.clusters = wave_ids;
  write_seed("attend_wave", FUZZ_ATTEND, &at.base);
  /* a batch: the wave attend, a full one of layer 1, and one of another session */
  Rakv__AttendRequest at_full = at, at_other = at;
  at_full.mode = RAKV__ATTEND_MODE__MODE_FULL;
  at_full.layer = 1;
  at_full.n_cluster_kv_heads = at_full.n_cluster_counts = at_full.n_clusters = 0;
  static uint8_t other_id[16] = {1};
  at_other.session_id.data = other_id;
  Rakv__AttendRequest *batch_items[3] = {&at, &at_full, &at_other};
  Rakv__AttendBatchRequest ab = RAKV__ATTEND_BATCH_REQUEST__INIT;
  ab.seq = 3;
  ab.n_items = 3;
  ab.items = batch_items;
  write_seed("attend_batch", FUZZ_ATTEND_BATCH, &ab.base);
  uint32_t pc_counts[2] = {1, 3}, pc_perm[4] = {2, 0, 3, 1};
  Rakv__PutClustersRequest pc = RAKV__PUT_CLUSTERS_REQUEST__INIT;
  pc.session_id.data = placeholder;
  pc.session_id.len = 16;
  pc.first_cluster = 2;
  pc.row_begin = 8;
  pc.n_counts = 2;
  pc.counts = pc_counts;
  pc.n_perm = 4;
  pc.perm = pc_perm;
  write_seed("put_clusters", FUZZ_PUT_CLUSTERS, &pc.base);
  pc.n_perm = 0;
  pc.first_cluster = 1;
  write_seed("put_clusters_defined", FUZZ_PUT_CLUSTERS, &pc.base);
  Rakv__FetchClustersRequest fc = RAKV__FETCH_CLUSTERS_REQUEST__INIT;
  fc.session_id.data = placeholder;
  fc.session_id.len = 16;
  fc.n_kv_heads = fc.n_counts = 1;
  fc.kv_heads = wave_kv;
  fc.counts = wave_counts;
  fc.n_clusters = 2;
  fc.clusters = wave_ids;
  write_seed("fetch_clusters", FUZZ_FETCH_CLUSTERS, &fc.base);

  /* BuildIndex: ivf from defaults, roar from vectors, roar from knn positions (some outside the
   * shard), a shared kgraph over the two empty shards of layer 1 kv head 1. */
  Rakv__IndexParams ip = RAKV__INDEX_PARAMS__INIT;
  ip.kind = RAKV__ATTEND_MODE__MODE_IVF;
  ip.n_lists = 3;
  Rakv__BuildIndexRequest bi = RAKV__BUILD_INDEX_REQUEST__INIT;
  bi.session_id.data = placeholder;
  bi.session_id.len = 16;
  bi.q_head = 1;
  bi.params = &ip;
  write_seed("build_ivf", FUZZ_BUILD, &bi.base);
  ip.kind = RAKV__ATTEND_MODE__MODE_ROAR;
  ip.n_lists = 0;
  ip.degree = 4;
  ip.build_ef = 8;
  bi.queries.data = (uint8_t *)q;
  bi.queries.len = sizeof q;
  bi.n_queries = 2;
  write_seed("build_roar_queries", FUZZ_BUILD, &bi.base);
  uint64_t knn[6] = {3, 1, 15, 2, 40, 0};
  bi.knn_ids = knn;
  bi.n_knn_ids = 6;
  write_seed("build_roar_knn", FUZZ_BUILD, &bi.base);
  bi.queries.len = 0;
  write_seed("build_roar_knn_only", FUZZ_BUILD, &bi.base);
  bi.n_knn_ids = 0;
  bi.n_queries = 0;
  bi.layer = 1;
  bi.q_head = 2;
  ip.kind = RAKV__ATTEND_MODE__MODE_KGRAPH;
  ip.per_kv_head = 1;
  write_seed("build_kgraph_shared", FUZZ_BUILD, &bi.base);

  Rakv__CloseSessionRequest cl = RAKV__CLOSE_SESSION_REQUEST__INIT;
  cl.session_id.data = placeholder;
  cl.session_id.len = 16;
  write_seed("close", FUZZ_CLOSE, &cl.base);
  Rakv__StatsRequest st = RAKV__STATS_REQUEST__INIT;
  write_seed("stats", FUZZ_STATS, &st.base);
  Rakv__HealthRequest h = RAKV__HEALTH_REQUEST__INIT;
  write_seed("health", FUZZ_HEALTH, &h.base);
  if (failures) fprintf(stderr, "fuzz-corpus: %d seeds could not be written to %s\n", failures, dir);
  return failures ? 1 : 0;
}
