/* A growable byte buffer: messages on the wire, serialized protobufs. */
#ifndef RA_BUF_H
#define RA_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct ra_buf {
  uint8_t *data;
  size_t len;
  size_t cap;
} ra_buf;

/* Makes room for `cap` bytes (keeps contents); 0 or RA_ENOMEM. */
int ra_buf_reserve(ra_buf *b, size_t cap);
void ra_buf_free(ra_buf *b);

#endif
