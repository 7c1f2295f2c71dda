/* A thin RPC layer over the gRPC core C API. This module is the only place that includes
 * <grpc/grpc.h>: gRPC's maintainers call the core API unstable, so the rest of the project
 * sees only these types.
 *
 * Model: every call, on either side, is driven synchronously by one thread through a private
 * completion queue. A server runs a fixed pool of call slots; each slot waits for a call,
 * runs the method's handler in its thread, and sends the status the handler returns. That
 * makes unary, client-streaming and bidirectional-streaming handlers plain sequential code:
 *
 *     static int handle_put(ra_rpc_call *call, void *ctx, ra_error *err) {
 *       ra_buf msg = {0};
 *       int rc;
 *       while ((rc = ra_rpc_call_recv(call, &msg, -1, err)) == RA_OK) { ...store chunk... }
 *       if (rc != RA_EOF) return rc;
 *       ... serialize reply ...
 *       return ra_rpc_call_send(call, reply, reply_len, err);
 *     }
 *
 * Messages are opaque bytes (serialized protobuf-c). Status codes map to gRPC's:
 *   RA_EINVAL/RA_EFORMAT -> INVALID_ARGUMENT, RA_ENOTFOUND -> NOT_FOUND,
 *   RA_ENOMEM -> RESOURCE_EXHAUSTED, RA_EEXIST -> ALREADY_EXISTS, RA_ESTATE -> FAILED_PRECONDITION,
 *   RA_EUNSUPPORTED -> UNIMPLEMENTED, RA_ETIMEDOUT -> DEADLINE_EXCEEDED,
 *   RA_EUNAVAIL -> UNAVAILABLE, RA_ECANCELED -> CANCELLED, RA_EAUTH -> UNAUTHENTICATED,
 *   RA_EPERM -> PERMISSION_DENIED, others -> INTERNAL; and back.
 *
 * Liveness and admission (server): a call first waits for its first message in one of
 * max_waiting slots (first_message_ms at most: a stream that opens and says nothing loses its
 * slot with DEADLINE_EXCEEDED), then takes one of max_calls service places or is refused at
 * once with RESOURCE_EXHAUSTED; a handler's recv (timeout -1) waits idle_ms at most for each
 * next message. HTTP/2 keepalive pings every connection (keepalive_ms): a peer that does not
 * answer within as long (frozen, its host gone) loses its calls. Clients ping the same way, so
 * a frozen server fails their calls within their keepalive instead of their deadline.
 *
 * Security: TLS on both sides from PEM text (gRPC core's SSL credentials; a server given a CA
 * requires and verifies client certificates: mutual TLS), and bearer tokens: a client sends
 * "authorization: Bearer TOKEN" with every call, a server given tokens refuses a call without
 * one of them with UNAUTHENTICATED before any handler runs. ra_rpc_call_principal names the
 * credential a call came with, for handlers that bind state to it. */
#ifndef RA_RPC_H
#define RA_RPC_H

#include "buf.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ra_rpc_server ra_rpc_server;
typedef struct ra_rpc_channel ra_rpc_channel;
typedef struct ra_rpc_call ra_rpc_call;

/* ---- server ---- */

/* A method handler. It may recv/send any number of messages; its return value (with err->msg
 * when not RA_OK) becomes the call's status. `ctx` is the pointer given at registration. */
typedef int (*ra_rpc_handler)(ra_rpc_call *call, void *ctx, ra_error *err);

/* PEM text (not file names). Server: cert + key required, ca set: mutual TLS. Client: ca (NULL:
 * gRPC's default roots), cert + key optional (a client certificate for mutual TLS). */
typedef struct ra_rpc_tls {
  const char *cert_pem;
  const char *key_pem;
  const char *ca_pem;
} ra_rpc_tls;

typedef struct ra_rpc_server_config {
  const char *listen;       /* "HOST:PORT"; port 0 picks a free port */
  int max_calls;            /* calls in service at once; more: RESOURCE_EXHAUSTED; default 64 */
  int max_waiting;          /* calls waiting for their first message; default 256 */
  size_t max_message_bytes; /* receive limit per message; default 64 MiB */
  int first_message_ms;     /* a new call's wait for its first message; default 10 s */
  int idle_ms;              /* a handler's wait for each next message (recv timeout -1); default 10 min */
  int keepalive_ms;         /* ping period and ack deadline; default 10 s */
  const ra_rpc_tls *tls;    /* NULL: plaintext */
  const char *const *tokens; /* [n_tokens] bearer tokens accepted; none: no authentication */
  size_t n_tokens;
} ra_rpc_server_config;

int ra_rpc_server_create(const ra_rpc_server_config *cfg, ra_rpc_server **out, ra_error *err);
/* Registers a handler for a full method path, e.g. "/rakv.KvStore/Attend". Before start only. */
int ra_rpc_server_add_method(ra_rpc_server *s, const char *path, ra_rpc_handler fn, void *ctx);
/* Binds and starts serving; fails with RA_EIO when the address cannot be bound. */
int ra_rpc_server_start(ra_rpc_server *s, ra_error *err);
/* The bound port (after start). */
int ra_rpc_server_port(const ra_rpc_server *s);
/* Stops taking calls, lets running calls finish for up to grace_ms, cancels the rest, and joins
 * the slot threads. Handlers blocked in recv see RA_ECANCELED. */
void ra_rpc_server_shutdown(ra_rpc_server *s, int grace_ms);
void ra_rpc_server_destroy(ra_rpc_server *s);

/* The peer's address of a server call, e.g. "ipv4:127.0.0.1:53412" (for logs). */
const char *ra_rpc_call_peer(const ra_rpc_call *call);
/* The credential of a server call: "token N" (the N-th accepted token, from 1) when the server
 * checks tokens, else "cert CN" (its client certificate's identity) under mutual TLS, else ""
 * (anyone). Handlers compare it to bind state (sessions) to the credential that made it. */
const char *ra_rpc_call_principal(const ra_rpc_call *call);

/* ---- client ---- */

typedef struct ra_rpc_channel_config {
  size_t max_message_bytes; /* 0: 64 MiB */
  int keepalive_ms;         /* ping period and ack deadline; 0: no pings */
  const ra_rpc_tls *tls;    /* NULL: plaintext */
  const char *token;        /* bearer token sent with every call; NULL: none */
  /* once a call found the connection up, a later call that finds it down fails at once with
   * RA_EUNAVAIL instead of waiting for a reconnect: for state that lives on the peer (a
   * session) and a peer that was just seen to stop answering */
  bool fail_after_loss;
} ra_rpc_channel_config;

/* Opens a channel to "HOST:PORT" (cfg NULL: the defaults). Connection is lazy: an unreachable
 * peer, or a TLS handshake that fails, shows up as RA_EUNAVAIL on the first call. */
int ra_rpc_channel_open(const char *target, const ra_rpc_channel_config *cfg, ra_rpc_channel **out,
                        ra_error *err);
const char *ra_rpc_channel_target(const ra_rpc_channel *ch);
void ra_rpc_channel_close(ra_rpc_channel *ch);

/* Starts a call of any kind. deadline_ms bounds the whole call (0: none); streams meant to live
 * for a session use 0 and give each recv a timeout instead. */
int ra_rpc_call_start(ra_rpc_channel *ch, const char *method, int64_t deadline_ms,
                      ra_rpc_call **out, ra_error *err);
/* Half-closes the client's side of the stream (no more sends). */
int ra_rpc_call_close_send(ra_rpc_call *call, ra_error *err);
/* Waits for the call's final status (after the last recv); returns it as an RA code. */
int ra_rpc_call_finish(ra_rpc_call *call, ra_error *err);
/* Cancels (if still running) and frees a client call. */
void ra_rpc_call_destroy(ra_rpc_call *call);

/* One request, one reply. */
int ra_rpc_unary(ra_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                 ra_buf *reply, int timeout_ms, ra_error *err);
/* The same call in two halves, so that one thread can keep many in flight (the server runs
 * them in parallel): start sends the request and closes the client's side; wait receives the
 * reply and the status and frees the call whatever happened. timeout_ms bounds the whole call
 * (0: none). On a start error nothing is left to wait for. */
int ra_rpc_unary_start(ra_rpc_channel *ch, const char *method, const void *req, size_t req_len,
                       int timeout_ms, ra_rpc_call **out, ra_error *err);
int ra_rpc_unary_wait(ra_rpc_call *call, ra_buf *reply, ra_error *err);

/* ---- both sides ---- */

/* Sends one message; blocks until gRPC has taken it (flow control gives back-pressure). */
int ra_rpc_call_send(ra_rpc_call *call, const void *data, size_t len, ra_error *err);
/* Receives one message into `msg` (replacing its contents). Returns RA_OK, RA_EOF at the end of
 * the peer's stream, or an error: for a client, the status the server ended the call with;
 * RA_ETIMEDOUT when timeout_ms (>= 0) passes first, after which the call is cancelled. */
int ra_rpc_call_recv(ra_rpc_call *call, ra_buf *msg, int timeout_ms, ra_error *err);

#endif
