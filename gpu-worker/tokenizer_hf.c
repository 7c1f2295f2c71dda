/* The tokenizer of a Hugging Face model directory: tokenizer.json's BPE model, pre-tokenizer and
 * added tokens, and tokenizer_config.json's special tokens and chat template, turned into an
 * ra_tok_spec. JSON from jansson. */
#include "tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The pre-tokenizer splits of the families tokenizer.c implements (HF's regexes, verbatim). */
#define LLAMA3_SPLIT                                                                                       \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_SPLIT                                                                                      \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *type_of(const json_t *o) { return json_string_value(json_object_get(o, "type")); }

static int is_type(const json_t *o, const char *type) {
  const char *t = type_of(o);
  return t && strcmp(t, type) == 0;
}

/* ByteLevel that applies the GPT-2 regex itself (use_regex defaults to true). */
static int is_bytelevel(const json_t *o, int use_regex) {
  const json_t *r = json_object_get(o, "use_regex");
  return is_type(o, "ByteLevel") && (r ? json_is_true(r) : 1) == use_regex;
}

/* The GGUF pre-tokenizer name of a tokenizer.json pre_tokenizer, or NULL when it is another kind. */
static const char *pre_family(const json_t *pre) {
  if (is_bytelevel(pre, 1)) return "gpt2";
  const json_t *seq = json_object_get(pre, "pretokenizers");
  if (!is_type(pre, "Sequence") || json_array_size(seq) != 2) return NULL;
  const json_t *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
  if (is_type(a, "Digits") && json_is_true(json_object_get(a, "individual_digits")) && is_bytelevel(b, 1))
    return "smollm";
  const char *re = json_string_value(json_object_get(json_object_get(a, "pattern"), "Regex"));
  if (!is_type(a, "Split") || !re || !is_bytelevel(b, 0)) return NULL;
  if (strcmp(re, LLAMA3_SPLIT) == 0) return "llama-bpe";
  if (strcmp(re, QWEN2_SPLIT) == 0) return "qwen2";
  return NULL;
}

static ra_gguf_str jstr(const json_t *s) { return (ra_gguf_str){json_string_value(s), json_string_length(s)}; }

/* A special token of tokenizer_config.json: "text" or {"content": "text", ...}; its id or -1. */
static int32_t config_token(const ra_tok_spec *sp, const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  const char *text = json_string_value(v);
  if (!text) return -1;
  for (int32_t i = 0; i < sp->n_vocab; i++)
    if (sp->tokens[i].len == strlen(text) && memcmp(sp->tokens[i].ptr, text, sp->tokens[i].len) == 0) return i;
  return -1;
}

/* chat_template: a string, or a list of {"name", "template"} (the "default" one). */
static ra_gguf_str config_template(const json_t *cfg) {
  const json_t *ct = json_object_get(cfg, "chat_template");
  if (json_is_string(ct)) return jstr(ct);
  size_t i;
  const json_t *e;
  json_array_foreach(ct, i, e) {
    const char *name = json_string_value(json_object_get(e, "name"));
    if (name && strcmp(name, "default") == 0 && json_is_string(json_object_get(e, "template")))
      return jstr(json_object_get(e, "template"));
  }
  return (ra_gguf_str){0};
}

/* Whether the post-processor's single-sequence template starts with the BOS token. */
static int post_adds_bos(const json_t *root, const ra_tok_spec *sp) {
  const json_t *pp = json_object_get(root, "post_processor");
  const json_t *first = json_array_get(json_object_get(pp, "single"), 0);
  const char *id = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
  return is_type(pp, "TemplateProcessing") && id && sp->bos >= 0 && sp->tokens[sp->bos].len == strlen(id) &&
         memcmp(sp->tokens[sp->bos].ptr, id, strlen(id)) == 0;
}

static json_t *load_json(const char *dir, const char *name, int required, ra_error *err, int *rc) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  *rc = RA_OK;
  if (access(path, F_OK) != 0) {
    if (required) *rc = ra_errorf(err, RA_ENOTFOUND, "tokenizer: %s does not exist", path);
    return NULL;
  }
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) *rc = ra_errorf(err, RA_EFORMAT, "tokenizer: %s: line %d: %s", path, je.line, je.text);
  else if (!json_is_object(j)) *rc = ra_errorf(err, RA_EFORMAT, "tokenizer: %s is not a JSON object", path);
  if (*rc) {
    json_decref(j);
    j = NULL;
  }
  return j;
}

/* Fills the token table from model.vocab and added_tokens (ids may leave holes). */
static int fill_tokens(const json_t *vocab, const json_t *added, ra_tok_spec *sp, ra_gguf_str **tokens,
                       int32_t **types, ra_error *err) {
  const char *key;
  const json_t *v;
  size_t i;
  json_int_t max_id = -1;
  json_object_foreach((json_t *)vocab, key, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
      return ra_errorf(err, RA_EFORMAT, "tokenizer: tokenizer.json: token '%s' has a bad id", key);
    if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
  }
  json_array_foreach(added, i, v) {
    json_int_t id = json_integer_value(json_object_get(v, "id"));
    if (!json_is_integer(json_object_get(v, "id")) || id < 0 || id >= (1 << 24) ||
        !json_is_string(json_object_get(v, "content")))
      return ra_errorf(err, RA_EFORMAT, "tokenizer: tokenizer.json: added_tokens[%zu] is malformed", i);
    if (id > max_id) max_id = id;
  }
  if (max_id < 0) return ra_errorf(err, RA_EFORMAT, "tokenizer: tokenizer.json has no tokens");
  sp->n_vocab = (int32_t)max_id + 1;
  *tokens = calloc((size_t)sp->n_vocab, sizeof(ra_gguf_str));
  *types = malloc((size_t)sp->n_vocab * sizeof(int32_t));
  if (!*tokens || !*types) return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  for (int32_t k = 0; k < sp->n_vocab; k++) (*types)[k] = RA_TOK_UNUSED;
  json_object_foreach((json_t *)vocab, key, v) {
    json_int_t id = json_integer_value(v);
    (*tokens)[id] = (ra_gguf_str){key, strlen(key)};
    (*types)[id] = RA_TOK_NORMAL;
  }
  json_array_foreach(added, i, v) {
    json_int_t id = json_integer_value(json_object_get(v, "id"));
    (*tokens)[id] = jstr(json_object_get(v, "content"));
    (*types)[id] = json_is_true(json_object_get(v, "special")) ? RA_TOK_CONTROL : RA_TOK_USER;
  }
  sp->tokens = *tokens;
  sp->types = *types;
  return RA_OK;
}

/* merges: ["a b", ...] (older files) or [["a", "b"], ...]. */
static int fill_merges(const json_t *merges, ra_tok_spec *sp, ra_gguf_str **out, ra_error *err) {
  size_t n = json_array_size(merges), i;
  const json_t *m;
  *out = malloc((2 * n + 1) * sizeof(ra_gguf_str));
  if (!*out) return ra_errorf(err, RA_ENOMEM, "tokenizer: out of memory");
  json_array_foreach(merges, i, m) {
    ra_gguf_str s = jstr(m);
    const char *spc = s.ptr ? memchr(s.ptr, ' ', s.len) : NULL;
    if (spc) {
      (*out)[2 * i] = (ra_gguf_str){s.ptr, (size_t)(spc - s.ptr)};
      (*out)[2 * i + 1] = (ra_gguf_str){spc + 1, s.len - (size_t)(spc - s.ptr) - 1};
    } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      (*out)[2 * i] = jstr(json_array_get(m, 0));
      (*out)[2 * i + 1] = jstr(json_array_get(m, 1));
    } else {
      return ra_errorf(err, RA_EFORMAT, "tokenizer: tokenizer.json: merge %zu is malformed", i);
    }
  }
  sp->merges = *out;
  sp->n_merges = n;
  return RA_OK;
}

int ra_tok_load_hf(const char *dir, ra_tokenizer **out, ra_error *err) {
  int rc;
  json_t *root = load_json(dir, "tokenizer.json", 1, err, &rc);
  if (!root) return rc;
  json_t *cfg = load_json(dir, "tokenizer_config.json", 0, err, &rc);
  ra_gguf_str *tokens = NULL, *merges = NULL;
  int32_t *types = NULL;
  ra_tok_spec sp = {.model = RA_TOK_BPE};
  const json_t *model = json_object_get(root, "model");
  if (rc) goto done;
  if (!is_type(model, "BPE") || json_is_true(json_object_get(model, "byte_fallback"))) {
    rc = ra_errorf(err, RA_EUNSUPPORTED, "tokenizer: %s/tokenizer.json: model '%s'%s is not supported (byte-level BPE)",
                   dir, type_of(model) ? type_of(model) : "?",
                   json_is_true(json_object_get(model, "byte_fallback")) ? " with byte_fallback" : "");
    goto done;
  }
  if (!(sp.pre = pre_family(json_object_get(root, "pre_tokenizer")))) {
    rc = ra_errorf(err, RA_EUNSUPPORTED,
                   "tokenizer: %s/tokenizer.json: pre_tokenizer is not one of ByteLevel, SmolLM's digits + ByteLevel, "
                   "Llama-3's or Qwen2's split",
                   dir);
    goto done;
  }
  const json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
  if (!json_is_object(vocab) || !json_is_array(json_object_get(model, "merges")) || (added && !json_is_array(added))) {
    rc = ra_errorf(err, RA_EFORMAT, "tokenizer: %s/tokenizer.json: model.vocab, model.merges or added_tokens malformed", dir);
    goto done;
  }
  if ((rc = fill_tokens(vocab, added, &sp, &tokens, &types, err)) ||
      (rc = fill_merges(json_object_get(model, "merges"), &sp, &merges, err)))
    goto done;
  sp.bos = config_token(&sp, cfg, "bos_token");
  sp.eos = config_token(&sp, cfg, "eos_token");
  sp.unk = config_token(&sp, cfg, "unk_token");
  sp.eot = -1;
  const json_t *ab = json_object_get(cfg, "add_bos_token");
  sp.add_bos = json_is_boolean(ab) ? json_is_true(ab) : post_adds_bos(root, &sp);
  sp.chat_template = config_template(cfg);
  rc = ra_tok_build(&sp, out, err);
done:
  free(tokens);
  free(types);
  free(merges);
  json_decref(cfg);
  json_decref(root);
  return rc;
}
