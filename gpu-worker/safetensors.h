/* safetensors reader: an 8-byte little-endian header length, a JSON header
 *   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__": {...}}
 * and the data section. The file is mapped; every tensor's byte range is checked against its
 * dtype and shape and the file size. */
#ifndef RA_SAFETENSORS_H
#define RA_SAFETENSORS_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define RA_ST_MAX_DIMS 4

typedef struct ra_st_tensor {
  char *name;
  uint32_t ggml_type; /* ra_ggml_type: F32, F16 or BF16 */
  int ndim;
  int64_t shape[RA_ST_MAX_DIMS];
  const uint8_t *data;
  size_t n_bytes;
} ra_st_tensor;

typedef struct ra_st_file {
  const uint8_t *base;
  size_t size;
  ra_st_tensor *tensors;
  size_t n_tensors;
} ra_st_file;

int ra_st_open(const char *path, ra_st_file *out, ra_error *err);
void ra_st_close(ra_st_file *f);
const ra_st_tensor *ra_st_find(const ra_st_file *f, const char *name);

#endif
