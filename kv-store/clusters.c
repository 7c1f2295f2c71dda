#include "clusters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Directories grow by doubling from this many entries / runs. */
#define KVS_CLUSTERS_MIN_CAP 64u

const kvs_cluster_dir *kvs_session_clusters(const kvs_session *s, uint32_t layer,
                                            uint32_t kv_head) {
  if (!s->clusters) return NULL;
  return s->clusters->dirs[(size_t)layer * s->geo.n_kv_heads + kv_head];
}

/* Index of the first run whose ids end after id (n_runs when none). */
static uint32_t run_after(const kvs_cluster_dir *d, uint64_t id) {
  uint32_t lo = 0, hi = d->n_runs;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if ((uint64_t)d->runs[mid].first_id + d->runs[mid].n <= id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Cluster id's entry and its run, NULL when d does not hold it. */
static const kvs_cluster_entry *entry_of(const kvs_cluster_dir *d, uint32_t id, const kvs_cluster_run **run) {
  if (!d) return NULL;
  const uint32_t r = run_after(d, id);
  if (r == d->n_runs || d->runs[r].first_id > id) return NULL;
  *run = &d->runs[r];
  return &d->entries[(*run)->entry + (id - (*run)->first_id)];
}

int kvs_cluster_dir_find(const kvs_cluster_dir *d, uint32_t id, kvs_cluster_span *out) {
  const kvs_cluster_run *run;
  const kvs_cluster_entry *e = entry_of(d, id, &run);
  if (!e) return 0;
  *out = (kvs_cluster_span){.shard = run->shard, .row = e->row, .count = e->count};
  return 1;
}

void kvs_cluster_dir_prefetch(const kvs_cluster_dir *d, uint32_t id) {
  const kvs_cluster_run *run;
  const kvs_cluster_entry *e = entry_of(d, id, &run);
  if (e) __builtin_prefetch(e);
}

void kvs_session_cluster_stats(const kvs_session *s, uint32_t layer, uint32_t kv_head,
                               kvs_cluster_stats *out) {
  memset(out, 0, sizeof *out);
  size_t count;
  const kvs_shard *sh = kvs_session_head(s, layer, kv_head, &count);
  const kvs_cluster_dir *d = kvs_session_clusters(s, layer, kv_head);
  for (size_t k = 0; k < count; k++) {
    uint64_t c = kvs_cluster_dir_clustered(d, (uint32_t)k);
    out->rows_clustered += c;
    out->rows_lagging += sh[k].n - c;
  }
  out->n_clusters = d ? d->n_entries : 0;
  out->directory_bytes = s->clusters ? s->clusters->bytes : 0;
}

void kvs_clusters_free(kvs_clusters *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_dirs; i++) {
    kvs_cluster_dir *d = c->dirs[i];
    if (!d) continue;
    free(d->runs);
    free(d->entries);
    free(d->clustered);
    free(d);
  }
  free(c->dirs);
  free(c);
}

/* ---- checks ---- */

static void format_rows(char *buf, size_t len, uint64_t b, uint64_t e) {
  snprintf(buf, len, "rows [%llu, %llu)", (unsigned long long)b, (unsigned long long)e);
}

/* Sizes and ids of the request on their own; *total gets sum(counts). */
static int check_shape(const kvs_session *s, const kvs_cluster_put *p, uint64_t *total,
                       ra_error *err) {
  const kvs_geometry *g = &s->geo;
  if (p->layer >= g->n_layers)
    return ra_errorf(err, RA_EINVAL, "layer %u out of range [0, %u)", p->layer, g->n_layers);
  if (p->kv_head >= g->n_kv_heads)
    return ra_errorf(err, RA_EINVAL, "kv head %u out of range [0, %u)", p->kv_head,
                     g->n_kv_heads);
  size_t count;
  kvs_session_head(s, p->layer, p->kv_head, &count);
  if (count == 0)
    return ra_errorf(err, RA_EINVAL, "layer %u kv head %u is not stored here", p->layer,
                     p->kv_head);
  if (p->n_clusters == 0) return ra_errorf(err, RA_EINVAL, "no clusters: counts is empty");
  if ((uint64_t)p->first_cluster + p->n_clusters > (uint64_t)UINT32_MAX + 1)
    return ra_errorf(err, RA_EINVAL, "cluster ids %u + %zu run past %u", p->first_cluster,
                     p->n_clusters, UINT32_MAX);
  uint64_t n = 0;
  for (size_t i = 0; i < p->n_clusters; i++) {
    if (p->counts[i] == 0)
      return ra_errorf(err, RA_EINVAL, "cluster %llu has 0 rows",
                       (unsigned long long)p->first_cluster + i);
    n += p->counts[i];
  }
  if (n > KVS_MAX_ROWS_PER_HEAD || p->row_begin > UINT64_MAX - n)
    return ra_errorf(err, RA_EINVAL, "the clusters' %llu rows from row %llu overflow",
                     (unsigned long long)n, (unsigned long long)p->row_begin);
  if (p->n_perm != 0 && p->n_perm != n)
    return ra_errorf(err, RA_EINVAL, "perm has %zu entries, the clusters cover %llu rows",
                     p->n_perm, (unsigned long long)n);
  *total = n;
  return RA_OK;
}

/* The shard holding rows [b, e) (index among the kv head's), checked against what it stores
 * and how far it is clustered. */
static int check_rows(const kvs_session *s, const kvs_cluster_put *p, uint64_t n, uint32_t *out,
                      ra_error *err) {
  size_t count;
  const kvs_shard *sh = kvs_session_head(s, p->layer, p->kv_head, &count);
  const uint64_t b = p->row_begin, e = b + n;
  char rows[64];
  format_rows(rows, sizeof rows, b, e);
  size_t k = 0;
  while (k < count && !(sh[k].spec.token_begin <= b &&
                        (sh[k].spec.token_end == RA_TOKEN_END_OPEN || b < sh[k].spec.token_end)))
    k++;
  if (k == count)
    return ra_errorf(err, RA_EINVAL, "%s of layer %u kv head %u are in no shard of this store",
                     rows, p->layer, p->kv_head);
  const kvs_shard *h = &sh[k];
  if (h->spec.token_end != RA_TOKEN_END_OPEN && e > h->spec.token_end)
    return ra_errorf(err, RA_EINVAL,
                     "%s of layer %u kv head %u run past the end %llu of their shard: clusters "
                     "lie within one shard",
                     rows, p->layer, p->kv_head, (unsigned long long)h->spec.token_end);
  const uint64_t stored = h->spec.token_begin + h->n;
  if (e > stored)
    return ra_errorf(err, RA_ESTATE,
                     "%s of layer %u kv head %u are not all stored yet: the shard holds rows "
                     "[%llu, %llu)",
                     rows, p->layer, p->kv_head, (unsigned long long)h->spec.token_begin,
                     (unsigned long long)stored);
  const uint64_t done = h->spec.token_begin +
                        kvs_cluster_dir_clustered(kvs_session_clusters(s, p->layer, p->kv_head),
                                                  (uint32_t)k);
  if (b < done)
    return ra_errorf(err, RA_ESTATE, "%s of layer %u kv head %u overlap rows [%llu, %llu) already clustered",
                     rows, p->layer, p->kv_head, (unsigned long long)h->spec.token_begin,
                     (unsigned long long)done);
  if (b > done)
    return ra_errorf(err, RA_ESTATE,
                     "%s of layer %u kv head %u start past row %llu, where the shard's clustered "
                     "rows end: clusters cover each shard from its start, in order",
                     rows, p->layer, p->kv_head, (unsigned long long)done);
  if (p->perm && h->ix)
    return ra_errorf(err, RA_ESTATE,
                     "%s of layer %u kv head %u cannot be permuted: their shard has a search "
                     "index, whose ids are rows",
                     rows, p->layer, p->kv_head);
  *out = (uint32_t)k;
  return RA_OK;
}

static int check_ids(const kvs_session *s, const kvs_cluster_put *p, ra_error *err) {
  const kvs_cluster_dir *d = kvs_session_clusters(s, p->layer, p->kv_head);
  if (!d || p->first_cluster >= d->next_id) return RA_OK;
  const uint64_t end = (uint64_t)p->first_cluster + p->n_clusters;
  uint32_t r = run_after(d, p->first_cluster);
  if (r < d->n_runs && d->runs[r].first_id < end) {
    uint32_t id = d->runs[r].first_id > p->first_cluster ? d->runs[r].first_id : p->first_cluster;
    return ra_errorf(err, RA_ESTATE, "cluster %u of layer %u kv head %u is already defined", id,
                     p->layer, p->kv_head);
  }
  return ra_errorf(err, RA_ESTATE,
                   "cluster ids out of order: %u after %llu of layer %u kv head %u (a store takes "
                   "a kv head's ids in increasing order)",
                   p->first_cluster, (unsigned long long)d->next_id - 1, p->layer, p->kv_head);
}

/* perm is a permutation of [0, n); seen: n bits, zeroed. */
static int check_perm(const uint32_t *perm, uint64_t n, uint8_t *seen, ra_error *err) {
  for (uint64_t j = 0; j < n; j++) {
    uint32_t v = perm[j];
    if (v >= n)
      return ra_errorf(err, RA_EINVAL, "perm[%llu] = %u is out of range [0, %llu)",
                       (unsigned long long)j, v, (unsigned long long)n);
    if (seen[v / 8] & (1u << (v % 8)))
      return ra_errorf(err, RA_EINVAL, "perm[%llu] = %u repeats an entry: not a permutation",
                       (unsigned long long)j, v);
    seen[v / 8] |= (uint8_t)(1u << (v % 8));
  }
  return RA_OK;
}

/* ---- memory ---- */

/* Charges, then allocates: *arr grows to hold `need` elements of `size` bytes. */
static int grow(kvs_session *s, void **arr, uint32_t *cap, uint64_t need, size_t size,
                ra_error *err) {
  if (need <= *cap) return RA_OK;
  uint64_t c = *cap ? (uint64_t)*cap * 2 : KVS_CLUSTERS_MIN_CAP;
  if (c < need) c = need;
  if (c > UINT32_MAX) c = UINT32_MAX;
  uint64_t delta = (c - *cap) * size;
  int rc = kvs_store_charge(s->store, delta, err);
  if (rc) return ra_error_wrap(err, "growing the cluster directory");
  void *a = realloc(*arr, (size_t)c * size);
  if (!a) {
    kvs_store_uncharge(s->store, delta);
    return ra_errorf(err, RA_ENOMEM, "out of memory growing the cluster directory");
  }
  *arr = a;
  *cap = (uint32_t)c;
  s->clusters->bytes += delta;
  atomic_fetch_add(&s->bytes, delta);
  return RA_OK;
}

/* Charges and allocates n zeroed bytes into *out; *charged adds them. */
static int charged_calloc(kvs_session *s, size_t n, void **out, uint64_t *charged,
                          ra_error *err) {
  if (kvs_store_charge(s->store, n, err) != RA_OK)
    return ra_error_wrap(err, "creating a cluster directory");
  void *p = calloc(1, n);
  if (!p) {
    kvs_store_uncharge(s->store, n);
    return ra_errorf(err, RA_ENOMEM, "out of memory creating a cluster directory");
  }
  *charged += n;
  atomic_fetch_add(&s->bytes, n);
  *out = p;
  return RA_OK;
}

/* Undoes charged_callocs of `bytes` in all. */
static void charged_undo(kvs_session *s, void *a, void *b, uint64_t bytes) {
  free(a);
  free(b);
  kvs_store_uncharge(s->store, bytes);
  atomic_fetch_sub(&s->bytes, bytes);
}

/* The directory of the request's kv head with room for the new entries and a run; what it
 * allocates stays (empty) when a later step fails, its bytes charged. */
static int reserve(kvs_session *s, const kvs_cluster_put *p, kvs_cluster_dir **out,
                   ra_error *err) {
  const size_t n_heads = (size_t)s->geo.n_layers * s->geo.n_kv_heads;
  int rc;
  if (!s->clusters) {
    uint64_t bytes = 0;
    kvs_clusters *c = NULL;
    void *dirs = NULL;
    if ((rc = charged_calloc(s, sizeof *c, (void **)&c, &bytes, err)) ||
        (rc = charged_calloc(s, n_heads * sizeof *c->dirs, &dirs, &bytes, err))) {
      charged_undo(s, c, dirs, bytes);
      return rc;
    }
    c->dirs = dirs;
    c->n_dirs = n_heads;
    c->bytes = bytes;
    s->clusters = c;
  }
  kvs_cluster_dir **slot = &s->clusters->dirs[(size_t)p->layer * s->geo.n_kv_heads + p->kv_head];
  if (!*slot) {
    size_t count;
    kvs_session_head(s, p->layer, p->kv_head, &count);
    uint64_t bytes = 0;
    kvs_cluster_dir *d = NULL;
    uint64_t *clustered = NULL;
    if ((rc = charged_calloc(s, sizeof *d, (void **)&d, &bytes, err)) ||
        (rc = charged_calloc(s, count * sizeof *clustered, (void **)&clustered, &bytes, err))) {
      charged_undo(s, d, clustered, bytes);
      return rc;
    }
    d->clustered = clustered;
    d->n_shards = (uint32_t)count;
    s->clusters->bytes += bytes;
    *slot = d;
  }
  kvs_cluster_dir *d = *slot;
  rc = grow(s, (void **)&d->entries, &d->cap_entries, (uint64_t)d->n_entries + p->n_clusters,
                sizeof *d->entries, err);
  if (rc == RA_OK)
    rc = grow(s, (void **)&d->runs, &d->cap_runs, (uint64_t)d->n_runs + 1, sizeof *d->runs, err);
  if (rc == RA_OK) *out = d;
  return rc;
}

/* ---- changes ---- */

/* Rows [r0, r0 + n) of sh reordered in place, keys and values: new row r0 + j = old row
 * r0 + perm[j], by following the permutation's cycles (a row of scratch, no copy of the rows).
 * done: n bits, zeroed; tmp: 2 rows. */
static void permute_rows(const kvs_session *s, kvs_shard *sh, uint64_t r0, const uint32_t *perm,
                         uint64_t n, uint8_t *done, char *tmp) {
  const size_t rb = kvs_row_bytes(&s->geo);
  char *k = (char *)sh->keys + r0 * rb, *v = (char *)sh->values + r0 * rb;
  for (uint64_t i = 0; i < n; i++) {
    if (done[i / 8] & (1u << (i % 8)) || perm[i] == i) continue;
    memcpy(tmp, k + i * rb, rb);
    memcpy(tmp + rb, v + i * rb, rb);
    uint64_t j = i;
    for (;;) {
      done[j / 8] |= (uint8_t)(1u << (j % 8));
      uint64_t from = perm[j];
      if (from == i) break;
      memcpy(k + j * rb, k + from * rb, rb);
      memcpy(v + j * rb, v + from * rb, rb);
      j = from;
    }
    memcpy(k + j * rb, tmp, rb);
    memcpy(v + j * rb, tmp + rb, rb);
  }
}

static void install(kvs_cluster_dir *d, const kvs_cluster_put *p, uint32_t shard,
                    uint64_t local) {
  const uint32_t entry = d->n_entries;
  for (size_t i = 0; i < p->n_clusters; i++) {
    d->entries[d->n_entries++] = (kvs_cluster_entry){.row = (uint32_t)local, .count = p->counts[i]};
    local += p->counts[i];
  }
  kvs_cluster_run *last = d->n_runs ? &d->runs[d->n_runs - 1] : NULL;
  if (last && last->shard == shard && (uint64_t)last->first_id + last->n == p->first_cluster)
    last->n += (uint32_t)p->n_clusters;
  else
    d->runs[d->n_runs++] = (kvs_cluster_run){.first_id = p->first_cluster,
                                             .n = (uint32_t)p->n_clusters, .shard = shard,
                                             .entry = entry};
  d->clustered[shard] = local;
  d->next_id = (uint64_t)p->first_cluster + p->n_clusters;
}

int kvs_session_put_clusters(kvs_session *s, const kvs_cluster_put *p, kvs_cluster_stats *out,
                             ra_error *err) {
  uint8_t *bits = NULL;
  char *tmp = NULL;
  uint64_t n = 0;
  uint32_t shard = 0;
  kvs_cluster_dir *d = NULL;
  pthread_rwlock_wrlock(&s->lock);
  int rc = check_shape(s, p, &n, err);
  if (rc == RA_OK) rc = check_rows(s, p, n, &shard, err);
  if (rc == RA_OK) rc = check_ids(s, p, err);
  if (rc == RA_OK && p->perm) {
    bits = calloc(n / 8 + 1, 1);
    tmp = malloc(2 * kvs_row_bytes(&s->geo));
    if (!bits || !tmp)
      rc = ra_errorf(err, RA_ENOMEM, "out of memory checking a perm of %llu rows",
                     (unsigned long long)n);
    else
      rc = check_perm(p->perm, n, bits, err);
  }
  if (rc == RA_OK) rc = reserve(s, p, &d, err);
  if (rc == RA_OK) {
    size_t count;
    kvs_shard *sh = (kvs_shard *)kvs_session_head(s, p->layer, p->kv_head, &count) + shard;
    const uint64_t local = p->row_begin - sh->spec.token_begin;
    if (p->perm) {
      memset(bits, 0, n / 8 + 1);
      permute_rows(s, sh, local, p->perm, n, (uint8_t *)bits, tmp);
    }
    install(d, p, shard, local);
  }
  if (rc == RA_OK && out) kvs_session_cluster_stats(s, p->layer, p->kv_head, out);
  pthread_rwlock_unlock(&s->lock);
  free(bits);
  free(tmp);
  return rc;
}

/* ---- FetchClusters ---- */

void kvs_cluster_rows_free(kvs_cluster_rows *r) {
  free(r->rows);
  free(r->keys);
  free(r->values);
  memset(r, 0, sizeof *r);
}

static int u32_cmp(const void *x, const void *y) {
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return a < b ? -1 : a > b;
}

/* The request's shape and ids against the session; spans[i] gets the i-th id's rows and
 * *n_rows their sum. Caller holds the read lock. */
static int fetch_check(const kvs_session *s, const kvs_cluster_fetch *f, kvs_cluster_span *spans,
                       uint64_t *n_rows, ra_error *err) {
  const kvs_geometry *g = &s->geo;
  if (f->layer >= g->n_layers)
    return ra_errorf(err, RA_EINVAL, "layer %u out of range [0, %u)", f->layer, g->n_layers);
  if (f->n_ids == 0) return ra_errorf(err, RA_EINVAL, "no clusters asked for");
  uint64_t total = 0;
  for (size_t i = 0; i < f->n_heads; i++) total += f->counts[i];
  if (total != f->n_ids)
    return ra_errorf(err, RA_EINVAL, "counts sum to %llu, but %zu cluster ids came",
                     (unsigned long long)total, f->n_ids);
  uint8_t *seen = calloc(g->n_kv_heads, 1);
  uint32_t *sorted = malloc(f->n_ids * sizeof *sorted);
  int rc = seen && sorted ? RA_OK : ra_errorf(err, RA_ENOMEM, "out of memory for %zu ids", f->n_ids);
  uint64_t rows = 0;
  for (size_t i = 0, off = 0; i < f->n_heads && rc == RA_OK; off += f->counts[i++]) {
    const uint32_t kv = f->kv_heads[i];
    if (kv >= g->n_kv_heads) {
      rc = ra_errorf(err, RA_EINVAL, "kv head %u out of range [0, %u)", kv, g->n_kv_heads);
      break;
    }
    if (seen[kv]++) {
      rc = ra_errorf(err, RA_EINVAL, "kv head %u named twice", kv);
      break;
    }
    const kvs_cluster_dir *d = kvs_session_clusters(s, f->layer, kv);
    for (size_t j = off; j < off + f->counts[i] && rc == RA_OK; j++) {
      if (kvs_cluster_dir_find(d, f->ids[j], &spans[j]))
        rows += spans[j].count;
      else
        rc = ra_errorf(err, RA_ENOTFOUND, "cluster %u of layer %u kv head %u is not held by this store",
                       f->ids[j], f->layer, kv);
    }
    memcpy(sorted, f->ids + off, f->counts[i] * sizeof *sorted);
    qsort(sorted, f->counts[i], sizeof *sorted, u32_cmp);
    for (size_t j = 1; j < f->counts[i] && rc == RA_OK; j++)
      if (sorted[j] == sorted[j - 1])
        rc = ra_errorf(err, RA_EINVAL, "cluster %u of layer %u kv head %u named twice", sorted[j], f->layer, kv);
  }
  free(seen);
  free(sorted);
  if (rc == RA_OK && rows * 2 * kvs_row_bytes(g) > f->max_bytes)
    rc = ra_errorf(err, RA_EINVAL, "the clusters' %llu rows take %llu bytes of keys and values, more than a reply "
                   "carries (%llu)", (unsigned long long)rows, (unsigned long long)(rows * 2 * kvs_row_bytes(g)),
                   (unsigned long long)f->max_bytes);
  *n_rows = rows;
  return rc;
}

int kvs_session_fetch_clusters(kvs_session *s, const kvs_cluster_fetch *f, kvs_cluster_rows *out,
                               ra_error *err) {
  memset(out, 0, sizeof *out);
  kvs_cluster_span *spans = malloc((f->n_ids ? f->n_ids : 1) * sizeof *spans);
  if (!spans) return ra_errorf(err, RA_ENOMEM, "out of memory for %zu ids", f->n_ids);
  pthread_rwlock_rdlock(&s->lock);
  uint64_t n = 0;
  int rc = fetch_check(s, f, spans, &n, err);
  const size_t rb = kvs_row_bytes(&s->geo);
  if (rc == RA_OK) {
    out->rows = malloc(f->n_ids * sizeof *out->rows);
    const size_t bytes = (size_t)n * rb + 1; /* + 1: never a 0-byte malloc */
    out->keys = malloc(bytes);
    out->values = malloc(bytes);
    if (!out->rows || !out->keys || !out->values)
      rc = ra_errorf(err, RA_ENOMEM, "out of memory for %llu rows", (unsigned long long)n);
  }
  for (size_t i = 0, off = 0, at = 0; i < f->n_heads && rc == RA_OK; off += f->counts[i++]) {
    size_t count;
    const kvs_shard *sh = kvs_session_head(s, f->layer, f->kv_heads[i], &count);
    for (size_t j = off; j < off + f->counts[i]; j++) {
      const kvs_cluster_span *sp = &spans[j];
      const size_t bytes = (size_t)sp->count * rb, from = (size_t)sp->row * rb;
      memcpy(out->keys + at, (const uint8_t *)sh[sp->shard].keys + from, bytes);
      memcpy(out->values + at, (const uint8_t *)sh[sp->shard].values + from, bytes);
      out->rows[j] = sp->count;
      at += bytes;
    }
  }
  pthread_rwlock_unlock(&s->lock);
  free(spans);
  if (rc) kvs_cluster_rows_free(out);
  else out->n_rows = n;
  return rc;
}
