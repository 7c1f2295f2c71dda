/* Batch-1 matmul (decode): y = w x (+ bias) (+ y), w: [m, k] BF16/F16, x: [k] F32.
 *
 * It reads every weight byte once, so it should run at DRAM bandwidth: each thread issues
 * 16-byte loads (8 weights) for kRows rows at a time, which with full occupancy keeps ~100 KB
 * of loads in flight per SM (latency x bandwidth needs ~30 KB). x is small and shared by all
 * blocks, so it is read through the read-only cache in fp32 (more exact than the BF16 copy the
 * cuBLAS path uses). Threads of a block split k; partial sums meet in a warp shuffle and one
 * shared-memory step. */
#include "ra_cuda.cuh"

namespace {

constexpr int kRows = 4;
constexpr int kMaxThreads = 256;

template <typename WT>
__global__ void __launch_bounds__(kMaxThreads) gemv_kernel(const WT *__restrict__ w, const float *__restrict__ x,
                                                           const void *__restrict__ bias, int bias_dtype,
                                                           float *__restrict__ y, int64_t m, int64_t k,
                                                           int accumulate) {
  __shared__ float part[kMaxThreads / 32][kRows];
  const int64_t row0 = (int64_t)blockIdx.x * kRows;
  const int64_t nvec = k / 8;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    float xv[8];
    ra_cuda_load8(x + 8 * v, xv);
    float wv[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
      /* rows past m (last block) read row m-1 again and are dropped below: no branch in the
       * load stream */
      int64_t row = row0 + r < m ? row0 + r : m - 1;
      ra_cuda_load8(w + row * k + 8 * v, wv[r]);
    }
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
      for (int i = 0; i < 8; i++) acc[r] = fmaf(wv[r][i], xv[i], acc[r]);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kRows; r++) {
    float a = acc[r];
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) part[warp][r] = a;
  }
  __syncthreads();
  if (threadIdx.x < kRows && row0 + threadIdx.x < m) {
    float s = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i][threadIdx.x];
    int64_t row = row0 + threadIdx.x;
    if (bias) s += ra_cuda_load(bias, bias_dtype, row);
    if (accumulate) s += y[row];
    y[row] = s;
  }
}

} /* namespace */

cudaError_t ra_cuda_gemv(cudaStream_t s, const void *w, int w_dtype, const float *x, const void *bias, int bias_dtype,
                         float *y, int64_t m, int64_t k, int accumulate) {
  int64_t nvec = k / 8;
  int threads = (int)((nvec + 31) / 32 * 32);
  if (threads > kMaxThreads) threads = kMaxThreads;
  if (threads < 32) threads = 32;
  unsigned grid = (unsigned)((m + kRows - 1) / kRows);
  if (w_dtype == RA_DTYPE_F16)
    gemv_kernel<<<grid, threads, 0, s>>>((const __half *)w, x, bias, bias_dtype, y, m, k, accumulate);
  else
    gemv_kernel<<<grid, threads, 0, s>>>((const __nv_bfloat16 *)w, x, bias, bias_dtype, y, m, k, accumulate);
  return cudaGetLastError();
}
