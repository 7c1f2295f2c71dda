/* The one place where the project's vocabulary (common/modes.h, common/index_params.h) meets
 * protobuf-c's generated types: AttendMode values, IndexParams and SearchParams, both ways, for
 * the service (kv-store/service.c) and the client (kv-store/client.c), and a head's partial as
 * HeadPartial. The copies are expanded
 * from the parameter tables, whose row names are the proto fields' names. */
#ifndef KVS_WIRE_H
#define KVS_WIRE_H

#include "index_params.h"
#include "kvstore.pb-c.h"
#include "merge.h"
#include "modes.h"
#include "status.h"

/* The mode of a request's AttendMode value; RA_EINVAL "attend mode 17 is unknown". */
int kvs_wire_mode_from_proto(Rakv__AttendMode wire, ra_mode *out, ra_error *err);
/* The AttendMode of a store mode; RA_EINVAL for a mode no store is asked (streaming). */
int kvs_wire_mode_to_proto(ra_mode m, Rakv__AttendMode *out, ra_error *err);

/* proto IndexParams as a spec (m NULL: every field unset). Only the kind can fail to convert
 * ("index kind 9 is not ivf (2), kgraph (3) or roar (4)"); bounds are ra_index_spec_check's. */
int kvs_wire_index_spec_from_proto(const Rakv__IndexParams *m, ra_index_spec *out, ra_error *err);
/* A spec as proto IndexParams (initialized here); RA_EINVAL when its kind has no wire value. */
int kvs_wire_index_spec_to_proto(const ra_index_spec *s, Rakv__IndexParams *m, ra_error *err);

/* proto SearchParams as a spec (m NULL: unset), and back: to_proto initializes m and returns 1
 * when any field is set (0: the request can leave SearchParams out). */
void kvs_wire_search_spec_from_proto(const Rakv__SearchParams *m, ra_search_spec *out);
int kvs_wire_search_spec_to_proto(const ra_search_spec *s, Rakv__SearchParams *m);

/* A head's partial as proto HeadPartial: the message points into h (o, ids), no copy. */
void kvs_wire_partial_to_proto(const ra_head_partial *h, uint32_t head_dim, Rakv__HeadPartial *m);
/* A HeadPartial into the caller's partial: o into out->part.o ([head_dim]), the first ids_cap
 * ids into out->ids (when not NULL). RA_EFORMAT when o is not head_dim floats. */
int kvs_wire_partial_from_proto(const Rakv__HeadPartial *m, uint32_t head_dim, ra_head_partial *out);

#endif
