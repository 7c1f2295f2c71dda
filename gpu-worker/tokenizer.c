#include "tokenizer.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = RA_TOK_NORMAL, TT_UNKNOWN = 2, TT_CONTROL = RA_TOK_CONTROL, TT_USER = RA_TOK_USER, TT_UNUSED = RA_TOK_UNUSED, TT_BYTE = 6 };
enum pre_kind { PRE_GPT2, PRE_SMOLLM, PRE_LLAMA3, PRE_QWEN2 };
enum chat_kind { CHAT_NONE, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2 };

/* Open-addressing hash tables: token text -> id, and merge pair (a, b) -> rank. */
typedef struct str_map {
  int32_t *slots; /* id or -1 */
  size_t mask;
} str_map;

typedef struct pair_map {
  uint64_t *keys; /* (a << 32 | b) + 1, 0 = empty */
  int32_t *rank;
  int32_t *result;
  size_t mask;
} pair_map;

struct ra_tokenizer {
  ra_tok_model model;
  enum pre_kind pre;
  int32_t n_vocab;
  char *text_pool;
  char **text; /* token texts (NUL-terminated, pointing into text_pool) */
  uint32_t *len;
  float *scores;
  int32_t *type;
  str_map vocab;
  pair_map merges;
  int32_t byte_id[256]; /* BPE: token of the byte's GPT-2 char; SPM: <0xXX> token; -1 if absent */
  int32_t *specials;    /* control / user-defined tokens, longest text first */
  size_t n_specials;
  int32_t bos, eos, eot, unk, turn_end;
  int add_bos, add_space_prefix;
  enum chat_kind chat;
  char *chat_default_system;
};

/* ---------- hashing ---------- */

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n * 2) c <<= 1;
  return c;
}

static int32_t vocab_lookup(const ra_tokenizer *t, const char *s, size_t n) {
  for (size_t i = fnv1a(s, n) & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
    int32_t id = t->vocab.slots[i];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(t->text[id], s, n) == 0) return id;
  }
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

static int merge_lookup(const ra_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *result) {
  if (!t->merges.keys) return 0;
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  for (size_t i = mix64(key) & t->merges.mask;; i = (i + 1) & t->merges.mask) {
    if (t->merges.keys[i] == 0) return 0;
    if (t->merges.keys[i] == key) {
      *rank = t->merges.rank[i];
      *result = t->merges.result[i];
      return 1;
    }
  }
}

/* ---------- UTF-8 and Unicode classes ---------- */

/* Decodes one code point at s[0..n); invalid bytes decode as themselves with length 1 and a
 * code point above the Unicode range so they classify as "other". */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned c = s[0];
  size_t k;
  uint32_t v;
  if (c < 0x80) { *cp = c; return 1; }
  if ((c & 0xe0) == 0xc0) { k = 2; v = c & 0x1f; }
  else if ((c & 0xf0) == 0xe0) { k = 3; v = c & 0x0f; }
  else if ((c & 0xf8) == 0xf0) { k = 4; v = c & 0x07; }
  else { *cp = 0x110000 + c; return 1; }
  if (k > n) { *cp = 0x110000 + c; return 1; }
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) { *cp = 0x110000 + c; return 1; }
    v = (v << 6) | (s[i] & 0x3f);
  }
  *cp = v;
  return k;
}

enum ucls { U_OTHER = 0, U_LETTER = 1, U_NUMBER = 2, U_SPACE = 3 };

typedef struct urange { uint32_t lo, hi; } urange;

static int in_ranges(uint32_t cp, const urange *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (cp >= r[i].lo && cp <= r[i].hi) return 1;
  return 0;
}

static enum ucls unicode_class(uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return U_SPACE;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return U_LETTER;
    if (cp >= '0' && cp <= '9') return U_NUMBER;
    return U_OTHER;
  }
  static const urange spaces[] = {{0x85, 0x85}, {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a},
                                  {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}};
  static const urange numbers[] = {
      {0xb2, 0xb3}, {0xb9, 0xb9}, {0xbc, 0xbe}, {0x660, 0x669}, {0x6f0, 0x6f9}, {0x7c0, 0x7c9}, {0x966, 0x96f},
      {0x9e6, 0x9ef}, {0xa66, 0xa6f}, {0xae6, 0xaef}, {0xb66, 0xb6f}, {0xbe6, 0xbf2}, {0xc66, 0xc6f},
      {0xce6, 0xcef}, {0xd66, 0xd78}, {0xe50, 0xe59}, {0xed0, 0xed9}, {0xf20, 0xf33}, {0x1040, 0x1049},
      {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},
      {0x2460, 0x249b}, {0x24ea, 0x24ff}, {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029},
      {0x3038, 0x303a}, {0xff10, 0xff19}};
  static const urange letters[] = {
      {0xaa, 0xaa}, {0xb5, 0xb5}, {0xba, 0xba}, {0xc0, 0xd6}, {0xd8, 0xf6}, {0xf8, 0x2c1}, {0x2c6, 0x2d1},
      {0x2e0, 0x2e4}, {0x2ec, 0x2ec}, {0x2ee, 0x2ee}, {0x370, 0x374}, {0x376, 0x377}, {0x37a, 0x37d},
      {0x37f, 0x37f}, {0x386, 0x386}, {0x388, 0x3ff}, {0x400, 0x481}, {0x48a, 0x52f}, {0x531, 0x556},
      {0x560, 0x588}, {0x5d0, 0x5ea}, {0x5ef, 0x5f2}, {0x620, 0x64a}, {0x66e, 0x66f}, {0x671, 0x6d3},
      {0x6d5, 0x6d5}, {0x904, 0x939}, {0x985, 0x9b9}, {0xe01, 0xe30}, {0x10a0, 0x10ff}, {0x1100, 0x11ff},
      {0x1e00, 0x1fbc}, {0x1fc2, 0x1fcc}, {0x1fd0, 0x1fdb}, {0x1fe0, 0x1fec}, {0x1ff2, 0x1ffc},
      {0x2c00, 0x2ce4}, {0x3041, 0x3096}, {0x309d, 0x309f}, {0x30a1, 0x30fa}, {0x30fc, 0x30ff},
      {0x3105, 0x312f}, {0x3131, 0x318e}, {0x3400, 0x4dbf}, {0x4e00, 0x9fff}, {0xa000, 0xa48c},
      {0xac00, 0xd7a3}, {0xf900, 0xfaff}, {0xff21, 0xff3a}, {0xff41, 0xff5a}, {0xff66, 0xffdc},
      {0x20000, 0x2fa1f}};
  if (in_ranges(cp, spaces, sizeof spaces / sizeof spaces[0])) return U_SPACE;
  if (in_ranges(cp, numbers, sizeof numbers / sizeof numbers[0])) return U_NUMBER;
  if (in_ranges(cp, letters, sizeof letters / sizeof letters[0])) return U_LETTER;
  return U_OTHER;
}

/* ---------- output buffer ---------- */

typedef struct idbuf {
  int32_t *v;
  size_t n, cap;
} idbuf;

static int idbuf_push(idbuf *b, int32_t id) {
  if (b->n == b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 64;
    int32_t *nv = realloc(b->v, nc * sizeof(int32_t));
    if (!nv) return RA_ENOMEM;
    b->v = nv;
    b->cap = nc;
  }
  b->v[b->n++] = id;
  return RA_OK;
}

/* ---------- BPE (byte level) ---------- */

/* Byte-level BPE of one pre-token: bytes -> their GPT-2 char tokens, then merge the adjacent
 * pair of lowest rank until none is in the merge table. syms: scratch of len ids. */
static int bpe_word(const ra_tokenizer *t, const unsigned char *w, size_t len, int32_t *syms, idbuf *out) {
  size_t n = len;
  /* Bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF) may lack a token: they become
   * the unknown token, as in Hugging Face's BPE with an unk token. */
  for (size_t i = 0; i < len; i++) {
    syms[i] = t->byte_id[w[i]] >= 0 ? t->byte_id[w[i]] : t->unk;
    if (syms[i] < 0) return RA_EFORMAT;
  }
  while (n > 1) {
    int32_t best_rank = INT32_MAX, best_res = -1, r, res;
    size_t best = 0;
    for (size_t i = 0; i + 1 < n; i++)
      if (merge_lookup(t, syms[i], syms[i + 1], &r, &res) && r < best_rank) {
        best_rank = r;
        best_res = res;
        best = i;
      }
    if (best_res < 0) break;
    syms[best] = best_res;
    memmove(syms + best + 1, syms + best + 2, (n - best - 2) * sizeof(int32_t));
    n--;
  }
  for (size_t i = 0; i < n; i++)
    if (idbuf_push(out, syms[i])) return RA_ENOMEM;
  return RA_OK;
}

/* Decoded code points of a text segment with their byte offsets. */
typedef struct cps {
  uint32_t *cp;
  uint8_t *cls;
  size_t *off; /* n + 1 entries */
  size_t n;
} cps;

static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* Length (in code points) of an English contraction at i ('s 't 're 've 'm 'll 'd), or 0. */
static size_t contraction(const cps *c, size_t i, size_t end, int icase) {
  if (c->cp[i] != '\'' || i + 1 >= end) return 0;
  uint32_t a = c->cp[i + 1], b = i + 2 < end ? c->cp[i + 2] : 0;
  if (icase) {
    if (a < 128) a |= 0x20;
    if (b < 128 && b) b |= 0x20;
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* Length of the next pre-token at i (< end) for the GPT-2 regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t next_gpt2(const cps *c, size_t i, size_t end) {
  size_t k = contraction(c, i, end, 0);
  if (k) return k;
  size_t j = (c->cp[i] == ' ' && i + 1 < end) ? i + 1 : i;
  uint8_t cl = c->cls[j];
  if (cl != U_SPACE) {
    k = j + 1;
    while (k < end && c->cls[k] == cl) k++;
    return k - i;
  }
  k = i;
  while (k < end && c->cls[k] == U_SPACE) k++;
  if (k == end || k - i == 1) return k - i;
  return k - i - 1;
}

/* Llama-3 / Qwen2 regex (max_digits 3 or 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t next_llama3(const cps *c, size_t i, size_t end, int max_digits) {
  size_t k = contraction(c, i, end, 1);
  if (k) return k;
  uint8_t cl = c->cls[i];
  if (cl == U_LETTER || (cl != U_NUMBER && !is_nl(c->cp[i]) && i + 1 < end && c->cls[i + 1] == U_LETTER)) {
    k = i + 1;
    while (k < end && c->cls[k] == U_LETTER) k++;
    return k - i;
  }
  if (cl == U_NUMBER) {
    k = i;
    while (k < end && c->cls[k] == U_NUMBER && (int)(k - i) < max_digits) k++;
    return k - i;
  }
  size_t j = (c->cp[i] == ' ' && i + 1 < end) ? i + 1 : i;
  if (c->cls[j] == U_OTHER) {
    k = j + 1;
    while (k < end && c->cls[k] == U_OTHER) k++;
    while (k < end && is_nl(c->cp[k])) k++;
    return k - i;
  }
  /* whitespace run [i, k) */
  k = i;
  while (k < end && c->cls[k] == U_SPACE) k++;
  size_t last_nl = end;
  for (size_t p = i; p < k; p++)
    if (is_nl(c->cp[p])) last_nl = p;
  if (last_nl != end) return last_nl + 1 - i;
  if (k == end || k - i == 1) return k - i;
  return k - i - 1;
}

static int encode_bpe_segment(const ra_tokenizer *t, const char *text, size_t len, idbuf *out) {
  cps c = {0};
  c.cp = malloc((len + 1) * sizeof(uint32_t));
  c.cls = malloc(len + 1);
  c.off = malloc((len + 1) * sizeof(size_t));
  int32_t *syms = malloc((len + 1) * sizeof(int32_t));
  int rc = RA_OK;
  if (!c.cp || !c.cls || !c.off || !syms) {
    rc = RA_ENOMEM;
    goto done;
  }
  for (size_t p = 0; p < len;) {
    c.off[c.n] = p;
    p += utf8_next((const unsigned char *)text + p, len - p, &c.cp[c.n]);
    c.cls[c.n] = (uint8_t)unicode_class(c.cp[c.n]);
    c.n++;
  }
  c.off[c.n] = len;
  /* SmolLM splits every digit into its own piece before the GPT-2 regex (HF Digits). */
  size_t seg0 = 0;
  while (seg0 < c.n && rc == RA_OK) {
    size_t seg1 = c.n;
    if (t->pre == PRE_SMOLLM) {
      if (c.cls[seg0] == U_NUMBER) {
        seg1 = seg0 + 1;
      } else {
        seg1 = seg0;
        while (seg1 < c.n && c.cls[seg1] != U_NUMBER) seg1++;
      }
    }
    for (size_t i = seg0; i < seg1 && rc == RA_OK;) {
      size_t k = t->pre == PRE_LLAMA3   ? next_llama3(&c, i, seg1, 3)
                 : t->pre == PRE_QWEN2  ? next_llama3(&c, i, seg1, 1)
                                        : next_gpt2(&c, i, seg1);
      rc = bpe_word(t, (const unsigned char *)text + c.off[i], c.off[i + k] - c.off[i], syms, out);
      i += k;
    }
    seg0 = seg1;
  }
done:
  free(c.cp);
  free(c.cls);
  free(c.off);
  free(syms);
  return rc;
}

/* ---------- SentencePiece-style BPE ---------- */

static int encode_spm_segment(const ra_tokenizer *t, const char *text, size_t len, int at_start, idbuf *out) {
  /* Spaces become U+2581 (3 bytes), plus an optional leading one. */
  size_t cap = len * 3 + 4;
  char *s = malloc(cap);
  size_t n = 0;
  if (!s) return RA_ENOMEM;
  if (at_start && t->add_space_prefix) {
    memcpy(s, "\xe2\x96\x81", 3);
    n = 3;
  }
  for (size_t i = 0; i < len; i++) {
    if (text[i] == ' ') {
      memcpy(s + n, "\xe2\x96\x81", 3);
      n += 3;
    } else {
      s[n++] = text[i];
    }
  }
  /* symbols: byte spans [start, start+len) of s, merged while the union is a token */
  size_t *st = malloc((n + 1) * sizeof(size_t)), *ln = malloc((n + 1) * sizeof(size_t));
  int rc = RA_OK;
  if (!st || !ln) {
    rc = RA_ENOMEM;
    goto done;
  }
  size_t m = 0;
  for (size_t p = 0; p < n;) {
    uint32_t cp;
    size_t k = utf8_next((const unsigned char *)s + p, n - p, &cp);
    st[m] = p;
    ln[m++] = k;
    p += k;
  }
  while (m > 1) {
    float best = -1e30f;
    size_t bi = SIZE_MAX;
    for (size_t i = 0; i + 1 < m; i++) {
      int32_t id = vocab_lookup(t, s + st[i], ln[i] + ln[i + 1]);
      if (id >= 0 && t->scores[id] > best) {
        best = t->scores[id];
        bi = i;
      }
    }
    if (bi == SIZE_MAX) break;
    ln[bi] += ln[bi + 1];
    memmove(st + bi + 1, st + bi + 2, (m - bi - 2) * sizeof(size_t));
    memmove(ln + bi + 1, ln + bi + 2, (m - bi - 2) * sizeof(size_t));
    m--;
  }
  for (size_t i = 0; i < m && rc == RA_OK; i++) {
    int32_t id = vocab_lookup(t, s + st[i], ln[i]);
    if (id >= 0) {
      rc = idbuf_push(out, id);
      continue;
    }
    for (size_t b = 0; b < ln[i] && rc == RA_OK; b++) {
      int32_t bid = t->byte_id[(unsigned char)s[st[i] + b]];
      rc = idbuf_push(out, bid >= 0 ? bid : t->unk);
    }
  }
done:
  free(s);
  free(st);
  free(ln);
  return rc;
}

/* ---------- encode / decode ---------- */

int ra_tok_encode(const ra_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special, int32_t **ids,
                  size_t *n_ids, ra_error *err) {
  idbuf out = {0};
  int rc = RA_OK;
  if (add_bos && t->bos >= 0) rc = idbuf_push(&out, t->bos);
  size_t seg = 0, i = 0;
  while (rc == RA_OK && i <= len) {
    int32_t sp = -1;
    if (parse_special && i < len)
      for (size_t s = 0; s < t->n_specials; s++) {
        int32_t id = t->specials[s];
        if (t->len[id] <= len - i && memcmp(text + i, t->text[id], t->len[id]) == 0) {
          sp = id;
          break;
        }
      }
    if (sp < 0 && i < len) {
      i++;
      continue;
    }
    /* plain text [seg, i) before the special (or the end) */
    if (i > seg) {
      rc = t->model == RA_TOK_SPM ? encode_spm_segment(t, text + seg, i - seg, seg == 0, &out)
                                  : encode_bpe_segment(t, text + seg, i - seg, &out);
    }
    if (sp < 0) break;
    if (rc == RA_OK) rc = idbuf_push(&out, sp);
    i += t->len[sp];
    seg = i;
  }
  if (rc != RA_OK) {
    free(out.v);
    return ra_errorf(err, rc, rc == RA_ENOMEM ? "tokenizer: out of memory" : "tokenizer: vocabulary lacks a byte token");
  }
  *ids = out.v;
  *n_ids = out.n;
  return RA_OK;
}

/* GPT-2's byte <-> printable code point map: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to 256.. in order. */
static uint32_t byte_to_cp(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
  int n = 0;
  for (int x = 0; x < b; x++)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
  return 256u + (uint32_t)n;
}

static int cp_to_byte(uint32_t cp) {
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
  if (cp < 256 || cp >= 256 + 68) return -1;
  int n = (int)(cp - 256);
  for (int x = 0; x < 256; x++)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)) && n-- == 0) return x;
  return -1;
}

static size_t put_cp(char *o, uint32_t cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
  o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
  return 3;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

int ra_tok_piece(const ra_tokenizer *t, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= t->n_vocab) return RA_EINVAL;
  const char *s = t->text[id];
  size_t n = t->len[id], w = 0;
#define EMIT(b) do { if (w < cap) buf[w] = (char)(b); w++; } while (0)
  if (t->type[id] == TT_CONTROL || t->type[id] == TT_USER) {
    for (size_t i = 0; i < n; i++) EMIT(s[i]);
    return (int)w;
  }
  if (t->model == RA_TOK_SPM) {
    if (t->type[id] == TT_BYTE && n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x') {
      int hi = hexval(s[3]), lo = hexval(s[4]);
      if (hi >= 0 && lo >= 0) EMIT(hi * 16 + lo);
      return (int)w;
    }
    for (size_t i = 0; i < n;) {
      if (n - i >= 3 && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
        EMIT(' ');
        i += 3;
      } else {
        EMIT(s[i]);
        i++;
      }
    }
    return (int)w;
  }
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = utf8_next((const unsigned char *)s + i, n - i, &cp);
    int b = cp_to_byte(cp);
    if (b >= 0) {
      EMIT(b);
    } else {
      for (size_t j = 0; j < k; j++) EMIT(s[i + j]);
    }
    i += k;
  }
#undef EMIT
  return (int)w;
}

int ra_tok_decode(const ra_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len, ra_error *err) {
  size_t cap = 64, w = 0;
  char *out = malloc(cap);
  if (!out) return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i < n; i++) {
    if (ids[i] == t->bos && ra_tok_add_bos(t) && i == 0) continue;
    int k = ra_tok_piece(t, ids[i], NULL, 0);
    if (k < 0) {
      free(out);
      return ra_errorf(err, RA_EINVAL, "tokenizer: id %d outside the vocabulary of %d", ids[i], t->n_vocab);
    }
    if (w + (size_t)k + 1 > cap) {
      while (w + (size_t)k + 1 > cap) cap *= 2;
      char *no = realloc(out, cap);
      if (!no) {
        free(out);
        return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
      }
      out = no;
    }
    ra_tok_piece(t, ids[i], out + w, (size_t)k);
    /* SentencePiece's prefix space is an artifact of encoding, not part of the text */
    if (t->model == RA_TOK_SPM && t->add_space_prefix && w == 0 && k > 0 && out[0] == ' ') {
      memmove(out, out + 1, (size_t)k - 1);
      k--;
    }
    w += (size_t)k;
  }
  out[w] = 0;
  *text = out;
  *len = w;
  return RA_OK;
}

/* ---------- loading ---------- */

void ra_tok_free(ra_tokenizer *t) {
  if (!t) return;
  free(t->text_pool);
  free(t->text);
  free(t->len);
  free(t->scores);
  free(t->type);
  free(t->vocab.slots);
  free(t->merges.keys);
  free(t->merges.rank);
  free(t->merges.result);
  free(t->specials);
  free(t->chat_default_system);
  free(t);
}

static int cmp_special(const void *a, const void *b, void *ctx) {
  const ra_tokenizer *t = ctx;
  uint32_t la = t->len[*(const int32_t *)a], lb = t->len[*(const int32_t *)b];
  return la < lb ? 1 : la > lb ? -1 : 0;
}

/* Sorts specials longest first (insertion sort: there are few), so "<|im_start|>" wins over a
 * shorter special that is its prefix. */
static void sort_specials(ra_tokenizer *t) {
  for (size_t i = 1; i < t->n_specials; i++)
    for (size_t j = i; j > 0 && cmp_special(&t->specials[j - 1], &t->specials[j], t) > 0; j--) {
      int32_t x = t->specials[j];
      t->specials[j] = t->specials[j - 1];
      t->specials[j - 1] = x;
    }
}

static int load_merges(ra_tokenizer *t, const ra_tok_spec *sp, ra_error *err) {
  size_t cap = pow2_at_least(sp->n_merges);
  t->merges.keys = calloc(cap, sizeof(uint64_t));
  t->merges.rank = malloc(cap * sizeof(int32_t));
  t->merges.result = malloc(cap * sizeof(int32_t));
  if (!t->merges.keys || !t->merges.rank || !t->merges.result) return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  t->merges.mask = cap - 1;
  char buf[1024];
  for (size_t r = 0; r < sp->n_merges; r++) {
    ra_gguf_str ma = sp->merges[2 * r], mb = sp->merges[2 * r + 1];
    if (ma.len + mb.len >= sizeof buf) return ra_errorf(err, RA_EFORMAT, "tokenizer: merge %zu is malformed", r);
    int32_t a = vocab_lookup(t, ma.ptr, ma.len), b = vocab_lookup(t, mb.ptr, mb.len);
    memcpy(buf, ma.ptr, ma.len);
    memcpy(buf + ma.len, mb.ptr, mb.len);
    int32_t res = vocab_lookup(t, buf, ma.len + mb.len);
    if (a < 0 || b < 0 || res < 0) continue; /* merges of tokens outside the vocabulary never fire */
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = mix64(key) & t->merges.mask;
    while (t->merges.keys[i] && t->merges.keys[i] != key) i = (i + 1) & t->merges.mask;
    if (t->merges.keys[i]) continue; /* duplicate: the first (lower rank) wins */
    t->merges.keys[i] = key;
    t->merges.rank[i] = (int32_t)r;
    t->merges.result[i] = res;
  }
  return RA_OK;
}

static void detect_chat(ra_tokenizer *t, ra_gguf_str tpl) {
  if (!tpl.ptr) return;
  /* memmem over a non-terminated string */
  const char *im = memmem(tpl.ptr, tpl.len, "<|im_start|>", 12);
  if (im) {
    t->chat = CHAT_CHATML;
    t->turn_end = ra_tok_find(t, "<|im_end|>");
    /* A default system prompt is written literally as '<|im_start|>system\n...<|im_end|>'. */
    const char *key = "<|im_start|>system\n";
    const char *p = memmem(tpl.ptr, tpl.len, key, strlen(key));
    if (p) {
      p += strlen(key);
      const char *e = memmem(p, tpl.len - (size_t)(p - tpl.ptr), "<|im_end|>", 10);
      if (e && e - p < 4096 && !memchr(p, '{', (size_t)(e - p))) t->chat_default_system = strndup(p, (size_t)(e - p));
    }
  } else if (memmem(tpl.ptr, tpl.len, "<|start_header_id|>", 19)) {
    t->chat = CHAT_LLAMA3;
    t->turn_end = ra_tok_find(t, "<|eot_id|>");
  } else if (memmem(tpl.ptr, tpl.len, "[INST]", 6)) {
    t->chat = CHAT_LLAMA2;
  }
}

static int32_t valid_id(int32_t id, int32_t n_vocab) { return id >= 0 && id < n_vocab ? id : -1; }

int ra_tok_build(const ra_tok_spec *sp, ra_tokenizer **out, ra_error *err) {
  if (sp->n_vocab <= 0 || sp->n_vocab > (1 << 24)) return ra_errorf(err, RA_EFORMAT, "tokenizer: %d tokens", sp->n_vocab);
  int rc;
  ra_tokenizer *t = calloc(1, sizeof(*t));
  if (!t) return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  t->turn_end = -1;
  t->model = sp->model;
  const char *pre = sp->pre ? sp->pre : "";
  t->pre = PRE_GPT2;
  if (strcmp(pre, "smollm") == 0) t->pre = PRE_SMOLLM;
  else if (strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "llama3") == 0) t->pre = PRE_LLAMA3;
  else if (strcmp(pre, "qwen2") == 0) t->pre = PRE_QWEN2;
  else if (t->model == RA_TOK_BPE && *pre && strcmp(pre, "gpt2") != 0 && strcmp(pre, "default") != 0)
    ra_log_warn("tokenizer: pre-tokenizer '%s' unknown; using GPT-2's", pre);
  t->n_vocab = sp->n_vocab;
  size_t pool = 0;
  for (int32_t i = 0; i < t->n_vocab; i++) pool += sp->tokens[i].len + 1;
  t->text_pool = malloc(pool);
  t->text = malloc((size_t)t->n_vocab * sizeof(char *));
  t->len = malloc((size_t)t->n_vocab * sizeof(uint32_t));
  t->scores = calloc((size_t)t->n_vocab, sizeof(float));
  t->type = malloc((size_t)t->n_vocab * sizeof(int32_t));
  size_t vcap = pow2_at_least((size_t)t->n_vocab);
  t->vocab.slots = malloc(vcap * sizeof(int32_t));
  if (!t->text_pool || !t->text || !t->len || !t->scores || !t->type || !t->vocab.slots) {
    rc = ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  t->vocab.mask = vcap - 1;
  memset(t->vocab.slots, 0xff, vcap * sizeof(int32_t));
  size_t w = 0;
  for (int32_t i = 0; i < t->n_vocab; i++) {
    ra_gguf_str s = sp->tokens[i];
    t->text[i] = t->text_pool + w;
    if (s.len) memcpy(t->text_pool + w, s.ptr, s.len);
    t->text_pool[w + s.len] = 0;
    w += s.len + 1;
    t->len[i] = (uint32_t)s.len;
    t->scores[i] = sp->scores ? sp->scores[i] : 0.0f;
    t->type[i] = sp->types ? sp->types[i] : TT_NORMAL;
    if (t->type[i] == TT_UNUSED && s.len == 0) continue; /* a hole in the id space */
    size_t h = fnv1a(s.ptr, s.len) & t->vocab.mask;
    int dup = 0;
    for (; t->vocab.slots[h] >= 0; h = (h + 1) & t->vocab.mask)
      if (t->len[t->vocab.slots[h]] == s.len && memcmp(t->text[t->vocab.slots[h]], s.ptr, s.len) == 0) dup = 1;
    if (!dup) t->vocab.slots[h] = i; /* duplicates keep the first id */
    if (t->type[i] == TT_CONTROL || t->type[i] == TT_USER) t->n_specials += s.len > 0;
  }
  t->specials = malloc((t->n_specials ? t->n_specials : 1) * sizeof(int32_t));
  if (!t->specials) {
    rc = ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
    goto fail;
  }
  t->n_specials = 0;
  for (int32_t i = 0; i < t->n_vocab; i++)
    if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) t->specials[t->n_specials++] = i;
  sort_specials(t);
  for (int b = 0; b < 256; b++) {
    char buf[8];
    if (t->model == RA_TOK_BPE) {
      size_t k = put_cp(buf, byte_to_cp(b));
      t->byte_id[b] = vocab_lookup(t, buf, k);
    } else {
      snprintf(buf, sizeof buf, "<0x%02X>", b);
      t->byte_id[b] = vocab_lookup(t, buf, 6);
    }
  }
  if (t->model == RA_TOK_BPE && (rc = load_merges(t, sp, err))) goto fail;
  t->bos = valid_id(sp->bos, t->n_vocab);
  t->eos = valid_id(sp->eos, t->n_vocab);
  t->eot = valid_id(sp->eot, t->n_vocab);
  t->unk = valid_id(sp->unk, t->n_vocab);
  t->add_bos = sp->add_bos;
  t->add_space_prefix = sp->add_space_prefix;
  detect_chat(t, sp->chat_template);
  *out = t;
  return RA_OK;
fail:
  ra_tok_free(t);
  return rc;
}

static int32_t opt_id(const ra_gguf *g, const char *key) {
  uint32_t v;
  if (ra_gguf_get_u32(g, key, &v, NULL) != RA_OK || v > INT32_MAX) return -1;
  return (int32_t)v;
}

int ra_tok_load_gguf(const ra_gguf *g, ra_tokenizer **out, ra_error *err) {
  ra_gguf_str model, pre = {"", 0};
  int rc = ra_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
  if (rc) return rc;
  const ra_gguf_kv *tk = ra_gguf_find(g, "tokenizer.ggml.tokens");
  if (!tk || tk->type != RA_GGUF_ARRAY || tk->arr_type != RA_GGUF_STRING || tk->arr_n == 0 || tk->arr_n > (1u << 24))
    return ra_errorf(err, RA_EFORMAT, "tokenizer: tokenizer.ggml.tokens missing or not a string array");
  ra_tok_spec sp = {.n_vocab = (int32_t)tk->arr_n};
  if (ra_gguf_str_eq(model, "gpt2")) sp.model = RA_TOK_BPE;
  else if (ra_gguf_str_eq(model, "llama")) sp.model = RA_TOK_SPM;
  else return ra_errorf(err, RA_EUNSUPPORTED, "tokenizer: model '%.*s' is not supported (gpt2, llama)", (int)model.len, model.ptr);
  ra_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
  char pre_name[64];
  snprintf(pre_name, sizeof pre_name, "%.*s", (int)pre.len, pre.ptr);
  sp.pre = pre_name;
  const ra_gguf_kv *sk = ra_gguf_find(g, "tokenizer.ggml.scores");
  const ra_gguf_kv *ty = ra_gguf_find(g, "tokenizer.ggml.token_type");
  if (sk && (sk->type != RA_GGUF_ARRAY || sk->arr_n != tk->arr_n || sk->arr_type == RA_GGUF_STRING)) sk = NULL;
  if (ty && (ty->type != RA_GGUF_ARRAY || ty->arr_n != tk->arr_n || ty->arr_type == RA_GGUF_STRING)) ty = NULL;
  const ra_gguf_kv *mk = ra_gguf_find(g, "tokenizer.ggml.merges");
  if (sp.model == RA_TOK_BPE && (!mk || mk->type != RA_GGUF_ARRAY || mk->arr_type != RA_GGUF_STRING))
    return ra_errorf(err, RA_EFORMAT, "tokenizer: a gpt2 tokenizer needs tokenizer.ggml.merges");
  size_t n_merges = sp.model == RA_TOK_BPE ? (size_t)mk->arr_n : 0;
  ra_gguf_str *tokens = malloc((size_t)sp.n_vocab * sizeof(ra_gguf_str));
  ra_gguf_str *merges = malloc((2 * n_merges + 1) * sizeof(ra_gguf_str));
  float *scores = sk ? malloc((size_t)sp.n_vocab * sizeof(float)) : NULL;
  int32_t *types = ty ? malloc((size_t)sp.n_vocab * sizeof(int32_t)) : NULL;
  if (!tokens || !merges || (sk && !scores) || (ty && !types)) {
    rc = ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
    goto done;
  }
  for (int32_t i = 0; i < sp.n_vocab; i++) {
    tokens[i] = ra_gguf_arr_str(tk, (uint64_t)i);
    if (scores) scores[i] = (float)ra_gguf_arr_num(sk, (uint64_t)i);
    if (types) types[i] = (int32_t)ra_gguf_arr_num(ty, (uint64_t)i);
  }
  /* GGUF merges are "a b", split at the first space */
  for (size_t r = 0; r < n_merges; r++) {
    ra_gguf_str s = ra_gguf_arr_str(mk, r);
    const char *spc = memchr(s.ptr, ' ', s.len);
    if (!spc) {
      rc = ra_errorf(err, RA_EFORMAT, "tokenizer: merge %zu is malformed", r);
      goto done;
    }
    merges[2 * r] = (ra_gguf_str){s.ptr, (size_t)(spc - s.ptr)};
    merges[2 * r + 1] = (ra_gguf_str){spc + 1, s.len - (size_t)(spc - s.ptr) - 1};
  }
  sp.tokens = tokens;
  sp.scores = scores;
  sp.types = types;
  sp.merges = merges;
  sp.n_merges = n_merges;
  sp.bos = opt_id(g, "tokenizer.ggml.bos_token_id");
  sp.eos = opt_id(g, "tokenizer.ggml.eos_token_id");
  sp.eot = opt_id(g, "tokenizer.ggml.eot_token_id");
  sp.unk = opt_id(g, "tokenizer.ggml.unknown_token_id");
  int flag;
  sp.add_bos = sp.model == RA_TOK_SPM;
  if (ra_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag, NULL) == RA_OK) sp.add_bos = flag;
  sp.add_space_prefix = sp.model == RA_TOK_SPM;
  if (ra_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &flag, NULL) == RA_OK) sp.add_space_prefix = flag;
  ra_gguf_get_str(g, "tokenizer.chat_template", &sp.chat_template, NULL);
  rc = ra_tok_build(&sp, out, err);
done:
  free(tokens);
  free(merges);
  free(scores);
  free(types);
  return rc;
}

/* ---------- small accessors ---------- */

ra_tok_model ra_tok_kind(const ra_tokenizer *t) { return t->model; }
int32_t ra_tok_vocab(const ra_tokenizer *t) { return t->n_vocab; }
int32_t ra_tok_bos(const ra_tokenizer *t) { return t->bos; }
int32_t ra_tok_eos(const ra_tokenizer *t) { return t->eos; }
int ra_tok_add_bos(const ra_tokenizer *t) { return t->add_bos && t->bos >= 0; }

int ra_tok_is_stop(const ra_tokenizer *t, int32_t id) {
  return id >= 0 && (id == t->eos || id == t->eot || id == t->turn_end);
}

int32_t ra_tok_find(const ra_tokenizer *t, const char *text) { return vocab_lookup(t, text, strlen(text)); }

/* Appends text to the growing string *s (length *len, capacity *cap); RA_ENOMEM. */
static int str_append(char **s, size_t *len, size_t *cap, const char *text) {
  size_t n = strlen(text);
  if (*len + n + 1 > *cap) {
    size_t c = (*len + n + 1) * 2;
    char *p = realloc(*s, c);
    if (!p) return RA_ENOMEM;
    *s = p;
    *cap = c;
  }
  memcpy(*s + *len, text, n + 1);
  *len += n;
  return RA_OK;
}

int ra_tok_chat_format_messages(const ra_tokenizer *t, const ra_chat_msg *msgs, size_t n, char **out, ra_error *err) {
  if (t->chat == CHAT_NONE)
    return ra_errorf(err, RA_EUNSUPPORTED, "tokenizer: the model has no chat template this runtime knows");
  if (n == 0) return ra_errorf(err, RA_EINVAL, "tokenizer: no chat messages");
  /* each kind's turn: open role sep content close; the answer starts after open "assistant" sep */
  const char *open = "<|im_start|>", *sep = "\n", *close = "<|im_end|>\n";
  if (t->chat == CHAT_LLAMA3) open = "<|start_header_id|>", sep = "<|end_header_id|>\n\n", close = "<|eot_id|>";
  int has_system = strcmp(msgs[0].role, "system") == 0;
  if (t->chat == CHAT_LLAMA2 && (n > 2 || (n == 2) != has_system || strcmp(msgs[n - 1].role, "user") != 0))
    return ra_errorf(err, RA_EUNSUPPORTED,
                     "tokenizer: the [INST] template takes one user message (after an optional system one)");
  char *s = NULL;
  size_t len = 0, cap = 0;
  int rc = str_append(&s, &len, &cap, "");
  if (t->chat == CHAT_LLAMA2) {
    if (!rc) rc = str_append(&s, &len, &cap, "[INST] ");
    if (!rc && has_system) {
      rc = str_append(&s, &len, &cap, "<<SYS>>\n");
      if (!rc) rc = str_append(&s, &len, &cap, msgs[0].content);
      if (!rc) rc = str_append(&s, &len, &cap, "\n<</SYS>>\n\n");
    }
    if (!rc) rc = str_append(&s, &len, &cap, msgs[n - 1].content);
    if (!rc) rc = str_append(&s, &len, &cap, " [/INST]");
  } else {
    /* ChatML's templates (SmolLM2's) open with their default system prompt when none is given */
    ra_chat_msg dflt = {"system", t->chat_default_system};
    for (size_t i = has_system || !dflt.content ? 1 : 0; rc == RA_OK && i <= n; i++) {
      const ra_chat_msg *m = i == 0 ? &dflt : &msgs[i - 1];
      if (!(rc = str_append(&s, &len, &cap, open)) && !(rc = str_append(&s, &len, &cap, m->role)) &&
          !(rc = str_append(&s, &len, &cap, sep)) && !(rc = str_append(&s, &len, &cap, m->content)))
        rc = str_append(&s, &len, &cap, close);
    }
    if (!rc && !(rc = str_append(&s, &len, &cap, open)) && !(rc = str_append(&s, &len, &cap, "assistant")))
      rc = str_append(&s, &len, &cap, sep);
  }
  if (rc) {
    free(s);
    return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  }
  *out = s;
  return RA_OK;
}

int ra_tok_chat_format(const ra_tokenizer *t, const char *system, const char *user, char **out, ra_error *err) {
  ra_chat_msg m[2] = {{"system", system}, {"user", user}};
  return system ? ra_tok_chat_format_messages(t, m, 2, out, err) : ra_tok_chat_format_messages(t, m + 1, 1, out, err);
}
