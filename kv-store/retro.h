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

/* Charges delta bytes of record growth to the owner's budget before they are allocated (0, or an
 * error filled in err: the growth is refused); a negative delta gives bytes back and never fails. */
typedef int (*kvs_retro_charge_fn)(void *ctx, int64_t delta, ra_error *err);

/* The fixed table of record slots (allocated by kvs_retro_new, not charged through charge: the
 * owner counts it with its own metadata). */
size_t kvs_retro_table_bytes(uint32_t n_layers, uint32_t n_q_heads);

/* charge: NULL leaves the records uncounted. */
int kvs_retro_new(uint32_t n_layers, uint32_t n_q_heads, kvs_retro_charge_fn charge, void *charge_ctx,
                  kvs_retro **out, ra_error *err);
/* Gives the records' charged bytes back through charge, then frees. */
void kvs_retro_free(kvs_retro *r);
/* The records' positions' bytes charged so far (capacity: a slot's buffer is reused, never shrunk). */
uint64_t kvs_retro_bytes(kvs_retro *r);

/* Of pos [n] (distinct token positions step `step` attends over for (layer, q_head)), writes to
 * out (room for n) those that past step `past` < step has not seen, in pos order, and returns
 * their count; -1 when a record of the steps past .. step - 1 is missing here (the partial is
 * then left empty: without the record nothing proves a position unseen). */
long kvs_retro_unseen(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t past,
                      const uint64_t *pos, size_t n, uint64_t *out);

/* Records that `step` (>= 1) attended over pos [n] for (layer, q_head) while the store held
 * positions below `horizon`; the record of step - KVS_RETRO_MAX_WINDOW is dropped. A slot's
 * growth is charged first: refused, the slot records no step (later partials of the steps it
 * would have covered stay empty) and the error is returned. */
int kvs_retro_record(kvs_retro *r, uint32_t layer, uint32_t q_head, uint64_t step, uint64_t horizon,
                     const uint64_t *pos, size_t n, ra_error *err);

#endif
