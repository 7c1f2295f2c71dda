/* The NCCL all-reduce of tp_comm.h: one communicator per rank (ncclCommInitAll over the ranks'
 * devices), the sum issued on the rank's CUDA stream, so it is ordered with the backend's ops
 * and the host sees its result at the next download or sync. */
#include "tp_comm.h"

#include "backend_cuda.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct nccl_comm {
  int n_ranks;
  atomic_int aborted;
  ncclComm_t *comms;
  ra_backend **bes;
} nccl_comm;

static int nccl_fail(ra_error *err, const char *what, ncclResult_t r) {
  return ra_errorf(err, RA_EINTERNAL, "tp: %s: %s", what, ncclGetErrorString(r));
}

static int nccl_all_reduce(ra_tp_comm *c, int rank, ra_tensor *x, ra_error *err) {
  nccl_comm *n = c->impl;
  if (rank < 0 || rank >= n->n_ranks) return ra_errorf(err, RA_EINVAL, "tp: rank %d of %d", rank, n->n_ranks);
  if (x->dtype != RA_DTYPE_F32) return ra_errorf(err, RA_EINVAL, "tp: all-reduce of a %s tensor", ra_dtype_name(x->dtype));
  if (atomic_load(&n->aborted)) return ra_errorf(err, RA_ECANCELED, "tp: another rank failed");
  ncclResult_t r = ncclAllReduce(x->data, x->data, ra_tensor_nelem(x), ncclFloat, ncclSum, n->comms[rank],
                                 (cudaStream_t)ra_backend_cuda_stream(n->bes[rank]));
  return r == ncclSuccess ? RA_OK : nccl_fail(err, "ncclAllReduce", r);
}

/* Releases ranks whose streams wait in a collective for a rank that failed. */
static void nccl_abort(ra_tp_comm *c) {
  nccl_comm *n = c->impl;
  if (atomic_exchange(&n->aborted, 1)) return;
  for (int r = 0; r < n->n_ranks; r++) ncclCommAbort(n->comms[r]);
}

static void nccl_destroy(ra_tp_comm *c) {
  nccl_comm *n = c->impl;
  if (n) {
    if (n->comms && !atomic_load(&n->aborted))
      for (int r = 0; r < n->n_ranks; r++) ncclCommDestroy(n->comms[r]);
    free(n->comms);
    free(n->bes);
    free(n);
  }
  free(c);
}

static const ra_tp_comm_ops nccl_ops = {nccl_all_reduce, nccl_abort, nccl_destroy};

int ra_tp_comm_nccl_new(int n_ranks, ra_backend *const *bes, ra_tp_comm **out, ra_error *err) {
  *out = NULL;
  if (n_ranks < 1) return ra_errorf(err, RA_EINVAL, "tp: %d ranks", n_ranks);
  ra_tp_comm *c = calloc(1, sizeof *c);
  nccl_comm *n = calloc(1, sizeof *n);
  int *devs = calloc((size_t)n_ranks, sizeof(int));
  if (n) {
    n->comms = calloc((size_t)n_ranks, sizeof(ncclComm_t));
    n->bes = calloc((size_t)n_ranks, sizeof(ra_backend *));
  }
  if (!c || !n || !devs || !n->comms || !n->bes) {
    if (n) {
      free(n->comms);
      free(n->bes);
    }
    free(n);
    free(c);
    free(devs);
    return ra_errorf(err, RA_ENOMEM, "tp: out of memory");
  }
  n->n_ranks = n_ranks;
  for (int r = 0; r < n_ranks; r++) {
    n->bes[r] = bes[r];
    devs[r] = ra_backend_cuda_device(bes[r]);
  }
  ncclResult_t res = ncclCommInitAll(n->comms, n_ranks, devs);
  free(devs);
  if (res != ncclSuccess) {
    free(n->comms);
    n->comms = NULL;
    *c = (ra_tp_comm){.ops = &nccl_ops, .impl = n};
    nccl_destroy(c);
    return nccl_fail(err, "ncclCommInitAll", res);
  }
  *c = (ra_tp_comm){.ops = &nccl_ops, .name = "nccl", .n_ranks = n_ranks, .impl = n};
  *out = c;
  return RA_OK;
}
