/* The inner loops of attention and of every index: an fp32 query against stored key rows in
 * f32, f16, bf16 or int8, and value accumulation. AVX2 + FMA (+ F16C), and AVX-512 for
 * attention's strips, are picked once at run time, so one binary runs anywhere; other CPUs take
 * the portable path. Rows are row-major [n, dim], ra_dtype_row_bytes(t, dim) apart; an int8
 * row's values are widened int8 -> int32 -> fp32 and its scale applied once per row (to the dot,
 * or to the accumulation's weight), except in the int8 Q K^T below, which stays in integers. */
#ifndef RA_VEC_H
#define RA_VEC_H

#include "half.h"

#include <stddef.h>
#include <stdint.h>

/* q · row, where row is one row of `dim` values in dtype t. */
float ra_vec_dot(const float *q, const void *row, ra_dtype t, int dim);

/* scores[i] = q · rows[ids ? ids[i] : i] for i < n. Gathers prefetch rows a few ahead, since a
 * graph walk's rows are scattered and memory latency, not arithmetic, is the cost. */
void ra_vec_dot_rows(const float *q, const void *rows, ra_dtype t, int dim, const uint32_t *ids,
                     size_t n, float *scores);

/* As ra_vec_dot_rows (bit for bit the same scores), four rows at a time: eight independent FMA
 * chains instead of two and the query loaded once per four rows. For the index builds'
 * candidate ranking (kv-store/index/graph.c), whose rows are mostly cached, and a new key against
 * roar's kept queries (ids NULL). */
void ra_vec_dot_rows4(const float *q, const void *rows, ra_dtype t, int dim, const uint32_t *ids,
                      size_t n, float *scores);

/* scores[i] = qs[i] · row for the n fp32 vectors qs [n, dim]: one row against several vectors,
 * each score bit for bit ra_vec_dot's, the row loaded once per four. */
void ra_vec_dot_queries(const float *qs, size_t n, const void *row, ra_dtype t, int dim,
                        float *scores);

/* out[0..cols) = x[0..rows) A for the fp32 matrix A [rows, cols] (row-major), i.e. A^T x, which
 * is A x for a symmetric A: the rows of A are streamed once, scaled by x and summed, in eight
 * independent accumulator chains. out must not alias x or A. */
void ra_vec_vecmat(const float *x, const float *A, int rows, int cols, float *out);

/* acc[0..dim) += w * row. */
void ra_vec_axpy(float *acc, float w, const void *row, ra_dtype t, int dim);

/* scores[j * lds + r] = qs[j] · rows[r] for the n_q fp32 queries qs [n_q, dim] and n rows at
 * the addresses rows[]: attention's Q K^T over a strip of rows, each row widened once per four
 * queries and each query loaded once per two rows. Within rounding of ra_vec_dot (one FMA
 * chain per score where ra_vec_dot has two). */
void ra_vec_dot_queries_rows(const float *qs, size_t n_q, const void *const *rows, size_t n, ra_dtype t,
                             int dim, float *scores, size_t lds);

/* o[j] += sum over r < n of w[j * ldw + r] * rows[r], for the n_out fp32 accumulators o
 * [n_out, dim] and n value rows at the addresses rows[]: attention's P V over a strip of rows.
 * Each row is widened once for all outputs and the sums stay in registers across the rows;
 * per element the rows are added in order, bit for bit n x n_out ra_vec_axpy calls. */
void ra_vec_accumulate_rows(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                            size_t n, ra_dtype t, int dim);

/* Q K^T over int8 rows in integer arithmetic (attention's strips over `--store-dtype int8`
 * rows): each query rounded once to two int16 halves, every int16 x int8 product summed exactly
 * in int32 (AVX-512 VNNI's vpdpwssd, AVX2's vpmaddwd) and the scales applied once per dot, so
 * that an int8 value is widened to 16 bits once per row, not to fp32 once per query; every
 * kernel set gives the same bits. dim <= RA_VEC_I8_MAX_DIM keeps the sums below 2^31. */
#define RA_VEC_I8_MAX_DIM 512

/* q16 [n, 2, dim] and qscale [n]: each query of qs [n, dim] as (hi + lo / 2^15) * qscale, hi
 * rounded against the query's largest magnitude (qscale = max|q| / 32767, 0 for an all-zero
 * query) and lo the next 15 bits: each value within fp32's rounding (2^-23) of the largest.
 * qs finite. */
void ra_vec_queries_to_i16(const float *qs, size_t n, int dim, int16_t *q16, float *qscale);

/* scores[j * lds + r] = ((float)S_hi + (float)S_lo / 2^15) * qscale[j] * scale_r for the n_q
 * queries of ra_vec_queries_to_i16 and n int8 rows at the addresses rows[] (S_hi, S_lo: the
 * exact sums of query j's halves times the row's values; scale_r: the row's). Within fp32
 * rounding of the exact dots, as ra_vec_dot_queries_rows. */
void ra_vec_dot_queries_rows_i8(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                size_t n, int dim, float *scores, size_t lds);

/* The largest of x[0..n), n >= 1, x finite: a strip's logits' maximum, eight lanes at a time
 * (the scalar chain was a quarter of the strip's bookkeeping). */
float ra_vec_max(const float *x, size_t n);

/* x[i] = exp(x[i] - shift) for i < n, returning their sum: the softmax weights of a strip of
 * logits in one pass. Within 2 ulp of expf; an argument below about -87.3 gives 0 (AVX2: a
 * degree-5 polynomial after reduction by ln 2, eight lanes at a time). */
float ra_vec_exp_sum(float *x, size_t n, float shift);

/* The index of the first element of x ([n], dtype t) that is NaN or infinite, or n when all are
 * finite: what a store checks before it keeps K/V (one NaN key empties a full-mode partial).
 * Reads the bit patterns (all-ones exponent), in blocks the compiler vectorizes. */
size_t ra_vec_first_nonfinite(const void *x, ra_dtype t, size_t n);

/* Issues a prefetch of one row (all its cache lines). */
void ra_vec_prefetch_row(const void *rows, ra_dtype t, int dim, uint32_t id);

/* Name of the kernel set in use ("avx512", "avx2" or "portable"), for benchmark reports. The
 * AVX-512 set has its own attention strip kernels (ra_vec_dot_queries_rows,
 * ra_vec_accumulate_rows) and takes the AVX2 ones elsewhere. */
const char *ra_vec_kernel_name(void);

/* Uses the kernel set `name` from now on instead of the best this CPU has: for tests of every
 * set and benchmarks of one against another. Call it before other threads use the kernels.
 * RA_OK, RA_EUNSUPPORTED (the CPU lacks it) or RA_EINVAL (no such set). */
int ra_vec_use_kernels(const char *name);

#endif
