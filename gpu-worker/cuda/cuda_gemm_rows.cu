/* Matmul of a few rows of x on tensor cores: y = x w^T for x of 4..RA_CUDA_MMA_MAX_X rows (a
 * serve step's sequences, a retro step), x already rounded to w's 16-bit type as cuBLAS takes it
 * (one conversion, or the RMSNorm writing it, ahead of the launch).
 *
 * A step of few tokens reads every weight byte once, so the weights' stream is the bill: cuBLAS
 * streamed them at 2.68 TB/s with 16 rows of x where the one-row GEMV reaches 3.2, and the GEMV's
 * CUDA cores are bound by L1 past 3 rows of x (bench/results/h200/decode-batch/, gemv-rows/).
 * Here the multiply-adds go to mma.sync and the kernel only has to keep the weights in flight:
 *   - a block owns a tile of 16 or 32 weight rows (one or two m16 tiles) and its 8 warps split
 *     the columns; each warp streams its slice from global memory straight into A fragments
 *     (no shared-memory staging), and the 8 partials meet in shared memory once per tile, added
 *     in a fixed order (the result does not depend on timing);
 *   - lane (g, t) loads 16 contiguous bytes of weight rows g and g + 8 per 32 columns: columns
 *     8t..8t+7 feed its fragment slots of two k16 steps, a permutation of the k order that x's
 *     B fragments (the same 16 bytes of x row g) share, so every dot product is unchanged;
 *   - x (<= 16 rows: one or two n8 tiles) is read in the same 16-byte pieces through L1;
 *   - blocks are persistent (2 per SM), each warp loads one round ahead of its multiply-adds,
 *     across tile boundaries, and the first round of weights goes out before the
 *     programmatic-dependent-launch wait, while the previous kernel finishes.
 * Segments (q/k/v sharing x) and the gate/up pair with SwiGLU behind it are fused as in the
 * GEMV (cuda_gemv.cu), whose argument block this kernel takes. */
#include "cuda_mma.cuh"
#include "ra_cuda.cuh"

#include <algorithm>

namespace {

constexpr int kWarps = 8;
constexpr int kBlocksPerSm = 2;
constexpr int kU = 2; /* 32-column chunks a warp loads per round */

__device__ __forceinline__ uint32_t word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* Tiles of the joint row space: 16 * MT rows, or (SWIGLU) 16 gate rows with the same up rows. */
__host__ __device__ inline int64_t n_tiles(const ra_cuda_gemv_args &a, int mt, bool swiglu) {
  return swiglu ? (a.m[0] + 15) / 16 : (a.m[0] + a.m[1] + a.m[2] + 16 * mt - 1) / (16 * mt);
}

/* Row r (0..15) of m16 tile mt of a tile: its segment and row there, and whether it exists (a
 * last tile may be short: its missing rows re-read a real one and are not written). */
template <int MT, bool SWIGLU>
__device__ __forceinline__ bool locate(const ra_cuda_gemv_args &a, int64_t tile, int mt, int r, int &seg, int64_t &row) {
  if constexpr (SWIGLU) {
    seg = mt;
    row = tile * 16 + r;
    const bool live = row < a.m[0];
    if (!live) row = a.m[0] - 1;
    return live;
  }
  const int64_t m_all = a.m[0] + a.m[1] + a.m[2];
  int64_t j = tile * 16 * MT + mt * 16 + r;
  const bool live = j < m_all;
  if (!live) j = m_all - 1;
  int s = 0;
  while (s < 2 && j >= a.m[s]) j -= a.m[s++];
  seg = s;
  row = j;
  return live;
}

template <typename WT, int MT, int NT, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm) gemm_rows_kernel(ra_cuda_gemv_args a, const WT *__restrict__ xh) {
  static_assert(!SWIGLU || MT == 2, "SwiGLU pairs a gate tile with an up tile");
  constexpr int S = MT * NT * 4; /* accumulators per lane */
  __shared__ float red[2][kWarps][S][32];
  struct round_buf {
    uint4 w[MT][2][kU]; /* rows g and g + 8 of each m16 tile */
    uint4 x[NT][kU];    /* x row 8 nt + g */
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t k = a.k, chunks = (k + 31) / 32, per_warp = (chunks + kWarps - 1) / kWarps;
  const int64_t c_lo = warp * per_warp, c_hi = c_lo + per_warp < chunks ? c_lo + per_warp : chunks;
  const int rounds = (int)((per_warp + kU - 1) / kU); /* >= 1: k >= 8 */
  const int64_t tiles = n_tiles(a, MT, SWIGLU);
  /* column of this lane's 8 in chunk u of round rd, or -1 past the warp's slice or k */
  auto col_of = [&](int rd, int u) -> int64_t {
    const int64_t c = c_lo + (int64_t)rd * kU + u, col = c * 32 + 8 * t;
    return c < c_hi && col < k ? col : -1;
  };
  auto load_w = [&](round_buf &b, int64_t tile, int rd) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int seg;
        int64_t row;
        locate<MT, SWIGLU>(a, tile, mt, 8 * h + g, seg, row);
        const WT *p = (const WT *)a.w[seg] + row * k;
#pragma unroll
        for (int u = 0; u < kU; u++) {
          const int64_t col = col_of(rd, u);
          b.w[mt][h][u] = col >= 0 ? __ldcs((const uint4 *)(p + col)) : make_uint4(0, 0, 0, 0);
        }
      }
  };
  auto load_x = [&](round_buf &b, int rd) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int u = 0; u < kU; u++) {
        const int64_t col = col_of(rd, u);
        const int xr = 8 * nt + g;
        b.x[nt][u] = col >= 0 && xr < a.n_x ? __ldg((const uint4 *)(xh + xr * k + col)) : make_uint4(0, 0, 0, 0);
      }
  };
  float acc[MT][NT][4] = {};
  auto multiply = [&](const round_buf &b, int rd) {
#pragma unroll
    for (int u = 0; u < kU; u++) {
      if (c_lo + (int64_t)rd * kU + u >= c_hi) break;
#pragma unroll
      for (int s = 0; s < 2; s++) /* the chunk's two k16 steps: words 2s, 2s + 1 of each piece */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          const uint32_t af[4] = {word(b.w[mt][0][u], 2 * s), word(b.w[mt][1][u], 2 * s),
                                  word(b.w[mt][0][u], 2 * s + 1), word(b.w[mt][1][u], 2 * s + 1)};
#pragma unroll
          for (int nt = 0; nt < NT; nt++)
            ra_mma_traits<WT>::mma(acc[mt][nt], af, word(b.x[nt][u], 2 * s), word(b.x[nt][u], 2 * s + 1));
        }
    }
  };
  int p = 0; /* the shared buffer of this tile's partials */
  /* the 8 warps' partials of a tile, added in warp order; a thread per (lane, n8 tile, slot) */
  auto reduce_write = [&](int64_t tile) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          red[p][warp][(mt * NT + nt) * 4 + c][lane] = acc[mt][nt][c];
          acc[mt][nt][c] = 0.0f;
        }
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
      const int l = e & 31, q = e >> 5, nt = q >> 2, c = q & 3;
      const int xr = 8 * nt + 2 * (l & 3) + (c & 1), r = (l >> 2) + 8 * (c >> 1);
      float sum[MT];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        float v = 0.0f;
        for (int w = 0; w < kWarps; w++) v += red[p][w][mt * NT * 4 + q][l];
        sum[mt] = v;
      }
      if (xr >= a.n_x) continue;
      if constexpr (SWIGLU) {
        int seg;
        int64_t row;
        if (locate<MT, SWIGLU>(a, tile, 0, r, seg, row)) {
          const float gt = sum[0];
          a.y[0][(int64_t)xr * a.m[0] + row] = __fmul_rn(__fdiv_rn(gt, __fadd_rn(1.0f, expf(-gt))), sum[1]);
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          int seg;
          int64_t row;
          if (!locate<MT, SWIGLU>(a, tile, mt, r, seg, row)) continue;
          const float b = a.bias[seg] ? ra_cuda_load(a.bias[seg], a.bias_dtype[seg], row) : 0.0f;
          float *y = a.y[seg] + (int64_t)xr * a.m[seg] + row;
          *y = a.accumulate ? *y + (sum[mt] + b) : sum[mt] + b;
        }
      }
    }
    p ^= 1; /* the next tile writes the other buffer: no second barrier */
  };

  round_buf bufA, bufB;
  int64_t tile = blockIdx.x;
  int rd = 0;
  if (tile < tiles) load_w(bufA, tile, 0);
  ra_cuda_pdl_entry(); /* x is the previous kernel's output; the weights are not */
  if (tile < tiles) load_x(bufA, 0);
  /* one round: load the next one into nxt, multiply cur; at a tile's last round, write it */
  auto round = [&](round_buf &cur, round_buf &nxt) -> bool {
    int64_t ntile = tile;
    int nrd = rd + 1;
    if (nrd == rounds) {
      nrd = 0;
      ntile += gridDim.x;
    }
    if (ntile < tiles) {
      load_w(nxt, ntile, nrd);
      load_x(nxt, nrd);
    }
    multiply(cur, rd);
    if (rd == rounds - 1) reduce_write(tile);
    tile = ntile;
    rd = nrd;
    return tile < tiles;
  };
  /* two buffers in registers: the loop is unrolled by two so that neither is indexed at run time */
  while (tile < tiles) {
    if (!round(bufA, bufB)) break;
    if (!round(bufB, bufA)) break;
  }
}

template <typename WT, int MT, int NT, bool SWIGLU>
cudaError_t launch(cudaStream_t s, const ra_cuda_gemv_args &a, const void *xh) {
  const int64_t tiles = n_tiles(a, MT, SWIGLU), max_blocks = (int64_t)std::max(a.n_sm, 1) * kBlocksPerSm;
  if (tiles == 0) return cudaSuccess;
  return ra_cuda_launch(gemm_rows_kernel<WT, MT, NT, SWIGLU>, (unsigned)std::min(tiles, max_blocks), kWarps * 32, 0, s,
                        a, (const WT *)xh);
}

/* Two m16 tiles a block halve x's reads per weight byte, where there are tiles enough to give
 * every block slot one; else 16-row tiles spread the weights over more of the SMs. */
template <typename WT, int NT> cudaError_t launch_x(cudaStream_t s, const ra_cuda_gemv_args &a, const void *xh) {
  if (a.swiglu) return launch<WT, 2, NT, true>(s, a, xh);
  if (n_tiles(a, 2, false) >= (int64_t)std::max(a.n_sm, 1) * kBlocksPerSm) return launch<WT, 2, NT, false>(s, a, xh);
  return launch<WT, 1, NT, false>(s, a, xh);
}

template <typename WT> cudaError_t launch_dtype(cudaStream_t s, const ra_cuda_gemv_args &a, const void *xh) {
  return a.n_x <= 8 ? launch_x<WT, 1>(s, a, xh) : launch_x<WT, 2>(s, a, xh);
}

} /* namespace */

cudaError_t ra_cuda_gemm_rows(cudaStream_t s, const ra_cuda_gemv_args *a, const void *xh) {
  if (a->norm_w || a->n_x < 1 || a->n_x > RA_CUDA_MMA_MAX_X || a->k % 8 ||
      (a->swiglu && (a->accumulate || a->m[0] != a->m[1])))
    return cudaErrorInvalidValue;
  if (a->w_dtype == RA_DTYPE_F16) return launch_dtype<__half>(s, *a, xh);
  return launch_dtype<__nv_bfloat16>(s, *a, xh);
}
