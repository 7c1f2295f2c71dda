/* Wave mode's cluster directory (proto PutClustersRequest): per (layer, kv head), the clusters
 * of the worker's wave index whose rows this store holds, cluster id -> (shard, first row,
 * rows), and how far each shard of the kv head is clustered.
 *
 * Clusters cover a prefix of each shard: rows [0, clustered) of shard k are the clusters
 * installed on it, back to back; rows [clustered, n) are its lag (appended, not clustered yet),
 * which every wave attend scans (attend_wave.c). Ids are the worker's, global over the stores of
 * a kv head, and a store takes them in increasing order: one install adds a run of consecutive
 * ids over consecutive rows of one shard, merged into the run before when it continues it, so a
 * directory is a short list of runs sorted by id (binary search) over an array of per-cluster
 * (first row, rows).
 *
 * Memory: charged to the store's budget and counted in the session's bytes before it is
 * allocated, freed with the session. Locks: installs take the session's write lock; attends
 * read the directory under its read lock. */
#ifndef KVS_CLUSTERS_H
#define KVS_CLUSTERS_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

/* One cluster's rows: [row, row + count) of the kv head's shard-th shard (kvs_session_head). */
typedef struct kvs_cluster_span {
  uint32_t shard;
  uint32_t row;
  uint32_t count;
} kvs_cluster_span;

/* Ids [first_id, first_id + n) are entries [entry, entry + n), all on one shard. */
typedef struct kvs_cluster_run {
  uint32_t first_id, n;
  uint32_t shard;
  uint32_t entry;
} kvs_cluster_run;

typedef struct kvs_cluster_entry {
  uint32_t row, count;
} kvs_cluster_entry;

typedef struct kvs_cluster_dir {
  kvs_cluster_run *runs; /* [n_runs], sorted by first_id, disjoint */
  uint32_t n_runs, cap_runs;
  kvs_cluster_entry *entries; /* [n_entries] in id order */
  uint32_t n_entries, cap_entries;
  uint64_t next_id;    /* one past the highest id held */
  uint64_t *clustered; /* [n_shards]: rows of each shard of the kv head that clusters cover */
  uint32_t n_shards;
} kvs_cluster_dir;

/* A session's directories. */
typedef struct kvs_clusters {
  kvs_cluster_dir **dirs; /* [n_dirs = n_layers * n_kv_heads]; NULL where none installed */
  size_t n_dirs;
  uint64_t bytes;         /* charged for all of it */
} kvs_clusters;

/* One PutClusters (proto PutClustersRequest, whose comment gives the rules): clusters
 * first_cluster + i of (layer, kv_head), counts[i] rows each, over the rows at positions
 * [row_begin, row_begin + sum(counts)), first reordered by perm when given
 * (new row row_begin + j = old row row_begin + perm[j]). */
typedef struct kvs_cluster_put {
  uint32_t layer, kv_head;
  uint32_t first_cluster;
  uint64_t row_begin;
  const uint32_t *counts;
  size_t n_clusters;
  const uint32_t *perm; /* [n_perm]; NULL (n_perm 0): the rows are in cluster order already */
  size_t n_perm;
} kvs_cluster_put;

/* A kv head's clusters on this store (proto PutClustersReply). */
typedef struct kvs_cluster_stats {
  uint32_t n_clusters;
  uint64_t rows_clustered, rows_lagging;
  uint64_t directory_bytes; /* the session's, all kv heads */
} kvs_cluster_stats;

/* Checks the request against the session (RA_EINVAL: malformed or outside this store's shards;
 * RA_ESTATE: ids held or out of order, rows not stored yet, already clustered or not at the
 * clustered prefix's end, a perm over a shard with a search index; RA_ENOMEM: the budget),
 * then permutes the rows and installs the clusters, or changes nothing. Takes the session's
 * write lock. out (optional): the kv head's clusters after the call. */
int kvs_session_put_clusters(kvs_session *s, const kvs_cluster_put *p, kvs_cluster_stats *out,
                             ra_error *err);

/* The directory of (layer, kv_head), NULL when none was installed. Caller holds the session
 * lock. */
const kvs_cluster_dir *kvs_session_clusters(const kvs_session *s, uint32_t layer,
                                            uint32_t kv_head);
/* Cluster `id`'s rows; 0 when d (possibly NULL) does not hold it. */
int kvs_cluster_dir_find(const kvs_cluster_dir *d, uint32_t id, kvs_cluster_span *out);
/* Starts loading cluster `id`'s entry into the cache (nothing when d does not hold it): a
 * decode step's picks scatter over a directory that the scans of the other layers evicted, so
 * prefetching them all before the finds overlaps their misses. */
void kvs_cluster_dir_prefetch(const kvs_cluster_dir *d, uint32_t id);
/* Rows of the kv head's shard-th shard that clusters cover; its lag starts there. */
static inline uint64_t kvs_cluster_dir_clustered(const kvs_cluster_dir *d, uint32_t shard) {
  return d ? d->clustered[shard] : 0;
}
/* The kv head's clusters here (caller holds the session lock). */
void kvs_session_cluster_stats(const kvs_session *s, uint32_t layer, uint32_t kv_head,
                               kvs_cluster_stats *out);

/* One FetchClusters (proto FetchClustersRequest): of layer, kv head kv_heads[i] names the next
 * counts[i] of ids. */
typedef struct kvs_cluster_fetch {
  uint32_t layer;
  const uint32_t *kv_heads, *counts;
  size_t n_heads;
  const uint32_t *ids;
  size_t n_ids;
  uint64_t max_bytes; /* keys + values the answer may hold */
} kvs_cluster_fetch;

/* The answer: rows[i] rows of the i-th id, their keys and values back to back in request order,
 * [n_rows, head_dim] each in the session dtype. */
typedef struct kvs_cluster_rows {
  uint32_t *rows;
  uint64_t n_rows;
  uint8_t *keys, *values;
} kvs_cluster_rows;

/* Copies the rows of the named clusters under the session's read lock. RA_EINVAL: layer or kv
 * head out of range, counts not summing to the ids, a kv head or id named twice, no id, an
 * answer over max_bytes; RA_ENOTFOUND: an id this store does not hold for its kv head;
 * RA_ENOMEM. On failure out holds nothing. */
int kvs_session_fetch_clusters(kvs_session *s, const kvs_cluster_fetch *f, kvs_cluster_rows *out,
                               ra_error *err);
void kvs_cluster_rows_free(kvs_cluster_rows *r);

/* Frees the directories (session teardown: their bytes are in the session's). */
void kvs_clusters_free(kvs_clusters *c);

#endif
