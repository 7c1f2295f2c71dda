#include "vec.h"

#include "cpu.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define RA_X86 1
#endif

static inline size_t row_bytes(ra_dtype t, int dim) { return ra_dtype_size(t) * (size_t)dim; }

static float dot_portable(const float *q, const void *row, ra_dtype t, int dim) {
  float s = 0.0f;
  switch (t) {
    case RA_DTYPE_F32: {
      const float *r = row;
      for (int i = 0; i < dim; i++) s += q[i] * r[i];
      break;
    }
    case RA_DTYPE_F16: {
      const ra_fp16 *r = row;
      for (int i = 0; i < dim; i++) s += q[i] * ra_fp16_to_fp32(r[i]);
      break;
    }
    case RA_DTYPE_BF16: {
      const ra_bf16 *r = row;
      for (int i = 0; i < dim; i++) s += q[i] * ra_bf16_to_fp32(r[i]);
      break;
    }
  }
  return s;
}

static void axpy_portable(float *acc, float w, const void *row, ra_dtype t, int dim) {
  switch (t) {
    case RA_DTYPE_F32: {
      const float *r = row;
      for (int i = 0; i < dim; i++) acc[i] += w * r[i];
      break;
    }
    case RA_DTYPE_F16: {
      const ra_fp16 *r = row;
      for (int i = 0; i < dim; i++) acc[i] += w * ra_fp16_to_fp32(r[i]);
      break;
    }
    case RA_DTYPE_BF16: {
      const ra_bf16 *r = row;
      for (int i = 0; i < dim; i++) acc[i] += w * ra_bf16_to_fp32(r[i]);
      break;
    }
  }
}

#ifdef RA_X86
#define RA_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Eight elements of row starting at i, widened to fp32. */
RA_AVX2 static inline __m256 load8(const void *row, ra_dtype t, int i) {
  switch (t) {
    case RA_DTYPE_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ra_fp16 *)row + i)));
    case RA_DTYPE_BF16: {
      __m128i h = _mm_loadu_si128((const __m128i *)((const ra_bf16 *)row + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case RA_DTYPE_F32:
    default:
      return _mm256_loadu_ps((const float *)row + i);
  }
}

RA_AVX2 static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

RA_AVX2 static float dot_avx2(const float *q, const void *row, ra_dtype t, int dim) {
  /* Two accumulators hide the FMA latency for dim >= 16 (head_dim is 64 or 128). */
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= dim; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(row, t, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(row, t, i + 8), a1);
  }
  for (; i + 8 <= dim; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(row, t, i), a0);
  float s = hsum(_mm256_add_ps(a0, a1));
  if (i < dim) {
    size_t off = (size_t)i * ra_dtype_size(t);
    s += dot_portable(q + i, (const char *)row + off, t, dim - i);
  }
  return s;
}

RA_AVX2 static void axpy_avx2(float *acc, float w, const void *row, ra_dtype t, int dim) {
  __m256 vw = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, load8(row, t, i), _mm256_loadu_ps(acc + i)));
  if (i < dim) axpy_portable(acc + i, w, (const char *)row + (size_t)i * ra_dtype_size(t), t, dim - i);
}

#endif

const char *ra_vec_kernel_name(void) { return ra_cpu_has_avx2() ? "avx2" : "portable"; }

float ra_vec_dot(const float *q, const void *row, ra_dtype t, int dim) {
#ifdef RA_X86
  if (ra_cpu_has_avx2()) return dot_avx2(q, row, t, dim);
#endif
  return dot_portable(q, row, t, dim);
}

void ra_vec_prefetch_row(const void *rows, ra_dtype t, int dim, uint32_t id) {
  size_t bytes = row_bytes(t, dim);
  const char *p = (const char *)rows + (size_t)id * bytes;
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

/* How many rows ahead a gather prefetches: enough misses in flight to cover DRAM latency. */
#define RA_PREFETCH_AHEAD 8

void ra_vec_dot_rows(const float *q, const void *rows, ra_dtype t, int dim, const uint32_t *ids,
                     size_t n, float *scores) {
  size_t bytes = row_bytes(t, dim);
  const char *base = rows;
  if (!ids) {
    for (size_t i = 0; i < n; i++) scores[i] = ra_vec_dot(q, base + i * bytes, t, dim);
    return;
  }
  for (size_t i = 0; i < n && i < RA_PREFETCH_AHEAD; i++) ra_vec_prefetch_row(rows, t, dim, ids[i]);
  for (size_t i = 0; i < n; i++) {
    if (i + RA_PREFETCH_AHEAD < n) ra_vec_prefetch_row(rows, t, dim, ids[i + RA_PREFETCH_AHEAD]);
    scores[i] = ra_vec_dot(q, base + (size_t)ids[i] * bytes, t, dim);
  }
}

void ra_vec_axpy(float *acc, float w, const void *row, ra_dtype t, int dim) {
#ifdef RA_X86
  if (ra_cpu_has_avx2()) {
    axpy_avx2(acc, w, row, t, dim);
    return;
  }
#endif
  axpy_portable(acc, w, row, t, dim);
}
