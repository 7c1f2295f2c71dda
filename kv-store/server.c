#include "server.h"

#include <stdlib.h>

typedef int (*unary_fn)(kvs_service *, const kvs_caller *, const uint8_t *, size_t, ra_buf *, ra_error *);

/* The service's view of who made the call. */
static kvs_caller caller_of(const ra_rpc_call *call) {
  return (kvs_caller){.principal = ra_rpc_call_principal(call), .peer = ra_rpc_call_peer(call)};
}

/* Counts transport failures (a peer that went away mid-call) as errors, like bad requests. */
static int transport_failed(kvs_service *svc, int rc) {
  kvs_service_count_error(svc);
  return rc;
}

static int serve_unary(ra_rpc_call *call, kvs_service *svc, unary_fn fn, ra_error *err) {
  ra_buf in = {0}, out = {0};
  int rc = ra_rpc_call_recv(call, &in, -1, err);
  if (rc == RA_EOF) {
    rc = ra_errorf(err, RA_EINVAL, "the call carried no request message");
    kvs_service_count_error(svc);
  } else if (rc != RA_OK) {
    transport_failed(svc, rc);
  } else {
    kvs_caller who = caller_of(call);
    rc = fn(svc, &who, in.data, in.len, &out, err);
    if (rc == RA_OK) {
      rc = ra_rpc_call_send(call, out.data, out.len, err);
      if (rc) transport_failed(svc, rc);
    }
  }
  ra_buf_free(&in);
  ra_buf_free(&out);
  return rc;
}

static int handle_open_session(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_open_session, err);
}
static int handle_append(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_append, err);
}
static int handle_build_index(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_build_index, err);
}
static int handle_put_clusters(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_put_clusters, err);
}
static int handle_fetch_clusters(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_fetch_clusters, err);
}
static int handle_close_session(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_close_session, err);
}
static int handle_stats(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_stats, err);
}
static int handle_read_kv(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_read_kv, err);
}
static int handle_health(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_unary(call, ctx, kvs_service_health, err);
}

static int handle_put_kv(ra_rpc_call *call, void *ctx, ra_error *err) {
  kvs_service *svc = ctx;
  kvs_put_state st;
  ra_buf in = {0}, out = {0};
  kvs_caller who = caller_of(call);
  kvs_service_put_begin(svc, &who, &st);
  int rc, chunk_failed = 0;
  while ((rc = ra_rpc_call_recv(call, &in, -1, err)) == RA_OK) {
    rc = kvs_service_put_chunk(svc, &st, in.data, in.len, err);
    if (rc) {
      chunk_failed = 1; /* counted by the service */
      break;
    }
  }
  if (rc == RA_EOF) {
    rc = kvs_service_put_finish(svc, &st, &out, err);
    if (rc == RA_OK) {
      rc = ra_rpc_call_send(call, out.data, out.len, err);
      if (rc) transport_failed(svc, rc);
    }
  } else if (!chunk_failed) {
    /* cancelled, timed out or the peer gone: the stream's chunks are dropped (service.h) */
    kvs_service_put_abort(svc, &st);
    transport_failed(svc, rc);
  }
  ra_buf_free(&in);
  ra_buf_free(&out);
  return rc;
}

/* A bidirectional stream of requests each answered by `fn`; a failure ends the stream with its
 * status. */
typedef int (*stream_fn)(kvs_service *, const kvs_caller *, const uint8_t *, size_t, ra_buf *, ra_error *);
static int serve_stream(ra_rpc_call *call, void *ctx, stream_fn fn, ra_error *err) {
  kvs_service *svc = ctx;
  ra_buf in = {0}, out = {0};
  kvs_caller who = caller_of(call);
  int rc;
  while ((rc = ra_rpc_call_recv(call, &in, -1, err)) == RA_OK) {
    rc = fn(svc, &who, in.data, in.len, &out, err);
    if (rc) break;
    rc = ra_rpc_call_send(call, out.data, out.len, err);
    if (rc) {
      transport_failed(svc, rc);
      break;
    }
  }
  if (rc == RA_EOF) rc = RA_OK;
  ra_buf_free(&in);
  ra_buf_free(&out);
  return rc;
}

static int handle_attend(ra_rpc_call *call, void *ctx, ra_error *err) {
  return serve_stream(call, ctx, kvs_service_attend, err);
}
/* Sends one item's reply of an AttendBatch message. */
static int emit_reply(void *call, const uint8_t *data, size_t len, ra_error *err) {
  return ra_rpc_call_send(call, data, len, err);
}

static int handle_attend_batch(ra_rpc_call *call, void *ctx, ra_error *err) {
  kvs_service *svc = ctx;
  ra_buf in = {0};
  kvs_caller who = caller_of(call);
  int rc;
  /* the service counts a reply that could not be sent as a failed request */
  while ((rc = ra_rpc_call_recv(call, &in, -1, err)) == RA_OK)
    if ((rc = kvs_service_attend_batch(svc, &who, in.data, in.len, emit_reply, call, err)) != RA_OK) break;
  if (rc == RA_EOF) rc = RA_OK;
  ra_buf_free(&in);
  return rc;
}

int kvs_server_register(ra_rpc_server *s, kvs_service *svc, ra_error *err) {
  static const struct {
    const char *path;
    ra_rpc_handler fn;
  } methods[] = {
      {KVS_METHOD_OPEN_SESSION, handle_open_session},
      {KVS_METHOD_PUT_KV, handle_put_kv},
      {KVS_METHOD_APPEND, handle_append},
      {KVS_METHOD_BUILD_INDEX, handle_build_index},
      {KVS_METHOD_ATTEND, handle_attend},
      {KVS_METHOD_ATTEND_BATCH, handle_attend_batch},
      {KVS_METHOD_PUT_CLUSTERS, handle_put_clusters},
      {KVS_METHOD_FETCH_CLUSTERS, handle_fetch_clusters},
      {KVS_METHOD_CLOSE_SESSION, handle_close_session},
      {KVS_METHOD_STATS, handle_stats},
      {KVS_METHOD_HEALTH, handle_health},
      {KVS_METHOD_READ_KV, handle_read_kv},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    int rc = ra_rpc_server_add_method(s, methods[i].path, methods[i].fn, svc);
    if (rc) return ra_errorf(err, rc, "cannot register %s: %s", methods[i].path, ra_strerror(rc));
  }
  return RA_OK;
}
