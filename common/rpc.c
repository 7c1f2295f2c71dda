/* The one module that speaks the gRPC core C API (see rpc.h for the model).
 *
 * Every call owns a completion queue that only its driving thread polls, so "start a batch,
 * then wait for its tag" is all the machinery there is. A client call additionally keeps a
 * RECV_STATUS_ON_CLIENT batch outstanding from the start, because that is how gRPC reports a
 * failed call; waits therefore note the status tag whenever it shows up. */
#include "rpc.h"

#include "log.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RA_RPC_DEFAULT_MAX_CALLS 64
#define RA_RPC_DEFAULT_MAX_WAITING 256
#define RA_RPC_DEFAULT_MAX_MESSAGE (64u << 20)
#define RA_RPC_DEFAULT_FIRST_MESSAGE_MS 10000
#define RA_RPC_DEFAULT_IDLE_MS (10 * 60 * 1000)
#define RA_RPC_DEFAULT_KEEPALIVE_MS 10000
#define RA_RPC_PRINCIPAL_MAX 96

typedef struct ra_rpc_server ra_rpc_server;

/* Completion tags. A call has at most one batch of each kind in flight. */
enum { TAG_NEW_CALL = 1, TAG_OP, TAG_STATUS, TAG_SHUTDOWN };
#define TAG(t) ((void *)(intptr_t)(t))

struct ra_rpc_call {
  grpc_call *call;
  grpc_completion_queue *cq;
  bool is_client;
  bool md_sent;     /* initial metadata goes out with the first op */
  bool md_received; /* client: initial metadata comes in with the first recv */
  bool dead;        /* no more ops: cancelled, timed out or finished */
  grpc_metadata_array md_in;
  /* client status, filled by the RECV_STATUS_ON_CLIENT batch */
  bool status_pending;
  bool status_done;
  grpc_status_code status;
  grpc_slice status_details;
  grpc_metadata_array trailing;
  char *peer; /* gpr_malloc'd, server calls only */
  const char *target;
  const grpc_metadata *md_out; /* client: sent with the initial metadata (the bearer token) */
  size_t n_md_out;
  /* server: the first message, received before admission (serve_call), returned by the first
   * recv; the wait limit of every later recv with timeout -1; the caller's credential */
  bool has_first;
  int first_rc;
  ra_buf first;
  int idle_ms;
  char principal[RA_RPC_PRINCIPAL_MAX];
};

/* ---------------------------------------------------------------- status mapping */

/* The mapping is common/status.c's; gRPC's enum holds the same wire numbers. */
_Static_assert(GRPC_STATUS_INVALID_ARGUMENT == 3 && GRPC_STATUS_UNAUTHENTICATED == 16, "gRPC status numbers");
static grpc_status_code code_to_grpc(int code) { return (grpc_status_code)ra_status_to_grpc(code); }
static int code_from_grpc(grpc_status_code s) { return ra_status_from_grpc((int)s); }

static const char *grpc_code_name(grpc_status_code s) {
  static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN";
}

/* ---------------------------------------------------------------- helpers */

static gpr_timespec deadline_after_ms(int64_t ms) {
  if (ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static grpc_byte_buffer *buffer_from(const void *data, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer(data, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

/* Copies a received byte buffer into msg (which it replaces). */
static int buffer_to(grpc_byte_buffer *bb, ra_buf *msg) {
  size_t len = grpc_byte_buffer_length(bb);
  if (ra_buf_reserve(msg, len ? len : 1) != RA_OK) return RA_ENOMEM;
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) return RA_EFORMAT;
  size_t off = 0;
  grpc_slice s;
  while (grpc_byte_buffer_reader_next(&reader, &s)) {
    size_t n = GRPC_SLICE_LENGTH(s);
    if (off + n <= msg->cap) memcpy(msg->data + off, GRPC_SLICE_START_PTR(s), n);
    off += n;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&reader);
  if (off > msg->cap) return RA_EINTERNAL; /* decompressed larger than announced */
  msg->len = off;
  return RA_OK;
}

/* Waits until the batch tagged `tag` completes, noting the client status batch on the way.
 * Returns 1 on success, 0 on failure, -1 on timeout. */
static int call_wait(ra_rpc_call *c, int tag, gpr_timespec deadline) {
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) return -1;
    if (ev.type != GRPC_OP_COMPLETE) return 0;
    if (ev.tag == TAG(TAG_STATUS)) {
      c->status_pending = false;
      c->status_done = true;
      if (tag == TAG_STATUS) return 1;
      continue;
    }
    if (ev.tag == TAG(tag)) return ev.success ? 1 : 0;
  }
}

/* Client: the call failed; fill err from the status the call ended with. */
static int call_status_error(ra_rpc_call *c, ra_error *err) {
  c->dead = true;
  if (!c->status_done && c->status_pending) call_wait(c, TAG_STATUS, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  if (!c->status_done) return ra_errorf(err, RA_EINTERNAL, "%s: call ended without a status", c->target);
  int code = code_from_grpc(c->status);
  if (code == RA_OK) return ra_errorf(err, RA_EFORMAT, "%s: call ended early without an error", c->target);
  int n = (int)GRPC_SLICE_LENGTH(c->status_details);
  return ra_errorf(err, code, "%s: %s: %.*s", c->target, grpc_code_name(c->status), n,
                   (const char *)GRPC_SLICE_START_PTR(c->status_details));
}

static void call_free(ra_rpc_call *c) {
  if (c->call) grpc_call_unref(c->call);
  if (c->cq) {
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
  }
  grpc_metadata_array_destroy(&c->md_in);
  grpc_metadata_array_destroy(&c->trailing);
  grpc_slice_unref(c->status_details);
  if (c->peer) gpr_free(c->peer);
  ra_buf_free(&c->first);
  free(c);
}

/* The initial metadata op: a client's carries its bearer token. */
static void op_send_md(const ra_rpc_call *c, grpc_op *op) {
  op->op = GRPC_OP_SEND_INITIAL_METADATA;
  op->data.send_initial_metadata.count = c->n_md_out;
  op->data.send_initial_metadata.metadata = (grpc_metadata *)c->md_out;
}

static ra_rpc_call *call_new(bool is_client) {
  ra_rpc_call *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->is_client = is_client;
  grpc_metadata_array_init(&c->md_in);
  grpc_metadata_array_init(&c->trailing);
  c->status_details = grpc_empty_slice();
  return c;
}

/* ---------------------------------------------------------------- both sides */

int ra_rpc_call_send(ra_rpc_call *c, const void *data, size_t len, ra_error *err) {
  if (c->dead) return ra_errorf(err, RA_ECANCELED, "%s: send on a finished call", c->target);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!c->md_sent) op_send_md(c, &ops[n++]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  grpc_byte_buffer *bb = buffer_from(data, len);
  ops[n++].data.send_message.send_message = bb;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, TAG(TAG_OP), NULL);
  int ok = e == GRPC_CALL_OK ? call_wait(c, TAG_OP, gpr_inf_future(GPR_CLOCK_MONOTONIC)) : 0;
  grpc_byte_buffer_destroy(bb);
  c->md_sent = true;
  if (e != GRPC_CALL_OK) return ra_errorf(err, RA_EINTERNAL, "%s: start send: grpc error %d", c->target, e);
  if (ok == 1) return RA_OK;
  if (c->is_client) return call_status_error(c, err);
  c->dead = true;
  return ra_errorf(err, RA_ECANCELED, "send to %s failed: call cancelled", c->peer ? c->peer : "peer");
}

int ra_rpc_call_recv(ra_rpc_call *c, ra_buf *msg, int timeout_ms, ra_error *err) {
  if (c->dead) return ra_errorf(err, RA_ECANCELED, "%s: recv on a finished call", c->target);
  if (c->has_first) {
    c->has_first = false;
    if (c->first_rc != RA_OK) return c->first_rc;
    ra_buf t = *msg;
    *msg = c->first;
    c->first = t;
    return RA_OK;
  }
  if (!c->is_client && timeout_ms < 0) timeout_ms = c->idle_ms;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  grpc_byte_buffer *bb = NULL;
  if (c->is_client && !c->md_received) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c->md_in;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &bb;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, TAG(TAG_OP), NULL);
  if (e != GRPC_CALL_OK) return ra_errorf(err, RA_EINTERNAL, "%s: start recv: grpc error %d", c->target, e);
  c->md_received = true;
  int ok = call_wait(c, TAG_OP, deadline_after_ms(timeout_ms));
  if (ok < 0) {
    /* Cancel, then collect the recv batch so that no op is left referencing `bb`. A server call
     * tells the peer why its slot was taken back. */
    char why[96];
    snprintf(why, sizeof why, c->is_client ? "client timeout" : "no message within %d ms: the call's slot is taken back",
             timeout_ms);
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, why, NULL);
    call_wait(c, TAG_OP, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    if (bb) grpc_byte_buffer_destroy(bb);
    c->dead = true;
    if (!c->is_client)
      return ra_errorf(err, RA_ETIMEDOUT, "%s: no message within %d ms", c->target, timeout_ms);
    return ra_errorf(err, RA_ETIMEDOUT, "%s: no reply within %d ms", c->target, timeout_ms);
  }
  if (ok == 1 && bb) {
    int rc = buffer_to(bb, msg);
    grpc_byte_buffer_destroy(bb);
    if (rc != RA_OK) return ra_errorf(err, rc, "%s: cannot read message: %s", c->target, ra_strerror(rc));
    return RA_OK;
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  if (c->is_client) {
    /* No message: the server has ended the call; its status says whether that was an error. */
    if (!c->status_done) call_wait(c, TAG_STATUS, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    if (c->status_done && c->status == GRPC_STATUS_OK) return RA_EOF;
    return call_status_error(c, err);
  }
  if (ok == 1 && !grpc_call_failed_before_recv_message(c->call)) return RA_EOF;
  c->dead = true;
  return ra_errorf(err, RA_ECANCELED, "call from %s cancelled", c->peer ? c->peer : "peer");
}

/* ---------------------------------------------------------------- server */

typedef struct rpc_method {
  char *path;
  ra_rpc_handler fn;
  void *ctx;
} rpc_method;

typedef struct slot {
  ra_rpc_server *server;
  grpc_completion_queue *cq;
  pthread_t thread;
  bool started;
} slot;

struct ra_rpc_server {
  grpc_server *server;
  grpc_completion_queue *shutdown_cq;
  char *listen;
  int port;
  size_t max_message;
  rpc_method *methods;
  size_t n_methods;
  slot *slots;
  int n_slots;          /* max_calls + max_waiting threads */
  int max_calls;
  atomic_int in_service; /* calls admitted and not finished */
  int first_message_ms, idle_ms, keepalive_ms;
  char *cert_pem, *key_pem, *ca_pem; /* TLS (NULL: plaintext) */
  char **tokens;
  size_t n_tokens;
  bool running;
};

static const rpc_method *find_method(const ra_rpc_server *s, grpc_slice path) {
  size_t len = GRPC_SLICE_LENGTH(path);
  for (size_t i = 0; i < s->n_methods; i++)
    if (strlen(s->methods[i].path) == len && memcmp(s->methods[i].path, GRPC_SLICE_START_PTR(path), len) == 0)
      return &s->methods[i];
  return NULL;
}

/* Sends the final status of a server call (and its initial metadata, if no message went out). */
static void server_finish(ra_rpc_call *c, int code, const char *message) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  int cancelled = 0;
  if (!c->md_sent) op_send_md(c, &ops[n++]);
  grpc_slice details = grpc_slice_from_copied_string(message ? message : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code_to_grpc(code);
  ops[n++].data.send_status_from_server.status_details = &details;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &cancelled;
  if (grpc_call_start_batch(c->call, ops, n, TAG(TAG_OP), NULL) == GRPC_CALL_OK)
    call_wait(c, TAG_OP, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  grpc_slice_unref(details);
}

/* Equal without an early exit, so the time of a refusal says nothing about the token. */
static bool same_secret(const char *a, size_t alen, const char *b, size_t blen) {
  unsigned diff = alen != blen;
  for (size_t i = 0; i < alen; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (blen ? blen : 1)];
  return diff == 0;
}

/* Who the call comes from (ra_rpc_call_principal) or RA_EAUTH when the server checks tokens and
 * the call's "authorization: Bearer ..." names none of them. */
static int call_authenticate(const ra_rpc_server *s, ra_rpc_call *c, const grpc_metadata_array *md, ra_error *err) {
  if (s->n_tokens) {
    static const char prefix[] = "Bearer ";
    const size_t np = sizeof prefix - 1;
    for (size_t i = 0; i < md->count; i++) {
      if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") != 0) continue;
      const char *v = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
      size_t vl = GRPC_SLICE_LENGTH(md->metadata[i].value);
      if (vl <= np || memcmp(v, prefix, np) != 0) continue;
      for (size_t t = 0; t < s->n_tokens; t++)
        if (same_secret(v + np, vl - np, s->tokens[t], strlen(s->tokens[t]))) {
          snprintf(c->principal, sizeof c->principal, "token %zu", t + 1);
          return RA_OK;
        }
    }
    return ra_errorf(err, RA_EAUTH, "a valid bearer token is required (authorization: Bearer TOKEN)");
  }
  if (s->ca_pem) {
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    grpc_auth_property_iterator it = grpc_auth_context_peer_identity(ctx);
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p) snprintf(c->principal, sizeof c->principal, "cert %.*s", (int)p->value_length, p->value);
    grpc_auth_context_release(ctx);
  }
  return RA_OK;
}

/* Admission: the first message (or the end of the stream) within first_message_ms, then one of
 * max_calls service places. */
static int call_admit(ra_rpc_server *s, ra_rpc_call *c, ra_error *err) {
  c->first_rc = ra_rpc_call_recv(c, &c->first, s->first_message_ms, err);
  if (c->first_rc != RA_OK && c->first_rc != RA_EOF) return c->first_rc;
  c->has_first = true;
  if (atomic_fetch_add(&s->in_service, 1) >= s->max_calls) {
    atomic_fetch_sub(&s->in_service, 1);
    return ra_errorf(err, RA_ENOMEM, "the server is serving %d calls, its most (--max-calls); try again later",
                     s->max_calls);
  }
  return RA_OK;
}

static void serve_call(ra_rpc_server *s, grpc_completion_queue *cq, grpc_call *gcall,
                       const grpc_call_details *details, const grpc_metadata_array *md) {
  ra_rpc_call *c = call_new(false);
  if (!c) {
    grpc_call_cancel_with_status(gcall, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
    grpc_call_unref(gcall);
    return;
  }
  c->call = gcall;
  c->cq = cq; /* the slot's queue: not owned by the call */
  c->peer = grpc_call_get_peer(gcall);
  c->target = c->peer;
  c->idle_ms = s->idle_ms;
  ra_error err;
  ra_error_clear(&err);
  int code, admitted = 0;
  const rpc_method *m = find_method(s, details->method);
  if ((code = call_authenticate(s, c, md, &err)) != RA_OK) {
  } else if (!m) {
    int len = (int)GRPC_SLICE_LENGTH(details->method);
    char path[128];
    ra_log_escape((const char *)GRPC_SLICE_START_PTR(details->method), (size_t)len, path, sizeof path);
    code = ra_errorf(&err, RA_EUNSUPPORTED, "unknown method %s", path);
  } else if ((code = call_admit(s, c, &err)) == RA_OK) {
    admitted = 1;
    code = m->fn(c, m->ctx, &err);
    if (code == RA_EOF) code = RA_OK;
    if (code != RA_OK && err.msg[0] == '\0')
      snprintf(err.msg, sizeof err.msg, "%s", ra_strerror(code));
  }
  if (code != RA_OK && code != RA_ECANCELED)
    ra_log_debug("%s from %s: %s: %s", m ? m->path : "call", c->peer, ra_status_name(code), err.msg);
  server_finish(c, code, code == RA_OK ? "" : err.msg);
  if (admitted) atomic_fetch_sub(&s->in_service, 1);
  c->cq = NULL;
  call_free(c);
}

static void *slot_main(void *arg) {
  slot *sl = arg;
  ra_rpc_server *s = sl->server;
  for (;;) {
    grpc_call *gcall = NULL;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_call_details_init(&details);
    grpc_metadata_array_init(&md);
    grpc_call_error e = grpc_server_request_call(s->server, &gcall, &details, &md, sl->cq, sl->cq,
                                                 TAG(TAG_NEW_CALL));
    bool got = false;
    if (e == GRPC_CALL_OK) {
      grpc_event ev;
      do {
        ev = grpc_completion_queue_next(sl->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
      } while (ev.type == GRPC_OP_COMPLETE && ev.tag != TAG(TAG_NEW_CALL));
      got = ev.type == GRPC_OP_COMPLETE && ev.success;
    }
    if (got) serve_call(s, sl->cq, gcall, &details, &md);
    else if (gcall) grpc_call_unref(gcall);
    grpc_call_details_destroy(&details);
    grpc_metadata_array_destroy(&md);
    if (!got) break; /* the server is shutting down */
  }
  return NULL;
}

/* What create copied from the config (and the server itself). */
static void server_free_config(ra_rpc_server *s) {
  for (size_t i = 0; i < s->n_tokens; i++) free(s->tokens[i]);
  free(s->tokens);
  free(s->cert_pem);
  free(s->key_pem);
  free(s->ca_pem);
  free(s->listen);
  free(s);
}

int ra_rpc_server_create(const ra_rpc_server_config *cfg, ra_rpc_server **out, ra_error *err) {
  *out = NULL;
  if (!cfg->listen || !strchr(cfg->listen, ':'))
    return ra_errorf(err, RA_EINVAL, "listen address '%s' is not HOST:PORT", cfg->listen ? cfg->listen : "");
  ra_rpc_server *s = calloc(1, sizeof *s);
  if (!s || !(s->listen = strdup(cfg->listen))) {
    free(s);
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
  s->max_calls = cfg->max_calls > 0 ? cfg->max_calls : RA_RPC_DEFAULT_MAX_CALLS;
  s->n_slots = s->max_calls + (cfg->max_waiting > 0 ? cfg->max_waiting : RA_RPC_DEFAULT_MAX_WAITING);
  s->max_message = cfg->max_message_bytes ? cfg->max_message_bytes : RA_RPC_DEFAULT_MAX_MESSAGE;
  s->first_message_ms = cfg->first_message_ms > 0 ? cfg->first_message_ms : RA_RPC_DEFAULT_FIRST_MESSAGE_MS;
  s->idle_ms = cfg->idle_ms > 0 ? cfg->idle_ms : RA_RPC_DEFAULT_IDLE_MS;
  s->keepalive_ms = cfg->keepalive_ms > 0 ? cfg->keepalive_ms : RA_RPC_DEFAULT_KEEPALIVE_MS;
  int ok = 1;
  if (cfg->tls) {
    if (!cfg->tls->cert_pem || !cfg->tls->key_pem) ok = -1;
    else if (!(s->cert_pem = strdup(cfg->tls->cert_pem)) || !(s->key_pem = strdup(cfg->tls->key_pem)) ||
             (cfg->tls->ca_pem && !(s->ca_pem = strdup(cfg->tls->ca_pem))))
      ok = 0;
  }
  if (ok == 1 && cfg->n_tokens) {
    if (!(s->tokens = calloc(cfg->n_tokens, sizeof *s->tokens))) ok = 0;
    for (size_t i = 0; ok == 1 && i < cfg->n_tokens; i++, s->n_tokens++)
      if (!cfg->tokens[i][0]) ok = -2;
      else if (!(s->tokens[i] = strdup(cfg->tokens[i]))) ok = 0;
  }
  if (ok != 1) {
    server_free_config(s);
    if (ok == -1) return ra_errorf(err, RA_EINVAL, "TLS needs a certificate and its key");
    if (ok == -2) return ra_errorf(err, RA_EINVAL, "an empty bearer token");
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
  grpc_init();
  *out = s;
  return RA_OK;
}

int ra_rpc_server_add_method(ra_rpc_server *s, const char *path, ra_rpc_handler fn, void *ctx) {
  if (s->running) return RA_ESTATE;
  rpc_method *m = realloc(s->methods, (s->n_methods + 1) * sizeof *m);
  if (!m) return RA_ENOMEM;
  s->methods = m;
  if (!(m[s->n_methods].path = strdup(path))) return RA_ENOMEM;
  m[s->n_methods].fn = fn;
  m[s->n_methods].ctx = ctx;
  s->n_methods++;
  return RA_OK;
}

int ra_rpc_server_start(ra_rpc_server *s, ra_error *err) {
  if (s->running) return ra_errorf(err, RA_ESTATE, "server already started");
  int max = s->max_message > INT32_MAX ? INT32_MAX : (int)s->max_message;
  /* SO_REUSEPORT is on by default in gRPC: two stores would then share one port silently.
   * Keepalive: the server pings every connection, idle or not, and drops one whose ack does not
   * come within as long (its calls are cancelled, their slots freed); it accepts the clients'
   * pings at any rate (they ping at their own keepalive: a frozen store is noticed that way). */
  grpc_arg args[] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = max},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = max},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = s->keepalive_ms},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = s->keepalive_ms},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, .value.integer = 1},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, .value.integer = 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, .value.integer = 100},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PING_STRIKES, .value.integer = 0},
  };
  grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0], .args = args};
  s->server = grpc_server_create(&cargs, NULL);
  s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
  if (!s->server || !s->slots) return ra_errorf(err, RA_ENOMEM, "out of memory");
  s->shutdown_cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->shutdown_cq, NULL);
  for (int i = 0; i < s->n_slots; i++) {
    s->slots[i].server = s;
    s->slots[i].cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->slots[i].cq, NULL);
  }
  grpc_server_credentials *creds;
  if (s->cert_pem) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = s->key_pem, .cert_chain = s->cert_pem};
    creds = grpc_ssl_server_credentials_create_ex(
        s->ca_pem, &pair, 1,
        s->ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!creds) return ra_errorf(err, RA_EINVAL, "the TLS certificate, key or CA is not valid PEM");
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  s->port = grpc_server_add_http2_port(s->server, s->listen, creds);
  grpc_server_credentials_release(creds);
  if (s->port <= 0)
    return ra_errorf(err, RA_EIO, "cannot listen on %s (address in use or invalid%s)", s->listen,
                     s->cert_pem ? ", or the TLS certificate and key do not load" : "");
  grpc_server_start(s->server);
  s->running = true;
  for (int i = 0; i < s->n_slots; i++) {
    if (pthread_create(&s->slots[i].thread, NULL, slot_main, &s->slots[i]) != 0) {
      ra_rpc_server_shutdown(s, 0);
      return ra_errorf(err, RA_ENOMEM, "cannot start server thread %d", i);
    }
    s->slots[i].started = true;
  }
  return RA_OK;
}

int ra_rpc_server_port(const ra_rpc_server *s) { return s->port; }

const char *ra_rpc_call_peer(const ra_rpc_call *c) { return c->peer ? c->peer : ""; }
const char *ra_rpc_call_principal(const ra_rpc_call *c) { return c->principal; }

void ra_rpc_server_shutdown(ra_rpc_server *s, int grace_ms) {
  if (!s->running) return;
  s->running = false;
  grpc_server_shutdown_and_notify(s->server, s->shutdown_cq, TAG(TAG_SHUTDOWN));
  grpc_event ev = grpc_completion_queue_next(s->shutdown_cq, deadline_after_ms(grace_ms), NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT) {
    grpc_server_cancel_all_calls(s->server);
    grpc_completion_queue_next(s->shutdown_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  }
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].started) pthread_join(s->slots[i].thread, NULL);
}

static void cq_drain_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

void ra_rpc_server_destroy(ra_rpc_server *s) {
  if (!s) return;
  if (s->running) ra_rpc_server_shutdown(s, 0);
  if (s->server) {
    if (!s->shutdown_cq) s->shutdown_cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_destroy(s->server);
  }
  for (int i = 0; s->slots && i < s->n_slots; i++)
    if (s->slots[i].cq) cq_drain_destroy(s->slots[i].cq);
  if (s->shutdown_cq) cq_drain_destroy(s->shutdown_cq);
  for (size_t i = 0; i < s->n_methods; i++) free(s->methods[i].path);
  free(s->methods);
  free(s->slots);
  server_free_config(s);
  grpc_shutdown();
}

/* ---------------------------------------------------------------- client */

/* gRPC core reads a socket only while some thread polls (waits on a completion queue). A worker
 * that starts calls and then computes for a second polls nothing, so the acks of its keepalive
 * pings sit unread and the watchdog closes healthy connections (seen on a 2-core host: both
 * stores' connections dropped mid-prefill). One thread per process, alive while any channel is
 * open, polls once every RA_RPC_POLL_PERIOD_MS without waiting: a caller that waits for its
 * reply keeps being the one woken by it (a poller blocked in epoll would take the wake-up and
 * hand it over, a thread switch on every decode RPC). */
#define RA_RPC_POLL_PERIOD_MS 50

static struct {
  pthread_mutex_t life; /* orders acquire and release (a release joins with it held) */
  pthread_mutex_t lock; /* stop, with wake */
  pthread_cond_t wake;
  int n_channels;
  bool stop;
  grpc_completion_queue *cq;
  pthread_t thread;
} g_poller = {.life = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static void *poller_main(void *arg) {
  grpc_completion_queue *cq = arg;
  pthread_mutex_lock(&g_poller.lock);
  while (!g_poller.stop) {
    pthread_mutex_unlock(&g_poller.lock);
    grpc_completion_queue_next(cq, gpr_now(GPR_CLOCK_MONOTONIC), NULL); /* one poll, no wait */
    pthread_mutex_lock(&g_poller.lock);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += RA_RPC_POLL_PERIOD_MS * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
      t.tv_sec++;
      t.tv_nsec -= 1000000000L;
    }
    if (!g_poller.stop) pthread_cond_timedwait(&g_poller.wake, &g_poller.lock, &t);
  }
  pthread_mutex_unlock(&g_poller.lock);
  return NULL;
}

static int poller_acquire(void) {
  int rc = RA_OK;
  pthread_mutex_lock(&g_poller.life);
  if (g_poller.n_channels == 0) {
    g_poller.cq = grpc_completion_queue_create_for_next(NULL);
    g_poller.stop = false;
    if (pthread_create(&g_poller.thread, NULL, poller_main, g_poller.cq) != 0) {
      grpc_completion_queue_destroy(g_poller.cq);
      rc = RA_ENOMEM;
    }
  }
  if (rc == RA_OK) g_poller.n_channels++;
  pthread_mutex_unlock(&g_poller.life);
  return rc;
}

static void poller_release(void) {
  pthread_mutex_lock(&g_poller.life);
  if (--g_poller.n_channels == 0) {
    pthread_mutex_lock(&g_poller.lock);
    g_poller.stop = true;
    pthread_cond_signal(&g_poller.wake);
    pthread_mutex_unlock(&g_poller.lock);
    pthread_join(g_poller.thread, NULL);
    cq_drain_destroy(g_poller.cq);
  }
  pthread_mutex_unlock(&g_poller.life);
}

struct ra_rpc_channel {
  grpc_channel *channel;
  char *target;
  grpc_metadata auth; /* "authorization: Bearer TOKEN", sent with every call */
  size_t n_auth;
  bool fail_after_loss;
  atomic_bool was_ready; /* a call found the connection up */
};

int ra_rpc_channel_open(const char *target, const ra_rpc_channel_config *cfg, ra_rpc_channel **out,
                        ra_error *err) {
  *out = NULL;
  ra_rpc_channel_config d = {0};
  if (cfg) d = *cfg;
  if (!target || !strchr(target, ':'))
    return ra_errorf(err, RA_EINVAL, "store address '%s' is not HOST:PORT", target ? target : "");
  if (d.tls && (!d.tls->cert_pem) != (!d.tls->key_pem))
    return ra_errorf(err, RA_EINVAL, "a client certificate needs its key, and a key its certificate");
  ra_rpc_channel *ch = calloc(1, sizeof *ch);
  if (!ch || !(ch->target = strdup(target))) {
    free(ch);
    return ra_errorf(err, RA_ENOMEM, "out of memory");
  }
  size_t mm = d.max_message_bytes ? d.max_message_bytes : RA_RPC_DEFAULT_MAX_MESSAGE;
  int max = mm > INT32_MAX ? INT32_MAX : (int)mm;
  /* Pings every keepalive_ms, even while a call only waits (a long BuildIndex), and fails the
   * connection's calls when an ack does not come within as long: a frozen store is noticed
   * within about twice keepalive_ms whatever the calls' deadlines. */
  int ka = d.keepalive_ms > 0 ? d.keepalive_ms : INT32_MAX;
  grpc_arg args[] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = max},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = max},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = ka},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = d.keepalive_ms > 0 ? ka : 20000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, .value.integer = d.keepalive_ms > 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, .value.integer = 0},
      /* an idle channel stays connected: its going down means the peer did (fail_after_loss) */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, .value.integer = INT32_MAX},
  };
  grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0], .args = args};
  grpc_init();
  if (poller_acquire() != RA_OK) {
    free(ch->target);
    free(ch);
    grpc_shutdown();
    return ra_errorf(err, RA_ENOMEM, "cannot start the RPC poller thread");
  }
  ch->fail_after_loss = d.fail_after_loss;
  grpc_channel_credentials *creds;
  if (d.tls) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = d.tls->key_pem, .cert_chain = d.tls->cert_pem};
    creds = grpc_ssl_credentials_create(d.tls->ca_pem, d.tls->cert_pem ? &pair : NULL, NULL, NULL);
  } else {
    creds = grpc_insecure_credentials_create();
  }
  ch->channel = creds ? grpc_channel_create(target, creds, &cargs) : NULL;
  if (creds) grpc_channel_credentials_release(creds);
  if (!ch->channel) {
    free(ch->target);
    free(ch);
    poller_release();
    grpc_shutdown();
    return ra_errorf(err, RA_EINVAL, "cannot create a channel to '%s'%s", target, d.tls ? " (TLS settings)" : "");
  }
  if (d.token) {
    size_t n = strlen(d.token);
    char *v = malloc(n + 8);
    if (v) {
      memcpy(v, "Bearer ", 7);
      memcpy(v + 7, d.token, n + 1);
      ch->auth.key = grpc_slice_from_static_string("authorization");
      ch->auth.value = grpc_slice_from_copied_string(v);
      ch->n_auth = 1;
      free(v);
    } else {
      ra_rpc_channel_close(ch);
      return ra_errorf(err, RA_ENOMEM, "out of memory");
    }
  }
  *out = ch;
  return RA_OK;
}

const char *ra_rpc_channel_target(const ra_rpc_channel *ch) { return ch->target; }

void ra_rpc_channel_close(ra_rpc_channel *ch) {
  if (!ch) return;
  grpc_channel_destroy(ch->channel);
  if (ch->n_auth) grpc_slice_unref(ch->auth.value);
  free(ch->target);
  free(ch);
  poller_release();
  grpc_shutdown();
}

int ra_rpc_call_start(ra_rpc_channel *ch, const char *method, int64_t deadline_ms,
                      ra_rpc_call **out, ra_error *err) {
  *out = NULL;
  if (ch->fail_after_loss) {
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch->channel, 0);
    if (st == GRPC_CHANNEL_READY) atomic_store(&ch->was_ready, true);
    else if (atomic_load(&ch->was_ready))
      return ra_errorf(err, RA_EUNAVAIL, "%s: UNAVAILABLE: the connection was lost (the peer stopped answering or closed it)",
                       ch->target);
  }
  ra_rpc_call *c = call_new(true);
  if (!c) return ra_errorf(err, RA_ENOMEM, "out of memory");
  c->target = ch->target;
  c->md_out = ch->n_auth ? &ch->auth : NULL;
  c->n_md_out = ch->n_auth;
  c->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_slice path = grpc_slice_from_copied_string(method);
  c->call = grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, path, NULL,
                                     deadline_after_ms(deadline_ms > 0 ? deadline_ms : -1), NULL);
  grpc_slice_unref(path);
  if (!c->call) {
    call_free(c);
    return ra_errorf(err, RA_EINTERNAL, "%s: cannot create call %s", ch->target, method);
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &c->trailing;
  op.data.recv_status_on_client.status = &c->status;
  op.data.recv_status_on_client.status_details = &c->status_details;
  if (grpc_call_start_batch(c->call, &op, 1, TAG(TAG_STATUS), NULL) != GRPC_CALL_OK) {
    call_free(c);
    return ra_errorf(err, RA_EINTERNAL, "%s: cannot start call %s", ch->target, method);
  }
  c->status_pending = true;
  *out = c;
  return RA_OK;
}

int ra_rpc_call_close_send(ra_rpc_call *c, ra_error *err) {
  if (c->dead) return ra_errorf(err, RA_ECANCELED, "%s: close on a finished call", c->target);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!c->md_sent) op_send_md(c, &ops[n++]);
  ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (grpc_call_start_batch(c->call, ops, n, TAG(TAG_OP), NULL) != GRPC_CALL_OK)
    return ra_errorf(err, RA_EINTERNAL, "%s: cannot half-close", c->target);
  c->md_sent = true;
  if (call_wait(c, TAG_OP, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 1) return call_status_error(c, err);
  return RA_OK;
}

int ra_rpc_call_finish(ra_rpc_call *c, ra_error *err) {
  if (!c->status_done && c->status_pending)
    call_wait(c, TAG_STATUS, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  c->dead = true;
  if (c->status_done && c->status == GRPC_STATUS_OK) return RA_OK;
  return call_status_error(c, err);
}

void ra_rpc_call_destroy(ra_rpc_call *c) {
  if (!c) return;
  if (c->status_pending) {
    grpc_call_cancel(c->call, NULL);
    call_wait(c, TAG_STATUS, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  }
  call_free(c);
}

int ra_rpc_unary_start(ra_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                       int timeout_ms, ra_rpc_call **out, ra_error *err) {
  ra_rpc_call *c;
  int rc = ra_rpc_call_start(ch, method, timeout_ms > 0 ? timeout_ms : 0, &c, err);
  if (rc != RA_OK) return rc;
  if ((rc = ra_rpc_call_send(c, req, req_len, err)) != RA_OK || (rc = ra_rpc_call_close_send(c, err)) != RA_OK) {
    ra_rpc_call_destroy(c);
    return rc;
  }
  *out = c;
  return RA_OK;
}

int ra_rpc_unary_wait(ra_rpc_call *c, ra_buf *reply, ra_error *err) {
  int rc = ra_rpc_call_recv(c, reply, -1, err);
  if (rc == RA_EOF) rc = ra_errorf(err, RA_EFORMAT, "%s: the call returned no reply", c->target);
  if (rc == RA_OK) rc = ra_rpc_call_finish(c, err);
  ra_rpc_call_destroy(c);
  return rc;
}

int ra_rpc_unary(ra_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                 ra_buf *reply, int timeout_ms, ra_error *err) {
  ra_rpc_call *c;
  int rc = ra_rpc_call_start(ch, method, timeout_ms > 0 ? timeout_ms : 0, &c, err);
  if (rc != RA_OK) return rc;
  /* One batch for the whole exchange: a unary call costs a single wake-up. */
  grpc_byte_buffer *out_bb = buffer_from(req, req_len), *in_bb = NULL;
  grpc_op ops[5];
  memset(ops, 0, sizeof ops);
  op_send_md(c, &ops[0]);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_in;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in_bb;
  if (grpc_call_start_batch(c->call, ops, 5, TAG(TAG_OP), NULL) != GRPC_CALL_OK) {
    rc = ra_errorf(err, RA_EINTERNAL, "%s: cannot start %s", ch->target, method);
  } else {
    c->md_sent = c->md_received = true;
    int ok = call_wait(c, TAG_OP, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    rc = ra_rpc_call_finish(c, err);
    if (rc == RA_OK && (ok != 1 || !in_bb))
      rc = ra_errorf(err, RA_EFORMAT, "%s: %s returned no reply", ch->target, method);
    if (rc == RA_OK) {
      rc = buffer_to(in_bb, reply);
      if (rc != RA_OK) ra_errorf(err, rc, "%s: cannot read reply", ch->target);
    }
  }
  grpc_byte_buffer_destroy(out_bb);
  if (in_bb) grpc_byte_buffer_destroy(in_bb);
  ra_rpc_call_destroy(c);
  return rc;
}
