/* Writes the fuzzer's seed corpus: small valid GGUF files built with gguf_build. */
#include <stdio.h>
#include <stdlib.h>

#include "gguf_build.h"
#include "quant.h"

static void save(const char *dir, const char *name, gb *b) {
  size_t len;
  uint8_t *f = gb_finish(b, &len);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *o = fopen(path, "wb");
  if (o) {
    fwrite(f, 1, len, o);
    fclose(o);
  }
  free(f);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  gb b = {0};
  gb_str(&b, "general.architecture", "llama");
  gb_u32(&b, "llama.block_count", 2);
  gb_f32(&b, "llama.rope.freq_base", 10000.0f);
  gb_bool(&b, "tokenizer.ggml.add_bos_token", 1);
  const char *toks[] = {"a", "b", "ab"};
  gb_strs(&b, "tokenizer.ggml.tokens", toks, 3);
  float w[64] = {1, 2, 3};
  uint64_t ne[2] = {32, 2};
  gb_tensor(&b, "w", 2, ne, RA_GGML_F32, w, sizeof w);
  save(argv[1], "meta_f32.gguf", &b);
  uint8_t blocks[210 * 2] = {0};
  uint64_t nk = 256;
  const uint32_t types[] = {RA_GGML_Q4_0, RA_GGML_Q4_1, RA_GGML_Q8_0, RA_GGML_Q4_K, RA_GGML_Q6_K, RA_GGML_F16};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    gb q = {0};
    size_t bytes;
    ra_quant_row_bytes(types[i], nk, &bytes);
    gb_tensor(&q, "t", 1, &nk, types[i], blocks, bytes);
    char name[32];
    snprintf(name, sizeof name, "%s.gguf", ra_quant_name(types[i]));
    save(argv[1], name, &q);
  }
  return 0;
}
