#include "tp_comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Shared host buffers of the host all-reduce. Rank r only ever resizes its own buffers, and only
 * where no other rank reads them: its slot before the first barrier of a call (the others read
 * slots between the two barriers), its sum chunk after the first (they read sums after the
 * second barrier of the previous call, which they have left before reaching this first one). */
typedef struct host_comm {
  int n_ranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiting;
  unsigned gen;
  int aborted;
  float **slot, **sum;   /* per rank: its tensor's copy [n], its chunk of the sum */
  size_t *slot_cap, *sum_cap;
  size_t *n;             /* the element count each rank passed */
} host_comm;

/* A barrier that abort releases (a pthread_barrier_t cannot be woken); RA_ECANCELED once any
 * rank aborted. */
static int host_barrier(host_comm *h, ra_error *err) {
  pthread_mutex_lock(&h->mu);
  int passed = 0;
  if (!h->aborted) {
    unsigned gen = h->gen;
    if (++h->waiting == h->n_ranks) {
      h->waiting = 0;
      h->gen++;
      pthread_cond_broadcast(&h->cv);
    } else {
      while (gen == h->gen && !h->aborted) pthread_cond_wait(&h->cv, &h->mu);
    }
    /* every rank arrived, even if one of them aborted since (after its own check) */
    passed = gen != h->gen;
  }
  pthread_mutex_unlock(&h->mu);
  return passed ? RA_OK : ra_errorf(err, RA_ECANCELED, "tp: another rank failed");
}

static int grow(float **buf, size_t *cap, size_t n, ra_error *err) {
  if (n <= *cap) return RA_OK;
  float *b = realloc(*buf, n * sizeof(float));
  if (!b) return ra_errorf(err, RA_ENOMEM, "tp: out of memory for the all-reduce (%zu floats)", n);
  *buf = b;
  *cap = n;
  return RA_OK;
}

static void host_abort(ra_tp_comm *c) {
  host_comm *h = c->impl;
  pthread_mutex_lock(&h->mu);
  h->aborted = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* Chunk r of n elements over the ranks: [*b, *e). */
static void chunk(size_t n, int n_ranks, int r, size_t *b, size_t *e) {
  *b = n * (size_t)r / (size_t)n_ranks;
  *e = n * (size_t)(r + 1) / (size_t)n_ranks;
}

static int host_all_reduce(ra_tp_comm *c, int rank, ra_tensor *x, ra_error *err) {
  host_comm *h = c->impl;
  if (rank < 0 || rank >= h->n_ranks) return ra_errorf(err, RA_EINVAL, "tp: rank %d of %d", rank, h->n_ranks);
  if (x->dtype != RA_DTYPE_F32) return ra_errorf(err, RA_EINVAL, "tp: all-reduce of a %s tensor", ra_dtype_name(x->dtype));
  size_t n = ra_tensor_nelem(x);
  h->n[rank] = n;
  int rc = grow(&h->slot[rank], &h->slot_cap[rank], n, err);
  if (rc == RA_OK) rc = x->be->ops->download(x->be, x, 0, h->slot[rank], n, err);
  if (rc != RA_OK) {
    host_abort(c);
    return rc;
  }
  if ((rc = host_barrier(h, err))) return rc;
  for (int r = 0; r < h->n_ranks; r++)
    if (h->n[r] != n) {
      /* every rank sees the same counts, so all of them fail here */
      host_abort(c);
      return ra_errorf(err, RA_EINTERNAL, "tp: all-reduce of %zu elements on rank %d, %zu on rank %d", n, rank, h->n[r], r);
    }
  size_t b, e;
  chunk(n, h->n_ranks, rank, &b, &e);
  if ((rc = grow(&h->sum[rank], &h->sum_cap[rank], e - b, err))) {
    host_abort(c);
    return rc;
  }
  /* in rank order, so the result does not depend on which rank summed the chunk */
  float *s = h->sum[rank];
  memcpy(s, h->slot[0] + b, (e - b) * sizeof(float));
  for (int r = 1; r < h->n_ranks; r++) {
    const float *src = h->slot[r] + b;
    for (size_t i = 0; i < e - b; i++) s[i] += src[i];
  }
  if ((rc = host_barrier(h, err))) return rc;
  for (int r = 0; r < h->n_ranks && rc == RA_OK; r++) {
    chunk(n, h->n_ranks, r, &b, &e);
    if (e > b) rc = x->be->ops->upload(x->be, x, b, h->sum[r], e - b, err);
  }
  if (rc != RA_OK) host_abort(c);
  return rc;
}

static void host_destroy(ra_tp_comm *c) {
  host_comm *h = c->impl;
  if (h) {
    for (int r = 0; r < h->n_ranks; r++) {
      if (h->slot) free(h->slot[r]);
      if (h->sum) free(h->sum[r]);
    }
    free(h->slot);
    free(h->sum);
    free(h->slot_cap);
    free(h->sum_cap);
    free(h->n);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
  }
  free(c);
}

static const ra_tp_comm_ops host_ops = {host_all_reduce, host_abort, host_destroy};

int ra_tp_comm_host_new(int n_ranks, ra_tp_comm **out, ra_error *err) {
  *out = NULL;
  if (n_ranks < 1) return ra_errorf(err, RA_EINVAL, "tp: %d ranks", n_ranks);
  ra_tp_comm *c = calloc(1, sizeof *c);
  host_comm *h = calloc(1, sizeof *h);
  if (!c || !h) {
    free(c);
    free(h);
    return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  }
  h->n_ranks = n_ranks;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  *c = (ra_tp_comm){.ops = &host_ops, .name = "host", .n_ranks = n_ranks, .impl = h};
  size_t nr = (size_t)n_ranks;
  h->slot = calloc(nr, sizeof(float *));
  h->sum = calloc(nr, sizeof(float *));
  h->slot_cap = calloc(nr, sizeof(size_t));
  h->sum_cap = calloc(nr, sizeof(size_t));
  h->n = calloc(nr, sizeof(size_t));
  if (!h->slot || !h->sum || !h->slot_cap || !h->sum_cap || !h->n) {
    host_destroy(c);
    return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  }
  *out = c;
  return RA_OK;
}

#ifndef RA_WITH_NCCL
int ra_tp_comm_nccl_new(int n_ranks, ra_backend *const *bes, ra_tp_comm **out, ra_error *err) {
  (void)n_ranks;
  (void)bes;
  *out = NULL;
  return ra_errorf(err, RA_EUNSUPPORTED, "tp: this build has no NCCL (configure with NCCL found: -DRA_NCCL=ON)");
}
#endif

void ra_tp_comm_free(ra_tp_comm *c) {
  if (c) c->ops->destroy(c);
}
