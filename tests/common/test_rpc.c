/* The gRPC core wrapper: unary, client-streaming and bidi calls against an in-process server,
 * status codes and messages crossing the wire, timeouts, limits and shutdown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rpc.h"

#define MAX_MSG (1u << 20)

static ra_rpc_server *server;
static ra_rpc_channel *channel;

/* Echoes one message back. */
static int h_echo(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  int rc = ra_rpc_call_recv(call, &m, -1, err);
  if (rc == RA_OK) rc = ra_rpc_call_send(call, m.data, m.len, err);
  ra_buf_free(&m);
  return rc;
}

/* Client stream of messages -> one reply holding the total byte count. */
static int h_count(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  unsigned long total = 0;
  int rc;
  while ((rc = ra_rpc_call_recv(call, &m, -1, err)) == RA_OK) total += m.len;
  ra_buf_free(&m);
  if (rc != RA_EOF) return rc;
  char out[32];
  int n = snprintf(out, sizeof out, "%lu", total);
  return ra_rpc_call_send(call, out, (size_t)n, err);
}

/* Bidi: echoes every message, uppercased first byte, until the client half-closes. */
static int h_bidi(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  int rc;
  while ((rc = ra_rpc_call_recv(call, &m, -1, err)) == RA_OK) {
    if (m.len) m.data[0] = (uint8_t)(m.data[0] - 32);
    if ((rc = ra_rpc_call_send(call, m.data, m.len, err)) != RA_OK) break;
  }
  ra_buf_free(&m);
  return rc == RA_EOF ? RA_OK : rc;
}

static int h_fail(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  ra_rpc_call_recv(call, &m, -1, err);
  ra_buf_free(&m);
  return ra_errorf(err, RA_ENOTFOUND, "no session %s", "abcd");
}

/* Reads, then never answers until the call is cancelled (client timeout / shutdown). */
static int h_silent(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  int rc;
  while ((rc = ra_rpc_call_recv(call, &m, -1, err)) == RA_OK) {
  }
  ra_buf_free(&m);
  return rc;
}

/* Answers one request, but only after the client has given up. */
static int h_slow(ra_rpc_call *call, void *ctx, ra_error *err) {
  ra_buf m = {0};
  int rc = ra_rpc_call_recv(call, &m, -1, err);
  usleep(600 * 1000);
  if (rc == RA_OK) rc = ra_rpc_call_send(call, m.data, m.len, err);
  ra_buf_free(&m);
  return rc;
}

static int setup(void **state) {
  ra_rpc_server_config cfg = {.listen = "127.0.0.1:0", .max_calls = 8, .max_message_bytes = MAX_MSG};
  ra_error err;
  assert_int_equal(ra_rpc_server_create(&cfg, &server, &err), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Echo", h_echo, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Count", h_count, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Bidi", h_bidi, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Fail", h_fail, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Silent", h_silent, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(server, "/t.T/Slow", h_slow, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_start(server, &err), RA_OK);
  assert_true(ra_rpc_server_port(server) > 0);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", ra_rpc_server_port(server));
  ra_rpc_channel_config cc = {.max_message_bytes = MAX_MSG};
  assert_int_equal(ra_rpc_channel_open(target, &cc, &channel, &err), RA_OK);
  return 0;
}

static int teardown(void **state) {
  ra_rpc_channel_close(channel);
  ra_rpc_server_shutdown(server, 1000);
  ra_rpc_server_destroy(server);
  return 0;
}

static void test_unary_roundtrip(void **state) {
  ra_buf reply = {0};
  ra_error err;
  for (int i = 0; i < 50; i++) {
    char msg[32];
    int n = snprintf(msg, sizeof msg, "hello %d", i);
    assert_int_equal(ra_rpc_unary(channel, "/t.T/Echo", msg, (size_t)n, &reply, 5000, &err), RA_OK);
    assert_int_equal(reply.len, (size_t)n);
    assert_memory_equal(reply.data, msg, (size_t)n);
  }
  /* An empty message is a valid message. */
  assert_int_equal(ra_rpc_unary(channel, "/t.T/Echo", "", 0, &reply, 5000, &err), RA_OK);
  assert_int_equal(reply.len, 0);
  ra_buf_free(&reply);
}

static void test_error_status_and_message_cross_the_wire(void **state) {
  ra_buf reply = {0};
  ra_error err;
  assert_int_equal(ra_rpc_unary(channel, "/t.T/Fail", "x", 1, &reply, 5000, &err), RA_ENOTFOUND);
  assert_non_null(strstr(err.msg, "NOT_FOUND"));
  assert_non_null(strstr(err.msg, "no session abcd"));
  assert_int_equal(ra_rpc_unary(channel, "/t.T/Nope", "x", 1, &reply, 5000, &err), RA_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "unknown method /t.T/Nope"));
  ra_buf_free(&reply);
}

static void test_client_stream(void **state) {
  ra_rpc_call *call;
  ra_error err;
  assert_int_equal(ra_rpc_call_start(channel, "/t.T/Count", 5000, &call, &err), RA_OK);
  static uint8_t chunk[100000];
  for (int i = 0; i < 20; i++) assert_int_equal(ra_rpc_call_send(call, chunk, sizeof chunk, &err), RA_OK);
  assert_int_equal(ra_rpc_call_close_send(call, &err), RA_OK);
  ra_buf reply = {0};
  assert_int_equal(ra_rpc_call_recv(call, &reply, 5000, &err), RA_OK);
  assert_int_equal(reply.len, 7);
  assert_memory_equal(reply.data, "2000000", 7);
  assert_int_equal(ra_rpc_call_recv(call, &reply, 5000, &err), RA_EOF);
  assert_int_equal(ra_rpc_call_finish(call, &err), RA_OK);
  ra_rpc_call_destroy(call);
  ra_buf_free(&reply);
}

static void test_bidi_stream_many_round_trips(void **state) {
  ra_rpc_call *call;
  ra_error err;
  ra_buf reply = {0};
  assert_int_equal(ra_rpc_call_start(channel, "/t.T/Bidi", 0, &call, &err), RA_OK);
  for (int i = 0; i < 200; i++) {
    char msg[16];
    int n = snprintf(msg, sizeof msg, "layer%d", i);
    assert_int_equal(ra_rpc_call_send(call, msg, (size_t)n, &err), RA_OK);
    assert_int_equal(ra_rpc_call_recv(call, &reply, 5000, &err), RA_OK);
    msg[0] = 'L';
    assert_int_equal(reply.len, (size_t)n);
    assert_memory_equal(reply.data, msg, (size_t)n);
  }
  assert_int_equal(ra_rpc_call_close_send(call, &err), RA_OK);
  assert_int_equal(ra_rpc_call_recv(call, &reply, 5000, &err), RA_EOF);
  assert_int_equal(ra_rpc_call_finish(call, &err), RA_OK);
  ra_rpc_call_destroy(call);
  ra_buf_free(&reply);
}

static void test_recv_timeout_cancels(void **state) {
  ra_rpc_call *call;
  ra_error err;
  ra_buf reply = {0};
  assert_int_equal(ra_rpc_call_start(channel, "/t.T/Silent", 0, &call, &err), RA_OK);
  assert_int_equal(ra_rpc_call_send(call, "q", 1, &err), RA_OK);
  assert_int_equal(ra_rpc_call_recv(call, &reply, 200, &err), RA_ETIMEDOUT);
  assert_non_null(strstr(err.msg, "no reply within 200 ms"));
  /* The call is over; further use is an error, not a hang. */
  assert_int_not_equal(ra_rpc_call_send(call, "q", 1, &err), RA_OK);
  ra_rpc_call_destroy(call);
  /* Unary deadline. */
  assert_int_equal(ra_rpc_unary(channel, "/t.T/Slow", "q", 1, &reply, 200, &err), RA_ETIMEDOUT);
  assert_non_null(strstr(err.msg, "DEADLINE_EXCEEDED"));
  ra_buf_free(&reply);
}

static void test_oversized_message_is_refused(void **state) {
  static uint8_t big[MAX_MSG + 1024];
  ra_buf reply = {0};
  ra_error err;
  int rc = ra_rpc_unary(channel, "/t.T/Echo", big, sizeof big, &reply, 5000, &err);
  assert_int_equal(rc, RA_ENOMEM); /* RESOURCE_EXHAUSTED */
  /* The channel still works afterwards. */
  assert_int_equal(ra_rpc_unary(channel, "/t.T/Echo", "ok", 2, &reply, 5000, &err), RA_OK);
  ra_buf_free(&reply);
}

static void test_unreachable_peer_is_unavailable(void **state) {
  ra_rpc_channel *ch;
  ra_error err;
  ra_buf reply = {0};
  /* Port 1 on loopback: nothing listens there. */
  assert_int_equal(ra_rpc_channel_open("127.0.0.1:1", NULL, &ch, &err), RA_OK);
  assert_int_equal(ra_rpc_unary(ch, "/t.T/Echo", "x", 1, &reply, 5000, &err), RA_EUNAVAIL);
  assert_non_null(strstr(err.msg, "127.0.0.1:1"));
  ra_rpc_channel_close(ch);
  assert_int_equal(ra_rpc_channel_open("no-port", NULL, &ch, &err), RA_EINVAL);
  ra_buf_free(&reply);
}

static void test_bad_listen_address(void **state) {
  ra_rpc_server *s;
  ra_error err;
  ra_rpc_server_config cfg = {.listen = "127.0.0.1:0"};
  assert_int_equal(ra_rpc_server_create(&cfg, &s, &err), RA_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ra_rpc_server_port(server));
  ra_rpc_server_destroy(s);
  cfg.listen = addr; /* already taken by the fixture's server */
  assert_int_equal(ra_rpc_server_create(&cfg, &s, &err), RA_OK);
  assert_int_equal(ra_rpc_server_start(s, &err), RA_EIO);
  assert_non_null(strstr(err.msg, addr));
  ra_rpc_server_destroy(s);
  cfg.listen = "nonsense";
  assert_int_equal(ra_rpc_server_create(&cfg, &s, &err), RA_EINVAL);
}

/* A server shut down under an open stream ends it: the client sees an error, not a hang. */
static void test_shutdown_with_open_stream(void **state) {
  ra_rpc_server *s;
  ra_rpc_channel *ch;
  ra_rpc_call *call;
  ra_error err;
  ra_buf reply = {0};
  ra_rpc_server_config cfg = {.listen = "127.0.0.1:0", .max_calls = 2};
  assert_int_equal(ra_rpc_server_create(&cfg, &s, &err), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(s, "/t.T/Bidi", h_bidi, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_start(s, &err), RA_OK);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", ra_rpc_server_port(s));
  assert_int_equal(ra_rpc_channel_open(target, NULL, &ch, &err), RA_OK);
  assert_int_equal(ra_rpc_call_start(ch, "/t.T/Bidi", 0, &call, &err), RA_OK);
  assert_int_equal(ra_rpc_call_send(call, "abc", 3, &err), RA_OK);
  assert_int_equal(ra_rpc_call_recv(call, &reply, 5000, &err), RA_OK);
  ra_rpc_server_shutdown(s, 100);
  int rc = ra_rpc_call_recv(call, &reply, 5000, &err);
  assert_true(rc < 0);
  assert_int_not_equal(rc, RA_ETIMEDOUT);
  ra_rpc_call_destroy(call);
  ra_rpc_channel_close(ch);
  ra_rpc_server_destroy(s);
  ra_buf_free(&reply);
}

static ra_rpc_server *echo_server(const char *listen) {
  ra_rpc_server *s;
  ra_error err;
  ra_rpc_server_config cfg = {.listen = listen, .max_calls = 2};
  assert_int_equal(ra_rpc_server_create(&cfg, &s, &err), RA_OK);
  assert_int_equal(ra_rpc_server_add_method(s, "/t.T/Echo", h_echo, NULL), RA_OK);
  assert_int_equal(ra_rpc_server_start(s, &err), RA_OK);
  return s;
}

/* fail_after_loss: once the connection it saw up is gone, every later call fails at once saying
 * so, even when a server answers at that address again (a session there would be gone). */
static void test_a_lost_connection_stays_lost(void **state) {
  ra_rpc_server *s = echo_server("127.0.0.1:0");
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", ra_rpc_server_port(s));
  ra_rpc_channel *ch;
  ra_error err;
  ra_buf reply = {0};
  ra_rpc_channel_config cc = {.fail_after_loss = true};
  assert_int_equal(ra_rpc_channel_open(target, &cc, &ch, &err), RA_OK);
  assert_int_equal(ra_rpc_unary(ch, "/t.T/Echo", "x", 1, &reply, 5000, &err), RA_OK);
  assert_int_equal(ra_rpc_unary(ch, "/t.T/Echo", "y", 1, &reply, 5000, &err), RA_OK);
  ra_rpc_server_shutdown(s, 100);
  ra_rpc_server_destroy(s);
  int lost = 0;
  for (int i = 0; i < 100 && !lost; i++) {
    int rc = ra_rpc_unary(ch, "/t.T/Echo", "z", 1, &reply, 5000, &err);
    assert_int_equal(rc, RA_EUNAVAIL);
    lost = strstr(err.msg, "connection was lost") != NULL;
    if (!lost) usleep(50 * 1000);
  }
  assert_true(lost);
  s = echo_server(target); /* the same address answers again */
  ra_rpc_channel *fresh;
  assert_int_equal(ra_rpc_channel_open(target, NULL, &fresh, &err), RA_OK);
  assert_int_equal(ra_rpc_unary(fresh, "/t.T/Echo", "w", 1, &reply, 5000, &err), RA_OK);
  assert_int_equal(ra_rpc_unary(ch, "/t.T/Echo", "w", 1, &reply, 5000, &err), RA_EUNAVAIL);
  assert_non_null(strstr(err.msg, "connection was lost"));
  ra_rpc_channel_close(fresh);
  ra_rpc_channel_close(ch);
  ra_rpc_server_shutdown(s, 100);
  ra_rpc_server_destroy(s);
  ra_buf_free(&reply);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_roundtrip),
      cmocka_unit_test(test_error_status_and_message_cross_the_wire),
      cmocka_unit_test(test_client_stream),
      cmocka_unit_test(test_bidi_stream_many_round_trips),
      cmocka_unit_test(test_recv_timeout_cancels),
      cmocka_unit_test(test_oversized_message_is_refused),
      cmocka_unit_test(test_unreachable_peer_is_unavailable),
      cmocka_unit_test(test_bad_listen_address),
      cmocka_unit_test(test_shutdown_with_open_stream),
      cmocka_unit_test(test_a_lost_connection_stays_lost),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
