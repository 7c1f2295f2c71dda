/* fp16 (IEEE binary16) and bf16 <-> fp32 conversion, scalar and bulk.
 * Bulk conversions use F16C/AVX2 when the CPU has them (checked once at run time), so the same
 * binary runs on any x86-64 and on other architectures through the portable path. */
#ifndef RA_HALF_H
#define RA_HALF_H

#include <stddef.h>
#include <stdint.h>

typedef uint16_t ra_fp16;
typedef uint16_t ra_bf16;

/* Storage dtypes of KV, numbered as in proto/kvstore.proto's DType. */
typedef enum { RA_DTYPE_F32 = 0, RA_DTYPE_F16 = 1, RA_DTYPE_BF16 = 2 } ra_dtype;

size_t ra_dtype_size(ra_dtype t);   /* bytes per element; 0 for an unknown dtype */
const char *ra_dtype_name(ra_dtype t);
int ra_dtype_parse(const char *name, ra_dtype *out); /* "f32"|"f16"|"bf16"; 0 or RA_EINVAL */

float ra_fp16_to_fp32(ra_fp16 h);
ra_fp16 ra_fp32_to_fp16(float f);  /* round to nearest even; overflow -> inf; NaN kept */
float ra_bf16_to_fp32(ra_bf16 h);
ra_bf16 ra_fp32_to_bf16(float f);  /* round to nearest even; NaN kept */

void ra_fp16_to_fp32_n(const ra_fp16 *src, float *dst, size_t n);
void ra_fp32_to_fp16_n(const float *src, ra_fp16 *dst, size_t n);
void ra_bf16_to_fp32_n(const ra_bf16 *src, float *dst, size_t n);
void ra_fp32_to_bf16_n(const float *src, ra_bf16 *dst, size_t n);

/* Converts n elements of `src` in dtype `t` to fp32 / from fp32. */
void ra_dtype_to_fp32_n(ra_dtype t, const void *src, float *dst, size_t n);
void ra_dtype_from_fp32_n(ra_dtype t, const float *src, void *dst, size_t n);

#endif
