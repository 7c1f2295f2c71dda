/* Index build and search parameters: one table row per parameter, from which the C structs
 * (ra_index_spec, ra_search_spec), the proto copies (kv-store/wire.c: protobuf-c's IndexParams /
 * SearchParams fields are named as the rows), the one validator with its bounds, the index
 * library's defaults-over-spec resolution (kv-store/store_index.c) and its own checks
 * (kv-store/index/index.c), and the CLIs' flags are derived.
 *
 *   X(name, TYPE, lo, hi, modes, zero, flag, help)
 *     name   the field in ra_index_spec / ra_search_spec, ra_index_params and proto
 *     TYPE   U32, U64, F32 or BOOL (the C type: RA_PARAM_CTYPE_<TYPE>)
 *     lo, hi bounds of a set value: [lo, hi]; F32 (lo, hi]. 0 is never bounded: in a spec (and on
 *            the wire) 0 always means "unset, take the session's, then the library's default"
 *     modes  RA_MODE_BIT mask of the modes that use it (others ignore it)
 *     zero   once resolved (ra_index_params): RA_PARAM_ZERO_OK when 0 is a value of its own
 *            (auto, none), RA_PARAM_ZERO_BAD when a resolved 0 is a misuse of the library
 *     flag   the CLI flag, without "--"
 *     help   one line for usage text
 *
 * RA_INDEX_BUILD_PARAM_TABLE holds the rows the index library builds with (fields of
 * ra_index_params of the same name), RA_INDEX_PLACE_PARAM_TABLE those the store acts on
 * (where an index lives); RA_INDEX_PARAM_TABLE is both: the whole of proto IndexParams but
 * `kind`. RA_SEARCH_PARAM_TABLE is proto SearchParams, a request's search settings.
 *
 * For CLIs: ra_index_param_find / ra_search_param_find map a flag to its row (ra_param: name,
 * flag, help, bounds, modes), ra_param_parse parses a value into a spec through the row, and
 * ra_index_param_rows / ra_search_param_rows iterate the rows to generate option tables and
 * usage lines. */
#ifndef RA_INDEX_PARAMS_H
#define RA_INDEX_PARAMS_H

#include "modes.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_PARAM_CTYPE_U32 uint32_t
#define RA_PARAM_CTYPE_U64 uint64_t
#define RA_PARAM_CTYPE_F32 float
#define RA_PARAM_CTYPE_BOOL int

#define RA_PARAM_ZERO_BAD 0
#define RA_PARAM_ZERO_OK 1

/* Size bounds: far above any useful value, low enough that a hostile request cannot ask for an
 * absurd graph (its memory is charged anyway). */
#define RA_INDEX_MAX_DEGREE 1024u
#define RA_INDEX_MAX_EF 65536u
#define RA_INDEX_MAX_LISTS 65536u
#define RA_INDEX_MAX_KEEP 65536u     /* kept queries */
#define RA_INDEX_MAX_KEEP_TOPK 1024u /* a kept query's list */
/* An attend's top_k (keys per q head): as large as a graph search's beam can be; a store
 * refuses more with INVALID_ARGUMENT (its working memory grows with top_k x heads x shards). */
#define RA_ATTEND_MAX_TOP_K RA_INDEX_MAX_EF

#define RA_MODES_GRAPH (RA_MODE_BIT(RA_MODE_KGRAPH) | RA_MODE_BIT(RA_MODE_ROAR))
#define RA_MODES_INDEXED (RA_MODE_BIT(RA_MODE_IVF) | RA_MODES_GRAPH)

/* clang-format off */
#define RA_INDEX_BUILD_PARAM_TABLE(X)                                                              \
  X(degree,       U32,  2, RA_INDEX_MAX_DEGREE,    RA_MODES_GRAPH, RA_PARAM_ZERO_BAD, "index-degree", \
    "graph out-degree bound M")                                                                  \
  X(build_ef,     U32,  1, RA_INDEX_MAX_EF,        RA_MODES_GRAPH, RA_PARAM_ZERO_BAD, "build-ef",     \
    "beam width while building (L_build)")                                                       \
  X(knn_nq,       U32,  2, RA_INDEX_MAX_EF,        RA_MODE_BIT(RA_MODE_ROAR), RA_PARAM_ZERO_BAD, "knn-nq", \
    "roar: top-Nq keys per prefill query projected onto the keys")                               \
  X(query_sample, F32,  0, 1,                      RA_MODE_BIT(RA_MODE_ROAR), RA_PARAM_ZERO_BAD, "query-sample", \
    "roar: fraction of the prefill queries used to build, (0, 1]")                               \
  X(n_lists,      U32,  1, RA_INDEX_MAX_LISTS,     RA_MODE_BIT(RA_MODE_IVF), RA_PARAM_ZERO_OK, "n-lists", \
    "ivf: k-means lists (default about 4 sqrt(keys))")                                           \
  X(seed,         U64,  0, 18446744073709551615.0, RA_MODES_INDEXED, RA_PARAM_ZERO_OK, "index-seed", \
    "every random choice of a build; a fixed seed gives a bit-identical index")                  \
  X(pivots,       U32,  1, RA_INDEX_MAX_EF,        RA_MODE_BIT(RA_MODE_ROAR), RA_PARAM_ZERO_OK, "pivots", \
    "roar: the first keys of each query's list that are pivots (default 64, fewer with key lists)") \
  X(keep_queries, U32,  1, RA_INDEX_MAX_KEEP,      RA_MODE_BIT(RA_MODE_ROAR), RA_PARAM_ZERO_OK, "keep-queries", \
    "roar: build queries kept for query-aware insertion")                                        \
  X(keep_topk,    U32,  2, RA_INDEX_MAX_KEEP_TOPK, RA_MODE_BIT(RA_MODE_ROAR), RA_PARAM_ZERO_OK, "keep-topk", \
    "roar: the top keys each kept query tracks")

#define RA_INDEX_PLACE_PARAM_TABLE(X)                                                              \
  X(per_kv_head,  BOOL, 0, 1,                      RA_MODES_INDEXED, RA_PARAM_ZERO_OK, "index-per-kv-head", \
    "one index per kv head, shared by its GQA group, instead of one per q head")

#define RA_SEARCH_PARAM_TABLE(X)                                                                   \
  X(ef,           U32,  1, RA_INDEX_MAX_EF,        RA_MODES_GRAPH, RA_PARAM_ZERO_BAD, "ef",            \
    "graph beam width while searching (L_search; raised to top_k)")                              \
  X(nprobe,       U32,  1, RA_INDEX_MAX_LISTS,     RA_MODE_BIT(RA_MODE_IVF), RA_PARAM_ZERO_BAD, "nprobe", \
    "ivf: lists probed")
/* clang-format on */

#define RA_INDEX_PARAM_TABLE(X) RA_INDEX_BUILD_PARAM_TABLE(X) RA_INDEX_PLACE_PARAM_TABLE(X)

#define RA_PARAM_FIELD_(name, type, lo, hi, modes, zero, flag, help) RA_PARAM_CTYPE_##type name;

/* Index parameters as a request (OpenSession's defaults, BuildIndex's overrides) carries them:
 * zero fields are unset. A BuildIndex request's set fields override the session's, which override
 * ra_index_params_default; per_kv_head can only be switched on. */
typedef struct ra_index_spec {
  ra_mode kind; /* an indexed mode; RA_MODE_FULL (0): unset */
  RA_INDEX_PARAM_TABLE(RA_PARAM_FIELD_)
} ra_index_spec;

/* Search parameters of one attend request: zero fields take the library's defaults
 * (ra_search_params_default). */
typedef struct ra_search_spec {
  RA_SEARCH_PARAM_TABLE(RA_PARAM_FIELD_)
} ra_search_spec;

typedef enum ra_param_type { RA_PARAM_U32, RA_PARAM_U64, RA_PARAM_F32, RA_PARAM_BOOL } ra_param_type;

/* One row of a table, for code that iterates them (validators, CLIs). */
typedef struct ra_param {
  const char *name; /* the field, as in the structs and proto */
  const char *flag; /* CLI flag without "--" */
  const char *help;
  ra_param_type type;
  double lo, hi;    /* a set value's bounds: [lo, hi]; F32: (lo, hi] */
  unsigned modes;   /* RA_MODE_BIT mask of the modes that use it */
  int zero_ok;      /* resolved: 0 is a value of its own (RA_PARAM_ZERO_OK) */
  int build;        /* an index row of RA_INDEX_BUILD_PARAM_TABLE (a field of ra_index_params) */
  size_t offset;    /* of the field in ra_index_spec (index rows) or ra_search_spec (search rows) */
} ra_param;

const ra_param *ra_index_param_rows(size_t *n);  /* [*n] in table order */
const ra_param *ra_search_param_rows(size_t *n); /* [*n] in table order */
/* The row of a CLI flag (without "--", e.g. "knn-nq"), or NULL. */
const ra_param *ra_index_param_find(const char *flag);
const ra_param *ra_search_param_find(const char *flag);

/* A row's value in a spec (an ra_index_spec for index rows, ra_search_spec for search rows), as
 * a double (exact for every U32, F32 and BOOL value; a U64 seed above 2^53 rounds). */
double ra_param_get(const ra_param *p, const void *spec);
/* Parses `text` as the row's value into spec (as for ra_param_get) and checks it: a number of
 * the row's type within its bounds, or 0 (unset); BOOL takes 0 / 1. RA_EINVAL names the flag:
 * "--knn-nq '1' is not 0 (unset) or in [2, 65536]". */
int ra_param_parse(const ra_param *p, const char *text, void *spec, ra_error *err);

/* The validator of a request's parameters: kind unset or an indexed mode, every set field within
 * its row's bounds. RA_EINVAL names the first field that is not ("index degree 5000 out of range
 * [2, 1024]"). */
int ra_index_spec_check(const ra_index_spec *s, ra_error *err);
/* The same for search parameters ("search ef 70000 out of range [1, 65536]"). */
int ra_search_spec_check(const ra_search_spec *s, ra_error *err);
/* The index library's check of resolved parameters (spec: the build rows of ra_index_params,
 * copied by RA_INDEX_BUILD_PARAM_TABLE): every row the kind uses within bounds, 0 only where the
 * row has RA_PARAM_ZERO_OK (the library checks kind itself: it also builds flat indexes).
 * Messages start "index: ". */
int ra_index_spec_check_resolved(const ra_index_spec *s, ra_error *err);

#endif
