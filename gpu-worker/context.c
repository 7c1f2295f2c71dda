#include "context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static const char MAGIC[8] = "RACTX01";
#define ADDR_BYTES 128

/* The header's u32 fields in file order (ra_context from n_layers to n_stores). */
#define N_U32 13

static uint32_t *header_u32(ra_context *c, int i) {
  uint32_t *f[N_U32] = {&c->n_layers, &c->n_q_heads, &c->n_kv_heads, &c->head_dim, &c->vocab,
                        &c->mode, &c->n_sink, &c->n_window, &c->kv_dtype, &c->store_dtype,
                        &c->top_k, &c->ring_rows, &c->n_stores};
  return f[i];
}

static size_t ring_floats(const ra_context *c) {
  return (size_t)c->n_layers * 2 * c->ring_rows * c->n_kv_heads * c->head_dim;
}

void ra_context_free(ra_context *c) {
  free(c->addrs);
  free(c->sessions);
  free(c->ring);
  memset(c, 0, sizeof *c);
}

/* Writes n bytes and folds them into the running crc. */
static int put(FILE *f, uLong *crc, const void *p, size_t n) {
  *crc = crc32(*crc, p, (uInt)n);
  return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int ra_context_save(const char *path, ra_offload *o, const ra_offload_config *cfg, int32_t next_token,
                    ra_error *err) {
  ra_state *st = ra_offload_state(o);
  ra_remote *r = ra_offload_remote(o);
  const ra_model_config *m = &st->m->cfg;
  if (cfg->mode == RA_MODE_WAVE || !r)
    return ra_errorf(err, RA_EINVAL, "save context: mode %s is not saved (%s)", ra_mode_name(cfg->mode),
                     r ? "its meta-index lives on the worker" : "no stores");
  ra_context c = {.n_layers = (uint32_t)m->n_layers, .n_q_heads = (uint32_t)m->n_heads,
                  .n_kv_heads = (uint32_t)m->n_kv_heads, .head_dim = (uint32_t)m->head_dim, .vocab = (uint32_t)m->vocab,
                  .mode = (uint32_t)cfg->mode, .n_sink = cfg->n_sink, .n_window = cfg->n_window,
                  .kv_dtype = (uint32_t)cfg->kv_dtype, .store_dtype = (uint32_t)cfg->store_dtype, .top_k = cfg->top_k,
                  .ring_rows = (uint32_t)st->k_cache[0].shape[0], .n_stores = (uint32_t)ra_remote_n_stores(r),
                  .position = st->pos, .next_token = next_token};
  size_t per = (size_t)c.ring_rows * c.n_kv_heads * c.head_dim;
  float *ring = malloc(per * sizeof *ring);
  size_t plen = strlen(path) + 5;
  char *tmp = malloc(plen);
  if (!ring || !tmp) {
    free(ring);
    free(tmp);
    return ra_errorf(err, RA_ENOMEM, "save context: out of memory");
  }
  snprintf(tmp, plen, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int rc = f ? RA_OK : ra_errorf(err, RA_EIO, "save context: cannot create %s", tmp);
  uLong crc = crc32(0L, Z_NULL, 0);
  int bad = 0;
  if (rc == RA_OK) {
    bad |= put(f, &crc, MAGIC, sizeof MAGIC);
    for (int i = 0; i < N_U32; i++) bad |= put(f, &crc, header_u32(&c, i), 4);
    bad |= put(f, &crc, &c.position, 8);
    bad |= put(f, &crc, &c.next_token, 4);
    for (uint32_t i = 0; i < c.n_stores; i++) {
      ra_remote_store_report s;
      ra_remote_store_state(r, i, &s);
      if (s.down || s.replaced) {
        rc = ra_errorf(err, RA_EINVAL, "save context: store %s %s%s; the saved store list would not be the one "
                       "reopened", s.replaced ? s.replaced : s.addr, s.down ? "is down: " : "was replaced by ",
                       s.down ? s.why : s.addr);
        break;
      }
      char addr[ADDR_BYTES] = {0};
      snprintf(addr, sizeof addr, "%s", s.addr);
      bad |= put(f, &crc, addr, sizeof addr);
      bad |= put(f, &crc, s.session_id, 16);
      bad |= put(f, &crc, &s.tokens, 8);
    }
  }
  ra_backend *be = st->be;
  for (uint32_t l = 0; l < c.n_layers && rc == RA_OK; l++)
    for (int kv = 0; kv < 2 && rc == RA_OK; kv++) {
      rc = be->ops->download(be, kv ? &st->v_cache[l] : &st->k_cache[l], 0, ring, per, err);
      if (rc == RA_OK) bad |= put(f, &crc, ring, per * sizeof *ring);
    }
  uint32_t sum = (uint32_t)crc;
  if (rc == RA_OK && (bad || fwrite(&sum, 4, 1, f) != 1)) rc = ra_errorf(err, RA_EIO, "save context: writing %s failed", tmp);
  if (f && fclose(f) != 0 && rc == RA_OK) rc = ra_errorf(err, RA_EIO, "save context: writing %s failed", tmp);
  if (rc == RA_OK && rename(tmp, path) != 0) rc = ra_errorf(err, RA_EIO, "save context: cannot rename %s", tmp);
  if (rc != RA_OK && f) remove(tmp);
  free(ring);
  free(tmp);
  return rc;
}

/* Reads n bytes and folds them into the running crc. */
static int get(FILE *f, uLong *crc, void *p, size_t n) {
  if (fread(p, 1, n, f) != n) return -1;
  *crc = crc32(*crc, p, (uInt)n);
  return 0;
}

int ra_context_read(const char *path, ra_context *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) return ra_errorf(err, RA_EIO, "context %s: cannot open", path);
  uLong crc = crc32(0L, Z_NULL, 0);
  char magic[sizeof MAGIC];
  int rc = RA_OK;
  if (get(f, &crc, magic, sizeof magic) || memcmp(magic, MAGIC, sizeof MAGIC) != 0)
    rc = ra_errorf(err, RA_EFORMAT, "context %s: not a saved context", path);
  for (int i = 0; i < N_U32 && rc == RA_OK; i++)
    if (get(f, &crc, header_u32(out, i), 4)) rc = ra_errorf(err, RA_EFORMAT, "context %s: truncated", path);
  if (rc == RA_OK && (get(f, &crc, &out->position, 8) || get(f, &crc, &out->next_token, 4)))
    rc = ra_errorf(err, RA_EFORMAT, "context %s: truncated", path);
  /* bounds before allocating: the model geometry limits the stores' (kv-store/store.h) */
  if (rc == RA_OK && (out->n_layers == 0 || out->n_layers > 1024 || out->n_kv_heads == 0 || out->n_kv_heads > 1024 ||
                      out->head_dim == 0 || out->head_dim > 1024 || out->ring_rows == 0 || out->ring_rows > (1u << 24) ||
                      out->n_stores == 0 || out->n_stores > 4096 || out->position < 1))
    rc = ra_errorf(err, RA_EFORMAT, "context %s: header out of bounds", path);
  if (rc == RA_OK) {
    out->addrs = calloc(out->n_stores, sizeof *out->addrs);
    out->sessions = calloc(out->n_stores, sizeof *out->sessions);
    out->ring = malloc(ring_floats(out) * sizeof *out->ring);
    if (!out->addrs || !out->sessions || !out->ring) rc = ra_errorf(err, RA_ENOMEM, "context %s: out of memory", path);
  }
  for (uint32_t i = 0; i < out->n_stores && rc == RA_OK; i++) {
    if (get(f, &crc, out->addrs[i], ADDR_BYTES) || get(f, &crc, out->sessions[i].id, 16) ||
        get(f, &crc, &out->sessions[i].tokens, 8))
      rc = ra_errorf(err, RA_EFORMAT, "context %s: truncated", path);
    out->addrs[i][ADDR_BYTES - 1] = 0;
  }
  if (rc == RA_OK && get(f, &crc, out->ring, ring_floats(out) * sizeof *out->ring))
    rc = ra_errorf(err, RA_EFORMAT, "context %s: truncated", path);
  uint32_t sum;
  if (rc == RA_OK && (fread(&sum, 4, 1, f) != 1 || sum != (uint32_t)crc))
    rc = ra_errorf(err, RA_EFORMAT, "context %s: checksum mismatch (damaged file)", path);
  fclose(f);
  if (rc) ra_context_free(out);
  return rc;
}

int ra_context_check(const ra_context *c, const ra_model_config *m, const ra_offload_config *cfg,
                     const ra_offload_plan *plan, ra_error *err) {
  if (c->n_layers != (uint32_t)m->n_layers || c->n_q_heads != (uint32_t)m->n_heads ||
      c->n_kv_heads != (uint32_t)m->n_kv_heads || c->head_dim != (uint32_t)m->head_dim || c->vocab != (uint32_t)m->vocab)
    return ra_errorf(err, RA_EINVAL, "context: saved from a model of %u layers, %u/%u heads, head_dim %u, vocab %u, "
                     "not this one", c->n_layers, c->n_q_heads, c->n_kv_heads, c->head_dim, c->vocab);
  struct { const char *what; uint32_t saved, now; } p[] = {
      {"--mode", c->mode, (uint32_t)cfg->mode},          {"--sink", c->n_sink, cfg->n_sink},
      {"--window", c->n_window, cfg->n_window},          {"--kv-dtype", c->kv_dtype, (uint32_t)cfg->kv_dtype},
      {"--store-dtype", c->store_dtype, (uint32_t)cfg->store_dtype}, {"--attn-top-k", c->top_k, cfg->top_k}};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
    if (p[i].saved != p[i].now)
      return ra_errorf(err, RA_EINVAL, "context: saved with %s %u, not %u", p[i].what, p[i].saved, p[i].now);
  if (!plan || plan->n_stores != c->n_stores)
    return ra_errorf(err, RA_EINVAL, "context: saved with %u stores, not %zu", c->n_stores, plan ? plan->n_stores : 0);
  for (uint32_t i = 0; i < c->n_stores; i++)
    if (strcmp(plan->stores[i].addr, c->addrs[i]) != 0)
      return ra_errorf(err, RA_EINVAL, "context: store %u is %s, saved as %s", i + 1, plan->stores[i].addr, c->addrs[i]);
  return RA_OK;
}

int ra_context_restore(const ra_context *c, ra_offload *o, ra_error *err) {
  ra_state *st = ra_offload_state(o);
  size_t per = (size_t)c->ring_rows * c->n_kv_heads * c->head_dim;
  if ((int64_t)c->ring_rows > st->k_cache[0].shape[0])
    return ra_errorf(err, RA_EINVAL, "context: %u ring rows saved, the runtime has %lld", c->ring_rows,
                     (long long)st->k_cache[0].shape[0]);
  int rc = RA_OK;
  for (uint32_t l = 0; l < c->n_layers && rc == RA_OK; l++)
    for (int kv = 0; kv < 2 && rc == RA_OK; kv++)
      rc = st->be->ops->upload(st->be, kv ? &st->v_cache[l] : &st->k_cache[l], 0, c->ring + (2 * (size_t)l + kv) * per,
                               per, err);
  return rc ? rc : ra_offload_resume(o, c->position, err);
}
