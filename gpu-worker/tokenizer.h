/* Tokenizer from GGUF metadata: byte-level BPE (tokenizer.ggml.model = "gpt2": GPT-2, SmolLM,
 * Llama-3, Qwen2 pre-tokenizers) and SentencePiece-style BPE ("llama": scores, U+2581 for
 * spaces, <0xXX> byte fallback); special tokens; a minimal chat template.
 *
 * Pre-tokenization follows the Hugging Face regexes of each "tokenizer.ggml.pre" family,
 * implemented by hand. Unicode letter/number classes come from compact range tables that
 * cover Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, CJK, kana and Hangul; other scripts'
 * letters are classified as letters when they are in the BMP's alphabetic blocks listed in
 * unicode_class(), so rare scripts may split differently from the reference implementation. */
#ifndef RA_TOKENIZER_H
#define RA_TOKENIZER_H

#include "gguf.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ra_tokenizer ra_tokenizer;

typedef enum ra_tok_model { RA_TOK_BPE = 0, RA_TOK_SPM = 1 } ra_tok_model;

/* Token types (GGUF's tokenizer.ggml.token_type values). */
enum { RA_TOK_NORMAL = 1, RA_TOK_CONTROL = 3, RA_TOK_USER = 4, RA_TOK_UNUSED = 5 };

/* A tokenizer as its files describe it; the strings need only live during ra_tok_build.
 * Ids absent from a sparse id space have an empty text and type RA_TOK_UNUSED. */
typedef struct ra_tok_spec {
  ra_tok_model model;
  const char *pre;             /* pre-tokenizer family by GGUF's name: "smollm", "llama-bpe", "qwen2", "gpt2" */
  int32_t n_vocab;
  const ra_gguf_str *tokens;   /* [n_vocab] texts */
  const int32_t *types;        /* [n_vocab] RA_TOK_*, or NULL (all normal) */
  const float *scores;         /* [n_vocab] SentencePiece scores, or NULL */
  const ra_gguf_str *merges;   /* BPE: [2 * n_merges] (left, right) texts, by rank */
  size_t n_merges;
  int32_t bos, eos, eot, unk;  /* -1: none */
  int add_bos, add_space_prefix;
  ra_gguf_str chat_template;   /* ptr NULL: none */
} ra_tok_spec;

int ra_tok_build(const ra_tok_spec *spec, ra_tokenizer **out, ra_error *err);
int ra_tok_load_gguf(const ra_gguf *g, ra_tokenizer **out, ra_error *err);
/* A Hugging Face directory's tokenizer.json (byte-level BPE) and tokenizer_config.json (special
 * tokens, add_bos_token, chat_template), read with jansson. RA_ENOTFOUND without tokenizer.json;
 * RA_EUNSUPPORTED for a model or pre-tokenizer of another kind. */
int ra_tok_load_hf(const char *dir, ra_tokenizer **out, ra_error *err);
void ra_tok_free(ra_tokenizer *t);

ra_tok_model ra_tok_kind(const ra_tokenizer *t);
int32_t ra_tok_vocab(const ra_tokenizer *t);
int32_t ra_tok_bos(const ra_tokenizer *t);
int32_t ra_tok_eos(const ra_tokenizer *t);
/* Whether the model wants BOS prepended (tokenizer.ggml.add_bos_token). */
int ra_tok_add_bos(const ra_tokenizer *t);
/* True for tokens that end generation: EOS, EOT, and the chat template's end-of-turn token. */
int ra_tok_is_stop(const ra_tokenizer *t, int32_t id);
/* The id of a token given by its exact text, or -1. */
int32_t ra_tok_find(const ra_tokenizer *t, const char *text);

/* Encodes len bytes of text. With parse_special, the text of special tokens (e.g.
 * "<|im_start|>") becomes their ids; otherwise it is tokenized as plain text. *ids is malloc'ed. */
int ra_tok_encode(const ra_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special, int32_t **ids,
                  size_t *n_ids, ra_error *err);
/* Appends the bytes of token `id` to buf (at most cap bytes); returns the number of bytes the
 * token has (which may exceed cap), or a negative RA code for a bad id. Specials give their text. */
int ra_tok_piece(const ra_tokenizer *t, int32_t id, char *buf, size_t cap);
/* Decodes ids to a malloc'ed NUL-terminated string (bytes as produced; may be invalid UTF-8 if
 * the ids split a character). */
int ra_tok_decode(const ra_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len, ra_error *err);

/* One message of a conversation: role "system", "user" or "assistant" (any role name is written
 * as given), and its text. */
typedef struct ra_chat_msg {
  const char *role, *content;
} ra_chat_msg;

/* Formats a conversation with the model's chat template, ending where the assistant's answer
 * starts. The template is recognised from tokenizer.chat_template, not executed: ChatML
 * (<|im_start|>: SmolLM2, Qwen2; the template's literal default system prompt is prepended when
 * the first message is not a system one) and Llama-3 headers take any sequence of turns;
 * Llama-2 [INST] takes one user message after an optional system one (RA_EUNSUPPORTED
 * otherwise, and for a template of another kind). Jinja logic beyond that (tools, per-message
 * conditions) is not reproduced. */
int ra_tok_chat_format_messages(const ra_tokenizer *t, const ra_chat_msg *msgs, size_t n, char **out, ra_error *err);
/* One user turn (and a system prompt: NULL takes the template's default). */
int ra_tok_chat_format(const ra_tokenizer *t, const char *system, const char *user, char **out, ra_error *err);

#endif
