/* The OpenAI HTTP API's JSON (jansson): requests of /v1/completions and /v1/chat/completions
 * parsed and checked into a prompt and sampling parameters, and the responses, stream chunks,
 * model list and errors written as the API shapes them. */
#ifndef RA_SERVE_API_H
#define RA_SERVE_API_H

#include "serve_sched.h"
#include "tokenizer.h"

#include <stddef.h>

typedef enum ra_api_kind { RA_API_COMPLETION, RA_API_CHAT } ra_api_kind;

typedef struct ra_api_request {
  ra_api_kind kind;
  char *prompt;        /* the text to tokenize (chat: the conversation in the model's template); malloc'ed */
  int stream, include_usage;
  int max_tokens;      /* 0: not given (the server fills the context) */
  ra_sched_params params; /* params.max_tokens unset */
} ra_api_request;

/* An OpenAI-style error: HTTP status, error.type, error.param (may be empty), error.message. */
typedef struct ra_api_error {
  int status;
  char type[48], param[48], code[48];
  char msg[512];
} ra_api_error;

typedef struct ra_api_usage {
  size_t prompt, completion, cached;
} ra_api_usage;

/* Parses body[0, len) for `kind`. model: the one model served (another is a 404). On failure
 * returns nonzero with *e filled (400 bad JSON / types / values, 404 unknown model). */
int ra_api_parse(const char *body, size_t len, ra_api_kind kind, const char *model, const ra_tokenizer *tok,
                 ra_api_request *out, ra_api_error *e);
void ra_api_request_free(ra_api_request *r);

/* Fills *e (printf-style message); returns e->status. */
int ra_api_error_set(ra_api_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The 404 of a model this server does not have (code model_not_found); returns the status. */
int ra_api_error_no_model(ra_api_error *e, const char *asked, const char *model);
/* {"error": {"message", "type", "param", "code"}}, malloc'ed (NULL: out of memory). */
char *ra_api_error_json(const ra_api_error *e);

/* A whole response: text_completion or chat.completion with usage. */
char *ra_api_response_json(ra_api_kind kind, const char *id, const char *model, long created, const char *text,
                           size_t text_len, const char *finish, const ra_api_usage *u);
/* One SSE chunk's JSON: text (delta) and finish (NULL until the last); chat's first chunk
 * carries the role (first). usage: the final usage-only chunk (choices empty), else NULL. */
char *ra_api_chunk_json(ra_api_kind kind, const char *id, const char *model, long created, const char *text,
                        size_t text_len, const char *finish, int first, const ra_api_usage *u);
/* GET /v1/models */
char *ra_api_models_json(const char *model, long created);
/* GET /v1/models/{model}: the one model's object */
char *ra_api_model_json(const char *model, long created);

#endif
