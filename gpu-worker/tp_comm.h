/* The all-reduce of tensor parallelism: N ranks of one process sum a tensor in place.
 *
 * Every rank calls all_reduce with the same element count, in the same order of calls; on
 * return every rank's tensor holds the elementwise sum over the ranks, bitwise identical on all
 * of them (so that ranks that sample from replicated logits pick the same tokens). A rank that
 * fails calls abort: every all_reduce in progress or to come then returns RA_ECANCELED instead
 * of waiting for a rank that will never arrive.
 *
 * Two implementations behind the table:
 *   host: shared host buffers and a barrier; each rank downloads its tensor, sums a 1/N chunk
 *         of every rank's copy in rank order, and uploads the whole sum (any backend; the CPU
 *         simulation of N ranks and CI use it);
 *   nccl: ncclAllReduce on each rank's CUDA stream (built when CMake finds NCCL). */
#ifndef RA_TP_COMM_H
#define RA_TP_COMM_H

#include "backend.h"
#include "status.h"

typedef struct ra_tp_comm ra_tp_comm;

typedef struct ra_tp_comm_ops {
  /* x: F32 on the rank's backend, any shape; summed over the ranks in place */
  int (*all_reduce)(ra_tp_comm *c, int rank, ra_tensor *x, ra_error *err);
  void (*abort)(ra_tp_comm *c);
  void (*destroy)(ra_tp_comm *c);
} ra_tp_comm_ops;

struct ra_tp_comm {
  const ra_tp_comm_ops *ops;
  const char *name; /* "host", "nccl" */
  int n_ranks;
  void *impl;
};

int ra_tp_comm_host_new(int n_ranks, ra_tp_comm **out, ra_error *err);
/* One NCCL communicator per rank over the CUDA backends bes[0..n_ranks) (one device each).
 * RA_EUNSUPPORTED when the build has no NCCL. */
int ra_tp_comm_nccl_new(int n_ranks, ra_backend *const *bes, ra_tp_comm **out, ra_error *err);

static inline int ra_tp_all_reduce(ra_tp_comm *c, int rank, ra_tensor *x, ra_error *err) {
  return c->ops->all_reduce(c, rank, x, err);
}
void ra_tp_comm_free(ra_tp_comm *c);

#endif
