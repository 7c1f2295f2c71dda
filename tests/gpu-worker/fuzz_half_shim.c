/* Portable scalar fp16/bf16 -> fp32 conversions for the fuzz build only.
 * clang 14 rejects common/half.c (__builtin_cpu_supports("f16c")), so fuzz_gguf links these
 * instead of ra_common; the parser and dequantizers under test are the real ones. */
#include "half.h"

#include <string.h>

float ra_fp16_to_fp32(ra_fp16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  bits = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

float ra_bf16_to_fp32(ra_bf16 h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

void ra_fp16_to_fp32_n(const ra_fp16 *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ra_fp16_to_fp32(src[i]);
}

void ra_bf16_to_fp32_n(const ra_bf16 *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ra_bf16_to_fp32(src[i]);
}
