/* NumPy .npy files (format 1.0 and 2.0) for the Q/K dumps: 2-D, C-order, little-endian float16
 * ('<f2') or float32 ('<f4') only. Strict: anything else (other dtypes, Fortran order, other
 * ranks, a header over 64 KiB, a data size that does not match the shape exactly) is refused with
 * a message saying what and where, never guessed at. */
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
  void *data; /* rows * cols elements, row-major */
} ra_npy;

/* Parses the preamble + header at the start of a file held in buf[len] (len may exceed the
 * header). On success: dtype, shape and *data_offset (bytes before the array data).
 * RA_EFORMAT (malformed, truncated), RA_EUNSUPPORTED (valid .npy we do not read). */
int ra_npy_parse_header(const void *buf, size_t len, ra_dtype *dtype, uint64_t *rows,
                        uint64_t *cols, size_t *data_offset, ra_error *err);

/* Reads a whole file; out->data is malloc'ed (free with ra_npy_free). Also RA_EIO, RA_ENOMEM. */
int ra_npy_read(const char *path, ra_npy *out, ra_error *err);

/* Writes data [rows, cols] of dtype (F16 or F32) as a format 1.0 .npy file, header padded to 64.
 * RA_EINVAL, RA_EIO (the file is removed on a failed write). */
int ra_npy_write(const char *path, ra_dtype dtype, uint64_t rows, uint64_t cols, const void *data,
                 ra_error *err);

void ra_npy_free(ra_npy *a);

#endif
