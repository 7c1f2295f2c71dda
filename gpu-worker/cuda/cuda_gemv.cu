/* Batch-1 matmul (decode): y = w x (+ bias) (+ y), w: [m, k] BF16/F16, x: [k] F32 — and its fused
 * forms: several matrices sharing x (q/k/v), an RMSNorm of x in front, and SwiGLU behind a
 * gate/up pair.
 *
 * Decode reads every weight byte once, so this kernel is the decode step's bandwidth bill: it
 * must keep enough bytes in flight to cover DRAM latency (~30-40 KB per SM on an H200).
 * One warp owns R rows; each lane issues U 16-byte loads (8 weights) per row before it uses
 * any of them, so a warp has R * U * 512 bytes in flight and a block of 8 warps 8x that.
 * The loop body has no barrier and no shared-memory write: partial sums meet in a warp shuffle
 * only. x is staged once per block in shared memory in fp32 (more exact than the BF16 copy the
 * cuBLAS path uses) when it fits, else read through the read-only cache.
 *
 * Fusions (each saves a launch and a round trip of the activation through DRAM):
 *   - segments: up to 3 matrices with the same k are one row space (q, k, v projections);
 *   - norm: x is staged as x * norm_w and every output is scaled by 1/rms(x) (the block computes
 *     the sum of squares of x while staging it, in double like the rmsnorm kernel);
 *   - swiglu: a warp takes row j of the gate and of the up matrix and writes silu(g) * u. */
#include "ra_cuda.cuh"

namespace {

constexpr int kWarps = 8;  /* warps per block */

template <typename WT> __device__ __forceinline__ float dot8(const uint4 &u, const float x[8]) {
  float w[8], s = 0.0f;
  ra_cuda_cvt8(u, w, (const WT *)nullptr);
#pragma unroll
  for (int i = 0; i < 8; i++) s = fmaf(w[i], x[i], s);
  return s;
}

/* Staged x: x * norm_w (norm_w NULL: x), and 1/rms(x) (1 without a norm). Every thread of the
 * block must call it. */
__device__ float stage_x(float4 *xs4, const float *__restrict__ x, int64_t k, const void *norm_w, int norm_dtype,
                         float eps) {
  __shared__ double part[kWarps];
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < k / 4; i += blockDim.x) {
    float4 v = __ldg((const float4 *)x + i);
    if (norm_w) {
      ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
      v.x *= ra_cuda_load(norm_w, norm_dtype, 4 * i);
      v.y *= ra_cuda_load(norm_w, norm_dtype, 4 * i + 1);
      v.z *= ra_cuda_load(norm_w, norm_dtype, 4 * i + 2);
      v.w *= ra_cuda_load(norm_w, norm_dtype, 4 * i + 3);
    }
    xs4[i] = v;
  }
  if (!norm_w) {
    __syncthreads();
    return 1.0f;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
  return (float)(1.0 / sqrt(t / (double)k + (double)eps));
}

template <typename WT, int R, int U, bool XSMEM, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(ra_cuda_gemv_args a) {
  extern __shared__ float4 xs4[]; /* [k / 4] when XSMEM */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k = a.k;
  /* the warp's rows: R consecutive rows of the segments' joint row space, or (SWIGLU) row j
   * of the gate (segment 0) and of the up matrix (segment 1) */
  const int64_t unit = (int64_t)blockIdx.x * kWarps + warp;
  const int64_t m_all = SWIGLU ? a.m[0] : a.m[0] + a.m[1] + a.m[2];
  const WT *wr[R];
  int seg[R];
  int64_t srow[R];
  bool live[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int64_t g = SWIGLU ? unit : unit * R + r;
    live[r] = g < m_all;
    if (!live[r]) g = m_all - 1; /* re-read a real row, dropped below: no branch in the loads */
    int s = SWIGLU ? r : 0;
    if (!SWIGLU)
      while (s < 2 && g >= a.m[s]) g -= a.m[s++];
    seg[r] = s;
    srow[r] = g;
    wr[r] = (const WT *)a.w[s] + g * k;
  }
  const int64_t nvec = k / 8;
  /* A round: U 16-byte loads of each of the R rows per lane. */
  uint4 wv[R][U];
  auto load_round = [&](int64_t v0) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t v = v0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; r++) wv[r][u] = v < nvec ? __ldg((const uint4 *)(wr[r] + 8 * v)) : make_uint4(0, 0, 0, 0);
    }
  };
  /* The weights do not depend on the kernels before this one: with PDL the first round is
   * loaded and the second requested into L2 while the previous kernel finishes, and only then
   * does the block wait for x (and stage it). */
  const bool active = unit * (SWIGLU ? 1 : R) < m_all;
  if (active) {
    load_round(lane);
    if ((lane & 7) == 0) {
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
          const int64_t v = lane + 32 * (U + u);
          if (v < nvec) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + 8 * v));
        }
    }
  }
  ra_cuda_pdl_entry();
  const float rinv = XSMEM ? stage_x(xs4, a.x, k, a.norm_w, a.norm_dtype, a.eps) : 1.0f;
  if (!active) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  for (int64_t v0 = lane; v0 < nvec; v0 += 32 * U) {
    if (v0 != lane) load_round(v0);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t v = v0 + 32 * u;
      if (v >= nvec) break;
      float xv[8];
      if (XSMEM) {
        const float4 p = xs4[2 * v], q = xs4[2 * v + 1];
        xv[0] = p.x; xv[1] = p.y; xv[2] = p.z; xv[3] = p.w;
        xv[4] = q.x; xv[5] = q.y; xv[6] = q.z; xv[7] = q.w;
      } else {
        ra_cuda_load8(a.x + 8 * v, xv);
      }
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] += dot8<WT>(wv[r][u], xv);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = acc[r];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    acc[r] = s * rinv;
    if (a.bias[seg[r]]) acc[r] += ra_cuda_load(a.bias[seg[r]], a.bias_dtype[seg[r]], srow[r]);
  }
  if constexpr (SWIGLU) {
    if (lane == 0) {
      const float g = acc[0];
      a.y[0][unit] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), acc[R - 1]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (lane == r && live[r]) {
        float *y = a.y[seg[r]] + srow[r];
        *y = a.accumulate ? *y + acc[r] : acc[r];
      }
    }
  }
}

template <typename WT, int R, int U, bool SWIGLU> cudaError_t launch(cudaStream_t s, const ra_cuda_gemv_args &a) {
  const int64_t rows = SWIGLU ? a.m[0] : a.m[0] + a.m[1] + a.m[2];
  const int64_t per_block = (int64_t)kWarps * (SWIGLU ? 1 : R);
  const unsigned grid = (unsigned)((rows + per_block - 1) / per_block);
  if (a.k <= RA_CUDA_GEMV_SMEM_COLS)
    return ra_cuda_launch(gemv_kernel<WT, R, U, true, SWIGLU>, grid, kWarps * 32, (size_t)a.k * sizeof(float), s, a);
  return ra_cuda_launch(gemv_kernel<WT, R, U, false, SWIGLU>, grid, kWarps * 32, 0, s, a);
}

template <typename WT> cudaError_t launch_dtype(cudaStream_t s, const ra_cuda_gemv_args &a) {
  if (a.swiglu) return launch<WT, 2, 4, true>(s, a);
  /* long rows (the FFN's down projection) leave few warps per SM (x takes most of the shared
   * memory): each warp keeps twice the loads in flight */
  if (a.k >= 8192) return launch<WT, 2, 8, false>(s, a);
  /* two rows per warp halve the x reads per weight byte; small outputs keep one so that every
   * SM gets blocks */
  if (a.m[0] + a.m[1] + a.m[2] >= 8192) return launch<WT, 2, 4, false>(s, a);
  return launch<WT, 1, 4, false>(s, a);
}

template <typename WT> cudaError_t init_for() {
  const int bytes = (int)(RA_CUDA_GEMV_SMEM_COLS * sizeof(float));
  cudaError_t e;
  const void *kernels[] = {(const void *)gemv_kernel<WT, 1, 4, true, false>, (const void *)gemv_kernel<WT, 2, 4, true, false>,
                           (const void *)gemv_kernel<WT, 2, 8, true, false>, (const void *)gemv_kernel<WT, 2, 4, true, true>};
  for (const void *k : kernels)
    if ((e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) != cudaSuccess) return e;
  return cudaSuccess;
}

} /* namespace */

cudaError_t ra_cuda_gemv_init(void) {
  cudaError_t e = init_for<__nv_bfloat16>();
  return e != cudaSuccess ? e : init_for<__half>();
}

cudaError_t ra_cuda_gemv_fused(cudaStream_t s, const ra_cuda_gemv_args *a) {
  /* the norm is computed while x is staged in shared memory: without staging it would be skipped */
  if (a->norm_w && a->k > RA_CUDA_GEMV_SMEM_COLS) return cudaErrorInvalidValue;
  if (a->w_dtype == RA_DTYPE_F16) return launch_dtype<__half>(s, *a);
  return launch_dtype<__nv_bfloat16>(s, *a);
}

cudaError_t ra_cuda_gemv(cudaStream_t s, const void *w, int w_dtype, const float *x, const void *bias, int bias_dtype,
                         float *y, int64_t m, int64_t k, int accumulate) {
  ra_cuda_gemv_args a = {};
  a.w[0] = w;
  a.bias[0] = bias;
  a.bias_dtype[0] = bias_dtype;
  a.y[0] = y;
  a.m[0] = m;
  a.w_dtype = w_dtype;
  a.x = x;
  a.k = k;
  a.accumulate = accumulate;
  return ra_cuda_gemv_fused(s, &a);
}
