#include "vec.h"

#include "cpu.h"
#include "status.h"
#include "vec_avx512.h"
#include "vec_i8.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define RA_X86 1
#endif

/* The kernel sets, in the order each adds to the one before; the set in use is the best this
 * CPU has unless ra_vec_use_kernels chose a lower one. */
enum { VEC_PORTABLE, VEC_AVX2, VEC_AVX512, VEC_SETS };
static const char *const set_names[VEC_SETS] = {"portable", "avx2", "avx512"};
static atomic_int vec_set = -1;

static int best_set(void) { return ra_cpu_has_avx512() ? VEC_AVX512 : ra_cpu_has_avx2() ? VEC_AVX2 : VEC_PORTABLE; }

static inline int kernel_set(void) {
  int k = atomic_load_explicit(&vec_set, memory_order_relaxed);
  if (k < 0) {
    k = best_set();
    atomic_store_explicit(&vec_set, k, memory_order_relaxed);
  }
  return k;
}

static inline int has_avx2(void) { return kernel_set() >= VEC_AVX2; }
static inline int has_avx512(void) { return kernel_set() >= VEC_AVX512; }

static inline size_t row_bytes(ra_dtype t, int dim) { return ra_dtype_row_bytes(t, (size_t)dim); }

/* Bytes of one stored value: an int8 row's values are bytes (its scale follows them). */
static inline size_t value_bytes(ra_dtype t) { return t == RA_DTYPE_I8 ? 1 : ra_dtype_size(t); }

/* q · the first dim values of row, before an int8 row's scale (the kernels apply it once a
 * row). */
static float dot_values(const float *q, const void *row, ra_dtype t, int dim) {
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
    case RA_DTYPE_I8: {
      const int8_t *r = row;
      for (int i = 0; i < dim; i++) s += q[i] * (float)r[i];
      break;
    }
  }
  return s;
}

static float dot_portable(const float *q, const void *row, ra_dtype t, int dim) {
  float s = dot_values(q, row, t, dim);
  return t == RA_DTYPE_I8 ? s * ra_i8_row_scale(row, (size_t)dim) : s;
}

/* acc[0..dim) += w * the first dim values of row (w already carries an int8 row's scale). */
static void axpy_values(float *acc, float w, const void *row, ra_dtype t, int dim) {
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
    case RA_DTYPE_I8: {
      const int8_t *r = row;
      for (int i = 0; i < dim; i++) acc[i] += w * (float)r[i];
      break;
    }
  }
}

/* The weight of a row in an accumulation: an int8 row's scale folded in once. */
static inline float row_weight(float w, const void *row, ra_dtype t, int dim) {
  return t == RA_DTYPE_I8 ? w * ra_i8_row_scale(row, (size_t)dim) : w;
}

static void axpy_portable(float *acc, float w, const void *row, ra_dtype t, int dim) {
  axpy_values(acc, row_weight(w, row, t, dim), row, t, dim);
}

#ifdef RA_X86
#define RA_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Runs CALL(DT) with the dtype t as a constant DT in each branch, so that load8's switch leaves
 * the inlined loops. */
#define WITH_CONST_DTYPE(t, CALL)   \
  switch (t) {                      \
    case RA_DTYPE_F16:              \
      CALL(RA_DTYPE_F16);           \
      break;                        \
    case RA_DTYPE_BF16:             \
      CALL(RA_DTYPE_BF16);          \
      break;                        \
    case RA_DTYPE_I8:               \
      CALL(RA_DTYPE_I8);            \
      break;                        \
    default:                        \
      CALL(RA_DTYPE_F32);           \
  }

/* Eight elements of row starting at i, widened to fp32 (int8: to int32, then exactly to fp32;
 * the row's scale is the caller's, once a row). */
RA_AVX2 static inline __m256 load8(const void *row, ra_dtype t, int i) {
  switch (t) {
    case RA_DTYPE_I8:
      return _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
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

/* hsum of a, b, c and d into out[0..4), each sum made of the same additions as hsum's (lanes
 * (0+4, 2+6) and (1+5, 3+7), then those two): equal bit for bit, in 10 vector instructions
 * instead of 4 x 6 (the reductions were a third of the four-dot kernel's samples in a roar
 * build's occlusion pruning, where each call's scores are awaited at once). */
RA_AVX2 static inline void hsum4(__m256 a, __m256 b, __m256 c, __m256 d, float *out) {
  __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  /* Per 128-bit lane [s0, s2, s1, s3], so that the horizontal add pairs s0 + s2 and s1 + s3. */
  ab = _mm256_permute_ps(ab, _MM_SHUFFLE(3, 1, 2, 0));
  cd = _mm256_permute_ps(cd, _MM_SHUFFLE(3, 1, 2, 0));
  __m256 h = _mm256_hadd_ps(ab, cd);
  h = _mm256_hadd_ps(h, h); /* lanes [a, c, a, c | b, d, b, d] */
  _mm_storeu_ps(out, _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
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
    size_t off = (size_t)i * value_bytes(t);
    s += dot_values(q + i, (const char *)row + off, t, dim - i);
  }
  return t == RA_DTYPE_I8 ? s * ra_i8_row_scale(row, (size_t)dim) : s;
}

/* Four dots sharing one side, as dot_avx2 computes each (same accumulators, same order: equal
 * bit for bit), so that eight FMA chains are in flight instead of two and the shared side is
 * loaded once. Row r_j against query q_j; the caller passes the same pointer four times for the
 * shared one. dim % 16 == 0. */
RA_AVX2 static inline void dot4_avx2(const float *q0, const float *q1, const float *q2,
                                     const float *q3, const void *r0, const void *r1,
                                     const void *r2, const void *r3, ra_dtype t, int dim,
                                     float *out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (int i = 0; i < dim; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), load8(r0, t, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i + 8), load8(r0, t, i + 8), a1);
    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), load8(r1, t, i), b0);
    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i + 8), load8(r1, t, i + 8), b1);
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), load8(r2, t, i), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i + 8), load8(r2, t, i + 8), c1);
    d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), load8(r3, t, i), d0);
    d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i + 8), load8(r3, t, i + 8), d1);
  }
  hsum4(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1), _mm256_add_ps(c0, c1),
        _mm256_add_ps(d0, d1), out);
  if (t == RA_DTYPE_I8) {
    out[0] *= ra_i8_row_scale(r0, (size_t)dim);
    out[1] *= ra_i8_row_scale(r1, (size_t)dim);
    out[2] *= ra_i8_row_scale(r2, (size_t)dim);
    out[3] *= ra_i8_row_scale(r3, (size_t)dim);
  }
}

/* The dtype as a constant in each branch, so that load8's switch leaves the loop. */
RA_AVX2 static void dot4_any(const float *q0, const float *q1, const float *q2, const float *q3,
                             const void *r0, const void *r1, const void *r2, const void *r3,
                             ra_dtype t, int dim, float *out) {
#define CALL(DT) dot4_avx2(q0, q1, q2, q3, r0, r1, r2, r3, DT, dim, out)
  WITH_CONST_DTYPE(t, CALL)
#undef CALL
}

/* Four queries against one row: dot4_avx2 inlined with the row's pointer four times, so that its
 * loads and conversions are shared: an fp16 / bf16 row is widened once, not four times (the
 * conversions were the most sampled instructions of the occlusion test's dots; a 131K-key roar
 * build, build-bench on a 2-core EPYC: 4.95-5.36 -> 4.65-4.67 CPU-s, same graph). */
RA_AVX2 static void dot4_row(const float *q0, const float *q1, const float *q2, const float *q3,
                             const void *row, ra_dtype t, int dim, float *out) {
#define CALL(DT) dot4_avx2(q0, q1, q2, q3, row, row, row, row, DT, dim, out)
  WITH_CONST_DTYPE(t, CALL)
#undef CALL
}

RA_AVX2 static void axpy_avx2(float *acc, float w, const void *row, ra_dtype t, int dim) {
  w = row_weight(w, row, t, dim);
  __m256 vw = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, load8(row, t, i), _mm256_loadu_ps(acc + i)));
  if (i < dim) axpy_values(acc + i, w, (const char *)row + (size_t)i * value_bytes(t), t, dim - i);
}

/* Four queries against two rows: eight dots, one FMA chain each (eight chains cover an FMA's
 * latency times its throughput), each query's 8 values loaded once for both rows and each row's
 * widened once for all four queries. dim % 16 == 0; out: [4][2]. */
RA_AVX2 __attribute__((always_inline)) static inline void dot4x2(const float *q0, const float *q1,
                                                                  const float *q2, const float *q3,
                                                                  const void *ra, const void *rb,
                                                                  ra_dtype t, int dim, float *out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (int i = 0; i < dim; i += 8) {
    const __m256 x = load8(ra, t, i), y = load8(rb, t, i);
    const __m256 u0 = _mm256_loadu_ps(q0 + i), u1 = _mm256_loadu_ps(q1 + i);
    const __m256 u2 = _mm256_loadu_ps(q2 + i), u3 = _mm256_loadu_ps(q3 + i);
    a0 = _mm256_fmadd_ps(u0, x, a0);
    a1 = _mm256_fmadd_ps(u0, y, a1);
    b0 = _mm256_fmadd_ps(u1, x, b0);
    b1 = _mm256_fmadd_ps(u1, y, b1);
    c0 = _mm256_fmadd_ps(u2, x, c0);
    c1 = _mm256_fmadd_ps(u2, y, c1);
    d0 = _mm256_fmadd_ps(u3, x, d0);
    d1 = _mm256_fmadd_ps(u3, y, d1);
  }
  float s0[4], s1[4];
  hsum4(a0, b0, c0, d0, s0);
  hsum4(a1, b1, c1, d1, s1);
  const float fa = t == RA_DTYPE_I8 ? ra_i8_row_scale(ra, (size_t)dim) : 1.0f;
  const float fb = t == RA_DTYPE_I8 ? ra_i8_row_scale(rb, (size_t)dim) : 1.0f;
  for (int j = 0; j < 4; j++) {
    out[2 * j] = t == RA_DTYPE_I8 ? s0[j] * fa : s0[j];
    out[2 * j + 1] = t == RA_DTYPE_I8 ? s1[j] * fb : s1[j];
  }
}

/* scores[j * lds + r] = qs_j · rows[r] for the n_q queries qs [n_q, dim] and n rows at the
 * addresses rows[], four queries by two rows a pass (an odd last row and a short last group of
 * queries repeat one, their extra scores dropped); the dtype a constant in each branch. */
RA_AVX2 __attribute__((always_inline)) static inline void dot_queries_rows_dt(
    const float *qs, size_t n_q, const void *const *rows, size_t n, ra_dtype t, int dim, float *scores,
    size_t lds) {
  const size_t d = (size_t)dim;
  for (size_t j = 0; j < n_q; j += 4) {
    const size_t last = n_q - 1;
    const float *q0 = qs + j * d, *q1 = qs + (j + 1 < n_q ? j + 1 : last) * d;
    const float *q2 = qs + (j + 2 < n_q ? j + 2 : last) * d, *q3 = qs + (j + 3 < n_q ? j + 3 : last) * d;
    const size_t nj = n_q - j < 4 ? n_q - j : 4;
    for (size_t r = 0; r < n; r += 2) {
      const size_t r2 = r + 1 < n ? r + 1 : r;
      float out[8];
      dot4x2(q0, q1, q2, q3, rows[r], rows[r2], t, dim, out);
      for (size_t i = 0; i < nj; i++) {
        scores[(j + i) * lds + r] = out[2 * i];
        if (r2 != r) scores[(j + i) * lds + r2] = out[2 * i + 1];
      }
    }
  }
}

RA_AVX2 static void dot_queries_rows_avx2(const float *qs, size_t n_q, const void *const *rows, size_t n,
                                          ra_dtype t, int dim, float *scores, size_t lds) {
#define CALL(DT) dot_queries_rows_dt(qs, n_q, rows, n, DT, dim, scores, lds)
  WITH_CONST_DTYPE(t, CALL)
#undef CALL
}

/* Dims [d0, d0 + 16) of up to four accumulators o_j (j < nh, ldo apart) += w_j[r] * row r for
 * r < n: the 16 values of each row widened once for all nh outputs, the 2 nh sums in registers
 * across the rows. Per element, rows are added in order by one FMA each, as axpy_avx2 does. */
RA_AVX2 __attribute__((always_inline)) static inline void accumulate16(float *o, size_t ldo, int nh, const float *w, size_t ldw,
                                        const void *const *rows, size_t n, ra_dtype t, int dim,
                                        int d0) {
  __m256 a[4][2];
#pragma GCC unroll 4
  for (int j = 0; j < nh; j++) {
    a[j][0] = _mm256_loadu_ps(o + j * ldo + d0);
    a[j][1] = _mm256_loadu_ps(o + j * ldo + d0 + 8);
  }
  for (size_t r = 0; r < n; r++) {
    const __m256 x0 = load8(rows[r], t, d0), x1 = load8(rows[r], t, d0 + 8);
    const float s = t == RA_DTYPE_I8 ? ra_i8_row_scale(rows[r], (size_t)dim) : 1.0f;
#pragma GCC unroll 4
    for (int j = 0; j < nh; j++) {
      const __m256 wj = _mm256_set1_ps(t == RA_DTYPE_I8 ? w[j * ldw + r] * s : w[j * ldw + r]);
      a[j][0] = _mm256_fmadd_ps(wj, x0, a[j][0]);
      a[j][1] = _mm256_fmadd_ps(wj, x1, a[j][1]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < nh; j++) {
    _mm256_storeu_ps(o + j * ldo + d0, a[j][0]);
    _mm256_storeu_ps(o + j * ldo + d0 + 8, a[j][1]);
  }
}

/* accumulate16 over every 16 dims and groups of four outputs, nh and the dtype constants in
 * each branch so that the loops over heads unroll and load8's switch leaves the loop. */
RA_AVX2 __attribute__((always_inline)) static inline void accumulate_dt(float *o, size_t n_out, const float *w, size_t ldw,
                                         const void *const *rows, size_t n, ra_dtype t, int dim) {
  size_t j = 0;
  for (; j + 4 <= n_out; j += 4)
    for (int d = 0; d < dim; d += 16) accumulate16(o + j * dim, (size_t)dim, 4, w + j * ldw, ldw, rows, n, t, dim, d);
  for (; j + 2 <= n_out; j += 2)
    for (int d = 0; d < dim; d += 16) accumulate16(o + j * dim, (size_t)dim, 2, w + j * ldw, ldw, rows, n, t, dim, d);
  for (; j < n_out; j++)
    for (int d = 0; d < dim; d += 16) accumulate16(o + j * dim, (size_t)dim, 1, w + j * ldw, ldw, rows, n, t, dim, d);
}

RA_AVX2 static void accumulate_avx2(float *o, size_t n_out, const float *w, size_t ldw,
                                    const void *const *rows, size_t n, ra_dtype t, int dim) {
#define CALL(DT) accumulate_dt(o, n_out, w, ldw, rows, n, DT, dim)
  WITH_CONST_DTYPE(t, CALL)
#undef CALL
}

/* Columns [c0, c0 + 64) of x A: eight accumulators (an FMA's latency times its throughput), each
 * A row's 64 floats loaded once. */
RA_AVX2 static void vecmat64_avx2(const float *x, const float *A, int rows, int cols, int c0,
                                  float *out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int j = 0; j < rows; j++) {
    const float *r = A + (size_t)j * cols + c0;
    __m256 b = _mm256_set1_ps(x[j]);
    a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 8), a1);
    a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 16), a2);
    a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 24), a3);
    a4 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 32), a4);
    a5 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 40), a5);
    a6 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 48), a6);
    a7 = _mm256_fmadd_ps(b, _mm256_loadu_ps(r + 56), a7);
  }
  _mm256_storeu_ps(out + c0, a0);
  _mm256_storeu_ps(out + c0 + 8, a1);
  _mm256_storeu_ps(out + c0 + 16, a2);
  _mm256_storeu_ps(out + c0 + 24, a3);
  _mm256_storeu_ps(out + c0 + 32, a4);
  _mm256_storeu_ps(out + c0 + 40, a5);
  _mm256_storeu_ps(out + c0 + 48, a6);
  _mm256_storeu_ps(out + c0 + 56, a7);
}

/* Columns [c0, c0 + 8) of x A. */
RA_AVX2 static void vecmat8_avx2(const float *x, const float *A, int rows, int cols, int c0,
                                 float *out) {
  __m256 a = _mm256_setzero_ps();
  for (int j = 0; j < rows; j++)
    a = _mm256_fmadd_ps(_mm256_set1_ps(x[j]), _mm256_loadu_ps(A + (size_t)j * cols + c0), a);
  _mm256_storeu_ps(out + c0, a);
}

/* exp(x) for eight lanes (Cephes' expf): x = k ln2 + r with |r| <= ln2 / 2, ln2 split in two
 * so that the reduction is exact, e^r by a degree-5 polynomial, 2^k built in the exponent bits.
 * x is clamped to the range where 2^k is a normal float or zero. */
RA_AVX2 static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                             _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

RA_AVX2 static float exp_sum_avx2(float *x, size_t n, float shift) {
  __m256 vs = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum(acc);
  for (; i < n; i++) s += (x[i] = expf(x[i] - shift));
  return s;
}

/* The first of n 16-bit values whose exponent bits (mask) are all set, or n: 64 values a pass,
 * unaligned loads. The scalar scan ran at ~1 GB/s, 15 % of a store's PutKv time. */
RA_AVX2 static size_t first_nonfinite16_avx2(const unsigned char *x, size_t n, uint16_t mask) {
  const __m256i m = _mm256_set1_epi16((short)mask);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256i bad = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
      __m256i w = _mm256_loadu_si256((const __m256i *)(x + (i + 16 * (size_t)j) * 2));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(w, m), m));
    }
    if (!_mm256_testz_si256(bad, bad)) break;
  }
  for (; i < n; i++) {
    uint16_t w;
    memcpy(&w, x + i * 2, 2);
    if ((w & mask) == mask) return i;
  }
  return n;
}

#endif

/* max(mx, x[i..n)). */
static inline float max_from(const float *x, size_t i, size_t n, float mx) {
  for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

#ifdef RA_X86
RA_AVX2 static float max_avx2(const float *x, size_t n) {
  size_t i = 8;
  __m256 m = _mm256_loadu_ps(x);
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  return max_from(x, i, n, max_from(lanes, 1, 8, lanes[0]));
}
#endif

float ra_vec_max(const float *x, size_t n) {
#ifdef RA_X86
  if (has_avx2() && n >= 8) return max_avx2(x, n);
#endif
  return max_from(x, 1, n, x[0]);
}

float ra_vec_exp_sum(float *x, size_t n, float shift) {
#ifdef RA_X86
  if (has_avx2()) return exp_sum_avx2(x, n, shift);
#endif
  float s = 0.0f;
  for (size_t i = 0; i < n; i++) s += (x[i] = expf(x[i] - shift));
  return s;
}

/* Columns [c0, cols) of x A, one column at a time. */
static void vecmat_portable(const float *x, const float *A, int rows, int cols, int c0,
                            float *out) {
  for (int c = c0; c < cols; c++) {
    float s = 0.0f;
    for (int j = 0; j < rows; j++) s += x[j] * A[(size_t)j * cols + c];
    out[c] = s;
  }
}

void ra_vec_vecmat(const float *x, const float *A, int rows, int cols, float *out) {
  int c = 0;
#ifdef RA_X86
  if (has_avx2()) {
    for (; c + 64 <= cols; c += 64) vecmat64_avx2(x, A, rows, cols, c, out);
    for (; c + 8 <= cols; c += 8) vecmat8_avx2(x, A, rows, cols, c, out);
  }
#endif
  vecmat_portable(x, A, rows, cols, c, out);
}

const char *ra_vec_kernel_name(void) { return set_names[kernel_set()]; }

int ra_vec_use_kernels(const char *name) {
  for (int k = 0; k < VEC_SETS; k++)
    if (strcmp(name, set_names[k]) == 0) {
      if (k > best_set()) return RA_EUNSUPPORTED;
      atomic_store_explicit(&vec_set, k, memory_order_relaxed);
      return RA_OK;
    }
  return RA_EINVAL;
}

float ra_vec_dot(const float *q, const void *row, ra_dtype t, int dim) {
#ifdef RA_X86
  if (has_avx2()) return dot_avx2(q, row, t, dim);
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

void ra_vec_dot_rows4(const float *q, const void *rows, ra_dtype t, int dim, const uint32_t *ids,
                      size_t n, float *scores) {
#ifdef RA_X86
  if (has_avx2() && dim % 16 == 0) {
    size_t bytes = row_bytes(t, dim), i = 0;
    const char *base = rows;
    if (!ids) { /* contiguous rows: the hardware prefetcher follows them */
      for (; i + 4 <= n; i += 4)
        dot4_any(q, q, q, q, base + i * bytes, base + (i + 1) * bytes, base + (i + 2) * bytes,
                 base + (i + 3) * bytes, t, dim, scores + i);
      for (; i < n; i++) scores[i] = dot_avx2(q, base + i * bytes, t, dim);
      return;
    }
    for (size_t j = 0; j < n && j < RA_PREFETCH_AHEAD; j++) ra_vec_prefetch_row(rows, t, dim, ids[j]);
    for (; i + 4 <= n; i += 4) {
      for (size_t j = i + RA_PREFETCH_AHEAD; j < i + 4 + RA_PREFETCH_AHEAD && j < n; j++)
        ra_vec_prefetch_row(rows, t, dim, ids[j]);
      dot4_any(q, q, q, q, base + (size_t)ids[i] * bytes, base + (size_t)ids[i + 1] * bytes,
               base + (size_t)ids[i + 2] * bytes, base + (size_t)ids[i + 3] * bytes, t, dim,
               scores + i);
    }
    for (; i < n; i++) scores[i] = dot_avx2(q, base + (size_t)ids[i] * bytes, t, dim);
    return;
  }
#endif
  ra_vec_dot_rows(q, rows, t, dim, ids, n, scores);
}

void ra_vec_dot_queries(const float *qs, size_t n, const void *row, ra_dtype t, int dim,
                        float *scores) {
#ifdef RA_X86
  if (has_avx2() && dim % 16 == 0) {
    size_t i = 0, d = (size_t)dim;
    for (; i + 4 <= n; i += 4)
      dot4_row(qs + i * d, qs + (i + 1) * d, qs + (i + 2) * d, qs + (i + 3) * d, row, t, dim,
               scores + i);
    /* Two or three left: one four-dot call, the last vector repeated (its score computed
     * twice), not two or three single dots of two FMA chains each (those were 3.9 % of a
     * 131K-key roar build's samples, ~1 % so). */
    if (n - i >= 2) {
      float tail[4];
      const float *q2 = qs + (n - i > 2 ? i + 2 : i + 1) * d;
      dot4_row(qs + i * d, qs + (i + 1) * d, q2, q2, row, t, dim, tail);
      memcpy(scores + i, tail, (n - i) * sizeof *scores);
      return;
    }
    if (i < n) scores[i] = dot_avx2(qs + i * d, row, t, dim);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) scores[i] = ra_vec_dot(qs + i * (size_t)dim, row, t, dim);
}

void ra_vec_axpy(float *acc, float w, const void *row, ra_dtype t, int dim) {
#ifdef RA_X86
  if (has_avx2()) {
    axpy_avx2(acc, w, row, t, dim);
    return;
  }
#endif
  axpy_portable(acc, w, row, t, dim);
}

void ra_vec_dot_queries_rows(const float *qs, size_t n_q, const void *const *rows, size_t n, ra_dtype t,
                             int dim, float *scores, size_t lds) {
#ifdef RA_X86
  if (has_avx2() && dim % 16 == 0) {
    dot_queries_rows_avx2(qs, n_q, rows, n, t, dim, scores, lds);
    return;
  }
#endif
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < n_q; j++) scores[j * lds + r] = ra_vec_dot(qs + j * (size_t)dim, rows[r], t, dim);
}

void ra_vec_accumulate_rows(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                            size_t n, ra_dtype t, int dim) {
#ifdef RA_X86
  if (has_avx512() && dim % 16 == 0) {
    ra_vec_avx512_accumulate_rows(o, n_out, w, ldw, rows, n, t, dim);
    return;
  }
  if (has_avx2() && dim % 16 == 0) {
    accumulate_avx2(o, n_out, w, ldw, rows, n, t, dim);
    return;
  }
#endif
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < n_out; j++) ra_vec_axpy(o + j * (size_t)dim, w[j * ldw + r], rows[r], t, dim);
}

void ra_vec_queries_to_i16(const float *qs, size_t n, int dim, int16_t *q16, float *qscale) {
  const size_t D = (size_t)dim;
  for (size_t j = 0; j < n; j++) {
    const float *q = qs + j * D;
    int16_t *hi = q16 + 2 * j * D, *lo = hi + D;
    float mx = 0.0f;
    for (size_t d = 0; d < D; d++) mx = fabsf(q[d]) > mx ? fabsf(q[d]) : mx;
    const float inv = mx > 0.0f ? 32767.0f / mx : 0.0f;
    for (size_t d = 0; d < D; d++) {
      /* x - rint(x) is exact in fp32 (|x| <= 32767), so lo keeps the next 15 bits */
      const float x = q[d] * inv, h = rintf(x);
      const float hc = h > 32767.0f ? 32767.0f : h < -32767.0f ? -32767.0f : h;
      hi[d] = (int16_t)hc;
      lo[d] = (int16_t)lrintf((x - hc) * 32768.0f);
    }
    qscale[j] = mx / 32767.0f;
  }
}

void ra_vec_dot_queries_rows_i8(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                size_t n, int dim, float *scores, size_t lds) {
#ifdef RA_X86
  if (has_avx512() && dim % 32 == 0) {
    ra_vec_i8_dot_avx512(q16, qscale, n_q, rows, n, dim, scores, lds);
    return;
  }
  if (has_avx2() && dim % 16 == 0) {
    ra_vec_i8_dot_avx2(q16, qscale, n_q, rows, n, dim, scores, lds);
    return;
  }
#endif
  ra_vec_i8_dot_portable(q16, qscale, n_q, rows, n, dim, scores, lds);
}

/* One pass of OR-reduced exponent tests per 64-element block (vectorized: no branch inside);
 * a block that has one is searched for its first. Elements are read by memcpy: K/V come from
 * protobuf bytes fields, which have no alignment. */
#define FIRST_NONFINITE_(type, mask)                                        \
  do {                                                                      \
    const unsigned char *v = x;                                             \
    for (size_t b = 0; b < n; b += 64) {                                    \
      size_t e = n - b < 64 ? n : b + 64;                                   \
      type bad = 0, w;                                                      \
      for (size_t i = b; i < e; i++) {                                      \
        memcpy(&w, v + i * sizeof w, sizeof w);                             \
        bad |= (type)((w & mask) == mask);                                  \
      }                                                                     \
      for (size_t i = b; bad && i < e; i++) {                               \
        memcpy(&w, v + i * sizeof w, sizeof w);                             \
        if ((w & mask) == mask) return i;                                   \
      }                                                                     \
    }                                                                       \
    return n;                                                               \
  } while (0)

size_t ra_vec_first_nonfinite(const void *x, ra_dtype t, size_t n) {
#ifdef RA_X86
  if (has_avx2() && (t == RA_DTYPE_F16 || t == RA_DTYPE_BF16))
    return first_nonfinite16_avx2(x, n, t == RA_DTYPE_F16 ? 0x7c00u : 0x7f80u);
#endif
  switch (t) {
    case RA_DTYPE_F32: FIRST_NONFINITE_(uint32_t, 0x7f800000u);
    case RA_DTYPE_F16: FIRST_NONFINITE_(uint16_t, 0x7c00u);
    case RA_DTYPE_BF16: FIRST_NONFINITE_(uint16_t, 0x7f80u);
    case RA_DTYPE_I8: return n; /* int8 values are finite: their rows' scales are ra_dtype_rows_check's */
  }
  return 0;
}
