/* Attention modes: how the tokens outside the worker's sink + window are attended over. One table
 * row per mode; every enum, name, wire value and property below is derived from it.
 *
 *   X(ID, name, wire, flags, slot, help)
 *     ID     RA_MODE_<ID>
 *     name   what CLIs, logs and messages call it
 *     wire   its proto AttendMode value (kv-store/wire.c asserts they match protobuf-c's
 *            RAKV__ATTEND_MODE__*), or RA_MODE_NO_WIRE for a mode no store is asked
 *     flags  RA_MODE_F_STORES: the worker's offload runtime sends the tokens that leave its window
 *            to kv-stores and asks them to attend (full runs on the worker alone; a store still
 *            answers a full attend)
 *            RA_MODE_F_TOP_K: a store attends over the top_k keys it picks per q head (an attend
 *            request needs top_k > 0)
 *            RA_MODE_F_RETRO: retrospective correction (--retro) can supplement past steps with
 *            what later steps retrieve (docs/architecture.md, "Retrospective correction")
 *     slot   an indexed mode: its index slot in a shard's table, 0 .. RA_MODE_N_INDEXED - 1,
 *            consecutive in row order; -1: the mode needs no index
 *     help   one line for usage text
 *
 * Modes with a wire value are answered by kv-store/attend.c; indexed ones also need an index of
 * their kind per shard (kv-store/index/index.h, BuildIndex). Adding a mode is a row here plus its
 * implementation (docs/architecture.md, "How to add a mode / a parameter"). */
#ifndef RA_MODES_H
#define RA_MODES_H

#include <stddef.h>

#define RA_MODE_NO_WIRE (-1)
#define RA_MODE_F_STORES 1u
#define RA_MODE_F_TOP_K 2u
#define RA_MODE_F_RETRO 4u

/* clang-format off */
#define RA_MODE_TABLE(X)                                                                               \
  X(FULL,      "full",      0,               0,                                                   -1, \
    "exact attention over every token")                                                                \
  X(STREAMING, "streaming", RA_MODE_NO_WIRE, 0,                                                   -1, \
    "sink + window only; evicted tokens are dropped (StreamingLLM)")                                   \
  X(FLAT,      "flat",      1,               RA_MODE_F_STORES | RA_MODE_F_TOP_K | RA_MODE_F_RETRO, -1, \
    "stores attend over the exact top-k keys by inner product")                                        \
  X(IVF,       "ivf",       2,               RA_MODE_F_STORES | RA_MODE_F_TOP_K | RA_MODE_F_RETRO,  0, \
    "top-k from k-means lists: the nprobe lists of nearest centroid")                                  \
  X(KGRAPH,    "kgraph",    3,               RA_MODE_F_STORES | RA_MODE_F_TOP_K | RA_MODE_F_RETRO,  1, \
    "top-k from a key-key proximity graph (HNSW-like baseline)")                                       \
  X(ROAR,      "roar",      4,               RA_MODE_F_STORES | RA_MODE_F_TOP_K | RA_MODE_F_RETRO,  2, \
    "top-k from an attention-aware graph built from prefill queries (RoarGraph)")                      \
  X(WAVE,      "wave",      5,               RA_MODE_F_STORES | RA_MODE_F_RETRO,                  -1, \
    "clusters picked on the worker from centroids: exact at the stores, estimated on the worker")
/* clang-format on */

typedef enum ra_mode {
#define RA_MODE_ENUM_(id, name, wire, flags, slot, help) RA_MODE_##id,
  RA_MODE_TABLE(RA_MODE_ENUM_)
#undef RA_MODE_ENUM_
  RA_MODE_COUNT
} ra_mode;

/* Indexed modes: the number of index slots a shard's table has per owner. */
enum {
#define RA_MODE_INDEXED_(id, name, wire, flags, slot, help) +((slot) >= 0)
  RA_MODE_N_INDEXED = 0 RA_MODE_TABLE(RA_MODE_INDEXED_)
#undef RA_MODE_INDEXED_
};

/* The names joined by '|' ("full|streaming|..."), a constant for option tables' value hints. */
#define RA_MODE_NAME_BAR_(id, name, wire, flags, slot, help) "|" name
#define RA_MODE_NAMES (&(RA_MODE_TABLE(RA_MODE_NAME_BAR_))[1])

/* A set of modes as a bit mask (index_params.h: which modes use a parameter). */
#define RA_MODE_BIT(m) (1u << (m))

const char *ra_mode_name(ra_mode m); /* "full", "flat", ...; "?" when m is no mode */
const char *ra_mode_help(ra_mode m); /* the row's help; "" when m is no mode */
int ra_mode_parse(const char *name, ra_mode *out); /* RA_OK, or RA_EINVAL for an unknown name */
/* Writes the names of the modes that have every flag of `flags` (0: all), in table order, joined
 * by ", " ("full, streaming, flat, ivf, kgraph, roar"), for usage text and messages. Truncates to
 * fit cap (NUL-terminated when cap > 0); returns the length the whole list needs, as snprintf. */
size_t ra_mode_list(char *buf, size_t cap, unsigned flags);

int ra_mode_uses_stores(ra_mode m); /* RA_MODE_F_STORES */
int ra_mode_takes_top_k(ra_mode m); /* RA_MODE_F_TOP_K */
int ra_mode_takes_retro(ra_mode m); /* RA_MODE_F_RETRO */
int ra_mode_has_index(ra_mode m);   /* slot >= 0 */
int ra_mode_index_slot(ra_mode m);  /* 0 .. RA_MODE_N_INDEXED - 1; -1: none */

/* The proto AttendMode value of m, or RA_MODE_NO_WIRE (streaming, or no mode). */
int ra_mode_to_wire(ra_mode m);
/* The mode of a wire value: RA_OK, or RA_EINVAL when no mode has it. */
int ra_mode_from_wire(int wire, ra_mode *out);

#endif
