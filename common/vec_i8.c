#include "vec_i8.h"

#include "half.h"

#include <math.h>
#include <string.h>

/* Rows per block of P V summed in int32: |sum| <= 256 * 32767 * 127 < 2^31. */
#define I8_BLOCK 256
#define Q16_MAX 32767.0f

/* The scales of rows[0..n), each stored after its dim values. */
static inline void row_scales(const void *const *rows, size_t n, int dim, float *s) {
  for (size_t r = 0; r < n; r++) s[r] = ra_i8_row_scale(rows[r], (size_t)dim);
}

/* max(mx, |w[r] s[r]|) over r in [r0, n): the scalar tail of every set's weights maximum. */
static inline float abs_max_from(const float *w, const float *s, size_t r0, size_t n, float mx) {
  for (size_t r = r0; r < n; r++) {
    const float a = fabsf(w[r] * s[r]);
    mx = a > mx ? a : mx;
  }
  return mx;
}

/* w16[r] = rint(w[r] s[r] 32767 / mx) for r in [r0, n) and w16[n] = 0 (the pad of an odd
 * count's last pair); returns the weights' scale mx / 32767. */
static inline float round_from(const float *w, const float *s, size_t r0, size_t n, float mx, int16_t *w16) {
  const float inv = Q16_MAX / mx;
  for (size_t r = r0; r < n; r++) w16[r] = (int16_t)lrintf(w[r] * s[r] * inv);
  w16[n] = 0;
  return mx / Q16_MAX;
}

/* The int16 weights of w[r] s[r] for r < n against their largest magnitude (round_from); 0
 * when every weight is 0 (w16 unwritten). */
static float weights_i16_portable(const float *w, const float *s, size_t n, int16_t *w16) {
  const float mx = abs_max_from(w, s, 0, n, 0.0f);
  return mx > 0.0f ? round_from(w, s, 0, n, mx, w16) : 0.0f;
}

void ra_vec_i8_dot_portable(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                            int dim, float *scores, size_t lds) {
  for (size_t r = 0; r < n; r++) {
    const int8_t *k = rows[r];
    const float ks = ra_i8_row_scale(k, (size_t)dim);
    for (size_t j = 0; j < n_q; j++) {
      const int16_t *q = q16 + j * (size_t)dim;
      int32_t acc = 0;
      for (int d = 0; d < dim; d++) acc += (int32_t)q[d] * k[d];
      scores[j * lds + r] = (float)acc * qscale[j] * ks;
    }
  }
}

/* A kernel set's P V: its weights' rounding (weights_i16_portable's, vectorized) and its passes
 * over every dim of nh <= 4 outputs (o [nh, dim] += the int16 weights wp[h] of rows[0..nb) times
 * the rows, scaled by ws[h]; an output with ws[h] == 0 is left as it is). */
typedef float (*weights_fn)(const float *w, const float *s, size_t n, int16_t *w16);
typedef void (*passes_fn)(float *o, int dim, int nh, const int16_t *const *wp, const float *ws,
                          const void *const *rows, size_t nb);

/* ra_vec_accumulate_rows_i8 in blocks of I8_BLOCK rows and groups of four outputs, each block's
 * weights rounded once per output. */
static void accumulate_blocks(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows, size_t n,
                              int dim, weights_fn weights, passes_fn passes) {
  float s[I8_BLOCK], ws[4];
  int16_t w16[4][I8_BLOCK + 2];
  for (size_t r0 = 0; r0 < n; r0 += I8_BLOCK) {
    const size_t nb = n - r0 < I8_BLOCK ? n - r0 : I8_BLOCK;
    row_scales(rows + r0, nb, dim, s);
    for (size_t j = 0; j < n_out; j += 4) {
      const int nh = n_out - j < 4 ? (int)(n_out - j) : 4;
      const int16_t *wp[4];
      for (int h = 0; h < nh; h++) {
        ws[h] = weights(w + (j + (size_t)h) * ldw + r0, s, nb, w16[h]);
        if (ws[h] == 0.0f) memset(w16[h], 0, (nb + 1) * sizeof **w16); /* read by the pass, not added */
        wp[h] = w16[h];
      }
      passes(o + j * (size_t)dim, dim, nh, wp, ws, rows + r0, nb);
    }
  }
}

static void passes_portable(float *o, int dim, int nh, const int16_t *const *wp, const float *ws,
                            const void *const *rows, size_t nb) {
  for (int h = 0; h < nh; h++) {
    if (ws[h] == 0.0f) continue;
    float *oh = o + (size_t)h * (size_t)dim;
    for (int d = 0; d < dim; d++) {
      int32_t acc = 0;
      for (size_t r = 0; r < nb; r++) acc += (int32_t)wp[h][r] * ((const int8_t *)rows[r])[d];
      oh[d] = fmaf(ws[h], (float)acc, oh[d]);
    }
  }
}

void ra_vec_i8_accumulate_portable(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                   size_t n, int dim) {
  accumulate_blocks(o, n_out, w, ldw, rows, n, dim, weights_i16_portable, passes_portable);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define RA_AVX2 __attribute__((target("avx2,fma")))
#define RA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma")))
#define INLINE __attribute__((always_inline)) static inline

/* ---- AVX2: vpmaddwd on 16 int16 lanes ---- */

/* The int16 weights of rows 2p and 2p + 1 as one int32 lane (the low half row 2p's): what
 * vpmaddwd and vpdpwssd pair with two rows' interleaved values. */
static inline int32_t weight_pair(const int16_t *w16, size_t p) {
  int32_t v;
  memcpy(&v, w16 + 2 * p, sizeof v);
  return v;
}

/* weights_i16_portable, eight lanes at a time (the same products and roundings). */
RA_AVX2 static float weights_i16_avx2(const float *w, const float *s, size_t n, int16_t *w16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vm = _mm256_setzero_ps();
  size_t r = 0;
  for (; r + 8 <= n; r += 8)
    vm = _mm256_max_ps(vm, _mm256_andnot_ps(sign, _mm256_mul_ps(_mm256_loadu_ps(w + r), _mm256_loadu_ps(s + r))));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float mx = abs_max_from(w, s, r, n, _mm_cvtss_f32(m4));
  if (!(mx > 0.0f)) return 0.0f;
  const __m256 vi = _mm256_set1_ps(Q16_MAX / mx);
  for (r = 0; r + 8 <= n; r += 8) {
    const __m256i x = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(w + r), _mm256_loadu_ps(s + r)), vi));
    _mm_storeu_si128((__m128i *)(w16 + r), _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
  return round_from(w, s, r, n, mx, w16);
}

/* The sums of a, b, c and d's eight int32 lanes as [a, b, c, d]. */
RA_AVX2 INLINE __m128i hsum4_epi32_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

RA_AVX2 void ra_vec_i8_dot_avx2(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                                int dim, float *scores, size_t lds) {
  const size_t D = (size_t)dim;
  for (size_t j = 0; j < n_q; j += 4) {
    /* a short last group repeats its last query, the extra scores dropped */
    const size_t nj = n_q - j < 4 ? n_q - j : 4, j1 = j + (nj > 1), j2 = j + (nj > 2 ? 2 : nj - 1),
                 j3 = j + nj - 1;
    const int16_t *q0 = q16 + j * D, *q1 = q16 + j1 * D, *q2 = q16 + j2 * D, *q3 = q16 + j3 * D;
    const __m128 qs = _mm_setr_ps(qscale[j], qscale[j1], qscale[j2], qscale[j3]);
    for (size_t r = 0; r < n; r++) {
      const int8_t *k = rows[r];
      __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
#pragma GCC unroll 8
      for (size_t i = 0; i < D; i += 16) {
        const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k + i)));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q0 + i))));
        b = _mm256_add_epi32(b, _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q1 + i))));
        c = _mm256_add_epi32(c, _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q2 + i))));
        d = _mm256_add_epi32(d, _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(q3 + i))));
      }
      float out[4];
      _mm_storeu_ps(out, _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(hsum4_epi32_avx2(a, b, c, d)), qs),
                                    _mm_set1_ps(ra_i8_row_scale(k, D))));
      for (size_t i = 0; i < nj; i++) scores[(j + i) * lds + r] = out[i];
    }
  }
}

/* Dims [d0, d0 + 16) of up to four outputs: acc_j += sum over row pairs of the pair's two
 * int16 weights (weight_pair) times their rows' values interleaved, vpmaddwd lanes
 * holding dims d0 + {0-3, 8-11} (lo) and {4-7, 12-15} (hi); then o_j += ws_j acc_j. */
RA_AVX2 INLINE void accumulate_pass_avx2(float *o, size_t ldo, int NH, const int16_t *const *wp, const float *ws,
                                         const void *const *rows, size_t nb, int d0) {
  __m256i lo[4], hi[4];
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++) lo[j] = hi[j] = _mm256_setzero_si256();
  for (size_t r = 0, p = 0; r < nb; r += 2, p++) {
    const int8_t *ka = rows[r], *kb = rows[r + 1 < nb ? r + 1 : r];
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(ka + d0)));
    const __m256i y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kb + d0)));
    const __m256i xl = _mm256_unpacklo_epi16(x, y), xh = _mm256_unpackhi_epi16(x, y);
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++) {
      const __m256i wj = _mm256_set1_epi32(weight_pair(wp[j], p));
      lo[j] = _mm256_add_epi32(lo[j], _mm256_madd_epi16(xl, wj));
      hi[j] = _mm256_add_epi32(hi[j], _mm256_madd_epi16(xh, wj));
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++) {
    if (ws[j] == 0.0f) continue;
    float *oj = o + j * ldo + d0;
    const __m256 s = _mm256_set1_ps(ws[j]);
    const __m256i a = _mm256_permute2x128_si256(lo[j], hi[j], 0x20), b = _mm256_permute2x128_si256(lo[j], hi[j], 0x31);
    _mm256_storeu_ps(oj, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a), _mm256_loadu_ps(oj)));
    _mm256_storeu_ps(oj + 8, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(b), _mm256_loadu_ps(oj + 8)));
  }
}

RA_AVX2 static void passes_avx2(float *o, int dim, int nh, const int16_t *const *wp, const float *ws,
                                const void *const *rows, size_t nb) {
  for (int d = 0; d < dim; d += 16) {
    if (nh == 4) accumulate_pass_avx2(o, (size_t)dim, 4, wp, ws, rows, nb, d);
    else if (nh == 3) accumulate_pass_avx2(o, (size_t)dim, 3, wp, ws, rows, nb, d);
    else if (nh == 2) accumulate_pass_avx2(o, (size_t)dim, 2, wp, ws, rows, nb, d);
    else accumulate_pass_avx2(o, (size_t)dim, 1, wp, ws, rows, nb, d);
  }
}

void ra_vec_i8_accumulate_avx2(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows, size_t n,
                               int dim) {
  accumulate_blocks(o, n_out, w, ldw, rows, n, dim, weights_i16_avx2, passes_avx2);
}

/* ---- AVX-512 with VNNI: vpdpwssd on 32 int16 lanes ---- */

/* weights_i16_portable, sixteen lanes at a time. */
RA_AVX512 static float weights_i16_avx512(const float *w, const float *s, size_t n, int16_t *w16) {
  __m512 vm = _mm512_setzero_ps();
  size_t r = 0;
  for (; r + 16 <= n; r += 16)
    vm = _mm512_max_ps(vm, _mm512_abs_ps(_mm512_mul_ps(_mm512_loadu_ps(w + r), _mm512_loadu_ps(s + r))));
  const float mx = abs_max_from(w, s, r, n, _mm512_reduce_max_ps(vm));
  if (!(mx > 0.0f)) return 0.0f;
  const __m512 vi = _mm512_set1_ps(Q16_MAX / mx);
  for (r = 0; r + 16 <= n; r += 16) {
    const __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w + r), _mm512_loadu_ps(s + r)), vi));
    _mm256_storeu_si256((__m256i *)(w16 + r), _mm512_cvtepi32_epi16(x));
  }
  return round_from(w, s, r, n, mx, w16);
}

/* The sums of a, b, c and d's sixteen int32 lanes as [a, b, c, d]. */
RA_AVX512 INLINE __m128i hsum4_epi32_avx512(__m512i a, __m512i b, __m512i c, __m512i d) {
  /* per 128-bit lane: ab = [a0 + a2, b0 + b2, a1 + a3, b1 + b3], then [a, b, c, d] */
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Four queries against four rows, 32 dims a step: 16 sums in registers, each row's values
 * widened once for the four queries and each query's loaded once for the four rows; the sums
 * reduced per query into the four rows' scores, stored as one vector. DIM a constant in the
 * callers for the usual head_dims, so that the dims' loop unrolls. */
RA_AVX512 INLINE void dot4x4_i8_avx512(const int16_t *const *q, const void *const *rows, const int DIM, __m128i *out) {
  __m512i a[4][4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++)
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) a[j][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < DIM; i += 32) {
    __m512i x[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) x[r] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)((const int8_t *)rows[r] + i)));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
      const __m512i qj = _mm512_loadu_si512(q[j] + i);
#pragma GCC unroll 4
      for (int r = 0; r < 4; r++) a[j][r] = _mm512_dpwssd_epi32(a[j][r], x[r], qj);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) out[j] = hsum4_epi32_avx512(a[j][0], a[j][1], a[j][2], a[j][3]);
}

/* Four queries against one row (the rows left over from dot4x4_i8_avx512's fours). */
RA_AVX512 INLINE __m128i dot4x1_i8_avx512(const int16_t *const *q, const int8_t *k, const int DIM) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
#pragma GCC unroll 8
  for (int i = 0; i < DIM; i += 32) {
    const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(k + i)));
    a = _mm512_dpwssd_epi32(a, x, _mm512_loadu_si512(q[0] + i));
    b = _mm512_dpwssd_epi32(b, x, _mm512_loadu_si512(q[1] + i));
    c = _mm512_dpwssd_epi32(c, x, _mm512_loadu_si512(q[2] + i));
    d = _mm512_dpwssd_epi32(d, x, _mm512_loadu_si512(q[3] + i));
  }
  return hsum4_epi32_avx512(a, b, c, d);
}

RA_AVX512 INLINE void dot_i8_avx512(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                    size_t n, const int DIM, float *scores, size_t lds) {
  const size_t D = (size_t)DIM;
  for (size_t j = 0; j < n_q; j += 4) {
    /* a short last group repeats its last query, the extra scores dropped */
    const size_t nj = n_q - j < 4 ? n_q - j : 4, jj[4] = {j, j + (nj > 1), j + (nj > 2 ? 2 : nj - 1), j + nj - 1};
    const int16_t *q[4] = {q16 + jj[0] * D, q16 + jj[1] * D, q16 + jj[2] * D, q16 + jj[3] * D};
    size_t r = 0;
    for (; r + 4 <= n; r += 4) {
      __m128i sums[4];
      dot4x4_i8_avx512(q, rows + r, DIM, sums);
      const __m128 ks = _mm_setr_ps(ra_i8_row_scale(rows[r], D), ra_i8_row_scale(rows[r + 1], D),
                                    ra_i8_row_scale(rows[r + 2], D), ra_i8_row_scale(rows[r + 3], D));
      for (size_t i = 0; i < nj; i++)
        _mm_storeu_ps(scores + (j + i) * lds + r,
                      _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(sums[i]), _mm_set1_ps(qscale[jj[i]])), ks));
    }
    const __m128 qs = _mm_setr_ps(qscale[jj[0]], qscale[jj[1]], qscale[jj[2]], qscale[jj[3]]);
    for (; r < n; r++) {
      const int8_t *k = rows[r];
      float out[4];
      _mm_storeu_ps(out, _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(dot4x1_i8_avx512(q, k, DIM)), qs),
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

/* Dims [d0, d0 + 32 NZ) of up to four outputs, as accumulate_pass_avx2 with vpdpwssd: per 32
 * dims, lanes of lo hold dims {0-3, 8-11, 16-19, 24-27} and of hi the others, put back in order
 * by one vpermt2q each at the end. */
RA_AVX512 INLINE void accumulate_pass_avx512(float *o, size_t ldo, int NH, int NZ, const int16_t *const *wp,
                                             const float *ws, const void *const *rows, size_t nb, int d0) {
  __m512i lo[4][2], hi[4][2];
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++)
#pragma GCC unroll 2
    for (int z = 0; z < NZ; z++) lo[j][z] = hi[j][z] = _mm512_setzero_si512();
  for (size_t r = 0, p = 0; r < nb; r += 2, p++) {
    const int8_t *ka = rows[r], *kb = rows[r + 1 < nb ? r + 1 : r];
    __m512i xl[2], xh[2];
#pragma GCC unroll 2
    for (int z = 0; z < NZ; z++) {
      const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(ka + d0 + 32 * z)));
      const __m512i y = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kb + d0 + 32 * z)));
      xl[z] = _mm512_unpacklo_epi16(x, y);
      xh[z] = _mm512_unpackhi_epi16(x, y);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++) {
      const __m512i wj = _mm512_set1_epi32(weight_pair(wp[j], p));
#pragma GCC unroll 2
      for (int z = 0; z < NZ; z++) {
        lo[j][z] = _mm512_dpwssd_epi32(lo[j][z], xl[z], wj);
        hi[j][z] = _mm512_dpwssd_epi32(hi[j][z], xh[z], wj);
      }
    }
  }
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
#pragma GCC unroll 4
  for (int j = 0; j < NH; j++) {
    if (ws[j] == 0.0f) continue;
    const __m512 s = _mm512_set1_ps(ws[j]);
#pragma GCC unroll 2
    for (int z = 0; z < NZ; z++) {
      float *oj = o + j * ldo + d0 + 32 * z;
      const __m512i a = _mm512_permutex2var_epi64(lo[j][z], first, hi[j][z]);
      const __m512i b = _mm512_permutex2var_epi64(lo[j][z], second, hi[j][z]);
      _mm512_storeu_ps(oj, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(a), _mm512_loadu_ps(oj)));
      _mm512_storeu_ps(oj + 16, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(b), _mm512_loadu_ps(oj + 16)));
    }
  }
}

/* 64 dims a pass where dim allows, else 32. */
RA_AVX512 static void passes_avx512(float *o, int dim, int nh, const int16_t *const *wp, const float *ws,
                                    const void *const *rows, size_t nb) {
#define PASSES(NH, NZ)                           \
  for (int d = 0; d < dim; d += 32 * (NZ))       \
  accumulate_pass_avx512(o, (size_t)dim, NH, NZ, wp, ws, rows, nb, d)
#define OUTPUTS(NZ)                \
  do {                             \
    if (nh == 4) PASSES(4, NZ);    \
    else if (nh == 3) PASSES(3, NZ); \
    else if (nh == 2) PASSES(2, NZ); \
    else PASSES(1, NZ);            \
  } while (0)
  if (dim % 64 == 0) OUTPUTS(2);
  else OUTPUTS(1);
#undef OUTPUTS
#undef PASSES
}

void ra_vec_i8_accumulate_avx512(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                 size_t n, int dim) {
  accumulate_blocks(o, n_out, w, ldw, rows, n, dim, weights_i16_avx512, passes_avx512);
}

#endif
