/* libFuzzer target: arbitrary bytes through the GGUF parser, and on success through every
 * accessor (metadata getters, string arrays, dequantization of each tensor's first row). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "gguf.h"
#include "quant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ra_gguf g;
  if (ra_gguf_parse(data, size, &g, NULL) != RA_OK) return 0;
  uint32_t u;
  float f;
  int b;
  ra_gguf_str s;
  ra_gguf_get_u32(&g, "llama.block_count", &u, NULL);
  ra_gguf_get_f32(&g, "llama.rope.freq_base", &f, NULL);
  ra_gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &b, NULL);
  ra_gguf_get_str(&g, "general.architecture", &s, NULL);
  for (uint64_t i = 0; i < g.n_kv; i++) {
    const ra_gguf_kv *kv = &g.kvs[i];
    if (kv->type != RA_GGUF_ARRAY) continue;
    for (uint64_t j = 0; j < kv->arr_n && j < 64; j++) {
      if (kv->arr_type == RA_GGUF_STRING) (void)ra_gguf_arr_str(kv, j);
      else (void)ra_gguf_arr_num(kv, j);
    }
  }
  for (uint64_t i = 0; i < g.n_tensors; i++) {
    const ra_gguf_tensor *t = &g.tensors[i];
    size_t row = t->ne[0] < 4096 ? (size_t)t->ne[0] : 0;
    if (!row) continue;
    float *out = malloc(row * sizeof(float));
    if (out) ra_quant_dequantize(t->type, t->data, out, row);
    free(out);
  }
  ra_gguf_close(&g);
  return 0;
}
