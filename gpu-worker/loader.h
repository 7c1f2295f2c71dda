/* Opens a model by spec, with its tokenizer:
 *   PATH.gguf        GGUF weights + tokenizer
 *   DIR              Hugging Face directory: config.json, safetensors (sharded with their index),
 *                    tokenizer.json + tokenizer_config.json (or the tokenizer of tokenizer_gguf)
 *   random:PRESET    random weights (ra_model_config_preset) from `seed`; no tokenizer
 * The GGUF file is only mapped while loading (weights are copied to the backend). */
#ifndef RA_LOADER_H
#define RA_LOADER_H

#include "model.h"
#include "tokenizer.h"

int ra_load_model(ra_backend *be, const char *spec, const char *tokenizer_gguf, uint64_t seed, ra_model **model,
                  ra_tokenizer **tok, ra_error *err);
/* The tokenizer alone: of a GGUF file, or of a Hugging Face directory (tokenizer.json). */
int ra_load_tokenizer(const char *path, ra_tokenizer **tok, ra_error *err);

#endif
