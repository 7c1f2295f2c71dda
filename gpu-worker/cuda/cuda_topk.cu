/* Per-row top-k (k <= RA_CUDA_TOPK_MAX) of rows of up to 2^31 columns, one block per row; the
 * block's algorithm is in cuda_topk.cuh. */
#include "ra_cuda.cuh"
#include "cuda_topk.cuh"

namespace {

__global__ void __launch_bounds__(RA_CUDA_TOPK_THREADS) topk_kernel(const float *__restrict__ x, int64_t m, int k,
                                                                    int k_pow2, int32_t *__restrict__ out_idx,
                                                                    float *__restrict__ out_val) {
  extern __shared__ unsigned long long cand[]; /* [k_pow2]: key << 32 | ~index */
  const float *row = x + (int64_t)blockIdx.x * m;
  ra_cuda_block_topk(row, m, k, k_pow2, cand);
  for (int i = threadIdx.x; i < k; i += RA_CUDA_TOPK_THREADS) {
    const uint32_t ix = ra_cuda_topk_index(cand[i]);
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
  topk_kernel<<<(unsigned)n, RA_CUDA_TOPK_THREADS, smem, s>>>(x, m, k, k_pow2, idx, val);
  return cudaGetLastError();
}
