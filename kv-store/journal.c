#include "journal.h"

#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define REC_MAGIC 0x314a4152u /* "RAJ1" little-endian */
#define REC_HEADER 16
#define REC_MAX (1u << 30)    /* larger than any request the store accepts */
#define SEG_DEFAULT (64ull << 20)

struct kvs_journal {
  kvs_data_dir *d;
  char dir[3200];
  pthread_mutex_t order; /* kvs_journal_lock */
  pthread_mutex_t mu;    /* the file */
  int fd;
  uint32_t seq;          /* the open segment's number */
  uint64_t seg_bytes;    /* bytes in the open segment */
  int dirty;             /* written since the last sync */
  kvs_journal *next;     /* the data dir's list */
};

struct kvs_data_dir {
  char path[3072];
  int fsync_ms;
  uint64_t segment_bytes;
  pthread_mutex_t mu;  /* the list and the syncer's state */
  pthread_cond_t wake;
  kvs_journal *journals;
  pthread_t syncer;
  int syncer_running, stopping;
};

static void hex_id(const uint8_t id[KVS_JOURNAL_ID_BYTES], char out[2 * KVS_JOURNAL_ID_BYTES + 1]) {
  for (int i = 0; i < KVS_JOURNAL_ID_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static int parse_hex_id(const char *s, uint8_t id[KVS_JOURNAL_ID_BYTES]) {
  if (strlen(s) != 2 * KVS_JOURNAL_ID_BYTES) return 0;
  for (int i = 0; i < KVS_JOURNAL_ID_BYTES; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return 0;
    id[i] = (uint8_t)v;
  }
  for (const char *c = s; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
  return 1;
}

static void sync_dirty(kvs_data_dir *d) {
  pthread_mutex_lock(&d->mu);
  for (kvs_journal *j = d->journals; j; j = j->next) {
    pthread_mutex_lock(&j->mu);
    if (j->dirty && j->fd >= 0 && fsync(j->fd) == 0) j->dirty = 0;
    pthread_mutex_unlock(&j->mu);
  }
  pthread_mutex_unlock(&d->mu);
}

static void *syncer_main(void *arg) {
  kvs_data_dir *d = arg;
  pthread_mutex_lock(&d->mu);
  while (!d->stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(d->fsync_ms % 1000) * 1000000L;
    ts.tv_sec += d->fsync_ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&d->wake, &d->mu, &ts);
    pthread_mutex_unlock(&d->mu);
    sync_dirty(d);
    pthread_mutex_lock(&d->mu);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

int kvs_data_dir_open(const char *path, int fsync_ms, uint64_t segment_bytes, kvs_data_dir **out, ra_error *err) {
  *out = NULL;
  if (strlen(path) > 3000) return ra_errorf(err, RA_EINVAL, "data dir path is too long");
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return ra_errorf(err, RA_EIO, "data dir %s: %s", path, strerror(errno));
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return ra_errorf(err, RA_EIO, "data dir %s is not a directory", path);
  kvs_data_dir *d = calloc(1, sizeof *d);
  if (!d) return ra_errorf(err, RA_ENOMEM, "out of memory");
  snprintf(d->path, sizeof d->path, "%s", path);
  d->fsync_ms = fsync_ms;
  d->segment_bytes = segment_bytes ? segment_bytes : SEG_DEFAULT;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->wake, NULL);
  if (fsync_ms > 0) {
    if (pthread_create(&d->syncer, NULL, syncer_main, d) != 0) {
      kvs_data_dir_close(d);
      return ra_errorf(err, RA_EINTERNAL, "cannot start the journal sync thread");
    }
    d->syncer_running = 1;
  }
  *out = d;
  return RA_OK;
}

void kvs_data_dir_close(kvs_data_dir *d) {
  if (!d) return;
  if (d->syncer_running) {
    pthread_mutex_lock(&d->mu);
    d->stopping = 1;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->syncer, NULL);
  }
  pthread_cond_destroy(&d->wake);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

static void seg_path(const kvs_journal *j, uint32_t seq, char *out, size_t len) {
  snprintf(out, len, "%s/%08u.seg", j->dir, seq);
}

/* Opens segment seq for appending at its end (created if absent). File lock held or private. */
static int seg_open(kvs_journal *j, uint32_t seq, ra_error *err) {
  char p[3300];
  seg_path(j, seq, p, sizeof p);
  int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ra_errorf(err, RA_EIO, "journal %s: %s", p, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return ra_errorf(err, RA_EIO, "journal %s: %s", p, strerror(errno));
  }
  if (j->fd >= 0) {
    if (j->dirty) fsync(j->fd);
    close(j->fd);
  }
  j->fd = fd;
  j->seq = seq;
  j->seg_bytes = (uint64_t)sb.st_size;
  return RA_OK;
}

static kvs_journal *journal_new(kvs_data_dir *d, const uint8_t id[KVS_JOURNAL_ID_BYTES]) {
  kvs_journal *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  char hex[2 * KVS_JOURNAL_ID_BYTES + 1];
  hex_id(id, hex);
  j->d = d;
  j->fd = -1;
  snprintf(j->dir, sizeof j->dir, "%s/%s", d->path, hex);
  pthread_mutex_init(&j->order, NULL);
  pthread_mutex_init(&j->mu, NULL);
  return j;
}

static void journal_register(kvs_journal *j) {
  kvs_data_dir *d = j->d;
  pthread_mutex_lock(&d->mu);
  j->next = d->journals;
  d->journals = j;
  pthread_mutex_unlock(&d->mu);
}

static void journal_free(kvs_journal *j) {
  if (j->fd >= 0) close(j->fd);
  pthread_mutex_destroy(&j->order);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

int kvs_journal_create(kvs_data_dir *d, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_journal **out, ra_error *err) {
  kvs_journal *j = journal_new(d, id);
  if (!j) return ra_errorf(err, RA_ENOMEM, "out of memory");
  if (mkdir(j->dir, 0700) != 0) {
    int rc = ra_errorf(err, RA_EIO, "journal %s: %s", j->dir, strerror(errno));
    journal_free(j);
    return rc;
  }
  int rc = seg_open(j, 1, err);
  if (rc) {
    rmdir(j->dir);
    journal_free(j);
    return rc;
  }
  journal_register(j);
  *out = j;
  return RA_OK;
}

static int journal_write(kvs_journal *j, int type, const uint8_t *pre, size_t pre_len, const uint8_t *data,
                         size_t len, ra_error *err) {
  uint64_t total = (uint64_t)pre_len + len;
  if (total > REC_MAX) return ra_errorf(err, RA_EINVAL, "journal: a %llu-byte record", (unsigned long long)total);
  uLong crc = crc32(0L, Z_NULL, 0);
  if (pre_len) crc = crc32(crc, pre, (uInt)pre_len);
  if (len) crc = crc32(crc, data, (uInt)len);
  uint32_t hdr[4] = {REC_MAGIC, (uint32_t)type, (uint32_t)total, (uint32_t)crc};
  struct iovec iov[3] = {{hdr, sizeof hdr}, {(void *)pre, pre_len}, {(void *)data, len}};
  size_t want = sizeof hdr + total;
  pthread_mutex_lock(&j->mu);
  int rc = RA_OK;
  if (j->seg_bytes >= j->d->segment_bytes) rc = seg_open(j, j->seq + 1, err);
  if (rc == RA_OK) {
    ssize_t n;
    do n = writev(j->fd, iov, 3);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)want) {
      /* a short write leaves a torn record: cut it, so that the next record starts clean */
      if (ftruncate(j->fd, (off_t)j->seg_bytes) != 0) ra_log_error("journal %s: cannot cut a torn record", j->dir);
      rc = ra_errorf(err, RA_EIO, "journal %s: write: %s", j->dir, n < 0 ? strerror(errno) : "short write");
    } else {
      j->seg_bytes += want;
      j->dirty = 1;
      if (j->d->fsync_ms == 0) {
        if (fsync(j->fd) != 0) rc = ra_errorf(err, RA_EIO, "journal %s: fsync: %s", j->dir, strerror(errno));
        else j->dirty = 0;
      }
    }
  }
  pthread_mutex_unlock(&j->mu);
  return rc;
}

int kvs_journal_append(kvs_journal *j, int type, const uint8_t *data, size_t len, ra_error *err) {
  return journal_write(j, type, NULL, 0, data, len, err);
}

int kvs_journal_append_open(kvs_journal *j, const uint8_t *data, size_t len, ra_error *err) {
  uint8_t id[KVS_JOURNAL_ID_BYTES];
  const char *hex = strrchr(j->dir, '/') + 1;
  parse_hex_id(hex, id);
  return journal_write(j, KVS_REC_OPEN, id, sizeof id, data, len, err);
}

void kvs_journal_lock(kvs_journal *j) { pthread_mutex_lock(&j->order); }
void kvs_journal_unlock(kvs_journal *j) { pthread_mutex_unlock(&j->order); }

/* Removes dir's segment files and dir itself. */
static void remove_dir(const char *dir) {
  DIR *dh = opendir(dir);
  if (dh) {
    struct dirent *e;
    while ((e = readdir(dh))) {
      if (e->d_name[0] == '.') continue;
      char p[3500];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
    closedir(dh);
  }
  if (rmdir(dir) != 0) ra_log_error("journal %s: cannot remove: %s", dir, strerror(errno));
}

void kvs_journal_close(kvs_journal *j, int discard) {
  if (!j) return;
  kvs_data_dir *d = j->d;
  pthread_mutex_lock(&d->mu);
  for (kvs_journal **p = &d->journals; *p; p = &(*p)->next)
    if (*p == j) {
      *p = j->next;
      break;
    }
  pthread_mutex_unlock(&d->mu);
  if (!discard && j->dirty && j->fd >= 0) fsync(j->fd);
  if (j->fd >= 0) close(j->fd);
  j->fd = -1;
  if (discard) remove_dir(j->dir);
  journal_free(j);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* The segment numbers in dir, sorted. */
static int list_segments(const char *dir, uint32_t **out, size_t *n, ra_error *err) {
  *out = NULL;
  *n = 0;
  DIR *dh = opendir(dir);
  if (!dh) return ra_errorf(err, RA_EIO, "journal %s: %s", dir, strerror(errno));
  size_t cap = 0;
  struct dirent *e;
  int rc = RA_OK;
  while (rc == RA_OK && (e = readdir(dh))) {
    unsigned seq;
    char tail;
    if (sscanf(e->d_name, "%8u.se%c", &seq, &tail) != 2 || tail != 'g' || strlen(e->d_name) != 12) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      uint32_t *a = realloc(*out, cap * sizeof *a);
      if (!a) {
        rc = ra_errorf(err, RA_ENOMEM, "out of memory");
        break;
      }
      *out = a;
    }
    (*out)[(*n)++] = seq;
  }
  closedir(dh);
  if (rc == RA_OK && *n) qsort(*out, *n, sizeof **out, cmp_u32);
  return rc;
}

/* Reads a whole segment file. */
static int read_file(const char *p, uint8_t **data, size_t *len, ra_error *err) {
  *data = NULL;
  *len = 0;
  FILE *f = fopen(p, "rb");
  if (!f) return ra_errorf(err, RA_EIO, "journal %s: %s", p, strerror(errno));
  int rc = RA_OK;
  if (fseek(f, 0, SEEK_END) != 0) rc = ra_errorf(err, RA_EIO, "journal %s: seek", p);
  long size = rc == RA_OK ? ftell(f) : -1;
  if (rc == RA_OK && size < 0) rc = ra_errorf(err, RA_EIO, "journal %s: tell", p);
  if (rc == RA_OK && fseek(f, 0, SEEK_SET) != 0) rc = ra_errorf(err, RA_EIO, "journal %s: seek", p);
  if (rc == RA_OK) {
    *data = malloc(size ? (size_t)size : 1);
    if (!*data) rc = ra_errorf(err, RA_ENOMEM, "journal %s: out of memory for %ld bytes", p, size);
    else if (size && fread(*data, 1, (size_t)size, f) != (size_t)size) rc = ra_errorf(err, RA_EIO, "journal %s: read", p);
    else *len = (size_t)size;
  }
  fclose(f);
  if (rc) {
    free(*data);
    *data = NULL;
  }
  return rc;
}

/* Replays one session directory; on success *out is its journal, open for appending. */
static int replay_session(kvs_data_dir *d, const uint8_t id[KVS_JOURNAL_ID_BYTES], kvs_replay_fn replay, void *ctx,
                          kvs_journal **out, uint64_t *n_records, ra_error *err) {
  kvs_journal *j = journal_new(d, id);
  if (!j) return ra_errorf(err, RA_ENOMEM, "out of memory");
  uint32_t *segs;
  size_t n_segs;
  int rc = list_segments(j->dir, &segs, &n_segs, err);
  if (rc == RA_OK && n_segs == 0) rc = ra_errorf(err, RA_EFORMAT, "journal %s: no segment", j->dir);
  uint64_t n_rec = 0;
  for (size_t si = 0; si < n_segs && rc == RA_OK; si++) {
    char p[3300];
    seg_path(j, segs[si], p, sizeof p);
    uint8_t *data;
    size_t len, off = 0;
    if ((rc = read_file(p, &data, &len, err)) != RA_OK) break;
    int last = si + 1 == n_segs;
    while (rc == RA_OK && off < len) {
      uint32_t hdr[4];
      int torn = len - off < REC_HEADER;
      if (!torn) {
        memcpy(hdr, data + off, sizeof hdr);
        torn = hdr[0] != REC_MAGIC || hdr[2] > REC_MAX || hdr[2] > len - off - REC_HEADER ||
               (uint32_t)crc32(crc32(0L, Z_NULL, 0), data + off + REC_HEADER, hdr[2]) != hdr[3];
      }
      if (torn) {
        if (!last) {
          rc = ra_errorf(err, RA_EFORMAT, "journal %s: damaged record at byte %zu (not the end of the last segment)", p,
                         off);
          break;
        }
        ra_log_warn("journal %s: cutting a torn record at byte %zu of %zu (a write the crash interrupted)", p, off, len);
        if (truncate(p, (off_t)off) != 0) rc = ra_errorf(err, RA_EIO, "journal %s: truncate: %s", p, strerror(errno));
        break;
      }
      rc = replay(ctx, id, (int)hdr[1], data + off + REC_HEADER, hdr[2], err);
      if (rc) ra_error_wrap(err, "journal %s: record at byte %zu", p, off);
      off += REC_HEADER + hdr[2];
      n_rec++;
    }
    free(data);
  }
  if (rc == RA_OK) rc = seg_open(j, segs[n_segs - 1], err);
  free(segs);
  if (rc) {
    journal_free(j);
    return rc;
  }
  journal_register(j);
  *out = j;
  *n_records += n_rec;
  return RA_OK;
}

int kvs_data_dir_replay(kvs_data_dir *d, kvs_replay_fn replay, kvs_attach_fn attach, kvs_drop_fn drop, void *ctx,
                        size_t *n_sessions, uint64_t *n_records, ra_error *err) {
  *n_sessions = 0;
  *n_records = 0;
  DIR *dh = opendir(d->path);
  if (!dh) return ra_errorf(err, RA_EIO, "data dir %s: %s", d->path, strerror(errno));
  struct dirent *e;
  while ((e = readdir(dh))) {
    uint8_t id[KVS_JOURNAL_ID_BYTES];
    if (!parse_hex_id(e->d_name, id)) continue;
    kvs_journal *j = NULL;
    ra_error serr;
    ra_error_clear(&serr);
    if (replay_session(d, id, replay, ctx, &j, n_records, &serr) == RA_OK) {
      attach(ctx, id, j);
      (*n_sessions)++;
      continue;
    }
    drop(ctx, id);
    char from[3400], to[3500];
    snprintf(from, sizeof from, "%s/%s", d->path, e->d_name);
    snprintf(to, sizeof to, "%s.corrupt", from);
    ra_log_error("session %.8s... not restored: %s; its files are kept in %s", e->d_name, serr.msg, to);
    if (rename(from, to) != 0) ra_log_error("cannot rename %s: %s", from, strerror(errno));
  }
  closedir(dh);
  (void)err;
  return RA_OK;
}
