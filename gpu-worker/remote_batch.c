#include "remote_batch.h"

#include "shardmap.h"

#include <stdlib.h>
#include <string.h>

/* A message of the step: sent (or its send failed), then its items' replies, in order, until
 * they are all in or the stream broke. */
typedef struct batch_msg {
  int rc; /* the send's failure, or the stream's before every reply came */
  ra_error err;
  size_t n_items, n_got;
  ra_kvclient_batch_reply **replies; /* [n_items]: [0, n_got) received */
} batch_msg;

typedef struct batch_store {
  char addr[RA_ADDR_MAX];
  ra_kvclient *client; /* NULL: connected at the next request staged for it */
  ra_kvclient_batch *stream;
  batch_msg *msgs;     /* the step's messages; msgs[n_msgs] is the one being staged */
  size_t n_msgs, cap_msgs;
  size_t n_done;       /* messages [0, n_done) have every reply or their failure */
} batch_store;

struct ra_remote_batch {
  batch_store *stores;
  size_t n_stores, cap_stores;
  uint64_t messages, requests;
};

int ra_remote_batch_new(ra_remote_batch **out, ra_error *err) {
  *out = calloc(1, sizeof **out);
  return *out ? RA_OK : ra_errorf(err, RA_ENOMEM, "out of memory for an attend batch");
}

static void store_disconnect(batch_store *s) {
  ra_kvclient_batch_close(s->stream);
  s->stream = NULL;
  ra_kvclient_close(s->client);
  s->client = NULL;
}

/* The replies not yet in of messages [n_done, n_msgs) of s are lost with e (its stream broke):
 * their requests fail with e. */
static void store_lose(batch_store *s, const ra_error *e) {
  for (size_t k = s->n_done; k < s->n_msgs; k++)
    if (s->msgs[k].rc == RA_OK) {
      s->msgs[k].rc = e->code ? e->code : RA_EUNAVAIL;
      s->msgs[k].err = *e;
    }
  s->n_done = s->n_msgs;
  store_disconnect(s);
}

static void msg_free(batch_msg *m) {
  for (size_t i = 0; i < m->n_got; i++) ra_kvclient_batch_reply_free(m->replies[i]);
  free(m->replies);
  *m = (batch_msg){0};
}

void ra_remote_batch_end_step(ra_remote_batch *b) {
  for (size_t i = 0; i < b->n_stores; i++) {
    batch_store *s = &b->stores[i];
    /* a reply nobody took would answer the next step's first message: start afresh */
    if (s->n_done < s->n_msgs) store_disconnect(s);
    for (size_t k = 0; k < s->n_msgs; k++) msg_free(&s->msgs[k]);
    s->n_msgs = s->n_done = 0;
    /* staged and never sent (the step failed before its send): dropped with the stream */
    if (s->stream && ra_kvclient_batch_staged(s->stream)) store_disconnect(s);
  }
}

void ra_remote_batch_free(ra_remote_batch *b) {
  if (!b) return;
  ra_remote_batch_end_step(b);
  for (size_t i = 0; i < b->n_stores; i++) {
    store_disconnect(&b->stores[i]);
    free(b->stores[i].msgs);
  }
  free(b->stores);
  free(b);
}

void ra_remote_batch_counts(const ra_remote_batch *b, uint64_t *messages, uint64_t *requests) {
  *messages = b->messages;
  *requests = b->requests;
}

static int store_find(ra_remote_batch *b, const char *addr, size_t *out, ra_error *err) {
  for (size_t i = 0; i < b->n_stores; i++)
    if (strcmp(b->stores[i].addr, addr) == 0) {
      *out = i;
      return RA_OK;
    }
  if (strlen(addr) >= RA_ADDR_MAX) return ra_errorf(err, RA_EINVAL, "attend batch: store address too long: %s", addr);
  if (b->n_stores == b->cap_stores) {
    size_t cap = b->cap_stores ? 2 * b->cap_stores : 4;
    batch_store *st = realloc(b->stores, cap * sizeof *st);
    if (!st) return ra_errorf(err, RA_ENOMEM, "out of memory for an attend batch's stores");
    b->stores = st;
    b->cap_stores = cap;
  }
  batch_store *s = &b->stores[b->n_stores];
  memset(s, 0, sizeof *s);
  strcpy(s->addr, addr);
  *out = b->n_stores++;
  return RA_OK;
}

int ra_remote_batch_stage(ra_remote_batch *b, const char *addr, const ra_kvclient_options *opt,
                          const ra_kvclient_session *sess, const ra_kvclient_attend_req *req, ra_remote_batch_ticket *t,
                          ra_error *err) {
  size_t i = 0;
  int rc = store_find(b, addr, &i, err);
  if (rc) return rc;
  batch_store *s = &b->stores[i];
  if (!s->client) {
    if ((rc = ra_kvclient_connect(addr, opt, &s->client, err)) != RA_OK) {
      s->client = NULL;
      return rc;
    }
    if ((rc = ra_kvclient_batch_open(s->client, &s->stream, err)) != RA_OK) {
      store_disconnect(s);
      return rc;
    }
  }
  if (s->n_msgs == s->cap_msgs) {
    size_t cap = s->cap_msgs ? 2 * s->cap_msgs : 8;
    batch_msg *m = realloc(s->msgs, cap * sizeof *m);
    if (!m) return ra_errorf(err, RA_ENOMEM, "out of memory for an attend batch's messages");
    s->msgs = m;
    s->cap_msgs = cap;
  }
  size_t item;
  if ((rc = ra_kvclient_batch_add(s->stream, sess, req, &item, err)) != RA_OK) return rc;
  *t = (ra_remote_batch_ticket){i, s->n_msgs, item};
  return RA_OK;
}

void ra_remote_batch_send(ra_remote_batch *b) {
  for (size_t i = 0; i < b->n_stores; i++) {
    batch_store *s = &b->stores[i];
    size_t n = s->stream ? ra_kvclient_batch_staged(s->stream) : 0;
    if (!n) continue;
    batch_msg *m = &s->msgs[s->n_msgs++];
    *m = (batch_msg){.n_items = n, .replies = malloc(n * sizeof *m->replies)};
    b->messages++;
    b->requests += n;
    m->rc = m->replies ? ra_kvclient_batch_send(s->stream, &m->err)
                       : ra_errorf(&m->err, RA_ENOMEM, "out of memory for an attend batch's replies");
    if (m->rc) store_lose(s, &m->err); /* the stream broke: the replies awaited are lost too */
  }
}

int ra_remote_batch_take(ra_remote_batch *b, const ra_remote_batch_ticket *t, const ra_kvclient_session *sess,
                         const ra_kvclient_attend_req *req, ra_head_partial *out, int timeout_ms, uint64_t *compute_us,
                         ra_error *err) {
  if (t->store >= b->n_stores || t->msg >= b->stores[t->store].n_msgs || t->item >= b->stores[t->store].msgs[t->msg].n_items)
    return ra_errorf(err, RA_ESTATE, "attend batch: a request taken before its message was sent");
  batch_store *s = &b->stores[t->store];
  batch_msg *m = &s->msgs[t->msg];
  /* the replies come in order: those before this one's are kept for their takers */
  while (m->n_got <= t->item && s->n_done <= t->msg) {
    batch_msg *next = &s->msgs[s->n_done];
    ra_error e;
    if (ra_kvclient_batch_recv(s->stream, timeout_ms, &next->replies[next->n_got], &e) != RA_OK) {
      store_lose(s, &e);
      break;
    }
    if (++next->n_got == next->n_items) s->n_done++;
  }
  if (t->item >= m->n_got) {
    *err = m->err;
    return m->rc ? m->rc : RA_EINTERNAL;
  }
  return ra_kvclient_batch_reply_take(m->replies[t->item], sess, req, out, compute_us, err);
}
