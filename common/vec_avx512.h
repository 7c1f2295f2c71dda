/* Attention's P V over a strip in AVX-512 (F, BW, DQ, VL): 32 registers of 16 lanes hold four
 * outputs by 64 dims, so that each weight is broadcast once per row and pass where AVX2 takes
 * eight passes of 16 dims. Q K^T stays AVX2's: four queries by four rows in zmm registers ran
 * 1.16x slower on a Zen 4 core (double-pumped 512-bit FMAs; the 16 sums' reduction), see
 * bench/results/wave-scan/. Called by vec.c only, once it has checked the CPU. */
#ifndef RA_VEC_AVX512_H
#define RA_VEC_AVX512_H

#include "half.h"

#include <stddef.h>

/* ra_vec_accumulate_rows, bit for bit; dim % 16 == 0. */
void ra_vec_avx512_accumulate_rows(float *o, size_t n_out, const float *w, size_t ldw, const void *const *rows,
                                   size_t n, ra_dtype t, int dim);

#endif
