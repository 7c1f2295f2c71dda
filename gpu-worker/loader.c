#include "loader.h"

#include <string.h>
#include <sys/stat.h>

int ra_load_tokenizer(const char *path, ra_tokenizer **tok, ra_error *err) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return ra_tok_load_hf(path, tok, err);
  ra_gguf g;
  int rc = ra_gguf_open(path, &g, err);
  if (rc) return rc;
  rc = ra_tok_load_gguf(&g, tok, err);
  ra_gguf_close(&g);
  return rc;
}

int ra_load_model(ra_backend *be, const char *spec, const char *tokenizer_gguf, uint64_t seed, ra_model **model,
                  ra_tokenizer **tok, ra_error *err) {
  *model = NULL;
  *tok = NULL;
  int rc;
  if (strncmp(spec, "random:", 7) == 0) {
    ra_model_config cfg;
    if ((rc = ra_model_config_preset(spec + 7, &cfg, err))) return rc;
    rc = ra_model_random(be, &cfg, seed, model, err);
    /* the dtype the backend keeps a loaded checkpoint's matrices in (backend_cuda.h) */
    if (rc == RA_OK && strcmp(be->name, "cuda") == 0) rc = ra_model_convert_weights(*model, RA_DTYPE_BF16, err);
  } else {
    struct stat sb;
    if (stat(spec, &sb) != 0)
      return ra_errorf(err, RA_ENOTFOUND, "model: %s does not exist (run deploy/fetch-model.sh for SmolLM2)", spec);
    if (S_ISDIR(sb.st_mode)) {
      rc = ra_model_load_safetensors(be, spec, model, err);
      /* the directory's own tokenizer.json, unless one is given; a directory without one has none */
      if (rc == RA_OK && !tokenizer_gguf && (rc = ra_tok_load_hf(spec, tok, err)) == RA_ENOTFOUND) rc = RA_OK;
    } else {
      ra_gguf g;
      if ((rc = ra_gguf_open(spec, &g, err))) return rc;
      rc = ra_model_load_gguf(be, &g, model, err);
      if (rc == RA_OK && !tokenizer_gguf) rc = ra_tok_load_gguf(&g, tok, err);
      ra_gguf_close(&g);
    }
  }
  if (rc == RA_OK && tokenizer_gguf) rc = ra_load_tokenizer(tokenizer_gguf, tok, err);
  if (rc == RA_OK && *tok && ra_tok_vocab(*tok) > (*model)->cfg.vocab)
    rc = ra_errorf(err, RA_EINVAL, "model: tokenizer has %d tokens, the model %d", ra_tok_vocab(*tok), (*model)->cfg.vocab);
  if (rc != RA_OK) {
    ra_model_free(*model);
    ra_tok_free(*tok);
    *model = NULL;
    *tok = NULL;
  }
  return rc;
}
