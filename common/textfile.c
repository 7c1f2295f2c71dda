#include "textfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ra_textfile_read(const char *path, size_t max, char **text, size_t *len, ra_error *err) {
  *text = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, RA_EIO, "cannot open %s: %s", path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  int rc = RA_OK;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *b = realloc(buf, cap);
      if (!b) {
        rc = ra_errorf(err, RA_ENOMEM, "%s: out of memory", path);
        break;
      }
      buf = b;
    }
    size_t got = fread(buf + n, 1, 4096, f);
    n += got;
    if (n > max) {
      rc = ra_errorf(err, RA_EINVAL, "%s: larger than %zu bytes", path, max);
      break;
    }
    if (got < 4096) break;
  }
  if (rc == RA_OK && ferror(f)) rc = ra_errorf(err, RA_EIO, "%s: read error", path);
  fclose(f);
  if (rc == RA_OK) {
    buf[n] = '\0';
    if (strlen(buf) != n) rc = ra_errorf(err, RA_EINVAL, "%s: contains NUL bytes", path);
  }
  if (rc != RA_OK) {
    free(buf);
    return rc;
  }
  *text = buf;
  if (len) *len = n;
  return RA_OK;
}
