/* fp16 (IEEE binary16) and bf16 <-> fp32 conversion, scalar and bulk.
 * Bulk conversions use F16C/AVX2 when the CPU has them (checked once at run time), so the same
 * binary runs on any x86-64 and on other architectures through the portable path. */
#ifndef RA_HALF_H
#define RA_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t ra_fp16;
typedef uint16_t ra_bf16;

/* Storage dtypes of KV, numbered as in proto/kvstore.proto's DType. f32, f16 and bf16 are
 * element dtypes (tensors, caches, rows); int8 is a row dtype only (the stores' KV): a row of
 * `dim` values is `dim` int8 q followed by one fp32 scale, value = q * scale, scale = max|x| / 127
 * (symmetric, per row). */
typedef enum { RA_DTYPE_F32 = 0, RA_DTYPE_F16 = 1, RA_DTYPE_BF16 = 2, RA_DTYPE_I8 = 3 } ra_dtype;

/* Bytes per element of an element dtype; 0 for int8 (its rows carry a scale: use
 * ra_dtype_row_bytes) and for an unknown dtype. */
size_t ra_dtype_size(ra_dtype t);
/* Bytes of one row of `dim` values in dtype t (what every stride over KV rows uses); 0 for an
 * unknown dtype. */
size_t ra_dtype_row_bytes(ra_dtype t, size_t dim);
const char *ra_dtype_name(ra_dtype t);
int ra_dtype_parse(const char *name, ra_dtype *out); /* "f32"|"f16"|"bf16"|"int8"; 0 or RA_EINVAL */

/* The scale of an int8 row of `dim` values (stored after them, unaligned). */
static inline float ra_i8_row_scale(const void *row, size_t dim) {
  float s;
  memcpy(&s, (const char *)row + dim, sizeof s);
  return s;
}

float ra_fp16_to_fp32(ra_fp16 h);
ra_fp16 ra_fp32_to_fp16(float f);  /* round to nearest even; overflow -> inf; NaN kept */
float ra_bf16_to_fp32(ra_bf16 h);
ra_bf16 ra_fp32_to_bf16(float f);  /* round to nearest even; NaN kept */

void ra_fp16_to_fp32_n(const ra_fp16 *src, float *dst, size_t n);
void ra_fp32_to_fp16_n(const float *src, ra_fp16 *dst, size_t n);
void ra_bf16_to_fp32_n(const ra_bf16 *src, float *dst, size_t n);
void ra_fp32_to_bf16_n(const float *src, ra_bf16 *dst, size_t n);

/* Converts n elements of `src` in element dtype `t` to fp32 / from fp32. int8 has no elements
 * without their row: to_fp32 gives NaN there and from_fp32 writes nothing (ra_dtype_rows_*). */
void ra_dtype_to_fp32_n(ra_dtype t, const void *src, float *dst, size_t n);
void ra_dtype_from_fp32_n(ra_dtype t, const float *src, void *dst, size_t n);

/* Rows: src / dst are n_rows rows of `dim` values, ra_dtype_row_bytes(t, dim) bytes each in dtype
 * t, fp32 [n_rows, dim] on the other side. from_fp32 quantizes int8 rows (round to nearest even
 * of x * 127 / max|x|); a row with a non-finite value has no int8 form: it returns RA_EINVAL with
 * that row's index in *bad_row (rows before it are written) rather than a silently wrong row. The
 * element dtypes keep inf / NaN as their conversions do. */
void ra_dtype_rows_to_fp32(ra_dtype t, const void *src, float *dst, size_t n_rows, size_t dim);
int ra_dtype_rows_from_fp32(ra_dtype t, const float *src, void *dst, size_t n_rows, size_t dim,
                            size_t *bad_row);
/* Checks rows received in dtype t: every int8 scale finite and >= 0 (else RA_EINVAL, *bad_row its
 * index). Element dtypes have no invalid bit pattern: always RA_OK. */
int ra_dtype_rows_check(ra_dtype t, const void *rows, size_t n_rows, size_t dim, size_t *bad_row);

#endif
