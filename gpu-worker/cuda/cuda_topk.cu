/* Per-row top-k (k <= RA_CUDA_TOPK_MAX) of rows of up to 2^31 columns, one block per row:
 *   1. radix select: four 8-bit passes over order-preserving uint32 keys find the key T of the
 *      k-th largest value and how many of the k are equal to T (the rest are > T);
 *   2. gather: every element > T (order free), then the lowest-index elements == T in index
 *      order (block-wide ballot prefix sums), so ties go to the lower index;
 *   3. bitonic sort of the k candidates in shared memory by (value desc, index asc).
 * Each pass streams the row from global memory (L2-resident for rows up to a few MB). */
#include "ra_cuda.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

/* Monotone map float -> uint32 (a < b as floats <=> key(a) < key(b)); -0 maps like +0 so the
 * two compare equal, as they do for the CPU backend. */
__device__ __forceinline__ uint32_t fkey(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(const float *__restrict__ x, int64_t m, int k, int k_pow2,
                                                        int32_t *__restrict__ out_idx, float *__restrict__ out_val) {
  extern __shared__ unsigned long long cand[]; /* [k_pow2]: key << 32 | ~index */
  __shared__ unsigned hist[256];
  __shared__ unsigned sel_bin, need_eq, n_gt, taken;
  __shared__ unsigned wcount[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float *row = x + (int64_t)blockIdx.x * m;

  uint32_t prefix = 0, mask = 0;
  unsigned remaining = (unsigned)k; /* how many of the top k are still to place at or below prefix */
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = tid; i < m; i += kThreads) {
      const uint32_t u = fkey(row[i]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      unsigned cum = 0;
      int b = 255;
      for (; b > 0; b--) {
        if (cum + hist[b] >= remaining) break;
        cum += hist[b];
      }
      sel_bin = (unsigned)b;
      need_eq = remaining - cum;
    }
    __syncthreads();
    prefix |= sel_bin << shift;
    mask |= 255u << shift;
    remaining = need_eq;
    __syncthreads();
  }
  /* prefix is T's key; `remaining` elements equal to T belong to the top k */
  const unsigned gt_total = (unsigned)k - remaining;
  if (tid == 0) {
    n_gt = 0;
    taken = 0;
  }
  for (int i = tid; i < k_pow2; i += kThreads) cand[i] = 0ull; /* padding sorts last */
  __syncthreads();
  for (int64_t i = tid; i < m; i += kThreads) {
    const uint32_t u = fkey(row[i]);
    if (u > prefix) {
      const unsigned slot = atomicAdd(&n_gt, 1u);
      cand[slot] = ((unsigned long long)u << 32) | (uint32_t)~(uint32_t)i;
    }
  }
  __syncthreads();
  for (int64_t base = 0; base < m; base += kThreads) {
    if (taken >= remaining) break; /* uniform: read after a barrier */
    const int64_t i = base + tid;
    const bool eq = i < m && fkey(row[i]) == prefix;
    const unsigned ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) wcount[warp] = __popc(ballot);
    __syncthreads();
    unsigned before = taken;
    for (int w = 0; w < warp; w++) before += wcount[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (eq && before < remaining) cand[gt_total + before] = ((unsigned long long)prefix << 32) | (uint32_t)~(uint32_t)i;
    __syncthreads();
    if (tid == 0) {
      unsigned t = 0;
      for (int w = 0; w < kWarps; w++) t += wcount[w];
      taken += t;
    }
    __syncthreads();
  }
  /* bitonic sort, descending */
  for (int size = 2; size <= k_pow2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < k_pow2; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long a = cand[i], b = cand[j];
          const bool desc = (i & size) == 0;
          if (desc ? a < b : a > b) {
            cand[i] = b;
            cand[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = tid; i < k; i += kThreads) {
    const uint32_t ix = ~(uint32_t)cand[i];
    out_idx[(int64_t)blockIdx.x * k + i] = (int32_t)ix;
    out_val[(int64_t)blockIdx.x * k + i] = row[ix];
  }
}

} /* namespace */

cudaError_t ra_cuda_topk_rows(cudaStream_t s, const float *x, int64_t n, int64_t m, int k, int32_t *idx, float *val) {
  if (n == 0) return cudaSuccess;
  int k_pow2 = 1;
  while (k_pow2 < k) k_pow2 <<= 1;
  size_t smem = (size_t)k_pow2 * sizeof(unsigned long long);
  cudaError_t e = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  topk_kernel<<<(unsigned)n, kThreads, smem, s>>>(x, m, k, k_pow2, idx, val);
  return cudaGetLastError();
}
