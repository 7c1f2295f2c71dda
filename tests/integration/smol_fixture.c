#include "smol_fixture.h"

#include <stdio.h>
#include <stdlib.h>

int smol_fixture_up(ra_backend **be, ra_model **m, ra_tokenizer **tok, harness_store *st, int n_stores,
                    ra_shard_map *map) {
  char path[1024];
  const char *src = getenv("RA_SOURCE_DIR");
  snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", src ? src : ".");
  ra_error err;
  ra_backend_config bc = {0};
  if (ra_backend_create("cpu", &bc, be, &err) || ra_load_model(*be, path, NULL, 1, m, tok, &err)) {
    fprintf(stderr, "FAIL: %s (the model comes from deploy/fetch-model.sh)\n", err.msg);
    return -1;
  }
  const char *args[] = {"--threads", "1", NULL};
  const char *addrs[8];
  if (n_stores < 1 || n_stores > 8) return -1;
  for (int i = 0; i < n_stores; i++) {
    if (harness_store_start(&st[i], args) != 0) return -1;
    addrs[i] = st[i].addr;
  }
  const ra_model_config *c = &(*m)->cfg;
  if (ra_shard_map_spread(addrs, (size_t)n_stores, (uint32_t)c->n_layers, (uint32_t)c->n_kv_heads, map, &err)) {
    fprintf(stderr, "FAIL: %s\n", err.msg);
    return -1;
  }
  return 0;
}

int smol_fixture_down(ra_backend *be, ra_model *m, ra_tokenizer *tok, harness_store *st, int n_stores,
                      ra_shard_map *map) {
  int rc = 0;
  for (int i = 0; i < n_stores; i++)
    if (st[i].pid > 0 && harness_store_stop(&st[i], 5000) != 0) rc = -1;
  ra_shard_map_free(map);
  ra_tok_free(tok);
  ra_model_free(m);
  if (be) ra_backend_destroy(be);
  return rc;
}
