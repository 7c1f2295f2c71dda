#include "serve.h"

#include "log.h"
#include "serve_api.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct server {
  const ra_serve_config *cfg;
  ra_sched *sched;
  ra_serve_stores *stores;
  ra_serve_metrics metrics;
  atomic_int draining;
  atomic_ulong next_id;
  long started;
} server;

/* One connection's request: the body as it arrives. */
typedef struct conn {
  char *body;
  size_t len, cap;
  int too_large;
} conn;

/* A streamed response: SSE events made from the request's text as it grows. */
typedef struct stream {
  server *srv;
  ra_sched_req *req;
  ra_api_kind kind;
  char id[48];
  long created;
  int include_usage, first, finished;
  size_t sent;     /* text bytes already in events */
  char *out;       /* pending event bytes */
  size_t out_len, out_pos;
} stream;

static void count_status(server *s, unsigned status) {
  char lab[32];
  snprintf(lab, sizeof lab, "status=\"%u\"", status);
  ra_metric_add(s->metrics.requests, lab, 1);
}

static enum MHD_Result send_text(server *s, struct MHD_Connection *c, unsigned status, const char *type, char *body) {
  if (!body) {
    body = strdup("{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\"}}");
    status = 503;
    if (!body) return MHD_NO;
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  count_status(s, status);
  enum MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, const ra_api_error *e) {
  return send_text(s, c, (unsigned)e->status, "application/json", ra_api_error_json(e));
}

/* The HTTP status and error of a scheduler failure: at submit, RA_EUNAVAIL is the sequence
 * limit (429); later, every failure (a kv-store's, named in msg) is the server's (503). */
static void sched_error(int code, int at_submit, const char *msg, ra_api_error *e) {
  if (code == RA_EINVAL) ra_api_error_set(e, 400, "invalid_request_error", NULL, "%s", msg);
  else if (code == RA_EUNAVAIL && at_submit) ra_api_error_set(e, 429, "rate_limit_error", NULL, "%s", msg);
  else ra_api_error_set(e, 503, "server_error", NULL, "%s", msg);
}

static void usage_of(const ra_sched_view *v, ra_api_usage *u) {
  *u = (ra_api_usage){v->prompt_tokens, v->completion_tokens, v->cached_tokens};
}

/* Appends "data: JSON\n\n" to the stream's pending bytes (json freed). */
static int stream_event(stream *st, char *json) {
  if (!json) return -1;
  size_t n = strlen(json) + 8;
  char *p = realloc(st->out, st->out_len + n + 1);
  if (!p) {
    free(json);
    return -1;
  }
  st->out = p;
  st->out_len += (size_t)sprintf(st->out + st->out_len, "data: %s\n\n", json);
  free(json);
  return 0;
}

static int stream_raw(stream *st, const char *text) {
  size_t n = strlen(text);
  char *p = realloc(st->out, st->out_len + n + 1);
  if (!p) return -1;
  st->out = p;
  memcpy(st->out + st->out_len, text, n + 1);
  st->out_len += n;
  return 0;
}

/* Waits for the request's next text and makes its events (an SSE comment after a quiet second,
 * which also finds a client that has gone). */
static void stream_fill(stream *st) {
  ra_sched_view v;
  const char *text = ra_sched_wait(st->req, st->sent, 1000, &v);
  server *s = st->srv;
  st->out_len = st->out_pos = 0;
  if (v.err_code && v.done) {
    ra_api_error e;
    sched_error(v.err_code, 0, v.err_msg, &e);
    stream_event(st, ra_api_error_json(&e));
    stream_raw(st, "data: [DONE]\n\n");
    st->finished = 1;
    return;
  }
  if (v.visible > st->sent || v.done) {
    const char *fin = v.done ? v.finish : NULL;
    if (v.visible > st->sent || st->first || fin)
      stream_event(st, ra_api_chunk_json(st->kind, st->id, s->cfg->model_name, st->created, text + st->sent,
                                         v.visible - st->sent, fin, st->first, NULL));
    st->first = 0;
    st->sent = v.visible;
  }
  if (v.done) {
    if (st->include_usage) {
      ra_api_usage u;
      usage_of(&v, &u);
      stream_event(st, ra_api_chunk_json(st->kind, st->id, s->cfg->model_name, st->created, "", 0, NULL, 0, &u));
    }
    stream_raw(st, "data: [DONE]\n\n");
    st->finished = 1;
  }
  if (st->out_len == 0) stream_raw(st, ": waiting\n\n");
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream *st = cls;
  (void)pos;
  if (st->out_pos == st->out_len) {
    if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    stream_fill(st);
    if (st->out_len == 0) return MHD_CONTENT_READER_END_WITH_ERROR; /* out of memory */
  }
  size_t n = st->out_len - st->out_pos;
  if (n > max) n = max;
  memcpy(buf, st->out + st->out_pos, n);
  st->out_pos += n;
  return (ssize_t)n;
}

/* The response is gone: done, or the client closed the connection (the sequence is then
 * cancelled and its KV freed). */
static void stream_free(void *cls) {
  stream *st = cls;
  ra_sched_release(st->req);
  free(st->out);
  free(st);
}

/* Whether the client of c has closed its end: a non-streaming request's handler blocks until the
 * answer is ready, and libmicrohttpd notices a closed socket only when it writes, so the
 * handler peeks at the socket between waits (0 bytes: end of stream). */
static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  char b;
  const ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

static enum MHD_Result handle_generate(server *s, struct MHD_Connection *c, ra_api_kind kind, const conn *cn) {
  ra_api_error e;
  ra_api_request rq;
  if (ra_api_parse(cn->body ? cn->body : "", cn->len, kind, s->cfg->model_name, s->cfg->sched.tok, &rq, &e))
    return send_error(s, c, &e);
  ra_error err;
  ra_error_clear(&err);
  int32_t *ids = NULL;
  size_t n = 0;
  const ra_tokenizer *tok = s->cfg->sched.tok;
  /* chat text carries the template's special tokens; a completion prompt is plain text */
  int rc = ra_tok_encode(tok, rq.prompt, strlen(rq.prompt), ra_tok_add_bos(tok), kind == RA_API_CHAT, &ids, &n, &err);
  if (rc) {
    ra_api_request_free(&rq);
    ra_api_error_set(&e, 400, "invalid_request_error", "prompt", "%s", err.msg);
    return send_error(s, c, &e);
  }
  int64_t room = s->cfg->sched.max_ctx - (int64_t)n;
  rq.params.max_tokens = rq.max_tokens ? rq.max_tokens : kind == RA_API_COMPLETION ? 16 : (int)(room > 0 ? room : 1);
  if (kind == RA_API_COMPLETION && !rq.max_tokens && room > 0 && room < 16) rq.params.max_tokens = (int)room;
  if (!rq.params.seed) rq.params.seed = (uint64_t)atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull + 1;
  ra_sched_req *req = NULL;
  rc = atomic_load(&s->draining) ? ra_errorf(&err, RA_ECANCELED, "the server is shutting down")
                                 : ra_sched_submit(s->sched, ids, n, &rq.params, &req, &err);
  free(ids);
  int stream_it = rq.stream, usage = rq.include_usage;
  ra_api_request_free(&rq);
  if (rc) {
    sched_error(rc, 1, err.msg, &e);
    return send_error(s, c, &e);
  }
  char id[48];
  snprintf(id, sizeof id, "%s-%lu", kind == RA_API_CHAT ? "chatcmpl" : "cmpl", atomic_fetch_add(&s->next_id, 1));
  long created = (long)time(NULL);
  if (stream_it) {
    stream *st = calloc(1, sizeof *st);
    struct MHD_Response *r = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free) : NULL;
    if (!r) {
      free(st);
      ra_sched_release(req);
      return send_text(s, c, 503, "application/json", NULL);
    }
    *st = (stream){s, req, kind, "", created, usage, 1, 0, 0, NULL, 0, 0};
    snprintf(st->id, sizeof st->id, "%s", id);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    count_status(s, 200);
    enum MHD_Result q = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return q;
  }
  ra_sched_view v;
  const char *text;
  do {
    text = ra_sched_wait(req, 0, 200, &v);
    if (!v.done && client_gone(c)) {
      /* nobody to answer: the sequence stops and its KV is freed (as a stream's, stream_free) */
      ra_log_info("serve: %s: the client closed its connection; the request is cancelled", id);
      ra_sched_release(req);
      return MHD_NO;
    }
  } while (!v.done);
  enum MHD_Result q;
  if (v.err_code) {
    sched_error(v.err_code, 0, v.err_msg, &e);
    q = send_error(s, c, &e);
  } else {
    ra_api_usage u;
    usage_of(&v, &u);
    q = send_text(s, c, 200, "application/json",
                  ra_api_response_json(kind, id, s->cfg->model_name, created, text, v.visible, v.finish, &u));
  }
  ra_sched_release(req);
  return q;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  server *s = cls;
  (void)version;
  conn *cn = *con_cls;
  if (!cn) {
    if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
    *con_cls = cn;
    return MHD_YES;
  }
  if (*upload_size) {
    if (cn->len + *upload_size > s->cfg->max_body) cn->too_large = 1;
    if (!cn->too_large) {
      if (cn->len + *upload_size + 1 > cn->cap) {
        size_t cap = (cn->len + *upload_size + 1) * 2;
        char *b = realloc(cn->body, cap);
        if (!b) return MHD_NO;
        cn->body = b;
        cn->cap = cap;
      }
      memcpy(cn->body + cn->len, upload, *upload_size);
      cn->len += *upload_size;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  ra_api_error e;
  int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  int gen_route = strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0;
  if (cn->too_large) {
    ra_api_error_set(&e, 413, "invalid_request_error", NULL, "the request body exceeds %zu bytes (--max-body)",
                     s->cfg->max_body);
    return send_error(s, c, &e);
  }
  if (gen_route && post) {
    if (atomic_load(&s->draining)) {
      ra_api_error_set(&e, 503, "server_error", NULL, "the server is shutting down");
      return send_error(s, c, &e);
    }
    return handle_generate(s, c, strcmp(url, "/v1/chat/completions") == 0 ? RA_API_CHAT : RA_API_COMPLETION, cn);
  }
  if (get && strcmp(url, "/v1/models") == 0)
    return send_text(s, c, 200, "application/json", ra_api_models_json(s->cfg->model_name, s->started));
  const int model_route = strncmp(url, "/v1/models/", 11) == 0;
  if (get && model_route) {
    if (strcmp(url + 11, s->cfg->model_name) == 0)
      return send_text(s, c, 200, "application/json", ra_api_model_json(s->cfg->model_name, s->started));
    ra_api_error_no_model(&e, url + 11, s->cfg->model_name);
    return send_error(s, c, &e);
  }
  if (get && strcmp(url, "/health") == 0) {
    char why[400] = "";
    if (atomic_load(&s->draining)) {
      ra_api_error_set(&e, 503, "server_error", NULL, "the server is shutting down");
      return send_error(s, c, &e);
    }
    if (!ra_serve_stores_healthy(s->stores, why, sizeof why)) {
      ra_api_error_set(&e, 503, "server_error", NULL, "%s", why);
      return send_error(s, c, &e);
    }
    return send_text(s, c, 200, "application/json", strdup("{\"status\": \"ok\"}"));
  }
  if (get && strcmp(url, "/metrics") == 0) {
    ra_serve_stores_metrics(s->stores, &s->metrics);
    char *text;
    size_t len;
    if (ra_metrics_render(s->metrics.reg, &text, &len) != RA_OK) text = NULL;
    return send_text(s, c, 200, "text/plain; version=0.0.4", text);
  }
  int known = gen_route || model_route || strcmp(url, "/v1/models") == 0 || strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0;
  if (known) {
    ra_api_error_set(&e, 405, "invalid_request_error", NULL, "%s is not allowed on %s", method, url);
    return send_error(s, c, &e);
  }
  ra_api_error_set(&e, 404, "invalid_request_error", NULL, "no route %s %.200s", method, url);
  return send_error(s, c, &e);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c, (void)toe;
  conn *cn = *con_cls;
  if (!cn) return;
  free(cn->body);
  free(cn);
  *con_cls = NULL;
}

static int parse_listen(const char *spec, struct sockaddr_in *sa, ra_error *err) {
  const char *colon = strrchr(spec, ':');
  char host[64];
  if (!colon || (size_t)(colon - spec) >= sizeof host) return ra_errorf(err, RA_EINVAL, "--listen %s: not HOST:PORT", spec);
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (*end || port < 0 || port > 65535 || colon[1] == 0) return ra_errorf(err, RA_EINVAL, "--listen %s: bad port", spec);
  if (strcmp(host, "localhost") == 0) snprintf(host, sizeof host, "127.0.0.1");
  if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
    return ra_errorf(err, RA_EINVAL, "--listen %s: the host must be an IPv4 address", spec);
  return RA_OK;
}

int ra_serve_run(const ra_serve_config *cfg, ra_error *err) {
  struct sockaddr_in sa;
  int rc = parse_listen(cfg->listen, &sa, err);
  if (rc) return rc;
  server s = {.cfg = cfg, .started = (long)time(NULL)};
  atomic_init(&s.draining, 0);
  atomic_init(&s.next_id, 1);
  if (ra_serve_metrics_new(&s.metrics) != RA_OK) return ra_errorf(err, RA_ENOMEM, "serve: out of memory");
  ra_metric_set(s.metrics.device_bytes, "kind=\"weights\"", (double)cfg->weight_bytes);
  /* SIGTERM / SIGINT are taken by sigwait below: blocked in every thread started from here */
  sigset_t sigs, old;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, &old);
  signal(SIGPIPE, SIG_IGN);
  ra_sched_config sc = cfg->sched;
  sc.metrics = &s.metrics;
  struct MHD_Daemon *d = NULL;
  if ((rc = ra_serve_stores_new(cfg->sched.plan, &s.stores)) != RA_OK) rc = ra_errorf(err, rc, "serve: out of memory");
  else rc = ra_sched_new(&sc, &s.sched, err);
  if (rc == RA_OK) {
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
                         NULL, handle, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)cfg->max_conns, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                         MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!d) rc = ra_errorf(err, RA_EIO, "serve: cannot listen on %s", cfg->listen);
  }
  if (rc == RA_OK) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char host[64], addr[96];
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
    snprintf(addr, sizeof addr, "%s:%u", host, info ? (unsigned)info->port : (unsigned)ntohs(sa.sin_port));
    ra_log_info("serving %s on http://%s (mode %s, %d sequences, context %lld)", cfg->model_name, addr,
                ra_mode_name(cfg->sched.off.mode), cfg->sched.max_seqs, (long long)cfg->sched.max_ctx);
    if (cfg->ready_file) {
      char tmp[4096];
      snprintf(tmp, sizeof tmp, "%s.tmp", cfg->ready_file);
      FILE *f = fopen(tmp, "w");
      if (!f || fprintf(f, "%s\n", addr) < 0 || fclose(f) != 0 || rename(tmp, cfg->ready_file) != 0)
        rc = ra_errorf(err, RA_EIO, "serve: cannot write %s", cfg->ready_file);
    }
  }
  if (rc == RA_OK) {
    int sig = 0;
    sigwait(&sigs, &sig);
    ra_log_info("signal %d: draining %d running sequences", sig, ra_sched_live(s.sched));
    atomic_store(&s.draining, 1);
    if (ra_sched_drain(s.sched, cfg->drain_timeout_ms) != RA_OK)
      ra_log_warn("drain: sequences still running after %d ms are cancelled", cfg->drain_timeout_ms);
  }
  if (d) {
    /* the engine stops first so that every waiting stream ends, then the connections close */
    ra_sched_free(s.sched);
    s.sched = NULL;
    MHD_stop_daemon(d);
  }
  ra_sched_free(s.sched);
  ra_serve_stores_free(s.stores);
  ra_serve_metrics_free(&s.metrics);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}
