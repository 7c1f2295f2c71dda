#include "half.h"

#include "cpu.h"
#include "status.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define RA_X86 1
#endif

size_t ra_dtype_size(ra_dtype t) {
  switch (t) {
    case RA_DTYPE_F32: return 4;
    case RA_DTYPE_F16:
    case RA_DTYPE_BF16: return 2;
  }
  return 0;
}

const char *ra_dtype_name(ra_dtype t) {
  switch (t) {
    case RA_DTYPE_F32: return "f32";
    case RA_DTYPE_F16: return "f16";
    case RA_DTYPE_BF16: return "bf16";
  }
  return "?";
}

int ra_dtype_parse(const char *name, ra_dtype *out) {
  for (int t = RA_DTYPE_F32; t <= RA_DTYPE_BF16; t++) {
    if (strcmp(name, ra_dtype_name((ra_dtype)t)) == 0) {
      *out = (ra_dtype)t;
      return RA_OK;
    }
  }
  return RA_EINVAL;
}

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float ra_fp16_to_fp32(ra_fp16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

ra_fp16 ra_fp32_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf or NaN; keep NaN quiet and non-zero */
    return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
  if (ax < 0x38800000u) {
    /* result is subnormal or zero: round |f| * 2^24 to the nearest integer, ties to even */
    float v = bits_f32(ax) * 0x1p24f;
    return (uint16_t)(sign | (uint16_t)nearbyintf(v));
  }
  uint32_t mant_odd = (ax >> 13) & 1;
  ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round to nearest even */
  return (uint16_t)(sign | (ax >> 13));
}

float ra_bf16_to_fp32(ra_bf16 h) { return bits_f32((uint32_t)h << 16); }

ra_bf16 ra_fp32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#ifdef RA_X86
__attribute__((target("avx2,f16c"))) static void fp16_to_fp32_f16c(const ra_fp16 *src, float *dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = ra_fp16_to_fp32(src[i]);
}

__attribute__((target("avx2,f16c"))) static void fp32_to_fp16_f16c(const float *src, ra_fp16 *dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = ra_fp32_to_fp16(src[i]);
}

#endif

void ra_fp16_to_fp32_n(const ra_fp16 *src, float *dst, size_t n) {
#ifdef RA_X86
  if (ra_cpu_has_avx2()) {
    fp16_to_fp32_f16c(src, dst, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) dst[i] = ra_fp16_to_fp32(src[i]);
}

void ra_fp32_to_fp16_n(const float *src, ra_fp16 *dst, size_t n) {
#ifdef RA_X86
  if (ra_cpu_has_avx2()) {
    fp32_to_fp16_f16c(src, dst, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) dst[i] = ra_fp32_to_fp16(src[i]);
}

void ra_bf16_to_fp32_n(const ra_bf16 *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ra_bf16_to_fp32(src[i]);
}

void ra_fp32_to_bf16_n(const float *src, ra_bf16 *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ra_fp32_to_bf16(src[i]);
}

void ra_dtype_to_fp32_n(ra_dtype t, const void *src, float *dst, size_t n) {
  switch (t) {
    case RA_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
    case RA_DTYPE_F16: ra_fp16_to_fp32_n(src, dst, n); return;
    case RA_DTYPE_BF16: ra_bf16_to_fp32_n(src, dst, n); return;
  }
}

void ra_dtype_from_fp32_n(ra_dtype t, const float *src, void *dst, size_t n) {
  switch (t) {
    case RA_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
    case RA_DTYPE_F16: ra_fp32_to_fp16_n(src, dst, n); return;
    case RA_DTYPE_BF16: ra_fp32_to_bf16_n(src, dst, n); return;
  }
}
