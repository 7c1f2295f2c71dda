/* Whole text files read into memory: config files, shard maps, prompts. */
#ifndef RA_TEXTFILE_H
#define RA_TEXTFILE_H

#include "status.h"

#include <stddef.h>

/* Reads the file at `path` into a NUL-terminated *text (the caller frees it) of *len bytes (len
 * may be NULL). RA_EIO when it cannot be opened or read, RA_EINVAL when larger than `max` bytes
 * or holding a NUL byte, RA_ENOMEM; the messages name the file. *text is NULL on failure. */
int ra_textfile_read(const char *path, size_t max, char **text, size_t *len, ra_error *err);

#endif
