#include "qkdump.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ra_qk_path(char *out, size_t cap, const char *dir, const char *what, int layer, int head) {
  snprintf(out, cap, "%s/%s_L%d_H%d.npy", dir, what, layer, head);
}

/* The value text after "key": in a flat JSON object (enough for meta.json), or NULL. */
static const char *find_value(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *p = strstr(json, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

static int get_int(const char *json, const char *key, long long lo, long long hi, long long *v,
                   ra_error *err) {
  const char *p = find_value(json, key);
  char *end;
  if (!p) return ra_errorf(err, RA_EFORMAT, "meta.json: missing \"%s\"", key);
  errno = 0;
  long long x = strtoll(p, &end, 10);
  if (end == p || errno || x < lo || x > hi)
    return ra_errorf(err, RA_EFORMAT, "meta.json: \"%s\" is not an integer in [%lld, %lld]", key,
                     lo, hi);
  *v = x;
  return RA_OK;
}

int ra_qk_meta_read(const char *dir, ra_qk_meta *m, ra_error *err) {
  char path[4096];
  memset(m, 0, sizeof *m);
  snprintf(path, sizeof path, "%s/meta.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, RA_ENOTFOUND, "%s: %s", path, strerror(errno));
  char *buf = malloc(65537);
  if (!buf) {
    fclose(f);
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
  size_t n = fread(buf, 1, 65536, f);
  fclose(f);
  buf[n] = '\0';
  long long v[6];
  static const char *const keys[] = {"layers", "q_heads", "kv_heads", "head_dim", "n_tokens"};
  int rc = RA_OK;
  for (int i = 0; i < 5 && !rc; i++) rc = get_int(buf, keys[i], 1, 1LL << 31, &v[i], err);
  if (!rc && find_value(buf, "n_decode")) rc = get_int(buf, "n_decode", 0, 1LL << 31, &v[5], err);
  else v[5] = 0;
  /* gpu-worker dump-qk also writes the prompt / decode split: there n_tokens counts both (the
   * keys' rows), while q holds the prompt only. */
  if (!rc && find_value(buf, "n_prompt_tokens")) {
    rc = get_int(buf, "n_prompt_tokens", 1, 1LL << 31, &v[4], err);
    if (!rc) rc = get_int(buf, "n_decode_tokens", 0, 1LL << 31, &v[5], err);
  }
  if (!rc) {
    m->layers = (int)v[0];
    m->q_heads = (int)v[1];
    m->kv_heads = (int)v[2];
    m->head_dim = (int)v[3];
    m->n_tokens = (uint32_t)v[4];
    m->n_decode = (uint32_t)v[5];
    if (m->q_heads % m->kv_heads)
      rc = ra_errorf(err, RA_EFORMAT, "meta.json: q_heads %d not a multiple of kv_heads %d",
                     m->q_heads, m->kv_heads);
  }
  const char *p = find_value(buf, "rope_applied");
  m->rope_applied = p && strncmp(p, "true", 4) == 0;
  p = find_value(buf, "model");
  if (p && *p == '"') {
    size_t i = 0;
    for (p++; *p && *p != '"' && i + 1 < sizeof m->model; p++) m->model[i++] = *p;
    m->model[i] = '\0';
  }
  free(buf);
  if (rc) ra_error_wrap(err, "%s", dir);
  return rc;
}

int ra_qk_meta_write(const char *dir, const ra_qk_meta *m, const char *dtype_name,
                     const char *extra, ra_error *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return ra_errorf(err, RA_EIO, "%s: %s", path, strerror(errno));
  fprintf(f,
          "{\n  \"model\": \"%s\",\n  \"layers\": %d,\n  \"q_heads\": %d,\n  \"kv_heads\": %d,\n"
          "  \"head_dim\": %d,\n  \"n_tokens\": %u,\n  \"n_decode\": %u,\n  \"rope_applied\": %s,\n"
          "  \"dtype\": \"%s\"%s%s\n}\n",
          m->model, m->layers, m->q_heads, m->kv_heads, m->head_dim, m->n_tokens, m->n_decode,
          m->rope_applied ? "true" : "false", dtype_name, extra ? ",\n  " : "", extra ? extra : "");
  if (fclose(f) != 0) return ra_errorf(err, RA_EIO, "%s: write failed", path);
  return RA_OK;
}
