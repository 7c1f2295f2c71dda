/* Retrospective correction's memory at the store: per session, (layer, q head), the token
 * positions each recent decode step attended over, so that a later step can give a past query
 * the partial over exactly the positions it has not seen (RetroAttention).
 *
 * Past step s has seen, by the time of step t > s: every position stored only after s (it was
 * in the worker's window then: positions >= s's horizon) and every position any of the steps
 * s .. t-1 attended over here (its own retrieval, and the later ones its supplementary partials
 * covered). So the positions step t attends over that s has not seen are those below s's
 * horizon and in none of those steps' sets. The store keeps the sets (not the worker) because
 * they are known only here, when the request's retrieval ends: one round trip per layer, and
 * no ids on the wire (docs/architecture.md, "Retrospective correction"). */
#ifndef KVS_RETRO_H
#define KVS_RETRO_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* Steps a request may look back (AttendRequest.retro_window). */
#define KVS_RETRO_MAX_WINDOW 16

typedef struct kvs_retro kvs_retro;

int kvs_retro_new(uint32_t n_layers, uint32_t n_q_heads, kvs_retro **out, ra_error *err);
void kvs_retro_free(kvs_retro *r);

/* Of pos [n] (distinct token positions step `step` attends over for (layer, q_head)), writes to
 * out (room for n) those that past step `past` < step has not seen, in pos order, and returns
 * their count; -1 when a record of the steps past .. step - 1 is missing here (the partial is
 * then left empty: without the record nothing proves a position unseen). */
long kvs_retro_unseen(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t past,
                      const uint64_t *pos, size_t n, uint64_t *out);

/* Records that `step` (>= 1) attended over pos [n] for (layer, q_head) while the store held
 * positions below `horizon`; the record of step - KVS_RETRO_MAX_WINDOW is dropped. */
int kvs_retro_record(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t horizon,
                     const uint64_t *pos, size_t n, ra_error *err);

#endif
