/* Attention's strips over int8 rows in integer arithmetic, one implementation per kernel set
 * (portable, AVX2, AVX-512 with VNNI), all giving the same bits. Called by vec.c only, which
 * picks the set; the contract is ra_vec_dot_queries_rows_i8's and ra_vec_accumulate_rows_i8's
 * in vec.h. */
#ifndef RA_VEC_I8_H
#define RA_VEC_I8_H

#include <stddef.h>
#include <stdint.h>

typedef void (*ra_vec_i8_dot_fn)(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows,
                                 size_t n, int dim, float *scores, size_t lds);
typedef void (*ra_vec_i8_accumulate_fn)(float *o, size_t n_out, const float *w, size_t ldw,
                                        const void *const *rows, size_t n, int dim);

void ra_vec_i8_dot_portable(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                            int dim, float *scores, size_t lds);
void ra_vec_i8_accumulate_portable(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                   size_t n, int dim);
/* dim % 16 == 0 */
void ra_vec_i8_dot_avx2(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                        int dim, float *scores, size_t lds);
void ra_vec_i8_accumulate_avx2(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                               size_t n, int dim);
/* dim % 32 == 0 */
void ra_vec_i8_dot_avx512(const int16_t *q16, const float *qscale, size_t n_q, const void *const *rows, size_t n,
                          int dim, float *scores, size_t lds);
void ra_vec_i8_accumulate_avx512(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                 size_t n, int dim);

#endif
