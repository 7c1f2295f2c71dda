#include "vec_i8.h"

#include "half.h"

#include <string.h>

/* The dot from its two exact int32 sums: (hi + lo / 2^15) * qscale * ks, in this order in every
 * kernel set (the product by 2^-15 is exact). */
static inline float dot_from_sums(int32_t hi, int32_t lo, float qscale, float ks) {
  return ((float)hi + (float)lo * 0x1p-15f) * qscale * ks;
}

void ra_vec_i8_dot_portable(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                            int dim, float *scores, size_t lds) {
  const size_t D = (size_t)dim;
  for (size_t r = 0; r < n; r++) {
    const int8_t *k = rows[r];
    const float ks = ra_i8_row_scale(k, D);
    for (size_t j = 0; j < n_q; j++) {
      const int16_t *hi = q16 + 2 * j * D, *lo = hi + D;
      int32_t sh = 0, sl = 0;
      for (size_t d = 0; d < D; d++) {
        sh += (int32_t)hi[d] * k[d];
        sl += (int32_t)lo[d] * k[d];
      }
      scores[j * lds + r] = dot_from_sums(sh, sl, qscale[j], ks);
    }
  }
}

#if defined(__x86_64__)
#include <immintrin.h>

#define RA_AVX2 __attribute__((target("avx2,fma")))
#define RA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma")))
#define INLINE __attribute__((always_inline)) static inline

/* dot_from_sums on four lanes. */
#define DOTS_FROM_SUMS(hi, lo, qs, ks) \
  _mm_mul_ps(_mm_mul_ps(_mm_add_ps(_mm_cvtepi32_ps(hi), _mm_mul_ps(_mm_cvtepi32_ps(lo), _mm_set1_ps(0x1p-15f))), qs), ks)

/* ---- AVX2: vpmaddwd on 16 int16 lanes ---- */

/* The sums of a, b, c and d's eight int32 lanes as [a, b, c, d]. */
RA_AVX2 INLINE __m128i hsum4_epi32_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* Four queries (hi and lo halves) against each row, 16 dims a step, eight sums in registers. */
RA_AVX2 void ra_vec_i8_dot_avx2(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                                int dim, float *scores, size_t lds) {
  const size_t D = (size_t)dim;
  for (size_t j = 0; j < n_q; j += 4) {
    /* a short last group repeats its last query, the extra scores dropped */
    const size_t nj = n_q - j < 4 ? n_q - j : 4, jj[4] = {j, j + (nj > 1), j + (nj > 2 ? 2 : nj - 1), j + nj - 1};
    const int16_t *q[4] = {q16 + 2 * jj[0] * D, q16 + 2 * jj[1] * D, q16 + 2 * jj[2] * D, q16 + 2 * jj[3] * D};
    const __m128 qs = _mm_setr_ps(qscale[jj[0]], qscale[jj[1]], qscale[jj[2]], qscale[jj[3]]);
    for (size_t r = 0; r < n; r++) {
      const int8_t *k = rows[r];
      __m256i h[4], l[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) h[i] = l[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (size_t d = 0; d < D; d += 16) {
        const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k + d)));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
          h[i] = _mm256_add_epi32(h[i], _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q[i] + d))));
          l[i] = _mm256_add_epi32(l[i], _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q[i] + D + d))));
        }
      }
      float out[4];
      _mm_storeu_ps(out, DOTS_FROM_SUMS(hsum4_epi32_avx2(h[0], h[1], h[2], h[3]), hsum4_epi32_avx2(l[0], l[1], l[2], l[3]),
                                        qs, _mm_set1_ps(ra_i8_row_scale(k, D))));
      for (size_t i = 0; i < nj; i++) scores[(j + i) * lds + r] = out[i];
    }
  }
}

/* ---- AVX-512 with VNNI: vpdpwssd on 32 int16 lanes ---- */

/* The sums of a, b, c and d's sixteen int32 lanes as [a, b, c, d]. */
RA_AVX512 INLINE __m128i hsum4_epi32_avx512(__m512i a, __m512i b, __m512i c, __m512i d) {
  /* per 128-bit lane: ab = [a0 + a2, b0 + b2, a1 + a3, b1 + b3], then [a, b, c, d] */
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Two queries (hi and lo halves) against four rows, 32 dims a step: 16 sums in registers, each
 * row's values widened once for both queries, each query half loaded once for the four rows;
 * out[j][h]: query j's half-h sums of the four rows. DIM a constant in the callers for the
 * usual head_dims, so that the dims' loop unrolls. */
RA_AVX512 INLINE void dot2x4_i8_avx512(const int16_t *const *q, const void *const *rows, const int DIM,
                                       __m128i out[2][2]) {
  __m512i a[2][2][4];
#pragma GCC unroll 2
  for (int j = 0; j < 2; j++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
      for (int r = 0; r < 4; r++) a[j][h][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < DIM; i += 32) {
    __m512i x[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) x[r] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)((const int8_t *)rows[r] + i)));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++)
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        const __m512i qv = _mm512_loadu_si512(q[j] + h * DIM + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) a[j][h][r] = _mm512_dpwssd_epi32(a[j][h][r], x[r], qv);
      }
  }
#pragma GCC unroll 2
  for (int j = 0; j < 2; j++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) out[j][h] = hsum4_epi32_avx512(a[j][h][0], a[j][h][1], a[j][h][2], a[j][h][3]);
}

/* Two queries against one row (the rows left over from dot2x4_i8_avx512's fours): [hi0, hi1,
 * lo0, lo1]. */
RA_AVX512 INLINE __m128i dot2x1_i8_avx512(const int16_t *const *q, const int8_t *k, const int DIM) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
#pragma GCC unroll 8
  for (int i = 0; i < DIM; i += 32) {
    const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(k + i)));
    a = _mm512_dpwssd_epi32(a, x, _mm512_loadu_si512(q[0] + i));
    b = _mm512_dpwssd_epi32(b, x, _mm512_loadu_si512(q[1] + i));
    c = _mm512_dpwssd_epi32(c, x, _mm512_loadu_si512(q[0] + DIM + i));
    d = _mm512_dpwssd_epi32(d, x, _mm512_loadu_si512(q[1] + DIM + i));
  }
  return hsum4_epi32_avx512(a, b, c, d);
}

RA_AVX512 INLINE void dot_i8_avx512(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                    size_t n, const int DIM, float *scores, size_t lds) {
  const size_t D = (size_t)DIM;
  for (size_t j = 0; j < n_q; j += 2) {
    /* an odd last query is paired with itself, its copy's scores dropped */
    const size_t j1 = j + 1 < n_q ? j + 1 : j, nj = j1 - j + 1;
    const int16_t *q[2] = {q16 + 2 * j * D, q16 + 2 * j1 * D};
    size_t r = 0;
    for (; r + 4 <= n; r += 4) {
      __m128i sums[2][2];
      dot2x4_i8_avx512(q, rows + r, DIM, sums);
      const __m128 ks = _mm_setr_ps(ra_i8_row_scale(rows[r], D), ra_i8_row_scale(rows[r + 1], D),
                                    ra_i8_row_scale(rows[r + 2], D), ra_i8_row_scale(rows[r + 3], D));
      for (size_t i = 0; i < nj; i++)
        _mm_storeu_ps(scores + (j + i) * lds + r, DOTS_FROM_SUMS(sums[i][0], sums[i][1], _mm_set1_ps(qscale[j + i]), ks));
    }
    for (; r < n; r++) {
      const int8_t *k = rows[r];
      const __m128i s = dot2x1_i8_avx512(q, k, DIM); /* [hi0, hi1, lo0, lo1] */
      float out[4];
      _mm_storeu_ps(out, DOTS_FROM_SUMS(s, _mm_unpackhi_epi64(s, s), _mm_setr_ps(qscale[j], qscale[j1], 0.0f, 0.0f),
                                        _mm_set1_ps(ra_i8_row_scale(k, D))));
      for (size_t i = 0; i < nj; i++) scores[(j + i) * lds + r] = out[i];
    }
  }
}

RA_AVX512 void ra_vec_i8_dot_avx512(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                    size_t n, int dim, float *scores, size_t lds) {
  if (dim == 128) dot_i8_avx512(q16, qscale, n_q, rows, n, 128, scores, lds);
  else if (dim == 64) dot_i8_avx512(q16, qscale, n_q, rows, n, 64, scores, lds);
  else dot_i8_avx512(q16, qscale, n_q, rows, n, dim, scores, lds);
}

#endif
