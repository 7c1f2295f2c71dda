/* The fixture of the integration tests that run SmolLM2 against real stores: the model on the
 * CPU backend (from $RA_SOURCE_DIR/models, fetched by deploy/fetch-model.sh) and n kv-store
 * processes on loopback (--threads 1), the model's (layer, kv head) pairs spread over them. */
#ifndef RA_SMOL_FIXTURE_H
#define RA_SMOL_FIXTURE_H

#include "harness.h"
#include "loader.h"
#include "shardmap.h"

/* 0, or -1 with the reason on stderr; what was set up is left for smol_fixture_down. */
int smol_fixture_up(ra_backend **be, ra_model **m, ra_tokenizer **tok, harness_store *st, int n_stores,
                    ra_shard_map *map);
/* Stops the stores (0, or -1 when one did not stop cleanly) and frees the rest. */
int smol_fixture_down(ra_backend *be, ra_model *m, ra_tokenizer *tok, harness_store *st, int n_stores,
                      ra_shard_map *map);

#endif
