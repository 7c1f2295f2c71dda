#include "half.h"

#include "cpu.h"
#include "status.h"

#include <float.h>
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
    case RA_DTYPE_I8: return 0;
  }
  return 0;
}

size_t ra_dtype_row_bytes(ra_dtype t, size_t dim) {
  if (t == RA_DTYPE_I8) return dim + sizeof(float);
  return ra_dtype_size(t) * dim;
}

const char *ra_dtype_name(ra_dtype t) {
  switch (t) {
    case RA_DTYPE_F32: return "f32";
    case RA_DTYPE_F16: return "f16";
    case RA_DTYPE_BF16: return "bf16";
    case RA_DTYPE_I8: return "int8";
  }
  return "?";
}

int ra_dtype_parse(const char *name, ra_dtype *out) {
  for (int t = RA_DTYPE_F32; t <= RA_DTYPE_I8; t++) {
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
    case RA_DTYPE_I8:
      for (size_t i = 0; i < n; i++) dst[i] = NAN;
      return;
  }
}

void ra_dtype_from_fp32_n(ra_dtype t, const float *src, void *dst, size_t n) {
  switch (t) {
    case RA_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
    case RA_DTYPE_F16: ra_fp32_to_fp16_n(src, dst, n); return;
    case RA_DTYPE_BF16: ra_fp32_to_bf16_n(src, dst, n); return;
    case RA_DTYPE_I8: return;
  }
}

/* Below this max|x| an int8 row is stored as zeros (scale 0): 127 / max|x| would overflow. */
#define I8_TINY 1e-30f

static void i8_dequantize_row(const int8_t *q, float *dst, size_t dim) {
  const float s = ra_i8_row_scale(q, dim);
  for (size_t i = 0; i < dim; i++) dst[i] = (float)q[i] * s;
}

#ifdef RA_X86
/* Elements [0, n8) of row_max_abs (n8 a multiple of 8): max|x| into *mx, sum of x * 0 into *bad. */
__attribute__((target("avx2"))) static void max_abs_avx2(const float *x, size_t n8, float *mx, float *bad) {
  const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
  __m256 vm = zero, vb = zero;
  for (size_t i = 0; i < n8; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    vm = _mm256_max_ps(vm, _mm256_andnot_ps(sign, v));
    vb = _mm256_add_ps(vb, _mm256_mul_ps(v, zero));
  }
  float m8[8], b8[8];
  _mm256_storeu_ps(m8, vm);
  _mm256_storeu_ps(b8, vb);
  for (int j = 0; j < 8; j++) {
    *mx = m8[j] > *mx ? m8[j] : *mx;
    *bad += b8[j];
  }
}

/* q[i] = round(x[i] * inv) for i < n8 (a multiple of 8): cvtps rounds to nearest even, as lrintf;
 * |x * inv| <= 127, so the packs never saturate. */
__attribute__((target("avx2"))) static void quantize_avx2(const float *x, size_t n8, float inv, int8_t *q) {
  const __m256 vi = _mm256_set1_ps(inv);
  for (size_t i = 0; i < n8; i += 8) {
    __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w, w));
  }
}
#endif

/* How many leading elements of a dim-row the AVX2 kernels take (0 without AVX2). */
static size_t vector_part(size_t dim) {
#ifdef RA_X86
  if (ra_cpu_has_avx2()) return dim / 8 * 8;
#endif
  (void)dim;
  return 0;
}

/* max|x| of the row, and whether every element is finite (x * 0 is NaN for inf and NaN, and a
 * sum with a NaN stays NaN, where max would drop it). */
static float row_max_abs(const float *x, size_t dim, int *finite) {
  size_t i = vector_part(dim);
  float mx = 0.0f, bad = 0.0f;
#ifdef RA_X86
  if (i) max_abs_avx2(x, i, &mx, &bad);
#endif
  for (; i < dim; i++) {
    float a = fabsf(x[i]);
    mx = a > mx ? a : mx;
    bad += x[i] * 0.0f;
  }
  *finite = bad == 0.0f;
  return mx;
}

static int i8_quantize_row(const float *x, int8_t *q, size_t dim) {
  int finite;
  const float mx = row_max_abs(x, dim, &finite);
  if (!finite) return RA_EINVAL;
  const int zero = mx < I8_TINY;
  const float scale = zero ? 0.0f : mx / 127.0f, inv = zero ? 0.0f : 127.0f / mx;
  size_t i = vector_part(dim);
#ifdef RA_X86
  if (i) quantize_avx2(x, i, inv, q);
#endif
  for (; i < dim; i++) {
    long r = lrintf(x[i] * inv);
    q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
  }
  memcpy(q + dim, &scale, sizeof scale);
  return RA_OK;
}

void ra_dtype_rows_to_fp32(ra_dtype t, const void *src, float *dst, size_t n_rows, size_t dim) {
  if (t != RA_DTYPE_I8) {
    ra_dtype_to_fp32_n(t, src, dst, n_rows * dim);
    return;
  }
  const size_t rb = ra_dtype_row_bytes(t, dim);
  for (size_t r = 0; r < n_rows; r++) i8_dequantize_row((const int8_t *)src + r * rb, dst + r * dim, dim);
}

int ra_dtype_rows_from_fp32(ra_dtype t, const float *src, void *dst, size_t n_rows, size_t dim,
                            size_t *bad_row) {
  if (t != RA_DTYPE_I8) {
    ra_dtype_from_fp32_n(t, src, dst, n_rows * dim);
    return RA_OK;
  }
  const size_t rb = ra_dtype_row_bytes(t, dim);
  for (size_t r = 0; r < n_rows; r++) {
    if (i8_quantize_row(src + r * dim, (int8_t *)dst + r * rb, dim) != RA_OK) {
      if (bad_row) *bad_row = r;
      return RA_EINVAL;
    }
  }
  return RA_OK;
}

int ra_dtype_rows_check(ra_dtype t, const void *rows, size_t n_rows, size_t dim, size_t *bad_row) {
  if (t != RA_DTYPE_I8) return RA_OK;
  const size_t rb = ra_dtype_row_bytes(t, dim);
  for (size_t r = 0; r < n_rows; r++) {
    const float s = ra_i8_row_scale((const char *)rows + r * rb, dim);
    if (!(s >= 0.0f && s <= FLT_MAX)) {
      if (bad_row) *bad_row = r;
      return RA_EINVAL;
    }
  }
  return RA_OK;
}
