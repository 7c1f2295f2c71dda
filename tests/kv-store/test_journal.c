/* Persistence (journal.h): records replayed in order, a torn tail cut, damage elsewhere refused
 * (the session renamed .corrupt, the others restored), closed sessions' files removed; and the
 * service over a data dir: a session written, the service destroyed (as a restart) and created
 * again has the same id and rows (ReadKv gives them back), and OpenSession reattaches it by id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "journal.h"
#include "kvstore.pb-c.h"
#include "service.h"

static char *make_tmpdir(void) {
  char tmpl[] = "/tmp/test_journal.XXXXXX";
  char *d = mkdtemp(tmpl);
  assert_non_null(d);
  return strdup(d);
}

static void rm_rf(const char *path) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  assert_int_equal(system(cmd), 0);
}

typedef struct seen {
  int n;
  int types[64];
  size_t lens[64];
  uint8_t first[64];
  int attached, dropped;
  kvs_journal *j[4];
} seen;

static int on_record(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], int type, const uint8_t *data, size_t len,
                     ra_error *err) {
  (void)id;
  (void)err;
  seen *s = ctx;
  s->types[s->n] = type;
  s->lens[s->n] = len;
  s->first[s->n] = len ? data[0] : 0;
  s->n++;
  return RA_OK;
}

static void on_attach(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal *j) {
  (void)id;
  seen *s = ctx;
  s->j[s->attached++] = j;
}

static void on_drop(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES]) {
  (void)id;
  ((seen *)ctx)->dropped++;
}

static const uint8_t ID[KVS_JOURNAL_ID_BYTES] = {0xab, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#define ID_HEX "ab0102030405060708090a0b0c0d0e0f"

static void test_records_replay_in_order_and_a_torn_tail_is_cut(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  ra_error err;
  kvs_data_dir *d;
  kvs_journal *j;
  assert_int_equal(kvs_data_dir_open(dir, -1, 0, &d, &err), RA_OK);
  assert_int_equal(kvs_journal_create(d, ID, &j, &err), RA_OK);
  uint8_t payload[100];
  for (int i = 0; i < 5; i++) {
    memset(payload, i + 1, sizeof payload);
    assert_int_equal(kvs_journal_append(j, KVS_REC_APPEND, payload, (size_t)(10 * (i + 1)), &err), RA_OK);
  }
  kvs_journal_close(j, 0);
  /* a write cut by a crash: half a header and payload at the end */
  char seg[512];
  snprintf(seg, sizeof seg, "%s/%s/00000001.seg", dir, ID_HEX);
  struct stat sb;
  assert_int_equal(stat(seg, &sb), 0);
  FILE *f = fopen(seg, "ab");
  assert_non_null(f);
  const uint32_t torn[3] = {0x314a4152u, KVS_REC_APPEND, 1000};
  fwrite(torn, sizeof torn, 1, f);
  fwrite(payload, 7, 1, f);
  fclose(f);

  seen s = {0};
  size_t n_sessions;
  uint64_t n_records;
  assert_int_equal(kvs_data_dir_replay(d, on_record, on_attach, on_drop, &s, &n_sessions, &n_records, &err), RA_OK);
  assert_int_equal(n_sessions, 1);
  assert_int_equal(n_records, 5);
  assert_int_equal(s.n, 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(s.types[i], KVS_REC_APPEND);
    assert_int_equal(s.lens[i], 10 * (i + 1));
    assert_int_equal(s.first[i], i + 1);
  }
  struct stat cut;
  assert_int_equal(stat(seg, &cut), 0);
  assert_int_equal(cut.st_size, sb.st_size); /* the torn record is gone */
  /* the journal goes on where the good records end */
  assert_int_equal(kvs_journal_append(s.j[0], KVS_REC_BUILD, payload, 3, &err), RA_OK);
  kvs_journal_close(s.j[0], 0);
  seen again = {0};
  assert_int_equal(kvs_data_dir_replay(d, on_record, on_attach, on_drop, &again, &n_sessions, &n_records, &err), RA_OK);
  assert_int_equal(again.n, 6);
  assert_int_equal(again.types[5], KVS_REC_BUILD);
  /* closing for good removes the files */
  kvs_journal_close(again.j[0], 1);
  char sdir[512];
  snprintf(sdir, sizeof sdir, "%s/%s", dir, ID_HEX);
  assert_int_not_equal(stat(sdir, &sb), 0);
  kvs_data_dir_close(d);
  rm_rf(dir);
  free(dir);
}

static void test_damage_before_the_end_is_refused(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  ra_error err;
  kvs_data_dir *d;
  kvs_journal *j;
  /* 64-byte segments: every record starts a new one */
  assert_int_equal(kvs_data_dir_open(dir, 0, 64, &d, &err), RA_OK);
  assert_int_equal(kvs_journal_create(d, ID, &j, &err), RA_OK);
  uint8_t payload[80] = {0};
  for (int i = 0; i < 3; i++) assert_int_equal(kvs_journal_append(j, KVS_REC_PUT, payload, sizeof payload, &err), RA_OK);
  kvs_journal_close(j, 0);
  char seg[512];
  snprintf(seg, sizeof seg, "%s/%s/00000002.seg", dir, ID_HEX);
  FILE *f = fopen(seg, "r+b");
  assert_non_null(f);
  fseek(f, 20, SEEK_SET);
  fputc(0x5a, f); /* one payload byte: the crc no longer matches */
  fclose(f);
  seen s = {0};
  size_t n_sessions;
  uint64_t n_records;
  assert_int_equal(kvs_data_dir_replay(d, on_record, on_attach, on_drop, &s, &n_sessions, &n_records, &err), RA_OK);
  assert_int_equal(n_sessions, 0);
  assert_int_equal(s.attached, 0);
  assert_int_equal(s.dropped, 1);
  char moved[512];
  snprintf(moved, sizeof moved, "%s/%s.corrupt", dir, ID_HEX);
  struct stat sb;
  assert_int_equal(stat(moved, &sb), 0);
  kvs_data_dir_close(d);
  rm_rf(dir);
  free(dir);
}

/* ---- the service over a data dir ---- */

/* Calls fn as an in-process caller (no credential). */
static int call(kvs_service *svc,
                int (*fn)(kvs_service *, const kvs_caller *, const uint8_t *, size_t, ra_buf *, ra_error *),
                const ProtobufCMessage *m, ra_buf *reply, ra_error *err) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n ? n : 1);
  protobuf_c_message_pack(m, b);
  int rc = fn(svc, NULL, b, n, reply, err);
  free(b);
  return rc;
}

static void test_service_restores_sessions(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  ra_error err;
  kvs_service_config cfg = {.memory_budget = 64u << 20, .attend_threads = 1, .data_dir = dir, .fsync_ms = 0};
  kvs_service *svc;
  assert_int_equal(kvs_service_create(&cfg, &svc, &err), RA_OK);
  ra_buf reply = {0};
  Rakv__Geometry g = RAKV__GEOMETRY__INIT;
  g.n_layers = 1, g.n_q_heads = 2, g.n_kv_heads = 1, g.head_dim = 4, g.dtype = RAKV__DTYPE__DTYPE_F32;
  Rakv__Shard sh = RAKV__SHARD__INIT, *shp = &sh;
  Rakv__OpenSessionRequest open = RAKV__OPEN_SESSION_REQUEST__INIT;
  open.geometry = &g, open.n_shards = 1, open.shards = &shp, open.client = "test";
  assert_int_equal(call(svc, kvs_service_open_session, &open.base, &reply, &err), RA_OK);
  Rakv__OpenSessionReply *r = rakv__open_session_reply__unpack(NULL, reply.len, reply.data);
  uint8_t id[16];
  memcpy(id, r->session_id.data, 16);
  rakv__open_session_reply__free_unpacked(r, NULL);
  /* 3 rows by PutKv, 1 by Append */
  float kv[3 * 4];
  for (int i = 0; i < 12; i++) kv[i] = (float)i;
  Rakv__KvChunk c = RAKV__KV_CHUNK__INIT;
  c.session_id.data = id, c.session_id.len = 16, c.n_tokens = 3;
  c.keys.data = (uint8_t *)kv, c.keys.len = sizeof kv, c.values.data = (uint8_t *)kv, c.values.len = sizeof kv;
  size_t n = rakv__kv_chunk__get_packed_size(&c);
  uint8_t *b = malloc(n);
  rakv__kv_chunk__pack(&c, b);
  kvs_put_state ps;
  kvs_service_put_begin(svc, NULL, &ps);
  assert_int_equal(kvs_service_put_chunk(svc, &ps, b, n, &err), RA_OK);
  assert_int_equal(kvs_service_put_finish(svc, &ps, &reply, &err), RA_OK);
  free(b);
  Rakv__KvChunk a = RAKV__KV_CHUNK__INIT, *ap = &a;
  a.token_begin = 3, a.n_tokens = 1;
  a.keys.data = (uint8_t *)kv, a.keys.len = 16, a.values.data = (uint8_t *)kv, a.values.len = 16;
  Rakv__AppendRequest ar = RAKV__APPEND_REQUEST__INIT;
  ar.session_id.data = id, ar.session_id.len = 16, ar.n_chunks = 1, ar.chunks = &ap;
  assert_int_equal(call(svc, kvs_service_append, &ar.base, &reply, &err), RA_OK);
  kvs_service_destroy(svc); /* a restart */

  assert_int_equal(kvs_service_create(&cfg, &svc, &err), RA_OK);
  kvs_session *s;
  assert_int_equal(kvs_store_get(kvs_service_store(svc), id, 16, &s, &err), RA_OK);
  assert_int_equal(atomic_load(&s->tokens), 4);
  assert_int_equal(s->shards[0].n, 4);
  assert_memory_equal(s->shards[0].keys, kv, sizeof kv);
  kvs_session_release(s);
  /* ReadKv gives the restored rows back; rows past the stored ones are refused */
  Rakv__ReadKvRequest rd = RAKV__READ_KV_REQUEST__INIT;
  rd.session_id.data = id, rd.session_id.len = 16, rd.token_begin = 1, rd.n_tokens = 3;
  assert_int_equal(call(svc, kvs_service_read_kv, &rd.base, &reply, &err), RA_OK);
  Rakv__KvChunk *got = rakv__kv_chunk__unpack(NULL, reply.len, reply.data);
  assert_non_null(got);
  assert_int_equal(got->keys.len, 3 * 16);
  assert_memory_equal(got->keys.data, kv + 4, 2 * 16);     /* rows 1-2 of the PutKv */
  assert_memory_equal(got->values.data + 32, kv, 16);      /* row 3, the Append */
  rakv__kv_chunk__free_unpacked(got, NULL);
  rd.n_tokens = 4;
  assert_int_equal(call(svc, kvs_service_read_kv, &rd.base, &reply, &err), RA_EINVAL);
  /* reattach by id: the rows it holds */
  Rakv__OpenSessionRequest resume = RAKV__OPEN_SESSION_REQUEST__INIT;
  resume.geometry = &g, resume.resume_session_id.data = id, resume.resume_session_id.len = 16;
  assert_int_equal(call(svc, kvs_service_open_session, &resume.base, &reply, &err), RA_OK);
  r = rakv__open_session_reply__unpack(NULL, reply.len, reply.data);
  assert_int_equal(r->tokens, 4);
  assert_memory_equal(r->session_id.data, id, 16);
  rakv__open_session_reply__free_unpacked(r, NULL);
  /* another geometry is refused, an unknown id is NOT_FOUND */
  g.head_dim = 8;
  assert_int_equal(call(svc, kvs_service_open_session, &resume.base, &reply, &err), RA_EINVAL);
  uint8_t other[16] = {1};
  resume.resume_session_id.data = other;
  assert_int_equal(call(svc, kvs_service_open_session, &resume.base, &reply, &err), RA_ENOTFOUND);
  /* a closed session is gone from the disk too */
  Rakv__CloseSessionRequest cl = RAKV__CLOSE_SESSION_REQUEST__INIT;
  cl.session_id.data = id, cl.session_id.len = 16;
  assert_int_equal(call(svc, kvs_service_close_session, &cl.base, &reply, &err), RA_OK);
  kvs_service_destroy(svc);
  assert_int_equal(kvs_service_create(&cfg, &svc, &err), RA_OK);
  assert_int_equal(kvs_store_sessions(kvs_service_store(svc)), 0);
  kvs_service_destroy(svc);
  ra_buf_free(&reply);
  rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_records_replay_in_order_and_a_torn_tail_is_cut),
      cmocka_unit_test(test_damage_before_the_end_is_refused),
      cmocka_unit_test(test_service_restores_sessions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
