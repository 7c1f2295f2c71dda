/* The Q/K dump format shared by the model runtime (gpu-worker dump-qk), qk-synth and index-bench.
 *
 * A directory holding:
 *   meta.json            {"model": "...", "layers": L, "q_heads": H, "kv_heads": G,
 *                          "head_dim": D, "n_tokens": N, "n_decode": Nd, "rope_applied": true,
 *                          "dtype": "float16"|"float32", ...more keys allowed}
 *   q_L{l}_H{h}.npy      prefill queries of layer l, query head h: [N, D], RoPE applied
 *   k_L{l}_H{g}.npy      keys of layer l, kv head g: [N, D], RoPE applied
 *   qdec_L{l}_H{h}.npy   queries of Nd generated tokens (only when n_decode > 0): [Nd, D]
 *   v_L{l}_H{g}.npy      values of layer l, kv head g: [N, D] (gpu-worker and qk-synth write
 *                        them; index-bench does not read them, wave-bench does)
 * Arrays are .npy 1.0/2.0, float16 or float32, C order (common/npy.h). Query head h reads kv
 * head h / (H / G) (GQA). Row t is token t. */
#ifndef RA_QKDUMP_H
#define RA_QKDUMP_H

#include "npy.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char model[128];
  int layers, q_heads, kv_heads, head_dim;
  uint32_t n_tokens, n_decode;
  int rope_applied;
} ra_qk_meta;

/* Reads and checks DIR/meta.json (required keys present, positive, q_heads % kv_heads == 0). */
int ra_qk_meta_read(const char *dir, ra_qk_meta *m, ra_error *err);

/* Writes DIR/meta.json; extra (may be NULL) is more JSON members, e.g. "\"seed\": 1". */
int ra_qk_meta_write(const char *dir, const ra_qk_meta *m, const char *dtype_name,
                     const char *extra, ra_error *err);

/* DIR/{what}_L{layer}_H{head}.npy, what = "q" | "k" | "v" | "qdec". */
void ra_qk_path(char *out, size_t cap, const char *dir, const char *what, int layer, int head);

/* Reads DIR/{what}_L{layer}_H{head}.npy as fp32 into out (ra_npy_free it), checking that it has
 * dim columns and at least rows_min rows. */
int ra_qk_read_f32(const char *dir, const char *what, int layer, int head, int dim, uint64_t rows_min,
                   ra_npy *out, ra_error *err);

#endif
