#include "vec_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define RA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

/* Sixteen elements of row starting at i, widened to fp32 (int8: to int32, then exactly to fp32;
 * the row's scale is the caller's, once a row). */
RA_AVX512 static inline __m512 load16(const void *row, ra_dtype t, int i) {
  switch (t) {
    case RA_DTYPE_I8:
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)row + i))));
    case RA_DTYPE_F16:
      return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const ra_fp16 *)row + i)));
    case RA_DTYPE_BF16: {
      const __m256i h = _mm256_loadu_si256((const __m256i *)((const ra_bf16 *)row + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case RA_DTYPE_F32:
    default:
      return _mm512_loadu_ps((const float *)row + i);
  }
}

/* Dims [d0, d0 + 16 NZ) of up to four accumulators o_j (j < NH, ldo apart) += w_j[r] * row r for
 * r < n: each row's 16 NZ values widened once for all NH outputs, the NH x NZ sums in registers
 * across the rows, each weight broadcast once per row and pass. Per element the rows are added
 * in order by one FMA each, as ra_vec_axpy does. */
RA_AVX512 __attribute__((always_inline)) static inline void accumulate_pass(
    float *o, size_t ldo, int NH, int NZ, const float *w, size_t ldw, const void *const *rows, size_t n, ra_dtype t,
    int dim, int d0) {
  __m512 a[4][4];
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) a[j][z] = _mm512_loadu_ps(o + j * ldo + d0 + 16 * z);
  for (size_t r = 0; r < n; r++) {
    __m512 x[4];
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) x[z] = load16(rows[r], t, d0 + 16 * z);
    const float s = t == RA_DTYPE_I8 ? ra_i8_row_scale(rows[r], (size_t)dim) : 1.0f;
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++) {
      const __m512 wj = _mm512_set1_ps(t == RA_DTYPE_I8 ? w[j * ldw + r] * s : w[j * ldw + r]);
#pragma GCC unroll 4
      for (int z = 0; z < NZ; z++) a[j][z] = _mm512_fmadd_ps(wj, x[z], a[j][z]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) _mm512_storeu_ps(o + j * ldo + d0 + 16 * z, a[j][z]);
}

/* Every dim in passes of 64 (32, 16 when dim is not a multiple), outputs four at a time (then
 * two, one); NH, NZ and the dtype constants so that the passes unroll into registers. */
RA_AVX512 __attribute__((always_inline)) static inline void accumulate_dt(float *o, size_t n_out, const float *w,
                                                                           size_t ldw, const void *const *rows, size_t n,
                                                                           ra_dtype t, int dim) {
#define PASSES(NH, NZ)                                                                                         \
  for (int d = 0; d < dim; d += 16 * (NZ))                                                                     \
    accumulate_pass(o + j * (size_t)dim, (size_t)dim, NH, NZ, w + j * ldw, ldw, rows, n, t, dim, d)
#define OUTPUTS(NH)              \
  do {                           \
    if (dim % 64 == 0)           \
      PASSES(NH, 4);             \
    else if (dim % 32 == 0)      \
      PASSES(NH, 2);             \
    else                         \
      PASSES(NH, 1);             \
  } while (0)
  size_t j = 0;
  for (; j + 4 <= n_out; j += 4) OUTPUTS(4);
  for (; j + 2 <= n_out; j += 2) OUTPUTS(2);
  for (; j < n_out; j++) OUTPUTS(1);
#undef OUTPUTS
#undef PASSES
}

RA_AVX512 void ra_vec_avx512_accumulate_rows(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                   size_t n, ra_dtype t, int dim) {
  switch (t) {
    case RA_DTYPE_F16: accumulate_dt(o, n_out, w, ldw, rows, n, RA_DTYPE_F16, dim); break;
    case RA_DTYPE_BF16: accumulate_dt(o, n_out, w, ldw, rows, n, RA_DTYPE_BF16, dim); break;
    case RA_DTYPE_I8: accumulate_dt(o, n_out, w, ldw, rows, n, RA_DTYPE_I8, dim); break;
    default: accumulate_dt(o, n_out, w, ldw, rows, n, RA_DTYPE_F32, dim);
  }
}

#endif
