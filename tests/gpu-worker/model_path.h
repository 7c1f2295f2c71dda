/* Test helper: the SmolLM2 GGUF under $RA_SOURCE_DIR/models. A missing file fails the test with
 * instructions; model-dependent tests never pass silently. */
#ifndef RA_TEST_MODEL_PATH_H
#define RA_TEST_MODEL_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SMOLLM2_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static inline const char *smollm2_path(void) {
  static char path[4096];
  const char *root = getenv("RA_SOURCE_DIR");
  snprintf(path, sizeof path, "%s/%s", root ? root : ".", SMOLLM2_FILE);
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "FAIL: %s is missing: run deploy/fetch-model.sh (or deploy/setup.sh) first\n", path);
    return NULL;
  }
  return path;
}

#endif
