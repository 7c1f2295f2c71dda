/* Q/K dumps for offline index experiments.
 *
 * A dump directory holds:
 *   meta.json                 {"model", "layers", "q_heads", "kv_heads", "head_dim",
 *                              "n_prompt_tokens", "n_decode_tokens", "n_tokens", "rope_applied": true,
 *                              "rope_style", "dtype", "dumped_layers": [...], "prompt_tokens": [...],
 *                              "decode_tokens": [...]}
 *   q_L{l}_H{h}.npy           [n_prompt_tokens, head_dim]  post-RoPE query of q head h, prompt tokens
 *   qdec_L{l}_H{h}.npy        [n_decode_tokens, head_dim]  queries of the generated tokens, in order
 *   k_L{l}_H{g}.npy           [n_tokens, head_dim]         post-RoPE keys of kv head g, all tokens
 *   v_L{l}_H{g}.npy           [n_tokens, head_dim]         values of kv head g, all tokens
 * with n_tokens = n_prompt_tokens + n_decode_tokens: decode token j (greedy) is fed at position
 * n_prompt_tokens + j, so qdec row j attends to k rows [0, n_prompt_tokens + j]. q head h reads kv
 * head h / (q_heads / kv_heads). Arrays are float16 or float32 (npy.h reads both). */
#ifndef RA_DUMP_QK_H
#define RA_DUMP_QK_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_dump_config {
  const char *out_dir;     /* created if missing */
  int n_decode;            /* generated tokens whose queries are dumped */
  const uint8_t *layer_on; /* [n_layers] flags; NULL = every layer */
  ra_dtype dtype;          /* RA_DTYPE_F16 or RA_DTYPE_F32 */
  const char *model_name;
} ra_dump_config;

/* Runs the prompt (fresh state) plus n_decode greedy steps and writes the dump. */
int ra_dump_qk(ra_state *st, const int32_t *prompt, size_t n_prompt, const ra_dump_config *cfg, ra_error *err);

/* Parses "0,3,5-7" into flags for n_layers layers. */
int ra_dump_parse_layers(const char *spec, int n_layers, uint8_t *flags, ra_error *err);

#endif
