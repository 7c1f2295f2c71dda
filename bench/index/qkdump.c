#include "qkdump.h"

#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ra_qk_path(char *out, size_t cap, const char *dir, const char *what, int layer, int head) {
  snprintf(out, cap, "%s/%s_L%d_H%d.npy", dir, what, layer, head);
}

/* An integer field of meta.json within [lo, hi]; RA_ENOTFOUND when absent (for optional ones). */
static int get_int(const ra_json *meta, const char *key, double lo, double hi, uint32_t *v, ra_error *err) {
  double x;
  if (!ra_json_get(meta, key)) return ra_errorf(err, RA_ENOTFOUND, "meta.json: missing \"%s\"", key);
  if (ra_json_get_num(meta, key, &x) != RA_OK || x != (double)(int64_t)x || x < lo || x > hi)
    return ra_errorf(err, RA_EFORMAT, "meta.json: \"%s\" is not an integer in [%.0f, %.0f]", key, lo, hi);
  *v = (uint32_t)x;
  return RA_OK;
}

int ra_qk_meta_read(const char *dir, ra_qk_meta *m, ra_error *err) {
  char path[4096];
  memset(m, 0, sizeof *m);
  snprintf(path, sizeof path, "%s/meta.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, RA_ENOTFOUND, "%s: %s", path, strerror(errno));
  char *buf = malloc(1u << 20);
  if (!buf) {
    fclose(f);
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
  size_t n = fread(buf, 1, 1u << 20, f);
  fclose(f);
  ra_json *meta = NULL;
  int rc = n == 1u << 20 ? ra_errorf(err, RA_EFORMAT, "meta.json: larger than 1 MiB") : ra_json_parse(buf, n, &meta, err);
  free(buf);
  uint32_t v[4];
  static const char *const keys[] = {"layers", "q_heads", "kv_heads", "head_dim"};
  for (int i = 0; i < 4 && rc == RA_OK; i++) rc = get_int(meta, keys[i], 1, 1 << 20, &v[i], err);
  /* gpu-worker dump-qk writes the prompt / decode split (n_tokens then counts both: the keys'
   * rows, while q holds the prompt only); qk-synth writes n_tokens and n_decode. */
  if (rc == RA_OK && ra_json_get(meta, "n_prompt_tokens")) {
    rc = get_int(meta, "n_prompt_tokens", 1, 4294967295.0, &m->n_tokens, err);
    if (rc == RA_OK) rc = get_int(meta, "n_decode_tokens", 0, 4294967295.0, &m->n_decode, err);
  } else if (rc == RA_OK) {
    rc = get_int(meta, "n_tokens", 1, 4294967295.0, &m->n_tokens, err);
    if (rc == RA_OK && ra_json_get(meta, "n_decode")) rc = get_int(meta, "n_decode", 0, 4294967295.0, &m->n_decode, err);
  }
  if (rc == RA_OK) {
    m->layers = (int)v[0];
    m->q_heads = (int)v[1];
    m->kv_heads = (int)v[2];
    m->head_dim = (int)v[3];
    if (m->q_heads % m->kv_heads)
      rc = ra_errorf(err, RA_EFORMAT, "meta.json: q_heads %d not a multiple of kv_heads %d", m->q_heads,
                     m->kv_heads);
  }
  const char *model = NULL;
  if (rc == RA_OK) {
    ra_json_get_bool(meta, "rope_applied", &m->rope_applied);
    if (ra_json_get_str(meta, "model", &model) == RA_OK) snprintf(m->model, sizeof m->model, "%s", model);
  }
  ra_json_free(meta);
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

int ra_qk_read_f32(const char *dir, const char *what, int layer, int head, int dim, uint64_t rows_min,
                   ra_npy *out, ra_error *err) {
  char path[4096];
  ra_qk_path(path, sizeof path, dir, what, layer, head);
  int rc = ra_npy_read_f32(path, out, err);
  if (rc) return rc;
  if (out->cols != (uint64_t)dim || out->rows < rows_min) {
    rc = ra_errorf(err, RA_EFORMAT, "%s: shape (%llu, %llu), expected (>= %llu, %d)", path,
                   (unsigned long long)out->rows, (unsigned long long)out->cols,
                   (unsigned long long)rows_min, dim);
    ra_npy_free(out);
  }
  return rc;
}
