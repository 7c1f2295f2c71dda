/* GGML tensor types as stored in GGUF files, their block geometry, and dequantization to fp32.
 *
 * Every quantized type packs QK values (32 for the legacy types, 256 for the k-quants) into a
 * fixed-size block; a row of n values (n a multiple of QK) takes n / QK * block_bytes bytes.
 * Dequantizers read bytes with memcpy, so the source needs no alignment (tensors in an mmapped
 * file are only as aligned as the file says). */
#ifndef RA_QUANT_H
#define RA_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Numbered as in the GGUF spec (ggml_type). */
typedef enum ra_ggml_type {
  RA_GGML_F32 = 0,
  RA_GGML_F16 = 1,
  RA_GGML_Q4_0 = 2,
  RA_GGML_Q4_1 = 3,
  RA_GGML_Q5_0 = 6,
  RA_GGML_Q5_1 = 7,
  RA_GGML_Q8_0 = 8,
  RA_GGML_Q2_K = 10,
  RA_GGML_Q3_K = 11,
  RA_GGML_Q4_K = 12,
  RA_GGML_Q5_K = 13,
  RA_GGML_Q6_K = 14,
  RA_GGML_BF16 = 30,
} ra_ggml_type;

/* True for the types this module can dequantize. */
int ra_quant_supported(uint32_t type);
/* "Q4_1", "F32", ... or "?" for an unknown type. */
const char *ra_quant_name(uint32_t type);
/* Values per block (1 for F32/F16/BF16) and bytes per block; both 0 for an unsupported type. */
size_t ra_quant_block_size(uint32_t type);
size_t ra_quant_block_bytes(uint32_t type);

/* Bytes of n values of `type`, in *out. RA_EINVAL when the type is unsupported or n is not a
 * multiple of the block size, RA_EFORMAT when the size overflows size_t. */
int ra_quant_row_bytes(uint32_t type, uint64_t n, size_t *out);

/* Dequantizes n values (a multiple of the block size) from `src` to `dst`. The caller has
 * checked the type and size with ra_quant_row_bytes. */
void ra_quant_dequantize(uint32_t type, const void *src, float *dst, size_t n);

#endif
