/* Wave mode's device buffer (RetroInfer's wave buffer): a least-recently-used cache, per (layer,
 * kv head), of the K/V rows of clusters recent steps retrieved, since adjacent decode steps pick
 * mostly the same clusters. A selected cluster the buffer holds (a hit) is attended exactly on
 * the device over its rows here; the others (misses) go to their store as before, and the device
 * partial merges with the stores' by the LSE merge, so the result is the buffer-off one to fp32
 * rounding. Filling the buffer (the rows of missed clusters, fetched from the stores) is the
 * caller's (wave.c); this module only holds rows and attends over them.
 *
 * Memory: per layer K and V tensors [n_kv_heads * R, 1, head_dim] in the stores' dtype (so the
 * rows are bit-equal to what the stores attend over), kv head g owning rows [g * R, (g + 1) * R),
 * cut into pages of RA_WAVE_BUFFER_PAGE rows. A cluster of n rows takes ceil(n / page) pages,
 * not necessarily adjacent; R = clusters * ceil(cluster_rows / page) * page, the room for
 * `clusters` clusters of the average size. Admission evicts least recently hit clusters until
 * the new one's pages are free; a cluster larger than R is never held.
 *
 * A step of layer l: ra_wave_buffer_hit(l, g, c) for each retrieved cluster (1: held, its rows
 * join kv head g's hit list, and it becomes the most recently used), then
 * ra_wave_buffer_attend(l), which attends every q head over its kv head's hit list and clears
 * the lists. Install only between steps of a layer (never between its hits and its attend). */
#ifndef RA_WAVE_BUFFER_H
#define RA_WAVE_BUFFER_H

#include "backend.h"

#include <stdint.h>

#define RA_WAVE_BUFFER_PAGE 8

typedef struct ra_wave_buffer ra_wave_buffer;

/* n_ids: cluster indices per (layer, kv head) (the meta-index capacity); clusters: the size in
 * clusters of cluster_rows rows on average (>= 1). */
int ra_wave_buffer_new(ra_backend *be, int n_layers, int n_heads, int n_kv_heads, int head_dim, ra_dtype dtype,
                       int64_t n_ids, int64_t clusters, int64_t cluster_rows, ra_wave_buffer **out, ra_error *err);
void ra_wave_buffer_free(ra_wave_buffer *b);

/* Rows a (layer, kv head) holds at most: R. */
int64_t ra_wave_buffer_rows(const ra_wave_buffer *b);

/* Whether cluster c of (l, g) is held; when it is, marks it most recently used and adds its
 * rows to kv head g's hit list of the step. */
int ra_wave_buffer_hit(ra_wave_buffer *b, int l, int g, int64_t c);

/* Stages cluster c of (l, g) for installation: rows k, v host fp32 [n, head_dim] (copied),
 * evicting least recently used clusters as needed. Returns RA_OK also when it is held already or
 * n > R (then nothing is installed). Installs of one layer at a time: RA_ESTATE for another
 * layer's while some are staged. A staged cluster is no hit until committed. */
int ra_wave_buffer_install(ra_wave_buffer *b, int l, int g, int64_t c, const float *k, const float *v, int64_t n,
                           ra_error *err);
/* Writes the staged rows to the device: one upload of K and of V and one scatter (set_rows)
 * each, however many clusters came, since the installs of a step's fetches are thousands of
 * small runs. On failure the staged clusters are evicted again. */
int ra_wave_buffer_commit(ra_wave_buffer *b, ra_error *err);
/* Drops the staged clusters (a failed fetch). */
void ra_wave_buffer_discard(ra_wave_buffer *b);

/* The step's device partial of layer l: every q head over its kv head's hit list. q: [1,
 * n_heads, head_dim] or [n_heads, head_dim] F32. *o, *ml ([n_heads, head_dim], [n_heads, 2],
 * attn_merge's layout) or NULL when no head hit; *rows: the rows attended per kv head, summed.
 * Clears the hit lists. */
int ra_wave_buffer_attend(ra_wave_buffer *b, int l, const ra_tensor *q, float scale, const ra_tensor **o,
                          const ra_tensor **ml, uint64_t *rows, ra_error *err);

#endif
