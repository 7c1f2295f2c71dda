/* NumPy .npy files (format 1.0 and 2.0) for the Q/K dumps and logits: 2-D, C-order,
 * little-endian float16 ('<f2') or float32 ('<f4') only. Strict: anything else (other dtypes,
 * Fortran order, other ranks, a header over 64 KiB, a data size that does not match the shape
 * exactly) is refused with a message saying what and where, never guessed at.
 *
 * Writing streams rows, so a dump never holds a whole matrix:
 *     ra_npy_writer *w;
 *     ra_npy_writer_open("q_L0_H0.npy", RA_DTYPE_F16, n_rows, n_cols, &w, &err);
 *     ra_npy_writer_append(w, rows_f32, k, &err);   // any number of times, k rows each
 *     ra_npy_writer_close(w, &err);                 // fails if fewer than n_rows were appended
 * Reading keeps the stored dtype (ra_npy_read: the index benchmark keeps f16 keys as f16) or
 * converts to fp32 (ra_npy_read_f32). Files are written as format 1.0, the header padded with
 * spaces and a '\n' so the data starts at a multiple of 64 bytes, as numpy writes them. */
#ifndef RA_NPY_H
#define RA_NPY_H

#include "half.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_NPY_MAX_HEADER 65536u

typedef struct ra_npy {
  ra_dtype dtype; /* RA_DTYPE_F16 or RA_DTYPE_F32 */
  uint64_t rows, cols;
  void *data; /* rows * cols elements of dtype, row-major */
} ra_npy;

/* Parses the preamble + header at the start of a file held in buf[len] (len may exceed the
 * header). On success: dtype, shape and *data_offset (bytes before the array data).
 * RA_EFORMAT (malformed, truncated), RA_EUNSUPPORTED (valid .npy we do not read). */
int ra_npy_parse_header(const void *buf, size_t len, ra_dtype *dtype, uint64_t *rows,
                        uint64_t *cols, size_t *data_offset, ra_error *err);

/* Reads a whole file as stored; out->data is malloc'ed (free with ra_npy_free) and NULL on
 * failure. Also RA_ENOTFOUND, RA_EIO, RA_ENOMEM. */
int ra_npy_read(const char *path, ra_npy *out, ra_error *err);

/* As ra_npy_read, then converted: out->dtype is RA_DTYPE_F32 and out->data holds floats. */
int ra_npy_read_f32(const char *path, ra_npy *out, ra_error *err);

void ra_npy_free(ra_npy *a);

typedef struct ra_npy_writer ra_npy_writer;

/* Creates a file [n_rows, n_cols] of dtype F32 or F16 (bf16 has no NumPy dtype): RA_EINVAL for
 * another dtype or n_cols outside [1, 2^24], RA_EIO, RA_ENOMEM. */
int ra_npy_writer_open(const char *path, ra_dtype dtype, uint64_t n_rows, uint64_t n_cols,
                       ra_npy_writer **out, ra_error *err);
/* Appends k rows given as fp32 (converted to the file's dtype); RA_ESTATE past n_rows. */
int ra_npy_writer_append(ra_npy_writer *w, const float *rows, uint64_t k, ra_error *err);
/* Closes the file; RA_ESTATE when the rows appended differ from n_rows (the file stays, and
 * reads as truncated). Frees w either way. */
int ra_npy_writer_close(ra_npy_writer *w, ra_error *err);

/* Writes a whole [rows, cols] fp32 matrix as dtype; the file is removed on failure. */
int ra_npy_write_f32(const char *path, ra_dtype dtype, uint64_t rows, uint64_t cols,
                     const float *data, ra_error *err);

#endif
