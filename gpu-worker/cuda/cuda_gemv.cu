/* Batch-1 matmul (decode): y = w x (+ bias) (+ y), w: [m, k] BF16/F16, x: [k] F32 — and its fused
 * forms: several matrices sharing x (q/k/v), an RMSNorm of x in front, and SwiGLU behind a
 * gate/up pair. A few rows of x (a decode step of several tokens: retro's corrected rows, a
 * serve step's sequences) take the plain form with NX rows: every weight byte is still read
 * once, and used NX times from registers (bench/results/h200/gemv-rows/).
 *
 * Decode reads every weight byte once, so this kernel is the decode step's bandwidth bill: it
 * must keep enough bytes in flight to cover DRAM latency (~30-40 KB per SM on an H200), and a
 * step is ~130 of these kernels back to back, so what a kernel costs at its start and its end
 * counts as much as its steady state: one-shot blocks moved a sequence of GEMVs at about 70 % of
 * the rate one large matrix reaches (bench/results/defaults/README.md). Hence:
 *   - persistent blocks: 2 per SM (kBlocksPerSm; 4 and 8 measured slower), each warp walking
 *     units (R rows, or a gate/up row pair) with the grid shrunk so that every warp gets the
 *     same number of units (no last-wave tail);
 *   - a warp streams its units in rounds of U 16-byte loads per row and lane, and loads the
 *     next round (of the same or the next unit) before it uses the current one: one round is
 *     always in flight, across unit boundaries;
 *   - x is staged once per block in shared memory (fp32: more exact than a BF16 copy), with
 *     all of a thread's loads of x issued before any is used: issued one after another
 *     behind the weight stream, they cost ~1 us each and 4-5 us per kernel;
 *   - the first round of weights is loaded before the programmatic-dependent-launch wait,
 *     while the previous kernel finishes (weights do not depend on it; x does).
 * The loop body has no barrier: partial sums meet in a warp shuffle only.
 *
 * Fusions (each saves a launch and a round trip of the activation through DRAM):
 *   - segments: up to 3 matrices with the same k are one row space (q, k, v projections);
 *   - norm: x is staged as x * norm_w and every output is scaled by 1/rms(x) (the block computes
 *     the sum of squares of x while staging it, in double like the rmsnorm kernel);
 *   - swiglu: a warp takes row j of the gate and of the up matrix and writes silu(g) * u. */
#include "ra_cuda.cuh"

#include <algorithm>

namespace {

constexpr int kWarps = 8;       /* warps per block */
constexpr int kBlocksPerSm = 2; /* persistent blocks per SM */
constexpr int kStageBatch = 8;  /* float4 of x per thread in flight while staging */

template <typename WT> __device__ __forceinline__ float dot8(const uint4 &u, const float x[8]) {
  float w[8], s = 0.0f;
  ra_cuda_cvt8(u, w, (const WT *)nullptr);
#pragma unroll
  for (int i = 0; i < 8; i++) s = fmaf(w[i], x[i], s);
  return s;
}

/* Staged x: x * norm_w (norm_w NULL: x), and 1/rms(x) (1 without a norm). Every thread of the
 * block must call it. Loads go out kStageBatch at a time per thread, then are used. */
__device__ float stage_x(float4 *xs4, const float *__restrict__ x, int64_t k, const void *norm_w, int norm_dtype,
                         float eps) {
  __shared__ double part[kWarps];
  double ss = 0.0;
  const int64_t n4 = k / 4, step = (int64_t)kStageBatch * blockDim.x;
  for (int64_t base = threadIdx.x; base < n4; base += step) {
    float4 v[kStageBatch];
#pragma unroll
    for (int j = 0; j < kStageBatch; j++) {
      const int64_t i = base + (int64_t)j * blockDim.x;
      if (i < n4) v[j] = __ldg((const float4 *)x + i);
    }
    float nw[kStageBatch][4];
    if (norm_w) {
#pragma unroll
      for (int j = 0; j < kStageBatch; j++) {
        const int64_t i = base + (int64_t)j * blockDim.x;
        if (i < n4)
#pragma unroll
          for (int c = 0; c < 4; c++) nw[j][c] = ra_cuda_load(norm_w, norm_dtype, 4 * i + c);
      }
    }
#pragma unroll
    for (int j = 0; j < kStageBatch; j++) {
      const int64_t i = base + (int64_t)j * blockDim.x;
      if (i >= n4) break;
      float4 t = v[j];
      if (norm_w) {
        ss += (double)t.x * t.x + (double)t.y * t.y + (double)t.z * t.z + (double)t.w * t.w;
        t.x *= nw[j][0];
        t.y *= nw[j][1];
        t.z *= nw[j][2];
        t.w *= nw[j][3];
      }
      xs4[i] = t;
    }
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

/* Units of the joint row space: R rows each, or (SWIGLU) a gate/up row pair. */
__host__ __device__ inline int64_t gemv_units(const ra_cuda_gemv_args &a, int R, bool swiglu) {
  return swiglu ? a.m[0] : (a.m[0] + a.m[1] + a.m[2] + R - 1) / R;
}

/* NX > 1: x [NX, k] and y_s [NX, m_s], read from global memory (L1-cached: every warp of a block
 * reads the same x), no norm, no swiglu. */
template <typename WT, int R, int U, int NX, bool XSMEM, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(ra_cuda_gemv_args a) {
  static_assert(NX == 1 || (!XSMEM && !SWIGLU), "several rows of x: plain form only");
  static_assert(NX * R <= 32, "a lane writes each output");
  extern __shared__ float4 xs4[]; /* [k / 4] when XSMEM */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k = a.k, nvec = k / 8;
  const int64_t m_all = SWIGLU ? a.m[0] : a.m[0] + a.m[1] + a.m[2];
  const int64_t units = gemv_units(a, R, SWIGLU), stride = (int64_t)gridDim.x * kWarps;
  const int rounds = (int)((nvec + 32 * U - 1) / (32 * U));
  /* row r of a unit: its segment, its row there, and whether it exists (a last unit may be
   * short; its missing rows re-read a real one and are dropped: no branch in the loads) */
  auto locate = [&](int64_t unit, int r, int &seg, int64_t &srow) -> bool {
    int64_t g = SWIGLU ? unit : unit * R + r;
    const bool live = g < m_all;
    if (!live) g = m_all - 1;
    int s = SWIGLU ? r : 0;
    if (!SWIGLU)
      while (s < 2 && g >= a.m[s]) g -= a.m[s++];
    seg = s;
    srow = g;
    return live;
  };
  auto load = [&](uint4(&buf)[R][U], int64_t unit, int rd) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      int sg;
      int64_t sr;
      locate(unit, r, sg, sr);
      const WT *p = (const WT *)a.w[sg] + sr * k;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = (int64_t)rd * 32 * U + 32 * u + lane;
        buf[r][u] = v < nvec ? __ldcs((const uint4 *)(p + 8 * v)) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint4 bufA[R][U], bufB[R][U];
  int64_t unit = (int64_t)blockIdx.x * kWarps + warp;
  int rd = 0;
  if (unit < units) load(bufA, unit, 0);
  ra_cuda_pdl_entry();
  const float rinv = XSMEM ? stage_x(xs4, a.x, k, a.norm_w, a.norm_dtype, a.eps) : 1.0f;
  float acc[NX][R];
#pragma unroll
  for (int xi = 0; xi < NX; xi++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[xi][r] = 0.0f;
  /* one round: load the next one into nxt, use cur; at a unit's last round, write its rows */
  auto round = [&](uint4(&cur)[R][U], uint4(&nxt)[R][U]) -> bool {
    int64_t nu = unit;
    int nrd = rd + 1;
    if (nrd == rounds) {
      nrd = 0;
      nu += stride;
    }
    if (nu < units) load(nxt, nu, nrd);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t v = (int64_t)rd * 32 * U + 32 * u + lane;
      if (v >= nvec) break;
      if constexpr (NX == 1) {
        float xv[8];
        if (XSMEM) {
          const float4 p = xs4[2 * v], q = xs4[2 * v + 1];
          xv[0] = p.x; xv[1] = p.y; xv[2] = p.z; xv[3] = p.w;
          xv[4] = q.x; xv[5] = q.y; xv[6] = q.z; xv[7] = q.w;
        } else {
          ra_cuda_load8(a.x + 8 * v, xv);
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[0][r] += dot8<WT>(cur[r][u], xv);
      } else {
#pragma unroll
        for (int r = 0; r < R; r++) {
          float w[8];
          ra_cuda_cvt8(cur[r][u], w, (const WT *)nullptr);
#pragma unroll
          for (int xi = 0; xi < NX; xi++) {
            float xv[8];
            ra_cuda_load8(a.x + xi * k + 8 * v, xv);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[xi][r] = fmaf(w[i], xv[i], acc[xi][r]);
          }
        }
      }
    }
    if (rd == rounds - 1) {
      int seg[R];
      int64_t srow[R];
      bool live[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        live[r] = locate(unit, r, seg[r], srow[r]);
        const float b = a.bias[seg[r]] ? ra_cuda_load(a.bias[seg[r]], a.bias_dtype[seg[r]], srow[r]) : 0.0f;
#pragma unroll
        for (int xi = 0; xi < NX; xi++) {
          float s = acc[xi][r];
          for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          acc[xi][r] = s * rinv + b;
        }
      }
      if constexpr (SWIGLU) {
        if (lane == 0) {
          const float g = acc[0][0];
          a.y[0][unit] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), acc[0][R - 1]);
        }
      } else {
#pragma unroll
        for (int xi = 0; xi < NX; xi++)
#pragma unroll
          for (int r = 0; r < R; r++) {
            if (lane == xi * R + r && live[r]) {
              float *y = a.y[seg[r]] + (int64_t)xi * a.m[seg[r]] + srow[r];
              *y = a.accumulate ? *y + acc[xi][r] : acc[xi][r];
            }
          }
      }
#pragma unroll
      for (int xi = 0; xi < NX; xi++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[xi][r] = 0.0f;
    }
    unit = nu;
    rd = nrd;
    return unit < units;
  };
  /* two buffers in registers: the loop is unrolled by two so that neither is indexed at run time */
  while (unit < units) {
    if (!round(bufA, bufB)) break;
    if (!round(bufB, bufA)) break;
  }
}

template <typename WT, int R, int U, bool SWIGLU, int NX = 1> cudaError_t launch(cudaStream_t s, const ra_cuda_gemv_args &a) {
  /* as many warps as kBlocksPerSm blocks per SM hold, then fewer blocks so that every warp
   * takes the same number of units */
  const int64_t units = gemv_units(a, R, SWIGLU);
  const int64_t max_warps = (int64_t)std::max(a.n_sm, 1) * kBlocksPerSm * kWarps;
  const int64_t per_warp = (units + max_warps - 1) / max_warps;
  const unsigned grid = (unsigned)((units + kWarps * per_warp - 1) / (kWarps * per_warp));
  if constexpr (NX == 1) {
    if (a.k <= RA_CUDA_GEMV_SMEM_COLS)
      return ra_cuda_launch(gemv_kernel<WT, R, U, 1, true, SWIGLU>, grid, kWarps * 32, (size_t)a.k * sizeof(float), s, a);
  }
  return ra_cuda_launch(gemv_kernel<WT, R, U, NX, false, SWIGLU>, grid, kWarps * 32, 0, s, a);
}

/* Several rows of x: two weight rows per warp, each x chunk loaded (from L1) used for both. x's L1
 * traffic grows with NX (NX bytes per weight byte): a layer costs 1.07x one row's time at 2 rows
 * (cuBLAS 1.19x), 1.20x at 3 (cuBLAS 1.17x, but two launches and a conversion per matmul), and
 * 1.5x at 4, where cuBLAS's 1.17x wins (bench/results/h200/gemv-rows/). Four weight rows per warp
 * (less L1 traffic) need ~164 registers, one block per SM, and measured slower still. */
template <typename WT> cudaError_t launch_rows(cudaStream_t s, const ra_cuda_gemv_args &a) {
  switch (a.n_x) {
  case 2: return launch<WT, 2, 4, false, 2>(s, a);
  case 3: return launch<WT, 2, 4, false, 3>(s, a);
  default: return cudaErrorInvalidValue;
  }
}

template <typename WT> cudaError_t launch_dtype(cudaStream_t s, const ra_cuda_gemv_args &a) {
  if (a.n_x > 1) return launch_rows<WT>(s, a);
  if (a.swiglu) return launch<WT, 2, 4, true>(s, a);
  /* two rows per warp halve the x reads per weight byte where there are rows enough; the
   * 4096-row matrices of Llama-3-8B measured faster with one */
  if (a.m[0] + a.m[1] + a.m[2] >= 8192) return launch<WT, 2, 4, false>(s, a);
  return launch<WT, 1, 4, false>(s, a);
}

template <typename WT> cudaError_t init_for() {
  const int bytes = (int)(RA_CUDA_GEMV_SMEM_COLS * sizeof(float));
  cudaError_t e;
  const void *kernels[] = {(const void *)gemv_kernel<WT, 1, 4, 1, true, false>,
                           (const void *)gemv_kernel<WT, 2, 4, 1, true, false>,
                           (const void *)gemv_kernel<WT, 2, 4, 1, true, true>};
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
  if (a->n_x > 1 && (a->norm_w || a->swiglu || a->n_x > RA_CUDA_GEMV_MAX_X)) return cudaErrorInvalidValue;
  if (a->w_dtype == RA_DTYPE_F16) return launch_dtype<__half>(s, *a);
  return launch_dtype<__nv_bfloat16>(s, *a);
}

cudaError_t ra_cuda_gemv(cudaStream_t s, int n_sm, const void *w, int w_dtype, const float *x, int n_x,
                         const void *bias, int bias_dtype, float *y, int64_t m, int64_t k, int accumulate) {
  ra_cuda_gemv_args a = {};
  a.n_x = n_x;
  a.n_sm = n_sm;
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
