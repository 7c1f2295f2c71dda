#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
  const char *s;
  size_t len, pos;
  ra_error *err;
} parser;

static int fail(parser *p, const char *what) {
  return ra_errorf(p->err, RA_EFORMAT, "json: %s at byte %zu", what, p->pos);
}

static void skip_ws(parser *p) {
  while (p->pos < p->len &&
         (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

static int parse_value(parser *p, ra_json *v, int depth);

static int hex4(parser *p, unsigned *out) {
  if (p->len - p->pos < 4) return fail(p, "truncated \\u escape");
  unsigned x = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos++];
    x <<= 4;
    if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
    else return fail(p, "bad hex digit in \\u escape");
  }
  *out = x;
  return RA_OK;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* Length of a valid UTF-8 sequence starting at s (at most n bytes), or 0. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
  if (s[0] < 0x80) return 1;
  size_t k;
  unsigned cp;
  if ((s[0] & 0xe0) == 0xc0) { k = 2; cp = s[0] & 0x1f; }
  else if ((s[0] & 0xf0) == 0xe0) { k = 3; cp = s[0] & 0x0f; }
  else if ((s[0] & 0xf8) == 0xf0) { k = 4; cp = s[0] & 0x07; }
  else return 0;
  if (k > n) return 0;
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return k;
}

/* Parses a string at p->pos (which is at the opening quote) into a malloc'ed buffer. */
static int parse_string(parser *p, char **out, size_t *out_len) {
  p->pos++;
  size_t start = p->pos;
  /* Decoded output never exceeds the raw length, so size the buffer by scanning to the quote. */
  size_t end = start;
  while (end < p->len && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
  if (end >= p->len) return fail(p, "unterminated string");
  char *o = malloc(end - start + 1);
  if (!o) return ra_errorf(p->err, RA_ENOMEM, "json: out of memory");
  size_t n = 0;
  while (p->s[p->pos] != '"') {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c < 0x20) { free(o); return fail(p, "control character in string"); }
    if (c == '\\') {
      p->pos++;
      char e = p->s[p->pos++];
      unsigned cp;
      switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u':
          if (hex4(p, &cp)) { free(o); return RA_EFORMAT; }
          if (cp >= 0xdc00 && cp <= 0xdfff) { free(o); return fail(p, "lone low surrogate"); }
          if (cp >= 0xd800 && cp <= 0xdbff) {
            unsigned lo;
            if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
              free(o);
              return fail(p, "lone high surrogate");
            }
            p->pos += 2;
            if (hex4(p, &lo)) { free(o); return RA_EFORMAT; }
            if (lo < 0xdc00 || lo > 0xdfff) { free(o); return fail(p, "bad surrogate pair"); }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          /* \uXXXX (6 raw bytes) yields <= 3 bytes, a pair (12) <= 4: fits the buffer. */
          n += put_utf8(o + n, cp);
          break;
        default: free(o); return fail(p, "bad escape");
      }
      continue;
    }
    size_t k = utf8_valid_len((const unsigned char *)p->s + p->pos, end - p->pos);
    if (!k) { free(o); return fail(p, "invalid UTF-8 in string"); }
    memcpy(o + n, p->s + p->pos, k);
    n += k;
    p->pos += k;
  }
  p->pos++;
  o[n] = 0;
  *out = o;
  *out_len = n;
  return RA_OK;
}

static int parse_number(parser *p, ra_json *v) {
  size_t st = p->pos;
  if (p->s[p->pos] == '-') p->pos++;
  if (p->pos >= p->len) return fail(p, "truncated number");
  if (p->s[p->pos] == '0') {
    p->pos++;
  } else if (p->s[p->pos] >= '1' && p->s[p->pos] <= '9') {
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  } else {
    return fail(p, "bad number");
  }
  if (p->pos < p->len && p->s[p->pos] == '.') {
    p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad fraction");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad exponent");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  }
  char buf[64];
  size_t n = p->pos - st;
  if (n >= sizeof buf) return fail(p, "number too long");
  memcpy(buf, p->s + st, n);
  buf[n] = 0;
  v->type = RA_JSON_NUMBER;
  v->num = strtod(buf, NULL);
  if (!isfinite(v->num)) return fail(p, "number out of range");
  return RA_OK;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "unexpected character");
  p->pos += n;
  return RA_OK;
}

static int grow(ra_json *v, size_t *cap, int with_keys, ra_error *err) {
  if (v->n < *cap) return RA_OK;
  size_t nc = *cap ? *cap * 2 : 4;
  ra_json *it = realloc(v->items, nc * sizeof(ra_json));
  if (!it) return ra_errorf(err, RA_ENOMEM, "json: out of memory");
  v->items = it;
  if (with_keys) {
    char **k = realloc(v->keys, nc * sizeof(char *));
    if (!k) return ra_errorf(err, RA_ENOMEM, "json: out of memory");
    v->keys = k;
  }
  *cap = nc;
  return RA_OK;
}

static void free_inner(ra_json *v) {
  for (size_t i = 0; i < v->n; i++) {
    free_inner(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  memset(v, 0, sizeof(*v));
}

static int parse_container(parser *p, ra_json *v, int depth, int is_obj) {
  if (depth >= RA_JSON_MAX_DEPTH) return fail(p, "nesting too deep");
  v->type = is_obj ? RA_JSON_OBJECT : RA_JSON_ARRAY;
  char close = is_obj ? '}' : ']';
  size_t cap = 0;
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    return RA_OK;
  }
  for (;;) {
    int rc = grow(v, &cap, is_obj, p->err);
    if (rc) return rc;
    skip_ws(p);
    char *key = NULL;
    if (is_obj) {
      size_t kl;
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected object key");
      if ((rc = parse_string(p, &key, &kl))) return rc;
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        free(key);
        return fail(p, "expected ':'");
      }
      p->pos++;
    }
    memset(&v->items[v->n], 0, sizeof(ra_json));
    if (is_obj) v->keys[v->n] = key;
    v->n++;
    if ((rc = parse_value(p, &v->items[v->n - 1], depth + 1))) return rc;
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unterminated container");
    if (p->s[p->pos] == ',') { p->pos++; continue; }
    if (p->s[p->pos] == close) { p->pos++; return RA_OK; }
    return fail(p, "expected ',' or end of container");
  }
}

static int parse_value(parser *p, ra_json *v, int depth) {
  skip_ws(p);
  if (p->pos >= p->len) return fail(p, "unexpected end of input");
  switch (p->s[p->pos]) {
    case '{': return parse_container(p, v, depth, 1);
    case '[': return parse_container(p, v, depth, 0);
    case '"': v->type = RA_JSON_STRING; return parse_string(p, &v->str, &v->str_len);
    case 't': v->type = RA_JSON_BOOL; v->boolean = 1; return literal(p, "true");
    case 'f': v->type = RA_JSON_BOOL; return literal(p, "false");
    case 'n': v->type = RA_JSON_NULL; return literal(p, "null");
    default: return parse_number(p, v);
  }
}

int ra_json_parse(const char *text, size_t len, ra_json **out, ra_error *err) {
  parser p = {text, len, 0, err};
  ra_json *v = calloc(1, sizeof(ra_json));
  if (!v) return ra_errorf(err, RA_ENOMEM, "json: out of memory");
  int rc = parse_value(&p, v, 0);
  if (rc == RA_OK) {
    skip_ws(&p);
    if (p.pos != len) rc = fail(&p, "trailing characters");
  }
  if (rc != RA_OK) {
    ra_json_free(v);
    return rc;
  }
  *out = v;
  return RA_OK;
}

void ra_json_free(ra_json *v) {
  if (!v) return;
  free_inner(v);
  free(v);
}

const ra_json *ra_json_get(const ra_json *obj, const char *key) {
  if (!obj || obj->type != RA_JSON_OBJECT) return NULL;
  for (size_t i = obj->n; i-- > 0;)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

int ra_json_get_num(const ra_json *obj, const char *key, double *out) {
  const ra_json *v = ra_json_get(obj, key);
  if (!v) return RA_ENOTFOUND;
  if (v->type != RA_JSON_NUMBER) return RA_EFORMAT;
  *out = v->num;
  return RA_OK;
}

int ra_json_get_str(const ra_json *obj, const char *key, const char **out) {
  const ra_json *v = ra_json_get(obj, key);
  if (!v) return RA_ENOTFOUND;
  if (v->type != RA_JSON_STRING) return RA_EFORMAT;
  *out = v->str;
  return RA_OK;
}

int ra_json_get_bool(const ra_json *obj, const char *key, int *out) {
  const ra_json *v = ra_json_get(obj, key);
  if (!v) return RA_ENOTFOUND;
  if (v->type != RA_JSON_BOOL) return RA_EFORMAT;
  *out = v->boolean;
  return RA_OK;
}

/* Length of the well-formed UTF-8 sequence at c (RFC 3629: no overlongs, no surrogates, nothing
 * past U+10FFFF), or 0. */
static int utf8_len(const unsigned char *c) {
  int n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c[0] >= 0xc2 && c[0] <= 0xdf) n = 2;
  else if (c[0] >= 0xe0 && c[0] <= 0xef) n = 3;
  else if (c[0] >= 0xf0 && c[0] <= 0xf4) n = 4;
  else return 0;
  if (c[0] == 0xe0) lo = 0xa0;
  if (c[0] == 0xed) hi = 0x9f;
  if (c[0] == 0xf0) lo = 0x90;
  if (c[0] == 0xf4) hi = 0x8f;
  if (c[1] < lo || c[1] > hi) return 0;
  for (int i = 2; i < n; i++)
    if (c[i] < 0x80 || c[i] > 0xbf) return 0;
  return n;
}

void ra_json_write_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
    else if (*c == '\n') fputs("\\n", f);
    else if (*c == '\t') fputs("\\t", f);
    else if (*c == '\r') fputs("\\r", f);
    else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
    else if (*c < 0x80) fputc(*c, f);
    else {
      /* JSON text is UTF-8: a byte that starts no well-formed sequence (a token's partial
       * character, a binary string) becomes U+FFFD, so that the file stays readable */
      int n = utf8_len(c);
      if (n == 0) {
        fputs("\\ufffd", f);
      } else {
        fwrite(c, 1, (size_t)n, f);
        c += n - 1;
      }
    }
  }
  fputc('"', f);
}
