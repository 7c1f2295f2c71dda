#include "serve_api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ra_api_error_set(ra_api_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
  e->status = status;
  snprintf(e->type, sizeof e->type, "%s", type);
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  e->code[0] = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return status;
}

int ra_api_error_no_model(ra_api_error *e, const char *asked, const char *model) {
  int rc = ra_api_error_set(e, 404, "invalid_request_error", "model", "The model '%.200s' does not exist; this server has '%s'",
                            asked, model);
  snprintf(e->code, sizeof e->code, "model_not_found");
  return rc;
}

static int bad(ra_api_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(ra_api_error *e, const char *param, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ra_api_error_set(e, 400, "invalid_request_error", param, "%s", msg);
}

/* A number field in [lo, hi] (integer when `integral`); absent leaves *out. */
static int get_num(json_t *o, const char *key, double lo, double hi, int integral, double *out, ra_api_error *e) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (integral ? !json_is_integer(v) : !json_is_number(v))
    return bad(e, key, "'%s' must be %s", key, integral ? "an integer" : "a number");
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi)) return bad(e, key, "'%s' is %g; it must be in [%g, %g]", key, x, lo, hi);
  *out = x;
  return 0;
}

static int get_bool(json_t *o, const char *key, int *out, ra_api_error *e) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return bad(e, key, "'%s' must be a boolean", key);
  *out = json_is_true(v);
  return 0;
}

/* What an unsupported parameter may hold and still be honoured: its OpenAI default, or nothing. */
static int off_or_zero(json_t *v) {
  return json_is_null(v) || json_is_false(v) || (json_is_number(v) && json_number_value(v) == 0);
}
static int empty(json_t *v) {
  return json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0) ||
         (json_is_object(v) && json_object_size(v) == 0) || (json_is_array(v) && json_array_size(v) == 0);
}
static int one(json_t *v) { return json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 1); }
static int plain_text(json_t *v) {
  const char *t = json_string_value(json_object_get(v, "type"));
  return json_is_null(v) || (json_is_object(v) && json_object_size(v) == 1 && t && strcmp(t, "text") == 0);
}
static int no_tool(json_t *v) {
  const char *t = json_string_value(v);
  return json_is_null(v) || (t && (strcmp(t, "none") == 0 || strcmp(t, "auto") == 0));
}

/* Parameters of the OpenAI API that change the answer and that this server does not implement:
 * a request that sets one to anything but its default is refused by name, never answered as if
 * the parameter were not there. */
static const struct {
  const char *key;
  int (*honoured)(json_t *v);
} unsupported[] = {
    {"logprobs", off_or_zero},      {"top_logprobs", off_or_zero},  {"frequency_penalty", off_or_zero},
    {"presence_penalty", off_or_zero}, {"echo", off_or_zero},       {"logit_bias", empty},
    {"suffix", empty},              {"tools", empty},               {"functions", empty},
    {"best_of", one},               {"response_format", plain_text}, {"tool_choice", no_tool},
    {"function_call", no_tool},
};

static int check_unsupported(json_t *root, ra_api_error *e) {
  for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
    json_t *v = json_object_get(root, unsupported[i].key);
    if (v && !unsupported[i].honoured(v))
      return bad(e, unsupported[i].key, "'%s' is not supported by this server (leave it out or at its default)",
                 unsupported[i].key);
  }
  return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts, joined. */
static int content_text(json_t *c, char **out, ra_api_error *e) {
  if (json_is_string(c)) return (*out = strdup(json_string_value(c))) ? 0 : ra_api_error_set(e, 503, "server_error", NULL, "out of memory");
  if (!json_is_array(c)) return bad(e, "messages", "a message's 'content' must be a string or an array of text parts");
  size_t n = 0, i;
  json_t *part;
  json_array_foreach(c, i, part) {
    json_t *t = json_object_get(part, "text");
    const char *type = json_string_value(json_object_get(part, "type"));
    if (!json_is_object(part) || !json_is_string(t) || !type || strcmp(type, "text"))
      return bad(e, "messages", "content parts must be {\"type\": \"text\", \"text\": STRING}");
    n += json_string_length(t);
  }
  char *s = malloc(n + 1);
  if (!s) return ra_api_error_set(e, 503, "server_error", NULL, "out of memory");
  s[0] = 0;
  json_array_foreach(c, i, part) strcat(s, json_string_value(json_object_get(part, "text")));
  *out = s;
  return 0;
}

static int parse_chat(json_t *root, const ra_tokenizer *tok, ra_api_request *out, ra_api_error *e) {
  json_t *msgs = json_object_get(root, "messages");
  if (!json_is_array(msgs) || json_array_size(msgs) == 0)
    return bad(e, "messages", "'messages' must be a non-empty array");
  size_t n = json_array_size(msgs);
  ra_chat_msg *m = calloc(n, sizeof *m);
  char **texts = calloc(n, sizeof *texts);
  int rc = m && texts ? 0 : ra_api_error_set(e, 503, "server_error", NULL, "out of memory");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    json_t *msg = json_array_get(msgs, i);
    json_t *role = json_object_get(msg, "role");
    if (!json_is_object(msg) || !json_is_string(role)) {
      rc = bad(e, "messages", "messages[%zu] must be an object with a string 'role'", i);
      break;
    }
    const char *r = json_string_value(role);
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer")) {
      rc = bad(e, "messages", "messages[%zu].role '%.40s' is not system, developer, user or assistant", i, r);
      break;
    }
    json_t *c = json_object_get(msg, "content");
    if (!c) {
      rc = bad(e, "messages", "messages[%zu] has no 'content'", i);
      break;
    }
    if ((rc = content_text(c, &texts[i], e))) break;
    m[i] = (ra_chat_msg){strcmp(r, "developer") ? r : "system", texts[i]};
  }
  if (rc == 0) {
    ra_error err;
    int trc = ra_tok_chat_format_messages(tok, m, n, &out->prompt, &err);
    if (trc) rc = bad(e, "messages", "%s", err.msg);
  }
  for (size_t i = 0; texts && i < n; i++) free(texts[i]);
  free(texts);
  free(m);
  return rc;
}

int ra_api_parse(const char *body, size_t len, ra_api_kind kind, const char *model, const ra_tokenizer *tok,
                 ra_api_request *out, ra_api_error *e) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) return bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  int rc = 0;
  double x;
  json_t *jm = json_object_get(root, "model");
  if (!json_is_object(root)) rc = bad(e, NULL, "the body must be a JSON object");
  else if (!json_is_string(jm)) rc = bad(e, "model", "'model' must be a string");
  else if (strcmp(json_string_value(jm), model) != 0) rc = ra_api_error_no_model(e, json_string_value(jm), model);
  ra_sched_params *p = &out->params;
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->seed = 0;
  if (!rc && (x = 1, !(rc = get_num(root, "temperature", 0, 2, 0, &x, e)))) p->temperature = (float)x;
  if (!rc && (x = 1, !(rc = get_num(root, "top_p", 0, 1, 0, &x, e)))) {
    if (x == 0) rc = bad(e, "top_p", "'top_p' must be above 0");
    p->top_p = (float)x;
  }
  const char *mt_key = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!rc && (x = 0, !(rc = get_num(root, mt_key, -1e18, 1e18, 1, &x, e)))) {
    if (json_object_get(root, mt_key) && x < 1) rc = bad(e, mt_key, "'%s' is %.0f; it must be at least 1", mt_key, x);
    out->max_tokens = x > 1 << 30 ? 1 << 30 : (int)x;
  }
  if (!rc && (x = 0, !(rc = get_num(root, "seed", -9.2e18, 9.2e18, 1, &x, e))))
    p->seed = json_object_get(root, "seed") ? (uint64_t)json_integer_value(json_object_get(root, "seed")) : 0;
  if (!rc) rc = get_num(root, "n", 1, 1, 1, &x, e);
  if (!rc) rc = check_unsupported(root, e);
  if (!rc) rc = get_bool(root, "stream", &out->stream, e);
  json_t *so = json_object_get(root, "stream_options");
  if (!rc && so && !json_is_null(so)) {
    if (!json_is_object(so)) rc = bad(e, "stream_options", "'stream_options' must be an object");
    else rc = get_bool(so, "include_usage", &out->include_usage, e);
  }
  json_t *stop = json_object_get(root, "stop");
  if (!rc && stop && !json_is_null(stop)) {
    json_t *one = json_is_string(stop) ? stop : NULL;
    size_t n = one ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
    if (!one && !json_is_array(stop)) rc = bad(e, "stop", "'stop' must be a string or an array of strings");
    else if (n > RA_SCHED_MAX_STOP) rc = bad(e, "stop", "'stop' takes at most %d strings", RA_SCHED_MAX_STOP);
    for (size_t i = 0; !rc && i < n; i++) {
      json_t *s = one ? one : json_array_get(stop, i);
      if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > RA_SCHED_MAX_STOP_LEN)
        rc = bad(e, "stop", "every stop sequence must be a string of 1 to %d bytes", RA_SCHED_MAX_STOP_LEN);
      else snprintf(p->stop[p->n_stop++], sizeof p->stop[0], "%s", json_string_value(s));
    }
  }
  if (!rc && kind == RA_API_CHAT) rc = parse_chat(root, tok, out, e);
  if (!rc && kind == RA_API_COMPLETION) {
    json_t *pr = json_object_get(root, "prompt");
    if (json_is_array(pr) && json_array_size(pr) == 1) pr = json_array_get(pr, 0);
    if (!json_is_string(pr)) rc = bad(e, "prompt", "'prompt' must be a string (or an array of one string)");
    else if (!(out->prompt = strdup(json_string_value(pr)))) rc = ra_api_error_set(e, 503, "server_error", NULL, "out of memory");
  }
  json_decref(root);
  if (rc) ra_api_request_free(out);
  return rc;
}

void ra_api_request_free(ra_api_request *r) {
  free(r->prompt);
  r->prompt = NULL;
}

static char *dump(json_t *o) {
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}

char *ra_api_error_json(const ra_api_error *e) {
  return dump(json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->msg, "type", e->type, "param",
                        e->param[0] ? e->param : NULL, "code", e->code[0] ? e->code : NULL));
}

static json_t *usage_json(const ra_api_usage *u) {
  return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt, "completion_tokens",
                   (json_int_t)u->completion, "total_tokens", (json_int_t)(u->prompt + u->completion),
                   "prompt_tokens_details", "cached_tokens", (json_int_t)u->cached);
}

/* One choice: chat's message or delta, or completion's text. */
static json_t *choice_json(ra_api_kind kind, const char *text, size_t len, const char *finish, int delta, int first) {
  json_t *t = json_stringn(text, len);
  if (!t) t = json_string(""); /* invalid UTF-8 cannot occur: the scheduler holds partial characters back */
  json_t *c;
  if (kind == RA_API_CHAT) {
    json_t *msg = delta ? (first ? json_pack("{s:s, s:o}", "role", "assistant", "content", t) : json_pack("{s:o}", "content", t))
                        : json_pack("{s:s, s:o}", "role", "assistant", "content", t);
    c = json_pack("{s:i, s:o}", "index", 0, delta ? "delta" : "message", msg);
  } else {
    c = json_pack("{s:i, s:o, s:n}", "index", 0, "text", t, "logprobs");
  }
  if (c) json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
  return c;
}

char *ra_api_response_json(ra_api_kind kind, const char *id, const char *model, long created, const char *text,
                           size_t text_len, const char *finish, const ra_api_usage *u) {
  return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
                        kind == RA_API_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)created,
                        "model", model, "choices", choice_json(kind, text, text_len, finish, 0, 0), "usage", usage_json(u)));
}

char *ra_api_chunk_json(ra_api_kind kind, const char *id, const char *model, long created, const char *text,
                        size_t text_len, const char *finish, int first, const ra_api_usage *u) {
  json_t *choices = u ? json_array() : json_pack("[o]", choice_json(kind, text, text_len, finish, 1, first));
  return dump(json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
                        kind == RA_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                        (json_int_t)created, "model", model, "choices", choices, "usage", u ? usage_json(u) : json_null()));
}

static json_t *model_json(const char *model, long created) {
  return json_pack("{s:s, s:s, s:I, s:s}", "id", model, "object", "model", "created", (json_int_t)created, "owned_by",
                   "retrieval-attention");
}

char *ra_api_models_json(const char *model, long created) {
  return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(model, created)));
}

char *ra_api_model_json(const char *model, long created) { return dump(model_json(model, created)); }
