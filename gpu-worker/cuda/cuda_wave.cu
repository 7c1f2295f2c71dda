/* CUDA wave ops (backend.h; the same definitions as backend_cpu_wave.c).
 *
 * cluster_keys: work items are (kv head, segment), processed in batches that fit a scratch
 * budget. Per batch: one kernel centres and normalises the keys and seeds the centroids; each
 * Lloyd iteration is one cuBLAS strided-batched TF32 GEMM (scores [item][row][cluster], every
 * item padded to a full segment so one call covers the batch), an argmax kernel (a warp per row)
 * and an update kernel (a block per item: a stable counting sort, then a warp per cluster summing
 * its rows in row order, so results are deterministic). An item whose assignment did not change
 * skips its argmax and update from then on (device flags; the GEMM still runs, no host sync).
 * A last kernel per batch writes perm/counts, the raw-key centroids, sizes, value sums and the
 * permuted rows. The only host sync is the final download of perm and counts.
 *
 * wave_select: a scores kernel (a warp per cluster, the group's q in shared memory) writes
 * scale q.c for every q head and cluster; then one block per kv head takes the per-head softmax
 * of z + log(size), sums it over the group, ranks with the block top-k of cuda_topk.cuh and,
 * when asked, computes the estimation zone's partial (two launches per layer in all). */
#include "cuda_topk.cuh"
#include "cuda_wave.cuh"
#include "ra_cuda.cuh"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend_check_wave.h"
}

namespace {

constexpr int kMaxHd = 256;              /* 8 dims per lane */
constexpr int kMaxGroup = 64;            /* q heads per kv head in wave_select */
constexpr int kMaxSegClusters = 16384;   /* clusters per segment: the counting sort's shared arrays */
constexpr int kMaxRank = 16384;          /* r + e: the block top-k's shared candidates */
constexpr size_t kBatchBytes = (size_t)1 << 30;
constexpr int kSortThreads = 1024;

int fail(ra_error *err, const char *op, const char *what, cudaError_t e) {
  return ra_errorf(err, e == cudaErrorMemoryAllocation ? RA_ENOMEM : RA_EINTERNAL, "cuda %s: %s: %s", op, what,
                   cudaGetErrorString(e));
}

#define WV_TRY(op, call)                                  \
  do {                                                    \
    cudaError_t e_ = (call);                              \
    if (e_ != cudaSuccess) return fail(err, op, #call, e_); \
  } while (0)

int grow(ra_cuda_wave_scratch *s, size_t bytes, const char *op, ra_error *err) {
  if (bytes <= s->cap) return RA_OK;
  if (s->p) {
    cudaFree(s->p);
    s->p = nullptr;
    s->cap = 0;
  }
  size_t cap = bytes + bytes / 4;
  cudaError_t e = cudaMalloc(&s->p, cap);
  if (e != cudaSuccess) {
    s->p = nullptr;
    return ra_errorf(err, RA_ENOMEM, "cuda %s: cannot allocate %zu bytes of scratch: %s", op, cap,
                     cudaGetErrorString(e));
  }
  s->cap = cap;
  return RA_OK;
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

/* Carves consecutive 256-byte aligned pieces out of one scratch buffer. */
struct carver {
  char *base;
  size_t off;
  template <typename T> T *take(size_t n) {
    T *p = (T *)(base + off);
    off += align256(n * sizeof(T));
    return p;
  }
};

template <typename T> __device__ __forceinline__ float elem(const T *p, int64_t i) { return ra_cuda_to_f32(p[i]); }

size_t nelem_of(const ra_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

__device__ __forceinline__ void store_any(void *p, int dtype, int64_t i, float v) {
  if (dtype == RA_DTYPE_F32)
    ((float *)p)[i] = v;
  else if (dtype == RA_DTYPE_F16)
    ((__half *)p)[i] = __float2half_rn(v);
  else
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Block-wide reductions (every thread gets the result); red: >= 32 floats of shared memory. */
__device__ float block_max(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < nw; w++) r = fmaxf(r, red[w]);
  return r;
}

__device__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < nw; w++) r += red[w];
  return r;
}

/* ---------- cluster_keys ---------- */

struct geom {
  int64_t n, L, S, KS, K, cs, row0;
  int hkv, hd;
};

__device__ __forceinline__ void item_shape(const geom &g, int64_t item, int64_t *h, int64_t *seg, int64_t *t0,
                                           int64_t *len, int64_t *k) {
  *h = item / g.S;
  *seg = item % g.S;
  *t0 = *seg * g.L;
  *len = g.n - *t0 < g.L ? g.n - *t0 : g.L;
  *k = (*len + g.cs - 1) / g.cs;
}

/* Per item (block): x rows (unit, centred on the segment's mean key; zero padding rows up to
 * L), the initial unit centroids x[floor(j len / k)] (zero padding up to KS), assign = -1. */
template <typename T>
__global__ void __launch_bounds__(512) prep_kernel(const T *__restrict__ kc, geom g, int64_t item0,
                                                   float *__restrict__ X, float *__restrict__ C,
                                                   int32_t *__restrict__ A) {
  ra_cuda_pdl_entry();
  __shared__ double part[512];
  __shared__ float mu[kMaxHd];
  int64_t h, seg, t0, len, k;
  item_shape(g, item0 + blockIdx.x, &h, &seg, &t0, &len, &k);
  const int hd = g.hd, tid = threadIdx.x, G = blockDim.x / hd;
  float *Xi = X + blockIdx.x * g.L * hd, *Ci = C + blockIdx.x * g.KS * hd;
  int32_t *Ai = A + blockIdx.x * g.L;
  const int64_t rs = (int64_t)g.hkv * hd; /* cache row stride */
  const T *base = kc + (g.row0 + t0) * rs + h * hd;
  if (tid < G * hd) {
    const int gi = tid / hd, d = tid % hd;
    double s = 0.0;
    for (int64_t t = gi; t < len; t += G) s += elem(base, t * rs + d);
    part[tid] = s;
  }
  __syncthreads();
  if (tid < hd) {
    double s = 0.0;
    for (int gi = 0; gi < G; gi++) s += part[gi * hd + tid];
    mu[tid] = (float)(s / (double)len);
  }
  __syncthreads();
  const int lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  for (int64_t t = warp; t < g.L; t += nw) {
    float v[kMaxHd / 32];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++) {
      const int d = lane + 32 * i;
      v[i] = (t < len && d < hd) ? elem(base, t * rs + d) - mu[d] : 0.0f;
      ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    const float inv = ss > 0.0f ? 1.0f / sqrtf(ss) : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++)
      if (lane + 32 * i < hd) Xi[t * hd + lane + 32 * i] = v[i] * inv;
  }
  for (int64_t t = tid; t < g.L; t += blockDim.x) Ai[t] = -1;
  __syncthreads(); /* X rows of other warps are read below */
  for (int64_t i = tid; i < g.KS * hd; i += blockDim.x) {
    const int64_t j = i / hd, d = i % hd;
    Ci[i] = j < k ? Xi[(j * len / k) * hd + d] : 0.0f;
  }
}

/* A warp per row: argmax over the item's k clusters of S[item][t][j] (ties to the lower j);
 * flags the item when an assignment changed. Items unchanged in the previous iteration stay. */
__global__ void __launch_bounds__(256) argmax_kernel(const float *__restrict__ Sc, geom g, int64_t item0,
                                                     int32_t *__restrict__ A, const int32_t *__restrict__ prev,
                                                     int32_t *__restrict__ cur) {
  ra_cuda_pdl_entry();
  const int64_t bi = blockIdx.y;
  if (prev && prev[bi] == 0) return;
  int64_t h, seg, t0, len, k;
  item_shape(g, item0 + bi, &h, &seg, &t0, &len, &k);
  const int lane = threadIdx.x & 31;
  const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= len) return;
  const float *row = Sc + (bi * g.L + t) * g.KS;
  float bv = -INFINITY;
  int bj = 0x7fffffff;
  for (int64_t j = lane; j < k; j += 32) {
    const float v = row[j];
    if (v > bv || bj == 0x7fffffff) bv = v, bj = (int)j;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
    if (ov > bv || (ov == bv && oj < bj)) bv = ov, bj = oj;
  }
  if (lane == 0 && A[bi * g.L + t] != bj) {
    A[bi * g.L + t] = bj;
    cur[bi] = 1;
  }
}

/* Stable counting sort of a[len] over k clusters (block-wide, kSortThreads threads):
 * cnt[j], start[j] in shared memory, order[pos] = row (global). */
__device__ void group_rows(const int32_t *__restrict__ a, int64_t len, int64_t k, int *cnt, int *start,
                           int32_t *__restrict__ order) {
  __shared__ int wsum[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
  for (int64_t j = tid; j < k; j += nt) cnt[j] = 0;
  __syncthreads();
  for (int64_t t = tid; t < len; t += nt) atomicAdd(&cnt[a[t]], 1);
  __syncthreads();
  const int64_t per = (k + nt - 1) / nt, lo = tid * per, hi = lo + per < k ? lo + per : k;
  int s = 0;
  for (int64_t j = lo; j < hi; j++) s += cnt[j];
  int x = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) wsum[warp] = x;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; w++) before += wsum[w];
  int excl = before + x - s;
  for (int64_t j = lo; j < hi; j++) {
    start[j] = excl;
    excl += cnt[j];
  }
  __syncthreads();
  for (int64_t j = tid; j < k; j += nt) cnt[j] = 0; /* the placement's cursor, back to the counts after */
  __syncthreads();
  if (warp == 0) {
    for (int64_t b = 0; b < len; b += 32) {
      const int64_t t = b + lane;
      const int c = t < len ? a[t] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, c);
      const int rank = __popc(same & ((1u << lane) - 1u));
      if (t < len) order[start[c] + cnt[c] + rank] = (int32_t)t;
      __syncwarp();
      if (t < len && lane == __ffs(same) - 1) cnt[c] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
}

/* A block per changed item: c_j = normalise(sum of its rows' x) for non-empty clusters with a
 * non-zero sum. */
__global__ void __launch_bounds__(kSortThreads) update_kernel(const float *__restrict__ X, geom g, int64_t item0,
                                                              const int32_t *__restrict__ A,
                                                              int32_t *__restrict__ O, const int32_t *__restrict__ cur,
                                                              float *__restrict__ C) {
  ra_cuda_pdl_entry();
  extern __shared__ int sm[];
  const int64_t bi = blockIdx.x;
  if (cur[bi] == 0) return;
  int64_t h, seg, t0, len, k;
  item_shape(g, item0 + bi, &h, &seg, &t0, &len, &k);
  int *cnt = sm, *start = sm + g.KS;
  int32_t *Oi = O + bi * g.L;
  group_rows(A + bi * g.L, len, k, cnt, start, Oi);
  const int hd = g.hd, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const float *Xi = X + bi * g.L * hd;
  for (int64_t j = warp; j < k; j += nw) {
    const int c = cnt[j];
    if (c == 0) continue;
    float acc[kMaxHd / 32] = {0};
    for (int m = 0; m < c; m++) {
      const float *xr = Xi + (int64_t)Oi[start[j] + m] * hd;
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; i++)
        if (lane + 32 * i < hd) acc[i] += xr[lane + 32 * i];
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++) ss += acc[i] * acc[i];
    ss = warp_sum(ss);
    if (ss <= 0.0f) continue;
    const float inv = 1.0f / sqrtf(ss);
    float *cr = C + (bi * g.KS + j) * hd;
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++)
      if (lane + 32 * i < hd) cr[lane + 32 * i] = acc[i] * inv;
  }
}

struct final_out {
  int32_t *perm, *counts; /* device [hkv, n], [hkv, K] */
  float *centroid, *size, *vsum;
  int64_t cap, c0;
  void *out_k, *out_v;
  int out_k_dtype, out_v_dtype;
};

/* A block per item: the final grouping, perm/counts, raw-key centroids, sizes, value sums and
 * the permuted rows. */
template <typename T>
__global__ void __launch_bounds__(kSortThreads) final_kernel(const T *__restrict__ kc, const T *__restrict__ vc,
                                                             geom g, int64_t item0, const int32_t *__restrict__ A,
                                                             int32_t *__restrict__ O, final_out f) {
  ra_cuda_pdl_entry();
  extern __shared__ int sm[];
  const int64_t bi = blockIdx.x;
  int64_t h, seg, t0, len, k;
  item_shape(g, item0 + bi, &h, &seg, &t0, &len, &k);
  int *cnt = sm, *start = sm + g.KS;
  int32_t *Oi = O + bi * g.L;
  group_rows(A + bi * g.L, len, k, cnt, start, Oi);
  const int hd = g.hd, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t p = threadIdx.x; p < len; p += blockDim.x) f.perm[h * g.n + t0 + p] = (int32_t)(t0 + Oi[p]);
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) f.counts[h * g.K + seg * g.KS + j] = cnt[j];
  const int64_t rs = (int64_t)g.hkv * hd;
  const T *kb = kc + (g.row0 + t0) * rs + h * hd, *vb = vc + (g.row0 + t0) * rs + h * hd;
  for (int64_t j = warp; j < k; j += nw) {
    const int c = cnt[j];
    float ak[kMaxHd / 32] = {0}, av[kMaxHd / 32] = {0};
    for (int m = 0; m < c; m++) {
      const int64_t pos = start[j] + m, t = Oi[pos], orow = (h * g.n + t0 + pos) * hd;
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; i++) {
        const int d = lane + 32 * i;
        if (d >= hd) continue;
        const float kv = elem(kb, t * rs + d), vv = elem(vb, t * rs + d);
        ak[i] += kv;
        av[i] += vv;
        if (f.out_k) store_any(f.out_k, f.out_k_dtype, orow + d, kv);
        if (f.out_v) store_any(f.out_v, f.out_v_dtype, orow + d, vv);
      }
    }
    const int64_t slot = h * f.cap + f.c0 + seg * g.KS + j;
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++) {
      const int d = lane + 32 * i;
      if (d >= hd) continue;
      f.centroid[slot * hd + d] = c ? ak[i] / (float)c : 0.0f;
      f.vsum[slot * hd + d] = av[i];
    }
    if (lane == 0) f.size[slot] = (float)c;
  }
}

template <typename T>
int cluster_run(const ra_cuda_wave_ctx *ctx, const T *kc, const T *vc, const geom &g, int iters, final_out f,
                int64_t nb_max, carver cv, ra_error *err) {
  const char *op = "cluster_keys";
  cudaStream_t s = ctx->stream;
  const int64_t items = (int64_t)g.hkv * g.S;
  float *X = cv.take<float>((size_t)(nb_max * g.L * g.hd));
  float *C = cv.take<float>((size_t)(nb_max * g.KS * g.hd));
  float *Sc = cv.take<float>((size_t)(nb_max * g.L * g.KS));
  int32_t *A = cv.take<int32_t>((size_t)(nb_max * g.L));
  int32_t *O = cv.take<int32_t>((size_t)(nb_max * g.L));
  int32_t *flags = cv.take<int32_t>((size_t)(iters * nb_max));
  const size_t sort_smem = (size_t)g.KS * 2 * sizeof(int);
  WV_TRY(op, cudaFuncSetAttribute(update_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sort_smem));
  WV_TRY(op, cudaFuncSetAttribute(final_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sort_smem));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t i0 = 0; i0 < items; i0 += nb_max) {
    const int64_t nb = items - i0 < nb_max ? items - i0 : nb_max;
    WV_TRY(op, cudaMemsetAsync(flags, 0, sizeof(int32_t) * (size_t)(iters * nb_max), s));
    WV_TRY(op, ra_cuda_launch(prep_kernel<T>, dim3((unsigned)nb), dim3(512), 0, s, kc, g, i0, X, C, A));
    for (int it = 0; it < iters; it++) {
      cublasStatus_t st = cublasGemmStridedBatchedEx(
          ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)g.KS, (int)g.L, g.hd, &one, C, CUDA_R_32F, g.hd, g.KS * g.hd, X,
          CUDA_R_32F, g.hd, g.L * g.hd, &zero, Sc, CUDA_R_32F, (int)g.KS, g.L * g.KS, (int)nb,
          CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS)
        return ra_errorf(err, st == CUBLAS_STATUS_ALLOC_FAILED ? RA_ENOMEM : RA_EINTERNAL, "cuda %s: cuBLAS: %s", op,
                         cublasGetStatusString(st));
      const int32_t *prev = it ? flags + (it - 1) * nb_max : nullptr;
      int32_t *cur = flags + it * nb_max;
      WV_TRY(op, ra_cuda_launch(argmax_kernel, dim3((unsigned)((g.L + 7) / 8), (unsigned)nb), dim3(256), 0, s, Sc, g,
                                i0, A, prev, cur));
      if (it + 1 < iters)
        WV_TRY(op, ra_cuda_launch(update_kernel, dim3((unsigned)nb), dim3(kSortThreads), sort_smem, s, X, g, i0,
                                  (const int32_t *)A, O, (const int32_t *)cur, C));
    }
    WV_TRY(op, ra_cuda_launch(final_kernel<T>, dim3((unsigned)nb), dim3(kSortThreads), sort_smem, s, kc, vc, g, i0,
                              (const int32_t *)A, O, f));
  }
  return RA_OK;
}

/* ---------- wave_select / wave_estimate ---------- */

/* A warp per column: z[(kvh * group + gi) * n_cols + col] = scale q_(kvh, gi) . centroid[c],
 * c = col, or ids[kvh * n_cols + col] when ids is given (-1: z = 0, unused). */
__global__ void __launch_bounds__(256) scores_kernel(const float *__restrict__ q, const float *__restrict__ cen,
                                                     int64_t cap, int64_t n_cols, const int32_t *__restrict__ ids,
                                                     int group, int hd, float scale, float *__restrict__ z) {
  extern __shared__ float qs[]; /* [group, hd] */
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.y;
  for (int i = threadIdx.x; i < group * hd; i += blockDim.x) qs[i] = q[kvh * group * hd + i];
  __syncthreads();
  ra_cuda_pdl_trigger();
  const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int64_t col = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); col < n_cols; col += (int64_t)gridDim.x * nw) {
    const int64_t c = ids ? ids[kvh * n_cols + col] : col;
    float cv[kMaxHd / 32];
#pragma unroll
    for (int i = 0; i < kMaxHd / 32; i++) {
      const int d = lane + 32 * i;
      cv[i] = (c >= 0 && d < hd) ? cen[(kvh * cap + c) * hd + d] : 0.0f;
    }
    for (int gi = 0; gi < group; gi++) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; i++)
        if (lane + 32 * i < hd) s += qs[gi * hd + lane + 32 * i] * cv[i];
      s = warp_sum(s);
      if (lane == 0) z[(kvh * group + gi) * n_cols + col] = scale * s;
    }
  }
}

/* The estimate of one kv head's q heads over n clusters (ids id[j], -1 or size 0 skipped) with
 * z(gi, j) = zrow[gi * zld + zcol(j)]: m, l per head by block reductions, then warps over the
 * clusters and lanes over dims accumulate 4 heads at a time, reduced over warps in fixed order.
 * red: 16 * 4 * hd floats of shared memory, blockDim 512. */
__device__ void block_estimate(int64_t kvh, int group, int hd, int64_t cap, int n, const int32_t *id,
                               const float *zrow, int64_t zld, bool zgather, const float *__restrict__ size,
                               const float *__restrict__ vsum, float *__restrict__ o, float *__restrict__ ml,
                               float *red) {
  __shared__ float mh[kMaxGroup], lh[kMaxGroup], rsm[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const float *sz = size + kvh * cap;
  for (int gi = 0; gi < group; gi++) {
    const float *zg = zrow + gi * zld;
    float m = -INFINITY;
    for (int j = tid; j < n; j += blockDim.x) {
      const int c = id[j];
      if (c >= 0 && sz[c] > 0.0f) m = fmaxf(m, zg[zgather ? c : j]);
    }
    m = block_max(m, rsm);
    float l = 0.0f;
    if (m != -INFINITY)
      for (int j = tid; j < n; j += blockDim.x) {
        const int c = id[j];
        if (c >= 0 && sz[c] > 0.0f) l += sz[c] * expf(zg[zgather ? c : j] - m);
      }
    l = block_sum(l, rsm);
    if (tid == 0) mh[gi] = m, lh[gi] = l;
  }
  __syncthreads();
  for (int g0 = 0; g0 < group; g0 += 4) {
    const int ng = group - g0 < 4 ? group - g0 : 4;
    float acc[4][kMaxHd / 32] = {};
    for (int j = warp; j < n; j += nw) {
      const int c = id[j];
      if (c < 0 || !(sz[c] > 0.0f)) continue;
      const float *vr = vsum + (kvh * cap + c) * hd;
      float v[kMaxHd / 32];
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; i++) v[i] = lane + 32 * i < hd ? vr[lane + 32 * i] : 0.0f;
#pragma unroll
      for (int gg = 0; gg < 4; gg++) {
        if (gg >= ng) break;
        const float w = expf(zrow[(g0 + gg) * zld + (zgather ? c : j)] - mh[g0 + gg]);
#pragma unroll
        for (int i = 0; i < kMaxHd / 32; i++) acc[gg][i] += w * v[i];
      }
    }
    for (int gg = 0; gg < ng; gg++)
#pragma unroll
      for (int i = 0; i < kMaxHd / 32; i++)
        if (lane + 32 * i < hd) red[(warp * 4 + gg) * hd + lane + 32 * i] = acc[gg][i];
    __syncthreads();
    for (int i = tid; i < ng * hd; i += blockDim.x) {
      const int gg = i / hd, d = i % hd;
      float s = 0.0f;
      for (int w = 0; w < nw; w++) s += red[(w * 4 + gg) * hd + d];
      const float l = lh[g0 + gg];
      o[(kvh * group + g0 + gg) * hd + d] = l > 0.0f ? s / l : 0.0f;
    }
    __syncthreads();
  }
  for (int gi = tid; gi < group; gi += blockDim.x) {
    ml[2 * (kvh * group + gi)] = mh[gi];
    ml[2 * (kvh * group + gi) + 1] = lh[gi];
  }
}

struct est_args {
  const float *size, *vsum;
  float *o, *ml; /* NULL: no estimate */
  int64_t cap;
};

/* The selection runs as a pipeline of launches over many blocks: one block per kv head left an
 * SM to stream every cluster's scores several times with few loads in flight, so its cost grew
 * with the context (bench/results/wave-select/). */
constexpr int kSelThreads = 256;
constexpr int kSelPer = 4;                          /* clusters per thread in stats / key */
constexpr int kSelChunk = kSelThreads * kSelPer;   /* clusters per block in stats / key */
constexpr int kEstSlice = 256;                      /* estimation clusters per block */

/* Grid (chunks, hkv): per q head of the kv head, the chunk's max m_b of z + log size and
 * l_b = sum exp(z + log size - m_b) over clusters of size > 0, to part[(kvh * group + gi) * nb + b]. */
__global__ void __launch_bounds__(kSelThreads) sel_stats_kernel(const float *__restrict__ z, int64_t nc, int group,
                                                                const float *__restrict__ size, int64_t cap, int nb,
                                                                float2 *__restrict__ part) {
  __shared__ float rsm[32];
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.y, c0 = (int64_t)blockIdx.x * kSelChunk;
  const float *sz = size + kvh * cap;
  float ls[kSelPer];
  bool ok[kSelPer];
#pragma unroll
  for (int i = 0; i < kSelPer; i++) {
    const int64_t c = c0 + threadIdx.x + (int64_t)i * kSelThreads;
    ok[i] = c < nc && sz[c] > 0.0f;
    ls[i] = ok[i] ? logf(sz[c]) : 0.0f;
  }
  for (int gi = 0; gi < group; gi++) {
    const float *zg = z + (kvh * group + gi) * nc + c0 + threadIdx.x;
    float v[kSelPer], m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSelPer; i++) {
      v[i] = ok[i] ? zg[i * kSelThreads] + ls[i] : -INFINITY;
      m = fmaxf(m, v[i]);
    }
    m = block_max(m, rsm);
    float l = 0.0f;
    if (m != -INFINITY)
#pragma unroll
      for (int i = 0; i < kSelPer; i++) l += ok[i] ? expf(v[i] - m) : 0.0f;
    l = block_sum(l, rsm);
    if (threadIdx.x == 0) part[(kvh * group + gi) * nb + blockIdx.x] = make_float2(m, l);
  }
  ra_cuda_pdl_trigger();
}

/* The ranking's coarse histogram: keys binned by the top 12 bits of their order-preserving
 * uint32 (sign, exponent, 3 mantissa bits), per kv head. */
constexpr int kBinShift = 20, kBins = 1 << (32 - kBinShift);

/* Grid (chunks, hkv): the chunk's ranking keys, key[kvh * nc + c] = sum over the group of the
 * head's softmax p(c) (size 0: -inf), with each head's m, l merged from the chunks' parts, and
 * their histogram added to hist [hkv, kBins]. */
__global__ void __launch_bounds__(kSelThreads) sel_key_kernel(const float *__restrict__ z, int64_t nc, int group,
                                                              const float *__restrict__ size, int64_t cap, int nb,
                                                              const float2 *__restrict__ part,
                                                              float *__restrict__ key, unsigned *__restrict__ hist) {
  __shared__ float mh[kMaxGroup], lh[kMaxGroup];
  __shared__ unsigned bins[kBins];
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) bins[i] = 0;
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.y, c0 = (int64_t)blockIdx.x * kSelChunk;
  for (int gi = threadIdx.x; gi < group; gi += blockDim.x) {
    const float2 *pg = part + (kvh * group + gi) * nb;
    float m = -INFINITY, l = 0.0f;
    for (int b = 0; b < nb; b++) m = fmaxf(m, pg[b].x);
    if (m != -INFINITY)
      for (int b = 0; b < nb; b++)
        if (pg[b].y > 0.0f) l += pg[b].y * expf(pg[b].x - m);
    mh[gi] = m;
    lh[gi] = l;
  }
  __syncthreads();
  const float *sz = size + kvh * cap;
#pragma unroll
  for (int i = 0; i < kSelPer; i++) {
    const int64_t c = c0 + threadIdx.x + (int64_t)i * kSelThreads;
    if (c >= nc) break;
    float p = -INFINITY;
    if (sz[c] > 0.0f) {
      p = 0.0f;
      const float ls = logf(sz[c]);
      for (int gi = 0; gi < group; gi++)
        if (lh[gi] > 0.0f) p += expf(z[(kvh * group + gi) * nc + c] + ls - mh[gi]) / lh[gi];
    }
    key[kvh * nc + c] = p;
    atomicAdd(&bins[ra_cuda_fkey(p) >> kBinShift], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x)
    if (bins[i]) atomicAdd(&hist[kvh * kBins + i], bins[i]);
  ra_cuda_pdl_trigger();
}

/* A block per kv head: from the histogram, the bin B holding the k-th largest key (k = min(ld,
 * nc)): every key of a higher bin is in the top k, and the top k are among the keys of bins >= B.
 * thr[kvh] = B (kBins: k = 0). */
__global__ void __launch_bounds__(RA_CUDA_TOPK_THREADS) sel_thresh_kernel(const unsigned *__restrict__ hist,
                                                                          int64_t nc, int ld,
                                                                          unsigned *__restrict__ thr) {
  constexpr int kPer = kBins / RA_CUDA_TOPK_THREADS;
  __shared__ unsigned wsum[RA_CUDA_TOPK_THREADS / 32];
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.x;
  const unsigned k = (unsigned)(ld < nc ? ld : nc);
  const unsigned *h = hist + kvh * kBins;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  /* thread t holds bins [hi - kPer, hi), hi = kBins - t kPer: thread 0 the highest */
  const int hi = kBins - tid * kPer;
  unsigned mine = 0;
  for (int i = 1; i <= kPer; i++) mine += h[hi - i];
  unsigned incl = mine; /* inclusive prefix over threads 0..tid */
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  unsigned before = incl - mine;
  for (int w = 0; w < warp; w++) before += wsum[w];
  if (k == 0) {
    if (tid == 0) thr[kvh] = kBins;
  } else if (before < k && before + mine >= k) {
    unsigned above = before;
    for (int i = 1; i <= kPer; i++) {
      above += h[hi - i];
      if (above >= k) {
        thr[kvh] = (unsigned)(hi - i);
        break;
      }
    }
  }
  ra_cuda_pdl_trigger();
}

/* Grid (chunks, hkv): the keys of bins >= thr[kvh] as key << 32 | ~index into cand [hkv, cap],
 * counted in n_cand[kvh] (also past cap: the final kernel then ranks the whole row). */
__global__ void __launch_bounds__(kSelThreads) sel_compact_kernel(const float *__restrict__ key, int64_t nc,
                                                                  const unsigned *__restrict__ thr, int cap,
                                                                  unsigned long long *__restrict__ cand,
                                                                  unsigned *__restrict__ n_cand) {
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.y, c0 = (int64_t)blockIdx.x * kSelChunk;
  const unsigned b = thr[kvh];
#pragma unroll
  for (int i = 0; i < kSelPer; i++) {
    const int64_t c = c0 + threadIdx.x + (int64_t)i * kSelThreads;
    if (c >= nc) break;
    const uint32_t u = ra_cuda_fkey(key[kvh * nc + c]);
    if ((u >> kBinShift) >= b) {
      const unsigned slot = atomicAdd(&n_cand[kvh], 1u);
      if ((int)slot < cap) cand[kvh * cap + slot] = ((unsigned long long)u << 32) | (uint32_t)~(uint32_t)c;
    }
  }
  ra_cuda_pdl_trigger();
}

/* A block per kv head: the top min(ld, nc) clusters by key (ties to the lower index) into idx
 * [hkv, ld], best first, -1 past nc: the compacted candidates sorted, or, when more than cap
 * came, a top-k over the whole row. Dynamic shared memory: cap * 8 bytes (cap >= k_pow2). */
__global__ void __launch_bounds__(RA_CUDA_TOPK_THREADS) sel_topk_kernel(const float *__restrict__ key, int64_t nc,
                                                                        int ld, const unsigned long long *cand_g,
                                                                        const unsigned *__restrict__ n_cand, int cap,
                                                                        int32_t *__restrict__ idx) {
  extern __shared__ unsigned long long cand[];
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.x;
  const int k = (int)(ld < nc ? ld : nc);
  int32_t *ir = idx + kvh * ld;
  if (k > 0) {
    const int n = (int)n_cand[kvh];
    if (n <= cap) {
      int n_pow2 = 1;
      while (n_pow2 < n) n_pow2 <<= 1;
      for (int i = threadIdx.x; i < n_pow2; i += blockDim.x) cand[i] = i < n ? cand_g[kvh * cap + i] : 0ull;
      __syncthreads();
      ra_cuda_block_sort_desc(cand, n_pow2);
    } else {
      int k_pow2 = 1;
      while (k_pow2 < k) k_pow2 <<= 1;
      ra_cuda_block_topk(key + kvh * nc, nc, k, k_pow2, cand);
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) ir[i] = (int32_t)ra_cuda_topk_index(cand[i]);
  }
  for (int i = k + threadIdx.x; i < ld; i += blockDim.x) ir[i] = -1;
  ra_cuda_pdl_trigger();
}

/* Grid (slices, hkv): the estimate over the slice [r + b * kEstSlice, ...) of the estimation ids
 * of idx [hkv, ld], z gathered by cluster id from z [hq, nc], into the slice's partial
 * o_part [nb, hq, hd], ml_part [nb, hq, 2]. */
__global__ void __launch_bounds__(RA_CUDA_TOPK_THREADS) sel_est_kernel(const float *__restrict__ z, int64_t nc,
                                                                       int group, int hd, int r, int ld,
                                                                       const int32_t *__restrict__ idx, est_args a) {
  extern __shared__ float red[];
  ra_cuda_pdl_wait();
  const int64_t kvh = blockIdx.y, hq = (int64_t)gridDim.y * group;
  const int j0 = r + (int)blockIdx.x * kEstSlice;
  const int n = ld - j0 < kEstSlice ? ld - j0 : kEstSlice;
  block_estimate(kvh, group, hd, a.cap, n, idx + kvh * ld + j0, z + kvh * group * nc, nc, true, a.size, a.vsum,
                 a.o + blockIdx.x * hq * hd, a.ml + blockIdx.x * hq * 2, red);
  ra_cuda_pdl_trigger();
}

/* A block per q head: the nb slice partials merged by LSE into o [hq, hd], ml [hq, 2]. */
__global__ void __launch_bounds__(128) sel_est_merge_kernel(const float *__restrict__ o_part,
                                                            const float *__restrict__ ml_part, int nb, int hd,
                                                            float *__restrict__ o, float *__restrict__ ml) {
  ra_cuda_pdl_wait();
  const int64_t h = blockIdx.x, hq = gridDim.x;
  float m = -INFINITY;
  for (int b = 0; b < nb; b++) m = fmaxf(m, ml_part[(b * hq + h) * 2]);
  float l = 0.0f;
  if (m != -INFINITY)
    for (int b = 0; b < nb; b++) {
      const float lb = ml_part[(b * hq + h) * 2 + 1];
      if (lb > 0.0f) l += lb * expf(ml_part[(b * hq + h) * 2] - m);
    }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float s = 0.0f;
    if (l > 0.0f)
      for (int b = 0; b < nb; b++) {
        const float lb = ml_part[(b * hq + h) * 2 + 1];
        if (lb > 0.0f) s += lb * expf(ml_part[(b * hq + h) * 2] - m) * o_part[(b * hq + h) * hd + d];
      }
    o[h * hd + d] = l > 0.0f ? s / l : 0.0f;
  }
  if (threadIdx.x == 0) {
    ml[2 * h] = m;
    ml[2 * h + 1] = l;
  }
  ra_cuda_pdl_trigger();
}

/* A block per kv head: the estimate over ids [hkv, n] with z [hq, n] from scores_kernel. */
__global__ void __launch_bounds__(RA_CUDA_TOPK_THREADS) estimate_kernel(const float *__restrict__ z, int n,
                                                                        int group, int hd,
                                                                        const int32_t *__restrict__ ids, est_args a) {
  extern __shared__ float red[];
  ra_cuda_pdl_entry();
  const int64_t kvh = blockIdx.x;
  block_estimate(kvh, group, hd, a.cap, n, ids + kvh * n, z + kvh * group * n, n, false, a.size, a.vsum, a.o, a.ml,
                 red);
}

int check_limits(const char *op, int64_t hd, int64_t group, ra_error *err) {
  if (hd > kMaxHd) return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: head_dim %lld above %d", op, (long long)hd, kMaxHd);
  if (group > kMaxGroup)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: %lld q heads per kv head (at most %d)", op, (long long)group,
                     kMaxGroup);
  return RA_OK;
}

size_t est_smem(int64_t hd) { return (size_t)(RA_CUDA_TOPK_THREADS / 32) * 4 * (size_t)hd * sizeof(float); }

cudaError_t launch_scores(cudaStream_t s, const float *q, const ra_tensor *cen, int64_t n_cols, const int32_t *ids, int hkv,
                  int group, int hd, float scale, float *z) {
  if (n_cols == 0) return cudaSuccess;
  const size_t smem = (size_t)group * hd * sizeof(float);
  cudaError_t e = cudaFuncSetAttribute(scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  int64_t bx = (n_cols + 31) / 32; /* 8 warps, ~4 columns each */
  if (bx > 65535) bx = 65535;
  return ra_cuda_launch(scores_kernel, dim3((unsigned)bx, (unsigned)hkv), dim3(256), smem, s, q,
                        (const float *)cen->data, cen->shape[1], n_cols, ids, group, hd, scale, z);
}

} /* namespace */

void ra_cuda_wave_scratch_release(ra_cuda_wave_scratch *s) {
  if (s->p) cudaFree(s->p);
  s->p = nullptr;
  s->cap = 0;
}

void ra_cuda_wave_pinned_release(ra_cuda_wave_scratch *s) {
  if (s->p) cudaFreeHost(s->p);
  s->p = nullptr;
  s->cap = 0;
}

int ra_cuda_cluster_keys(const ra_cuda_wave_ctx *ctx, const ra_tensor *kc, const ra_tensor *vc, int64_t row0,
                         int64_t n, const ra_wave_cluster_params *p, ra_tensor *centroid, ra_tensor *size,
                         ra_tensor *vsum, int64_t c0, ra_tensor *out_k, ra_tensor *out_v, int32_t *perm,
                         int32_t *counts, ra_error *err) {
  const char *op = "cluster_keys";
  int64_t K;
  int rc = ra_backend_check_wave_cluster("cuda", kc, vc, row0, n, p, centroid, size, vsum, c0, out_k, out_v, perm,
                                         counts, &K, err);
  if (rc) return rc;
  geom g;
  g.n = n;
  g.row0 = row0;
  g.cs = p->cluster_size;
  g.L = p->seg_len < n ? p->seg_len : n;
  g.S = (n + g.L - 1) / g.L;
  g.KS = (g.L + g.cs - 1) / g.cs;
  g.K = K;
  g.hkv = (int)kc->shape[1];
  g.hd = (int)kc->shape[2];
  if ((rc = check_limits(op, g.hd, 1, err))) return rc;
  if (g.KS > kMaxSegClusters)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: %lld clusters per segment (at most %d)", op, (long long)g.KS,
                     kMaxSegClusters);
  const int64_t items = (int64_t)g.hkv * g.S;
  const size_t per_item = align256((size_t)(g.L * g.hd) * 4) + align256((size_t)(g.KS * g.hd) * 4) +
                          align256((size_t)(g.L * g.KS) * 4) + 2 * align256((size_t)g.L * 4) +
                          align256((size_t)p->iters * 4);
  int64_t nb = (int64_t)(kBatchBytes / per_item);
  nb = nb < 1 ? 1 : nb > items ? items : nb;
  const size_t fixed = align256((size_t)(g.hkv * n) * 4) + align256((size_t)(g.hkv * K) * 4);
  const size_t total = fixed + (size_t)nb * per_item + (size_t)p->iters * 256 * 8;
  if ((rc = grow(ctx->scratch, total, op, err))) return rc;
  carver cv = {(char *)ctx->scratch->p, 0};
  final_out f;
  f.perm = cv.take<int32_t>((size_t)(g.hkv * n));
  f.counts = cv.take<int32_t>((size_t)(g.hkv * K));
  f.centroid = (float *)centroid->data;
  f.size = (float *)size->data;
  f.vsum = (float *)vsum->data;
  f.cap = centroid->shape[1];
  f.c0 = c0;
  f.out_k = out_k ? out_k->data : nullptr;
  f.out_v = out_v ? out_v->data : nullptr;
  f.out_k_dtype = out_k ? out_k->dtype : RA_DTYPE_F32;
  f.out_v_dtype = out_v ? out_v->dtype : RA_DTYPE_F32;
  switch (kc->dtype) {
    case RA_DTYPE_F32:
      rc = cluster_run(ctx, (const float *)kc->data, (const float *)vc->data, g, p->iters, f, nb, cv, err);
      break;
    case RA_DTYPE_F16:
      rc = cluster_run(ctx, (const __half *)kc->data, (const __half *)vc->data, g, p->iters, f, nb, cv, err);
      break;
    default:
      rc = cluster_run(ctx, (const __nv_bfloat16 *)kc->data, (const __nv_bfloat16 *)vc->data, g, p->iters, f, nb, cv,
                       err);
  }
  if (rc) return rc;
  WV_TRY(op, cudaMemcpyAsync(perm, f.perm, sizeof(int32_t) * (size_t)(g.hkv * n), cudaMemcpyDeviceToHost, ctx->stream));
  WV_TRY(op, cudaMemcpyAsync(counts, f.counts, sizeof(int32_t) * (size_t)(g.hkv * K), cudaMemcpyDeviceToHost,
                             ctx->stream));
  WV_TRY(op, cudaStreamSynchronize(ctx->stream));
  return RA_OK;
}

/* One item's shapes and scratch in wave_select_batch. */
struct sel_plan {
  int hkv, hd, group, k_pow2, nb, cand_cap, n_est, nbe;
  int64_t nc, ld, k;
  size_t hq, bytes;
};

int sel_plan_of(const ra_wave_select_item *it, sel_plan *p, ra_error *err) {
  const char *op = "wave_select";
  int rc = ra_backend_check_wave_select("cuda", it->q, it->centroid, it->size, it->n_clusters, it->r, it->e, it->idx,
                                        it->vsum, it->o, it->ml, err);
  if (rc) return rc;
  p->hkv = (int)it->centroid->shape[0];
  p->hd = (int)it->centroid->shape[2];
  p->group = (int)((int64_t)(nelem_of(it->q)) / p->hd / p->hkv);
  if ((rc = check_limits(op, p->hd, p->group, err))) return rc;
  p->nc = it->n_clusters;
  p->ld = (int64_t)it->r + it->e;
  p->k = p->ld < p->nc ? p->ld : p->nc;
  if (p->k > kMaxRank)
    return ra_errorf(err, RA_EUNSUPPORTED, "cuda %s: %lld ranked clusters (r + e at most %d)", op, (long long)p->k,
                     kMaxRank);
  p->k_pow2 = 1;
  while (p->k_pow2 < p->k) p->k_pow2 <<= 1;
  p->hq = (size_t)p->hkv * (size_t)p->group;
  p->nb = (int)((p->nc + kSelChunk - 1) / kSelChunk);
  /* candidates of the threshold bin's keys and above: up to twice the top k before falling back */
  p->cand_cap = 2 * p->k_pow2 < kMaxRank ? 2 * p->k_pow2 : (p->k_pow2 > kMaxRank ? p->k_pow2 : kMaxRank);
  p->n_est = it->o && p->ld > it->r ? (int)(p->ld - it->r) : 0;
  p->nbe = (p->n_est + kEstSlice - 1) / kEstSlice;
  const size_t nb1 = p->nb ? (size_t)p->nb : 1, nbe1 = p->nbe ? (size_t)p->nbe : 1;
  p->bytes = align256(p->hq * (size_t)p->nc * 4) + align256((size_t)p->hkv * (size_t)p->nc * 4) +
             align256((size_t)p->hkv * (size_t)p->ld * 4) + align256(p->hq * nb1 * 8) +
             align256(nbe1 * p->hq * (size_t)p->hd * 4) + align256(nbe1 * p->hq * 2 * 4) +
             align256(((size_t)p->hkv * kBins + 2 * (size_t)p->hkv) * 4) + align256((size_t)p->hkv * p->cand_cap * 8);
  return RA_OK;
}

/* An item's pieces of scratch, carved in the order and sizes sel_plan_of sums (keep the two
 * together). */
struct sel_bufs {
  float *z, *key, *o_part, *ml_part;
  int32_t *d_idx;
  float2 *part;
  unsigned *hist, *thr, *n_cand;
  unsigned long long *cand;
};

sel_bufs sel_carve(carver *cv, const sel_plan *p) {
  sel_bufs b;
  const size_t nb1 = p->nb ? (size_t)p->nb : 1, nbe1 = p->nbe ? (size_t)p->nbe : 1;
  b.z = cv->take<float>(p->hq * (size_t)p->nc);
  b.key = cv->take<float>((size_t)p->hkv * (size_t)p->nc);
  b.d_idx = cv->take<int32_t>((size_t)p->hkv * (size_t)p->ld);
  b.part = cv->take<float2>(p->hq * nb1);
  b.hist = cv->take<unsigned>((size_t)p->hkv * kBins + 2 * (size_t)p->hkv);
  b.thr = b.hist + (size_t)p->hkv * kBins;
  b.n_cand = b.thr + p->hkv;
  b.cand = cv->take<unsigned long long>((size_t)p->hkv * (size_t)p->cand_cap);
  b.o_part = cv->take<float>(nbe1 * p->hq * (size_t)p->hd);
  b.ml_part = cv->take<float>(nbe1 * p->hq * 2);
  return b;
}

/* The ranking of one item, to b.d_idx [hkv, ld]. */
int sel_rank(cudaStream_t s, const ra_wave_select_item *it, float scale, const sel_plan *p, const sel_bufs *b,
             ra_error *err) {
  const char *op = "wave_select";
  WV_TRY(op, launch_scores(s, (const float *)it->q->data, it->centroid, p->nc, nullptr, p->hkv, p->group, p->hd, scale,
                           b->z));
  const float *sz = (const float *)it->size->data;
  const int64_t cap = it->centroid->shape[1];
  WV_TRY(op, cudaMemsetAsync(b->hist, 0, ((size_t)p->hkv * kBins + 2 * (size_t)p->hkv) * 4, s));
  if (p->nb > 0) {
    const dim3 grid((unsigned)p->nb, (unsigned)p->hkv);
    WV_TRY(op, ra_cuda_launch(sel_stats_kernel, grid, dim3(kSelThreads), 0, s, (const float *)b->z, p->nc, p->group,
                              sz, cap, p->nb, b->part));
    WV_TRY(op, ra_cuda_launch(sel_key_kernel, grid, dim3(kSelThreads), 0, s, (const float *)b->z, p->nc, p->group, sz,
                              cap, p->nb, (const float2 *)b->part, b->key, b->hist));
    WV_TRY(op, ra_cuda_launch(sel_thresh_kernel, dim3((unsigned)p->hkv), dim3(RA_CUDA_TOPK_THREADS), 0, s,
                              (const unsigned *)b->hist, p->nc, (int)p->ld, b->thr));
    WV_TRY(op, ra_cuda_launch(sel_compact_kernel, grid, dim3(kSelThreads), 0, s, (const float *)b->key, p->nc,
                              (const unsigned *)b->thr, p->cand_cap, b->cand, b->n_cand));
  }
  const size_t smem = (size_t)p->cand_cap * 8;
  WV_TRY(op, cudaFuncSetAttribute(sel_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  WV_TRY(op, ra_cuda_launch(sel_topk_kernel, dim3((unsigned)p->hkv), dim3(RA_CUDA_TOPK_THREADS), smem, s,
                            (const float *)b->key, p->nc, (int)p->ld, (const unsigned long long *)b->cand,
                            (const unsigned *)b->n_cand, p->cand_cap, b->d_idx));
  return RA_OK;
}

/* The estimation zone's partial of one item (after its ranking), when it asks for one. */
int sel_estimate(cudaStream_t s, const ra_wave_select_item *it, const sel_plan *p, const sel_bufs *b, ra_error *err) {
  const char *op = "wave_select";
  if (!it->o) return RA_OK;
  float *out_o = (float *)it->o->data, *out_ml = (float *)it->ml->data;
  if (p->nbe == 0) { /* no estimation zone: the merge of no parts is the empty partial */
    WV_TRY(op, ra_cuda_launch(sel_est_merge_kernel, dim3((unsigned)p->hq), dim3(128), 0, s, (const float *)b->o_part,
                              (const float *)b->ml_part, 0, p->hd, out_o, out_ml));
    return RA_OK;
  }
  est_args a = {(const float *)it->size->data, (const float *)it->vsum->data, b->o_part, b->ml_part,
                it->centroid->shape[1]};
  const size_t esm = est_smem(p->hd);
  WV_TRY(op, cudaFuncSetAttribute(sel_est_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)esm));
  WV_TRY(op, ra_cuda_launch(sel_est_kernel, dim3((unsigned)p->nbe, (unsigned)p->hkv), dim3(RA_CUDA_TOPK_THREADS), esm,
                            s, (const float *)b->z, p->nc, p->group, p->hd, it->r, (int)p->ld,
                            (const int32_t *)b->d_idx, a));
  WV_TRY(op, ra_cuda_launch(sel_est_merge_kernel, dim3((unsigned)p->hq), dim3(128), 0, s, (const float *)b->o_part,
                            (const float *)b->ml_part, p->nbe, p->hd, out_o, out_ml));
  return RA_OK;
}

int grow_pinned(ra_cuda_wave_scratch *s, size_t bytes, ra_error *err) {
  if (bytes <= s->cap) return RA_OK;
  if (s->p) cudaFreeHost(s->p);
  s->p = nullptr;
  s->cap = 0;
  size_t cap = bytes + bytes / 4;
  cudaError_t e = cudaHostAlloc(&s->p, cap, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    s->p = nullptr;
    return ra_errorf(err, RA_ENOMEM, "cuda wave_select: cannot pin %zu bytes for the ids: %s", cap,
                     cudaGetErrorString(e));
  }
  s->cap = cap;
  return RA_OK;
}

int ra_cuda_wave_select_batch(const ra_cuda_wave_ctx *ctx, const ra_wave_select_item *items, int n_items,
                              float scale, ra_error *err) {
  const char *op = "wave_select";
  if (n_items < 1 || !items) return ra_errorf(err, RA_EINVAL, "cuda wave_select_batch: %d items", n_items);
  sel_plan *plan = (sel_plan *)malloc(sizeof(sel_plan) * (size_t)n_items);
  sel_bufs *bufs = (sel_bufs *)malloc(sizeof(sel_bufs) * (size_t)n_items);
  size_t bytes = 0, id_bytes = 0;
  int rc = plan && bufs ? RA_OK : ra_errorf(err, RA_ENOMEM, "cuda wave_select_batch: out of memory");
  for (int i = 0; rc == RA_OK && i < n_items; i++) {
    if ((rc = sel_plan_of(&items[i], &plan[i], err)) != RA_OK) ra_error_wrap(err, "item %d", i);
    bytes += rc == RA_OK ? plan[i].bytes : 0;
    id_bytes += rc == RA_OK ? align256((size_t)plan[i].hkv * (size_t)plan[i].ld * 4) : 0;
  }
  if (rc == RA_OK) rc = grow(ctx->scratch, bytes, op, err);
  if (rc == RA_OK) rc = grow_pinned(ctx->pinned, id_bytes, err);
  /* every item's ranking and its ids into pinned memory, one sync for all of them, then the
   * estimation zones (which the stores' requests need not wait for) */
  carver cv = {rc == RA_OK ? (char *)ctx->scratch->p : nullptr, 0};
  char *ids = rc == RA_OK ? (char *)ctx->pinned->p : nullptr;
  size_t off = 0;
  for (int i = 0; rc == RA_OK && i < n_items; i++) {
    const size_t nb = (size_t)plan[i].hkv * (size_t)plan[i].ld * 4;
    bufs[i] = sel_carve(&cv, &plan[i]);
    if ((rc = sel_rank(ctx->stream, &items[i], scale, &plan[i], &bufs[i], err)) == RA_OK) {
      cudaError_t e = cudaMemcpyAsync(ids + off, bufs[i].d_idx, nb, cudaMemcpyDeviceToHost, ctx->stream);
      if (e != cudaSuccess) rc = fail(err, op, "cudaMemcpyAsync(idx)", e);
    }
    off += align256(nb);
  }
  if (rc == RA_OK) {
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) rc = fail(err, op, "cudaStreamSynchronize", e);
  }
  off = 0;
  for (int i = 0; rc == RA_OK && i < n_items; i++) {
    const size_t nb = (size_t)plan[i].hkv * (size_t)plan[i].ld * 4;
    memcpy(items[i].idx, ids + off, nb);
    off += align256(nb);
  }
  for (int i = 0; rc == RA_OK && i < n_items; i++) rc = sel_estimate(ctx->stream, &items[i], &plan[i], &bufs[i], err);
  free(plan);
  free(bufs);
  return rc;
}

int ra_cuda_wave_select(const ra_cuda_wave_ctx *ctx, const ra_tensor *q, const ra_tensor *centroid,
                        const ra_tensor *size, int64_t n_clusters, float scale, int r, int e, int32_t *idx,
                        const ra_tensor *vsum, ra_tensor *o, ra_tensor *ml, ra_error *err) {
  const ra_wave_select_item it = {q, centroid, size, n_clusters, r, e, idx, vsum, o, ml};
  return ra_cuda_wave_select_batch(ctx, &it, 1, scale, err);
}

int ra_cuda_wave_estimate(const ra_cuda_wave_ctx *ctx, const ra_tensor *q, const ra_tensor *centroid,
                          const ra_tensor *size, const ra_tensor *vsum, int64_t n_clusters, const int32_t *ids,
                          int n_ids, int64_t ld, float scale, ra_tensor *o, ra_tensor *ml, ra_error *err) {
  const char *op = "wave_estimate";
  int rc = ra_backend_check_wave_estimate("cuda", q, centroid, size, vsum, n_clusters, ids, n_ids, ld, o, ml, err);
  if (rc) return rc;
  const int hkv = (int)centroid->shape[0], hd = (int)centroid->shape[2];
  const int group = (int)((int64_t)(nelem_of(q)) / hd / hkv);
  if ((rc = check_limits(op, hd, group, err))) return rc;
  const size_t hq = (size_t)hkv * (size_t)group, nid = (size_t)n_ids;
  if ((rc = grow(ctx->scratch, align256(hq * nid * 4 + 4) + align256((size_t)hkv * nid * 4 + 4), op, err))) return rc;
  carver cv = {(char *)ctx->scratch->p, 0};
  float *z = cv.take<float>(hq * nid + 1);
  int32_t *d_ids = cv.take<int32_t>((size_t)hkv * nid + 1);
  if (n_ids > 0) {
    /* the rows of ids, packed [hkv, n_ids] (pageable: staged before cudaMemcpyAsync returns) */
    int32_t *packed = (int32_t *)malloc(sizeof(int32_t) * (size_t)hkv * nid);
    if (!packed) return ra_errorf(err, RA_ENOMEM, "cuda %s: no host memory for %d ids", op, n_ids);
    for (int h = 0; h < hkv; h++) memcpy(packed + (size_t)h * nid, ids + h * ld, sizeof(int32_t) * nid);
    cudaError_t ce = cudaMemcpyAsync(d_ids, packed, sizeof(int32_t) * (size_t)hkv * nid, cudaMemcpyHostToDevice,
                                     ctx->stream);
    free(packed);
    if (ce != cudaSuccess) return fail(err, op, "cudaMemcpyAsync(ids)", ce);
    WV_TRY(op, launch_scores(ctx->stream, (const float *)q->data, centroid, n_ids, d_ids, hkv, group,
                                          hd, scale, z));
  }
  est_args a = {(const float *)size->data, (const float *)vsum->data, (float *)o->data, (float *)ml->data,
                centroid->shape[1]};
  const size_t smem = est_smem(hd);
  WV_TRY(op, cudaFuncSetAttribute(estimate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  WV_TRY(op, ra_cuda_launch(estimate_kernel, dim3((unsigned)hkv), dim3(RA_CUDA_TOPK_THREADS), smem, ctx->stream,
                            (const float *)z, n_ids, group, hd, (const int32_t *)d_ids, a));
  return RA_OK;
}
