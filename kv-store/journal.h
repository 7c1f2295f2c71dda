/* Persistence of sessions (kv-store --data-dir DIR): every request that changes a session is
 * kept, as the bytes that came over the wire, in the session's journal, and a restarted store
 * replays the journals through the same service code, so each session comes back with the same
 * id, rows, index and cluster state.
 *
 * Layout: DIR/<session id, 32 hex digits>/<8-digit sequence>.seg, segment files of records
 *     u32 magic 'RAJ1' | u32 type | u32 payload bytes | u32 crc32 of the payload | payload
 * (little-endian). A segment is closed once it passes segment_bytes and the next one started.
 * A record is one write(2) after the request succeeded in memory and before its reply: a
 * killed process (kill -9 included) loses nothing acknowledged, since the kernel has the bytes.
 * What a machine crash may lose is the fsync policy's: fsync_ms 0 syncs every record before
 * its reply; fsync_ms > 0 syncs each journal written since the last round every fsync_ms from
 * a background thread (a crash loses at most that window of acknowledged writes). On replay a
 * torn or corrupt record at the end of a session's last segment (a write cut by the crash) is
 * cut off; one anywhere else means the files were damaged: the session is not restored and its
 * directory is renamed <id>.corrupt for the operator.
 *
 * Closing a session (CloseSession, or the idle lease expiring) removes its directory; a
 * shutdown keeps it. */
#ifndef KVS_JOURNAL_H
#define KVS_JOURNAL_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define KVS_JOURNAL_ID_BYTES 16

/* Record types: the request each payload is (proto/kvstore.proto). OPEN's payload is the
 * session id, then the OpenSessionRequest. */
enum kvs_record_type {
  KVS_REC_OPEN = 1,     /* id + OpenSessionRequest */
  KVS_REC_PUT = 2,      /* one KvChunk of a PutKv stream */
  KVS_REC_APPEND = 3,   /* AppendRequest */
  KVS_REC_BUILD = 4,    /* BuildIndexRequest */
  KVS_REC_CLUSTERS = 5, /* PutClustersRequest */
};

typedef struct kvs_data_dir kvs_data_dir;
typedef struct kvs_journal kvs_journal;

/* Creates DIR if needed. fsync_ms: 0 sync every record, > 0 every fsync_ms in the background,
 * < 0 never (tests). segment_bytes: 0 takes 64 MiB. */
int kvs_data_dir_open(const char *path, int fsync_ms, uint64_t segment_bytes, kvs_data_dir **out, ra_error *err);
/* Stops the background sync (syncing what is pending) and frees; every journal must be closed. */
void kvs_data_dir_close(kvs_data_dir *d);

/* Called for each record of each session in order; a non-zero return stops that session's
 * replay (it is then not restored: see replay). */
typedef int (*kvs_replay_fn)(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], int type, const uint8_t *data,
                             size_t len, ra_error *err);
/* Called once a session's records are replayed: attach(ctx, id, j) hands over its journal,
 * opened for appending (the caller owns it from then on). */
typedef void (*kvs_attach_fn)(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal *j);
/* Replays every session directory; a session whose files are damaged or whose records fail is
 * skipped (logged, and renamed <id>.corrupt) and the others go on; drop(ctx, id) is then
 * called to remove what its replay had restored. *n_sessions / *n_records: what was restored. */
typedef void (*kvs_drop_fn)(void *ctx, const uint8_t id[KVS_JOURNAL_ID_BYTES]);
int kvs_data_dir_replay(kvs_data_dir *d, kvs_replay_fn replay, kvs_attach_fn attach, kvs_drop_fn drop, void *ctx,
                        size_t *n_sessions, uint64_t *n_records, ra_error *err);

/* A new session's journal (its directory must not exist). */
int kvs_journal_create(kvs_data_dir *d, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal **out, ra_error *err);
/* Writes one record (and syncs it when fsync_ms is 0). Thread-safe. */
int kvs_journal_append(kvs_journal *j, int type, const uint8_t *data, size_t len, ra_error *err);
/* Writes id + data as one OPEN record. */
int kvs_journal_append_open(kvs_journal *j, const uint8_t *data, size_t len, ra_error *err);
/* An ordering lock for callers whose changes must be recorded in the order they were made
 * (writes of one session): lock, change, append, unlock. (append has its own, inner lock.) */
void kvs_journal_lock(kvs_journal *j);
void kvs_journal_unlock(kvs_journal *j);
/* Closes the files; discard: the session ended, remove its directory. */
void kvs_journal_close(kvs_journal *j, int discard);

#endif
