/* Block-wide top-k of one row (CUDA C++ only), shared by topk_rows (cuda_topk.cu) and the wave
 * index's zone selection (cuda_wave.cu). Launch with RA_CUDA_TOPK_THREADS threads and
 * k_pow2 * 8 bytes of dynamic shared memory for cand (k_pow2: the power of two >= k):
 *   1. radix select: four 8-bit passes over order-preserving uint32 keys find the key T of the
 *      k-th largest value and how many of the k are equal to T (the rest are > T);
 *   2. gather: every element > T (order free), then the lowest-index elements == T in index
 *      order (block-wide ballot prefix sums), so ties go to the lower index;
 *   3. bitonic sort of the k candidates in shared memory by (value desc, index asc).
 * Each pass streams the row from global memory (L2-resident for rows up to a few MB), four loads
 * in flight per thread. On return
 * cand[i] for i < k holds key << 32 | ~index of the i-th largest (ra_cuda_topk_index). row is read
 * through plain loads, so it may have been written earlier in the same kernel (after a barrier). */
#ifndef RA_CUDA_TOPK_CUH
#define RA_CUDA_TOPK_CUH

#include <stdint.h>

#define RA_CUDA_TOPK_THREADS 512

/* Monotone map float -> uint32 (a < b as floats <=> key(a) < key(b)); -0 maps like +0 so the
 * two compare equal, as they do for the CPU backend. */
__device__ __forceinline__ uint32_t ra_cuda_fkey(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t ra_cuda_topk_index(unsigned long long c) { return ~(uint32_t)c; }

/* Bitonic sort of cand[0, n_pow2) in shared memory, descending; every thread of the block
 * calls it (n_pow2 a power of two). */
__device__ __forceinline__ void ra_cuda_block_sort_desc(unsigned long long *cand, int n_pow2) {
  for (int size = 2; size <= n_pow2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n_pow2; i += blockDim.x) {
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
}

__device__ __forceinline__ void ra_cuda_block_topk(const float *row, int64_t m, int k, int k_pow2,
                                                   unsigned long long *cand) {
  constexpr int kThreads = RA_CUDA_TOPK_THREADS;
  constexpr int kWarps = kThreads / 32;
  constexpr int kUnroll = 4; /* loads in flight per thread: one block streams the whole row */
  __shared__ unsigned hist[256];
  __shared__ unsigned sel_bin, need_eq, n_gt, taken;
  __shared__ unsigned wcount[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned remaining = (unsigned)k; /* how many of the top k are still to place at or below prefix */
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i0 = tid; i0 < m; i0 += kUnroll * kThreads) {
      uint32_t u[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; j++) {
        const int64_t i = i0 + (int64_t)j * kThreads;
        u[j] = i < m ? ra_cuda_fkey(row[i]) : 0u;
      }
#pragma unroll
      for (int j = 0; j < kUnroll; j++)
        if (i0 + (int64_t)j * kThreads < m && (u[j] & mask) == prefix) atomicAdd(&hist[(u[j] >> shift) & 255u], 1u);
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
  for (int64_t i0 = tid; i0 < m; i0 += kUnroll * kThreads) {
    uint32_t u[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; j++) {
      const int64_t i = i0 + (int64_t)j * kThreads;
      u[j] = i < m ? ra_cuda_fkey(row[i]) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kUnroll; j++) {
      const int64_t i = i0 + (int64_t)j * kThreads;
      if (i < m && u[j] > prefix) {
        const unsigned slot = atomicAdd(&n_gt, 1u);
        cand[slot] = ((unsigned long long)u[j] << 32) | (uint32_t)~(uint32_t)i;
      }
    }
  }
  __syncthreads();
  for (int64_t base = 0; base < m; base += kThreads) {
    if (taken >= remaining) break; /* uniform: read after a barrier */
    const int64_t i = base + tid;
    const bool eq = i < m && ra_cuda_fkey(row[i]) == prefix;
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
  ra_cuda_block_sort_desc(cand, k_pow2);
}

#endif
