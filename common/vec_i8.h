/* Attention's Q K^T over int8 rows in integer arithmetic, one implementation per kernel set
 * (portable, AVX2, AVX-512 with VNNI), all giving the same bits. Called by vec.c only, which
 * picks the set; the contract is ra_vec_dot_queries_rows_i8's in vec.h. */
#ifndef RA_VEC_I8_H
#define RA_VEC_I8_H

#include <stddef.h>
#include <stdint.h>

void ra_vec_i8_dot_portable(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                            int dim, float *scores, size_t lds);
/* dim % 16 == 0 */
void ra_vec_i8_dot_avx2(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                        int dim, float *scores, size_t lds);
/* dim % 32 == 0 */
void ra_vec_i8_dot_avx512(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                          size_t n, int dim, float *scores, size_t lds);

#endif
