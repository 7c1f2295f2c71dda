/* NumPy .npy files (format 1.0 written; 1.0/2.0/3.0 read), float32 or float16, C order.
 *
 * Self-contained apart from common/status.h and common/half.h, so other modules (the index
 * benchmark reading Q/K dumps) can use it as is. The layout of a file:
 *   "\x93NUMPY" | major u8 | minor u8 | header_len (u16 for 1.0, u32 for 2.0+) |
 *   header: a Python dict literal  {'descr': '<f4', 'fortran_order': False, 'shape': (R, C), }
 *   padded with spaces and a final '\n' so the data starts at a multiple of 64 bytes |
 *   data: R*C little-endian values, row-major.
 *
 * Writing (streaming, so a dump never holds a whole matrix):
 *     ra_npy_writer *w;
 *     ra_npy_writer_open("q_L0_H0.npy", RA_DTYPE_F16, n_rows, n_cols, &w, &err);
 *     ra_npy_writer_append(w, rows_f32, k, &err);   // any number of times, k rows each
 *     ra_npy_writer_close(w, &err);                 // fails if fewer than n_rows were appended
 * Reading:
 *     ra_npy_array a;
 *     ra_npy_read_f32("k_L0_H0.npy", &a, &err);     // a.data: [a.shape[0] * ... ] floats
 *     ra_npy_array_free(&a); */
#ifndef RA_NPY_H
#define RA_NPY_H

#include "half.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_NPY_MAX_DIMS 4

typedef struct ra_npy_writer ra_npy_writer;

/* Creates a 2-D file [n_rows, n_cols] of dtype f32 or f16 (bf16 has no NumPy dtype). */
int ra_npy_writer_open(const char *path, ra_dtype dtype, uint64_t n_rows, uint64_t n_cols,
                       ra_npy_writer **out, ra_error *err);
/* Appends k rows given as fp32 (converted to the file's dtype). */
int ra_npy_writer_append(ra_npy_writer *w, const float *rows, uint64_t k, ra_error *err);
/* Closes the file; RA_ESTATE when the rows appended differ from n_rows. Frees w either way. */
int ra_npy_writer_close(ra_npy_writer *w, ra_error *err);

/* Writes a whole array of fp32 values with the given shape (1..4 dims) as dtype. */
int ra_npy_write_f32(const char *path, ra_dtype dtype, int ndim, const uint64_t *shape,
                     const float *data, ra_error *err);

typedef struct ra_npy_array {
  int ndim;
  uint64_t shape[RA_NPY_MAX_DIMS];
  ra_dtype file_dtype; /* what the file stored */
  float *data;         /* converted to fp32, C order */
  size_t n;            /* number of values */
} ra_npy_array;

/* Reads a little-endian '<f4' or '<f2' C-order array; RA_EFORMAT for anything else or a file
 * whose size does not match its header. */
int ra_npy_read_f32(const char *path, ra_npy_array *out, ra_error *err);
void ra_npy_array_free(ra_npy_array *a);

#endif
