/* Retrospective correction in wave mode (--retro W): what each of the last W decode steps has
 * seen, per (layer, kv head), so that a later step can name to the stores exactly the clusters it
 * retrieves that a past step has not seen (docs/architecture.md, "Retrospective correction").
 *
 * Past step s has seen a cluster when it was in s's retrieval zone or its estimation zone (the
 * estimate is in s's output already and cannot be taken out again), or was supplemented to s
 * by a later step; and every cluster created after s (a growth block clusters rows s saw
 * exactly, in the worker's window or as lag rows): ids >= the number of clusters at s. The
 * worker keeps this rather than the stores because the zones are picked and estimated on the
 * worker: a store sees only its part of the retrieval zone.
 *
 * Memory: a bitset over the meta-index's clusters per (layer, kv head, step slot):
 * n_layers x n_kv_heads x W x cap / 8 bytes. Host only, no locks. */
#ifndef RA_WAVE_RETRO_H
#define RA_WAVE_RETRO_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_wave_retro ra_wave_retro;

/* cap: clusters per (layer, kv head) at most; window: steps kept (>= 1). */
int ra_wave_retro_new(int n_layers, int n_kv_heads, int64_t cap, uint32_t window, ra_wave_retro **out,
                      ra_error *err);
void ra_wave_retro_free(ra_wave_retro *r);

/* Decode step `step` (>= 1) at layer l, kv head g: clusters [0, n_clusters) existed, and it
 * attended or estimated the clusters seen [n] (-1 entries are skipped). Replaces the record of
 * step - window. */
void ra_wave_retro_record(ra_wave_retro *r, int l, int g, uint64_t step, int64_t n_clusters, const int32_t *seen,
                          size_t n);

/* Of the clusters ret [n] (a later step's retrieval zone; -1 entries are skipped), those past
 * step `past` has not seen, into out (room for n) in ret's order; they count as seen by `past`
 * from now on. Returns how many. A step without a record here (no select ran: nothing was
 * offloaded yet, so no cluster existed) has seen every cluster: 0. */
size_t ra_wave_retro_missing(ra_wave_retro *r, int l, int g, uint64_t past, const int32_t *ret, size_t n,
                             int32_t *out);

#endif
