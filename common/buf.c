#include "buf.h"

#include "status.h"

#include <stdlib.h>

int ra_buf_reserve(ra_buf *b, size_t cap) {
  if (cap <= b->cap) return RA_OK;
  size_t want = b->cap ? b->cap : 256;
  while (want < cap) want *= 2;
  uint8_t *d = realloc(b->data, want);
  if (!d) return RA_ENOMEM;
  b->data = d;
  b->cap = want;
  return RA_OK;
}

void ra_buf_free(ra_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}
